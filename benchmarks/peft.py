"""Parameter-efficient fine-tuning: full fine-tuning vs a linear probe vs LoRA vs bottleneck adapters, from one
pretrained trunk, at the recipe's budget; and a new task whose LoRA composes other tasks' stored LoRA deltas
(``--compose``) against a fresh LoRA. Prints a table: trainable parameters (% of the model), bytes per task on
disk, peak memory of the training process, training steps/s and the task's test metric (on the best checkpoint).

    python benchmarks/peft.py --trunk runs/pretrain/trunk --recipe configs/sst2_finetune.yaml \\
        --recipe configs/conll2003.yaml --recipe configs/trec_finetune.yaml --compose trec=sst2,conll

Each run is a `trunk fit` in a process of its own (so its peak memory is its own), writing to <root>/<recipe>/<method>;
its result is appended to <root>/results.jsonl, and a run already there is not run again: an interrupted benchmark goes
on where it stopped (benchmarks/ledger.py; delete the file to start over). Bytes per task: a full fine-tune needs its
whole trunk directory (`trunk export`); the others need one task directory (`trunk export --task`) beside the shared
trunk.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).parent))
from ledger import Ledger  # noqa: E402

# method -> `trunk fit` arguments ({task}: the recipe's task). The deltas and heads learn at a higher rate than a whole
# trunk can; LoRA on the attention's projections (q and the fused k, v), as the LoRA paper's q, v.
METHODS = {
    "full": "",
    "probe": "--model.finetune.freeze_trunk=true --model.optimizer.lr=1e-3",
    "lora": "'--model.peft={{{task}: {{method: lora, r: 8, alpha: 16, dropout: 0.1, targets: [q_proj, kv_proj]}}}}' "
    "--model.optimizer.lr=1e-3",
    "adapter": "'--model.peft={{{task}: {{method: adapter, r: 32}}}}' --model.optimizer.lr=1e-3",
    # LoRA on every projection of the blocks (attention and feed-forward), at a higher rate: 2.2% of the weights, 3.2%
    # with
    # a classification head
    "lora-all": "'--model.peft={{{task}: {{method: lora, r: 8, alpha: 16, dropout: 0.1, "
    "targets: [q_proj, kv_proj, out_proj, fc_in, fc_out]}}}}' --model.optimizer.lr=2e-3",
    # within 3% of the weights: rank 10 on every projection, the norms shifted per task, and a head without the pooler
    # (a pooled head's dense layer alone is 1% of a 256-wide model)
    "lora-small": "'--model.peft={{{task}: {{method: lora, r: 10, alpha: 20, dropout: 0.0, norms: true, "
    "targets: [q_proj, kv_proj, out_proj, fc_in, fc_out]}}}}' --model.optimizer.lr=2e-3 {small_head}",
}


class StepClock(L.Callback):
    """Seconds spent in training steps (forward, backward, optimizer), validation and data loading left out."""

    def __init__(self) -> None:
        self.seconds, self.steps, self.started = 0.0, 0, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seconds += time.perf_counter() - self.started
        self.steps += 1


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def one_run(recipe: str, method: str, arguments: list[str], root: Path) -> dict:
    """One `trunk fit` in this process, and what the table reports of it."""
    from trunk.cli import run_cli
    from trunk.formats.task_dir import save_task
    from trunk.formats.trunk_dir import export_checkpoint, load_pretrained

    clock = StepClock()
    start = time.perf_counter()
    cli = run_cli(
        [
            "--config",
            recipe,
            *arguments,
            f"--trainer.default_root_dir={root}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ],
        run=False,
    )
    cli.trainer.callbacks.append(clock)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)  # as `trunk fit` does, with the clock among the callbacks
    cli.after_fit()
    minutes = (time.perf_counter() - start) / 60
    model, (task,) = cli.model, list(cli.model.objectives)
    ckpt = cli.trainer.checkpoint_callback.best_model_path or cli.trainer.checkpoint_callback.last_model_path
    if not ckpt:  # a recipe without checkpoints: the final weights, which the test scored
        ckpt = root / "final.ckpt"
        cli.trainer.save_checkpoint(ckpt)
    if method == "full":
        stored = export_checkpoint(ckpt, root / "export", overwrite=True)
    else:
        stored = save_task(root / "task", load_pretrained(ckpt), task, overwrite=True)
    used = {id(p): p for p in [*model.trunk.parameters(), *model.objectives[task].parameters()]}.values()
    return {
        "recipe": Path(recipe).stem,
        "method": method,
        "task": task,
        "score": float(cli.trainer.callback_metrics["test/score"]),
        "trainable": sum(p.numel() for p in used if p.requires_grad),
        "parameters": sum(p.numel() for p in used),
        "bytes": directory_bytes(stored),
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "steps_per_s": clock.steps / clock.seconds,
        "minutes": minutes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", action="append", help="a single-task recipe with a test split (repeat)")
    parser.add_argument("--trunk", help="the pretrained trunk directory every run starts from")
    parser.add_argument("--method", action="append", choices=list(METHODS), help="default: all")
    parser.add_argument(
        "--compose",
        action="append",
        default=[],
        metavar="TASK=SOURCE,SOURCE",
        help="also train TASK with a LoRA composing the LoRA task directories of the SOURCE tasks (their recipes run "
             "first)",
    )
    parser.add_argument("--extra", default="", help="`trunk fit` arguments added to every run (e.g. a shorter budget)")
    parser.add_argument("--root", default="runs/peft")
    parser.add_argument("--one", nargs=2, metavar=("RECIPE", "METHOD"), help=argparse.SUPPRESS)  # a child run ...
    parser.add_argument("--arguments", default="", help=argparse.SUPPRESS)  # ... and its `trunk fit` arguments
    args = parser.parse_args()
    root = Path(args.root)
    if args.one:
        (recipe, method), arguments = args.one, args.arguments
        print(
            "RESULT " + json.dumps(one_run(recipe, method, shlex.split(arguments), root / Path(recipe).stem / method)),
            flush=True,
        )
        return
    if not args.recipe or not args.trunk:
        parser.error("give --trunk and at least one --recipe")
    ledger = Ledger(root)
    compose = dict(c.split("=", 1) for c in args.compose)
    tasks = {Path(recipe).stem: task_name(recipe) for recipe in args.recipe}
    plan = [(recipe, method, METHODS[method]) for recipe in args.recipe for method in args.method or METHODS]
    for recipe in args.recipe:
        task = tasks[Path(recipe).stem]
        if task in compose:
            sources = compose[task].split(",")
            recipes = {tasks[stem]: stem for stem in tasks}
            missing = [s for s in sources if s not in recipes]
            if missing:
                sys.exit(
                    f"error: --compose {task}={compose[task]}: no recipe here trains {missing}; the recipes' tasks are "
                    f"{sorted(recipes)}."
                )
            dirs = ",".join(str(root / recipes[s] / "lora" / "task") for s in sources)
            plan.append((recipe, "lora composed of " + "+".join(sources),
                         METHODS["lora"].replace("r: 8,", f"r: 8, compose: [{', '.join(sources)}],")
                         + f" --model.init_from=[{args.trunk},{dirs}]"))
    for recipe, method, arguments in plan:
        key = (Path(recipe).stem, method)
        if ledger.find({"recipe": key[0], "method": method}):
            continue
        task = tasks[key[0]]
        arguments = " ".join(
            filter(
                None,
                [
                    f"--model.init_from={args.trunk}",
                    arguments.format(task=task, small_head=small_head(recipe, task)),
                    args.extra,
                ],
            )
        )
        print(f"{key[0]} {method} ...", file=sys.stderr, flush=True)
        child = subprocess.run(
            [sys.executable, __file__, "--root", str(root), "--one", recipe, method, f"--arguments={arguments}"],
            capture_output=True,
            text=True,
        )
        line = next((line for line in child.stdout.splitlines() if line.startswith("RESULT ")), None)
        if child.returncode != 0 or line is None:
            sys.exit(f"error: {key[0]} {method} failed:\n{child.stderr[-3000:]}")
        ledger.add(json.loads(line[len("RESULT "):]))
    print_table(
        [ledger.find({"recipe": Path(recipe).stem, "method": method}) for recipe, method, _ in plan], args.trunk
    )


def small_head(recipe: str, task: str) -> str:
    """The option that leaves the pooler out of the task's head, where its kind has one."""
    import inspect

    import yaml

    from trunk.tasks.registry import objective_class

    objective = objective_class(yaml.safe_load(Path(recipe).read_text())["model"]["tasks"][task]["class_path"])
    return f"--model.tasks.{task}.init_args.pooler=false" if "pooler" in inspect.signature(objective).parameters else ""


