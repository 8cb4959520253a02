"""Data at scale: how fast splits are encoded and read back, and streamed pretraining on a corpus larger than memory
wants.

    python benchmarks/data_scale.py encode --sst2 ../shared/data/sst2/train.tsv \
        --corpus ../shared/data/wikitext2/valid.txt ../shared/data/wikitext2/test.txt
        ../shared/data/tinyshakespeare/input.txt \
        --tokenizer runs/pretrain/trunk/tokenizer.json
    python benchmarks/data_scale.py stream --trunk runs/pretrain/trunk --source ../shared/data/wikitext2/valid.txt \
        --validation ../shared/data/wikitext2/test.txt --gigabytes 2 --steps 300

``encode`` times, for SST-2 train (sequence classification) and a pretraining corpus (masked-LM
blocks), in one process with the rounds alternating: the in-memory encoding Trunk did before the
cache (Python lists, every run), the encoding into the Arrow cache in 1 and 2 processes (a cold
cache each round), and a run that finds the cache (setup of the split: key, checksums, memory map).
Raw rows are read before the clock starts; the tokenizer is the one given.

``stream`` writes a corpus of the given size by repeating ``--source`` (a temporary file), then runs
``trunk fit --config configs/pretrain.yaml`` on it with ``streaming: true`` and the trunk directory's
tokenizer for ``--steps`` steps, and reports the time to the first batch (no pass over the corpus
first), the steps' wall time and the run's peak resident memory.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trunk.training.precision import cpu_info

REPO = Path(__file__).resolve().parent.parent


def encode_rows(args) -> list[tuple]:
    import torch

    from trunk.datamodules import CorpusData, MultiTaskData, TextClassificationData
    from trunk.datamodules.corpus import _document_ids

    def member(kind: str, num_proc: int | None = None):
        data = (
            TextClassificationData(train=args.sst2, text_column="sentence", num_proc=num_proc)
            if kind == "sst2"
            else CorpusData(train=args.corpus, val_fraction=0.0, num_proc=num_proc)
        )
        run = MultiTaskData({kind: data}, tokenizer=args.tokenizer)
        run.tokenizer  # noqa: B018 (connects the task)
        data.raw("train")
        data.info()
        return data

    def previous(data) -> int:
        """Trunk's encoding before the cache: every row into Python lists, in this process, every run."""
        raw = data.raw("train")
        if isinstance(data, CorpusData):
            data.tokenizer.no_truncation()
            ids = (
                i
                for start in range(0, len(raw), 1000)
                for i in _document_ids(data.tokenizer, raw[start : start + 1000])["ids"]
            )
            return len(torch.tensor(list(data.pack(ids, "train"))))
        return len(data.encode(raw, "train"))

    def cached(data) -> int:
        data.prepare("train")
        return data.size("train")

    rows = []
    for kind in ("sst2", "corpus"):
        if (kind == "sst2" and not args.sst2) or (kind == "corpus" and not args.corpus):
            continue
        documents = len(member(kind).raw("train"))
        times: dict[str, list[float]] = {}
        for round_ in range(args.rounds):
            for name, make, work, cold in (("in memory (before the cache)", lambda: member(kind), previous, False),
                                           ("into the cache, 1 process", lambda: member(kind), cached, True),
                                           ("into the cache, 2 processes", lambda: member(kind, 2), cached, True),
                                           ("cache hit (the next run)", lambda: member(kind), cached, False)):
                if cold:
                    os.environ["TRUNK_CACHE"] = tempfile.mkdtemp(prefix="trunk-bench-cache-")
                data = make()
                start = time.perf_counter()
                examples = work(data)
                times.setdefault(name, []).append(time.perf_counter() - start)
                print(f"  round {round_}: {kind} {name}: {times[name][-1]:.2f} s", file=sys.stderr)
        for name, values in times.items():
            seconds = statistics.median(values)
            rows.append((kind, f"{documents:,} rows -> {examples:,} examples", name, seconds, documents / seconds))
    return rows


