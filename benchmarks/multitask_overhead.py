"""Does the multi-task machinery cost time per step? Prints a table.

    python benchmarks/multitask_overhead.py [--rounds 7] [--steps 20]

Compares, in one process and alternating, so machine noise hits both sides alike:
  * model: a training step (forward, backward, AdamW) of a one-task TrunkModule against the same
    step of a two-task TrunkModule (a second, NER head on the trunk), on the same classification batch;
  * data: building a training batch with MultiTaskData's sampling stream against a plain shuffled
    DataLoader over the same encoded rows.
Reported: median milliseconds per step over the rounds, and the ratio (joint / single). Then the
memory of a training step: each side runs alone in a fresh process (building the model, 5 steps),
which reports its peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from processes import in_fresh_process, resident_mib  # benchmarks/processes.py
from torch.utils.data import DataLoader

from trunk.datamodules import MultiTaskData, TextClassificationData
from trunk.datamodules.builtin import sentiment_example
from trunk.datamodules.text import rows
from trunk.models import TrunkConfig
from trunk.tasks import SequenceClassification, TokenClassification, TrunkModule
from trunk.training.precision import cpu_info


def model_step(module: TrunkModule, optimizer: torch.optim.Optimizer, batch: dict) -> None:
    loss = module.training_step(batch, 0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def timed(fn, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return 1000 * (time.perf_counter() - start) / steps


def build(side: str) -> tuple[TrunkModule, torch.optim.Optimizer, dict]:
    """The single-task or joint module, its optimizer and a classification batch (the same for both)."""
    torch.manual_seed(0)
    cfg = TrunkConfig(vocab_size=8000, d_model=256, n_layers=4, n_heads=4, d_ff=1024, max_len=128, dropout=0.1)
    labels = {"sst2": {"label_names": ["negative", "positive"]}}
    tasks = {"sst2": SequenceClassification()}
    if side == "joint":
        tasks["conll"] = TokenClassification()
        labels["conll"] = {"label_names": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]}
    module = TrunkModule(tasks, trunk=cfg, task_info=labels)
    batch = {
        "task": "sst2",
        "input_ids": torch.randint(5, 8000, (64, 24)),
        "attention_mask": torch.ones(64, 24, dtype=torch.long),
        "labels": torch.randint(0, 2, (64,)),
    }
    return module, torch.optim.AdamW(module.param_groups(), lr=1e-4), batch


def peak_memory(side: str, queue) -> None:
    """In a fresh process: build one side, train 5 steps, report the peak resident memory (MiB)."""
    module, optimizer, batch = build(side)
    for _ in range(5):
        model_step(module, optimizer, batch)
    queue.put(resident_mib())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    options = parser.parse_args()
    single, single_optimizer, batch = build("single")
    joint, joint_optimizer, _ = build("joint")
    joint.load_state_dict({**joint.state_dict(), **single.state_dict()})  # same weights for the shared parts
    modules = {"single": single, "joint": joint}
    optimizers = {"single": single_optimizer, "joint": joint_optimizer}

    # data: 4,000 generated sentences written to a file, encoded once
    rng = random.Random(0)
    folder = Path(tempfile.mkdtemp(prefix="trunk-bench-"))
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(sentiment_example(rng)) + "\n" for _ in range(4000)))
    os.environ.setdefault("TRUNK_CACHE", str(folder / "cache"))
    data = MultiTaskData({"sst2": TextClassificationData(train=str(path), batch_size=64)}, tokenizer_vocab_size=2000)
    data.setup("fit")
    member = data.tasks["sst2"]
    examples = rows(member._encoded["train"], list(range(member.size("train"))))  # in memory: the plain loop's baseline
    plain = DataLoader(examples, batch_size=64, shuffle=True, collate_fn=member.collate)
    loaders = {"single": plain, "joint": data.train_dataloader()}

    def drain(loader) -> float:
        start, n = time.perf_counter(), 0
        for _ in loader:
            n += 1
        return 1000 * (time.perf_counter() - start) / n

    for module in modules.values():  # warm-up, excluded
        model_step(module, optimizers["single" if module is single else "joint"], batch)
    results = {(kind, side): [] for kind in ("model step", "batch") for side in modules}
    for _ in range(options.rounds):
        for side in ("single", "joint"):
            results[("model step", side)].append(
                timed(lambda: model_step(modules[side], optimizers[side], batch), options.steps)
            )
            results[("batch", side)].append(drain(loaders[side]))

    print(f"\nmachine: {os.cpu_count()} x {cpu_info()}, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}; {options.rounds} rounds, medians")
    print("| what | single task (ms) | multi-task machinery (ms) | ratio |\n|---|---|---|---|")
    for kind in ("model step", "batch"):
        a, b = (statistics.median(results[(kind, side)]) for side in ("single", "joint"))
        what = (
            "training step, batch 64 x 24 tokens, width 256, 4 blocks; joint: + a second (NER) head"
            if kind == "model step"
            else "one training batch from 4,000 rows: plain DataLoader vs MultiTaskData's stream"
        )
        print(f"| {what} | {a:.2f} | {b:.2f} | {b / a:.3f} |")
    memory = {side: in_fresh_process(peak_memory, side) for side in ("single", "joint")}
    print(
        f"| peak resident memory of a process training that step (MiB) | {memory['single']:.0f} | "
        f"{memory['joint']:.0f} | {memory['joint'] / memory['single']:.3f} |"
    )


if __name__ == "__main__":
    main()
