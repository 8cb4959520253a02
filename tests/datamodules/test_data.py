"""Datamodules: sources, labels, the run's tokenizer, padding, bucketing, task sampling, and clear errors on bad
input."""

import collections
import json
import os
import random
import warnings
from pathlib import Path

import pytest
import torch
from conftest import write_rows
from tokenizers import Tokenizer

from trunk.core.codec import CLS, PAD, SEP, SPECIAL_TOKENS, load_tokenizer
from trunk.datamodules import CorpusData, MultiTaskData, TaskSampler, TextClassificationData, TokenClassificationData
from trunk.datamodules.builtin import sentiment_example
from trunk.datamodules.sources import column
from trunk.datamodules.text import hold_out, length_buckets
from trunk.datamodules.tokenizer import CHARS_PER_TOKEN, TRAINERS, cut_long_texts, train_wordpiece


def run_data(member, name: str = "sst", **options) -> MultiTaskData:
    return MultiTaskData({name: member}, **{"tokenizer_vocab_size": 300, **options})


def make_data(files, **kwargs) -> MultiTaskData:
    args = {
        "train": str(files["train"]),
        "validation": str(files["validation"]),
        "test": str(files["test"]),
        "batch_size": 16,
    }
    return run_data(TextClassificationData(**{**args, **kwargs}))


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_local_formats_and_string_labels(tmp_path, suffix):
    rng = random.Random(1)
    files = {
        s: write_rows(tmp_path / f"{s}{suffix}", [sentiment_example(rng) for _ in range(40)])
        for s in ("train", "validation", "test")
    }
    data = make_data(files)
    assert data.tasks["sst"].label_names == ["negative", "positive"]
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert set(batch) == {"task", "input_ids", "attention_mask", "labels", "text", "rows"} and batch["task"] == "sst"
    encoded = data.tasks["sst"]._encoded["train"]  # each row named by its split and index: the batch's own texts
    assert [encoded[int(r.removeprefix("train/"))]["text"] for r in batch["rows"]] == batch["text"]
    assert batch["labels"].dtype == torch.long and batch["labels"].shape == (16,)


def test_parquet_and_sentence_pairs(tmp_path):
    import datasets

    rows = [{"premise": f"a man plays {i}", "hypothesis": f"someone plays {i % 3}", "label": i % 3} for i in range(30)]
    for split in ("train", "validation"):
        datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / f"{split}.parquet"))
    data = run_data(
        TextClassificationData(
            train=str(tmp_path / "train.parquet"),
            validation=str(tmp_path / "validation.parquet"),
            text_column="premise",
            text_pair_column="hypothesis",
            batch_size=4,
        ),
        tokenizer_vocab_size=100,
    )
    assert data.tasks["sst"].label_names == ["0", "1", "2"]
    data.setup("fit")
    ids = next(iter(data.train_dataloader()))["input_ids"][0].tolist()
    tok = data.tokenizer
    assert ids[0] == tok.token_to_id(CLS) and ids.count(tok.token_to_id(SEP)) == 2  # [CLS] a [SEP] b [SEP]


def test_integer_labels_with_word_names(tmp_path):
    rows = [{"sentence": t, "label": i % 2} for i, t in enumerate(["good film", "bad film"] * 10)]
    f = write_rows(tmp_path / "train.tsv", rows)
    data = run_data(TextClassificationData(train=str(f), text_column="sentence", label_names=["negative", "positive"]),
                    tokenizer_vocab_size=50)
    data.setup("fit")
    assert data.tasks["sst"]._encoded["train"]["label"][:4] == [0, 1, 0, 1]


def test_builtin_dataset_is_deterministic_and_balanced():
    rows = TextClassificationData(dataset="trunk:sentiment", train="train").raw("train")
    again = TextClassificationData(dataset="trunk:sentiment", train="train").raw("train")
    assert rows["text"][:50] == again["text"][:50]
    share = rows["label"].count("positive") / len(rows)
    assert 0.4 < share < 0.6


def test_held_out_validation_is_random_stratified_and_seeded(tmp_path):
    rng = random.Random(0)
    rows = [{"text": f"example {i}", "label": "rare" if i % 10 == 0 else "common"} for i in range(200)]
    rng.shuffle(rows)
    member = TextClassificationData(train=str(write_rows(tmp_path / "train.csv", rows)), val_fraction=0.1)
    data = run_data(member, tokenizer_vocab_size=50)
    assert member.has_split("validation") and data.has_split("validation")
    data.setup("fit")
    train, validation = member.raw("train"), member.raw("validation")
    assert len(train) == 180 and len(validation) == 20 and not set(train["text"]) & set(validation["text"])
    assert collections.Counter(validation["label"]) == {"common": 18, "rare": 2}  # each label keeps its share
    tail = [r["text"] for r in rows[-20:]]
    assert set(validation["text"]) != set(tail)  # not simply the last rows
    assert hold_out(200, 0.1, strata=[r["label"] for r in rows]) == hold_out(
        200, 0.1, strata=[r["label"] for r in rows]
    )


def test_dynamic_padding_pads_to_the_longest_in_batch(sentiment_files):
    data = make_data(sentiment_files, max_length=64, batch_size=8)
    data.setup("fit")
    for batch in data.val_dataloader()[0]:
        lengths = batch["attention_mask"].sum(1)
        assert batch["input_ids"].shape[1] == lengths.max() < 64
        assert (batch["input_ids"][batch["attention_mask"] == 0] == data.tasks["sst"].pad_id).all()


