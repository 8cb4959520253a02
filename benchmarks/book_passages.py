"""A long-input task from the NLTK Gutenberg books in ../shared/data: which book is a passage of ``--words`` words
from? 17 books (3 by Austen, 3 by Chesterton, 3 Shakespeare plays, ...), so style alone does not settle it; names
and topics spread over a passage do. Writes train / validation / test .tsv files (``text``, ``label``) for
``configs/books.yaml``:

    python benchmarks/book_passages.py ../shared/data/gutenberg_nltk runs/books

Each book's sentences are cut into consecutive passages; its first 80% of passages train, the next 10% validate,
the last 10% test (no passage shares text with another split). At most ``--per-book`` training passages a book, and
a fifth of that for each other split, so the longest books do not swamp the rest.
"""

from __future__ import annotations

import argparse
import csv
import gzip
from pathlib import Path


def passages(path: Path, words: int) -> list[str]:
    """The book's text in consecutive passages of about ``words`` words (whole sentences; the last, short one
    dropped)."""
    out, current = [], []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            current += line.split()
            if len(current) >= words:
                out.append(" ".join(current))
                current = []
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("books", type=Path, help="the folder of <author>-<title>.txt.gz files")
    parser.add_argument("out", type=Path)
    parser.add_argument("--words", type=int, default=1000)
    parser.add_argument("--per-book", type=int, default=40)
    args = parser.parse_args()
    files = sorted(args.books.glob("*.txt.gz"))
    if not files:
        raise SystemExit(f"error: no .txt.gz books in '{args.books}'.")
    splits: dict[str, list[tuple[str, str]]] = {"train": [], "validation": [], "test": []}
    for path in files:
        book, pieces = path.name.removesuffix(".txt.gz"), passages(path, args.words)
        cut = [round(len(pieces) * 0.8), round(len(pieces) * 0.9)]
        held = max(1, args.per_book // 5)
        for split, chosen in (
            ("train", pieces[: cut[0]][: args.per_book]),
            ("validation", pieces[cut[0] : cut[1]][:held]),
            ("test", pieces[cut[1] :][:held]),
        ):
            splits[split] += [(text, book) for text in chosen]
    args.out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        with (args.out / f"{split}.tsv").open("w", newline="") as f:
            writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
            writer.writerow(["text", "label"])
            writer.writerows(rows)
        print(f"{split}: {len(rows)} passages of {len({b for _, b in rows})} books -> {args.out / f'{split}.tsv'}")


if __name__ == "__main__":
    main()
