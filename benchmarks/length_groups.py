"""Attention by length groups against attention over the padded batch, on a recipe's own batches. Prints a table.

    python benchmarks/length_groups.py --config configs/minilm_xquad.yaml --batches 4 \
        --set data.tasks.qa.init_args.max_length=256 [--inference] [--rounds 3]

Trunk's self-attention pads each group of like-length examples to its own longest (``LengthGroups`` in
``trunk/models/kernels.py``); this switches that off and on in one process, the two sides alternating over the
same batches (a warm-up pass each excluded), and reports the median of the rounds: training steps (forward,
backward, AdamW) or, with ``--inference``, forward passes under ``torch.inference_mode``. It prints each batch's
groups first (examples x length), then the seconds per side and their ratio (above 1: grouping is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from trunk.cli import run_cli
from trunk.models import Unpadded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a recipe of one task")
    parser.add_argument("--batches", type=int, default=8, help="training batches timed per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inference", action="store_true", help="time forward passes, not training steps")
    parser.add_argument("--set", nargs="*", default=[], metavar="PATH=VALUE", help="config overrides")
    args = parser.parse_args()
    cli = run_cli(["--config", args.config, "--trainer.logger=false", "--trainer.precision=32-true",
                   *(f"--{item}" for item in args.set)], run=False)
    model, data = cli.model, cli.datamodule
    data.setup("fit")
    (task, objective), = model.objectives.items()
    batches = [batch for batch, _ in zip(data.train_dataloader(), range(args.batches))]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)  # as Trunk trains

    def step(batch: dict) -> None:
        if args.inference:
            with torch.inference_mode():
                objective.loss(model.trunk, batch, "val")
            return
        objective.loss(model.trunk, batch, "train").backward()
        optimizer.step()
        optimizer.zero_grad()

    model.train(not args.inference)
    grouped = Unpadded.groups
    for batch in batches:
        mask = batch["attention_mask"].bool()
        groups = Unpadded(mask).groups if Unpadded.pays(mask) else None
        parts = "padded batch" if groups is None else " ".join(f"{g.size}x{g.length}" for g in groups.parts)
        print(f"batch {tuple(mask.shape)}, {mask.float().mean():.0%} real: {parts}")
    seconds: dict[str, list[float]] = {"padded": [], "grouped": []}
    for round_ in range(args.rounds + 1):  # round 0: the warm-up
        for side in seconds:
            Unpadded.groups = grouped if side == "grouped" else property(lambda self: None)
            start = time.perf_counter()
            for batch in batches:
                step(batch)
            if round_:
                seconds[side].append(time.perf_counter() - start)
    Unpadded.groups = grouped
    padded, by_groups = (statistics.median(seconds[side]) for side in seconds)
    kind = "inference" if args.inference else "training"
    print(f"\n| {task}, {kind}, {len(batches)} batches | padded s | grouped s | speed-up |\n|---|---|---|---|")
    print(f"| {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} thread(s) | {padded:.2f} | "
          f"{by_groups:.2f} | **{padded / by_groups:.2f}x** |")


if __name__ == "__main__":
    main()
