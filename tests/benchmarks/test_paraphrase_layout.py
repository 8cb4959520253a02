"""benchmarks/paraphrase_layout.py: SICK's pairs in the paraphrase corpus's layout, and a recipe that reads both
columns."""

import sys

import yaml
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))


def test_the_pairs_keep_their_layout_and_the_recipe_names_both_columns(tmp_path):
    import paraphrase_layout

    header = "pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tSemEval_set"
    rows = [f"{i}\ta dog runs {i}\ta dog is running {i}\tNEUTRAL\t{1 + i % 5}\t{'TRAIN' if i < 8 else 'TRIAL'}"
            for i in range(10)]
    (tmp_path / "SICK.txt").write_text("\n".join([header, *rows]) + "\n")
    paraphrase_layout.main(["--sick", str(tmp_path / "SICK.txt"), "--out", str(tmp_path / "out")])
    train = (tmp_path / "out" / "train.tsv").read_text(encoding="utf-8").splitlines()
    assert train[0] == "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String" and len(train) == 9
    assert [line.split("\t")[0] for line in train[1:]] == ["0", "0", "0", "1", "1", "0", "0", "0"]  # relatedness >= 3.4
    task = yaml.safe_load((tmp_path / "out" / "recipe.yaml").read_text())["data"]["tasks"]["para"]["init_args"]
    columns = (task["text_column"], task["text_pair_column"], task["label_column"])
    assert columns == ("#1 String", "#2 String", "Quality")
    assert task["train"] == str((tmp_path / "out" / "train.tsv").resolve())
