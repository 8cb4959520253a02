"""Time a `trunk fit` run and print its results as a table row for the README.

    python benchmarks/fit.py --config configs/sst2.yaml [more trunk fit arguments]

Wall time covers the whole command: data loading, tokenizer training (or its cache), training,
validation and the test run on the best checkpoint.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from trunk.cli import run_cli
from trunk.training.precision import cpu_info


def main(args: list[str]) -> None:
    start = time.perf_counter()
    cli = run_cli(["fit", *args])
    wall = time.perf_counter() - start
    trainer, ckpt = cli.trainer, cli.trainer.checkpoint_callback
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}
    rows = [
        ("command", "trunk fit " + " ".join(args)),
        ("machine", f"{os.cpu_count()} x {cpu_info()}, torch {torch.__version__}, threads {torch.get_num_threads()}"),
        ("precision", str(trainer.precision)),
        ("epochs / steps", f"{trainer.current_epoch} / {trainer.global_step}"),
        (
            f"best {ckpt.monitor}" if ckpt and ckpt.monitor else "best",
            f"{float(ckpt.best_model_score):.4f}" if ckpt and ckpt.best_model_score is not None else "-",
        ),
        *((name, f"{value:.4f}") for name, value in sorted(metrics.items())),
        ("wall time", f"{wall / 60:.1f} min"),
    ]
    width = max(len(name) for name, _ in rows)
    print("\n| " + "metric".ljust(width) + " | value |\n|" + "-" * (width + 2) + "|-------|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")


if __name__ == "__main__":
    main(sys.argv[1:])
