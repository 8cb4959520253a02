"""What does `trunk fit` cost beyond the bare training loop? Prints a table.

    python benchmarks/loop_overhead.py [--rounds 5] [--steps 40] [--precision bf16-mixed] [--bar rich|tqdm]
    python benchmarks/loop_overhead.py --under-load [--steps 40] [--precision bf16-mixed]

Both sides train the same model (width 256, 4 blocks, 4 heads, FFN 1024) on the same batches of the
built-in sentiment data (batch 64), alternating in one process:
  * `trunk fit`: the quickstart recipe at that size through the CLI (`run_cli`), with everything a
    run has: Lightning's loop, logging every 20 steps, the progress bar, checkpointing, the fault
    tolerance callback (NaN guard, signal handling), train metrics, the lr schedule;
  * the bare loop: a `for` loop over the same DataLoader calling the task's loss (which updates the
    same train metrics), backward, fused AdamW and the schedule.
A step is the time between the starts of consecutive steps (data loading included), median over the
steps after the first 5 of each round, then median over rounds. Validation is off on both sides.

``--under-load``: `trunk fit` alone, quiet and with another process spinning on one core (``while True: pass``), for
1 thread, Trunk's choice (the usable cores, OpenMP spinning ``trunk.training.threads.SPIN_COUNT`` turns, as the
``trunk`` command sets) and OpenMP's default spinning: wall time and CPU time per step (the process's, all threads).
Each runs in a child process: OpenMP reads its environment once, when torch loads it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from processes import beside_busy_core  # benchmarks/processes.py

from trunk.cli.fit import quiet_third_party, run_cli
from trunk.training.optim import WarmupDecayLR
from trunk.training.precision import cpu_info

SIZE = ["--model.trunk.d_model=256", "--model.trunk.n_layers=4", "--model.trunk.n_heads=4", "--model.trunk.d_ff=1024"]
WARMUP_STEPS = 5


class StepClock(L.Callback):
    """Records when each training step starts, on the wall clock and in the process's CPU time."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.cpu: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.starts.append(time.perf_counter())
        self.cpu.append(time.process_time())


def median_step(starts: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(starts[WARMUP_STEPS:], starts[WARMUP_STEPS + 1 :]))


def trunk_fit(root: Path, steps: int, precision: str) -> tuple[StepClock, object]:
    clock = StepClock()
    root.mkdir(parents=True)
    (root / "run.yaml").write_text(
        f"trainer:\n  default_root_dir: {root}\n  max_steps: {steps}\n  max_epochs: -1\n  limit_val_batches: 0\n  "
        f"num_sanity_val_steps: 0\n  precision: {precision}\n  logger:\n    - class_path: "
        f"lightning.pytorch.loggers.CSVLogger\n      init_args: {{save_dir: {root}, name: csv}}\ndata:\n  tasks:\n    "
        "sentiment:\n      init_args: {test: null, predict: null}\n"
    )
    args = ["fit", "--config", "configs/quickstart.yaml", "--config", str(root / "run.yaml"), *SIZE]
    original_init = L.Trainer.__init__

    @functools.wraps(original_init)  # the CLI reads Trainer's signature
    def with_clock(self, *a, **kw):  # the CLI builds the Trainer: add the clock to its callbacks
        kw["callbacks"] = [*(kw.get("callbacks") or []), clock]
        original_init(self, *a, **kw)

    L.Trainer.__init__ = with_clock
    try:
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            cli = run_cli(args)
    finally:
        L.Trainer.__init__ = original_init
    return clock, cli


def bare_loop(cli, steps: int, precision: str) -> float:
    module, data = cli.model, cli.datamodule
    objective = module.objectives["sentiment"]
    module.train()
    optimizer = torch.optim.AdamW(module.param_groups(), lr=1e-3, weight_decay=0.01, fused=True)
    scheduler = WarmupDecayLR(optimizer, steps, module.optim_config)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision.startswith("bf16") else contextlib.nullcontext()
    starts: list[float] = []
    batches = iter(data.train_dataloader())
    for _ in range(steps):
        starts.append(time.perf_counter())
        batch = next(batches)
        with autocast:
            loss = objective.loss(module.trunk, batch, "train")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    return median_step(starts)


def under_load(steps: int, precision: str) -> None:
    argv = [sys.executable, __file__, "--child", "--steps", str(steps), "--precision", precision]
    print("| other load | threads and waiting | threads | ms per step | CPU-seconds per step |\n|---|---|---|---|---|")
    for load_beside, setting, (threads, wall, cpu) in beside_busy_core(argv):
        print(f"| {load_beside} | {setting} | {threads} | {1000 * wall:.1f} | {cpu:.2f} |")


def child(steps: int, precision: str) -> None:
    """One `trunk fit` run: its threads, and the median wall and CPU time per step."""
    with tempfile.TemporaryDirectory() as tmp:
        clock, _ = trunk_fit(Path(tmp) / "run", steps, precision)
    print(json.dumps([torch.get_num_threads(), median_step(clock.starts), median_step(clock.cpu)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--precision", default="bf16-mixed", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--bar", default="rich", choices=["rich", "tqdm"],
                        help="the CLI's progress bar: rich (where installed) or tqdm (a plain install)")
    parser.add_argument("--under-load", action="store_true", help="trunk fit beside a busy core (see above)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one run of --under-load
    options = parser.parse_args()
    if options.bar == "tqdm":
        import trunk.training.callbacks

        trunk.training.callbacks._RICH_AVAILABLE = False  # as where rich is not installed (run_callbacks reads it)
    quiet_third_party()
    os.chdir(Path(__file__).resolve().parent.parent)  # the recipe's relative paths
    if options.child:
        return child(options.steps, options.precision)
    print(f"machine: {os.cpu_count()} x {cpu_info()}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{options.precision}, {options.bar} progress bar; {options.rounds} rounds of {options.steps} steps per side")
    if options.under_load:
        return under_load(options.steps, options.precision)
    fit_times, bare_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(options.rounds):
            clock, cli = trunk_fit(Path(tmp) / f"round{r}", options.steps, options.precision)
            fit_times.append(fit_time := median_step(clock.starts))
            bare_times.append(bare_loop(cli, options.steps, options.precision))
            print(
                f"round {r + 1}: trunk fit {1000 * fit_time:.1f} ms, bare loop {1000 * bare_times[-1]:.1f} ms",
                file=sys.stderr,
            )
    f, b = statistics.median(fit_times), statistics.median(bare_times)
    ratios = sorted(fit / bare for fit, bare in zip(fit_times, bare_times))  # each round's two sides ran back to back
    print("| side | ms per step | relative (median of the rounds' ratios) |\n|---|---|---|")
    print(f"| bare loop (loss, backward, fused AdamW, schedule) | {1000 * b:.1f} | 1.00 |")
    print(
        f"| `trunk fit` (Lightning loop, logging, progress bar, callbacks) | {1000 * f:.1f} | "
        f"{statistics.median(ratios):.3f} (rounds {ratios[0]:.2f}-{ratios[-1]:.2f}) |"
    )


if __name__ == "__main__":
    main()