@pytest.mark.parametrize("replicas", [2, 3, 5, 80])
def test_data_parallel_evaluation_scores_every_row_once_in_as_many_batches_on_every_replica(sentiment_files, replicas):
    """Lightning's sampler gives every replica as many rows by repeating some, which then counted twice in the
    metrics; each replica's shard leaves them out of its batches, and still has as many batches as the others. 80
    replicas for 64 rows: those without a row of their own score one (said, with how to get exact numbers)."""
    data = make_data(sentiment_files, batch_size=8)  # evaluation batches of 16; 64 validation rows
    data.setup("fit")
    member = data.tasks["sst"]

    def rows(loader) -> list[tuple]:
        return [tuple(ids[mask.bool()].tolist()) for batch in loader
                for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]

    whole = rows(member.loaders("validation")[0])
    assert len(whole) == 64
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        shards = [member.loaders("validation", shard=(rank, replicas))[0] for rank in range(replicas)]
    assert len({len(shard) for shard in shards}) == 1  # as many batches on every replica
    scored = [row for shard in shards for row in rows(shard)]
    if replicas < 64:
        assert collections.Counter(scored) == collections.Counter(whole)  # every row once
        assert not said
    else:
        assert len(scored) == replicas and collections.Counter(whole) <= collections.Counter(scored)
        assert "64 rows for 80 data-parallel replicas" in str(said[0].message) and "trainer.devices" in str(
            said[0].message)


def test_length_bucketing_covers_every_example_once():
    lengths = [random.Random(i).randint(1, 50) for i in range(1000)]
    order = list(range(1000))
    random.Random(0).shuffle(order)
    batches = length_buckets(order, lengths, 16, random.Random(1), pool_batches=8)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    assert spread < 10  # random batches of 16 from 1..50 spread about 43


def test_trained_tokenizer_is_cached_so_every_process_gets_the_same_ids(sentiment_files, tmp_path):
    """WordPiece training itself is not deterministic; the cache makes repeated runs (and DDP ranks) agree."""
    a, b = make_data(sentiment_files), make_data(sentiment_files)
    assert a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
    assert a.tokenizer.token_to_id(PAD) == 0
    other = run_data(TextClassificationData(train=str(sentiment_files["train"])), tokenizer_vocab_size=200)
    assert other.vocab_size <= 200 < a.vocab_size  # different options, different cache entry


def test_a_damaged_cached_tokenizer_is_trained_again(sentiment_files):
    first = make_data(sentiment_files).tokenizer
    cached = sorted((Path(os.environ["TRUNK_CACHE"]) / "tokenizers").glob("*.json"), key=lambda p: p.stat().st_mtime)[
        -1
    ]
    cached.write_text('{"truncated": ')
    with pytest.warns(UserWarning, match="is unreadable .* training it again"):
        again = make_data(sentiment_files).tokenizer
    assert load_tokenizer(cached).get_vocab() == again.get_vocab() and again.get_vocab_size() == first.get_vocab_size()


def test_editing_a_file_of_a_dataset_folder_retrains_the_tokenizer(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    write_rows(
        folder / "train.csv", [{"text": "alpha beta gamma", "label": "a"}, {"text": "alpha beta", "label": "b"}] * 20
    )
    first = run_data(TextClassificationData(dataset=str(folder), train="train"), tokenizer_vocab_size=60).tokenizer
    write_rows(
        folder / "train.csv", [{"text": "zeta omega kappa", "label": "a"}, {"text": "zeta omega", "label": "b"}] * 20
    )
    second = run_data(TextClassificationData(dataset=str(folder), train="train"), tokenizer_vocab_size=60).tokenizer
    assert "alpha" in first.get_vocab() and "alpha" not in second.get_vocab() and "zeta" in second.get_vocab()


def test_one_tokenizer_for_the_run_trained_on_every_task(sentiment_files, ner_files):
    data = MultiTaskData({"sst": TextClassificationData(train=str(sentiment_files["train"])),
                          "ner": TokenClassificationData(train=str(ner_files["train"]))}, tokenizer_vocab_size=400)
    vocab = data.tokenizer.get_vocab()
    assert "film" in vocab and "Nakamura" in vocab  # words of both tasks' training text
    assert data.tasks["sst"].tokenizer is data.tasks["ner"].tokenizer is data.tokenizer
    info = data.task_info
    assert info["sst"]["kinds"] == ["sequence_classification"] and info["ner"]["label_names"][0] == "O"


def test_tokenizer_round_trips_through_files(tmp_path):
    texts = [sentiment_example(random.Random(i))["text"] for i in range(300)]
    tok = train_wordpiece(texts, vocab_size=200)
    tok.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path).get_vocab() == tok.get_vocab()  # a directory holding tokenizer.json works too
    assert load_tokenizer(tmp_path / "tokenizer.json").encode("good film").ids == tok.encode("good film").ids


