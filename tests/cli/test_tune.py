"""`trunk tune`: a search end to end, resuming a killed tune, two workers on one study, pruning, the best recipe
trained again, and each kind of bad input refused in one line before any trial runs."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import REPO

from trunk.cli.fit import run_cli
from trunk.cli.search_space import SearchSpace, SpaceError, flat_keys
from trunk.cli.tune import pruning_saved, recipe_settings, recipe_text, tune_main

optuna.logging.set_verbosity(optuna.logging.WARNING)


def recipe(tmp_path: Path, files: dict, epochs: int = 2, **trainer) -> Path:
    """A tiny sentiment recipe on the generated files: a few seconds a trial."""
    config = {
        "seed_everything": 0,
        "model": {"tasks": {"sentiment": {"class_path": "trunk.tasks.SequenceClassification"}},
                  "trunk": {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "max_len": 64},
                  "optimizer": {"lr": 1e-3}},
        "data": {"tasks": {"sentiment": {"class_path": "trunk.datamodules.TextClassificationData", "init_args": {
            "train": str(files["train"]), "validation": str(files["validation"]), "test": str(files["test"]),
            "max_length": 64, "batch_size": 32}}}, "tokenizer_vocab_size": 300},
        "trainer": {"accelerator": "cpu", "devices": 1, "max_epochs": epochs, "val_check_interval": 0.5,
                    "enable_model_summary": False, **trainer,
                    "callbacks": [{"class_path": "trunk.training.callbacks.TrunkCheckpoint",
                                   "init_args": {"monitor": "val/score", "mode": "max", "save_last": True}}]},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def space_file(tmp_path: Path, space: dict, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(space))
    return path


SPACE = {"model.optimizer.lr": {"log_uniform": [1e-4, 1e-2]},
         "model.tasks.sentiment.pooling": {"choice": ["cls", "mean"]}}


def study_of(folder: Path) -> optuna.Study:
    return optuna.load_study(study_name=folder.name, storage=f"sqlite:///{folder / 'study.db'}")


def refused(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        tune_main(argv)
    assert isinstance(stop.value.code, str) and stop.value.code.startswith("error: "), stop.value.code
    return stop.value.code


def test_a_tiny_search_end_to_end_and_its_best_recipe_trains_to_the_same_score(sentiment_files, tmp_path, capsys):
    folder = tmp_path / "tune"
    args = ["--config", str(recipe(tmp_path, sentiment_files)), "--search", str(space_file(tmp_path, SPACE)),
            "--trials", "3", "--dir", str(folder), "--seed", "0"]
    tune_main(args)
    out = capsys.readouterr().out
    study = study_of(folder)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    assert {t.user_attrs["run_dir"] for t in study.trials} == {str(folder / f"trial_000{i}") for i in range(3)}
    for trial in study.trials:  # the trial ran with its settings
        ran = yaml.safe_load(Path(trial.user_attrs["config"]).read_text())
        assert ran["model"]["optimizer"]["lr"] == trial.params["model.optimizer.lr"]
        assert ran["model"]["tasks"]["sentiment"]["init_args"]["pooling"] == trial.params[
            "model.tasks.sentiment.init_args.pooling"]
    best = study.best_trial
    assert f"Best: trial {best.number}, val/score {best.value:.4f}; test/score" in out
    assert "trial  state" in out and "pooling=" in out and "lr=" in out
    assert {p.name for p in (folder / "plots").iterdir()} == {"history.png", "importances.png", "parallel.png"}

    tune_main(args)  # the budget is spent: nothing runs again
    assert len(study_of(folder).trials) == 3
    tune_main([*args, "--trials", "4"])  # a larger budget: one more, not a replay of the seeded sampler's first draw
    more = study_of(folder).trials
    assert len(more) == 4 and more[3].params not in [t.params for t in more[:3]]
    best = study_of(folder).best_trial
    capsys.readouterr()
    tune_main(["--summary", str(folder)])
    assert f"Best: trial {best.number}" in capsys.readouterr().out

    again = run_cli(["fit", "--config", str(folder / "best.yaml"), f"--trainer.default_root_dir={tmp_path / 'again'}",
                     "--trainer.enable_progress_bar=false"])
    assert float(again.trainer.checkpoint_callback.best_model_score) == pytest.approx(best.value, abs=1e-6)


def test_a_trial_behind_the_others_is_pruned(sentiment_files, tmp_path):
    """Four trials at a sound learning rate, then one at 0.5: its validation loss is far above the others' median at the
    first validation, and it stops there."""
    folder = tmp_path / "prune"
    folder.mkdir()
    study = optuna.create_study(study_name=folder.name, storage=f"sqlite:///{folder / 'study.db'}",
                                direction="minimize")
    for lr in [3e-3] * 4 + [0.5]:
        study.enqueue_trial({"model.optimizer.lr": lr})
    tune_main(["--config", str(recipe(tmp_path, sentiment_files, epochs=3)),
               "--search", str(space_file(tmp_path, {"model.optimizer.lr": {"choice": [3e-3, 0.5]}})),
               "--trials", "5", "--dir", str(folder), "--metric", "val/sentiment/loss"])
    trials = study_of(folder).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4 + ["PRUNED"]
    assert trials[-1].user_attrs["steps"] < trials[0].user_attrs["steps"] / 2
    assert "pruned at" in trials[-1].user_attrs["reason"]
    # what pruning saved: against each pruned trial's own planned steps (its epochs of its batches), not a guess
    planned = trials[-1].user_attrs["planned"]
    assert planned == trials[0].user_attrs["steps"] == trials[0].user_attrs["planned"]  # the same epochs and batches
    ran = sum(t.user_attrs["steps"] for t in trials)
    unpruned = ran - trials[-1].user_attrs["steps"] + planned
    assert pruning_saved(trials) == (
        f"Pruned 1 trials: the trials ran {ran} steps, {1 - ran / unpruned:.0%} fewer than the {unpruned} they would "
        "have run to their ends (each pruned trial's planned steps).")


def tune_command(folder: Path, recipe_path: Path, space_path: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "trunk.cli", "tune", "--config", str(recipe_path), "--search", str(space_path),
            "--dir", str(folder), "--heartbeat", "1", *more]


def wait_for(condition, timeout: float = 240):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.3)
    raise AssertionError("timed out")


@pytest.mark.slow
def test_a_killed_tune_goes_on_without_repeating_a_finished_trial(sentiment_files, tmp_path):
    """SIGKILL in the middle of the second trial, after its first checkpoint: the next `trunk tune` leaves the first
    trial alone and takes the second up again (its heartbeat stopped) from its last checkpoint."""
    folder = tmp_path / "killed"
    command = tune_command(folder, recipe(tmp_path, sentiment_files, epochs=12),
                           space_file(tmp_path, SPACE), "--trials", "2")
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        wait_for(lambda: any((folder / "trial_0001").rglob("last.ckpt")))
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    time.sleep(2.5)  # past the grace of two missed heartbeats
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_of(folder).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert trials[2].params == trials[1].params and trials[2].user_attrs["run_dir"] == str(folder / "trial_0001")
    assert "continues trial 1" in done.stdout
    assert "Resuming from" in (folder / "trial_0001" / "fit.log").read_text()
    assert "Resuming from" not in (folder / "trial_0000" / "fit.log").read_text()  # run once, never again
    assert trials[2].user_attrs["steps"] == trials[0].user_attrs["steps"]  # resumed, not restarted: the same length


def test_a_trial_taken_up_after_its_last_step_still_counts_the_steps_it_ran(tiny_cli_args, tmp_path):
    """A tune stopped after a trial's training ended (in its test) takes the trial up again from its last checkpoint,
    with no batch left to train: the steps it ran still count (they read 0, and what pruning saved with them)."""
    from trunk.cli.tune import reporter

    args = ["fit", *tiny_cli_args, "--trainer.max_steps=3", "--trainer.callbacks+=ModelCheckpoint",
            "--trainer.callbacks.save_last=true"]
    first, again = reporter(None, "val/score"), reporter(None, "val/score")
    run_cli(args, callbacks=[first])
    run_cli([*args, "--ckpt_path=last"], callbacks=[again])
    assert first.steps == again.steps == 3


@pytest.mark.slow
def test_two_workers_share_one_study_and_run_disjoint_trials(sentiment_files, tmp_path):
    folder = tmp_path / "workers"
    command = tune_command(folder, recipe(tmp_path, sentiment_files, epochs=12), space_file(tmp_path, SPACE),
                           "--trials", "4", "--workers", "2")
    done = subprocess.run(command,
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_of(folder).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4  # the budget is the study's, not each worker's
    assert len({t.user_attrs["worker"] for t in trials}) == 2
    assert len({t.user_attrs["run_dir"] for t in trials}) == 4
    assert done.stdout.count("Best: trial") == 1  # the summary once, by the process that started the workers


@pytest.fixture
def postgres(tmp_path):
    """A PostgreSQL server of the test's own on 127.0.0.1 (initdb into tmp_path, stopped after): its URL. Skipped
    where the server's programs or the driver (psycopg, SQLAlchemy's for postgresql://) are missing. Run as the
    ``postgres`` user when the test runs as root, which the server refuses."""
    import shutil
    import socket

    pytest.importorskip("psycopg")
    bin_dir = next((Path(p) for p in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)
    initdb = shutil.which("initdb") or (str(bin_dir / "initdb") if bin_dir else None)
    pg_ctl = shutil.which("pg_ctl") or (str(bin_dir / "pg_ctl") if bin_dir else None)
    if not (initdb and pg_ctl and Path(initdb).exists()):
        pytest.skip("needs PostgreSQL's initdb and pg_ctl")
    as_owner: list[str] = []
    folder = tmp_path / "postgres"
    folder.mkdir()
    if os.geteuid() == 0:
        import pwd

        if "postgres" not in {user.pw_name for user in pwd.getpwall()} or not shutil.which("runuser"):
            pytest.skip("the server refuses root: needs a postgres user and runuser")
        as_owner = ["runuser", "-u", "postgres", "--"]
        shutil.chown(folder, "postgres")
        for parent in (tmp_path, *tmp_path.parents):  # the server's user must reach its folder
            if parent.stat().st_mode & 0o011 != 0o011:  # pytest's own folders are the owner's alone
                parent.chmod(parent.stat().st_mode | 0o011)
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    subprocess.run([*as_owner, initdb, "-D", str(folder / "data"), "-A", "trust", "-U", "trunk"], check=True,
                   capture_output=True, timeout=120)
    subprocess.run([*as_owner, pg_ctl, "-D", str(folder / "data"), "-l", str(folder / "log"), "-w", "-o",
                    f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"], check=True, capture_output=True,
                   timeout=120)
    try:
        yield f"postgresql://trunk@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_owner, pg_ctl, "-D", str(folder / "data"), "-m", "fast", "stop"], capture_output=True,
                       timeout=120)


def test_workers_on_other_machines_join_one_study_through_a_database_server(sentiment_files, tmp_path, postgres,
                                                                             capsys):
    """Two plain `trunk tune` commands, each with a run folder of its own (as on two machines), the same --storage
    postgresql://... and --study: the budget is the study's, each trial runs once, both workers take trials, and
    either folder's summary reads the whole study."""
    space = space_file(tmp_path, SPACE)
    workers = []
    for name in ("machine_a", "machine_b"):
        (tmp_path / name).mkdir()
        command = tune_command(tmp_path / name / "tune", recipe(tmp_path / name, sentiment_files, epochs=12), space,
                               "--trials", "4", "--storage", postgres, "--study", "shared")
        workers.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        cwd=tmp_path / name, env={**os.environ, "OMP_NUM_THREADS": "1"}))
    said = [worker.communicate(timeout=600) for worker in workers]
    assert all(worker.returncode == 0 for worker in workers), [err[-3000:] for _, err in said]
    trials = optuna.load_study(study_name="shared", storage=postgres).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # both machines took trials
    assert all(t.user_attrs["run_dir"].startswith(str(tmp_path / "machine_")) for t in trials)
    assert len({t.user_attrs["run_dir"] for t in trials}) == 4
    tune_main(["--summary", str(tmp_path / "machine_b" / "tune")])  # either folder's summary: the whole study
    assert "Study 'shared': 4 complete" in capsys.readouterr().out
    # a recipe of other text joining the study is refused, whatever its path; the same text at another path joined
    (tmp_path / "machine_c").mkdir()
    other = recipe(tmp_path / "machine_c", sentiment_files, epochs=6)
    said = refused(["--config", str(other), "--search", str(space), "--trials", "4", "--storage", postgres,
                    "--study", "shared", "--dir", str(tmp_path / "machine_c" / "tune")])
    assert "was run with another recipe: trainer.max_epochs was 12, now 6." in said and "name a new study" in said


