"""Freezing, layer-wise learning rates and gradual unfreezing, checked on real (tiny) training runs."""

import lightning as L
import pytest
import torch

from trunk.cli import run_cli
from trunk.tasks import FinetuneConfig, SequenceClassification, TrunkModule


def fit(tiny_cli_args, *options, epochs: int = 1, callbacks=()):
    """Build a tiny classification run, train it, return (model, weights before training, trainer)."""
    cli = run_cli([*tiny_cli_args, f"--trainer.max_epochs={epochs}", *options], run=False)
    before = {k: v.clone() for k, v in cli.model.state_dict().items()}
    cli.trainer.callbacks.extend(callbacks)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.model, before, cli.trainer


def changed(model, before) -> dict[str, bool]:
    return {name: not torch.equal(value, before[name]) for name, value in model.state_dict().items()
            if name.startswith(("trunk.", "objectives.")) and "_metrics." not in name}


MODES = {
    "embeddings": (["--model.finetune.freeze_embeddings=true"], ("trunk.stems.",)),
    "lowest_block": (["--model.finetune.freeze_layers=1"], ("trunk.backbone.blocks.0.",)),
    "embeddings_and_lowest_block": (["--model.finetune.freeze_embeddings=true", "--model.finetune.freeze_layers=1"],
                                    ("trunk.stems.", "trunk.backbone.blocks.0.")),
    "whole_trunk": (["--model.finetune.freeze_trunk=true"], ("trunk.",)),
}


@pytest.mark.parametrize("mode", MODES)
def test_frozen_parts_stay_bit_identical_and_get_no_optimizer_state(mode, tiny_cli_args):
    options, frozen_prefixes = MODES[mode]
    model, before, trainer = fit(tiny_cli_args, *options)
    for name, did_change in changed(model, before).items():
        frozen = name.startswith(frozen_prefixes)
        assert did_change != frozen, f"{name}: {'changed although frozen' if frozen else 'did not train'}"
    optimizer = trainer.optimizers[0]
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        frozen = name.startswith(frozen_prefixes)
        assert (id(p) in in_optimizer) != frozen and (p in optimizer.state) != frozen, name
    # Frozen parts run in eval mode (no dropout) even while the rest trains.
    model.train()
    blocks = model.trunk.backbone.blocks
    for prefix, module in {"trunk.stems.": model.trunk.stems["text"], "trunk.backbone.blocks.0.": blocks[0],
                           "trunk.backbone.blocks.1.": blocks[1]}.items():
        assert module.training != prefix.startswith(frozen_prefixes), prefix
    assert model.objectives["sentiment"].training