def test_wordpiece_training_gives_the_same_vocabulary_in_every_process():
    """The tokenizers library's WordPiece trainer numbers its ## pieces in hash-map order, which differs per process
    and, through tie breaks between equally frequent pairs, changes the vocabulary itself; Trunk's training does not."""
    import subprocess
    import sys

    train = ("import random, sys; from trunk.datamodules.builtin import sentiment_example; "
             "from trunk.datamodules.tokenizer import CHARS_PER_TOKEN, TRAINERS, cut_long_texts, train_wordpiece; "
             "texts = (sentiment_example(random.Random(i))['text'] + ' Señor Ünïcode x-ray' for i in range(300)); "
             "sys.stdout.write(train_wordpiece(texts, vocab_size=150).to_str())")
    processes = [subprocess.Popen([sys.executable, "-c", train], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    here = {}
    exec(train.replace("sys.stdout.write", "here['out'] = "), {"here": here})
    # strip: the trainer's bar
    runs = [here["out"], *(process.communicate(timeout=300)[0].strip() for process in processes)]
    assert runs[0] == runs[1] == runs[2]
    tokenizer = Tokenizer.from_str(runs[0])
    assert [
        token.content for token in tokenizer.get_added_tokens_decoder().values()
    ] == SPECIAL_TOKENS  # ## pieces stay plain
    assert "##n" in tokenizer.get_vocab() and tokenizer.encode("señor", add_special_tokens=False).tokens[0] == "senor"


def test_long_texts_are_truncated_with_one_warning(tmp_path):
    rows = [
        {"text": "word " * 200, "label": "a"},
        {"text": "short", "label": "b"},
        {"text": "word " * 300, "label": "a"},
    ]
    f = write_rows(tmp_path / "train.csv", rows)
    data = run_data(TextClassificationData(train=str(f), max_length=16), tokenizer_vocab_size=50)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data.setup("fit")
    messages = [str(w.message) for w in caught if "truncated" in str(w.message)]
    assert len(messages) == 1 and "2 of 3 examples" in messages[0] and "max_length=16" in messages[0]
    assert "may not exceed model.trunk.max_len" in messages[0]  # the second knob is named
    assert max(len(ids) for ids in data.tasks["sst"]._encoded["train"]["input_ids"]) == 16
    vocabulary = [str(w.message) for w in caught if "Asked for 50 tokens, the tokenizer has" in str(w.message)]
    # a warning, with its reason
    assert (len(vocabulary) == 1 and "has no more pieces seen at least 2 times" in vocabulary[0])


@pytest.mark.parametrize("train", ["wordpiece", "byte_bpe", "bpe"])
def test_texts_far_longer_than_max_length_are_cut_before_tokenizing_and_encode_as_whole(train):
    """A text that max_length cannot use whole is cut before the tokenizer sees it (a pair of two 100 KB texts encoded
    whole makes a window for every combination of their overflowing windows: minutes and gigabytes), and the cut
    texts give exactly the ids of the whole ones: singles, pairs with one or both long, every truncation strategy,
    whitespace runs, words longer than the cut."""
    rng = random.Random(0)
    examples = [sentiment_example(rng)["text"] for _ in range(200)]
    words = [w for text in examples for w in text.split()] + ["naïve", "x" * 150, "e-mail", "5.0", "(sic)"]
    tokenizer = TRAINERS[train](words * 3, vocab_size=300)
    tokenizer.post_processor = Tokenizer.from_str(train_wordpiece(words, vocab_size=200).to_str()).post_processor

    def text(n):
        spaces = rng.choice([" ", "  ", "\n", "\t "])
        return spaces.join(rng.choice(words) for _ in range(n)) + rng.choice(["", " " * 99])

    cut_any = 0
    for strategy in ("longest_first", "only_first", "only_second"):
        for _ in range(12):
            max_length = rng.choice([8, 12])
            tokenizer.enable_truncation(max_length, strategy=strategy)
            sizes = [3, 50, 80]  # words: the cut is at 32 characters a token
            texts = [rng.choice([text(n), (text(n), text(rng.choice(sizes)))]) if strategy == "longest_first"
                     else (text(n), text(rng.choice(sizes))) for n in rng.choices(sizes, k=4)]
            texts.append((texts[0],) * 2 if isinstance(texts[0], str) else texts[0][:1] * 2)  # a tie: equal lengths

            def encoded(batch):
                try:
                    return [(e.ids, bool(e.overflowing)) for e in tokenizer.encode_batch(batch)]
                except Exception as err:  # only_second with a long first text: the same refusal either way
                    return str(err)

            cut = cut_long_texts(tokenizer, texts, max_length)
            assert tokenizer.truncation["strategy"] == strategy  # left as given
            assert encoded(cut) == encoded(texts)
            cut_any += sum(a != b for a, b in zip(cut, texts))
    assert cut_any > 30

    tokenizer.enable_truncation(16)
    long = text(20_000)
    (single, pair) = cut_long_texts(tokenizer, [long, (long, long + " x")], 16)
    assert len(single) <= CHARS_PER_TOKEN * 16 and all(len(part) <= CHARS_PER_TOKEN * 16 for part in pair)
    assert tokenizer.encode(single).ids == tokenizer.encode(long).ids


def test_truncated_ner_sentences_say_their_cut_words_are_predicted_o(tmp_path):
    from conftest import write_conll

    words = [(f"w{i}", "B-PER" if i == 0 else "O") for i in range(30)]
    train = write_conll(tmp_path / "train.txt", [words, words[:3]])
    data = run_data(
        TokenClassificationData(train=str(train), max_length=12, context_length=0), name="ner", tokenizer_vocab_size=60
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data.setup("fit")
    message = next(str(w.message) for w in caught if "truncated" in str(w.message))
    cut = sum(start == -1 for start in data.tasks["ner"]._encoded["train"][0]["word_starts"])
    assert cut > 0 and "1 of 2 examples" in message
    assert f"({cut} words lost their sub-tokens: they are predicted O, and scored so)" in message


# -- task sampling ---------------------------------------------------------------------------------


SIZES = {"big": 900, "mid": 90, "small": 10}


@pytest.mark.parametrize("mode, expected", [
    ("proportional", {"big": 0.9, "mid": 0.09, "small": 0.01}),
    ("uniform", {"big": 1 / 3, "mid": 1 / 3, "small": 1 / 3}),
    ("fixed", {"big": 0.25, "mid": 0.25, "small": 0.5}),
])
def test_sampler_proportions(mode, expected):
    sampler = TaskSampler(SIZES, mode, weights={"big": 1, "mid": 1, "small": 2} if mode == "fixed" else None)
    assert sampler.probabilities() == pytest.approx(expected)
    counts = collections.Counter(sampler.draw(20000, torch.Generator().manual_seed(0)))
    for name, p in expected.items():  # binomial: std of the share is at most 0.0035 over 20k draws
        assert counts[name] / 20000 == pytest.approx(p, abs=0.015)


def test_temperature_and_annealed_sampling_follow_their_formulas():
    t2 = TaskSampler(SIZES, "temperature", temperature=2.0).probabilities()
    root = {k: v ** 0.5 for k, v in SIZES.items()}
    assert t2 == pytest.approx({k: v / sum(root.values()) for k, v in root.items()})  # p ∝ n^(1/T), exactly
    annealed = TaskSampler(SIZES, "annealed", anneal_to=0.0)
    assert annealed.probabilities(0.0) == pytest.approx(TaskSampler(SIZES).probabilities())  # proportional at the start
    # uniform at the end
    assert annealed.probabilities(1.0) == pytest.approx(TaskSampler(SIZES, "uniform").probabilities())
    half = {k: v ** 0.5 for k, v in SIZES.items()}
    assert annealed.probabilities(0.5) == pytest.approx({k: v / sum(half.values()) for k, v in half.items()})


def test_bad_sampling_options_are_clear_errors(sentiment_files):
    with pytest.raises(ValueError, match="weights must be finite and >= 0"):
        TaskSampler(SIZES, "fixed", weights={"big": -1, "mid": 1, "small": 1})
    with pytest.raises(ValueError, match="sum to zero"):
        TaskSampler(SIZES, "fixed", weights={"big": 0, "mid": 0, "small": 0})
    with pytest.raises(ValueError, match="one weight per task"):
        TaskSampler(SIZES, "fixed", weights={"big": 1})
    with pytest.raises(ValueError, match="not one of"):
        TaskSampler(SIZES, "random")
    member = TextClassificationData(train=str(sentiment_files["train"]))
    with pytest.raises(ValueError, match="sum to zero"):
        MultiTaskData({"a": member}, sampling="fixed", weights={"a": 0.0})
    with pytest.raises(ValueError, match="predict_task='b' is not a task"):
        MultiTaskData({"a": member}, predict_task="b")
    for temperature in (0, -1.5):  # refused when the data is built, before any file is read
        with pytest.raises(ValueError, match=f"data.temperature must be > 0, got {temperature}: p ∝ n"):
            MultiTaskData({"a": member}, sampling="temperature", temperature=temperature)


def two_task_data(sentiment_files, ner_files, **options) -> MultiTaskData:
    return MultiTaskData({"sst": TextClassificationData(train=str(sentiment_files["train"]), batch_size=16),
                          "ner": TokenClassificationData(train=str(ner_files["train"]), batch_size=8)},
                         tokenizer_vocab_size=300, seed=3, **options)


def epoch_batches(data: MultiTaskData, epoch: int, rank: int, world: int) -> list[dict]:
    data.position = lambda: (epoch, rank, world)
    return list(data.train_dataloader())


def test_every_process_takes_the_same_task_at_each_step_and_its_own_rows(sentiment_files, ner_files):
    data = two_task_data(sentiment_files, ner_files)
    data.setup("fit")
    ranks = [epoch_batches(data, 0, rank, 2) for rank in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == data.steps_per_epoch() == 8 + 13  # ceil(128/16) + ceil(100/8)
    assert [b["task"] for b in ranks[0]] == [b["task"] for b in ranks[1]]  # same task sequence
    assert {b["task"] for b in ranks[0]} == {"sst", "ner"}
    for step in range(len(ranks[0])):  # different shards of that task
        a, b = (r[step] for r in ranks)
        assert a["text" if a["task"] == "sst" else "words"] != b["text" if b["task"] == "sst" else "words"]
    again = epoch_batches(data, 0, 0, 2)
    assert [b["task"] for b in again] == [b["task"] for b in ranks[0]]  # deterministic under the seed
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(again, ranks[0]))
    other_epoch = epoch_batches(data, 1, 0, 2)
    assert [b["task"] for b in other_epoch] != [b["task"] for b in ranks[0]]


def test_one_epoch_of_a_single_task_visits_every_row_once(sentiment_files):
    data = run_data(TextClassificationData(train=str(sentiment_files["train"]), batch_size=16, bucket_by_length=True))
    data.setup("fit")
    texts = [t for b in epoch_batches(data, 0, 0, 1) for t in b["text"]]
    assert sorted(texts) == sorted(data.tasks["sst"].raw("train")["text"])


# -- bad input ----------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    member = TextClassificationData(train=str(tmp_path / "nope.csv"))
    run_data(member, tokenizer="unused")
    with pytest.raises(FileNotFoundError, match=r"data.tasks.sst.train: file .*nope.csv' does not exist. .* or set "
                                                r"data.tasks.sst.dataset to load a hub dataset by name"):
        member.label_names  # noqa: B018 (reading it raises)


def test_wrong_column_names_the_option_and_the_choices(sentiment_files):
    data = make_data(sentiment_files, text_column="sentence")
    with pytest.raises(
        ValueError, match=r"no column 'sentence' \(set by data.tasks.sst.text_column\).*\['text', 'label'\]"
    ):
        data.setup("fit")


def test_empty_split(tmp_path, sentiment_files):
    empty = tmp_path / "empty.csv"
    empty.write_text("text,label\n")
    data = make_data(sentiment_files, validation=str(empty))
    with pytest.raises(ValueError, match="data.tasks.sst.validation .* is empty"):
        data.setup("fit")


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"", r"is empty: it has no rows"),
        (b"\n  \n", r"is empty: it has no rows"),
        (bytes(range(256)) * 8, r"is a binary file \(NUL bytes at line 1\), not csv text"),
        (
            "text,label\ngood film,positive\ncaf\u00e9 cr\u00e8me,negative\n".encode("latin-1"),
            r"bad.csv, line 3: byte 0xe9 at column 4 is not utf-8. Set the file.s encoding \(data.tasks.sst.encoding: "
            r"latin-1, cp1252, ...\) or save it as UTF-8",
        ),
        (
            b"text,label\ngood film,positive\nslow, dull film,negative\n",
            r"bad.csv' line 3 has 3 comma-separated fields where the file's first row has 2: a text holding a comma "
            r"splits into more fields. Fix or remove that line, or quote the text",
        ),
    ],
)
def test_unreadable_files_name_the_file_the_line_and_the_fix(tmp_path, sentiment_files, content, problem):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=r"data.tasks.sst.train.*" + problem):
        make_data(sentiment_files, train=str(bad)).setup("fit")


