"""The Hugging Face Hub path, offline: the model card every export writes, hf:// references (a cached copy is used like
a directory; without the network, an error that says how to download it elsewhere), and an upload refused offline."""

import pytest

from trunk.cli import export_main, run_cli
from trunk.tasks import load


@pytest.fixture
def exported(tiny_cli_args, tmp_path):
    cli = run_cli(
        [
            "fit",
            *tiny_cli_args,
            "--trainer.max_epochs=1",
            "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
            "--trainer.callbacks.monitor=val/score",
            "--trainer.callbacks.mode=max",
        ]
    )
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    export_main([ckpt, str(tmp_path / "exported")])
    return tmp_path / "exported", ckpt, cli


def test_the_model_card_says_what_the_model_is_and_how_to_load_it(exported):
    directory, _, cli = exported
    card = (directory / "README.md").read_text()
    trunk = cli.model.trunk.cfg
    assert f"| `d_model` | {trunk.d_model} |" in card and f"| `n_layers` | {trunk.n_layers} |" in card
    # the file the run trained on
    assert ("| `sentiment` | sequence_classification | negative, positive | `train.csv` |" in card)
    best = float(cli.trainer.checkpoint_callback.best_model_score)
    assert f"| `best val/score` | {best:.4f} |" in card and "| `global_step` |" in card
    assert f"--model.init_from={directory}" in card and f"model = load({str(directory)!r})" in card


def test_an_hf_reference_is_used_like_a_directory_once_downloaded(exported, monkeypatch, tiny_cli_args, tmp_path):
    import huggingface_hub

    directory, _, _ = exported
    asked = []
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda repo, revision=None, allow_patterns=None: asked.append((repo, revision)) or str(directory),
    )
    model = load("hf://my-org/sentiment@v1")
    assert asked == [("my-org/sentiment", "v1")] and model.tasks == ["sentiment"]
    reused = run_cli(
        [*tiny_cli_args, "--model.init_from=hf://my-org/sentiment", f"--trainer.default_root_dir={tmp_path / 'reuse'}"],
        run=False,
    )
    assert any("weights from model.init_from" in line and str(directory) in line for line in reused.run.report)
    # the downloaded copy is checked as any trunk directory is
    (directory / "model.safetensors").write_bytes(b"damaged")
    with pytest.raises(ValueError, match="does not match the checksum"):
        load("hf://my-org/sentiment")


def test_without_the_network_an_hf_reference_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ValueError,
        match=r"not in the local cache\. Download it where the Hub is reachable \(`hf download my-org/base "
        r"--revision v2 --local-dir DIR`\) and pass that directory as model.init_from",
    ):
        load("hf://my-org/base@v2")
    with pytest.raises(ValueError, match=r"a Hub reference is hf://<org>/<name>\[@<revision>\]"):
        load("hf://no-org")


def test_pushing_offline_is_refused_and_keeps_the_export(exported, monkeypatch, tmp_path):
    _, ckpt, _ = exported
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        SystemExit, match=r"HF_HUB_OFFLINE is set.*upload it where the Hub is reachable: `hf upload my-org/m "
    ):
        export_main([ckpt, str(tmp_path / "for_hub"), "--push-to-hub", "my-org/m"])
    card = (tmp_path / "for_hub" / "README.md").read_text()
    assert "--model.init_from=hf://my-org/m" in card and "load('hf://my-org/m')" in card
