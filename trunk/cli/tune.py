"""``trunk tune --config RECIPE.yaml --search SPACE.yaml``: find a recipe's settings by search, on Optuna.

Each trial is a plain ``trunk fit`` of the recipe with the trial's settings, run in this process (so its validations
reach the pruner) in a folder of its own (``<dir>/trial_0007``: checkpoints, config.yaml, logs; W&B runs in one group
named after the study). The study lives in an Optuna storage: by default ``<dir>/study.db`` (SQLite), or any database
URL (``--storage postgresql://...``), which workers on other machines join with the same command. Trials hold a
heartbeat there: a worker that dies (killed, its machine gone) leaves a trial that another worker, or the next tune,
takes up again with the same settings, resuming from the trial's own last checkpoint; a Ctrl+C does the same at once.
Finished trials are never run again."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import yaml

from trunk.cli.search_space import SearchSpace, SpaceError, differences, flat_keys
from trunk.core.atomic import atomic_write

TUNE_FILE = "tune.json"  # in the tune's folder: what it was started with, read by --summary
INTERRUPTED = (130, 143)  # trunk fit's exit codes after a Ctrl+C or SIGTERM (it saved last.ckpt first)
FAILURES_IN_A_ROW = 3  # trials that fail one after another stop the tune: the recipe or the space is at fault
WORKER_ENV = "TRUNK_TUNE_WORKER"  # set in the workers --workers starts: the starting process sums up at the end
SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "qmc": "QMCSampler", "gp": "GPSampler",
            "cmaes": "CmaEsSampler"}
PRUNERS = ("median", "hyperband", "halving", "none")


class TuneError(RuntimeError):
    """A tune that cannot go on: the message says why and what to change."""


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="trunk tune",
        description="Search a recipe's settings (Optuna): each trial a `trunk fit` of the recipe with settings drawn "
                    "from the search space, pruned on its validations; the best settings written as a recipe. Options "
                    "not listed here (--trainer.max_epochs=3, ...) go to every trial's `trunk fit`.",
        epilog="Example: trunk tune --config configs/minilm_trec.yaml --search configs/tune/minilm_trec.yaml "
               "--trials 16")
    parser.add_argument("--config", action="append", default=[], metavar="RECIPE.yaml",
                        help="the recipe (several: later ones override, as in trunk fit)")
    parser.add_argument("--search", metavar="SPACE.yaml", help="the search space: config paths and how to draw each")
    parser.add_argument("--trials", type=int, help="trials in the study, all workers together (default: 20, or no "
                        "limit with --timeout)")
    parser.add_argument("--timeout", type=duration, help="stop starting trials after this long (90m, 2h, 3600)")
    parser.add_argument("--metric", default="val/score",
                        help="what a trial scores: val/score (the mean of the tasks' primary metrics) or "
                             "val/<task>/<metric>")
    parser.add_argument("--direction", choices=["auto", "maximize", "minimize"], default="auto",
                        help="auto: the recipe checkpoint's mode for the metric, else by the metric")
    parser.add_argument("--seeds", type=int, default=1, help="runs per trial (seeds from the recipe's seed_everything "
                        "on); a trial scores their mean and is pruned on its first")
    parser.add_argument("--sampler", choices=sorted(SAMPLERS), default="tpe")
    parser.add_argument("--pruner", choices=PRUNERS, default="median",
                        help="median: stop a trial below the median of the others at the same point of training; "
                             "hyperband; halving (successive halving); none")
    parser.add_argument("--dir", help="the tune's folder (default runs/tune/<recipe name>)")
    parser.add_argument("--study", help="the study's name in the storage (default: the folder's name)")
    parser.add_argument("--storage", help="an Optuna database URL (default sqlite:///<dir>/study.db); workers with the "
                        "same --storage and --study share one study")
    parser.add_argument("--workers", type=int, default=1, help="worker processes on this machine, each on its share "
                        "of the cores")
    parser.add_argument("--seed", type=int, help="the sampler's seed (default: random)")
    parser.add_argument("--heartbeat", type=int, default=60, help="seconds between a running trial's heartbeats; one "
                        "silent for twice this is taken up again")
    parser.add_argument("--verbose", action="store_true", help="show each trial's own output (default: in its fit.log)")
    parser.add_argument("--summary", metavar="DIR", help="print a tune's trials, best settings and plots again")
    args, fit_args = parser.parse_known_args(argv)
    if args.summary is None:
        if not args.config or not args.search:
            parser.error("--config RECIPE.yaml and --search SPACE.yaml are needed (or --summary DIR)")
        if args.trials is not None and args.trials < 1:
            parser.error(f"--trials {args.trials}: give at least 1")
        if args.seeds < 1 or args.workers < 1 or args.heartbeat < 1:
            parser.error("--seeds, --workers and --heartbeat take 1 or more")
        if args.trials is None and args.timeout is None:
            args.trials = 20
    return args, fit_args


def duration(text: str) -> float:
    """Seconds from 3600, 90s, 45m, 2h or 1.5h."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write e.g. 3600, 90m or 2h")
    return float(found.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[found.group(2)]


# -- the recipe, checked once before any trial ----------------------------------------------------------------------
@dataclass
class Recipe:
    args: list[str]  # --config files and the options for every trial's trunk fit
    seed: int
    direction: str
    wandb_project: str | None


def check_recipe(args: argparse.Namespace, fit_args: list[str], space: SearchSpace, log: Path) -> tuple:
    """Parse and build the recipe once (as ``trunk fit`` would, without training): the space's paths must be its
    options, the metric one it logs, its trials on one device. Returns the space with the config's paths, and the
    Recipe."""
    from trunk.cli.fit import run_cli

    recipe_args = [part for path in args.config for part in ("--config", path)] + fit_args
    try:
        with captured(log, quiet=not args.verbose), empty_command_line():
            cli = run_cli(recipe_args, run=False)
    except (SystemExit, Exception) as err:
        raise TuneError(f"the recipe does not build as `trunk fit` would: {failure(err, log)}") from err
    config = cli.config
    space = space.check_paths(flat_keys(config))
    devices, nodes = config.trainer.get("devices"), config.trainer.get("num_nodes") or 1
    if (isinstance(devices, int) and devices > 1) or (isinstance(devices, list) and len(devices) > 1) or nodes > 1:
        raise TuneError(f"trials run in the tune's own process, on one device; this recipe asks for trainer.devices="
                        f"{devices}, num_nodes={nodes}. Pass --trainer.devices=1 (and --trainer.num_nodes=1), and run "
                        "more trials at once with --workers N or more `trunk tune` workers on one --storage.")
    tasks = cli.model.objectives
    stage, *rest = args.metric.split("/")
    if stage != "val" or (rest != ["score"] and (len(rest) != 2 or rest[0] not in tasks)):
        raise TuneError(f"--metric {args.metric}: a trial is scored on its validations: val/score (the mean of the "
                        f"tasks' primary metrics) or val/<task>/<metric> with a task of the recipe ({sorted(tasks)}), "
                        f"e.g. val/{next(iter(tasks))}/{tasks[next(iter(tasks))].primary}.")
    if not cli.datamodule.has_split("validation"):
        raise TuneError(f"the recipe logs no {args.metric}: none of its tasks has a validation split. Give one "
                        "(data.tasks.<task>.validation, or val_fraction to hold out part of the training data).")
    direction = args.direction
    if direction == "auto":
        checkpoint = next((c for c in cli.trainer.checkpoint_callbacks if c.monitor == args.metric), None)
        lower = rest[0] in tasks and rest[1] in tasks[rest[0]].lower_is_better
        direction = {"min": "minimize", "max": "maximize"}[checkpoint.mode] if checkpoint else (
            "minimize" if lower else "maximize")
    seed = config.get("seed_everything")
    loggers = config.trainer.get("logger")
    loggers = loggers if isinstance(loggers, list) else [loggers]
    project = next((getattr(lg.init_args, "project", None) or "lightning_logs" for lg in loggers
                    if str(getattr(lg, "class_path", "")).endswith("WandbLogger")), None)
    return space, Recipe(recipe_args, seed if isinstance(seed, int) and not isinstance(seed, bool) else 42, direction,
                         project)


# the packages that bring the database drivers SQLAlchemy imports, by module
DRIVERS = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary", "pymysql": "pymysql", "MySQLdb": "mysqlclient",
           "cx_Oracle": "cx_Oracle", "oracledb": "oracledb", "pyodbc": "pyodbc", "asyncpg": "asyncpg"}


