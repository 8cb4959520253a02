"""Files written before the house was split by job (tests/fixtures/make_legacy.py, commit 88facbf) load with
today's code and answer as they did then: a checkpoint, a trunk directory with its heads, a trunk with a task
directory. Their stored class paths (``trunk.tasks.<Objective>``, ``trunk.datamodules.<Data>``) still resolve."""

import json

import pytest
from conftest import REPO
from test_task_files import assert_same_records

LEGACY = REPO / "tests" / "fixtures" / "legacy_v0_1"
EXPECTED = json.loads((LEGACY / "records.json").read_text())


@pytest.mark.parametrize("source", [["joint.ckpt"], ["trunk"]], ids=["checkpoint", "trunk directory"])
def test_a_legacy_checkpoint_and_trunk_directory_answer_as_they_did(source):
    from trunk.tasks import load

    model = load([LEGACY / s for s in source] if len(source) > 1 else LEGACY / source[0], precision="32-true")
    assert sorted(model.tasks) == ["ner", "sentiment"]
    assert_same_records(model.predict(EXPECTED["texts"], task="sentiment"), EXPECTED["records"]["sentiment"])
    assert_same_records(model.predict(EXPECTED["sentences"], task="ner"), EXPECTED["records"]["ner"])


def test_a_legacy_task_directory_on_its_trunk_answers_as_it_did():
    from trunk.tasks import load

    model = load([LEGACY / "trunk_only", LEGACY / "task_ner"], precision="32-true")
    assert_same_records(model.predict(EXPECTED["sentences"], task="ner"), EXPECTED["records"]["ner"])


def test_class_paths_that_configs_stored_before_the_split_still_resolve(tiny_cli_args):
    """``trunk.tasks.callbacks.*`` in a config, and ``trunk.tasks.load`` / ``TrunkModule`` in code, as the README named
    them."""
    import trunk.tasks
    from trunk.cli import run_cli
    from trunk.training.callbacks import Throughput
    from trunk.training.module import TrunkModule

    cli = run_cli([*tiny_cli_args, "--trainer.callbacks=trunk.tasks.callbacks.Throughput"], run=False)
    assert any(isinstance(c, Throughput) for c in cli.trainer.callbacks)
    assert trunk.tasks.TrunkModule is TrunkModule and callable(trunk.tasks.load)


@pytest.mark.parametrize("source", [["joint.ckpt"], ["trunk"], ["trunk_only", "task_ner"]],
                         ids=["checkpoint", "trunk directory", "trunk and task directory"])
def test_load_builds_no_training_datamodule(source, monkeypatch):
    """``load`` goes source -> model -> predictor (with its runtime), each task's data settings handing it a
    preprocessor: a MultiTaskData built on the way would fail here."""
    from trunk.datamodules import MultiTaskData
    from trunk.tasks import load

    def refuse(*args, **kwargs):
        raise AssertionError("load() built a training datamodule")

    monkeypatch.setattr(MultiTaskData, "__init__", refuse)
    model = load([LEGACY / s for s in source] if len(source) > 1 else LEGACY / source[0], precision="32-true")
    if "sentiment" in model.tasks:
        assert_same_records(model.predict(EXPECTED["texts"], task="sentiment"), EXPECTED["records"]["sentiment"])
    assert_same_records(model.predict(EXPECTED["sentences"], task="ner"), EXPECTED["records"]["ner"])


@pytest.mark.parametrize("where", ["objective", "data"])
def test_a_stored_class_path_that_is_not_trunks_kind_is_refused_before_it_is_called(where, tmp_path):
    """A checkpoint naming ``subprocess.Popen`` as an objective or data class: refused by type, and nothing runs."""
    import torch

    from trunk.tasks import load

    ckpt = torch.load(LEGACY / "joint.ckpt", weights_only=True)
    hostile = {"class_path": "subprocess.Popen", "init_args": {"args": ["touch", str(tmp_path / "ran")]}}
    if where == "objective":
        ckpt["hyper_parameters"]["tasks"]["sentiment"] = hostile
    else:
        ckpt["datamodule_hyper_parameters"]["data_tasks"]["sentiment"] = hostile
    torch.save(ckpt, tmp_path / "hostile.ckpt")
    with pytest.raises(ValueError, match="'subprocess.Popen' is not a .* class"):
        load(tmp_path / "hostile.ckpt")
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("where", ["objective", "data"])
def test_a_stored_class_path_imports_no_module(where, tmp_path, monkeypatch):
    """A checkpoint naming a class in a module nobody imported: the module's top level (here: it writes a file) never
    runs, whatever the class would be; the error says how to load a class of one's own."""
    import sys

    import torch

    from trunk.tasks import load

    (tmp_path / "planted.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\nclass Objective: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ckpt = torch.load(LEGACY / "joint.ckpt", weights_only=True)
    planted = {"class_path": "planted.Objective", "init_args": {}}
    if where == "objective":
        ckpt["hyper_parameters"]["tasks"]["sentiment"] = planted
    else:
        ckpt["datamodule_hyper_parameters"]["data_tasks"]["sentiment"] = planted
    torch.save(ckpt, tmp_path / "planted.ckpt")
    with pytest.raises(ValueError, match=r"'planted.Objective' is not a .* class Trunk knows: .* import its module "
                                         r"before loading, or name it in your config"):
        load(tmp_path / "planted.ckpt")
    assert "planted" not in sys.modules and not (tmp_path / "ran").exists()