def test_bad_search_spaces_are_refused_with_the_fix():
    cases = {
        "low 0.1 is above high 0.01": {"model.optimizer.lr": {"uniform": [0.1, 0.01]}},
        "a log range needs both ends above zero": {"model.optimizer.lr": {"log_uniform": [0, 0.01]}},
        "names no way to draw it": {"model.optimizer.lr": {"between": [1, 2]}},
        "is not a range": {"model.optimizer.lr": 0.001},
        "int takes whole numbers": {"trainer.max_epochs": {"int": [1.5, 3]}},
        "which is not another entry": {"model.optimizer.lr": {"uniform": [0.0, 1.0], "when": {"x.y": 1}}},
        "which it never draws": {"a.b": {"choice": [1, 2]}, "c.d": {"int": [1, 3], "when": {"a.b": 5}}},
        "in a circle": {"a.b": {"choice": [1], "when": {"c.d": 1}}, "c.d": {"choice": [1], "when": {"a.b": 1}}},
        "the search space is empty": {},
    }
    for said, space in cases.items():
        with pytest.raises(SpaceError, match=said):
            SearchSpace.from_dict(space)
    nested = SearchSpace.from_dict({"model": {"optimizer": {"lr": {"log_uniform": [1e-5, 1e-3]}}},
                                    "trainer.max_epochs": {"int": [2, 6], "step": 2}})
    assert nested.paths == ["model.optimizer.lr", "trainer.max_epochs"]
    conditional = SearchSpace.from_dict({"b": {"int": [1, 3], "when": {"a": "x"}}, "a": {"choice": ["x", "y"]}})
    assert [e.path for e in conditional.order()] == ["a", "b"]  # drawn after the entry it depends on