# -- the study ------------------------------------------------------------------------------------------------------
def open_study(args: argparse.Namespace, folder: Path, space: SearchSpace, recipe: Recipe, trials: int | None):
    """Create or join the study, checking that its storage takes writes and that a study of this name searches this
    space with this recipe, before any trial runs."""
    import optuna
    from optuna.storages import RDBStorage

    url = args.storage or f"sqlite:///{(folder / 'study.db').resolve()}"
    name = args.study or folder.resolve().name
    engine = {"connect_args": {"connect_timeout": 10}} if url.startswith(("postgresql", "mysql")) else None
    for attempt in range(3):
        try:
            storage = RDBStorage(url, engine_kwargs=engine, heartbeat_interval=args.heartbeat,
                                 grace_period=2 * args.heartbeat, heartbeat_stale_trial_callback=take_up_again)
            study = optuna.create_study(storage=storage, study_name=name, sampler=optuna.samplers.RandomSampler(),
                                        pruner=make_pruner(args.pruner), direction=recipe.direction,
                                        load_if_exists=True)
            study.set_user_attr("joined", f"{socket.gethostname()}:{os.getpid()} {time.strftime('%F %T')}")
            break
        except ImportError as err:  # Optuna's, from SQLAlchemy's: the missing module is its cause's
            module = getattr(err.__cause__, "name", None) or ""
            package = DRIVERS.get(module.split(".")[0], module or "the database's driver")
            raise TuneError(f"--storage {url}: its database driver{f' {module!r}' if module else ''} is not "
                            f"installed: pip install \"{package}\" (SQLAlchemy picks the driver from the URL: "
                            "postgresql:// takes psycopg, postgresql+psycopg2:// psycopg2).") from err
        except Exception as err:  # sqlalchemy's errors: unreachable server, refused login, read-only file
            said = str(err).splitlines()[0][:300]
            # workers starting together both created its tables: the other won (SQLite: "UNIQUE constraint",
            # PostgreSQL: "duplicate key value violates unique constraint")
            if attempt < 2 and re.search(r"already exists|database is locked|unique constraint", said, re.IGNORECASE):
                time.sleep(1 + attempt)
                continue
            raise TuneError(f"cannot use the study storage {url}: {said}. Check the URL, that its server is "
                            "reachable and that this user may write to it.") from err
    study.sampler = make_sampler(args, trials, len(study.get_trials(deepcopy=False)))
    wanted = {"space": space.describe(), "recipe": recipe.args, "recipe_settings": recipe_settings(recipe.args),
              "metric": args.metric, "seeds": args.seeds}
    stored = {key: study.user_attrs[key] for key in (*wanted, "recipe_text") if key in study.user_attrs}
    if not stored:
        for key, value in wanted.items():
            study.set_user_attr(key, value)
    elif "space" in stored and (changed := differences(stored["space"], wanted["space"])):
        raise TuneError(f"study {name!r} in {url} searches another space: {'; '.join(changed)}. Name a new study "
                        "(--study NAME or another --dir), or give the space it was started with.")
    else:
        if "recipe_settings" in stored:  # what the recipe sets, whatever its paths, comments or key order
            changed = differences(stored["recipe_settings"], wanted["recipe_settings"])
        else:  # a study of an older Trunk kept its recipe files' bytes (older still: its command line)
            key, now = ("recipe_text", recipe_text(recipe.args)) if "recipe_text" in stored else ("recipe", recipe.args)
            changed = [f"{key.removesuffix('_text')} {stored[key]}, not {now}"] if stored.get(key, now) != now else []
        changed += [f"{key} {stored[key]}, not {wanted[key]}" for key in ("metric", "seeds")
                    if key in stored and stored[key] != wanted[key]]
        if changed:
            raise TuneError(f"study {name!r} in {url} was run with another recipe: {'; '.join(changed[:6])}"
                            f"{'; ...' if len(changed) > 6 else ''}. One study compares trials of one recipe, scored "
                            "one way: name a new study (--study NAME or another --dir), or give the recipe it was "
                            "started with.")
        if "recipe_settings" not in stored:  # an older study goes on, known by what its recipe sets from now on
            study.set_user_attr("recipe_settings", wanted["recipe_settings"])
    if study.direction.name.lower() != recipe.direction:
        raise TuneError(f"study {name!r} {study.direction.name.lower()}s its score, and this tune would "
                        f"{recipe.direction} {args.metric}: name a new study or pass --direction.")
    return study, url


