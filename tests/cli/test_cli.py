"""The `trunk` command end to end: fit -> validate -> test -> predict, checkpoints, precision, DDP, configs."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, single_task
from kinds import DATA_FILES, recipe_task_args

from trunk.cli import run_cli
from trunk.inference.predictor import Predictor
from trunk.tasks import TrunkModule


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_fit_validate_test_predict_and_checkpoint_round_trip(tiny_cli_args, tmp_path):
    cli = run_cli(["fit", *tiny_cli_args, "--trainer.max_epochs=2"])
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    assert ckpt and Path(ckpt).is_file()
    test_acc_after_fit = cli.trainer.callback_metrics["test/sentiment/acc"].item()  # the test split ran after fit
    assert (Path(cli.trainer.log_dir) / "tokenizer.json").is_file()
    assert (Path(cli.trainer.log_dir) / "config.yaml").is_file()

    validated = run_cli(["validate", *tiny_cli_args, f"--ckpt_path={ckpt}"])
    assert "val/sentiment/acc" in validated.trainer.callback_metrics
    tested = run_cli(["test", *tiny_cli_args, f"--ckpt_path={ckpt}"])
    assert tested.trainer.callback_metrics["test/sentiment/acc"] == pytest.approx(test_acc_after_fit)

    out = tmp_path / "predictions.jsonl"
    run_cli(["predict", *tiny_cli_args, f"--ckpt_path={ckpt}", f"--predictions.output={out}"])
    records = read_jsonl(out)
    assert len(records) == 64
    assert set(records[0]) == {"text", "label", "probs"}
    assert set(records[0]["probs"]) == {"negative", "positive"} and records[0]["label"] in ("negative", "positive")
    assert sum(records[0]["probs"].values()) == pytest.approx(1.0, abs=1e-5)
    # save -> load reproduces the predictions exactly: the trained model in memory, batched as trunk predict batches
    # (by length, eval batch size), gives the same records
    # (in the precision `trunk predict` ran: auto)
    in_memory = Predictor(cli.model, cli.datamodule.tasks, "auto").predict([r["text"] for r in records],
                                                                          batch_size=cli.datamodule.tasks["sentiment"].eval_batch_size)
    assert [r["probs"] for r in records] == [r["probs"] for r in in_memory]

    restored = TrunkModule.load_from_checkpoint(ckpt, weights_only=True)
    assert restored.objectives["sentiment"].label_names == ["negative", "positive"]
    for (name, a), b in zip(cli.model.state_dict().items(), restored.state_dict().values()):
        assert torch.equal(a, b), name


def test_predict_needs_only_the_checkpoint_and_the_inputs(tiny_cli_args, sentiment_files, tmp_path):
    """Label names and tokenizer come from the checkpoint: the predict file needs no label column."""
    cli = run_cli(["fit", *tiny_cli_args])
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"text": "the film was great"}\n{"text": "the plot was not good"}\n')
    out = tmp_path / "out.jsonl"
    run_cli(
        [
            "predict",
            *single_task(
                [
                    "--model=trunk.tasks.SequenceClassification",
                    "--data=trunk.datamodules.TextClassificationData",
                    f"--data.predict={texts}",
                ]
            ),
            f"--ckpt_path={ckpt}",
            f"--predictions.output={out}",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    assert [r["text"] for r in read_jsonl(out)] == ["the film was great", "the plot was not good"]


def test_predict_batches_by_length_and_writes_in_the_inputs_order(tiny_cli_args, tmp_path):
    """A predict file of mixed lengths: the batches hold rows of like length (less padding), the file lists them as
    given, and the records equal the Python API's on the same inputs."""
    cli = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=2"])
    ckpt = cli.trainer.checkpoint_callback.last_model_path or cli.trainer.checkpoint_callback.best_model_path
    words = ["the", "film", "was", "great", "but", "the", "plot", "was", "not", "good", "at", "all"]
    inputs = [" ".join(words[: 1 + (7 * i) % len(words)]) for i in range(40)]  # lengths 1 .. 12, shuffled
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in inputs))
    out = tmp_path / "out.jsonl"
    args = [
        *single_task(
            [
                "--model=trunk.tasks.SequenceClassification",
                "--data=trunk.datamodules.TextClassificationData",
                f"--data.predict={texts}",
                "--data.eval_batch_size=8",
            ]
        ),
        f"--ckpt_path={ckpt}",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    predicted = run_cli(["predict", *args, f"--predictions.output={out}"])
    written = read_jsonl(out)
    assert [r["text"] for r in written] == inputs
    (loader,) = predicted.trainer.predict_dataloaders
    batches = list(loader)
    assert sorted(i for b in batches for i in b["index"]) == list(range(40))
    widths = [b["input_ids"].shape[1] for b in batches]
    # in row order every batch would be about the widest
    assert widths == sorted(widths) and sum(widths) < 5 * max(widths)
    from trunk.tasks import load

    assert load(ckpt).predict(inputs, batch_size=8) == written


def test_bf16_mixed_precision_run(tiny_cli_args):
    cli = run_cli(["fit", *tiny_cli_args, "--trainer.precision=bf16-mixed"])
    assert cli.trainer.precision == "bf16-mixed"
    assert torch.isfinite(cli.trainer.callback_metrics["test/sentiment/loss"])


def test_two_process_ddp_run_on_cpu(tiny_cli_args, tmp_path):
    """The real command with Lightning's `ddp` launcher: 2 processes, gloo, one shared tokenizer."""
    args = [a for a in tiny_cli_args if not a.startswith("--trainer.devices")]
    cmd = [sys.executable, "-m", "trunk.cli", "fit", *args, "--config", str(REPO / "configs/trainer/ddp_cpu.yaml"),
           "--trainer.max_epochs=2"]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "distributed_backend=gloo" in output and "Starting with 2 processes" in output
    assert re.search(r"Test metrics:\n  sentiment  acc \d\.\d{4}", output), output[-3000:]  # tested after training
    # 256 examples, 2 processes, batch 32: 4 steps an epoch (a plain BatchSampler once made it 128 steps of one example)
    checkpoints = list((tmp_path / "run").rglob("*.ckpt"))
    assert checkpoints and all(torch.load(p, weights_only=True)["global_step"] == 8 for p in checkpoints), checkpoints


def test_wandb_logger_runs_offline_without_an_account(tiny_cli_args, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with W&B credentials
    monkeypatch.chdir(tmp_path)
    cli = run_cli(
        [
            "fit",
            *tiny_cli_args,
            "--config",
            str(REPO / "configs/trainer/wandb.yaml"),
            "--trainer.max_epochs=2",
            "--trainer.log_every_n_steps=2",
        ]
    )
    assert os.environ["WANDB_MODE"] == "offline"
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))  # the preset logs into the run folder
    assert runs, "no offline W&B run directory was written"
    # metrics.csv and checkpoints where they are without W&B
    version = (tmp_path / "run" / "lightning_logs" / "version_0")
    assert (version / "metrics.csv").is_file() and list((version / "checkpoints").glob("*.ckpt"))
    assert "test/sentiment/acc" in cli.trainer.callback_metrics
    # What `wandb sync` would upload: learning rates, throughput, and a prediction table per validation.
    import wandb
    from wandb_records import history, settled

    wandb.finish()
    rows = settled(
        history,
        runs[0],
        lambda rows: sum("confusion/sentiment_table/path" in r or "confusion/sentiment/path" in r for r in rows) == 2,
    )
    logged = {key for row in rows for key in row}
    assert {f"lr-AdamW/{g['name']}" for g in cli.trainer.optimizers[0].param_groups} <= logged
    assert {"perf/samples_per_sec", "perf/tokens_per_sec", "val/sentiment/acc"} <= logged
    tables = [row for row in rows if "samples/sentiment/path" in row]
    assert len(tables) == 2 and all(row["samples/sentiment/nrows"] == 16 for row in tables)  # one per validation
    contents = [json.loads((runs[0] / "files" / row["samples/sentiment/path"]).read_text()) for row in tables]
    assert all(c["columns"] == ["epoch", "id", "text", "gold", "predicted", "probability"] for c in contents)
    # the same rows
    assert ([r[1] for r in contents[0]["data"]] == [r[1] for r in contents[1]["data"]] == list(range(16)))
    assert [r[0] for r in contents[1]["data"]] == [1] * 16
    assert sum("confusion/sentiment_table/path" in row or "confusion/sentiment/path" in row for row in rows) == 2, (
        logged
    )
    csv_dir = next(Path(lg.log_dir) for lg in cli.trainer.loggers if type(lg).__name__ == "CSVLogger")
    # the JSON lines too, in the run's own folder
    assert (len((csv_dir / "samples" / "sentiment.jsonl").read_text().splitlines()) == 32)


