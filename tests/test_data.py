"""Datamodules: sources, labels, tokenizer, dynamic padding, bucketing, and clear errors on bad input."""

import random
import warnings

import pytest
import torch
from torch.utils.data import RandomSampler

from conftest import write_rows
from trunk.datamodules import LengthBucketBatchSampler, TextClassificationData
from trunk.datamodules.builtin import sentiment_example
from trunk.datamodules.tokenizer import CLS, PAD, SEP, load_tokenizer, train_wordpiece


def make_data(files, **kwargs) -> TextClassificationData:
    args = {"train": str(files["train"]), "validation": str(files["validation"]), "test": str(files["test"]),
            "tokenizer_vocab_size": 300, "batch_size": 16}
    return TextClassificationData(**{**args, **kwargs})


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_local_formats_and_string_labels(tmp_path, suffix):
    rng = random.Random(1)
    files = {s: write_rows(tmp_path / f"{s}{suffix}", [sentiment_example(rng) for _ in range(40)]) for s in ("train", "validation", "test")}
    dm = make_data(files)
    assert dm.label_names == ["negative", "positive"]
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_ids", "attention_mask", "labels", "text"}
    assert batch["labels"].dtype == torch.long and batch["labels"].shape == (16,)


def test_parquet_and_sentence_pairs(tmp_path):
    import datasets

    rows = [{"premise": f"a man plays {i}", "hypothesis": f"someone plays {i % 3}", "label": i % 3} for i in range(30)]
    for split in ("train", "validation"):
        datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / f"{split}.parquet"))
    dm = TextClassificationData(train=str(tmp_path / "train.parquet"), validation=str(tmp_path / "validation.parquet"),
                                text_column="premise", text_pair_column="hypothesis", tokenizer_vocab_size=100, batch_size=4)
    assert dm.label_names == ["0", "1", "2"]
    dm.setup("fit")
    ids = next(iter(dm.train_dataloader()))["input_ids"][0].tolist()
    tok = dm.tokenizer
    assert ids[0] == tok.token_to_id(CLS) and ids.count(tok.token_to_id(SEP)) == 2  # [CLS] a [SEP] b [SEP]


def test_integer_labels_with_word_names(tmp_path):
    rows = [{"sentence": t, "label": i % 2} for i, t in enumerate(["good film", "bad film"] * 10)]
    f = write_rows(tmp_path / "train.tsv", rows)
    dm = TextClassificationData(train=str(f), text_column="sentence", label_names=["negative", "positive"], tokenizer_vocab_size=50)
    dm.setup("fit")
    assert [e["label"] for e in dm._encoded["train"][:4]] == [0, 1, 0, 1]


def test_builtin_dataset_is_deterministic_and_balanced():
    dm = TextClassificationData(dataset="trunk:sentiment", train="train", tokenizer_vocab_size=200)
    rows = dm.raw("train")
    again = TextClassificationData(dataset="trunk:sentiment", train="train").raw("train")
    assert rows["text"][:50] == again["text"][:50]
    share = rows["label"].count("positive") / len(rows)
    assert 0.4 < share < 0.6


def test_dynamic_padding_pads_to_the_longest_in_batch(sentiment_files):
    dm = make_data(sentiment_files, max_length=64, batch_size=8)
    dm.setup("fit")
    for batch in dm.val_dataloader():
        lengths = batch["attention_mask"].sum(1)
        assert batch["input_ids"].shape[1] == lengths.max() < 64
        assert (batch["input_ids"][batch["attention_mask"] == 0] == dm.pad_id).all()


def test_length_bucketing_covers_every_example_once():
    lengths = [random.Random(i).randint(1, 50) for i in range(1000)]
    sampler = LengthBucketBatchSampler(RandomSampler(range(1000)), batch_size=16, drop_last=False, lengths=lengths, pool_batches=8)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    assert spread < 10  # random batches of 16 from 1..50 spread about 43


def test_trained_tokenizer_is_cached_so_every_process_gets_the_same_ids(sentiment_files, tmp_path):
    """WordPiece training itself is not deterministic; the cache makes repeated runs (and DDP ranks) agree."""
    a, b = make_data(sentiment_files), make_data(sentiment_files)
    assert a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
    assert a.tokenizer.token_to_id(PAD) == 0
    other = make_data(sentiment_files, tokenizer_vocab_size=200)
    assert other.vocab_size <= 200 < a.vocab_size  # different options, different cache entry


