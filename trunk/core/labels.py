"""Class names that print alike: how two labels differ when a reader cannot see it (case, width, spacing, invisible
characters, Unicode normalisation forms), and the folds a user may ask for (``normalize_labels``).

Hand-written over ``unicodedata``: no library names the difference between two strings in these terms.
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable

# normalize_labels: how labels are folded before they become classes
FOLDS = ("none", "nfc", "nfkc")


def invisible(char: str) -> bool:
    """A character that prints as nothing: format characters (zero-width space and joiners, the byte-order mark, soft
    hyphen, direction marks)."""
    return unicodedata.category(char) == "Cf"


def fold_label(name: str, how: str) -> str:
    """``name`` as ``normalize_labels`` folds it: ``nfc`` composes it (an accent typed as two code points becomes one
    character); ``nfkc`` also folds compatibility forms (full width, ligatures, superscripts) and drops invisible
    characters. Surrounding spaces are dropped always (as the data's cells are read)."""
    if how == "nfc":
        name = unicodedata.normalize("NFC", name)
    elif how == "nfkc":
        name = "".join(c for c in unicodedata.normalize("NFKC", name) if not invisible(c))
    return name.strip()


def check_fold(how: str, option: str = "normalize_labels") -> str:
    if how not in FOLDS:
        raise ValueError(f"{option}={how!r}: choose {', '.join(FOLDS)} (nfkc also folds full-width forms and drops "
                         "invisible characters).")
    return how


def skeleton(name: str) -> str:
    """What a reader sees of a label: compatibility-folded, invisible characters dropped, case-folded, spaces single."""
    return " ".join(fold_label(name, "nfkc").casefold().split())


def _code_points(text: str) -> str:
    return " ".join(f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}" for c in text)


STEPS = (  # what a reader cannot see, in the order it is folded away
    ("the Unicode normalisation form (composed against decomposed)", lambda t: unicodedata.normalize("NFC", t)),
    ("invisible characters", lambda t: "".join(c for c in t if not invisible(c))),
    ("compatibility forms (width, ligatures, ...)", lambda t: unicodedata.normalize("NFKC", t)),
    ("case", str.casefold),
    ("spacing", lambda t: " ".join(t.split())),
)


def difference(a: str, b: str) -> str:
    """In words, how ``a`` and ``b`` differ when they print alike: the kinds of difference and the code points."""
    kinds, x, y = [], a, b
    for kind, fold in STEPS:
        folded = fold(x), fold(y)
        if x != y and folded != (x, y):  # still apart, and this fold changes one of them
            kinds.append(kind)
        x, y = folded
    kind = " and ".join(kinds) or "other characters"
    parts = []
    for op, i, j, k, m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op != "equal":
            first, second = _code_points(a[i:j]), _code_points(b[k:m])
            parts.append(f"{second} in the second only" if i == j else f"{first} in the first only" if k == m
                         else f"{first} against {second}")
    return f"{a!r} and {b!r} differ by {kind}: {'; '.join(parts)}"


def foldable(a: str, b: str) -> bool:
    """Whether ``normalize_labels: nfkc`` makes the two one label."""
    return fold_label(a, "nfkc") == fold_label(b, "nfkc")


def alike_groups(names: Iterable) -> list[list[str]]:
    """The groups of distinct labels that print alike (``skeleton``), each sorted."""
    groups: dict[str, list[str]] = {}
    for name in sorted({str(n) for n in names}):
        groups.setdefault(skeleton(name), []).append(name)
    return [group for group in groups.values() if len(group) > 1]


def describe_alike(groups: list[list[str]]) -> str:
    """Each group's pairs (its first against each other), with how they differ; and what to do."""
    pairs = [difference(group[0], other) for group in groups for other in group[1:]]
    fold = any(foldable(group[0], other) for group in groups for other in group[1:])
    advice = ("Set normalize_labels: nfkc to fold invisible characters, normalisation and compatibility forms, or "
              "write them one way in the data" if fold else "If they mean one class, write them one way in the data")
    return f"{'; '.join(pairs[:5])}{' ...' if len(pairs) > 5 else ''}. {advice}."


def alike_across(ours: Iterable, theirs: Iterable) -> str:
    """The labels of ``ours`` that print as one of ``theirs`` but are not it, each pair with how they differ ('' when
    none): why a label that looks listed is not found."""
    by_look: dict[str, list[str]] = {}
    for name in {str(n) for n in theirs}:
        by_look.setdefault(skeleton(name), []).append(name)
    pairs = [difference(a, b) for a in sorted({str(n) for n in ours}) for b in sorted(by_look.get(skeleton(a), []))
             if a != b]
    return "; ".join(pairs[:5])
