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
  * sequential: each small task fine-tuned alone from the group's one large task's alone model (intermediate-task
    training), its own recipe with ``--model.init_from=<that checkpoint>``: the compute of alone;
  * merged (``--merge``, ``--merge-density``, ``--merge-scale``: another merge than TIES' defaults, a way of its own):
    ``trunk export <each alone best checkpoint> DIR --merge ties --base <the pretrained model>``, then each
    task tested on the merged model (``trunk test --config <its recipe> --model.init_from=DIR``).
    ``--merge deltas``: each task alone as a LoRA delta on the frozen trunk (way ``alone, lora``: the recipe with the
    delta and learning rate of configs/minilm_conll2003_lora.yaml), the deltas then combined side by side.
Scores are each task's primary test metric (the recipes' ``test/score``) on the best checkpoint by validation score.
Every finished run is a line of <root>/results.jsonl, or of ``--ledger FILE`` (benchmarks/ledger.py; the README's
runs: benchmarks/results/transfer.jsonl, kept in the repository since run folders do not outlive a machine, while the
checkpoints its lines name do not leave the machine that trained them): a stopped benchmark goes on where it stopped,
and the run it was in resumes from its last checkpoint (what is lost is the steps since; a killed MT-DNN stage starts
over). Compute: optimizer steps and wall minutes (the machine's, a resumed run's earlier attempts' training included;
a merge trains nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from ledger import Ledger, add_version_option, checked_version  # noqa: E402

from trunk.cli import export_main, run_cli  # noqa: E402
from trunk.core.checkpoint import load_checkpoint  # noqa: E402
from trunk.training.fault_tolerance import last_checkpoints  # noqa: E402
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
# counts a run's training time into its checkpoints, so a resumed run's minutes include the stopped attempts'
TIMER = '--trainer.callbacks+={"class_path": "lightning.pytorch.callbacks.Timer", "init_args": {"interval": "step"}}'
# the ``alone, lora`` way's delta and learning rate: MiniLM's LoRA recipe (within 0.1 point of full fine-tuning there)
LORA_RECIPE = "configs/minilm_conll2003_lora.yaml"


def lora_options(task: str) -> list[str]:
    """The overrides that train ``task`` as LoRA recipe's delta on the frozen trunk, at its learning rate."""
    model = yaml.safe_load((REPO / LORA_RECIPE).read_text())["model"]
    delta = next(iter(model["peft"].values()))
    return [f"--model.peft={json.dumps({task: delta})}", f"--model.optimizer.lr={model['optimizer']['lr']}"]


def primary_scores(cli) -> dict[str, float]:
    """Each task's primary test metric (what its share of test/score is)."""
    metrics = cli.trainer.callback_metrics
    return {task: float(metrics[f"test/{task}/{objective.primary}"]) for task, objective in cli.model.objectives.items()
            if f"test/{task}/{objective.primary}" in metrics}


def fit(arguments: list[str], directory: Path):
    """``trunk fit`` with ``arguments``, its run in ``directory``. A run a stopped benchmark left there goes on from
    its last checkpoint (``--ckpt_path last``: trunk's exact resume, which skips the MT-DNN stages' checkpoints in
    <directory>/<task>; those stages start over), so a session's end or a killed process costs the steps since that
    checkpoint, not the run. Returns the CLI and the run's wall minutes, the stopped attempts' training time included
    (a Timer's, which every checkpoint carries)."""
    stopped = bool(last_checkpoints(directory))  # stage checkpoints come after the joint run's: any will do
    if stopped:
        print(f"Resuming the stopped run in {directory}", file=sys.stderr)
    began = time.perf_counter()
    cli = run_cli(["fit", *arguments, *QUIET, TIMER, f"--trainer.default_root_dir={directory}",
                   *(["--ckpt_path=last"] if stopped else [])])
    # the stopped attempts' training seconds: the Timer's in the checkpoint resumed from (trunk's pick for "last").
    # Not the Timer's after the run: testing the best checkpoint loads that checkpoint's elapsed time into it.
    resumed = load_checkpoint(cli.config.fit.ckpt_path) if stopped else {}
    before = resumed.get("callbacks", {}).get("Timer", {}).get("time_elapsed", {}).get("train", 0)
    return cli, (time.perf_counter() - began + before) / 60


def alone(group: str, task: str, seed: int, root: Path, ledger: Ledger, way: str = "alone",
          options: tuple[str, ...] = (), precision: str | None = None) -> dict:
    """``task``'s own recipe; ``way``, ``options``: another way of training it alone, by overrides of that recipe (the
    LoRA delta of ``alone, lora``; ``sequential``'s starting model). ``precision``: the trainer's, instead of the
    recipe's (a run of another precision in the ledger is not this one)."""
    precision_field, precision_options, suffix = other_precision(precision)
    key = {"group": group, "way": way, "task": task, "seed": seed, **precision_field}
    found = ledger.find(key)
    if found:
        return found
    cli, minutes = fit(["--config", GROUPS[group]["alone"][task], f"--seed_everything={seed}", *options,
                        *precision_options], root / group / folder(way) / task / f"seed{seed}{suffix}")
    return ledger.add({**key, "scores": primary_scores(cli), "steps": cli.trainer.global_step, "minutes": minutes,
                       "precision": cli.trainer.precision,
                       "checkpoint": cli.trainer.checkpoint_callback.best_model_path})


def other_precision(precision: str | None) -> tuple[dict, list[str], str]:
    """A run in ``precision`` instead of its recipe's (``auto``, which differs by machine): its ledger key's field,
    its option and its run folder's suffix (a finished run of another precision is not resumed as this one); None:
    nothing."""
    if not precision:
        return {}, [], ""
    return {"precision": precision}, [f"--trainer.precision={precision}"], f"_{precision}"


def checkpoint_of(run: dict) -> str:
    """A finished alone run's best checkpoint, which sequential and merged start from. A ledger kept in the repository
    names checkpoints of the machine that trained them."""
    if not Path(run["checkpoint"]).is_file():
        sys.exit(f"error: the ledger's {run['way']} run of {run['task']} (group {run['group']}, seed {run['seed']}) "
                 f"saved its model to {run['checkpoint']}, which is not on this machine. Delete that line of the "
                 "ledger to train the run again here, or run this way on the machine that trained it.")
    return run["checkpoint"]


def large_task(group: str) -> str | None:
    """The task ``sequential`` starts a group's small tasks from: its one task that is not small (None: not one)."""
    large = [task for task in GROUPS[group]["alone"] if task not in GROUPS[group]["small"]]
    return large[0] if len(large) == 1 and GROUPS[group]["small"] else None


def sequential(group: str, seed: int, root: Path, ledger: Ledger) -> None:
    """Each small task fine-tuned alone from the group's large task's alone model (intermediate-task training, Phang
    et al., 2018, "STILTs"). That model is the way's model of the large task too (a second ledger line of the same
    run), so the way's compute is the large task's steps plus the small tasks'."""
    large = large_task(group)
    start = alone(group, large, seed, root, ledger)
    for task in GROUPS[group]["small"]:
        if not ledger.find({"group": group, "way": "sequential", "task": task, "seed": seed}):  # needs start's model
            alone(group, task, seed, root, ledger, "sequential", (f"--model.init_from={checkpoint_of(start)}",))
    if not ledger.find(key := {"group": group, "way": "sequential", "task": large, "seed": seed}):
        ledger.add({**key, **{field: start[field] for field in ("scores", "steps", "minutes", "checkpoint")}})


def folder(way: str) -> str:
    """A way's run folder: its name without spaces ("merged, ties, density 0.5" -> "merged_ties_density_0.5")."""
    return way.replace(", ", "_").replace(" ", "_")


def sampler_name(sampling: str | None, temperature: float | None) -> str:
    """What the ways of a joint run with another sampler than its recipe's are called ('' for the recipe's)."""
    if sampling is None:
        return ""
    return f", {sampling}" + (f" T={temperature:g}" if sampling == "temperature" and temperature else "")


def joint_and_mtdnn(group: str, seed: int, epochs: int, root: Path, ledger: Ledger, sampling: list[str],
                    sampler: str = "", precision: str | None = None) -> tuple[dict, dict]:
    """``sampling``: the command's overrides of the recipe's sampler, named ``sampler`` in the ways' names;
    ``precision``: the trainer's, instead of the recipe's."""
    precision_field, precision_options, suffix = other_precision(precision)
    keys = [{"group": group, "way": way + sampler, "seed": seed, **precision_field} for way in ("joint", "mtdnn")]
    found = [ledger.find(key) for key in keys]
    if all(found):
        return found[0], found[1]
    cli, minutes = fit(["--config", GROUPS[group]["recipe"], f"--seed_everything={seed}", f"--finetune_each={epochs}",
                        *sampling, *precision_options], root / group / folder(keys[0]["way"]) / f"seed{seed}{suffix}")
    stages = cli.finetune_stages
    joint_minutes = minutes - sum(stage["minutes"] for stage in stages.values())
    trained = {"precision": cli.trainer.precision}
    joint = ledger.add({**keys[0], "scores": primary_scores(cli), "steps": cli.trainer.global_step,
                        "minutes": joint_minutes, **trained,
                        "checkpoint": cli.trainer.checkpoint_callback.best_model_path})
    mtdnn = ledger.add({**keys[1], "scores": {task: stage["test_score"] for task, stage in stages.items()},
                        "steps": joint["steps"] + sum(stage["steps"] for stage in stages.values()),
                        "minutes": joint_minutes + sum(stage["minutes"] for stage in stages.values()),
                        "finetune_epochs": epochs, **trained})
    return joint, mtdnn


def merge_name(method: str, density: float | None, scale: float | None) -> str:
    """What a merge other than TIES' defaults is called ('' for them)."""
    settings = [f"{what} {value:g}" for what, value in (("density", density), ("scale", scale)) if value is not None]
    return "" if method == "ties" and not settings else ", ".join([f", {method}", *settings])


def merged(group: str, seed: int, models: dict[str, dict], root: Path, ledger: Ledger, merge: list[str],
           name: str = "") -> dict:
    """``merge``: the export's merge options, named ``name`` in the way's name."""
    key = {"group": group, "way": "merged" + name, "seed": seed}
    found = ledger.find(key)
    if found:
        return found
    began, directory = time.perf_counter(), root / group / folder(key["way"]) / f"seed{seed}"
    export_main([*map(checkpoint_of, models.values()), str(directory), *merge, "--base",
                 GROUPS[group]["base"], "--overwrite"])
    scores = {}
    for task, recipe in GROUPS[group]["alone"].items():
        delta = lora_options(task)[:1] if "deltas" in merge else []  # the stored delta needs its model.peft
        cli = run_cli(["test", "--config", recipe, f"--model.init_from={directory}", f"--seed_everything={seed}",
                       *delta, *QUIET, f"--trainer.default_root_dir={directory / 'test'}"])
        scores.update(primary_scores(cli))
    return ledger.add({**key, "scores": scores, "steps": sum(model["steps"] for model in models.values()),
                       "minutes": sum(model["minutes"] for model in models.values())
                       + (time.perf_counter() - began) / 60})


def learns_from_others(way: str) -> bool:
    """Whether a task's weights see the other tasks' data under ``way``: not alone, nor in the deltas merge, whose
    tasks keep their separately trained deltas (what they gain over alone is LoRA's, not the group's)."""
    return not way.startswith("alone") and not way.endswith("deltas")


def shares_trunk(way: str) -> bool:
    """Whether every task trains one trunk together under ``way``: the joint run and MT-DNN after it, any sampler (not
    the separate runs, sequential's large task being its alone model, nor a merge, which trains nothing)."""
    return way.split(",")[0] in ("joint", "mtdnn")


def sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def spread(values: list[float], seeds: int, signed: bool = False) -> str:
    """x 100, mean ± sd; the number of seeds where it is not every seed's (a run still to come)."""
    if not values:
        return "–"
    values = [100 * v for v in values]
    shown = f"{statistics.mean(values):{'+' if signed else ''}.2f}"
    shown += f" ± {sd(values):.2f}" if len(values) > 1 else ""
    return shown + (f" (n={len(values)})" if len(values) != seeds else "")


def collect(group: str, seeds: list[int], records: list[dict]) -> tuple[dict, dict[str, dict[int, dict]]]:
    """The ledger's runs (``records``) of ``group`` over ``seeds``: alone by (task, seed), every other way by seed (a
    way of separate runs, ``alone, lora`` or ``sequential``, as one run of a seed: their scores, steps and minutes
    summed), in the order alone's variants, joint, mtdnn, sequential, merged, then other samplers and merges."""
    runs = [r for r in records if r["group"] == group and r["seed"] in seeds]
    alone = {(r["task"], r["seed"]): r for r in runs if r["way"] == "alone"}
    by_way: dict[str, dict[int, dict]] = {}
    for r in runs:
        if r["way"] != "alone" and "task" in r:
            seen = by_way.setdefault(r["way"], {}).setdefault(r["seed"], {"scores": {}, "steps": 0, "minutes": 0})
            seen.update(scores={**seen["scores"], **r["scores"]}, steps=seen["steps"] + r["steps"],
                        minutes=seen["minutes"] + r["minutes"])
        elif r["way"] != "alone":
            by_way.setdefault(r["way"], {})[r["seed"]] = r
    order = ["alone", "joint", "mtdnn", "sequential", "merged"]
    rank = {way: (order.index(way.split(",")[0]) if way.split(",")[0] in order else len(order), way) for way in by_way}
    return alone, dict(sorted(by_way.items(), key=lambda item: rank[item[0]]))


def task_scores(task: str, seeds: list[int], alone: dict, runs: dict[int, dict]) -> tuple[list[float], list[float]]:
    """A task's scores under one way over the seeds it ran, and its gains over alone paired by seed."""
    scores = {seed: r["scores"][task] for seed, r in runs.items() if task in r["scores"]}
    return list(scores.values()), [scores[s] - alone[task, s]["scores"][task] for s in scores if (task, s) in alone]


def compute(group: str, seeds: list[int], alone: dict, by_way: dict) -> dict[str, tuple[float, float]]:
    """Each way's mean optimizer steps and minutes a seed, over the seeds with every task's score; alone is every
    task's run of a seed together."""
    tasks = GROUPS[group]["alone"]
    complete = [seed for seed in seeds if all((task, seed) in alone for task in tasks)]
    runs = {"alone": [(sum(alone[t, s]["steps"] for t in tasks), sum(alone[t, s]["minutes"] for t in tasks))
                      for s in complete]}
    runs.update({way: [(r["steps"], r["minutes"]) for r in by_seed.values() if set(r["scores"]) >= set(tasks)]
                 for way, by_seed in by_way.items()})  # a seed whose separate runs are not all done yet: not counted
    return {way: (statistics.mean(c[0] for c in cs), statistics.mean(c[1] for c in cs)) for way, cs in runs.items()
            if cs}


def report(group: str, seeds: list[int], records: list[dict]) -> None:
    """Per task: each way's mean ± sd over the seeds and its gain over alone (paired by seed); per way: the compute.
    Every way the ledger holds for these seeds is shown, whichever command ran it."""
    tasks, small = list(GROUPS[group]["alone"]), GROUPS[group]["small"]
    alone, by_way = collect(group, seeds, records)
    print(f"\n## {group}: test score x 100 (mean ± sd over seeds {', '.join(map(str, seeds))}; "
          f"small tasks: {', '.join(small) or 'none'})\n")
    print("| task | alone | " + " | ".join(by_way) + " | " + " | ".join(f"{w} - alone" for w in by_way) + " |")
    print("|---" * (2 + 2 * len(by_way)) + "|")
    for task in tasks:
        both = [task_scores(task, seeds, alone, runs) for runs in by_way.values()]
        alone_scores = [alone[task, seed]["scores"][task] for seed in seeds if (task, seed) in alone]
        n = len(seeds)
        print(f"| {task}{' (small)' if task in small else ''} | {spread(alone_scores, n)} | "
              + " | ".join([spread(scores, n) for scores, _ in both]
                           + [spread(gains, n, signed=True) for _, gains in both]) + " |")
    mean = compute(group, seeds, alone, by_way)
    base = mean.get("alone", (float("nan"), float("nan")))
    print("\n| way | optimizer steps (all tasks) | of alone | minutes | of alone |\n|---|---|---|---|---|")
    for way, (steps, minutes) in mean.items():
        print(f"| {way} | {steps:,.0f} | {steps / base[0]:.2f} | {minutes:.1f} | {minutes / base[1]:.2f} |")


def summary(seeds: list[int], ledger: Ledger, budget: float = 1.5) -> None:
    """Every group's table (``report``), then the issue's targets over them: per group, the multi-task way within
    ``budget`` times the steps of alone that helps its small tasks most (gain against the seeds' spread), the average
    gain over all small tasks, the merged model against the separate ones, and the large tasks' worst loss by sharing
    a trunk."""
    records = ledger.records()
    collected = {group: collect(group, seeds, records) for group in GROUPS}
    for group, (_, by_way) in collected.items():
        if by_way:
            report(group, seeds, records)
    print(f"\n## Targets over the groups (seeds {', '.join(map(str, seeds))}; points of test score)\n")
    print("| group | best way for the small tasks | steps of alone | small tasks: gain (sd of gain; sd alone; seeds) | "
          "large tasks: worst mean gain, joint ways | merged - alone, worst task (the best merge) |")
    print("|---|---|---|---|---|---|")
    best_gains, by_way_gains = [], {}
    for group, (alone, by_way) in collected.items():
        if not alone or not by_way:
            continue
        tasks, small = list(GROUPS[group]["alone"]), GROUPS[group]["small"]
        mean = compute(group, seeds, alone, by_way)

        def gain(way: str, task: str) -> list[float]:
            return [100 * g for g in task_scores(task, seeds, alone, by_way[way])[1]]

        # a way whose separate runs are not all done has no compute yet: not picked
        within = [w for w in by_way if "alone" in mean and w in mean and mean[w][0] <= budget * mean["alone"][0]
                  and learns_from_others(w)]
        best = None  # a group without small tasks (sentiment) bears on the large-task bound only
        if small:
            # compared on equal evidence: a way run on one seed does not outrank ways run on three by its luck
            most = max((min(len(gain(w, t)) for t in small) for w in within), default=0)
            within = [w for w in within if min(len(gain(w, t)) for t in small) == most]
            best = max(within, key=lambda w: statistics.mean(statistics.mean(gain(w, t) or [0]) for t in small),
                       default=None)
        cells = []
        for task in small if best else []:
            gains = gain(best, task)
            alone_sd = sd([100 * alone[task, s]["scores"][task] for s in seeds if (task, s) in alone])
            cells.append(f"{task} {statistics.mean(gains):+.2f} ({sd(gains):.2f}; {alone_sd:.2f}; n={len(gains)})")
            best_gains.append(statistics.mean(gains))
        for way in filter(learns_from_others, by_way):
            by_way_gains.setdefault(way, []).extend(statistics.mean(gain(way, t)) for t in small if gain(way, t))
        large = [t for t in tasks if t not in small]
        shared = [(statistics.mean(gain(w, t)), t, w) for w in filter(shares_trunk, by_way) for t in large
                  if gain(w, t)]
        merges = [w for w in by_way if w.startswith("merged") and all(gain(w, t) for t in tasks)]
        # each merge's worst task; the merge whose worst is best
        merged = max((min((statistics.mean(gain(w, t)), t, w) for t in tasks) for w in merges), default=None)
        against_own = ""  # the deltas merge also against the LoRA models it holds, paired by seed
        if merged and merged[2].endswith("deltas") and "alone, lora" in by_way:
            own = by_way["alone, lora"]
            worst = min(statistics.mean(100 * (r["scores"][t] - own[s]["scores"][t])
                                        for s, r in by_way[merged[2]].items() if s in own) for t in tasks)
            against_own = f"; against its LoRA models {worst:+.2f}"
        ratio = f"{mean[best][0] / mean['alone'][0]:.2f}" if best else "–"
        print(f"| {group} | {best or '–'} | {ratio} | {'; '.join(cells) or '–'} | "
              + (f"{min(shared)[0]:+.2f} ({min(shared)[1]}, {min(shared)[2]})" if shared else "–") + " | "
              + (f"{merged[0]:+.2f} ({merged[1]}; {merged[2]}{against_own})" if merged else "–") + " |")
    if best_gains:
        print(f"\nAverage gain of the small tasks under their group's best way: {statistics.mean(best_gains):+.2f} "
              f"points over {len(best_gains)} tasks (target: >= 1 at <= {budget}x the steps of alone).")
        # one way for every group: no pick of the best per group, which favours noise
        print("The same way in every group, its average over the small tasks: " + "; ".join(
            f"{way} {statistics.mean(g):+.2f} ({len(g)} tasks)" for way, g in by_way_gains.items() if g) + ".")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=Path, help="a YAML file of groups of your own, laid out as GROUPS")
    parser.add_argument("--group", help=f"built in: {', '.join(sorted(GROUPS))}")
    parser.add_argument("--summary", action="store_true",
                        help="train nothing: every group's table and the targets over the groups the ledger holds "
                        "(--seeds, --ledger or --root)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--ways", nargs="+", default=["alone", "joint", "merged"],
                        choices=["alone", "joint", "merged", "sequential"],
                        help="joint runs the mtdnn way too (one command); merged needs alone's checkpoints; "
                        "sequential: each small task fine-tuned from the large task's alone model")
    parser.add_argument("--finetune-epochs", type=int,
                        help="mtdnn: each task's epochs after the joint run (default: the group's, else 2)")
    parser.add_argument("--sampling", choices=["proportional", "temperature", "uniform"],
                        help="joint: draw the tasks by this rule instead of the recipe's (compare samplers)")
    parser.add_argument("--temperature", type=float, help="with --sampling temperature: T (p ∝ n^(1/T))")
    parser.add_argument("--merge", choices=["ties", "task_arithmetic", "deltas"], default="ties",
                        help="merged: how the alone models are combined (trunk export --merge); deltas: of each task "
                        "alone as a LoRA delta (way 'alone, lora')")
    parser.add_argument("--merge-density", type=float, help="merged: trunk export's --merge-density (ties)")
    parser.add_argument("--merge-scale", type=float, help="merged: trunk export's --merge-scale")
    parser.add_argument("--root", type=Path, default=Path("runs/transfer"), help="where the runs' folders go")
    parser.add_argument("--ledger", type=Path,
                        help="the finished runs' results, one JSON line each (default: <root>/results.jsonl)")
    add_version_option(parser)
    options = parser.parse_args()
    version = checked_version(parser, options.trunk_version, options.summary)
    if options.temperature is not None and options.sampling != "temperature":
        parser.error("--temperature is T of --sampling temperature: give both, or neither")
    if options.groups:
        GROUPS.update(yaml.safe_load(options.groups.read_text()))
    if options.summary:
        return summary(options.seeds, Ledger(options.ledger or options.root, version))
    if options.group not in GROUPS:
        parser.error(f"--group {options.group}: the groups are {', '.join(sorted(GROUPS))}")
    if "sequential" in options.ways and large_task(options.group) is None:
        parser.error(f"--ways sequential starts a group's small tasks from its one large task's model; group "
                     f"{options.group} has small tasks {GROUPS[options.group]['small']} of "
                     f"{list(GROUPS[options.group]['alone'])}: leave out sequential, or give a group of that shape")
    os.chdir(REPO)  # the recipes' relative paths
    print(f"machine: {os.cpu_count()} x {cpu_info()}, torch {torch.__version__}")
    sampler = sampler_name(options.sampling, options.temperature)
    sampling = [f"--data.sampling={options.sampling}"] if options.sampling else []
    sampling += [f"--data.temperature={options.temperature}"] if options.temperature is not None else []
    merge = ["--merge", options.merge]
    merge += [f"--merge-density={options.merge_density}"] if options.merge_density is not None else []
    merge += [f"--merge-scale={options.merge_scale}"] if options.merge_scale is not None else []
    merging = merge_name(options.merge, options.merge_density, options.merge_scale)
    ledger = Ledger(options.ledger or options.root, version)
    for seed in options.seeds:
        if "alone" in options.ways or "merged" in options.ways:
            models = {task: alone(options.group, task, seed, options.root, ledger)
                      for task in GROUPS[options.group]["alone"]}
            if options.merge == "deltas" and "merged" in options.ways:
                models = {task: alone(options.group, task, seed, options.root, ledger, "alone, lora",
                                      tuple(lora_options(task))) for task in GROUPS[options.group]["alone"]}
        if "joint" in options.ways:
            epochs = options.finetune_epochs or GROUPS[options.group].get("finetune_epochs", 2)
            joint_and_mtdnn(options.group, seed, epochs, options.root, ledger, sampling, sampler)
        if "sequential" in options.ways:
            sequential(options.group, seed, options.root, ledger)
        if "merged" in options.ways:
            merged(options.group, seed, models, options.root, ledger, merge, merging)
    report(options.group, options.seeds, ledger.records())


if __name__ == "__main__":
    main()
