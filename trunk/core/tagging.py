"""Entity tags: IOB1, IOB2 (BIO) and BIOES sequences read as spans, and spans written back as tags.

One reader serves every scheme. It follows the conlleval rules, which seqeval's default mode also
uses:
- An entity starts at ``B-X`` or ``S-X``.
- It also starts at ``I-X`` or ``E-X`` when the previous tag is ``O``, is of another type, or
  closed an entity (``E-``/``S-``).
- It ends before the first tag that does not continue it.

So IOB1 and IOB2 files give the same spans, and BIOES files give what their E-/S- tags say.
Ill-formed sequences are read leniently, not dropped: ``O I-PER`` is a PER entity that starts at
the I-, and ``B-PER I-LOC`` is two entities.

The model is trained on one scheme (``bio`` or ``bioes``). Every input scheme goes through spans
into it, so all input schemes are handled in the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch

Scheme = Literal["bio", "bioes"]
PREFIXES = {"bio": ("B", "I"), "bioes": ("B", "I", "E", "S")}


class Span(NamedTuple):
    type: str
    start: int  # index of the first word
    end: int  # index of the last word (inclusive)


def split_tag(tag: str) -> tuple[str, str]:
    """``"B-PER"`` -> ``("B", "PER")``; ``"O"`` -> ``("O", "")``. Raises on anything else."""
    if tag == "O":
        return "O", ""
    prefix, sep, entity_type = tag.partition("-")
    if not sep or prefix not in ("B", "I", "E", "S") or not entity_type:
        raise ValueError(f"Tag {tag!r} is not 'O' or '<B|I|E|S>-<TYPE>' (IOB1, IOB2/BIO and BIOES are accepted).")
    return prefix, entity_type


def is_tag(text: str) -> bool:
    """Whether ``text`` spells a tag (``O``, ``B-PER``, ...)."""
    try:
        split_tag(text)
    except ValueError:
        return False
    return True


def _ends(prev: str, prev_type: str, cur: str, cur_type: str) -> bool:
    """Does the entity open at the previous tag end before the current one? (conlleval's endOfChunk)"""
    if prev in ("E", "S"):
        return True
    if prev in ("B", "I") and cur in ("B", "S", "O"):
        return True
    return prev != "O" and prev_type != cur_type


def _starts(prev: str, prev_type: str, cur: str, cur_type: str) -> bool:
    """Does an entity start at the current tag? (conlleval's startOfChunk)"""
    if cur in ("B", "S"):
        return True
    if cur in ("I", "E") and prev in ("E", "S", "O"):
        return True
    return cur != "O" and prev_type != cur_type


def spans_from_tags(tags: Sequence[str]) -> list[Span]:
    """The entities of one sentence's tags, in order (see the module docstring for the rules)."""
    spans: list[Span] = []
    prev, prev_type, start = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):  # the final O closes an entity that runs to the end
        cur, cur_type = split_tag(tag)
        if prev != "O" and _ends(prev, prev_type, cur, cur_type):
            spans.append(Span(prev_type, start, i - 1))
        if cur != "O" and _starts(prev, prev_type, cur, cur_type):
            start = i
        prev, prev_type = cur, cur_type
    return spans


def tags_from_spans(spans: Sequence[Span], length: int, scheme: Scheme) -> list[str]:
    """Write non-overlapping spans as ``length`` tags in ``scheme``."""
    tags = ["O"] * length
    for entity_type, start, end in spans:
        if scheme == "bioes" and start == end:
            tags[start] = f"S-{entity_type}"
            continue
        tags[start] = f"B-{entity_type}"
        for i in range(start + 1, end + 1):
            tags[i] = f"I-{entity_type}"
        if scheme == "bioes":
            tags[end] = f"E-{entity_type}"
    return tags


def label_names_for(entity_types: Sequence[str], scheme: Scheme) -> list[str]:
    """The model's labels: ``O``, then each type's tags (``B-LOC, I-LOC, ...``), types sorted."""
    if scheme not in PREFIXES:
        raise ValueError(f"label_scheme must be 'bio' or 'bioes', got {scheme!r}.")
    return ["O"] + [f"{p}-{t}" for t in sorted(entity_types) for p in PREFIXES[scheme]]


def parse_label_names(label_names: Sequence[str]) -> tuple[Scheme, list[str]]:
    """(scheme, entity types) of a model label set; raises if the set is not complete and well formed."""
    types = sorted({split_tag(n)[1] for n in label_names if n != "O"})
    scheme: Scheme = "bioes" if any(split_tag(n)[0] in ("E", "S") for n in label_names) else "bio"
    expected = label_names_for(types, scheme)
    if sorted(label_names) != sorted(expected):
        raise ValueError(f"label_names {list(label_names)} are not a complete {scheme.upper()} label set; expected "
                         f"{expected} (in any order).")
    return scheme, types


class Transitions(NamedTuple):
    """Which label may start a sentence, follow another label, or end a sentence."""

    start: torch.Tensor  # (L,) bool
    step: torch.Tensor  # (L, L) bool, [previous, current]
    end: torch.Tensor  # (L,) bool


def allowed_transitions(label_names: Sequence[str]) -> Transitions:
    """The label sequences a well-formed tagging in the labels' scheme can have (I-X only inside an X entity, ...)."""
    scheme, _ = parse_label_names(label_names)
    parts = [split_tag(n) for n in label_names]
    opens_inside = {"B", "I"}  # after these, the entity continues (I-/E- of the same type)
    n = len(label_names)
    step = torch.zeros(n, n, dtype=torch.bool)
    for i, (prev, prev_type) in enumerate(parts):
        for j, (cur, cur_type) in enumerate(parts):
            continues = cur in ("I", "E") and prev in opens_inside and prev_type == cur_type
            starts_fresh = cur in ("O", "B", "S") and (scheme == "bio" or prev not in opens_inside)
            step[i, j] = continues or starts_fresh
    start = torch.tensor([p in ("O", "B", "S") for p, _ in parts])
    end = torch.tensor([scheme == "bio" or p in ("O", "E", "S") for p, _ in parts])
    return Transitions(start, step, end)


def constrained_decode(scores: torch.Tensor, lengths: torch.Tensor, allowed: Transitions) -> torch.Tensor:
    """Best label path (Viterbi) under ``allowed`` transitions: (B, W, L) log-probs -> (B, W) label ids.

    Per-word argmax can emit ``O I-PER`` or ``B-PER I-LOC``; this keeps every output well formed,
    choosing the most probable well-formed sequence. Positions at or after ``lengths`` are ignored.
    """
    batch, width, n = scores.shape
    scores = scores.float()
    forbid = torch.tensor(-1e4, device=scores.device)
    zero = torch.tensor(0.0, device=scores.device)
    step = torch.where(allowed.step.to(scores.device), zero, forbid)
    best = scores[:, 0] + torch.where(allowed.start.to(scores.device), zero, forbid)
    keep = torch.arange(n, device=scores.device).expand(batch, n)
    backpointers = []
    for t in range(1, width):
        candidate, back = (best.unsqueeze(2) + step).max(dim=1)  # over the previous label
        inside = (t < lengths).unsqueeze(1)
        best = torch.where(inside, candidate + scores[:, t], best)
        backpointers.append(torch.where(inside, back, keep))  # past the end: carry the label through
    last = (best + torch.where(allowed.end.to(scores.device), zero, forbid)).argmax(dim=1)
    path = [last]
    for back in reversed(backpointers):
        last = back.gather(1, last.unsqueeze(1)).squeeze(1)
        path.append(last)
    return torch.stack(path[::-1], dim=1)
