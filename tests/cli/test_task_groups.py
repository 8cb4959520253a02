"""A joint recipe's tasks alone (``--tasks``) and MT-DNN's joint stage followed by each task's own fine-tuning
(``--finetune_each``), as one command each."""

import pytest
import torch
import yaml

from trunk.cli import run_cli

TINY = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "max_len": 64}


@pytest.fixture
def group_config(sentiment_files, ner_files, tmp_path):
    """A joint recipe of a classification task (``mood``) and an NER task (``names``), with test splits."""
    config = {
        "seed_everything": 0,
        "model": {
            "trunk": TINY,
            "tasks": {"mood": {"class_path": "trunk.tasks.SequenceClassification"},
                      "names": {"class_path": "trunk.tasks.TokenClassification"}},
            "peft": {"names": {"method": "lora", "r": 2}},
        },
        "data": {
            "tokenizer_vocab_size": 300,
            "sampling": "fixed",
            "weights": {"mood": 1.0, "names": 2.0},
            "tasks": {
                "mood": {"class_path": "trunk.datamodules.TextClassificationData", "init_args": {
                    **{split: str(sentiment_files[split]) for split in ("train", "validation", "test")},
                    "max_length": 64, "batch_size": 32}},
                "names": {"class_path": "trunk.datamodules.TokenClassificationData", "init_args": {
                    **{split: str(ner_files[split]) for split in ("train", "validation", "test")},
                    "max_length": 64, "batch_size": 32}},
            },
        },
        "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 6, "enable_progress_bar": False,
                    "enable_model_summary": False, "logger": False},
    }
    path = tmp_path / "group.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_joint_recipes_task_runs_alone_in_a_folder_of_its_own(group_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = run_cli(["fit", "--config", str(group_config), "--tasks=[mood]"])
    assert list(cli.model.objectives) == ["mood"] and list(cli.datamodule.tasks) == ["mood"]
    assert not cli.model.router.deltas  # the other task's LoRA went with it
    assert cli.config.fit.trainer.default_root_dir == "runs/group_mood"  # not the joint run's runs/group
    assert "test/mood/acc" in cli.trainer.callback_metrics
    with pytest.raises(SystemExit, match=r"--tasks names \['moody'\], but this configuration's tasks are "
                                         r"\['mood', 'names'\]"):
        run_cli(["fit", "--config", str(group_config), "--tasks=[moody]"])


def test_finetune_each_trains_jointly_then_each_task_from_the_joint_best(group_config, tmp_path):
    root = tmp_path / "mtdnn"
    cli = run_cli(["fit", "--config", str(group_config), "--finetune_each=1", f"--trainer.default_root_dir={root}"])
    joint = cli.trainer.checkpoint_callback.best_model_path or cli.trainer.checkpoint_callback.last_model_path
    assert set(cli.finetune_stages) == {"mood", "names"}
    assert all(isinstance(stage["test_score"], float) and stage["steps"] > 0 for stage in cli.finetune_stages.values())
    for task in ("mood", "names"):
        stage = yaml.safe_load(next((root / task).rglob("config.yaml")).read_text())
        assert list(stage["model"]["tasks"]) == [task] and stage["model"]["init_from"] == joint
        assert stage["trainer"]["max_epochs"] == 1 and stage["finetune_each"] == 0
        ckpt = torch.load(next((root / task).rglob("*.ckpt")), map_location="cpu", weights_only=False)
        assert {k.split(".")[1] for k in ckpt["state_dict"] if k.startswith("objectives.")} == {task}

    for args, problem in (
        (["--tasks=[mood]"], "it fine-tunes the tasks of a joint run, and this run has 1"),
        (["--finetune_each=-1"], "it is not a whole number of epochs > 0"),
        (["--trainer.devices=2"], "its stages run in this one process"),
    ):
        with pytest.raises(SystemExit, match=problem):
            run_cli(["fit", "--config", str(group_config), "--finetune_each=1", *args,
                     f"--trainer.default_root_dir={tmp_path / 'refused'}"])


def test_a_joint_run_stopped_in_a_stage_resumes_from_its_own_last_checkpoint(group_config, tmp_path, capsys,
                                                                               monkeypatch):
    """A --finetune_each run's stages write newer last.ckpt files in <root>/<task>; --ckpt_path last (and a requeued
    SLURM job) takes the joint run's own, so the joint run resumes with both tasks, not a stage's one-task model."""
    root = tmp_path / "mtdnn"
    keep_last = ('--trainer.callbacks+={"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", '
                 '"init_args": {"save_last": true}}')
    args = ["--config", str(group_config), keep_last, f"--trainer.default_root_dir={root}"]
    run_cli(["fit", *args, "--finetune_each=1"])
    joint = root / "checkpoints" / "last.ckpt"
    stages = [root / task / "checkpoints" / "last.ckpt" for task in ("mood", "names")]
    assert all(stage.stat().st_mtime >= joint.stat().st_mtime for stage in stages)
    capsys.readouterr()
    tested = run_cli(["test", *args, "--ckpt_path=last"])
    assert f"Checkpoint: {joint}" in capsys.readouterr().err
    assert {"test/mood/acc", "test/names/f1"} <= set(tested.trainer.callback_metrics)
    resumed = run_cli(["fit", *args, "--ckpt_path=last", "--trainer.max_steps=8"])
    assert f"Resuming from {joint}" in capsys.readouterr().err
    assert resumed.trainer.global_step == 8 and set(resumed.model.objectives) == {"mood", "names"}
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the requeued job runs its command unchanged
    requeued = run_cli(["fit", *args, "--trainer.max_steps=10"])
    assert f"Resuming from {joint}" in capsys.readouterr().err and requeued.trainer.global_step == 10


@pytest.mark.parametrize("block, option, value, where", [
    ("data", "tokenizer", "other/tokenizer.json", "data.tokenizer"),
    ("data", "temperature", 3.0, "data.temperature"),
    ("model", "init_from", "other/trunk", "model.init_from"),
])
def test_a_run_option_in_a_tasks_block_says_where_it_belongs(group_config, block, option, value, where, capsys):
    """A group whose tasks would need their own tokenizer or pretrained model cannot be one run: the task block's
    option is refused, saying it is the run's (and how to combine separate runs)."""
    config = yaml.safe_load(group_config.read_text())
    config[block]["tasks"]["names"].setdefault("init_args", {})[option] = value
    with open(group_config, "w") as f:
        yaml.safe_dump(config, f)
    with pytest.raises(SystemExit):
        run_cli(["fit", "--config", str(group_config)])
    err = capsys.readouterr().err
    assert f"Option '{option}' is not accepted" in err
    assert f"{option} is set once per run, for all its tasks: {where}" in err and "--merge" in err