def test_bad_input_is_refused_in_one_line_before_any_trial(sentiment_files, tmp_path, monkeypatch):
    good = recipe(tmp_path, sentiment_files)
    space = space_file(tmp_path, SPACE)
    base = ["--config", str(good), "--search", str(space), "--trials", "1"]

    import importlib.util

    real = importlib.util.find_spec
    with monkeypatch.context() as without_optuna:
        without_optuna.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optuna" else real(name))
        assert "pip install 'trunk[tune]'" in refused([*base, "--dir", str(tmp_path / "0")])

    said = refused([*base[:2], "--search", str(space_file(tmp_path, {"model.optimizer.lrr": {"uniform": [0, 1]}},
                                                          "typo.yaml")), "--dir", str(tmp_path / "a")])
    assert "model.optimizer.lrr is not an option of this recipe; the nearest is model.optimizer.lr" in said
    said = refused([*base, "--dir", str(tmp_path / "b"), "--metric", "val/nosuch/acc"])
    assert "with a task of the recipe (['sentiment'])" in said
    said = refused([*base, "--dir", str(tmp_path / "c"), "--storage", "sqlite:////nonexistent/folder/x.db"])
    assert "cannot use the study storage sqlite:////nonexistent/folder/x.db" in said
    optuna.create_study(study_name="ro", storage=f"sqlite:///{tmp_path / 'ro.db'}")
    said = refused([*base, "--dir", str(tmp_path / "d"), "--study", "ro",
                    "--storage", f"sqlite:///file:{tmp_path / 'ro.db'}?mode=ro&uri=true"])
    assert "may write to it" in said
    said = refused([*base, "--dir", str(tmp_path / "e"), "--storage", "postgresql://127.0.0.1:1/none"])
    assert "postgresql://127.0.0.1:1/none" in said
    if importlib.util.find_spec("pymysql") is None:  # a driver not installed: its package named
        said = refused([*base, "--dir", str(tmp_path / "f"), "--storage", "mysql+pymysql://u@127.0.0.1:1/none"])
        assert "driver 'pymysql' is not installed: pip install \"pymysql\"" in said

    tune_main([*base, "--dir", str(tmp_path / "f")])  # a study of this space, then another space under its name
    other = space_file(tmp_path, {"model.optimizer.lr": {"log_uniform": [1e-5, 1e-2]}}, "other.yaml")
    said = refused([*base[:2], "--search", str(other), "--trials", "2", "--dir", str(tmp_path / "f")])
    assert "searches another space: model.tasks.sentiment.init_args.pooling is gone; model.optimizer.lr was" in said
    # the same recipe reworded (a comment, its keys in another order, another file) goes on with the study; a recipe
    # that sets other values is refused, naming them
    settings = yaml.safe_load(good.read_text())
    reworded = tmp_path / "reworded.yaml"
    reworded.write_text("# the same settings, reworded\n" + yaml.safe_dump(dict(reversed(settings.items())),
                                                                             sort_keys=False))
    tune_main(["--config", str(reworded), *base[2:4], "--trials", "2", "--dir", str(tmp_path / "f")])
    assert [t.state.name for t in study_of(tmp_path / "f").trials] == ["COMPLETE"] * 2
    settings["trainer"]["max_epochs"], settings["model"]["optimizer"]["weight_decay"] = 3, 0.1
    reworded.write_text(yaml.safe_dump(settings))
    said = refused(["--config", str(reworded), *base[2:4], "--trials", "3", "--dir", str(tmp_path / "f")])
    assert "was run with another recipe: model.optimizer.weight_decay is new; trainer.max_epochs was 2, now 3" in said
    # a study of an older Trunk, which kept its recipe files' text: the same text goes on, and its settings are kept
    storage = f"sqlite:///{tmp_path / 'f' / 'study.db'}"
    older = optuna.create_study(study_name="older", storage=storage, direction="maximize")
    for key, value in study_of(tmp_path / "f").user_attrs.items():
        older.set_user_attr(key, value) if key != "recipe_settings" else None
    older.set_user_attr("recipe_text", recipe_text(["--config", str(good)]))
    older.add_trials(study_of(tmp_path / "f").trials)
    tune_main([*base[:4], "--trials", "2", "--dir", str(tmp_path / "f"), "--study", "older"])
    assert optuna.load_study(study_name="older", storage=storage).user_attrs["recipe_settings"] == recipe_settings(
        ["--config", str(good)])

    said = refused([*base, "--dir", str(tmp_path / "g"), "--metric", "val/sentiment/nosuch"])
    assert "validations log no val/sentiment/nosuch; they log ['val/score', 'val/sentiment/acc'" in said
    without_validation = recipe(tmp_path, {**sentiment_files, "validation": None})
    text = yaml.safe_load(without_validation.read_text())
    del text["data"]["tasks"]["sentiment"]["init_args"]["validation"]
    text["trainer"]["callbacks"] = []
    without_validation.write_text(yaml.safe_dump(text))
    said = refused(["--config", str(without_validation), "--search", str(space), "--dir", str(tmp_path / "h")])
    assert "none of its tasks has a validation split" in said


