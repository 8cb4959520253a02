"""``trunk tune`` measured: a 16-trial search from MiniLM per task against the shipped recipe, and what pruning saves.

    python benchmarks/tune.py --task trec              # then --task wnut17, --task sst2
    python benchmarks/tune.py --task trec --unpruned   # also the same search without pruning (--pruner none)
    python benchmarks/tune.py --task trec --trial-seeds 3   # a search scoring each trial by 3 seeds' mean
    python benchmarks/tune.py summary
    python benchmarks/tune.py workers --ledger benchmarks/results/tune_workers.jsonl   # 1 worker against 2

For each task: ``trunk tune --config RECIPE --search configs/tune/<space> --trials 16 --seed 0`` (median pruning, the
recipe's seed for every trial), then the best recipe (its best.yaml) and the shipped one each trained with seeds 1, 2
and 3 (not the search's, so the tuned recipe is not scored on the seed it was picked on), scored on the test split.
``--unpruned`` runs the same search with ``--pruner none``: its steps against the pruned search's are the compute
pruning saved, its best dev score beside the pruned search's, and its best recipe trained with the same seeds and
scored on the test split, say whether it cost the result; and the pruner itself replayed over the unpruned
search's trials (``replay``): the compute pruning saves on the same trials, and whether it would have stopped the best
one. Every finished step is a
line of the ledger (default runs/bench_tune/results.jsonl); a stopped benchmark goes on where it stopped (the tunes
themselves resume: finished trials are kept, a stopped one resumes from its checkpoint).

``workers``: the wall time of one study (``--trials``, default 8, of configs/quickstart.yaml, ``--epochs`` 8, unpruned)
by one worker on one core against ``--workers 2`` (each pinned to a core of its own), one thread each, the two
alternating ``--rounds`` times; the speed-up is the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import optuna  # noqa: E402
from ledger import Ledger  # noqa: E402
from transfer import fit, spread  # noqa: E402

from trunk.training.precision import cpu_info  # noqa: E402

TASKS = {  # the shipped recipe and its search space
    "trec": ("configs/minilm_trec.yaml", "configs/tune/minilm_trec.yaml"),
    "wnut17": ("configs/minilm_wnut17.yaml", "configs/tune/minilm_wnut17.yaml"),
    "sst2": ("configs/minilm_sst2.yaml", "configs/tune/minilm_sst2.yaml"),
}


def study_in(folder: Path) -> optuna.Study:
    """The study a `trunk tune --dir FOLDER` kept: its default storage and name."""
    return optuna.load_study(study_name=folder.name, storage=f"sqlite:///{(folder / 'study.db').resolve()}")


def search(task: str, pruner: str, trials: int, root: Path, ledger: Ledger, trial_seeds: int = 1) -> dict:
    """A study's search; ``trial_seeds`` > 1: each trial scored by the mean of that many runs (``--seeds``)."""
    key = {"task": task, "step": "search", "pruner": pruner, "trials": trials,
           **({"trial_seeds": trial_seeds} if trial_seeds > 1 else {})}
    found = ledger.find(key)
    if found:
        return found
    recipe, space = TASKS[task]
    folder = root / task / (pruner if trial_seeds == 1 else f"{pruner}_seeds{trial_seeds}")
    command = [sys.executable, "-m", "trunk.cli", "tune", "--config", recipe, "--search", space, "--trials",
               str(trials), "--seed", "0", "--pruner", pruner, "--dir", str(folder),
               *(["--seeds", str(trial_seeds)] if trial_seeds > 1 else [])]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    study = study_in(folder)
    trials_run = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    best = study.best_trial
    return ledger.add({**key, "best_dev": best.value, "best_trial": best.number, "best_params": best.params,
                       "best_recipe": str(folder / "best.yaml"),
                       "steps": sum(t.user_attrs["steps"] for t in trials_run),
                       "minutes": sum(t.user_attrs["minutes"] for t in trials_run),
                       "pruned": sum(t.state.name == "PRUNED" for t in trials_run), "cpu": str(cpu_info())})