def recipe_settings(recipe_args: list[str]) -> dict:
    """What the recipe sets, whatever its files' paths, comments or key order (a study's identity): each --config
    file's values by dotted path, a later file's over an earlier one's, and the other options as given."""
    settings, options = {}, []
    for previous, part in zip(["", *recipe_args], recipe_args):
        if previous == "--config" and Path(part).is_file():
            settings.update(dotted(yaml.safe_load(Path(part).read_text()) or {}))
        elif part != "--config":
            options += ["--config", part] if previous == "--config" else [part]
    # JSON's types, as the study stores them (a YAML date would come back a string)
    return json.loads(json.dumps({**settings, **({"command line": options} if options else {})}, default=str))


def dotted(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def recipe_text(recipe_args: list[str]) -> list[str]:
    """How a study of an older Trunk recorded its recipe: each --config file's name and a digest of its bytes."""
    said = []
    for previous, part in zip(["", *recipe_args], recipe_args):
        if previous == "--config" and Path(part).is_file():
            part = f"{Path(part).name} (sha256 {hashlib.sha256(Path(part).read_bytes()).hexdigest()[:12]})"
        said.append(part)
    return said


def take_up_again(study, trial) -> None:
    """Queue a trial that stopped unfinished (its worker killed or interrupted) again with its settings, its seeds'
    results so far, its folder (whose last checkpoint it resumes from) and its reports to the pruner; three times at
    most."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    RetryHeartbeatStaleTrialCallback(max_retry=3, inherit_intermediate_values=True)(study, trial)


def make_sampler(args: argparse.Namespace, trials: int | None, done: int):
    """``--seed``'s sampler, its stream moved on by the trials the study already has and by the worker's number: a
    resumed tune or a second worker would otherwise propose the first one's settings again."""
    import optuna

    seed = args.seed if args.seed is None else args.seed + done + 1000 * int(os.environ.get(WORKER_ENV, 0))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if args.sampler == "tpe":
                # a short study gets to TPE's own proposals sooner than Optuna's 10 random ones; constant_liar keeps
                # parallel workers from proposing the same point
                startup = 10 if trials is None else max(4, min(10, trials // 3))
                return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True, group=True,
                                                  constant_liar=True)
            return getattr(optuna.samplers, SAMPLERS[args.sampler])(seed=seed)
    except ImportError as err:
        raise TuneError(f"--sampler {args.sampler} needs a package that is not installed ({err}).") from err


def make_pruner(name: str):
    import optuna

    return {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=4),
            "hyperband": optuna.pruners.HyperbandPruner, "halving": optuna.pruners.SuccessiveHalvingPruner,
            "none": optuna.pruners.NopPruner}[name]()


def trials_used(study) -> tuple[int, bool]:
    """Trials counted against --trials (a failed trial taken up again counts once), and whether one waits to be
    taken up."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    used = sum(t.state != TrialState.WAITING and t.number not in retried for t in trials)
    return used, any(t.state == TrialState.WAITING for t in trials)


# -- one trial ------------------------------------------------------------------------------------------------------
def reporter(trial, metric: str):
    """A callback that reports each validation's ``metric`` to ``trial`` (None: only records it) and raises
    ``optuna.TrialPruned`` when the pruner says so. Made here so Lightning and Optuna load only for a tune."""
    import optuna
    from lightning.pytorch.callbacks import Callback

    class ReportToTrial(Callback):
        last: float | None = None
        steps = 0  # the optimizer steps the run has taken (a resumed run counts its steps before the resume)
        planned = 0  # the steps it takes when it runs to its end (0: unknown)

        def on_train_start(self, trainer, pl_module) -> None:
            total = trainer.estimated_stepping_batches
            self.planned = int(total) if math.isfinite(total) else 0

        def on_train_batch_end(self, trainer, *args) -> None:
            self.steps = trainer.global_step

        def on_fit_end(self, trainer, pl_module) -> None:  # a run resumed after its last step trains no batch
            self.steps = trainer.global_step

        def on_validation_end(self, trainer, pl_module) -> None:
            if trainer.sanity_checking or trainer.state.fn != "fit":
                return
            value = trainer.callback_metrics.get(metric)
            if value is None:  # misnamed: said at the first validation, not after the trial
                logged = sorted(k for k in trainer.callback_metrics if k.startswith("val/"))
                raise TuneError(f"the recipe's validations log no {metric}; they log {logged}: pick one of those "
                                "with --metric.")
            self.last = float(value)
            if trial is None:
                return
            point = progress(trainer)
            trial.report(self.last, point)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at {point / 100:g} epoch{'' if point == 100 else 's'}, {metric} "
                                         f"{self.last:.4f}")

    return ReportToTrial()


def progress(trainer) -> int:
    """Where training is, in hundredths of an epoch: trials of other batch sizes or lengths are compared at the same
    share of their data (a resumed trial reports where it is, as the uninterrupted one would have)."""
    batches = trainer.num_training_batches
    if not isinstance(batches, int) or batches <= 0 or math.isinf(batches):
        return trainer.global_step
    done = trainer.fit_loop.epoch_loop.batch_progress.current.ready
    return round(100 * (trainer.current_epoch + min(done, batches) / batches))


def run_trial(trial, space: SearchSpace, recipe: Recipe, args: argparse.Namespace, folder: Path,
              study_name: str) -> float:
    """The trial's runs (one per seed), each a ``trunk fit`` in its folder; a seed's result is recorded as it ends,
    so a trial taken up again runs only what is missing, resuming a run from its last checkpoint."""
    from trunk.cli.fit import run_cli

    settings = space.draw(trial)
    run_dir = Path(trial.user_attrs.get("run_dir") or folder / f"trial_{trial.number:04d}")
    trial.set_user_attr("run_dir", str(run_dir))
    trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
    scores, tests = dict(trial.user_attrs.get("scores", {})), dict(trial.user_attrs.get("tests", {}))
    seeds = [recipe.seed + i for i in range(args.seeds)]
    for i, seed in enumerate(seeds):
        if str(seed) in scores:
            continue
        run = run_dir if len(seeds) == 1 else run_dir / f"seed_{seed}"
        fit = ["fit", *recipe.args, *(f"--{path}={as_option(value)}" for path, value in settings.items()),
               f"--trainer.default_root_dir={run}", f"--seed_everything={seed}"]
        fit += [] if args.verbose else ["--trainer.enable_progress_bar=false"]
        fit += ["--ckpt_path=last"] if any(run.rglob("last.ckpt")) else []  # taken up again: resume
        watch = reporter(trial if i == 0 else None, args.metric)  # pruned on the first seed's validations
        began = time.perf_counter()
        try:
            with captured(run / "fit.log", quiet=not args.verbose), wandb_names(study_name, trial.number, seed, seeds),\
                    empty_command_line():
                cli = run_cli(fit, callbacks=[watch])
        finally:  # pruned or stopped too: what it ran counts
            steps = {**trial.user_attrs.get("seed_steps", {}), str(seed): watch.steps}
            trial.set_user_attr("seed_steps", steps)
            trial.set_user_attr("steps", sum(steps.values()))
            trial.set_user_attr("minutes", trial.user_attrs.get("minutes", 0) + (time.perf_counter() - began) / 60)
            if i == 0 and watch.planned:  # the whole trial's steps, had it not been pruned: every seed's run
                trial.set_user_attr("planned", watch.planned * len(seeds))
        scores[str(seed)] = score_of(cli, watch, args.metric, run)
        test = cli.trainer.callback_metrics.get("test/" + args.metric.split("/", 1)[1])
        if test is not None:
            tests[str(seed)] = float(test)
        trial.set_user_attr("scores", scores)
        trial.set_user_attr("tests", tests)
        if i == 0:
            trial.set_user_attr("config", str(Path(cli.trainer.log_dir) / "config.yaml"))
    return sum(scores[str(s)] for s in seeds) / len(seeds)


def as_option(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def score_of(cli, watch, metric: str, run: Path) -> float:
    """The trial's score: the best checkpoint's where the recipe keeps the best by this metric (the model the run
    gives, and the one its test scores), else the last validation's."""
    callback = cli.trainer.checkpoint_callback
    if callback is not None and callback.monitor == metric and callback.best_model_score is not None:
        return float(callback.best_model_score)
    if watch.last is not None:
        return watch.last
    raise TuneError(f"the run in {run} ran no validation, so it has no {metric}: make the recipe validate "
                    "(trainer.val_check_interval, check_val_every_n_epoch, limit_val_batches).")


@contextlib.contextmanager
def captured(log: Path, quiet: bool = True):
    """A trial's output (Python's and the libraries' own, at the file descriptors) into its log, not the table."""
    if not quiet:
        yield
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log.open("a") as file:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


@contextlib.contextmanager
def empty_command_line():
    """The process's command line emptied while a run parses ``args``: LightningCLI warns of a second command line
    otherwise (the run itself says its own command where it needs to: the one that resumes it)."""
    before = sys.argv
    sys.argv = before[:1]
    try:
        yield
    finally:
        sys.argv = before


@contextlib.contextmanager
def wandb_names(study: str, number: int, seed: int, seeds: list[int]):
    """W&B runs of a trial: in the study's group, named after the trial (wandb reads these when a run starts), and
    finished with it (Lightning leaves a run open, which the next trial's logger would take over)."""
    before = {key: os.environ.get(key) for key in ("WANDB_RUN_GROUP", "WANDB_NAME")}
    os.environ["WANDB_RUN_GROUP"] = study
    os.environ["WANDB_NAME"] = f"trial-{number}" + (f"-seed-{seed}" if len(seeds) > 1 else "")
    failed = True
    try:
        yield
        failed = False
    finally:
        wandb = sys.modules.get("wandb")
        if wandb is not None and wandb.run is not None:
            wandb.finish(exit_code=int(failed))
            wandb.teardown()  # its settings (the name, the group) are read again for the next trial's run
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def heartbeat(storage, trial_id: int, every: float):
    """The trial's heartbeat in the storage while it runs: one that stops (a killed worker) lets others take the trial
    up again. Optuna's own beats only inside ``study.optimize``, which cannot resume a trial from its checkpoint."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            with contextlib.suppress(Exception):  # a storage hiccup: the next beat tries again
                storage.record_heartbeat(trial_id)

    storage.record_heartbeat(trial_id)
    thread = threading.Thread(target=beat, daemon=True, name="trunk-tune-heartbeat")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def failure(err: BaseException, log: Path | None = None) -> str:
    """One line for why a run failed: its error's own, or the last line it wrote (a parser's error exits with 2)."""
    if isinstance(err, SystemExit) and isinstance(err.code, str):
        return err.code.removeprefix("error: ").splitlines()[0]
    if not isinstance(err, SystemExit):
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:400]
    lines = log.read_text(errors="replace").splitlines() if log is not None and log.is_file() else []
    said = [line for line in lines if line.strip() and not line.startswith(("usage:", " "))]
    return (said[-1] if said else f"exit status {err.code}").removeprefix("error: ")[:400]


# -- the loop -------------------------------------------------------------------------------------------------------
def tune(args: argparse.Namespace, fit_args: list[str]) -> int:
    from optuna.storages import fail_stale_trials

    quiet_optuna()
    space = SearchSpace.from_file(args.search)
    folder = Path(args.dir or Path("runs") / "tune" / Path(args.config[0]).stem)
    folder.mkdir(parents=True, exist_ok=True)
    # the other workers start now, each checking the recipe as this one does: they start trials as soon as it does
    workers = start_workers(args) if args.workers > 1 else []
    try:
        space, recipe = check_recipe(args, fit_args, space, folder / "recipe.log")
        study, url = open_study(args, folder, space, recipe, args.trials)
    except BaseException:  # refused (or interrupted) here: so are the workers just started
        stop_workers(workers)
        raise
    meta = {"study": study.study_name, "storage": url, "metric": args.metric, "direction": recipe.direction,
            "recipe": recipe.args, "space": space.describe(), "seeds": args.seeds,
            "wandb_project": recipe.wandb_project}
    atomic_write(folder / TUNE_FILE, lambda path: path.write_text(json.dumps(meta, indent=1) + "\n"))
    table = Table(space.paths, args.metric)
    print(f"Tuning {' '.join(args.config)} over {len(space.paths)} settings: study {study.study_name!r} in {url}, "
          f"{args.metric} ({recipe.direction}), {args.sampler} sampler, {args.pruner} pruner; trials in {folder}/.")
    print(table.header(), flush=True)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    failed_in_a_row = 0
    while True:
        fail_stale_trials(study)  # trials of dead workers: failed, and queued again with their settings
        used, waiting = trials_used(study)
        if (not waiting and args.trials is not None and used >= args.trials) or (
                deadline is not None and time.monotonic() > deadline):
            break
        trial = study.ask()
        try:
            done, failed = attempt(study, trial, space, recipe, args, folder)
        except TakenOver:  # its heartbeat stopped for longer than the grace
            print(f"Trial {trial.number} was taken up by another worker while this one was silent for over "
                  f"{2 * args.heartbeat} s (stopped, or its machine asleep): this run of it is dropped.",
                  file=sys.stderr)
            continue
        except Interrupted as stop:
            print(f"Stopped. Trial {trial.number} is queued again and resumes from its last checkpoint: run the same "
                  "`trunk tune` command to go on.", file=sys.stderr)
            stop_workers(workers)
            return stop.code
        except TuneError:
            stop_workers(workers)
            raise
        failed_in_a_row = failed_in_a_row + 1 if failed else 0
        print(table.row(done, best_trial(study)), flush=True)
        if failed_in_a_row >= FAILURES_IN_A_ROW:
            stop_workers(workers)
            raise TuneError(f"{failed_in_a_row} trials failed in a row, the last: {done.user_attrs.get('reason')} "
                            f"(its log: {last_log(done)}). Fix the recipe or the space, then run the tune again.")
    for worker in workers:
        worker.wait()
    if not os.environ.get(WORKER_ENV):
        summarize(folder)
    return 0


class Interrupted(Exception):
    """A trial stopped by a Ctrl+C or SIGTERM, its checkpoint saved and the trial queued again."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class TakenOver(Exception):
    """The trial was failed and queued again by another worker while this one ran it (its heartbeat went silent)."""


