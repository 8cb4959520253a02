"""Does multi-task help small tasks? A related-task group, every task alone, all jointly, jointly then each task
fine-tuned alone (MT-DNN), and the separately fine-tuned models merged into one (TIES), over seeds. Prints tables: each
task's test score per way (mean ± sd over the seeds), its gain over alone, and the compute of each way.

    python benchmarks/transfer.py --group ner --seeds 1 2 3 [--ways alone joint merged] [--finetune-epochs 2]
    python benchmarks/transfer.py --groups my_groups.yaml --group mine   # a group of your own, GROUPS' layout
    python benchmarks/transfer.py --group ner --ways joint --sampling proportional   # another sampler than the recipe's

Run it from the repository (the recipes read ../shared/data). The ways:
  * alone: each task's own recipe (``GROUPS[group]["alone"]``), its settings the ones the group's recipe copies;
  * joint and mtdnn: one command, ``trunk fit --config <group recipe> --finetune_each N``: the joint run, tested on its
    best checkpoint, then each task fine-tuned alone N epochs from it (MT-DNN's recipe), each tested on its best;
    With ``--sampling`` (and ``--temperature``) the joint run draws its tasks by that rule instead of the recipe's: the
    ways are then named ``joint, <rule>`` and ``mtdnn, <rule>``, beside the recipe's own in the ledger and the table;
  * merged: ``trunk export <each alone best checkpoint> DIR --merge ties --base <the pretrained model>``, then each
    task tested on the merged model (``trunk test --config <its recipe> --model.init_from=DIR``).
Scores are each task's primary test metric (the recipes' ``test/score``) on the best checkpoint by validation score.
Every finished run is a line of <root>/results.jsonl (benchmarks/ledger.py): a stopped benchmark goes on where it
stopped. Compute: optimizer steps and wall minutes (the machine's; a merge trains nothing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from ledger import Ledger  # noqa: E402

from trunk.cli import export_main, run_cli  # noqa: E402
from trunk.training.precision import cpu_info  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MINILM = "../shared/data/pretrained/all-MiniLM-L6-v2"
# group -> its joint recipe, each task's own recipe, its small tasks (the targets' "small tasks"), the pretrained
# model every recipe starts from (what --merge subtracts) and, if not 2, the epochs of MT-DNN's per-task stage
GROUPS = {
    "ner": {"recipe": "configs/group_ner.yaml", "small": ["wnut"], "base": MINILM,
            "alone": {"conll": "configs/minilm_conll2003.yaml", "wnut": "configs/minilm_wnut17.yaml"}},
    "sick": {"recipe": "configs/group_sick.yaml", "small": ["entailment"], "base": MINILM,
             "alone": {"sick": "configs/minilm_sick.yaml", "entailment": "configs/minilm_sick_entailment.yaml"}},
    "questions": {"recipe": "configs/group_questions.yaml", "small": ["trec", "qa"], "base": MINILM,
                  "alone": {"trec": "configs/minilm_trec.yaml", "obqa": "configs/minilm_openbookqa.yaml",
                            "qa": "configs/minilm_xquad.yaml"}},
    "sentiment": {"recipe": "configs/group_sentiment.yaml", "small": [], "base": MINILM, "finetune_epochs": 1,
                  "alone": {"sst2": "configs/minilm_sst2.yaml", "goemotions": "configs/minilm_goemotions.yaml"}},
}
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def primary_scores(cli) -> dict[str, float]:
    """Each task's primary test metric (what its share of test/score is)."""
    metrics = cli.trainer.callback_metrics
    return {task: float(metrics[f"test/{task}/{objective.primary}"]) for task, objective in cli.model.objectives.items()
            if f"test/{task}/{objective.primary}" in metrics}


def alone(group: str, task: str, seed: int, root: Path, ledger: Ledger) -> dict:
    key = {"group": group, "way": "alone", "task": task, "seed": seed}
    found = ledger.find(key)
    if found:
        return found
    began = time.perf_counter()
    cli = run_cli(["fit", "--config", GROUPS[group]["alone"][task], f"--seed_everything={seed}", *QUIET,
                   f"--trainer.default_root_dir={root / group / 'alone' / task / f'seed{seed}'}"])
    callback = cli.trainer.checkpoint_callback
    return ledger.add({**key, "scores": primary_scores(cli), "steps": cli.trainer.global_step,
                       "minutes": (time.perf_counter() - began) / 60, "checkpoint": callback.best_model_path})


