"""Per-task deltas (trunk/models/deltas.py): LoRA and bottleneck adapters on a frozen trunk, routed by slices of the
batch."""

import contextlib
import dataclasses

import pytest
import torch

from trunk.models import TrunkConfig, build_trunk
from trunk.models.deltas import DeltaConfig, DeltaRouter, LoRA, NormShift, TaskDelta

CFG = TrunkConfig(vocab_size=60, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=32, dropout=0.0, attn_dropout=0.0)


def trunk_with(configs: dict[str, DeltaConfig], seed: int = 0):
    torch.manual_seed(seed)
    trunk = build_trunk(CFG).eval()
    router, deltas = DeltaRouter(), {}
    router.attach(trunk.backbone)
    for task, config in configs.items():
        deltas[task] = TaskDelta(trunk.backbone, config)
        router.add(task, deltas[task])
    return trunk, router, deltas


def batch(padded: bool):
    ids = torch.randint(5, 60, (4, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if padded:  # rows of 10, 4, 7 and 2 tokens: the real-token path (Unpadded) runs
        for row, n in enumerate((10, 4, 7, 2)):
            mask[row, n:] = 0
    return ids, mask


def randomise(delta):
    with torch.no_grad():
        for p in delta.parameters():
            p.normal_(0, 0.2)


KINDS_OF_DELTA = [
    {"method": "lora"},
    {"method": "adapter"},
    {"method": "lora", "norms": True},
    {"method": "lora", "dora": True},
]


@pytest.mark.parametrize("kind", KINDS_OF_DELTA)
def test_a_fresh_delta_leaves_the_trunk_as_it_is_and_only_the_delta_learns(kind):
    trunk, router, deltas = trunk_with({"a": DeltaConfig(r=4, **kind)})
    ids, mask = batch(padded=True)
    with torch.no_grad():
        plain = trunk(ids, mask)
        with router.route([("a", 4)], mask.bool()):
            assert torch.allclose(trunk(ids, mask), plain)  # B (LoRA) and up (adapter) start at zero
    before = {k: v.clone() for k, v in trunk.state_dict().items()}
    trunk.requires_grad_(False)
    optimizer = torch.optim.AdamW(deltas["a"].parameters(), lr=1e-2)
    for _ in range(3):
        with router.route([("a", 4)], mask.bool()):
            loss = trunk(ids, mask)[mask.bool()].pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(torch.equal(v, before[k]) for k, v in trunk.state_dict().items())  # the trunk: bit-identical
    with torch.no_grad(), router.route([("a", 4)], mask.bool()):
        assert not torch.allclose(trunk(ids, mask), plain)


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("kind", KINDS_OF_DELTA)
def test_one_batch_of_several_tasks_equals_each_task_alone(kind, padded):
    trunk, router, deltas = trunk_with({"a": DeltaConfig(r=4, **kind), "b": DeltaConfig(r=2, **kind)})
    for delta in deltas.values():
        randomise(delta)
    ids, mask = batch(padded)
    with torch.no_grad():
        with router.route([("a", 1), ("b", 2), ("a", 1)], mask.bool()):
            mixed = trunk(ids, mask)
        alone = []
        for rows, task in ((slice(0, 1), "a"), (slice(1, 3), "b"), (slice(3, 4), "a")):
            with router.route([(task, rows.stop - rows.start)], mask[rows].bool()):
                alone.append(trunk(ids[rows], mask[rows]))
    real = mask.bool()
    torch.testing.assert_close(mixed[real], torch.cat(alone)[real], atol=1e-5, rtol=1e-5)
    # the deltas do something
    assert not torch.allclose(alone[0][0], trunk_with({})[0](ids[:1], mask[:1])[0], atol=1e-3)


def test_norm_shifts_add_a_gain_and_a_bias_to_every_layernorm_of_their_blocks_and_the_final_one():
    _, _, deltas = trunk_with({"all": DeltaConfig(r=4, norms=True), "top": DeltaConfig(r=4, norms=True, layers=(1,))})

    def shifted(delta):
        return sorted(key for key, part in delta.parts.items() if isinstance(part, NormShift))

    assert shifted(deltas["all"]) == [
        "blocks__0__norm_attn",
        "blocks__0__norm_ff",
        "blocks__1__norm_attn",
        "blocks__1__norm_ff",
        "final_norm",
    ]
    assert shifted(deltas["top"]) == ["blocks__1__norm_attn", "blocks__1__norm_ff", "final_norm"]
    assert (
        sum(
            p.numel() for part in deltas["all"].parts.values() if isinstance(part, NormShift) for p in part.parameters()
        )
        == 5 * 2 * 32
    )
    assert deltas["top"].blocks() == {1}  # the final norm counts as the top block's: the blocks below stay shared


def test_dora_computes_the_adapted_weight_with_rows_of_the_learned_lengths():
    torch.manual_seed(0)
    layer, part = torch.nn.Linear(6, 4), LoRA(6, 4, r=2, alpha=4.0, dropout=0.0, dora=True)
    randomise(part)
    x = torch.randn(3, 6)
    with torch.no_grad():
        got = layer(x) + part(x, layer, layer(x))
        adapted = layer.weight + part.weight_delta()
        lengths = layer.weight.norm(dim=1) * (1 + part.magnitude)
        expected = x @ (adapted * (lengths / adapted.norm(dim=1))[:, None]).t() + layer.bias
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("dora", [False, True])
def test_merged_lora_gives_the_unmerged_outputs_and_unmerging_restores_the_trunk(dora):
    trunk, router, deltas = trunk_with({"a": DeltaConfig(r=4, alpha=8, norms=True, dora=dora), "b": DeltaConfig(r=4)})
    randomise(deltas["a"])
    ids, mask = batch(padded=True)
    original = {k: v.clone() for k, v in trunk.state_dict().items()}
    with torch.no_grad(), router.route([("a", 4)], mask.bool()):
        unmerged = trunk(ids, mask)
        router.merge(trunk.backbone, "a")
        merged = trunk(ids, mask)
    torch.testing.assert_close(merged[mask.bool()], unmerged[mask.bool()], atol=1e-5, rtol=1e-4)
    for routes in ([("b", 4)], [("a", 2), (None, 2)], None):  # another task's rows, or the trunk alone, would be wrong
        with pytest.raises(
            RuntimeError, match=r"Task 'a' is merged into the trunk: a forward of other tasks \(or of the trunk alone\)"
        ), torch.no_grad(), router.route(routes, mask.bool()) if routes else contextlib.nullcontext():
            trunk(ids, mask)
    router.unmerge(trunk.backbone)
    assert all(torch.allclose(v, original[k], atol=1e-6) for k, v in trunk.state_dict().items())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"r": 0}, r"peft r=0: the rank \(or bottleneck width\) must be a positive integer"),
        ({"r": 40}, r"peft r=40 is larger than the layer it adapts \(32 -> 32\): use at most 32"),
        ({"method": "adapter", "r": 40}, r"peft r=40 is wider than the model \(32\)"),
        (
            {"targets": ("query",)},
            r"peft targets \['query'\] match no layer of a block; the layers are \['q_proj', 'kv_proj'",
        ),
        ({"method": "prefix"}, r"peft method 'prefix': choose one of \['lora', 'adapter'\]"),
        ({"dropout": 1.0}, r"peft dropout=1.0 must be a probability in \[0, 1\)"),
        ({"layers": (1, 2)}, r"peft layers \[2\]: this trunk's blocks are 0 .. 1"),
        ({"method": "adapter", "dora": True}, r"peft dora=true is a form of LoRA; method 'adapter' cannot take it"),
    ],
)
def test_bad_delta_options_say_what_is_wrong(options, message):
    with pytest.raises(ValueError, match=message):
        TaskDelta(build_trunk(CFG).backbone, DeltaConfig(**options))