def test_a_tsv_row_with_a_tab_in_its_text_is_named_with_its_line_alone(tmp_path, sentiment_files, caplog):
    bad = tmp_path / "bad.tsv"
    bad.write_text("text\tlabel\ngood film\tpositive\nslow\tdull film\tnegative\n")
    with pytest.raises(ValueError, match=r"bad.tsv' line 3 has 3 tab-separated fields where the file's first row has "
                                         r"2: a text holding a tab splits into more fields. Fix or remove that line.$"):
        make_data(sentiment_files, train=str(bad)).setup("fit")
    assert "Failed to read" not in caplog.text  # datasets' own log line of it is not shown beside the error


def test_a_non_utf8_conll_file_names_its_line(tmp_path):
    bad = tmp_path / "train.txt"
    bad.write_bytes("Paris NN O B-LOC\n\nM\u00fcnchen NN O B-LOC\n".encode("latin-1"))
    with pytest.raises(
        ValueError, match=r"train.txt, line 3: byte 0xfc at column 2 is not utf-8. Set the file.s encoding"
    ):
        run_data(TokenClassificationData(train=str(bad)), name="ner").setup("fit")


@pytest.mark.parametrize(
    "labels, problem",
    [
        ([0.12, 0.5, 0.97, 0.33], r"column 'label' holds real numbers \(0.12, 0.33, 0.5, ...\), not class labels"),
        (
            [0, 1, "negative", "positive"],
            r"column 'label' mixes numbers \['0', '1'\] and names \['negative', 'positive'\] as labels",
        ),
        ([["joy", "love"], ["anger"]], r"column 'label' holds lists \(\['joy', 'love'\]\), not one class per row. "
                                       r"Rows with several labels are multi-label: use trunk.tasks.MultiLabel"),
    ],
)
def test_labels_that_are_not_classes_are_refused(tmp_path, sentiment_files, labels, problem):
    rows = [{"text": f"review {i}", "label": labels[i % len(labels)]} for i in range(40)]
    train = write_rows(tmp_path / "odd.jsonl", rows)
    with pytest.raises(ValueError, match=r"data.tasks.sst.train: " + problem):
        make_data(sentiment_files, train=str(train)).setup("fit")