def sampler_name(sampling: str | None, temperature: float | None) -> str:
    """What the ways of a joint run with another sampler than its recipe's are called ('' for the recipe's)."""
    if sampling is None:
        return ""
    return f", {sampling}" + (f" T={temperature:g}" if sampling == "temperature" and temperature else "")


def joint_and_mtdnn(group: str, seed: int, epochs: int, root: Path, ledger: Ledger, sampling: list[str],
                    sampler: str = "") -> tuple[dict, dict]:
    """``sampling``: the command's overrides of the recipe's sampler, named ``sampler`` in the ways' names."""
    keys = [{"group": group, "way": way + sampler, "seed": seed} for way in ("joint", "mtdnn")]
    found = [ledger.find(key) for key in keys]
    if all(found):
        return found[0], found[1]
    began, folder = time.perf_counter(), "joint" + sampler.replace(", ", "_").replace(" ", "_")
    cli = run_cli(["fit", "--config", GROUPS[group]["recipe"], f"--seed_everything={seed}", f"--finetune_each={epochs}",
                   *sampling, *QUIET, f"--trainer.default_root_dir={root / group / folder / f'seed{seed}'}"])
    stages = cli.finetune_stages
    joint_minutes = (time.perf_counter() - began) / 60 - sum(stage["minutes"] for stage in stages.values())
    joint = ledger.add({**keys[0], "scores": primary_scores(cli), "steps": cli.trainer.global_step,
                        "minutes": joint_minutes, "checkpoint": cli.trainer.checkpoint_callback.best_model_path})
    mtdnn = ledger.add({**keys[1], "scores": {task: stage["test_score"] for task, stage in stages.items()},
                        "steps": joint["steps"] + sum(stage["steps"] for stage in stages.values()),
                        "minutes": joint_minutes + sum(stage["minutes"] for stage in stages.values()),
                        "finetune_epochs": epochs})
    return joint, mtdnn


def merged(group: str, seed: int, models: dict[str, dict], root: Path, ledger: Ledger) -> dict:
    key = {"group": group, "way": "merged", "seed": seed}
    found = ledger.find(key)
    if found:
        return found
    began, directory = time.perf_counter(), root / group / "merged" / f"seed{seed}"
    export_main([*(model["checkpoint"] for model in models.values()), str(directory), "--merge", "ties", "--base",
                 GROUPS[group]["base"], "--overwrite"])
    scores = {}
    for recipe in GROUPS[group]["alone"].values():
        cli = run_cli(["test", "--config", recipe, f"--model.init_from={directory}", f"--seed_everything={seed}",
                       *QUIET, f"--trainer.default_root_dir={directory / 'test'}"])
        scores.update(primary_scores(cli))
    return ledger.add({**key, "scores": scores, "steps": sum(model["steps"] for model in models.values()),
                       "minutes": sum(model["minutes"] for model in models.values())
                       + (time.perf_counter() - began) / 60})


def spread(values: list[float]) -> str:
    if not values:
        return "–"
    values = [100 * v for v in values]
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {sd:.2f}"