def encode(args) -> None:
    rows = encode_rows(args)
    print(f"machine: {cpu_info()}, {os.cpu_count()} cores; median of {args.rounds} rounds, alternating")
    print("| data | size | path | time (s) | rows/s |")
    print("|---|---|---|---|---|")
    for kind, size, name, seconds, speed in rows:
        print(f"| {kind} | {size} | {name} | {seconds:.2f} | {speed:,.0f} |")


def write_corpus(source: Path, path: Path, gigabytes: float) -> int:
    """Repeat ``source`` until ``path`` holds ``gigabytes`` of text; returns its size in bytes."""
    text = source.read_bytes()
    target = int(gigabytes * 2**30)
    written = 0
    with open(path, "wb") as f:
        while written < target:
            f.write(text)
            written += len(text)
    return written


def stream(args) -> None:
    from trunk.datamodules import CorpusData, MultiTaskData

    folder = Path(tempfile.mkdtemp(prefix="trunk-bench-stream-"))
    corpus = folder / "corpus.txt"
    size = write_corpus(Path(args.source), corpus, args.gigabytes)
    tokenizer = str(Path(args.trunk) / "tokenizer.json")
    try:
        # Time to the first batch, in this process: no pass over the corpus before training starts.
        data = MultiTaskData({"mlm": CorpusData(train=str(corpus), streaming=True, batch_size=32)}, tokenizer=tokenizer,
                             steps_per_epoch=args.steps)
        start = time.perf_counter()
        data.setup("fit")
        batch = next(iter(data.train_dataloader()))
        first_batch = time.perf_counter() - start
        del data, batch

        command = [
            sys.executable,
            "-m",
            "trunk.cli",
            "fit",
            "--config",
            str(REPO / "configs/pretrain.yaml"),
            f"--data.tasks.mlm.init_args.train={corpus}",
            f"--data.tasks.mlm.init_args.validation={args.validation}",
            "--data.tasks.mlm.init_args.streaming=true",
            f"--data.steps_per_epoch={args.steps}",
            f"--model.init_from={args.trunk}",
            f"--trainer.max_steps={args.steps}",
            "--trainer.limit_val_batches=10",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={folder / 'run'}",
        ]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode:
            sys.exit(f"trunk fit failed:\n{done.stderr[-4000:]}")
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB: the largest child, the run
    finally:
        corpus.unlink(missing_ok=True)
    print(f"machine: {cpu_info()}, {os.cpu_count()} cores")
    print(
        "| corpus | steps (batch 32 x 128 tokens, bf16) | time to the first batch | trunk fit wall time | peak RSS of "
        "the run |"
    )
    print("|---|---|---|---|---|")
    print(
        f"| {size / 2**30:.2f} GiB ({args.source} repeated) | {args.steps} | {first_batch:.1f} s | {wall:.0f} s | "
        f"{peak:.2f} GiB |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("encode", help="encoding throughput: before the cache, into it, and a cache hit")
    p.add_argument("--sst2", help="SST-2 train.tsv")
    p.add_argument("--corpus", nargs="+", help="text files of a pretraining corpus")
    p.add_argument("--tokenizer", required=True, help="a tokenizer.json (e.g. runs/pretrain/trunk/tokenizer.json)")
    p.add_argument("--rounds", type=int, default=3)
    p = commands.add_parser("stream", help="streamed pretraining on a generated corpus of --gigabytes")
    p.add_argument(
        "--trunk", required=True, help="a pretrained trunk directory: its tokenizer and weights start the run"
    )
    p.add_argument("--source", required=True, help="text repeated to make the corpus")
    p.add_argument("--validation", required=True, help="a small text file to validate on")
    p.add_argument("--gigabytes", type=float, default=2.0)
    p.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    encode(args) if args.command == "encode" else stream(args)


if __name__ == "__main__":
    main()