def attempt(study, trial, space: SearchSpace, recipe: Recipe, args: argparse.Namespace, folder: Path):
    """Run the trial, holding its heartbeat, and record how it ended: (its record, whether it failed)."""
    import optuna
    from optuna.trial import TrialState

    try:
        with heartbeat(study._storage, trial._trial_id, args.heartbeat):
            value = run_trial(trial, space, recipe, args, folder, study.study_name)
    except optuna.TrialPruned as pruned:
        return tell(study, trial, state=TrialState.PRUNED, reason=str(pruned)), False
    except (KeyboardInterrupt, SystemExit) as err:
        code = 130 if isinstance(err, KeyboardInterrupt) else err.code
        if code in INTERRUPTED:  # the run saved its last checkpoint: queue the trial again, to resume from it
            take_up_again(study, tell(study, trial, state=TrialState.FAIL, reason="interrupted"))
            raise Interrupted(code) from err
        return tell(study, trial, state=TrialState.FAIL, reason=failure(err, last_log(trial))), True
    except optuna.exceptions.UpdateFinishedTrialError as err:  # recording a seed's result in a trial taken over
        raise TakenOver from err
    except TuneError:
        with contextlib.suppress(TakenOver):
            tell(study, trial, state=TrialState.FAIL, reason="stopped the tune")
        raise
    except Exception as err:
        log = last_log(trial)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as file:
            traceback.print_exc(file=file)
        return tell(study, trial, state=TrialState.FAIL, reason=failure(err)), True
    return tell(study, trial, value=value), False