def test_whole_number_floats_are_classes(tmp_path, sentiment_files):
    """A csv label column read as floats (1.0, 0.0) holds classes 1 and 0."""
    rows = [{"text": f"review {i}", "label": float(i % 2)} for i in range(40)]
    data = make_data(sentiment_files, train=str(write_rows(tmp_path / "f.jsonl", rows)),
                     validation=str(write_rows(tmp_path / "v.jsonl", rows[:8])))
    data.setup("fit")
    assert data.tasks["sst"].label_names == ["0", "1"]


def test_unseen_label_at_test_time(tmp_path, sentiment_files):
    bad = write_rows(tmp_path / "bad_test.csv", [{"text": "meh", "label": "neutral"}])
    data = make_data(sentiment_files, test=str(bad))
    data.setup("fit")
    with pytest.raises(
        ValueError, match=r"data.tasks.sst.test has labels \['neutral'\] that the training split never has"
    ):
        data.setup("test")


def test_configured_label_names_that_miss_the_data_say_so(tmp_path, sentiment_files):
    data = make_data(sentiment_files, label_names=["bad", "good"])
    with pytest.raises(
        ValueError, match=r"not in the configured label_names \['bad', 'good'\]. Remove data.tasks.sst.label_names"
    ):
        data.setup("fit")


def test_unknown_file_type_and_bad_tokenizer_path(tmp_path):
    (tmp_path / "train.xml").write_text("<x/>")
    with pytest.raises(ValueError, match="unknown file type '.xml'"):
        TextClassificationData(train=str(tmp_path / "train.xml")).label_names  # noqa: B018 (reading it raises)
    with pytest.raises(FileNotFoundError, match="Tokenizer not found"):
        run_data(TextClassificationData(), tokenizer=str(tmp_path / "missing.json")).vocab_size  # noqa: B018 (it raises)


def test_hub_dataset_offline_gives_a_clear_error():
    dm = TextClassificationData(dataset="glue", dataset_config="sst2", train="train")
    with pytest.raises(ValueError, match="Could not load split 'train'.*dataset 'glue'"):
        dm.label_names  # noqa: B018 (reading it raises)


def test_dataset_directory_with_classlabel_features(tmp_path):
    """The hub code path (load_dataset by name + split), offline: a local dataset directory whose
    parquet files carry a ClassLabel feature, like glue/sst2 on the hub."""
    import datasets

    features = datasets.Features(
        {"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["negative", "positive"])}
    )
    rows = {"sentence": ["a bad film", "a good film"] * 8, "label": [0, 1] * 8}
    (tmp_path / "sst").mkdir()
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "sst/train.parquet"))
    hidden = {"sentence": ["unknown"] * 4, "label": [-1] * 4}
    datasets.Dataset.from_dict(hidden, features=features).to_parquet(str(tmp_path / "sst/test.parquet"))
    member = TextClassificationData(dataset=str(tmp_path / "sst"), train="train", test="test", text_column="sentence")
    data = run_data(member, tokenizer_vocab_size=50)
    assert member.label_names == ["negative", "positive"]  # from the ClassLabel, not from the values
    data.setup("fit")
    assert member._encoded["train"]["label"][:2] == [0, 1]
    with pytest.raises(
        ValueError,
        match=r"test has no labels: every row's 'label' is -1 .* `trunk predict .*--data.tasks.sst.predict=test`",
    ):
        data.setup("test")


def test_corpus_data_feeds_pretraining_objectives_only():
    assert CorpusData.kinds == ("masked_lm", "replaced_token_detection")


