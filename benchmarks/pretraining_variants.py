"""Pretraining variants at one budget, each evaluated on the recipe's held-out text at several block lengths: the
extrapolation question (a trunk trained on 128-token blocks read at 256 and 512) for every position kind, or
optimisers at a larger batch. Prints a table of held-out masked-LM perplexity per length, and minutes per run.

    python benchmarks/pretraining_variants.py --recipe configs/pretrain.yaml --lengths 128 256 512 \\
        --variant "learned=--model.trunk.positions=learned" --variant "sinusoidal=--model.trunk.positions=sinusoidal" \\
        --variant "rope=--model.trunk.positions=rope" --variant "alibi=--model.trunk.positions=alibi" \\
        --variant "t5=--model.trunk.positions=t5" --common="--model.trunk.max_len=512"
    python benchmarks/pretraining_variants.py --recipe configs/pretrain.yaml --lengths 128 \\
        --common="--trainer.accumulate_grad_batches=4 --trainer.max_steps=700" \\
        --variant "adamw=" --variant "lamb=--model.optimizer.name=lamb --model.optimizer.lr=1e-2"

A variant is NAME=ARGUMENTS (`trunk fit` arguments, quoted as one); --common goes to every variant. Each run writes
to <root>/<variant> and is evaluated from its last checkpoint with `trunk validate` at every length (the same held-out
documents, packed into blocks of that length: about the same tokens at every length). Finished
runs and evaluations are kept in <root>/results.jsonl (benchmarks/ledger.py): a stopped benchmark goes on.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from ledger import Ledger  # noqa: E402

from trunk.cli import run_cli  # noqa: E402
from trunk.training.precision import cpu_info  # noqa: E402

QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def pretrain(recipe: str, variant: str, arguments: list[str], ledger: Ledger, root: Path) -> tuple[str, dict]:
    """Train one variant (once): its last checkpoint, and its record."""
    key = {"recipe": Path(recipe).stem, "variant": variant, "arguments": arguments, "stage": "fit"}
    record = ledger.find(key)
    if record is None:
        start = time.perf_counter()
        cli = run_cli(["fit", "--config", recipe, *arguments, f"--trainer.default_root_dir={root / variant}", *QUIET])
        saved = cli.trainer.checkpoint_callback
        record = ledger.add({**key, "checkpoint": saved.last_model_path or saved.best_model_path,
                             "minutes": (time.perf_counter() - start) / 60, "steps": cli.trainer.global_step})
    return record["checkpoint"], record


def perplexity(
    recipe: str, variant: str, arguments: list[str], checkpoint: str, length: int, task: str, ledger: Ledger
) -> float:
    """Held-out masked-LM perplexity of ``checkpoint`` on blocks of ``length`` tokens."""
    key = {
        "recipe": Path(recipe).stem,
        "variant": variant,
        "arguments": arguments,
        "stage": "validate",
        "length": length,
    }
    record = ledger.find(key)
    if record is None:
        cli = run_cli(
            [
                "validate",
                "--config",
                recipe,
                *arguments,
                f"--ckpt_path={checkpoint}",
                f"--data.tasks.{task}.max_length={length}",
                *QUIET,
                f"--trainer.default_root_dir={Path(checkpoint).parent.parent}",
            ]
        )
        record = ledger.add({**key, "ppl": float(cli.trainer.callback_metrics[f"val/{task}/ppl"])})
    return record["ppl"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", required=True, help="a pretraining recipe (one masked-LM task)")
    parser.add_argument("--variant", action="append", required=True, help="NAME=ARGUMENTS (repeat)")
    parser.add_argument(
        "--common", default="", help='`trunk fit` arguments for every variant (--common="...": they start with --)'
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[128])
    parser.add_argument("--task", default="mlm", help="the recipe's masked-LM task name")
    parser.add_argument("--root", default="runs/pretraining_variants")
    args = parser.parse_args()
    root, ledger = Path(args.root), Ledger(args.root)
    rows = []
    for name, arguments in (v.split("=", 1) for v in args.variant):
        arguments = shlex.split(args.common) + shlex.split(arguments)
        print(f"{name} ...", file=sys.stderr, flush=True)
        checkpoint, record = pretrain(args.recipe, name, arguments, ledger, root)
        ppl = [
            perplexity(args.recipe, name, arguments, checkpoint, length, args.task, ledger) for length in args.lengths
        ]
        rows.append((name, *(f"{p:.1f}" for p in ppl), str(record["steps"]), f"{record['minutes']:.1f}"))
    print(f"\n{os.cpu_count()} x {cpu_info()}, torch {torch.__version__}; {args.recipe} {args.common}\n")
    print("| variant | " + " | ".join(f"ppl @ {n}" for n in args.lengths) + " | steps | min |")
    print("|---|" + "---|" * (len(args.lengths) + 2))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