def test_tokenizer_round_trips_through_files(tmp_path):
    texts = [sentiment_example(random.Random(i))["text"] for i in range(300)]
    tok = train_wordpiece(texts, vocab_size=200)
    tok.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path).get_vocab() == tok.get_vocab()  # a directory holding tokenizer.json works too
    assert load_tokenizer(tmp_path / "tokenizer.json").encode("good film").ids == tok.encode("good film").ids


def test_long_texts_are_truncated_with_one_warning(tmp_path):
    rows = [{"text": "word " * 200, "label": "a"}, {"text": "short", "label": "b"}, {"text": "word " * 300, "label": "a"}]
    f = write_rows(tmp_path / "train.csv", rows)
    dm = TextClassificationData(train=str(f), max_length=16, tokenizer_vocab_size=50)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm.setup("fit")
    messages = [str(w.message) for w in caught if "truncated" in str(w.message)]
    assert len(messages) == 1 and "2 of 3 examples" in messages[0] and "max_length=16" in messages[0]
    assert max(len(e["input_ids"]) for e in dm._encoded["train"]) == 16


# -- bad input ----------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    dm = TextClassificationData(train=str(tmp_path / "nope.csv"))
    with pytest.raises(FileNotFoundError, match=r"data.train: file .*nope.csv' does not exist"):
        dm.label_names


def test_wrong_column_names_the_option_and_the_choices(sentiment_files):
    dm = make_data(sentiment_files, text_column="sentence")
    with pytest.raises(KeyError, match=r"no column 'sentence' \(set by data.text_column\).*\['text', 'label'\]"):
        dm.setup("fit")


def test_empty_split(tmp_path, sentiment_files):
    empty = tmp_path / "empty.csv"
    empty.write_text("text,label\n")
    dm = make_data(sentiment_files, validation=str(empty))
    with pytest.raises(ValueError, match="data.validation .* is empty"):
        dm.setup("fit")


def test_unseen_label_at_test_time(tmp_path, sentiment_files):
    bad = write_rows(tmp_path / "bad_test.csv", [{"text": "meh", "label": "neutral"}])
    dm = make_data(sentiment_files, test=str(bad))
    dm.setup("fit")
    with pytest.raises(ValueError, match=r"data.test has labels \['neutral'\] that training never saw"):
        dm.setup("test")


def test_unknown_file_type_and_bad_tokenizer_path(tmp_path):
    (tmp_path / "train.xml").write_text("<x/>")
    with pytest.raises(ValueError, match="unknown file type '.xml'"):
        TextClassificationData(train=str(tmp_path / "train.xml")).label_names
    with pytest.raises(FileNotFoundError, match="Tokenizer not found"):
        TextClassificationData(tokenizer=str(tmp_path / "missing.json")).vocab_size


def test_hub_dataset_offline_gives_a_clear_error():
    dm = TextClassificationData(dataset="glue", dataset_config="sst2", train="train")
    with pytest.raises(ValueError, match="Could not load split 'train'.*dataset 'glue'"):
        dm.label_names


def test_dataset_directory_with_classlabel_features(tmp_path):
    """The hub code path (load_dataset by name + split), offline: a local dataset directory whose
    parquet files carry a ClassLabel feature, like glue/sst2 on the hub."""
    import datasets

    features = datasets.Features({"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["negative", "positive"])})
    rows = {"sentence": ["a bad film", "a good film"] * 8, "label": [0, 1] * 8}
    (tmp_path / "sst").mkdir()
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "sst/train.parquet"))
    hidden = {"sentence": ["unknown"] * 4, "label": [-1] * 4}
    datasets.Dataset.from_dict(hidden, features=features).to_parquet(str(tmp_path / "sst/test.parquet"))
    dm = TextClassificationData(dataset=str(tmp_path / "sst"), train="train", test="test", text_column="sentence", tokenizer_vocab_size=50)
    assert dm.label_names == ["negative", "positive"]  # from the ClassLabel, not from the values
    dm.setup("fit")
    assert [e["label"] for e in dm._encoded["train"][:2]] == [0, 1]
    with pytest.raises(ValueError, match="unlabelled rows .* use `trunk predict`"):
        dm.setup("test")
