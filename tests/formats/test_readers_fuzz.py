"""Property-based fuzzing of the file readers: whatever bytes a checkpoint, a trunk directory, a Hugging Face model
folder, a SentencePiece model or a data file holds, reading it gives the data or one clear error (ValueError,
FileNotFoundError), never another exception from deep inside; and what they make of labels and edits: any label
with an invisible character or in another Unicode form is named and folded, any edit in place is read. Derandomised
(tests/conftest.py's profile "ci")."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from trunk.core.checkpoint import load_checkpoint  # noqa: E402
from trunk.formats.hf import FAMILIES, convert, map_weights  # noqa: E402
from trunk.formats.trunk_dir import load_pretrained  # noqa: E402

CLEAR = (ValueError, FileNotFoundError)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=16,
)
PICKLE_HEAD = b"PK\x03\x04"  # torch.save writes a zip; random bytes after a real head go further into the reader


ROOT: list[Path] = []  # this module's temporary folder (removed by pytest): hypothesis draws many examples a test,
# and a function-scoped tmp_path is one folder for all of them


@pytest.fixture(autouse=True, scope="module")
def fuzz_root(tmp_path_factory):
    ROOT.append(tmp_path_factory.mktemp("fuzz"))
    yield
    shutil.rmtree(ROOT.pop(), ignore_errors=True)


def folder() -> Path:
    return Path(tempfile.mkdtemp(dir=ROOT[-1]))


def refused_clearly(read, *args) -> None:
    try:
        read(*args)
    except CLEAR as err:
        assert str(err) and "Traceback" not in str(err)


@given(st.binary(max_size=2000) | st.binary(max_size=500).map(lambda b: PICKLE_HEAD + b))
def test_any_checkpoint_file(data):
    path = folder() / "model.ckpt"
    path.write_bytes(data)
    refused_clearly(load_checkpoint, path)


@given(JSON.map(json.dumps) | st.text(max_size=300), st.binary(max_size=300))
def test_any_trunk_directory(config, weights):
    path = folder()
    (path / "config.json").write_text(config)
    (path / "model.safetensors").write_bytes(weights)
    refused_clearly(load_pretrained, path)


@given(st.sampled_from(sorted(FAMILIES)), st.dictionaries(st.sampled_from(
    ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size", "hidden_act",
     "max_position_embeddings", "d_model", "num_layers", "num_heads", "d_kv", "d_ff", "encoder_layers",
     "decoder_layers", "image_size", "patch_size", "position_embedding_type", "layer_norm_eps", "dim", "n_layers"]),
    JSON, max_size=8), st.binary(max_size=200))
def test_any_hugging_face_folder(model_type, values, weights):
    """The config read on its own (as a real folder's is, before its weights: ``map_weights`` with none), and with
    the weights file."""
    path = folder()
    (path / "config.json").write_text(json.dumps({"model_type": model_type, **values}))
    (path / "model.safetensors").write_bytes(weights)
    refused_clearly(map_weights, {"model_type": model_type, **values}, {}, path)
    refused_clearly(convert, path)


@given(st.binary(max_size=1000))
def test_any_sentencepiece_file(data):
    pytest.importorskip("sentencepiece")
    from trunk.formats.spm import spm_tokenizer

    path = folder() / "spiece.model"
    path.write_bytes(data)
    refused_clearly(spm_tokenizer, path)


@given(st.sampled_from([".csv", ".tsv", ".jsonl", ".txt"]), st.text(max_size=300) | st.binary(max_size=300))
@hypothesis.settings(max_examples=25)  # each read goes through datasets
def test_any_data_file(suffix, content):
    from trunk.datamodules.sources import load_split

    path = folder() / f"train{suffix}"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    refused_clearly(load_split, None, None, str(path), "data.train")


INVISIBLE = st.sampled_from(["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"])
LABEL = st.text(st.characters(categories=["Ll", "Lu", "Nd"], max_codepoint=0x24F), min_size=1, max_size=8)


@given(LABEL, INVISIBLE, st.integers(0, 8), st.booleans())
def test_any_label_with_an_invisible_character_or_another_unicode_form_is_named_and_folded(label, mark, at, decompose):
    """A label and its copy with an invisible character inserted (or its decomposed form): one group of labels that
    print alike, the difference naming the code point; normalize_labels: nfkc (nfc for the forms) makes them one."""
    import unicodedata

    from trunk.core.labels import alike_groups, difference, fold_label

    other = unicodedata.normalize("NFD", label) if decompose else label[:at] + mark + label[at:]
    if other == label:
        return  # nothing decomposes
    assert alike_groups([label, other]) == [sorted([label, other])]
    said = difference(label, other)
    changed = {c for c in other if c not in label} or {c for c in label if c not in other}
    assert all(f"U+{ord(c):04X} {unicodedata.name(c)}" in said for c in changed), said
    assert fold_label(other, "nfkc") == fold_label(label, "nfkc")
    assert (fold_label(other, "nfc") == fold_label(label, "nfc")) == decompose


@given(st.lists(st.sampled_from(["pos", "neg"]), min_size=4, max_size=30), st.data())
@hypothesis.settings(max_examples=10)  # each read goes through datasets and the encoded cache
def test_any_in_place_edit_that_keeps_size_and_mtime_is_read(labels, data):
    """Labels of a csv swapped in place at any rows, the modification time set back: the next run reads the edit."""
    import os

    from trunk.datamodules import MultiTaskData, TextClassificationData

    path = folder() / "train.csv"
    path.write_text("text,label\n" + "".join(f"text {i},{y}\n" for i, y in enumerate(labels)))

    def read() -> list[str]:
        run = MultiTaskData({"task": TextClassificationData(train=str(path), label_names=["neg", "pos"],
                                                            val_fraction=0.0)}, tokenizer_vocab_size=60)
        run.setup("fit")
        return [["neg", "pos"][i] for i in run.tasks["task"]._encoded["train"]["label"]]

    assert read() == labels
    rows = data.draw(st.sets(st.integers(0, len(labels) - 1), min_size=1))
    edited = [{"pos": "neg", "neg": "pos"}[y] if i in rows else y for i, y in enumerate(labels)]
    stat = path.stat()
    path.write_text("text,label\n" + "".join(f"text {i},{y}\n" for i, y in enumerate(edited)))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert read() == edited