def report(group: str, seeds: list[int], ledger: Ledger) -> None:
    """Per task: each way's mean ± sd over the seeds and its gain over alone (paired by seed); per way: the compute.
    Every way the ledger holds for these seeds is shown, whichever command ran it."""
    tasks, small = list(GROUPS[group]["alone"]), GROUPS[group]["small"]
    runs = [r for r in ledger.records() if r["group"] == group and r["seed"] in seeds]
    alone = {(r["task"], r["seed"]): r for r in runs if r["way"] == "alone"}
    by_way: dict[str, dict[int, dict]] = {}
    for r in runs:
        if r["way"] != "alone":
            by_way.setdefault(r["way"], {})[r["seed"]] = r
    order = ["joint", "mtdnn", "merged"]
    ways = sorted(by_way, key=lambda w: (order.index(w.split(",")[0]) if w.split(",")[0] in order else 3, w))
    print(f"\n## {group}: test score x 100 (mean ± sd over seeds {', '.join(map(str, seeds))}; "
          f"small tasks: {', '.join(small) or 'none'})\n")
    print("| task | alone | " + " | ".join(ways) + " | " + " | ".join(f"{w} - alone" for w in ways) + " |")
    print("|---" * (2 + 2 * len(ways)) + "|")
    for task in tasks:
        alone_scores = {seed: alone[task, seed]["scores"][task] for seed in seeds if (task, seed) in alone}
        cells, gains = [], []
        for way in ways:
            scores = {seed: r["scores"][task] for seed, r in by_way[way].items() if task in r["scores"]}
            cells.append(spread(list(scores.values())))
            gains.append(spread([scores[s] - alone_scores[s] for s in scores if s in alone_scores]))
        print(f"| {task}{' (small)' if task in small else ''} | {spread(list(alone_scores.values()))} | "
              + " | ".join(cells + gains) + " |")
    # compute per seed: alone is every task's run of that seed together
    complete = [seed for seed in seeds if all((task, seed) in alone for task in tasks)]
    compute = {"alone": [(sum(alone[t, s]["steps"] for t in tasks), sum(alone[t, s]["minutes"] for t in tasks))
                         for s in complete]}
    compute.update({way: [(r["steps"], r["minutes"]) for r in by_way[way].values()] for way in ways})
    print("\n| way | optimizer steps (all tasks) | of alone | minutes | of alone |\n|---|---|---|---|---|")
    mean = {way: (statistics.mean(c[0] for c in runs), statistics.mean(c[1] for c in runs))
            for way, runs in compute.items() if runs}
    for way, (steps, minutes) in mean.items():
        base = mean.get("alone", (float("nan"), float("nan")))
        print(f"| {way} | {steps:,.0f} | {steps / base[0]:.2f} | {minutes:.1f} | {minutes / base[1]:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=Path, help="a YAML file of groups of your own, laid out as GROUPS")
    parser.add_argument("--group", required=True, help=f"built in: {', '.join(sorted(GROUPS))}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--ways", nargs="+", default=["alone", "joint", "merged"], choices=["alone", "joint", "merged"],
                        help="joint runs the mtdnn way too (one command); merged needs alone's checkpoints")
    parser.add_argument("--finetune-epochs", type=int,
                        help="mtdnn: each task's epochs after the joint run (default: the group's, else 2)")
    parser.add_argument("--sampling", choices=["proportional", "temperature", "uniform"],
                        help="joint: draw the tasks by this rule instead of the recipe's (compare samplers)")
    parser.add_argument("--temperature", type=float, help="with --sampling temperature: T (p ∝ n^(1/T))")
    parser.add_argument("--root", type=Path, default=Path("runs/transfer"))
    options = parser.parse_args()
    if options.temperature is not None and options.sampling != "temperature":
        parser.error("--temperature is T of --sampling temperature: give both, or neither")
    if options.groups:
        GROUPS.update(yaml.safe_load(options.groups.read_text()))
    if options.group not in GROUPS:
        parser.error(f"--group {options.group}: the groups are {', '.join(sorted(GROUPS))}")
    os.chdir(REPO)  # the recipes' relative paths
    print(f"machine: {os.cpu_count()} x {cpu_info()}, torch {torch.__version__}")
    sampler = sampler_name(options.sampling, options.temperature)
    sampling = [f"--data.sampling={options.sampling}"] if options.sampling else []
    sampling += [f"--data.temperature={options.temperature}"] if options.temperature is not None else []
    ledger = Ledger(options.root)
    for seed in options.seeds:
        if "alone" in options.ways or "merged" in options.ways:
            models = {task: alone(options.group, task, seed, options.root, ledger)
                      for task in GROUPS[options.group]["alone"]}
        if "joint" in options.ways:
            epochs = options.finetune_epochs or GROUPS[options.group].get("finetune_epochs", 2)
            joint_and_mtdnn(options.group, seed, epochs, options.root, ledger, sampling, sampler)
        if "merged" in options.ways:
            merged(options.group, seed, models, options.root, ledger)
    report(options.group, options.seeds, ledger)


if __name__ == "__main__":
    main()
