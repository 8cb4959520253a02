"""benchmarks/random_shapes.py: a folder of a named shape with random weights that both transformers and Trunk read."""

import sys

import pytest
from conftest import REPO

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(REPO / "benchmarks"))


def test_a_random_model_of_a_named_shape_loads_in_transformers_and_in_trunk(tmp_path):
    import random_shapes
    from test_hf import tiny

    from trunk.formats.hf import convert

    tiny("bert", tmp_path / "tokenizer", masked_lm=False)  # a folder with a tokenizer.json to copy
    transformers.AutoTokenizer.from_pretrained(tmp_path / "tokenizer").save_pretrained(tmp_path / "tokenizer")
    folder = random_shapes.write_random_model("deberta-v3-xsmall", tmp_path / "model", tmp_path / "tokenizer",
                                              num_hidden_layers=1, hidden_size=32, num_attention_heads=4,
                                              intermediate_size=64)
    model = transformers.AutoModel.from_pretrained(folder)
    assert type(model).__name__ == "DebertaV2Model" and model.config.position_buckets == 256
    pretrained, _ = convert(folder)
    assert pretrained.config.positions == "disentangled" and pretrained.config.relative_buckets == 512
    assert pretrained.codec.tokenizer.get_vocab_size() == model.config.vocab_size


def test_a_random_modernbert_takes_the_borrowed_tokenizers_special_ids(tmp_path):
    import random_shapes
    from test_hf import tiny

    from trunk.formats.hf import convert

    tiny("bert", tmp_path / "tokenizer", masked_lm=False)
    transformers.AutoTokenizer.from_pretrained(tmp_path / "tokenizer").save_pretrained(tmp_path / "tokenizer")
    folder = random_shapes.write_random_model("modernbert-base", tmp_path / "model", tmp_path / "tokenizer",
                                              num_hidden_layers=3, hidden_size=32, num_attention_heads=4,
                                              intermediate_size=48)
    model = transformers.AutoModel.from_pretrained(folder)
    assert (model.config.pad_token_id, model.config.sep_token_id) == (0, 8)  # BERT's test vocabulary's
    pretrained, _ = convert(folder)
    assert (pretrained.config.global_every, pretrained.config.local_window) == (3, 64)