def tell(study, trial, value: float | None = None, state=None, reason: str | None = None):
    """Record the trial's end (and why, unless it completed), unless another worker has already."""
    if study._storage.get_trial(trial._trial_id).state.is_finished():
        raise TakenOver
    if reason is not None:
        trial.set_user_attr("reason", reason)
    return study.tell(trial, value, state=state)


def quiet_optuna() -> None:
    """Optuna's notes on its experimental options (heartbeats, TPE's multivariate) and on driving heartbeats outside
    ``study.optimize`` (done on purpose here): nothing a user of the tune acts on."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its per-trial info lines: the table says what matters
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message=".*is experimental.*")
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    warnings.filterwarnings("ignore", message="Target and region quantiles select the same set of trials")


def last_log(trial) -> Path:
    run = Path(trial.user_attrs.get("run_dir", "."))
    logs = sorted(run.rglob("fit.log"), key=lambda p: p.stat().st_mtime) if run.is_dir() else []
    return logs[-1] if logs else run / "fit.log"


def best_trial(study):
    try:
        return study.best_trial
    except ValueError:  # no trial completed yet
        return None


def start_workers(args: argparse.Namespace) -> list[subprocess.Popen]:
    """``--workers N``: N - 1 more processes of this command, each pinned to its share of the cores (this one
    takes the first share), so that no two trials' threads contend for a core."""
    from trunk.training.fault_tolerance import without_option  # here: a tune's options are read without Lightning

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    shares = [cores[i::args.workers] for i in range(args.workers)] if len(cores) >= args.workers else []
    argv = without_option(sys.argv[1:] if sys.argv[1:2] == ["tune"] else ["tune", *sys.argv[1:]], "--workers")
    workers = []
    for i in range(1, args.workers):
        env = {**os.environ, WORKER_ENV: str(i)}
        pin = (lambda share=shares[i]: os.sched_setaffinity(0, share)) if shares else None
        # a session of its own: a Ctrl+C reaches this process alone, which passes it on once (a second would stop a
        # worker's trial without its checkpoint)
        workers.append(subprocess.Popen([sys.executable, "-m", "trunk.cli", *argv], env=env, preexec_fn=pin,
                                        start_new_session=True))
    if shares:
        os.sched_setaffinity(0, shares[0])
    return workers