def replay(study: optuna.Study, pruner: str) -> dict:
    """The same trials pruned: ``trunk tune``'s pruner of that name run over an unpruned study's trials, one by one in
    their order, each reporting the validations it recorded; where the pruner stops a trial, the steps after are the
    compute saved. Two searches compared instead would differ by the trials their samplers drew, not only by pruning.
    """
    from trunk.cli.tune import make_pruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    replayed = optuna.create_study(direction=study.direction, pruner=make_pruner(pruner))
    steps = kept = 0
    stopped, unpruned = [], [t for t in study.trials if t.state.name == "COMPLETE" and t.intermediate_values]
    for recorded in unpruned:
        curve, trial = sorted(recorded.intermediate_values.items()), replayed.ask()
        for point, value in curve:
            trial.report(value, point)
            if trial.should_prune():  # the steps it took to here: its share of the trial's points
                replayed.tell(trial, state=optuna.trial.TrialState.PRUNED)
                stopped.append(recorded.number)
                steps += round(recorded.user_attrs["steps"] * point / curve[-1][0])
                break
        else:
            replayed.tell(trial, recorded.value)
            steps += recorded.user_attrs["steps"]
            kept += 1
    return {"steps": steps, "unpruned_steps": sum(t.user_attrs["steps"] for t in unpruned), "trials": len(unpruned),
            "stopped": stopped, "best_dev": replayed.best_value if kept else math.nan,
            "unpruned_best_dev": study.best_value, "best_trial_stopped": study.best_trial.number in stopped}


def replay_search(task: str, pruner: str, root: Path, ledger: Ledger) -> dict:
    key = {"task": task, "step": "replay", "pruner": pruner}
    found = ledger.find(key)
    if found:
        return found
    folder = root / task / "none"
    study = study_in(folder)
    return ledger.add({**key, **replay(study, pruner), "cpu": str(cpu_info())})


def tuned_name(found: dict) -> str:
    """The rerun records' name for a search's best recipe: "tuned" ("tuned_seeds3": each trial by 3 seeds' mean)."""
    return "tuned" + (f"_seeds{found['trial_seeds']}" if "trial_seeds" in found else "")


def rerun(task: str, which: str, recipe: str, seed: int, root: Path, ledger: Ledger) -> dict:
    key = {"task": task, "step": "rerun", "recipe": which, "seed": seed}
    found = ledger.find(key)
    if found:
        return found
    cli, minutes = fit(["--config", recipe, f"--seed_everything={seed}"], root / task / f"{which}_seed{seed}")
    metrics = cli.trainer.callback_metrics
    return ledger.add({**key, "test": float(metrics["test/score"]), "minutes": minutes,
                       "dev": float(cli.trainer.checkpoint_callback.best_model_score), "cpu": str(cpu_info())})


WORKERS_SPACE = {"model.optimizer.lr": {"log_uniform": [3e-4, 3e-3]},
                 "model.tasks.sentiment.init_args.pooling": {"choice": ["cls", "mean"]}}


