"""Small-data benchmark: recipes trained from scratch and from trunks, several seeds each, against the linear
baselines computed here on the same split. Prints a table (mean ± standard deviation over the seeds).

    python benchmarks/small_data.py --recipe configs/trec.yaml --seeds 0 1 2 --variant "recipe=" --variant
    "wordpiece=--data.tokenizer_model=wordpiece"
    python benchmarks/small_data.py --recipe configs/trec_finetune.yaml --recipe configs/wnut17.yaml \\
        --variant "large=--model.init_from=runs/pretrain_large/trunk" --variant
        "prefinetuned=--model.init_from=runs/prefinetune/trunk"

A variant is NAME=ARGUMENTS: `trunk fit` arguments added to the recipe's (quoted as one, split like a shell
line). Each run writes to runs/small_data/<recipe>/<variant>/seed<N>; its test split is scored on the best
checkpoint (the recipes monitor val/score), and the table reports test/score: the task's primary metric. Each
finished run is appended to <root>/results.jsonl, and a run already there is not run again: a stopped benchmark goes
on where it stopped (delete the file, or that run's line, to run it anew).
The baselines (benchmarks/baselines.py; scikit-learn: pip install trunk[bench]) read the recipe's data exactly
as `trunk fit` does, so they see the same training rows and the same held-out share.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from baselines import BASELINES, task_data  # noqa: E402
from ledger import Ledger  # noqa: E402

from trunk.cli import run_cli  # noqa: E402
from trunk.training.precision import cpu_info  # noqa: E402


def baseline(recipe: str) -> tuple[str, float]:
    """The best linear baseline's primary metric on the recipe's test split (its first task)."""
    members, options = task_data([recipe])
    name, member = next(iter(members.items()))
    results = BASELINES[member.kinds[0]](member, "test", options.get(name, {}))
    primary = next(iter(next(iter(results.values()))))  # each baseline's first metric is the task's primary
    best = max(results, key=lambda b: results[b][primary])
    return best, results[best][primary]


def run(recipe: str, variant: str, arguments: list[str], seed: int, root: Path) -> tuple[float, float, int]:
    """One `trunk fit` in <root>/<recipe>/<variant>/seed<N>: (test score on the best checkpoint, minutes, epochs
    trained)."""
    ledger, key = Ledger(root), {"recipe": Path(recipe).stem, "variant": variant, "arguments": arguments, "seed": seed}
    result = ledger.find(key)
    if result is not None:
        return result["score"], result["minutes"], result["epochs"]
    start = time.perf_counter()
    directory = root / Path(recipe).stem / variant / f"seed{seed}"
    cli = run_cli(
        [
            "fit",
            "--config",
            recipe,
            *arguments,
            f"--seed_everything={seed}",
            f"--trainer.default_root_dir={directory}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ]
    )
    result = ledger.add(
        {
            **key,
            "score": float(cli.trainer.callback_metrics["test/score"]),
            "minutes": (time.perf_counter() - start) / 60,
            "epochs": cli.trainer.current_epoch,
        }
    )
    return result["score"], result["minutes"], result["epochs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--recipe", action="append", required=True, help="a recipe with a test split (repeat for several)"
    )
    parser.add_argument(
        "--variant", action="append", default=None, help="NAME=ARGUMENTS (repeat); default: the recipe as it is"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--root", default="runs/small_data")
    args = parser.parse_args()
    variants = dict(v.split("=", 1) for v in (args.variant or ["recipe="]))
    rows = []
    for recipe in args.recipe:
        name, score = baseline(recipe)
        rows.append((Path(recipe).stem, f"baseline: {name}", f"{score:.3f}", "", "", ""))
        print(f"{Path(recipe).stem}: {name} {score:.4f}", file=sys.stderr, flush=True)
        for variant, arguments in variants.items():
            results = []
            for seed in args.seeds:
                results.append(run(recipe, variant, shlex.split(arguments), seed, Path(args.root)))
                print(
                    f"{Path(recipe).stem} {variant} seed {seed}: {results[-1][0]:.4f} ({results[-1][1]:.1f} min)",
                    file=sys.stderr,
                    flush=True,
                )
            scores = [r[0] for r in results]
            spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
            rows.append(
                (
                    Path(recipe).stem,
                    variant,
                    f"{statistics.mean(scores):.3f} ± {spread:.3f}",
                    " ".join(f"{s:.3f}" for s in scores),
                    f"{statistics.mean(r[1] for r in results):.1f}",
                    str(results[0][2]),
                )
            )
    print(f"\n{os.cpu_count()} x {cpu_info()}, torch {torch.__version__}, seeds {args.seeds}\n")
    print("| recipe | start | test score (mean ± sd) | per seed | min per run | epochs |\n|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