def test_select_keeps_the_rows_of_one_split_from_a_file_that_holds_several(tmp_path):
    rows = [
        {"text": f"text {i}", "label": "a" if i % 2 else "b", "set": ["TRAIN", "TRIAL", "TEST"][i % 3]}
        for i in range(30)
    ]
    path = write_rows(tmp_path / "all.tsv", rows)
    member = TextClassificationData(
        train=str(path), validation=str(path), select={"train": {"set": "TRAIN"}, "validation": {"set": ["TRIAL"]}}
    )
    assert column(member.raw("train"), "text") == [r["text"] for r in rows if r["set"] == "TRAIN"]
    assert len(member.raw("validation")) == 10
    with pytest.raises(
        ValueError,
        match=r"select.train: no row of '.*all.tsv' has set in \['DEV'\]; "
        r"the column holds \['TEST', 'TRAIN', 'TRIAL'\]",
    ):
        TextClassificationData(train=str(path), select={"train": {"set": "DEV"}}).raw("train")
    with pytest.raises(ValueError, match=r"has no column 'split'; its columns are \['text', 'label', 'set'\]"):
        TextClassificationData(train=str(path), select={"train": {"split": "TRAIN"}}).raw("train")
    with pytest.raises(ValueError, match=r"select names the splits \['dev'\]"):
        TextClassificationData(train=str(path), select={"dev": {"set": "TRIAL"}})


def test_a_file_without_a_header_is_read_by_column_names_and_its_data_row_is_not_taken_for_one(tmp_path):
    path = tmp_path / "no_header.tsv"
    path.write_text("a gripping film from start to end\t1\tid1\nthe plot was dull\t0\tid2\nsuperb\t1\tid3\n")
    with pytest.raises(
        ValueError,
        match=r"looks like data rather than a header: if the file has no header row, name its columns "
        r"with data.tasks.task.column_names",
    ):
        TextClassificationData(train=str(path)).raw("train")
    member = TextClassificationData(train=str(path), column_names=["sentence", "label", "id"], text_column="sentence")
    assert column(member.raw("train"), "sentence") == [
        "a gripping film from start to end",
        "the plot was dull",
        "superb",
    ]  # no row lost
    assert member.label_names == ["0", "1"]
    with pytest.raises(ValueError, match="column_names is for csv / tsv files without a header"):
        TextClassificationData(
            train=str(write_rows(tmp_path / "rows.jsonl", [{"text": "a", "label": 1}])), column_names=["t", "l"]
        ).raw("train")


def test_a_csv_of_another_delimiter_is_named_and_read_with_it(tmp_path):
    """A spreadsheet saved as csv in many locales separates cells by ';': its header reads as one column, which is
    said with the option that reads it; with it set, training and predict files read (a comma in a text kept)."""
    path = tmp_path / "semicolons.csv"
    path.write_text("text;label\ngreat, funny film;pos\ndull;neg\nsuperb;pos\n")
    with pytest.raises(ValueError, match=r"data.tasks.task.train has no column 'text': its header 'text;label' is one "
                                         r"cell, its columns separated by ';'. Set data.tasks.task.delimiter: ';'"):
        TextClassificationData(train=str(path)).raw("train")
    mine = tmp_path / "mine.csv"  # the user's own inputs, read by their suffix, in the data's delimiter
    mine.write_text('id;review\n1;"a film; not bad"\n')
    member = TextClassificationData(train=str(path), predict=str(mine), delimiter=";")
    assert column(member.raw("train"), "text") == ["great, funny film", "dull", "superb"]
    assert member.label_names == ["neg", "pos"]
    assert column(member.raw("predict"), "text") == ["a film; not bad"]
    with pytest.raises(ValueError, match=r"delimiter=';;': a csv delimiter is one character"):
        run_data(TextClassificationData(train=str(path), delimiter=";;")).setup("fit")


def test_a_file_given_as_a_split_of_a_named_data_set_says_to_unset_it(tmp_path):
    """The quickstart's data is built in (dataset: trunk:sentiment): a predict file of one's own beside it is a split
    name to that data set, which the error says, with the option that makes it a path."""
    texts = tmp_path / "my_texts.txt"
    texts.write_text("a gripping film\n")
    with pytest.raises(ValueError, match=r"data.tasks.task.predict='.*my_texts.txt' is a file, but "
                                         r"data.tasks.task.dataset='trunk:sentiment' makes every split the name of one "
                                         r"of that data set's splits. To read files, set data.tasks.task.dataset=null"):
        TextClassificationData(dataset="trunk:sentiment", train="train", predict=str(texts)).raw("predict")


def test_every_missing_column_is_named_at_once(tmp_path):
    """A file whose text and labels are both under other names: one error names both options (fixing one, training
    a tokenizer, to be told the other was a run wasted)."""
    path = write_rows(tmp_path / "rows.jsonl", [{"review": "great", "sentiment": "pos"}, {"review": "dull",
                                                                                          "sentiment": "neg"}])
    with pytest.raises(ValueError, match=r"train has no columns 'text' \(set by data.tasks.task.text_column\) and "
                                         r"'label' \(set by data.tasks.task.label_column\). Its columns are "
                                         r"\['review', 'sentiment'\]"):
        TextClassificationData(train=str(path)).raw("train")
    with pytest.raises(ValueError, match=r"validation has no columns 'review' .* and 'sentiment' "):
        TextClassificationData(train=str(path), text_column="review", label_column="sentiment",
                               validation=str(write_rows(tmp_path / "dev.jsonl", [{"t": "ok", "l": "pos"}]))
                               ).raw("validation")
    member = TextClassificationData(train=str(path), text_column="review", label_column="sentiment")
    assert column(member.raw("train"), "review") == ["great", "dull"]