def test_trials_log_to_one_wandb_group_and_the_summary_run_holds_the_plots(sentiment_files, tmp_path, monkeypatch,
                                                                           fresh_wandb):
    from wandb_records import history, records, settled

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "grouped"
    tune_main(["--config", str(recipe(tmp_path, sentiment_files)), "--config", str(REPO / "configs/trainer/wandb.yaml"),
               "--search", str(space_file(tmp_path, SPACE)), "--trials", "2", "--dir", str(folder)])

    def run_of(run_dir: Path):  # W&B's own process may still be writing the file when its run has ended
        written = settled(lambda folder: list(records(folder)), run_dir,
                          lambda found: any(r.WhichOneof("record_type") == "run" for r in found))
        return next(r.run for r in written if r.WhichOneof("record_type") == "run")

    for number in (0, 1):
        run = run_of(next((folder / f"trial_000{number}" / "wandb").glob("offline-run-*")))
        assert (run.run_group, run.display_name) == ("grouped", f"trial-{number}")
    summary = next((folder / "wandb").glob("offline-run-*"))
    assert (run_of(summary).run_group, run_of(summary).job_type) == ("grouped", "tune")
    logged = settled(history, summary, lambda rows: bool(rows))
    assert {"tune/history", "tune/importances", "tune/parallel"} <= {k.split("/path")[0] for r in logged for k in r}