def test_a_route_to_a_task_without_a_delta_is_refused():
    trunk, router, _ = trunk_with({"a": DeltaConfig()})
    with pytest.raises(KeyError, match=r"No delta for the tasks \['c'\]; the tasks with deltas are \['a'\]"), \
            router.route([("c", 4)]):
        pass


@pytest.mark.parametrize("options", ["method: lora, r: 4", "method: lora, r: 4, norms: true, dora: true"])
def test_a_peft_run_trains_only_the_deltas_and_heads_and_predicts_through_them(options, tiny_cli_args, tmp_path):
    from trunk.cli import export_main, run_cli
    from trunk.tasks import load

    cli = run_cli([*tiny_cli_args, f"--model.peft={{sentiment: {{{options}}}}}", "--trainer.max_steps=4"], run=False)
    before = {k: v.clone() for k, v in cli.model.trunk.state_dict().items()}
    delta_before = {k: v.clone() for k, v in cli.model.objectives["sentiment"].delta.state_dict().items()}
    cli.trainer.fit(cli.model, cli.datamodule)
    assert all(torch.equal(v, before[k]) for k, v in cli.model.trunk.state_dict().items())  # the trunk: bit-identical
    changed = [
        k
        for k, v in cli.model.objectives["sentiment"].delta.state_dict().items()
        if not torch.equal(v, delta_before[k])
    ]
    learned = (".B", ".A", *((".gain", ".bias", ".magnitude") if "norms" in options else ()))
    assert changed and all(k.endswith(learned) for k in changed)
    assert "norms" not in options or {k.rsplit(".", 1)[1] for k in changed} == {"A", "B", "gain", "bias", "magnitude"}
    ckpt = cli.trainer.checkpoint_callback.last_model_path or cli.trainer.checkpoint_callback.best_model_path
    model = load(ckpt, precision="32-true")
    texts = ["the film was great", "a dull and tedious plot"]
    with_delta = model.predict(texts)
    # the trunk directory keeps the delta with the head, and says how it was made
    export_main([ckpt, str(tmp_path / "exported")])
    assert load(tmp_path / "exported", precision="32-true").predict(texts) == with_delta
    model.model.router.deltas.clear()  # the same weights without the delta: other answers
    assert [r["probs"] for r in model.predict(texts)] != [r["probs"] for r in with_delta]


