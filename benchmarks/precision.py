"""What `precision: auto` buys on this machine: each recipe's training step as shipped (auto), forced to
fp32 (32-true) and forced to bf16-mixed. Prints a table whose header names the CPU and its capability.

    python benchmarks/precision.py [--recipes sst2 mnist ...] [--steps 12] [--rounds 2]

Run from the repository root (the recipes read ../shared/data). Each recipe trains ``--steps`` steps
per precision through `trunk fit` with validation, checkpoints, logging and the test run off; a
recipe that fine-tunes (``model.init_from``) starts from fresh weights instead, which costs the same
per step. The precisions alternate within each round, in one process; a step is the median time
between the starts of consecutive steps after the first 5, then the median over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
import yaml
from loop_overhead import StepClock, median_step  # benchmarks/loop_overhead.py, beside this script

from trunk.cli.fit import quiet_third_party, run_cli
from trunk.training.precision import choose_precision, cpu_info

PRECISIONS = ("auto", "32-true", "bf16-mixed")


def step_time(recipe: Path, precision: str, steps: int, root: Path) -> float:
    tasks = yaml.safe_load(recipe.read_text())["data"]["tasks"]
    overrides = {
        "trainer": {
            "default_root_dir": str(root),
            "max_steps": steps,
            "max_epochs": -1,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            "logger": False,
            "enable_checkpointing": False,
            "callbacks": [],
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "precision": precision,
        },
        "data": {
            "tasks": {
                name: {"init_args": {k: None for k in ("test", "predict") if k in (spec.get("init_args") or {})}}
                for name, spec in tasks.items()
            }
        },
        "model": {"init_from": None},
    }
    root.mkdir(parents=True)
    (root / "run.yaml").write_text(yaml.safe_dump(overrides))
    clock = StepClock()
    cli = run_cli(["--config", str(recipe), "--config", str(root / "run.yaml")], run=False)
    cli.trainer.callbacks.append(clock)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return median_step(clock.starts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=["quickstart", "sst2", "mnist", "pretrain"])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    quiet_third_party()
    chosen, why = choose_precision("cpu")
    print(
        f"machine: {cpu_info()}, {torch.get_num_threads()} threads, torch {torch.__version__}; auto chose {chosen} "
        f"({why}); median step of {options.steps} steps, median of {options.rounds} alternating rounds\n"
    )
    print("| recipe | auto (ms) | 32-true (ms) | bf16-mixed (ms) | bf16-mixed / auto |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in options.recipes:
            times: dict[str, list[float]] = {p: [] for p in PRECISIONS}
            for r in range(options.rounds):
                for p in PRECISIONS:
                    times[p].append(
                        step_time(Path("configs") / f"{recipe}.yaml", p, options.steps, Path(tmp) / f"{recipe}-{r}-{p}")
                    )
            ms = {p: 1000 * statistics.median(t) for p, t in times.items()}
            print(
                f"| {recipe} | {ms['auto']:.0f} | {ms['32-true']:.0f} | {ms['bf16-mixed']:.0f} | "
                f"{ms['bf16-mixed'] / ms['auto']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
