"""A sentence-pair set in the paraphrase corpus's file layout, built from SICK, and its recipe: a copy of
configs/minilm_sst2.yaml pointed at it, as a user makes one for a data set of their own.

The layout is the one whose second column Trunk once dropped: a byte-order mark, then the columns ``Quality``,
``#1 ID``, ``#2 ID``, ``#1 String``, ``#2 String`` (names that start with '#', which YAML reads as comments unquoted
and the parser read as None quoted). The pairs are SICK's (TRAIN to train, TRIAL to validate), the label "paraphrase"
where their relatedness is at least 3.4 (63% of them, as the paraphrase corpus's 68% positive).

    python benchmarks/paraphrase_layout.py --sick ../shared/data/sick/SICK.txt --out runs/paraphrase_layout
    trunk fit --config runs/paraphrase_layout/recipe.yaml
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLUMNS = "\t".join(["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"])


def write_split(rows: list[dict], path: Path) -> float:
    """One split in the layout; returns its share of positive pairs."""
    lines = [COLUMNS] + [f"{int(float(r['relatedness_score']) >= 3.4)}\t{2 * i}\t{2 * i + 1}\t{r['sentence_A']}\t"
                         f"{r['sentence_B']}" for i, r in enumerate(rows)]
    path.write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    return sum(float(r["relatedness_score"]) >= 3.4 for r in rows) / len(rows)


def recipe(out: Path) -> str:
    """configs/minilm_sst2.yaml with this set's files, columns, labels and 3 epochs."""
    text = (REPO / "configs" / "minilm_sst2.yaml").read_text()
    text = text.replace("sst2:", "para:").replace("../shared/data/sst2/train.tsv", str(out / "train.tsv"))
    text = text.replace("../shared/data/sst2/dev.tsv", str(out / "dev.tsv")).replace("max_epochs: 2", "max_epochs: 3")
    text = "\n".join(line for line in text.splitlines() if "test_labeled.tsv" not in line) + "\n"
    text = text.replace("text_column: sentence", 'text_column: "#1 String"\n        text_pair_column: "#2 String"')
    text = text.replace("label_column: label", "label_column: Quality")
    return text.replace("[negative, positive]", "[different, paraphrase]")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sick", type=Path, default=REPO.parent / "shared" / "data" / "sick" / "SICK.txt")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "paraphrase_layout")
    args = parser.parse_args(argv)
    with args.sick.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    args.out.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", "TRAIN"), ("dev", "TRIAL")):
        share = write_split([r for r in rows if r["SemEval_set"] == part], args.out / f"{split}.tsv")
        print(f"{args.out / f'{split}.tsv'}: {share:.0%} paraphrase")
    (args.out / "recipe.yaml").write_text(recipe(args.out.resolve()))
    print(f"trunk fit --config {args.out / 'recipe.yaml'}")


if __name__ == "__main__":
    main(sys.argv[1:])