def workers(trials: int, rounds: int, epochs: int, root: Path, ledger: Ledger) -> None:
    space = root / "workers_space.yaml"
    space.parent.mkdir(parents=True, exist_ok=True)
    space.write_text(json.dumps(WORKERS_SPACE))  # JSON is YAML
    cores = sorted(os.sched_getaffinity(0))
    walls: dict[int, list[float]] = {1: [], 2: []}
    spans: dict[int, list[float]] = {1: [], 2: []}  # the trials alone: the first one's start to the last one's end
    for r in range(rounds):
        for n in (1, 2):
            folder = root / "workers" / f"workers{n}_round{r}"
            shutil.rmtree(folder, ignore_errors=True)
            command = [sys.executable, "-m", "trunk.cli", "tune", "--config", "configs/quickstart.yaml", "--search",
                       str(space), "--trials", str(trials), "--dir", str(folder), "--seed", "0", "--pruner", "none",
                       "--workers", str(n), f"--trainer.max_epochs={epochs}"]
            pin = (lambda: os.sched_setaffinity(0, cores[:1])) if n == 1 else None  # one core, as each of the two has
            began = time.perf_counter()
            subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=pin,
                           stdout=subprocess.DEVNULL)
            walls[n].append(time.perf_counter() - began)
            study = study_in(folder)
            spans[n].append((max(t.datetime_complete for t in study.trials)
                             - min(t.datetime_start for t in study.trials)).total_seconds())
            print(f"round {r}: {n} worker(s) {walls[n][-1]:.0f} s, its trials {spans[n][-1]:.0f} s", flush=True)
    speedup = statistics.median(walls[1]) / statistics.median(walls[2])
    trials_speedup = statistics.median(spans[1]) / statistics.median(spans[2])
    ledger.add({"step": "workers", "trials": trials, "epochs": epochs, "walls": walls, "speedup": speedup,
                "trial_spans": spans, "trials_speedup": trials_speedup, "cpu": str(cpu_info())})
    print(f"{trials} trials: one worker {statistics.median(walls[1]):.0f} s, two {statistics.median(walls[2]):.0f} s "
          f"(median of {rounds}): {speedup:.2f}x; from the first trial's start to the last one's end, "
          f"{trials_speedup:.2f}x (the rest: start-up, the recipe's check, the summary, once per study)")


def test_scores(records: list[dict], task: str, recipe: str, seeds: list[int]) -> dict[int, float]:
    """A recipe's reruns of ``task``: test score by seed (the seeds run in any order, by several processes)."""
    return {r["seed"]: r["test"] for r in records
            if r["task"] == task and r["step"] == "rerun" and r["recipe"] == recipe and r["seed"] in seeds}


def paired_gain(tuned: dict[int, float], shipped: dict[int, float]) -> list[float]:
    """Tuned minus shipped, paired by seed; none until both have the same seeds."""
    return [tuned[seed] - shipped[seed] for seed in sorted(tuned)] if tuned.keys() == shipped.keys() else []


