"""Strategies that split the work across processes: 1 process vs DDP-2 vs FSDP2-2 on CPU (gloo).

Runs are real multi-process runs (tests/parallel_run.py, started as a script: Lightning's launcher
starts the other process from it), fp32, dropout off, the same global batches.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, logged_metrics

RUN = REPO / "tests" / "parallel_run.py"


def train(mode: str, steps: int, out: Path, *extra: str) -> dict[str, torch.Tensor]:
    done = subprocess.run(
        [sys.executable, str(RUN), mode, str(steps), str(out), *extra],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=True)


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_one_process_ddp_and_fsdp2_train_the_same_weights(tmp_path):
    """20 steps of the same global batches (padded rows included): DDP averages the halves' gradients,
    FSDP2 reduce-scatters them; both end where one process does, to float rounding (tolerance 1e-5)."""
    one = train("one", 20, tmp_path / "one.pt")
    ddp = train("ddp", 20, tmp_path / "ddp.pt")
    fsdp2 = train("fsdp2", 20, tmp_path / "fsdp2.pt")
    start = train("one", 0, tmp_path / "start.pt")
    assert max_difference(one, start) > 1e-3  # it trained
    assert max_difference(one, ddp) < 1e-5
    assert max_difference(one, fsdp2) < 1e-5


def test_fsdp2_with_activation_checkpointing_layer_decay_lamb_and_local_attention_trains_like_one_process(tmp_path):
    """LAMB's trust ratios need each weight tensor's whole norm: under FSDP2 a process holds half of it. Local attention
    (12-token rows, a 3-token window) runs on padded rows, recomputed in backward."""
    options = ["--checkpointing-and-layer-decay", "--lamb", "--local"]
    one = train("one", 20, tmp_path / "one.pt", *options)
    fsdp2 = train("fsdp2", 20, tmp_path / "fsdp2.pt", *options)
    assert max_difference(one, fsdp2) < 1e-5


def test_fsdp2_saved_and_resumed_continues_the_same_run(tmp_path):
    straight = train("fsdp2", 20, tmp_path / "straight.pt")
    train("fsdp2", 20, tmp_path / "half.pt", "--stop-at", "10", "--save", str(tmp_path / "half.ckpt"))
    assert torch.load(tmp_path / "half.ckpt", weights_only=True)["global_step"] == 10  # one consolidated file
    resumed = train("fsdp2", 20, tmp_path / "resumed.pt", "--resume", str(tmp_path / "half.ckpt"))
    assert max_difference(straight, resumed) == 0.0


def test_tensor_parallel_alone_and_under_fsdp2_trains_and_checkpoints_like_one_process(tmp_path):
    """Tensor parallelism over 2 processes (every block's heads and feed-forward units split) for 10 steps, saved,
    then resumed on a 2-D mesh (FSDP2 over 2 tensor-parallel pairs: 4 processes) for 10 more: the weights of one
    process's 20 steps. The same checkpoint resumed in one process also ends there: it holds the one-process
    layout (the fused key/value rows in their order)."""
    one = train("one", 20, tmp_path / "one.pt")
    train("tp", 20, tmp_path / "tp.pt", "--stop-at", "10", "--save", str(tmp_path / "tp10.ckpt"))
    # 10 of 20 steps: not there yet
    assert (max_difference(one, torch.load(tmp_path / "tp.pt", weights_only=True)) > 1e-4)
    assert (
        max_difference(one, train("tp_fsdp2", 20, tmp_path / "2d.pt", "--resume", str(tmp_path / "tp10.ckpt"))) < 1e-5
    )
    assert (
        max_difference(one, train("one", 20, tmp_path / "resumed.pt", "--resume", str(tmp_path / "tp10.ckpt"))) < 1e-5
    )


@pytest.mark.parametrize("positions", ["alibi", "t5"])
def test_tensor_parallel_gives_each_process_its_heads_position_bias(positions, tmp_path):
    """ALiBi's slopes and T5's learned table are per head: each tensor-parallel process reads its own heads' (the T5
    table's gradient summed across them), and 2 processes train the weights of one, local attention included."""
    options = ["--positions", positions, "--local"]
    one = train("one", 12, tmp_path / "one.pt", *options)
    assert max_difference(one, train("tp", 12, tmp_path / "tp.pt", *options)) < 1e-5
    if positions == "t5":
        start = train("one", 0, tmp_path / "start.pt", *options)
        table = next(k for k in one if k.endswith("position_bias.embedding.weight"))
        assert (one[table] - start[table]).abs().max() > 1e-4  # the table trained


def test_tensor_parallelism_refuses_what_it_cannot_split(monkeypatch):
    from trunk.tasks import SequenceClassification, TrunkModule
    from trunk.training.sharding import tensor_parallel

    class Mesh:
        def size(self):
            return 2

    def model(**trunk):
        return TrunkModule(
            {"s": SequenceClassification()},
            trunk={"vocab_size": 50, "d_model": 24, "n_heads": 2, "d_ff": 48, **trunk},
            task_info={"s": {"label_names": ["a", "b"]}},
        )

    with pytest.raises(ValueError, match=r"n_heads=3 and d_ff=48 must be multiples of 2"):
        tensor_parallel(model(n_heads=3), Mesh())
    with pytest.raises(ValueError, match=r"does not split DeBERTa's disentangled attention .* DDP or FSDP2"):
        tensor_parallel(model(n_heads=2, positions="disentangled"), Mesh())


@pytest.mark.slow
def test_fsdp2_preset_trains_checkpoints_and_exports_through_the_cli(tiny_cli_args, tmp_path):
    """`trunk fit` with configs/trainer/fsdp2_cpu.yaml: sharded training, an atomic consolidated checkpoint
    that `trunk test` evaluates and `trunk export` turns into a trunk directory."""
    args = [a for a in tiny_cli_args if not a.startswith("--trainer.devices")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    fit = subprocess.run(
        [
            sys.executable,
            "-m",
            "trunk.cli",
            "fit",
            *args,
            "--config",
            str(REPO / "configs/trainer/fsdp2_cpu.yaml"),
            "--trainer.max_epochs=2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "Test metrics:" in fit.stdout and "test/sentiment/acc" in logged_metrics(tmp_path / "run")
    checkpoints = sorted((tmp_path / "run").rglob("*.ckpt"))
    assert checkpoints and all(torch.load(p, weights_only=True)["global_step"] == 8 for p in checkpoints), checkpoints
    export = subprocess.run([sys.executable, "-m", "trunk.cli", "export", str(checkpoints[0]), str(tmp_path / "trunk")],
                            capture_output=True, text=True, timeout=300, env=env)
    assert export.returncode == 0, export.stderr[-3000:]
    assert (tmp_path / "trunk" / "config.json").is_file()


@pytest.mark.slow
def test_fsdp2_pretraining_in_bf16_exports_a_trunk_equal_to_its_checkpoint(tmp_path):
    """Masked-LM under FSDP2 in bf16-mixed (the decoder tied to the token embeddings: one parameter across
    the sharded model). The trunk directory ExportTrunk writes at the end (gathered from the shards)
    holds the weights of the last checkpoint (consolidated by the first process), which `trunk export`
    writes unchanged."""
    from safetensors.torch import load_file
    from test_pretraining import pretrain_args, sentences

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences(600)) + "\n")
    args = [
        a
        for a in pretrain_args(corpus, tmp_path / "run")
        if not a.startswith(("--trainer.devices", "--trainer.val_check"))
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    fit = subprocess.run(
        [
            sys.executable,
            "-m",
            "trunk.cli",
            *args,
            "--config",
            str(REPO / "configs/trainer/fsdp2_cpu.yaml"),
            "--trainer.precision=bf16-mixed",
            "--trainer.val_check_interval=3",
            "--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint",
            "--trainer.callbacks.save_last=true",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    exported = load_file(str(tmp_path / "run" / "trunk" / "model.safetensors"))
    last = next((tmp_path / "run").rglob("last.ckpt"))
    assert torch.load(last, weights_only=True)["global_step"] == 6
    again = subprocess.run([sys.executable, "-m", "trunk.cli", "export", str(last), str(tmp_path / "from_ckpt")],
                           capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    from_checkpoint = load_file(str(tmp_path / "from_ckpt" / "model.safetensors"))
    assert exported.keys() == from_checkpoint.keys() and any(k.startswith("heads.mlm.") for k in exported)
    for key in exported:
        assert torch.equal(exported[key], from_checkpoint[key]), key


@pytest.mark.slow
def test_a_sharded_checkpoint_exports_and_starts_runs_like_a_consolidated_one(tiny_cli_args, tmp_path):
    """FSDP2 with Lightning's default distributed checkpoints (a directory of shards): `trunk export` and
    `init_from` gather it, giving the trunk directory a consolidated checkpoint of the same run gives."""
    from safetensors.torch import load_file

    args = [
        a
        for a in tiny_cli_args
        if not a.startswith(
            (
                "--trainer.devices",
                "--trainer.default_root_dir",
                "--data.tasks.sentiment.test",
                "--data.tasks.sentiment.predict",
            )
        )
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    fsdp2 = [
        "--config",
        str(REPO / "configs/trainer/fsdp2_cpu.yaml"),
        "--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.save_last=true",
    ]
    exports = {}
    for sharded in (False, True):
        root = tmp_path / ("sharded" if sharded else "consolidated")
        fit = subprocess.run(
            [
                sys.executable,
                "-m",
                "trunk.cli",
                "fit",
                *args,
                *fsdp2,
                f"--trainer.default_root_dir={root}",
                f"--trainer.strategy.init_args.save_distributed_checkpoint={str(sharded).lower()}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert fit.returncode == 0, fit.stderr[-3000:]
        last = next(root.rglob("last.ckpt"))
        assert last.is_dir() == sharded
        out = tmp_path / f"trunk_{root.name}"
        export = subprocess.run([sys.executable, "-m", "trunk.cli", "export", str(last), str(out)], capture_output=True,
                                text=True, timeout=300, env=env)
        assert export.returncode == 0, export.stderr[-3000:]
        exports[sharded] = load_file(str(out / "model.safetensors"))
    assert exports[True].keys() == exports[False].keys()
    for key in exports[False]:
        torch.testing.assert_close(exports[True][key], exports[False][key], msg=key)
    # a run can start from the sharded checkpoint directly (model.init_from), its tokenizer included
    sharded_last = next((tmp_path / "sharded").rglob("last.ckpt"))
    start = subprocess.run([sys.executable, "-m", "trunk.cli", "fit", *args, f"--model.init_from={sharded_last}",
                            "--trainer.max_steps=1", f"--trainer.default_root_dir={tmp_path / 'from_sharded'}"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert start.returncode == 0, start.stderr[-3000:]
    # and be evaluated from it in one process (`trunk test --ckpt_path DIR`); a plain directory is refused
    test_split = next(a for a in tiny_cli_args if a.startswith("--data.tasks.sentiment.test="))
    test = subprocess.run(
        [
            sys.executable,
            "-m",
            "trunk.cli",
            "test",
            *args,
            test_split,
            f"--ckpt_path={sharded_last}",
            f"--trainer.default_root_dir={tmp_path / 'test'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert test.returncode == 0, test.stderr[-3000:]
    assert "Test metrics:" in test.stdout and "test/sentiment/acc" in logged_metrics(tmp_path / "test")
    plain = subprocess.run([sys.executable, "-m", "trunk.cli", "test", *args, test_split, f"--ckpt_path={tmp_path}"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert plain.returncode != 0 and "is a directory but not a sharded checkpoint" in plain.stderr


def test_a_sharded_checkpoint_whose_index_would_run_code_is_refused(tmp_path):
    """A sharded checkpoint's index is a plain pickle: Trunk reads it allowing only the classes
    torch.distributed.checkpoint writes, as it reads checkpoint files with weights_only=True."""
    import pickle

    from trunk.core.checkpoint import load_checkpoint

    marker = tmp_path / "ran"

    class RunsCode:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    shard_dir = tmp_path / "last.ckpt"
    shard_dir.mkdir()
    (shard_dir / ".metadata").write_bytes(pickle.dumps(RunsCode()))
    torch.save({"global_step": 1}, shard_dir / "meta.pt")
    with pytest.raises(ValueError, match="could run code"):
        load_checkpoint(shard_dir)
    assert not marker.exists()


@pytest.mark.parametrize("preset", ["ddp_gpu", "fsdp_gpu", "deepspeed_zero2_gpu", "tp_fsdp2_gpu"])
def test_gpu_presets_build_their_strategy(preset, monkeypatch):
    """The GPU presets cannot train on this CPU machine; their strategies must still build from the YAML
    exactly as LightningCLI builds them (DeepSpeed, when not installed, must say how to install it)."""
    import importlib.util
    import inspect
    import warnings

    import yaml
    from jsonargparse import ArgumentParser
    from lightning.pytorch.strategies import (
        DeepSpeedStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
        Strategy,
        StrategyRegistry,
    )

    from trunk.models.trunk import Block

    config = yaml.safe_load((REPO / "configs" / "trainer" / f"{preset}.yaml").read_text())["trainer"]
    assert config["accelerator"] == "gpu" and config["precision"] == "auto"
    from trunk.training.precision import resolve_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))  # an A100
    assert resolve_precision(config["precision"], config["accelerator"]) == "bf16-mixed"
    strategy = config["strategy"]
    if isinstance(strategy, str):
        assert strategy in StrategyRegistry
        return
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--strategy", type=str | Strategy)
    if preset == "deepspeed_zero2_gpu" and importlib.util.find_spec("deepspeed") is None:
        inspect.signature(DeepSpeedStrategy).bind(**strategy["init_args"])  # every key is an argument of the strategy
        with pytest.raises(Exception, match="pip install -U deepspeed"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parser.instantiate_classes(parser.parse_object({"strategy": strategy}))
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = parser.instantiate_classes(parser.parse_object({"strategy": strategy})).strategy
    if preset == "tp_fsdp2_gpu":
        assert isinstance(built, ModelParallelStrategy) and (
            built._data_parallel_size,
            built._tensor_parallel_size,
        ) == (4, 2)
        assert config["devices"] == 4 * 2
    if preset == "fsdp_gpu":
        assert isinstance(built, FSDPStrategy) and built.kwargs["use_orig_params"] is True
        assert built.kwargs["auto_wrap_policy"]._module_classes == {Block}  # one FSDP unit per block
