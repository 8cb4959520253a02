"""benchmarks/long_finetune.py: a training step on long, padded inputs beside transformers on the same weights."""

import sys

import pytest
from conftest import REPO

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests" / "formats"))


def test_both_sides_take_a_step_on_the_same_padded_batch(tmp_path, capsys):
    import long_finetune
    from test_hf import tiny

    tiny("modernbert", tmp_path / "hf", masked_lm=False)
    long_finetune.main(["--model", str(tmp_path / "hf"), "--length", "48", "--batch", "3", "--ragged", "16",
                        "--rounds", "1"])
    out = capsys.readouterr().out
    assert "[48, 32, 16] real tokens, padded to 48" in out and "| Trunk |" in out and "| transformers |" in out
    assert "Trunk / transformers:" in out