def test_a_json_object_holding_the_rows_is_named_and_a_json_list_is_read(tmp_path):
    rows = [{"text": "great", "label": "pos"}, {"text": "dull", "label": "neg"}]
    (tmp_path / "nested.json").write_text(json.dumps({"version": 1, "data": rows}))
    with pytest.raises(ValueError, match=r"train has no column 'text': the file is one JSON object whose 'data' holds "
                                         r"the rows \(2 records\). Give the records themselves: a .jsonl file"):
        TextClassificationData(train=str(tmp_path / "nested.json")).raw("train")
    (tmp_path / "list.json").write_text(json.dumps(rows))
    assert column(TextClassificationData(train=str(tmp_path / "list.json")).raw("train"), "text") == ["great", "dull"]


def test_hold_out_by_keeps_whole_groups_on_one_side(tmp_path):
    rows = [{"text": f"text {i}", "label": "a" if i % 2 else "b", "article": f"article {i // 5}"} for i in range(50)]
    member = TextClassificationData(
        train=str(write_rows(tmp_path / "rows.csv", rows)), val_fraction=0.2, hold_out_by="article"
    )
    train, validation = (set(column(member.raw(role), "article")) for role in ("train", "validation"))
    assert len(validation) == 2 and not train & validation and len(train | validation) == 10
    assert len(member.raw("validation")) == 10
    missing = TextClassificationData(
        train=str(write_rows(tmp_path / "rows.csv", rows)), val_fraction=0.2, hold_out_by="title"
    )
    with pytest.raises(ValueError, match=r"has no column 'title' \(set by data.tasks.task.hold_out_by\)"):
        missing.raw("train")


def test_a_test_split_held_out_of_one_file_keeps_the_validation_rows_and_whole_groups(tmp_path):
    """XQuAD ships one file: ``test_fraction`` holds a test split out of it too, after the validation rows, which stay
    the ones ``val_fraction`` alone holds out; no article on two sides."""
    rows = [{"text": f"text {i}", "label": "a" if i % 2 else "b", "article": f"article {i // 5}"} for i in range(100)]
    path = str(write_rows(tmp_path / "rows.csv", rows))
    before = TextClassificationData(train=path, val_fraction=0.2, hold_out_by="article")
    member = TextClassificationData(train=path, val_fraction=0.2, test_fraction=0.3, hold_out_by="article")
    assert not before.has_split("test") and member.has_split("test") and member.has_split("validation")
    assert column(member.raw("validation"), "text") == column(before.raw("validation"), "text")
    articles = {role: set(column(member.raw(role), "article")) for role in ("train", "validation", "test")}
    assert [len(articles[role]) for role in ("train", "validation", "test")] == [10, 4, 6]  # 50%, 20%, 30% of 20
    assert not (articles["train"] & articles["test"] or articles["validation"] & articles["test"])
    assert sorted(t for role in ("train", "validation", "test") for t in column(member.raw(role), "text")) == \
        sorted(r["text"] for r in rows)
    data = run_data(member, tokenizer_vocab_size=50)
    data.setup("test")
    assert sum(len(batch["labels"]) for batch in data.test_dataloader()[0]) == 30
    given = TextClassificationData(train=path, test=path, test_fraction=0.3)  # a test split of its own wins
    assert given.held_out() == {} and len(given.raw("test")) == 100
    for options, message in (({"test_fraction": 1.0}, r"test_fraction must be in \[0, 1\), got 1.0"),
                             ({"val_fraction": 0.5, "test_fraction": 0.5}, "hold out every training row")):
        with pytest.raises(ValueError, match=message):
            TextClassificationData(train=path, **options)
    with pytest.raises(ValueError, match=r"Only 18 distinct values to hold out by: too few for a test share of 0.989. "
                       r"\(0.89 of all rows is 0.989 of those the validation split left.\)"):
        TextClassificationData(train=path, val_fraction=0.1, test_fraction=0.89, hold_out_by="article").raw("test")


TREC_PATTERN = r"(?P<label>[A-Z]+):\S+ (?P<text>.+)"


def test_one_example_per_line_in_its_own_shape_and_encoding_is_read_by_line_pattern(tmp_path):
    """TREC as it ships: ``COARSE:fine question`` per line, latin-1. No conversion: the config reads it."""
    rng = random.Random(0)
    lines = [
        f"{label}:{fine} {question} {i} ?"
        for i in range(40)
        for label, fine, question in [
            rng.choice(
                [
                    ("LOC", "city", "Where is Besançon"),
                    ("HUM", "ind", "Who wrote Señor Presidente"),
                    ("NUM", "date", "When was it"),
                ]
            )
        ]
    ]
    path = tmp_path / "train_5500.label"
    # a blank line is skipped
    path.write_bytes(("\n".join(lines[:20]) + "\n\n" + "\n".join(lines[20:]) + "\n").encode("latin-1"))
    member = TextClassificationData(train=str(path), line_pattern=TREC_PATTERN, encoding="latin-1", val_fraction=0.25)
    data = run_data(member, "trec")
    rows = member.raw("train")
    assert len(rows) + len(member.raw("validation")) == 40  # no line lost
    assert sorted(member.label_names) == ["HUM", "LOC", "NUM"] and any("Besançon" in t for t in column(rows, "text"))
    data.setup("fit")
    assert next(iter(data.train_dataloader()))["labels"].shape[0] > 0
    # the fine class instead: another pattern is other rows, not the first pattern's cached encoding
    fine = TextClassificationData(
        train=str(path), line_pattern=r"[A-Z]+:(?P<label>\S+) (?P<text>.+)", encoding="latin-1", val_fraction=0.25
    )
    run_data(fine, "trec").setup("fit")
    assert sorted(fine.label_names) == ["city", "date", "ind"]