RECIPES = sorted((REPO / "configs").glob("*.yaml"))
# configs/tune/ holds search spaces, not presets (tests/cli/test_tune.py checks them against their recipes)
PRESETS = sorted(p for p in (REPO / "configs").glob("*/*.yaml") if p.parent.name != "tune")


@pytest.mark.parametrize("config", RECIPES, ids=lambda p: p.name)
def test_every_recipe_config_instantiates(config, request, tiny_trunk_dir, tmp_path):
    """Each recipe builds its model, data and trainer (every task's data pointed at small generated files)."""
    recipe = yaml.safe_load(config.read_text())
    files = {source: request.getfixturevalue(f"{source}_files") for source in set(DATA_FILES.values()) - {None}}
    args, expected = [], {}
    for name, spec in recipe["data"]["tasks"].items():
        task_args, expected[name] = recipe_task_args(name, spec["class_path"], files)
        args += task_args
    args.append(
        f"--model.init_from={tiny_trunk_dir}" if recipe["model"].get("init_from") else "--data.tokenizer_vocab_size=300"
    )
    if recipe["model"].get("heads_from"):  # the stand-in trunk has no such heads, nor their languages
        args += ["--model.heads_from=null", *[f"--model.tasks.{name}.init_args.target_language=null"
                                              for name, spec in recipe["model"]["tasks"].items()
                                              if "target_language" in spec.get("init_args", {})]]
    cli = run_cli(["--config", str(config), *args, f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert set(cli.model.objectives) == set(recipe["model"]["tasks"])
    if "text" in cli.model.trunk.stems:
        assert cli.model.trunk.stems["text"].token.num_embeddings == cli.datamodule.vocab_size  # linked, never typed
    for name, labels in expected.items():
        assert cli.model.objectives[name].label_names == labels, name


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_preset_config_merges_onto_a_recipe(preset, capsys):
    with pytest.raises(SystemExit) as exit_info:
        # data presets name sst2
        base = ("configs/sst2.yaml" if preset.parent.name == "data" else "configs/quickstart.yaml")
        run_cli(["fit", "--config", str(REPO / base), "--config", str(preset), "--print_config"])
    assert exit_info.value.code == 0
    merged = yaml.safe_load(capsys.readouterr().out)
    assert contains(merged, yaml.safe_load(preset.read_text())), f"{preset.name} was not applied"


def contains(full, part) -> bool:
    """Every value in ``part`` appears in ``full`` (which also holds defaults filled in by the parser)."""
    if isinstance(part, dict):
        return isinstance(full, dict) and all(k in full and contains(full[k], v) for k, v in part.items())
    if isinstance(part, list):
        return isinstance(full, list) and len(full) == len(part) and all(contains(f, p) for f, p in zip(full, part))
    return full == part


def test_missing_checkpoint_path_is_a_clear_error(tiny_cli_args, tmp_path):
    with pytest.raises(SystemExit, match="--ckpt_path .*does not exist"):
        run_cli(["test", *tiny_cli_args, f"--ckpt_path={tmp_path / 'missing.ckpt'}"])


def test_data_longer_than_the_trunk_is_a_clear_error_before_a_tokenizer_is_trained(tiny_cli_args, monkeypatch):
    def train_tokenizer(self):
        raise AssertionError("a tokenizer was trained (minutes on a large corpus) before the lengths were checked")

    monkeypatch.setattr("trunk.datamodules.multitask.TaskSet.build_codec", train_tokenizer)
    with pytest.raises(ValueError, match="max_length=64 is longer than the trunk's max_len=32"):
        run_cli(["fit", *tiny_cli_args, "--model.trunk.max_len=32"])


def test_installed_under_one_namespace_beside_a_users_own_models_package(tmp_path):
    """The folders install as trunk.models / trunk.tasks / trunk.datamodules: a project with its own
    `models` package imports both without a clash."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("MINE = True\n")
    code = ("import models, trunk.tasks, trunk.models, trunk.datamodules; assert models.MINE; "
            "print(trunk.models.Backbone.__module__)")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "trunk.models.trunk"


def test_predictions_that_are_not_finite_are_an_error_not_invalid_json(tmp_path):
    from trunk.training.callbacks import PredictionWriter

    writer = PredictionWriter(output=str(tmp_path / "p.jsonl"))
    trainer = type("T", (), {"global_rank": 0, "world_size": 1, "log_dir": str(tmp_path), "datamodule": None})()
    writer.on_predict_start(trainer, None)
    with pytest.raises(
        ValueError, match="Task 'sst2': a prediction holds NaN or infinity .* Predict with an earlier checkpoint"
    ):
        writer.write_on_batch_end(trainer, None, [{"label": "positive", "probs": {"positive": float("nan")}}], None,
                                  {"task": "sst2"}, 0, 0)


def test_a_stored_class_that_names_the_wrong_thing_is_one_line_naming_the_file_the_class_and_what_it_must_be(
        tiny_cli_args, tmp_path):
    """A checkpoint (without its digest, as older or hand-made files are) whose stored objective is another class than
    its options and head were written for, a data class where an objective belongs, an objective of another kind than
    its head, a data class that feeds another kind: `trunk predict` and load() refuse each before anything is built,
    in one line naming the file, the stored class and what it must be."""
    import copy

    from trunk.tasks import load

    ckpt = run_cli(["fit", *tiny_cli_args]).trainer.checkpoint_callback.best_model_path
    state = torch.load(ckpt, weights_only=True)
    state.pop("trunk_digest")

    def edited(name: str, where: str, class_path: str) -> Path:
        changed = copy.deepcopy(state)
        spec = (changed["hyper_parameters"]["tasks"] if where == "objective"
                else changed["datamodule_hyper_parameters"]["data_tasks"])["sentiment"]
        spec["class_path"] = class_path
        torch.save(changed, tmp_path / name)
        return tmp_path / name

    cases = [
        (edited("token.ckpt", "objective", "trunk.tasks.TokenClassification"),
         r"token.ckpt' stores task 'sentiment''s objective as trunk.tasks.TokenClassification with the options "
         r"\[.*'pooling'.*\], which TokenClassification does not take; they are options of ImageClassification, "
         r"SequenceClassification: the file names another class"),
        (edited("data.ckpt", "objective", "trunk.datamodules.TextClassificationData"),
         r"data.ckpt': 'trunk.datamodules.TextClassificationData' is not a Objective class Trunk knows \(it is a "
         r"TaskData class, where an Objective class belongs\): a stored file may name only Trunk's own Objective "
         r"classes \(e.g. trunk.tasks.SequenceClassification\)"),
        (edited("kind.ckpt", "objective", "trunk.tasks.ImageClassification"),  # it takes the options
         r"kind.ckpt' stores task 'sentiment''s head as a sequence_classification head and its objective as "
         r"trunk.tasks.ImageClassification \(image_classification\): it must be SequenceClassification"),
        (edited("feeds.ckpt", "data", "trunk.datamodules.MultiLabelTextData"),  # it takes the options
         r"feeds.ckpt' stores task 'sentiment''s data as trunk.datamodules.MultiLabelTextData, which feeds "
         r"\['multi_label_classification'\]; its objective .*SequenceClassification \(sequence_classification\) needs "
         r"TextClassificationData"),
    ]
    for path, message in cases:
        with pytest.raises(ValueError, match=message):
            load(path)
        with pytest.raises(SystemExit, match=message):
            run_cli(["predict", *tiny_cli_args, f"--ckpt_path={path}",
                     f"--predictions.output={tmp_path / 'out.jsonl'}"])
    assert not (tmp_path / "out.jsonl").exists()


def test_unreadable_and_foreign_checkpoints_are_clear_errors(tiny_cli_args, tmp_path):
    garbage = tmp_path / "random.ckpt"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(SystemExit, match="--ckpt_path: .*random.ckpt' is not a readable checkpoint"):
        run_cli(["test", *tiny_cli_args, f"--ckpt_path={garbage}"])
    cli = run_cli(["fit", *tiny_cli_args])
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    image = ["--model.tasks.shapes=trunk.tasks.ImageClassification", "--model.tasks.shapes.image_size=16",
             "--model.tasks.shapes.patch_size=4", "--data.tasks.shapes=trunk.datamodules.ImageClassificationData",
             "--data.tasks.shapes.dataset=trunk:shapes", "--data.tasks.shapes.test=test"]
    nan = tmp_path / "nan.ckpt"
    state = torch.load(ckpt, weights_only=True)
    state.pop("trunk_digest")  # (with it, the changed tensor is caught as corruption first)
    next(v for v in state["state_dict"].values() if v.is_floating_point()).view(-1)[0] = float("nan")
    torch.save(state, nan)
    with pytest.raises(ValueError, match="The checkpoint has NaN or infinite weights in"):
        run_cli(["test", *tiny_cli_args, f"--ckpt_path={nan}"])
    others = [a for a in tiny_cli_args if "sentiment" not in a]
    with pytest.raises(
        SystemExit,
        match=r"was trained for the tasks \{'sentiment': 'sequence_classification'\}, but this config "
        r"has \{'shapes': 'image_classification'\}.*--model.init_from=",
    ):
        run_cli(["test", *others, *image, f"--ckpt_path={ckpt}"])


def test_an_unreachable_wandb_server_means_offline_logging_at_once(tiny_cli_args, tmp_path, monkeypatch, capsys):
    """A key is set but the server does not answer: no minutes of retries, no failure; the run logs offline."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    cli = run_cli(["fit", *tiny_cli_args, "--config", str(REPO / "configs/trainer/wandb.yaml")])
    assert os.environ["WANDB_MODE"] == "offline" and cli.trainer.loggers[1].experiment.settings.mode == "offline"
    assert "W&B server unreachable: logging offline" in capsys.readouterr().err
    assert "test/sentiment/acc" in cli.trainer.callback_metrics
    assert time.monotonic() - start < 90  # no minutes of retries


def test_bad_optimizer_settings_are_named(tiny_cli_args):
    with pytest.raises(
        ValueError, match=r"model.optimizer: lr=-0.001 \(must be > 0\), betas=\(0.9, 1.5\) \(each in \[0, 1\)\)"
    ):
        run_cli([*tiny_cli_args, "--model.optimizer.lr=-1e-3", "--model.optimizer.betas=[0.9, 1.5]"], run=False)


def test_the_output_holds_nothing_a_user_cannot_act_on(tiny_cli_args, caplog, recwarn):
    run_cli(["fit", *tiny_cli_args])
    assert not [r for r in caplog.records if "Tip" in r.getMessage()]  # Lightning's product tips
    assert not [w for w in recwarn if "LeafSpec" in str(w.message) or "does not have many workers" in str(w.message)]


def test_a_config_file_that_is_not_yaml_is_one_clear_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  tasks: [\n")
    with pytest.raises(SystemExit, match=r"bad.yaml, line 3, column 1: not valid YAML .* Fix the file's syntax"):
        run_cli(["fit", "--config", str(bad)])
    bad.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(SystemExit, match="is not UTF-8 text"):
        run_cli(["fit", "--config", str(bad)])


def test_an_interrupted_predict_leaves_the_previous_predictions_whole(tmp_path):
    from trunk.training.callbacks import PredictionWriter

    out = tmp_path / "p.jsonl"
    out.write_text('{"label": "old"}\n')
    writer = PredictionWriter(output=str(out))
    trainer = type("T", (), {"global_rank": 0, "world_size": 1, "log_dir": str(tmp_path), "datamodule": None})()
    writer.on_predict_start(trainer, None)
    writer.write_on_batch_end(trainer, None, [{"label": "new"}], None, {"task": "sst2"}, 0, 0)
    assert out.read_text() == '{"label": "old"}\n'  # nothing replaced mid-way
    writer.on_exception(trainer, None, KeyboardInterrupt())
    assert out.read_text() == '{"label": "old"}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]
    writer.on_predict_start(trainer, None)
    writer.write_on_batch_end(trainer, None, [{"label": "new"}], None, {"task": "sst2"}, 0, 0)
    writer.on_predict_end(trainer, None)
    assert out.read_text() == '{"label": "new"}\n'


def test_a_data_error_is_one_line_from_the_command(tmp_path):
    bad = tmp_path / "train.xml"
    bad.write_text("<rows/>")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trunk.cli",
            "fit",
            "--config",
            str(REPO / "configs/quickstart.yaml"),
            "--data.tasks.sentiment.dataset=null",
            f"--data.tasks.sentiment.train={bad}",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"error: data.tasks.sentiment.train: cannot read '{bad}': unknown file type '.xml'" in result.stderr


def test_a_fine_tuning_recipe_from_scratch_keeps_its_architecture_and_warns_about_layer_decay(ner_files, tmp_path):
    args = [
        "--config",
        str(REPO / "configs/conll2003.yaml"),
        "--model.init_from=null",
        f"--trainer.default_root_dir={tmp_path}",
        *(f"--data.tasks.conll.{split}={ner_files[split]}" for split in ("train", "validation", "test")),
        "--data.tokenizer_vocab_size=300",
    ]
    with pytest.warns(UserWarning, match="layer_decay=0.8 without model.init_from"):
        cli = run_cli(args, run=False)
    config = cli.model.trunk_config
    assert (config.positions, config.max_len, config.d_model, config.n_layers) == ("rope", 128, 256, 4)


def test_the_progress_bar_redraws_at_most_every_interval_and_at_the_last_batch(tiny_cli_args, monkeypatch):
    """Redrawing after every step cost 6-8% of a step: the CLI's bar (rich where installed, else tqdm) draws at most
    every 0.5 s."""
    from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

    from trunk.training.callbacks import ThrottledBar, TrunkProgressBar, TrunkTQDMProgressBar

    for rich in {_RICH_AVAILABLE, False}:
        monkeypatch.setattr("trunk.training.callbacks._RICH_AVAILABLE", rich)
        cli = run_cli([*tiny_cli_args, "--trainer.enable_progress_bar=true"], run=False)
        bars = [c for c in cli.trainer.callbacks if isinstance(c, ThrottledBar)]
        assert len(bars) == 1 and cli.trainer.progress_bar_callback is bars[0]
        assert isinstance(bars[0], TrunkProgressBar if rich else TrunkTQDMProgressBar)
    assert not any(isinstance(c, ThrottledBar) for c in run_cli(tiny_cli_args, run=False).trainer.callbacks)  # bar off
    own = run_cli(
        [
            *tiny_cli_args,
            "--trainer.enable_progress_bar=true",
            "--trainer.callbacks+=lightning.pytorch.callbacks.TQDMProgressBar",
        ],
        run=False,
    )  # a bar of the user's own is kept, alone
    assert type(own.trainer.progress_bar_callback).__name__ == "TQDMProgressBar"
    assert not any(isinstance(c, ThrottledBar) for c in own.trainer.callbacks)
    from trunk.training.callbacks import Throttle

    throttle, clock = Throttle(interval=0.5), [100.0]
    monkeypatch.setattr("trunk.training.callbacks.progress.time.monotonic", lambda: clock[0])
    drawn = []
    for step in range(10):  # 0.2 s per step, 10 steps in the epoch
        drawn.append(throttle.due(step, 10))
        clock[0] += 0.2
    assert drawn == [
        True,
        False,
        False,
        True,
        False,
        False,
        True,
        False,
        False,
        True,
    ]  # every 0.6 s, and the last batch


def test_the_progress_bar_shows_the_runs_version_as_a_number_not_a_metric():
    """Lightning's rich bar formats every number it shows with ".3f": the run's version read "v_num: 0.000"."""
    from types import SimpleNamespace

    from trunk.training.callbacks import TrunkProgressBar, TrunkTQDMProgressBar

    trainer = SimpleNamespace(loggers=[SimpleNamespace(version=3)], progress_bar_metrics={"train/loss": 0.8125})
    for bar in (TrunkProgressBar(), TrunkTQDMProgressBar()):
        assert bar.get_metrics(trainer, None) == {"v_num": "3", "train/loss": 0.8125}
    trainer.loggers = [SimpleNamespace(version="version_12")]  # a named version keeps Lightning's last 4 places
    assert TrunkProgressBar().get_metrics(trainer, None)["v_num"] == "n_12"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_through_torchrun_on_localhost(tiny_cli_args, tmp_path):
    """`torchrun --nnodes=2` started once per "machine" (here twice on localhost, one process each) and
    `trainer.num_nodes=2`: one DDP run over both, as on a cluster with a shared filesystem."""
    args = [a for a in tiny_cli_args if not a.startswith("--trainer.devices")]
    args += ["--trainer.num_nodes=2", "--trainer.devices=1", "--trainer.strategy=ddp", "--trainer.max_epochs=2"]
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={rank}",
                "--nproc-per-node=1",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "-m",
                "trunk.cli",
                "fit",
                *args,
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    assert "GLOBAL_RANK: 0" in outputs[0] and "GLOBAL_RANK: 1" in outputs[1]
    # 256 examples over 2 processes at batch 32: 4 steps an epoch, as with 2 processes on one machine
    checkpoints = list((tmp_path / "run").rglob("*.ckpt"))
    assert checkpoints and all(torch.load(p, weights_only=True)["global_step"] == 8 for p in checkpoints), checkpoints


def test_several_nodes_without_a_launcher_is_an_error_not_a_hang(tiny_cli_args, monkeypatch):
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "LSB_JOBID", "MASTER_ADDR", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"num_nodes=2 but no multi-machine launcher.*torchrun --nnodes=2"):
        run_cli([*tiny_cli_args, "--trainer.num_nodes=2"], run=False)


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2"])
def test_a_gpu_only_strategy_on_cpu_names_the_cpu_alternative(strategy, tiny_cli_args):
    with pytest.raises(ValueError, match=f"strategy={strategy} runs on GPUs only.*configs/trainer/ddp_cpu.yaml"):
        run_cli([*tiny_cli_args, f"--trainer.strategy={strategy}"], run=False)


def test_help_lists_every_subcommand_with_a_one_line_summary():
    from trunk.cli import SUBCOMMANDS

    done = subprocess.run([sys.executable, "-m", "trunk.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # the help text is reflowed
    for name, summary in SUBCOMMANDS.items():
        assert f"{name} {summary}" in text, name
    assert {"fit", "validate", "test", "predict", "export", "import", "serve"} <= set(SUBCOMMANDS)
    done = subprocess.run([sys.executable, "-m", "trunk.cli", "fit", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: trunk fit --config RECIPE.yaml [options]")
    head = done.stdout[:2000]  # it leads with the options people change, before the Trainer's hundreds
    assert "The options people change most" in head and "--model.init_from PATH" in head, head


def test_the_plain_commands_read_their_options_before_loading_lightning():
    """A mistyped option is said at once: `trunk serve ... --port=80` took 10 s (the ONNX runtime's imports reached
    Lightning), `trunk export`/`trunk import` 11 s (reading a trunk directory imported every task kind), where
    argparse needs a fraction of one."""
    code = ("import sys, trunk.cli.serve, trunk.cli.tune, trunk.cli.export, trunk.cli.import_model; "
            "print(sorted({'lightning', 'trunk.tasks', 'torchmetrics'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_ctrl_c_a_library_swallowed_while_a_command_loaded_stops_it_before_it_writes(tiny_cli_args, tmp_path):
    """torch's C extension clears a KeyboardInterrupt raised as it imports numpy: `trunk export` went on and wrote its
    directory; the Ctrl+C is honoured once the command's module has loaded (exit 130, one line, nothing written)."""
    fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=1"])
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    done = subprocess.run([sys.executable, str(REPO / "tests/ctrl_c_in_torch_import.py"), "export", ckpt,
                           str(tmp_path / "exported")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 130 and done.stderr.strip() == "Interrupted.", done.stdout + done.stderr[-3000:]
    assert not (tmp_path / "exported").exists()


def test_a_ctrl_c_inside_a_callback_python_cannot_raise_from_is_remembered_without_a_traceback():
    """A Ctrl+C that lands in a callback run inside an import (or a finalizer) cannot be raised there: Python printed it
    as an "Exception ignored ... KeyboardInterrupt" traceback (seen from `trunk serve` as it loaded). It is remembered
    and said once; another error in such a callback is still printed."""
    code = ("import signal, weakref\n"
            "from trunk.core.interrupts import catch_interrupts, interrupted\n"
            "catch_interrupts()\n"
            "class Loaded: pass\n"
            "class Broken:\n"
            "    def __del__(self): raise ValueError('a finalizer of ours failed')\n"
            "loaded = Loaded()\n"
            "watch = weakref.ref(loaded, lambda _: signal.raise_signal(signal.SIGINT))\n"
            "del loaded\n"
            "Broken()\n"
            "print('interrupted:', interrupted())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "interrupted: True", done.stdout + done.stderr
    assert "KeyboardInterrupt" not in done.stderr, done.stderr
    assert "ValueError: a finalizer of ours failed" in done.stderr, done.stderr


def test_a_command_builds_only_its_own_subcommands_parser(tiny_cli_args):
    """Lightning builds every subcommand's whole parser (0.3 s each); `trunk fit ...` builds fit's alone, the others
    bare (a Lightning that renamed the hook would be slower again, not wrong: this says so)."""
    cli = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=1"])
    parsers = cli.parser._subcommands_action._name_parser_map
    assert "--trainer.max_steps" in parsers["fit"]._option_string_actions
    assert not any("--trainer.max_steps" in parsers[name]._option_string_actions
                   for name in ("validate", "test", "predict"))
    assert cli.trainer.global_step == 1


def test_every_logged_run_records_learning_rates_throughput_and_optionally_norms(tiny_cli_args, tmp_path):
    """The CSV logger gets the learning rate of every optimizer group, samples/s and tokens/s, MFU when a peak is
    given (the FLOPs per token it implies are the trunk's, between the shortest and the longest batch's), and,
    with the Norms callback, gradient and weight norms of the model and its parts."""
    import csv

    args = [a for a in tiny_cli_args if not a.startswith("--trainer.default_root_dir")]
    cli = run_cli(["fit", *args, f"--trainer.default_root_dir={tmp_path}", "--trainer.log_every_n_steps=2",
                   "--trainer.callbacks+=trunk.training.callbacks.Throughput", "--trainer.callbacks.peak_flops=1e12",
                   "--trainer.callbacks+=trunk.training.callbacks.Norms", "--trainer.callbacks.every_n_steps=2"])
    with open(next(tmp_path.rglob("metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    series = lambda key: [float(r[key]) for r in rows if r.get(key)]  # noqa: E731
    groups = [g["name"] for g in cli.trainer.optimizers[0].param_groups]
    for name in groups:
        assert series(f"lr-AdamW/{name}"), (name, [k for k in rows[0] if "lr" in k])
    tokens, mfu = series("perf/tokens_per_sec"), series("perf/mfu")
    assert tokens and len(mfu) == len(tokens) and all(t > 0 for t in tokens)
    model = cli.model
    per_token = [m * 1e12 / t for m, t in zip(mfu, tokens)]
    assert all(model.trunk.flops_per_token(1) <= f <= model.trunk.flops_per_token(64) for f in per_token)
    for part in ("all", "stems", "block0", "block1", "head_sentiment"):
        assert series(f"norms/{part}/grad") and series(f"norms/{part}/weight"), part
    assert all(a >= b for a, b in zip(series("norms/all/grad"), series("norms/block0/grad")))


def test_validation_samples_are_written_as_json_lines_without_wandb(tiny_cli_args, tmp_path):
    """The same rows every epoch, capped (with one warning) at the validation split's size."""
    with pytest.warns(UserWarning, match="has 64 validation examples .* fewer than rows=100") as caught:
        cli = run_cli(
            [
                "fit",
                *tiny_cli_args,
                "--trainer.max_epochs=2",
                "--trainer.callbacks+=trunk.training.callbacks.PredictionSamples",
                "--trainer.callbacks.rows=100",
            ]
        )
    assert sum("fewer than rows" in str(w.message) for w in caught) == 1
    lines = [
        json.loads(line)
        for line in (Path(cli.trainer.log_dir) / "samples" / "sentiment.jsonl").read_text().splitlines()
    ]
    assert len(lines) == 2 * 64 and set(lines[0]) == {"epoch", "step", "id", "text", "gold", "predicted", "probability"}
    epochs = [[r["id"] for r in lines if r["epoch"] == e] for e in (0, 1)]
    assert epochs[0] == epochs[1] == list(range(64))
    assert all(r["gold"] in ("negative", "positive") and 0.5 <= r["probability"] <= 1 for r in lines)
    confusion = [
        json.loads(line)
        for line in (Path(cli.trainer.log_dir) / "samples" / "sentiment.confusion.jsonl").read_text().splitlines()
    ]
    assert [c["epoch"] for c in confusion] == [0, 1] and confusion[0]["labels"] == ["negative", "positive"]
    matrix = confusion[1]["rows_gold_columns_predicted"]
    assert sum(map(sum, matrix)) == 64  # the whole validation split
    correct = sum(matrix[i][i] for i in range(2)) / 64
    import csv

    logged = [
        float(r["val/sentiment/acc"])
        for r in csv.DictReader((Path(cli.trainer.log_dir) / "metrics.csv").read_text().splitlines())
        if r.get("val/sentiment/acc")
    ]
    assert correct == pytest.approx(logged[-1], abs=1e-6)  # the matrix of the same predictions as the logged accuracy