def test_a_delta_on_the_top_block_leaves_the_blocks_below_alone():
    trunk, router, deltas = trunk_with({"a": DeltaConfig(r=4, layers=(1,))})
    assert {key.split("__")[1] for key in deltas["a"].parts} == {"1"}
    randomise(deltas["a"])
    ids, mask = batch(padded=False)
    seen = {}
    trunk.backbone.blocks[0].register_forward_hook(lambda module, inputs, output: seen.setdefault(len(seen), output))
    with torch.no_grad():
        trunk(ids, mask)
        with router.route([("a", None)]):
            routed = trunk(ids, mask)
    torch.testing.assert_close(seen[0], seen[1])  # block 0's output: the same with the delta
    assert not torch.allclose(routed, trunk(ids, mask))


def test_several_tasks_deltas_answer_from_one_forked_pass_as_each_task_alone(sentiment_files, tmp_path):
    from conftest import single_task

    from trunk.cli import run_cli
    from trunk.tasks import load

    args = []
    for task in ("a", "b"):
        args += single_task(
            [
                "--model=trunk.tasks.SequenceClassification",
                "--data=trunk.datamodules.TextClassificationData",
                f"--data.train={sentiment_files['train']}",
                f"--data.validation={sentiment_files['validation']}",
                "--data.max_length=64",
            ],
            task,
        )
    args += [
        "--model.trunk.d_model=32",
        "--model.trunk.n_layers=2",
        "--model.trunk.n_heads=4",
        "--model.trunk.d_ff=64",
        "--model.trunk.max_len=64",
        "--data.tokenizer_vocab_size=300",
        "--trainer.max_steps=4",
        "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--model.peft={a: {method: lora, r: 4, layers: [1]}, b: {method: adapter, r: 4, layers: [1]}}",
    ]
    fit = run_cli(["fit", *args])
    model = load(
        fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path,
        precision="32-true",
    )
    for delta in model.model.router.deltas.values():
        randomise(delta)  # four steps leave them near zero: make each task's answers its own
    texts = ["the film was great", "a dull and tedious plot", "superb acting"]
    alone = {task: model.predict(texts, task=task) for task in ("a", "b")}
    assert alone["a"] != alone["b"]
    rows = []
    for i, block in enumerate(model.model.trunk.backbone.blocks):
        # the real tokens each block computes on (Unpadded rounds its rows up: inputs[3])
        block.register_forward_hook(lambda module, inputs, output, i=i: rows.append((i, inputs[3].real)))
    together = model.predict(texts, task=["a", "b"])
    assert [{t: r[t] for t in ("a", "b")} for r in together] == [
        {"a": x, "b": y} for x, y in zip(alone["a"], alone["b"])
    ]
    tokens = sum(n for i, n in rows if i == 0)
    assert rows == [(0, tokens), (1, 2 * tokens)]  # block 0 once for both tasks, block 1 once per task's copy


