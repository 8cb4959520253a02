"""benchmarks/translate_speed.py: beam search beside transformers' generate on the same random translator."""

import sys

import pytest
from conftest import REPO

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(REPO / "benchmarks"))


@pytest.mark.parametrize("shape", ["opus-mt-en-de", "nllb-200-distilled-600M"])
def test_both_sides_write_the_same_translations(shape, monkeypatch, capsys):
    import translate_speed

    small = {"d_model": 32, "encoder_layers": 1, "decoder_layers": 2, "encoder_attention_heads": 4,
             "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 300}
    model_type, values = translate_speed.SHAPES[shape]
    pad = {"marian": {"pad_token_id": 299, "decoder_start_token_id": 299}}.get(model_type, {})
    monkeypatch.setitem(translate_speed.SHAPES, shape, (model_type, {**values, **small, **pad}))
    translate_speed.main(["--shape", shape, "--sentences", "6", "--batch-size", "3", "--repeats", "1",
                          "--precision", "32-true"])
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("| 32-true |") and "| 6/6 |" in row
