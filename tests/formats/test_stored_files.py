"""What a stored file says that changes results is covered by its digest: one changed byte in a label name of a
checkpoint, a trunk directory or a task directory is refused like one changed byte in a tensor (docs/reliability.md,
the threat model)."""

from __future__ import annotations

import json

import pytest
import torch

from trunk.cli import export_main, run_cli
from trunk.tasks import load


def label_names(ckpt: dict) -> list[str]:
    """The stored label names of the task 'sentiment' (where Trunk keeps them in a checkpoint)."""
    return ckpt["hyper_parameters"]["task_info"]["sentiment"]["label_names"]


@pytest.fixture
def checkpoint(tiny_cli_args):
    return run_cli(["fit", *tiny_cli_args]).trainer.checkpoint_callback.best_model_path


def test_a_checkpoint_whose_label_name_was_edited_is_refused(checkpoint, tiny_cli_args, tmp_path):
    ckpt = torch.load(checkpoint, weights_only=True)
    names = label_names(ckpt)
    names[0] = names[0][:-1] + chr(ord(names[0][-1]) ^ 1)  # one bit of one character
    torch.save(ckpt, tmp_path / "edited.ckpt")
    message = r"edited.ckpt' changed after it was written: its stored settings \(label names, data options"
    with pytest.raises(ValueError, match=message):
        load(tmp_path / "edited.ckpt")
    with pytest.raises(SystemExit, match=message):  # resuming, testing and predicting read it the same way
        run_cli(["test", *tiny_cli_args, f"--ckpt_path={tmp_path / 'edited.ckpt'}"])
    ckpt = torch.load(checkpoint, weights_only=True)
    ckpt["hyper_parameters"]["trunk"]["d_ff"] += 0  # rewritten unchanged: nothing to refuse
    torch.save(ckpt, tmp_path / "same.ckpt")
    assert load(tmp_path / "same.ckpt").tasks == load(checkpoint).tasks


@pytest.mark.parametrize("kind", ["trunk", "task"])
def test_a_directory_whose_config_was_edited_is_refused(kind, checkpoint, tmp_path):
    """A trunk directory (its heads' label names) and a task directory (its head's): config.json's settings carry
    a digest in the weights' header; the files' checksums alone would not see an edit of config.json."""
    trunk_dir = tmp_path / "trunk"
    export_main([checkpoint, str(trunk_dir), *(["--trunk-only"] if kind == "task" else [])])
    export_main([checkpoint, str(tmp_path / "task"), "--task", "sentiment"])
    sources = {"trunk": [trunk_dir], "task": [trunk_dir, tmp_path / "task"]}[kind]
    edited = tmp_path / kind
    before = load(sources).predict(["a good film"], task="sentiment")
    meta = json.loads((edited / "config.json").read_text())
    head = meta["heads"]["sentiment"] if kind == "trunk" else meta["head"]
    head["label_names"] = [name.upper() for name in head["label_names"]]
    (edited / "config.json").write_text(json.dumps(meta, indent=2))
    with pytest.raises(ValueError, match=r"config.json' changed after it was written: its settings \(label names, "
                                         r"data options, architecture\) do not match the digest stored with the "
                                         r"weights in model.safetensors"):
        load(sources)
    meta = json.loads((edited / "config.json").read_text())
    head = meta["heads"]["sentiment"] if kind == "trunk" else meta["head"]
    head["label_names"] = [name.lower() for name in head["label_names"]]
    (edited / "config.json").write_text(json.dumps(meta))  # restored (another layout): read as before
    assert load(sources).predict(["a good film"], task="sentiment") == before