def task_name(recipe: str) -> str:
    """The one task a recipe trains."""
    import yaml

    tasks = list(((yaml.safe_load(Path(recipe).read_text()) or {}).get("model") or {}).get("tasks") or {})
    if len(tasks) != 1:
        sys.exit(f"error: {recipe} trains the tasks {tasks}; this benchmark takes single-task recipes.")
    return tasks[0]


def print_table(rows: list[dict], trunk: str) -> None:
    from trunk.training.precision import cpu_info

    trunk_bytes = directory_bytes(Path(trunk))
    print(
        f"\n{os.cpu_count()} x {cpu_info()}, torch {torch.__version__}; trunk {trunk} ({trunk_bytes / 2**20:.1f} MiB)\n"
    )
    print(
        "| recipe | method | trained params (% of model) | bytes per task (% of trunk dir) | peak RSS MiB | steps/s | "
        "test score | min |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['recipe']} | {r['method']} | {r['trainable']:,} ({100 * r['trainable'] / r['parameters']:.2f}%) | "
            f"{r['bytes'] / 1024:,.0f} KiB ({100 * r['bytes'] / trunk_bytes:.1f}%) | {r['peak_mb']:.0f} | "
            f"{r['steps_per_s']:.2f} | {r['score']:.4f} | {r['minutes']:.1f} |"
        )


if __name__ == "__main__":
    main()