@pytest.mark.parametrize("space", sorted((REPO / "configs" / "tune").glob("*.yaml")), ids=lambda p: p.name)
def test_each_shipped_search_space_names_options_of_its_recipe(space, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    recipe_path = REPO / "configs" / space.name
    assert f"trunk tune --config configs/{space.name} --search configs/tune/{space.name}" in space.read_text()
    with pytest.raises(SystemExit):
        run_cli(["fit", "--config", str(recipe_path), "--print_config"])
    config = yaml.safe_load(capsys.readouterr().out)
    SearchSpace.from_file(space).check_paths(flat_keys(config))


def test_a_worker_whose_trial_was_taken_up_by_another_drops_its_result_and_goes_on(sentiment_files, tmp_path,
                                                                                   monkeypatch, capsys):
    """A worker silent past its heartbeat's grace (stopped, asleep) finds its trial failed and queued again by another
    worker: it says so and goes on, rather than crashing on the finished trial."""
    import trunk.cli.tune as tune_module

    calls = []

    def trial_run(trial, *args):
        calls.append(trial.number)
        if len(calls) == 1:  # what another worker's look at the storage does to a silent trial
            study = optuna.load_study(study_name="taken", storage=f"sqlite:///{tmp_path / 'taken' / 'study.db'}")
            study._storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL)
            tune_module.take_up_again(study, study._storage.get_trial(trial._trial_id))
        return 0.5

    monkeypatch.setattr(tune_module, "run_trial", trial_run)
    monkeypatch.setattr(tune_module, "summarize", lambda folder: None)  # no runs, so no best recipe to write
    tune_main(["--config", str(recipe(tmp_path, sentiment_files)), "--search", str(space_file(tmp_path, SPACE)),
               "--trials", "1", "--dir", str(tmp_path / "taken")])
    assert "Trial 0 was taken up by another worker" in capsys.readouterr().err
    trials = study_of(tmp_path / "taken").trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"] and calls == [0, 1]
    assert trials[1].params == trials[0].params
