"""Data at scale: the on-disk encoded-split cache (reuse, invalidation, damage, one builder per node)
and streamed pretraining corpora (packing, sharding, continuation, bad input)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from conftest import REPO, sentiment_example, write_rows

from trunk.core.codec import cache_dir
from trunk.datamodules import CorpusData, MultiTaskData, TextClassificationData
from trunk.datamodules.text import TextDataModule
from trunk.datamodules.tokenizer import train_wordpiece


def sentiment_run(path: Path, **options) -> MultiTaskData:
    return MultiTaskData({"sst": TextClassificationData(train=str(path), **options)}, tokenizer_vocab_size=300)


@pytest.fixture
def count_encodes(monkeypatch, tmp_path) -> list:
    """Each encoding a test's runs make, in a cache of the test's own (the cache keys files by their bytes: another
    test's rows of the same seed would be served)."""
    monkeypatch.setenv("TRUNK_CACHE", str(tmp_path / "own-cache"))
    calls = []
    encode = TextClassificationData.encode

    def counting(self, ds, role):
        calls.append((role, len(ds)))
        return encode(self, ds, role)

    monkeypatch.setattr(TextClassificationData, "encode", counting)
    return calls


@pytest.fixture
def rows_file(tmp_path) -> Path:
    import random

    rng = random.Random(0)
    return write_rows(tmp_path / "train.jsonl", [sentiment_example(rng) for _ in range(300)])


def test_the_second_run_maps_the_cache_instead_of_encoding(rows_file, count_encodes):
    first = sentiment_run(rows_file)
    first.setup("fit")
    assert count_encodes == [("train", 300)]
    second = sentiment_run(rows_file)
    second.setup("fit")
    assert count_encodes == [("train", 300)], "the second run encoded again"
    a, b = first.tasks["sst"]._encoded["train"], second.tasks["sst"]._encoded["train"]
    assert a["input_ids"] == b["input_ids"] and a["label"] == b["label"]
    files = [Path(f["filename"]) for f in b.cache_files]  # memory-mapped Arrow files in Trunk's cache, not Python lists
    assert files and all(cache_dir() in f.parents for f in files)
    batch = second.tasks["sst"].make_batch("train", [3, 1, 2], train=True)
    assert batch["labels"].tolist() == [a["label"][i] for i in (3, 1, 2)]


def test_the_cache_is_rebuilt_when_the_tokenizer_the_data_or_an_option_changes(rows_file, count_encodes, tmp_path):
    sentiment_run(rows_file).setup("fit")
    # another tokenizer
    run = MultiTaskData({"sst": TextClassificationData(train=str(rows_file))}, tokenizer_vocab_size=200)
    run.setup("fit")
    assert len(count_encodes) == 2
    sentiment_run(rows_file, max_length=8).setup("fit")  # an encoding option
    assert len(count_encodes) == 3
    sentiment_run(rows_file, batch_size=7).setup("fit")  # not an encoding option: the cache serves
    assert len(count_encodes) == 3
    text = rows_file.read_text().replace("film", "movie")
    rows_file.write_text(text)  # the same path, new rows
    sentiment_run(rows_file).setup("fit")
    assert len(count_encodes) == 4


def entry(run: MultiTaskData, role: str = "train") -> Path:
    """The cache directory of a run's split."""
    from trunk.datamodules.encoded import CACHE_VERSION, key_digest

    run.tokenizer  # noqa: B018 (connects the tasks to the tokenizer their keys name)
    return cache_dir() / "encoded" / key_digest([CACHE_VERSION, *run.tasks["sst"].encoding_key(role)])


@pytest.mark.parametrize("damage", ["truncated", "garbage", "missing_meta", "foreign_key"])
def test_a_damaged_cache_is_rebuilt_with_a_warning_never_used(rows_file, count_encodes, damage):
    first = sentiment_run(rows_file)
    first.setup("fit")
    expected = list(first.tasks["sst"]._encoded["train"]["input_ids"])
    folder = entry(first)
    arrow = next(folder.glob("*.arrow"))
    if damage == "truncated":
        arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    elif damage == "garbage":
        arrow.write_bytes(b"\0" * arrow.stat().st_size)  # the same size: only Arrow's own checks can tell
    elif damage == "missing_meta":
        (folder / "trunk_cache.json").unlink()
    else:
        meta = json.loads((folder / "trunk_cache.json").read_text())
        meta["key"][1] = "something else"
        (folder / "trunk_cache.json").write_text(json.dumps(meta))
    again = sentiment_run(rows_file)
    with pytest.warns(UserWarning, match="cache .* is damaged"):
        again.setup("fit")
    assert len(count_encodes) == 2
    assert list(again.tasks["sst"]._encoded["train"]["input_ids"]) == expected


def test_a_killed_build_leaves_no_entry_and_its_leftovers_are_removed(rows_file, count_encodes, monkeypatch):
    import socket

    def killed(self, role, directory):
        (directory / "encoded.arrow").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(TextDataModule, "build_encoded", killed)
    run = sentiment_run(rows_file)
    folder = entry(run)
    with pytest.raises(KeyboardInterrupt):
        run.setup("fit")
    assert not list(folder.parent.glob(f"*{folder.name}*")), "an interrupted build must leave nothing behind"
    monkeypatch.undo()
    # A build killed for real (SIGKILL) leaves its temporary directory: it is not an entry, and the next build removes
    # it.
    run, digest = sentiment_run(rows_file), folder.name
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    leftover = cache_dir() / "encoded" / f".{digest}.{socket.gethostname()}.{dead}.abcd1234.tmp"
    leftover.mkdir(parents=True)
    (leftover / "encoded.arrow").write_bytes(b"half")
    run.setup("fit")
    assert not leftover.exists() and (cache_dir() / "encoded" / digest / "trunk_cache.json").is_file()
    assert len(run.tasks["sst"]._encoded["train"]) == 300


def test_encoding_in_several_processes_gives_the_same_rows_and_one_truncation_warning(tmp_path, monkeypatch):
    import random

    rng = random.Random(1)
    path = write_rows(tmp_path / "big.jsonl", [sentiment_example(rng) for _ in range(2500)])
    one = sentiment_run(path, max_length=12)
    with pytest.warns(UserWarning) as one_warnings:
        one.setup("fit")
    one.tokenizer.save(str(tmp_path / "tokenizer.json"))
    monkeypatch.setenv("TRUNK_CACHE", str(tmp_path / "cold-cache"))
    two = MultiTaskData(
        {"sst": TextClassificationData(train=str(path), max_length=12, num_proc=2)},
        tokenizer=str(tmp_path / "tokenizer.json"),
    )
    with pytest.warns(UserWarning) as two_warnings:
        two.setup("fit")
    a, b = one.tasks["sst"]._encoded["train"], two.tasks["sst"]._encoded["train"]
    assert len(b.cache_files) == 2  # one Arrow file per process
    assert a["input_ids"] == b["input_ids"] and a["label"] == b["label"]
    truncation = lambda ws: [str(w.message) for w in ws if "truncated" in str(w.message)]  # noqa: E731
    assert len(truncation(one_warnings)) == len(truncation(two_warnings)) == 1
    assert truncation(one_warnings)[0].split(" examples")[0] == truncation(two_warnings)[0].split(" examples")[0]
    assert truncation(one_warnings)[0].endswith("training from scratch.") and " of 2500 " in truncation(one_warnings)[0]


def test_under_ddp_one_process_encodes_and_the_other_reads_the_cache(tiny_cli_args, tmp_path):
    record = tmp_path / "encodes.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
           "TRUNK_CACHE": str(tmp_path / "cache")}
    args = [a for a in tiny_cli_args if not a.startswith("--trainer.devices")]
    args += [
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        "--trainer.max_steps=2",
        "--trainer.callbacks+=probes.CountEncodes",
        f"--trainer.callbacks.path={record}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "trunk.cli", "fit", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = record.read_text().split("\n")[:-1]
    assert {line.split()[0] for line in lines} == {"0"}, lines  # the other process only read the cache
    # each split once
    assert sorted(line.split()[1] for line in lines) == sorted(set(line.split()[1] for line in lines)), (lines)
    assert {"train", "validation"} <= {line.split()[1] for line in lines}


# -- streaming ------------------------------------------------------------------------------------


def corpus_file(tmp_path: Path, n: int = 400) -> Path:
    import random

    rng = random.Random(0)
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(sentiment_example(rng)["text"] for _ in range(n)) + "\n")
    return path