def summary(ledger: Ledger, seeds: list[int]) -> None:
    records = ledger.records()
    print("| task | shipped recipe, test | tuned recipe, test | gain | search: trials pruned, steps, minutes | "
          "best dev, pruned / unpruned | steps, pruned / unpruned |")
    print("|---|---|---|---|---|---|---|")
    for task in TASKS:
        runs = {w: test_scores(records, task, w, seeds) for w in ("shipped", "tuned")}
        searches = {r["pruner"]: r for r in records
                    if r["task"] == task and r["step"] == "search" and r.get("trial_seeds", 1) == 1}
        if not searches and not any(runs.values()):
            continue
        gain = paired_gain(runs["tuned"], runs["shipped"])
        pruned, unpruned = searches.get("median"), searches.get("none")
        about = (f"{pruned['pruned']} of {pruned['trials']}, {pruned['steps']}, {pruned['minutes']:.0f}" if pruned
                 else "–")
        dev = " / ".join(f"{s['best_dev']:.4f}" if s else "–" for s in (pruned, unpruned))
        steps = " / ".join(str(s["steps"]) if s else "–" for s in (pruned, unpruned))
        if pruned and unpruned:
            steps += f" ({1 - pruned['steps'] / unpruned['steps']:.0%} saved)"
        print(f"| {task} | {spread(list(runs['shipped'].values()), len(seeds))} | "
              f"{spread(list(runs['tuned'].values()), len(seeds))} | "
              f"{spread(gain, len(seeds), signed=True)} | {about} | {dev} | {steps} |")
    for task in TASKS:
        unpruned = test_scores(records, task, "tuned unpruned", seeds)
        if unpruned:
            print(f"{task}: the unpruned search's best recipe, test: {spread(list(unpruned.values()), len(seeds))}")
        shipped = test_scores(records, task, "shipped", seeds)
        for found in [r for r in records if r["task"] == task and r["step"] == "search" and "trial_seeds" in r]:
            tuned = test_scores(records, task, tuned_name(found), seeds)
            gain = paired_gain(tuned, shipped)
            print(f"{task}: the {found['pruner']} search scoring each trial by {found['trial_seeds']} seeds' mean "
                  f"(best dev {found['best_dev']:.4f}, {found['steps']} steps, {found['minutes']:.0f} min): its best "
                  f"recipe, test: {spread(list(tuned.values()), len(seeds))}, "
                  f"gain {spread(gain, len(seeds), signed=True)}")
    for record in [r for r in records if r["step"] == "replay"]:
        best = "its best trial stopped" if record["best_trial_stopped"] else "its best trial kept"
        print(f"{record['task']}: {record['pruner']} pruning replayed over the unpruned search's {record['trials']} "
              f"trials: {record['steps']} steps against {record['unpruned_steps']} "
              f"({1 - record['steps'] / record['unpruned_steps']:.0%} saved), trials stopped {record['stopped']}, "
              f"best dev {record['best_dev']:.4f} against {record['unpruned_best_dev']:.4f} ({best})")
    params = [r for r in records if r["step"] == "search" and r["pruner"] == "median"]
    for record in params:
        print(f"{record['task']}: best trial {record['best_trial']}: {json.dumps(record['best_params'])}")
    if records:
        print(f"CPU: {records[-1]['cpu']}; test scores x 100, mean ± sd over seeds {seeds}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="?", choices=["run", "summary", "workers"], default="run")
    parser.add_argument("--task", help=f"one of {sorted(TASKS)}, or a name of your own with --recipe and --space")
    parser.add_argument("--recipe", help="a task of your own: its recipe")
    parser.add_argument("--space", help="a task of your own: its search space")
    parser.add_argument("--trials", type=int, help="trials per search (default 16; workers: 8)")
    parser.add_argument("--rounds", type=int, default=2, help="workers: rounds of one against two")
    parser.add_argument("--epochs", type=int, default=8, help="workers: each trial's epochs (the recipe's 8: a trial "
                        "of about 20 s on one core, whose start-up, a few seconds per worker, then counts little)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--reruns", nargs="+", choices=["tuned", "shipped"], default=["tuned", "shipped"],
                        help="which recipes the seeds train (one of them: two processes can share the reruns)")
    parser.add_argument("--unpruned", action="store_true", help="also the same search with --pruner none")
    parser.add_argument("--trial-seeds", type=int, default=1, help="runs per trial, the trial's score their mean "
                        "(trunk tune --seeds): a search of its own, its best recipe rerun as 'tuned_seedsN'")
    parser.add_argument("--root", default="runs/bench_tune")
    parser.add_argument("--ledger", help="the ledger (default <root>/results.jsonl)")
    args = parser.parse_args()
    root = Path(args.root)
    ledger = Ledger(args.ledger or root)
    if args.what == "summary":
        if args.task and args.recipe:
            TASKS[args.task] = (args.recipe, args.space)
        summary(ledger, args.seeds)
        return
    if args.what == "workers":
        workers(args.trials or 8, args.rounds, args.epochs, root, ledger)
        return
    if args.recipe or args.space:
        TASKS[args.task] = (args.recipe, args.space)
    if args.task not in TASKS:
        parser.error(f"--task: one of {sorted(TASKS)}, or a name of your own with --recipe and --space")
    args.trials = args.trials or 16
    found = search(args.task, "median", args.trials, root, ledger, args.trial_seeds)
    for seed in args.seeds:
        if "tuned" in args.reruns:
            rerun(args.task, tuned_name(found), found["best_recipe"], seed, root, ledger)
        if "shipped" in args.reruns:
            rerun(args.task, "shipped", TASKS[args.task][0], seed, root, ledger)
    if args.unpruned:  # its best recipe over the same seeds too: did pruning cost the result on the test split?
        unpruned = search(args.task, "none", args.trials, root, ledger)
        for seed in args.seeds:
            rerun(args.task, "tuned unpruned", unpruned["best_recipe"], seed, root, ledger)
        replay_search(args.task, "median", root, ledger)
    summary(ledger, args.seeds)


if __name__ == "__main__":
    main()