def stop_workers(workers: list[subprocess.Popen]) -> None:
    """Workers stop as this process does: their trials save and are queued again (SIGINT, as a Ctrl+C would)."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGINT)
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(timeout=300)


# -- what the user reads --------------------------------------------------------------------------------------------
class Table:
    """The live table of trials: number, state, score, steps, minutes, settings (by their shortest distinct names)."""

    def __init__(self, paths: list[str], metric: str) -> None:
        self.names, self.metric = short_names(paths), metric

    def header(self) -> str:
        return f"{'trial':>5}  {'state':<8}  {self.metric:>12}  {'steps':>6}  {'min':>5}  settings"

    def row(self, trial, best=None) -> str:
        value = "-" if trial.value is None else f"{trial.value:.4f}"
        star = " *" if best is not None and best.number == trial.number else ""
        settings = " ".join(f"{self.names.get(k, k)}={fmt(v)}" for k, v in trial.params.items())
        reason = trial.user_attrs.get("reason", "") if trial.state.name != "COMPLETE" else ""
        if "failed_trial" in trial.system_attrs:
            reason = ", ".join(filter(None, [f"continues trial {trial.system_attrs['retry_history'][-1]}", reason]))
        note = f"  ({reason})" if reason else ""
        return (f"{trial.number:>5}  {trial.state.name:<8}  {value + star:>12}  {trial.user_attrs.get('steps', 0):>6}"
                f"  {trial.user_attrs.get('minutes', 0):>5.1f}  {settings}{note}")


def short_names(paths: list[str]) -> dict[str, str]:
    """Each path's shortest dotted tail that no other path ends with (lr, sst2.init_args.pooling)."""
    names = {}
    for path in paths:
        parts = path.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(other != path and (other == tail or other.endswith("." + tail)) for other in paths):
                names[path] = tail
                break
        else:
            names[path] = path
    return names