@pytest.fixture
def corpus_tokenizer(tmp_path) -> Path:
    path = tmp_path / "tokenizer.json"
    train_wordpiece(corpus_file(tmp_path, 200).read_text().splitlines(), vocab_size=200).save(str(path))
    return path


def corpus_run(path: Path, tokenizer: Path, **options) -> MultiTaskData:
    options = {"max_length": 16, "batch_size": 4, "val_fraction": 0.0, **options}
    run = MultiTaskData({"mlm": CorpusData(train=str(path), **options)}, tokenizer=str(tokenizer), steps_per_epoch=5)
    run.tokenizer  # noqa: B018 (connects the task)
    return run


def test_streaming_packs_the_same_blocks_as_the_in_memory_path(tmp_path, corpus_tokenizer):
    path = corpus_file(tmp_path)
    memory = corpus_run(path, corpus_tokenizer)
    memory.setup("fit")
    blocks = memory.tasks["mlm"]._encoded["train"]["input_ids"]
    streamed = corpus_run(path, corpus_tokenizer, streaming=True, shuffle_buffer=0).tasks["mlm"]
    stream = streamed._stream_batches("0/0", rank=0, world=1)
    first_pass = [row for _ in range((len(blocks) + 3) // 4) for row in next(stream).tolist()]
    assert first_pass == blocks  # the same tokens, in the same blocks
    assert next(stream).tolist() == blocks[:4]  # the second pass starts over


def test_streaming_shards_documents_across_processes_and_shuffles_in_a_buffer(tmp_path, corpus_tokenizer):
    path = corpus_file(tmp_path)
    data = corpus_run(path, corpus_tokenizer, streaming=True).tasks["mlm"]
    everything = list(data.iter_documents("train"))
    shards = [list(data.iter_documents("train", rank, 2)) for rank in (0, 1)]
    assert shards[0] == everything[0::2] and shards[1] == everything[1::2]
    memory = corpus_run(path, corpus_tokenizer)
    memory.setup("fit")
    blocks = memory.tasks["mlm"]._encoded["train"]["input_ids"]
    stream = data._stream_batches("0/0", 0, 1)  # the buffer (10,000 blocks) holds the whole small corpus
    first_pass = [row for _ in range((len(blocks) + 3) // 4) for row in next(stream).tolist()]
    assert first_pass != blocks and sorted(first_pass) == sorted(blocks)  # the same blocks, shuffled


def test_a_streamed_epoch_continues_where_the_last_one_stopped_and_a_resumed_run_finds_its_place(
    tmp_path, corpus_tokenizer
):
    path = corpus_file(tmp_path)
    data = corpus_run(path, corpus_tokenizer, streaming=True, shuffle_buffer=0).tasks["mlm"]
    epoch0 = data.train_items("0/0", 0, 0, 1, before=0)
    first = [next(epoch0) for _ in range(5)]
    epoch0.close()
    second = [next(data.train_items("0/0", 1, 0, 1, before=5)) for _ in range(1)]
    fresh = corpus_run(path, corpus_tokenizer, streaming=True, shuffle_buffer=0).tasks["mlm"]
    straight = [next(it) for it in [fresh._stream_batches("0/0", 0, 1)] for _ in range(6)]
    assert torch.equal(torch.stack(first + second), torch.stack(straight))
    resumed = corpus_run(path, corpus_tokenizer, streaming=True, shuffle_buffer=0).tasks["mlm"]  # no live stream
    assert torch.equal(next(resumed.train_items("0/0", 1, 0, 1, before=5)), straight[5])


def test_streamed_pretraining_trains_through_the_cli(tmp_path, corpus_tokenizer):
    from conftest import TINY_MODEL, single_task

    from trunk.cli import run_cli

    path = corpus_file(tmp_path)
    tiny = [a.replace("SequenceClassification", "MaskedLanguageModeling") for a in TINY_MODEL]
    cli = run_cli(
        [
            "fit",
            *single_task(
                [
                    *tiny,
                    "--model.trunk.max_len=32",
                    "--data=trunk.datamodules.CorpusData",
                    f"--data.train={path}",
                    f"--data.validation={path}",
                    "--data.streaming=true",
                    "--data.max_length=16",
                ],
                "mlm",
            ),
            f"--data.tokenizer={corpus_tokenizer}",
            "--data.steps_per_epoch=4",
            "--trainer.max_epochs=2",
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
        ]
    )
    assert cli.trainer.global_step == 8 and torch.isfinite(cli.trainer.callback_metrics["val/mlm/loss"])


def test_streaming_bad_input_is_refused_clearly(tmp_path, corpus_tokenizer):
    path = corpus_file(tmp_path)
    no_length = MultiTaskData({"mlm": CorpusData(train=str(path), streaming=True)}, tokenizer=str(corpus_tokenizer))
    no_length.setup("fit")
    with pytest.raises(ValueError, match="steps_per_epoch"):
        no_length.steps_per_epoch()
    no_tokenizer = MultiTaskData({"mlm": CorpusData(train=str(path), streaming=True)}, steps_per_epoch=3)
    with pytest.raises(ValueError, match="data.tokenizer"):
        no_tokenizer.setup("fit")
    mixed = MultiTaskData(
        {"mlm": CorpusData(train=str(path), streaming=True), "sst": TextClassificationData(train=str(path))},
        tokenizer=str(corpus_tokenizer),
        steps_per_epoch=3,
    )
    with pytest.raises(ValueError, match="sampling"):
        mixed.sampler()
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    with pytest.raises(ValueError, match="is empty"):
        MultiTaskData(
            {"mlm": CorpusData(train=str(empty), streaming=True)}, tokenizer=str(corpus_tokenizer), steps_per_epoch=3
        ).setup("fit")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"fine line\n\x00\x01 binary\n")
    data = CorpusData(train=str(binary), streaming=True)
    with pytest.raises(ValueError, match="binary file .* line 2"):
        list(data.iter_documents("train"))


def labelled_file(folder: Path, form: str) -> tuple[Path, dict, str]:
    """A small training file of one reader's form whose two labels have equal lengths (``pos`` / ``neg``, ``B-PER`` /
    ``B-LOC``), the data module's options for it, and its text."""
    words = ["good", "bad", "film", "plot", "cast", "dull", "fine", "long"]
    texts = [" ".join(words[(i * 3 + j) % len(words)] for j in range(4)) for i in range(40)]
    labels = ["pos" if i % 3 else "neg" for i in range(40)]
    if form in ("csv", "tsv", "jsonl"):
        path = write_rows(folder / f"train.{form}", [{"text": t, "label": y} for t, y in zip(texts, labels)])
        return path, {"text_column": "text", "label_column": "label"}, path.read_bytes().decode()
    if form == "line_pattern":
        path = folder / "train.txt"
        path.write_text("".join(f"{y}:{t}\n" for t, y in zip(texts, labels)))
        return path, {"line_pattern": r"(?P<label>\w+):(?P<text>.+)"}, path.read_text()
    path = folder / "train.conll"  # CoNLL: a token and its tag per line
    path.write_text("".join(f"{t.split()[0]} {'B-PER' if y == 'pos' else 'B-LOC'}\n{t.split()[1]} O\n\n"
                            for t, y in zip(texts, labels)))
    return path, {}, path.read_text()


@pytest.mark.parametrize("form", ["csv", "tsv", "jsonl", "line_pattern", "conll"])
def test_an_edit_that_keeps_size_and_modification_time_is_read_not_served_from_the_caches(form, tmp_path,
                                                                                         monkeypatch):
    """Labels swapped in place (same size), the old modification time set back (``touch -d``): neither Trunk's
    encoded cache nor the ``datasets`` cache under it serves the old rows; the run says the source changed, and
    encodes what a run with empty caches encodes."""
    from trunk.datamodules import TokenClassificationData

    path, options, text = labelled_file(tmp_path, form)
    data = TokenClassificationData if form == "conll" else TextClassificationData

    def encoded(**extra) -> dict:
        run = MultiTaskData({"task": data(train=str(path), val_fraction=0.0, **options, **extra)},
                            tokenizer_vocab_size=120)
        run.setup("fit")
        return run.tasks["task"]._encoded["train"].to_dict()

    before = encoded()
    stat = path.stat()
    swapped = {"pos": "neg", "neg": "pos", "B-PER": "B-LOC", "B-LOC": "B-PER"}
    edited = re.sub(r"\b(pos|neg|B-PER|B-LOC)\b", lambda m: swapped[m.group(1)], text)
    assert len(edited) == len(text) and edited != text
    path.write_bytes(edited.encode())
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # touch -d: the old modification time back
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    with pytest.warns(UserWarning, match=r"data.tasks.task.train: its source changed since it was last encoded"):
        after = encoded()
    assert after != before
    monkeypatch.setenv("TRUNK_CACHE", str(tmp_path / "cold"))  # empty caches: what the edited file holds
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cold-datasets"))
    assert encoded() == after


def test_a_file_copied_elsewhere_or_touched_is_served_from_the_cache_not_encoded_again(tmp_path, monkeypatch):
    """The caches key a file by its bytes: the same rows staged again to another folder (a job's scratch disk) or a
    file whose times alone changed (a disk mounted again) reuse the tokenizer and the encoded splits."""
    import shutil

    from trunk.datamodules import encoded

    path, options, _ = labelled_file(tmp_path, "csv")
    built = []
    real = encoded.encoded_split

    def counted(key, build, what, origin=None):
        return real(key, lambda folder: built.append(what) or build(folder), what, origin)

    monkeypatch.setattr("trunk.datamodules.text.encoded_split", counted)

    def rows(source: Path) -> dict:
        run = MultiTaskData({"task": TextClassificationData(train=str(source), val_fraction=0.1, **options)},
                            tokenizer_vocab_size=120)
        run.setup("fit")
        return run.tasks["task"]._encoded["train"].to_dict()

    first = rows(path)
    assert built  # encoded once
    built.clear()
    staged = tmp_path / "scratch" / "job-2" / path.name
    staged.parent.mkdir(parents=True)
    shutil.copy(path, staged)
    os.utime(path, ns=(0, 0))
    assert rows(staged) == first and rows(path) == first and not built  # from the cache, both
    staged.write_text(staged.read_text().replace("good", "nice"))  # other bytes: encoded again
    assert rows(staged) != first and built


def test_a_local_dataset_folder_edited_in_place_is_read_again(tmp_path, monkeypatch):
    """``data.dataset`` naming a local folder: its files are keyed by the same identity, for ``datasets``' cache
    too."""
    folder = tmp_path / "folder"
    folder.mkdir()
    path, options, text = labelled_file(folder, "csv")

    def labels() -> list:
        run = MultiTaskData({"task": TextClassificationData(dataset=str(folder), train="train", val_fraction=0.0,
                                                            **options)}, tokenizer_vocab_size=120)
        run.setup("fit")
        task = run.tasks["task"]
        return [task.label_names[i] for i in task._encoded["train"]["label"]]

    before = labels()
    stat = path.stat()
    path.write_bytes(text.replace(",pos", ",xxx").replace(",neg", ",pos").replace(",xxx", ",neg").encode())
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = labels()
    assert after == [{"pos": "neg", "neg": "pos"}[y] for y in before]