def test_line_pattern_and_encoding_errors_name_the_option_the_line_and_the_fix(tmp_path):
    path = tmp_path / "q.label"
    path.write_bytes("LOC:city Where is Besançon ?\nno label on this line\n".encode("latin-1"))

    def read(**options):
        member = TextClassificationData(train=str(path), **options)
        member.name = "trec"
        return member.raw("train")

    with pytest.raises(
        ValueError,
        match=r"data.tasks.trec.train: .*q.label, line 1: byte 0xe7 at column 24 is not utf-8. Set the "
        r"file's encoding \(data.tasks.trec.encoding: latin-1",
    ):
        read(line_pattern=TREC_PATTERN)
    with pytest.raises(
        ValueError, match=r"q.label, line 2 does not match data.tasks.trec.line_pattern .* 'no label on this line'"
    ):
        read(line_pattern=TREC_PATTERN, encoding="latin-1")
    with pytest.raises(ValueError, match=r"data.tasks.trec.encoding='latin-9x' is not an encoding"):
        read(encoding="latin-9x")
    with pytest.raises(ValueError, match=r"data.tasks.trec.line_pattern='\(unclosed' is not a regular expression"):
        read(line_pattern="(unclosed")
    with pytest.raises(ValueError, match=r"has no named groups: name each column as \(\?P<name>...\)"):
        read(line_pattern=r"(\w+) (.+)")
    with pytest.raises(ValueError, match=r"line_pattern splits lines files; it cannot read file_type='csv'"):
        read(line_pattern=TREC_PATTERN, file_type="csv")
    with pytest.raises(ValueError, match=r"say how to read local files; hub and built-in datasets describe their own"):
        read(dataset="trunk:sentiment", line_pattern=TREC_PATTERN)
    with pytest.raises(ValueError, match="token classification reads CoNLL column files"):
        TokenClassificationData(train=str(path), line_pattern=TREC_PATTERN)


def test_encoding_reads_latin1_conll_and_corpus_files(tmp_path):
    conll = tmp_path / "train.conll"
    conll.write_bytes("José\tB-PER\nvit\tO\nà\tO\nSão\tB-LOC\nPaulo\tI-LOC\n\n".encode("latin-1"))
    member = TokenClassificationData(train=str(conll), tag_column=-1, encoding="latin-1")
    member.name = "ner"
    assert column(member.raw("train"), "tokens") == [["José", "vit", "à", "São", "Paulo"]]
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes("Où est la gare ?\nÀ gauche.\n".encode("latin-1"))
    member = CorpusData(train=str(corpus), documents="line", encoding="latin-1", val_fraction=0.0)
    member.name = "mlm"
    assert list(member.texts_for_tokenizer()) == ["Où est la gare ?", "À gauche."]


def test_tokenizer_min_frequency_keeps_a_small_texts_vocabulary_to_pieces_seen_often(tmp_path):
    """Each piece of the vocabulary occurs at least that often in the training text: rare words are spelled in
    pieces."""
    rng = random.Random(0)
    common, rare = ["what", "who", "where", "city", "river"], [f"name{i}x" for i in range(60)]
    rows = [{"text": " ".join(rng.choices(common, k=4) + [rng.choice(rare)]), "label": "a"} for _ in range(120)]
    path = write_rows(tmp_path / "train.csv", rows)
    sizes = {}
    for frequency in (2, 8):
        data = run_data(
            TextClassificationData(train=str(path)), tokenizer_vocab_size=2000, tokenizer_min_frequency=frequency
        )
        vocabulary = data.codec.tokenizer.get_vocab()
        sizes[frequency] = len(vocabulary)
        assert all(word in vocabulary for word in common)
    assert sizes[8] < sizes[2]
    whole_rare = sum(word in run_data(TextClassificationData(train=str(path)), tokenizer_vocab_size=2000,
                                      tokenizer_min_frequency=8).codec.tokenizer.get_vocab() for word in rare)
    assert whole_rare == 0  # each rare name occurs about twice: below 8, it is spelled in pieces
    with pytest.raises(ValueError, match="data.tokenizer_min_frequency must be >= 1"):
        run_data(TextClassificationData(train=str(path)), tokenizer_min_frequency=0)


def test_byte_level_bpe_never_produces_unk_for_text_it_has_not_seen(tmp_path):
    from trunk.core.codec import UNK

    rows = [{"text": f"the film was {w}", "label": "a"} for w in ("good", "bad", "fine", "dull")] * 20
    path = write_rows(tmp_path / "train.csv", rows)
    unseen = "Ünïcødé 🙂 #wnut17 lookin gr8 ☕"
    byte = run_data(TextClassificationData(train=str(path)), tokenizer_model="byte_bpe").codec.tokenizer
    word = run_data(TextClassificationData(train=str(path)), tokenizer_model="wordpiece").codec.tokenizer
    assert (
        byte.token_to_id(UNK) not in byte.encode(unseen).ids and byte.decode(byte.encode(unseen).ids).strip() == unseen
    )
    assert word.token_to_id(UNK) in word.encode(unseen).ids  # what byte level avoids
    with pytest.raises(
        ValueError, match="data.tokenizer_model='sentencepiece': choose auto, wordpiece, bpe, byte_bpe or word"
    ):
        run_data(TextClassificationData(train=str(path)), tokenizer_model="sentencepiece")


def test_a_word_vocabulary_keeps_words_seen_often_enough_and_reads_the_others_as_unk(tmp_path):
    from trunk.core.codec import UNK

    rows = [{"text": f"What is {w} ?", "label": "def"} for w in ("autism", "gravity", "a cat")] * 3
    rows += [{"text": "What is acetaminophen ?", "label": "def"}]  # once: below min_frequency
    path = write_rows(tmp_path / "train.csv", rows)
    tokenizer = run_data(
        TextClassificationData(train=str(path)), tokenizer_model="word", tokenizer_min_frequency=2
    ).codec.tokenizer
    assert tokenizer.encode("What is gravity ?").tokens == ["[CLS]", "What", "is", "gravity", "?", "[SEP]"]
    assert tokenizer.encode("What is acetaminophen ?").tokens == [
        "[CLS]",
        "What",
        "is",
        UNK,
        "?",
        "[SEP]",
    ]  # one slot, not pieces
    assert tokenizer.decode(tokenizer.encode("What is autism ?").ids) == "What is autism?"  # BERT's detokenization