def test_deltas_train_under_ddp_and_fsdp2_as_in_one_process_and_resume_exactly(tmp_path):
    """The scaling tests' runs (tests/parallel_run.py) with a LoRA delta on the frozen trunk: DDP-2 and FSDP2-2 end
    where one process does; a run saved half-way and resumed ends bit-identical."""
    from test_scaling import max_difference, train

    one = train("one", 12, tmp_path / "one.pt", "--peft")
    assert all(one[k].abs().max() > 1e-3 for k in one if k.endswith(".B"))  # LoRA's B starts at zero: it trained
    assert max_difference(one, train("ddp", 12, tmp_path / "ddp.pt", "--peft")) < 1e-5
    assert max_difference(one, train("fsdp2", 12, tmp_path / "fsdp2.pt", "--peft")) < 1e-5
    train("one", 12, tmp_path / "half.pt", "--peft", "--stop-at", "6", "--save", str(tmp_path / "half.ckpt"))
    assert (
        max_difference(
            one, train("one", 12, tmp_path / "resumed.pt", "--peft", "--resume", str(tmp_path / "half.ckpt"))
        )
        == 0.0
    )


def test_a_composed_delta_adds_its_sources_deltas_weighted_per_block():
    trunk, router, deltas = trunk_with({"a": DeltaConfig(r=4), "b": DeltaConfig(method="adapter", r=4)})
    for delta in deltas.values():
        randomise(delta)
    options = {task: dataclasses.asdict(delta.config) for task, delta in deltas.items()}
    both = TaskDelta(trunk.backbone, DeltaConfig(r=2, compose=options))
    for task, delta in deltas.items():
        both.sources[task].load_state_dict(delta.state_dict())
    router.add("both", both)
    assert both.mix.tolist() == [[0.5, 0.5], [0.5, 0.5]] and not any(p.requires_grad for p in both.sources.parameters())
    ids, mask = batch(padded=True)
    with torch.no_grad():
        both.mix.fill_(1.0)  # each source at full weight: their sum, as one delta holding both would add
        with router.route([("both", None)]):
            composed = trunk(ids, mask)
        stacked = TaskDelta(trunk.backbone, DeltaConfig(r=4))  # a's LoRA then b's adapter, written out by hand
        router.add("by_hand", stacked)
        stacked.load_state_dict(deltas["a"].state_dict())
        for key, part in deltas["b"].parts.items():
            stacked.parts[key] = part
        with router.route([("by_hand", None)]):
            expected = trunk(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(composed[real], expected[real], atol=1e-5, rtol=1e-5)


def test_activation_checkpointing_recomputes_blocks_with_their_deltas():
    """Checkpointing recomputes a block in backward, after the forward's route has closed: the deltas must be in the
    recomputed activations too, or their gradients are silently wrong."""
    grads = {}
    for checkpointing in (False, True):
        trunk, router, deltas = trunk_with({"a": DeltaConfig(r=4), "b": DeltaConfig(method="adapter", r=4)})
        for delta in deltas.values():
            randomise(delta)
        trunk.train().backbone.set_grad_checkpointing(checkpointing)
        ids, mask = batch(padded=True)
        with router.route([("a", 2), ("b", 2)], mask.bool()):
            loss = trunk(ids, mask)[mask.bool()].pow(2).mean()
        loss.backward()  # outside the route, as Lightning calls it
        grads[checkpointing] = {f"{t}.{k}": p.grad.clone() for t, d in deltas.items() for k, p in d.named_parameters()}
    assert grads[True].keys() == grads[False].keys()
    for key, grad in grads[False].items():
        torch.testing.assert_close(grads[True][key], grad, atol=1e-6, rtol=1e-5)