def test_layer_decay_gives_one_learning_rate_per_depth(tiny_cli_args):
    cli = run_cli([*tiny_cli_args, "--model.finetune.layer_decay=0.5", "--model.optimizer.lr=0.01"], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    groups = {g["name"]: g["initial_lr"] for g in cli.trainer.optimizers[0].param_groups}
    # 2 blocks: stem = depth 0, blocks = 1 and 2, top (final norm + head) = 3
    assert groups == pytest.approx({
        "depth0": 0.01 * 0.5**3, "depth0_no_decay": 0.01 * 0.5**3,  # the stem's position table does not decay
        "depth1": 0.01 * 0.5**2, "depth1_no_decay": 0.01 * 0.5**2,
        "depth2": 0.01 * 0.5, "depth2_no_decay": 0.01 * 0.5,
        "depth3": 0.01, "depth3_no_decay": 0.01,
    })
    by_name = {g["name"]: g for g in cli.trainer.optimizers[0].param_groups}
    assert all(
        any(p is q for q in by_name["depth1"]["params"])
        for p in cli.model.trunk.backbone.blocks[0].parameters()
        if p.ndim >= 2
    )
    assert all(
        any(p is q for q in by_name["depth3"]["params"]) for p in cli.model.objectives.parameters() if p.ndim >= 2
    )


class RecordTrainable(L.Callback):
    """Which trunk depths train, and each group's lr / initial_lr, at the first batch of every epoch."""

    def __init__(self) -> None:
        self.trainable: list[list[bool]] = []
        self.lr_ratios: list[list[float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 0:
            depths = pl_module.depth_groups()[:-1]
            self.trainable.append([all(p.requires_grad for m in d for p in m.parameters()) for d in depths])
            self.lr_ratios.append([g["lr"] / g["initial_lr"] for g in trainer.optimizers[0].param_groups])


def test_gradual_unfreezing_thaws_one_depth_every_k_epochs_top_down(tiny_cli_args):
    record = RecordTrainable()
    model, before, trainer = fit(
        tiny_cli_args,
        "--model.finetune.unfreeze_every=2",
        "--model.finetune.freeze_embeddings=true",
        epochs=5,
        callbacks=[record],
    )
    # depths: [stem, block 0, block 1]; the embeddings are frozen for good
    assert record.trainable == [
        [False, False, False], [False, False, False],  # epochs 0-1: only the head (and nothing in the trunk)
        [False, False, True], [False, False, True],    # epoch 2: the top block thaws
        [False, True, True],                           # epoch 4: the next block
    ]
    for ratios in record.lr_ratios:  # thawed groups follow the same schedule as the head
        assert ratios == pytest.approx([ratios[0]] * len(ratios))
    assert [len(r) for r in record.lr_ratios] == [2, 2, 4, 4, 6]
    did_change = changed(model, before)
    assert not any(v for k, v in did_change.items() if k.startswith("trunk.stems."))
    assert all(v for k, v in did_change.items() if k.startswith("trunk.backbone.blocks."))


def test_gradual_unfreezing_resumes_with_the_same_thawed_parts(tiny_cli_args, tmp_path):
    first = run_cli(["fit", *tiny_cli_args, "--model.finetune.unfreeze_every=1", "--trainer.max_epochs=2"])
    last = first.trainer.checkpoint_callback.last_model_path or first.trainer.checkpoint_callback.best_model_path
    record = RecordTrainable()
    cli = run_cli([*tiny_cli_args, "--model.finetune.unfreeze_every=1", "--trainer.max_epochs=3"], run=False)
    cli.trainer.callbacks.append(record)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=last)
    assert record.trainable == [[False, True, True]]  # epoch 2: top block (epoch 1) and block 0 (epoch 2)


def test_invalid_finetune_options():
    with pytest.raises(ValueError, match="set only one of them"):
        FinetuneConfig(freeze_trunk=True, unfreeze_every=1)
    with pytest.raises(ValueError, match="layer_decay must be in"):
        FinetuneConfig(layer_decay=0.0)
    with pytest.raises(ValueError, match="freeze_layers=5 exceeds the trunk's 4 blocks"):
        TrunkModule({"t": SequenceClassification()}, task_info={"t": {"label_names": ["a", "b"]}},
                    finetune=FinetuneConfig(freeze_layers=5))


def test_gradual_unfreezing_under_ddp_and_fsdp2_thaws_what_one_process_thaws(tiny_cli_args, tmp_path):
    """Under DDP and FSDP2 the parts waiting to thaw are held (gradients dropped), not frozen by
    requires_grad: 2 processes change exactly the parameters one process changes, epoch by epoch."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    records = {}
    for mode in ("one", "ddp", "fsdp2"):
        record = tmp_path / f"changes_{mode}.json"
        args = [a for a in tiny_cli_args if not a.startswith(("--trainer.devices", "--trainer.default_root_dir"))]
        args += [
            "--trainer.max_epochs=3",
            "--model.finetune.unfreeze_every=1",
            "--trainer.callbacks+=probes.RecordChanges",
            "--trainer.precision=32-true",  # a gradient rounded to zero in bf16 would leave a thawed weight as it was
            f"--trainer.callbacks.path={record}",
            f"--trainer.default_root_dir={tmp_path / mode}",
        ]
        args += {"one": ["--trainer.devices=1"], "ddp": ["--trainer.devices=2", "--trainer.strategy=ddp"],
                 "fsdp2": ["--config", str(REPO / "configs/trainer/fsdp2_cpu.yaml")]}[mode]
        done = subprocess.run([sys.executable, "-m", "trunk.cli", "fit", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        records[mode] = json.loads(record.read_text())
    one, two, sharded = records["one"], records["ddp"], records["fsdp2"]
    assert [e["changed"] for e in two] == [e["changed"] for e in sharded] == [e["changed"] for e in one]
    assert [e["training"] for e in two] == [e["training"] for e in sharded] == [e["training"] for e in one] == [
        [False, False, False], [False, False, True], [False, True, True]]  # [stem, block 0, block 1]: top-down
    assert one[0]["changed"] == [] and all(n.startswith("backbone.blocks.1.") or n.startswith("backbone.final_norm")
                                           for n in one[1]["changed"])
    assert any(n.startswith("backbone.blocks.0.") for n in one[2]["changed"])
    assert not any(n.startswith("stems.") for e in one for n in e["changed"])  # thawed only at epoch 3


def test_activation_checkpointing_gives_the_same_gradients_with_less_kept(tiny_cli_args):
    """``model.activation_checkpointing`` recomputes blocks in backward: the same loss and gradients
    (dropout on: the random state is replayed), and no block activation is kept for backward."""
    from trunk.tasks import Translation

    def build(checkpointing: bool):
        torch.manual_seed(0)
        return TrunkModule(
            {"mt": Translation()},
            trunk={"vocab_size": 60, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "max_len": 32},
            task_info={"mt": {}},
            activation_checkpointing=checkpointing,
        ).train()

    plain, checkpointed = build(False), build(True)
    assert checkpointed.trunk.backbone.grad_checkpointing and checkpointed.objectives["mt"].decoder.grad_checkpointing
    ids = torch.randint(5, 60, (4, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "decoder_input_ids": ids, "labels": ids}
    grads, kept = {}, {}
    for name, module in (("plain", plain), ("checkpointed", checkpointed)):
        torch.manual_seed(1)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            loss = module.objectives["mt"].loss(module.trunk, batch, "train")
        loss.backward()
        grads[name] = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
        kept[name] = sum(saved)
    assert grads["plain"].keys() == grads["checkpointed"].keys()
    for n in grads["plain"]:
        torch.testing.assert_close(grads["checkpointed"][n], grads["plain"][n], msg=n)
    assert kept["checkpointed"] < 0.5 * kept["plain"]


def test_compile_option_compiles_every_block_and_keeps_the_outputs():
    cfg = {"vocab_size": 60, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "max_len": 32}
    torch.manual_seed(0)
    eager = TrunkModule({"s": SequenceClassification()}, trunk=cfg, task_info={"s": {"label_names": ["a", "b"]}}).eval()
    compiled = TrunkModule(
        {"s": SequenceClassification()}, trunk=cfg, task_info={"s": {"label_names": ["a", "b"]}}, compile=True
    ).eval()
    compiled.load_state_dict(eager.state_dict())
    assert all(block._compiled_call_impl is not None for block in compiled.trunk.backbone.blocks)
    ids = torch.randint(5, 60, (3, 10))
    with torch.no_grad():
        torch.testing.assert_close(
            compiled.trunk(ids, torch.ones_like(ids)), eager.trunk(ids, torch.ones_like(ids)), atol=1e-5, rtol=1e-5
        )