def fmt(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def summarize(folder: Path) -> None:
    """Print every trial, the best settings and their test score, and how much pruning saved; write best.yaml and
    the plots (also into the W&B group, where the recipe logs there)."""
    import optuna
    from optuna.trial import TrialState

    quiet_optuna()
    meta_file = folder / TUNE_FILE
    if not meta_file.is_file():
        raise TuneError(f"{folder} holds no tune ({TUNE_FILE} is missing): give the folder a `trunk tune` wrote.")
    meta = json.loads(meta_file.read_text())
    try:
        study = optuna.load_study(study_name=meta["study"], storage=meta["storage"])
    except Exception as err:
        raise TuneError(f"cannot read study {meta['study']!r} from {meta['storage']}: "
                        f"{str(err).splitlines()[0][:300]}") from err
    trials = study.get_trials(deepcopy=False)
    table = Table(list(meta["space"]), meta["metric"])
    states = {s: sum(t.state == s for t in trials) for s in TrialState}
    print(f"\nStudy {meta['study']!r}: {states[TrialState.COMPLETE]} complete, {states[TrialState.PRUNED]} pruned, "
          f"{states[TrialState.FAIL]} failed, {states[TrialState.RUNNING]} running ({meta['storage']}).")
    best = best_trial(study)
    print(table.header())
    for trial in trials:
        if trial.state != TrialState.WAITING:
            print(table.row(trial, best))
    print(pruning_saved(trials))
    if best is None:
        print("No trial has completed yet: no best settings.")
        return
    tests = best.user_attrs.get("tests", {})
    seeds = best.user_attrs.get("scores", {})
    spread = f" (seeds {', '.join(f'{v:.4f}' for v in seeds.values())})" if len(seeds) > 1 else ""
    test = f"; {'test/' + meta['metric'].split('/', 1)[1]} {sum(tests.values()) / len(tests):.4f}" if tests else ""
    print(f"Best: trial {best.number}, {meta['metric']} {best.value:.4f}{spread}{test}")
    print("  " + " ".join(f"{table.names.get(k, k)}={fmt(v)}" for k, v in best.params.items()))
    recipe = write_best(folder, meta, best)
    print(f"  recipe: {recipe}  (trunk fit --config {recipe})")
    plots = draw_plots(study, folder / "plots")
    if plots:
        print(f"Plots: {', '.join(str(p) for p in plots)}")
    if meta.get("wandb_project") and plots:
        log_to_wandb(meta, folder, best, plots)


def pruning_saved(trials) -> str:
    """The steps pruned trials did not run, against the same trials run to the end: each pruned trial's planned
    steps (its epochs of its batches, every seed), or where a trial did not record them, the complete trials' median."""
    from optuna.trial import TrialState

    complete = sorted(t.user_attrs.get("steps", 0) for t in trials if t.state == TrialState.COMPLETE)
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    if not pruned or not (complete or all(t.user_attrs.get("planned") for t in pruned)):
        return f"Pruned {len(pruned)} trials."
    median = complete[len(complete) // 2] if complete else 0
    ran = sum(complete) + sum(t.user_attrs.get("steps", 0) for t in pruned)
    unpruned = sum(complete) + sum(t.user_attrs.get("planned") or median for t in pruned)
    guessed = sum(not t.user_attrs.get("planned") for t in pruned)
    how = f"; {guessed} of them at the complete trials' median, {median} steps" if guessed else ""
    return (f"Pruned {len(pruned)} trials: the trials ran {ran} steps, {1 - ran / unpruned:.0%} fewer than the "
            f"{unpruned} they would have run to their ends (each pruned trial's planned steps{how}).")


def write_best(folder: Path, meta: dict, best) -> Path:
    """The best trial's recipe, whole (its run's config.yaml as it ran), to train again with ``trunk fit``."""
    source = Path(best.user_attrs.get("config", ""))
    if not source.is_file():
        raise TuneError(f"the best trial's config ({source}) is gone: its folder was moved or deleted.")
    config = yaml.safe_load(source.read_text())
    config.pop("ckpt_path", None)
    config.get("trainer", {}).pop("default_root_dir", None)  # runs/best, unless given
    head = (f"# trunk tune: the best of study {meta['study']!r} ({meta['storage']}), trial {best.number}, "
            f"{meta['metric']} {best.value:.4f}\n# settings found: "
            + ", ".join(f"{k}={fmt(v)}" for k, v in best.params.items())
            + f"\n# from its run {best.user_attrs.get('run_dir')}; train it again with: trunk fit --config THIS_FILE\n")
    path = folder / "best.yaml"
    atomic_write(path, lambda tmp: tmp.write_text(head + yaml.safe_dump(config, sort_keys=False)))
    return path


def draw_plots(study, folder: Path) -> list[Path]:
    if importlib.util.find_spec("matplotlib") is None:
        print("Plots need matplotlib: pip install 'trunk[tune]'.")
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    folder.mkdir(parents=True, exist_ok=True)
    drawn = []
    for name, plot in (("history", plots.plot_optimization_history), ("importances", plots.plot_param_importances),
                       ("parallel", plots.plot_parallel_coordinate)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # experimental, and matplotlib's notes on flat axes
                axes = plot(study)
        except (ValueError, RuntimeError, ZeroDivisionError):  # too few complete trials for this plot
            continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        path = folder / f"{name}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(figure)
        drawn.append(path)
    return drawn


def log_to_wandb(meta: dict, folder: Path, best, plots: list[Path]) -> None:
    """The plots and the best settings as a run of the study's W&B group."""
    import wandb

    from trunk.formats.artifacts import wandb_has_credentials

    if not wandb_has_credentials():
        os.environ.setdefault("WANDB_MODE", "offline")
    with contextlib.redirect_stdout(sys.stderr):
        run = wandb.init(project=meta["wandb_project"], group=meta["study"], name=f"{meta['study']}-summary",
                         job_type="tune", dir=str(folder), config={"best": best.params, "trial": best.number},
                         reinit="finish_previous")
        run.log({f"tune/{p.stem}": wandb.Image(str(p)) for p in plots})
        run.summary["best_value"] = best.value
        run.finish()


def tune_main(argv: list[str]) -> None:
    args, fit_args = parse_args(argv)
    if importlib.util.find_spec("optuna") is None:
        sys.exit("error: trunk tune runs on Optuna, which is not installed: pip install 'trunk[tune]'.")
    try:
        if args.summary is not None:
            summarize(Path(args.summary))
            return
        code = tune(args, fit_args)
    except (SpaceError, TuneError) as err:
        sys.exit(f"error: {err}")
    if code:
        sys.exit(code)
