"""The LightningModule and its objectives: learning on a tiny batch, optimizer groups, the schedule, bad input."""

import dataclasses

import pytest
import torch

from trunk.models import TrunkConfig
from trunk.tasks import (
    ImageClassification,
    MaskedLanguageModeling,
    OptimConfig,
    SequenceClassification,
    TokenClassification,
    TrunkModule,
)
from trunk.training.optim import Lamb, build_optimizer, lr_lambda

TINY = TrunkConfig(vocab_size=60, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=16, dropout=0.0, attn_dropout=0.0)


def classifier(labels=("a", "b", "c"), trunk: TrunkConfig = TINY, **kwargs) -> TrunkModule:
    return TrunkModule(
        {"t": SequenceClassification(head_dropout=0.0)},
        trunk=trunk,
        task_info={"t": {"label_names": list(labels)}},
        **kwargs,
    )


def test_a_small_batch_overfits_to_near_zero_loss():
    torch.manual_seed(0)
    model = classifier()
    ids = torch.randint(5, 60, (12, 10))
    mask = torch.ones_like(ids)
    mask[6:, 7:] = 0
    batch = {"task": "t", "input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 3, (12,))}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = model.objectives["t"].loss(model.trunk, batch, "train")
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.01
    assert (model.objectives["t"](model.trunk, batch).argmax(-1) == batch["labels"]).all()


def decay_split(model: TrunkModule, weight_decay: float) -> tuple[set[str], set[str]]:
    """The parameter names in decaying and in non-decaying optimizer groups."""
    names = {id(p): name for name, p in model.named_parameters()}
    groups = model.param_groups()
    assert {g["weight_decay"] for g in groups} <= {weight_decay, 0.0}
    return ({names[id(p)] for g in groups if g["weight_decay"] for p in g["params"]},
            {names[id(p)] for g in groups if not g["weight_decay"] for p in g["params"]})


def test_weight_decay_groups_exclude_biases_norms_and_position_tables():
    model = classifier(
        ("a", "b"), optimizer=OptimConfig(weight_decay=0.1), trunk=dataclasses.replace(TINY, positions="learned")
    )
    params = dict(model.named_parameters())
    decay, no_decay = decay_split(model, 0.1)
    assert all(params[n].ndim >= 2 and "position" not in n for n in decay)
    assert no_decay == {n for n, p in params.items() if p.ndim == 1} | {"trunk.stems.text.position.weight"}
    assert len(decay) + len(no_decay) == len(params)
    groups = model.param_groups()
    assert all(g["lr"] == model.optim_config.lr for g in groups)  # no layer decay by default
    model.trunk.stems.requires_grad_(False)  # frozen parameters get no optimizer state
    assert sum(len(g["params"]) for g in model.param_groups()) == len(
        [p for p in model.parameters() if p.requires_grad]
    )


def test_vit_position_table_and_cls_do_not_decay():
    model = TrunkModule(
        {"pictures": ImageClassification(image_size=8, patch_size=4)},
        trunk=dataclasses.replace(TINY, positions="learned"),
        task_info={"pictures": {"label_names": ["a", "b"]}},
        optimizer=OptimConfig(weight_decay=0.1),
    )
    decay, no_decay = decay_split(model, 0.1)
    assert {"trunk.stems.image.cls", "trunk.stems.image.position"} <= no_decay
    assert "trunk.stems.image.proj.weight" in decay


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_warmup_then_decay(schedule):
    cfg = OptimConfig(warmup=10, schedule=schedule, min_lr_ratio=0.1)
    factors = [lr_lambda(step, 110, cfg) for step in range(111)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)  # linear warmup over 10 steps
    assert factors[10] == pytest.approx(1.0)
    if schedule == "constant":
        assert factors[-1] == 1.0
    else:
        assert factors[-1] == pytest.approx(0.1)  # ends at lr * min_lr_ratio
        assert all(a >= b for a, b in zip(factors[10:], factors[11:]))
    if schedule == "cosine":
        assert factors[60] == pytest.approx(0.1 + 0.9 * 0.5)  # halfway down the cosine
    assert lr_lambda(5, 100, OptimConfig(warmup=0.1)) == pytest.approx(0.6)  # fraction of all steps


def test_inverse_sqrt_is_the_transformer_papers_schedule():
    """lr = d_model**-0.5 * warmup**-0.5 peaks at the warmup's end; with it the rate at (1-based) step s is the paper's
    d_model**-0.5 * min(s**-0.5, s * warmup**-1.5)."""
    d_model, warmup = 512, 4000
    cfg = OptimConfig(lr=d_model ** -0.5 * warmup ** -0.5, warmup=warmup, schedule="inverse_sqrt")
    for s in (1, 100, 3999, 4000, 4001, 16000, 100_000):
        paper = d_model ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)
        assert cfg.lr * lr_lambda(s - 1, 200_000, cfg) == pytest.approx(paper, rel=1e-9), s
    # a quarter of the rate 4x later, whatever the run's length
    assert lr_lambda(4 * warmup - 1, 10, cfg) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="inverse_sqrt' with warmup=0"):
        OptimConfig(schedule="inverse_sqrt", warmup=0)
    with pytest.raises(ValueError, match=r"schedule='noam' \(one of"):
        OptimConfig(schedule="noam")


def lamb_reference(
    w: torch.Tensor, grads: list[torch.Tensor], lr: float, betas, eps: float, weight_decay: float
) -> torch.Tensor:
    """Algorithm 2 of You et al. 2020 written out for one weight tensor, in float64."""
    w, m, v = w.double().clone(), torch.zeros_like(w, dtype=torch.float64), torch.zeros_like(w, dtype=torch.float64)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        r = (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
        u = r + weight_decay * w
        trust = w.norm() / u.norm() if weight_decay else 1.0
        w = w - lr * trust * u
    return w


def test_lamb_matches_the_papers_update_and_leaves_no_decay_tensors_to_plain_adam():
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.nn.Parameter(torch.randn(8, 4, generator=g)), torch.nn.Parameter(torch.randn(4, generator=g))
    grads = [(torch.randn(8, 4, generator=g), torch.randn(4, generator=g)) for _ in range(5)]
    lamb = Lamb([{"params": [weight], "weight_decay": 0.1}, {"params": [bias], "weight_decay": 0.0}], lr=0.05, eps=1e-6)
    start = weight.detach().clone(), bias.detach().clone()
    for gw, gb in grads:
        weight.grad, bias.grad = gw, gb
        lamb.step()
    torch.testing.assert_close(
        weight.detach().double(), lamb_reference(start[0], [gw for gw, _ in grads], 0.05, (0.9, 0.999), 1e-6, 0.1)
    )
    adam = torch.optim.Adam([b := torch.nn.Parameter(start[1].clone())], lr=0.05, eps=1e-6)
    for _, gb in grads:
        b.grad = gb
        adam.step()
    torch.testing.assert_close(bias.detach(), b.detach())
    # each weight tensor moves by the same share of its norm, whatever the gradient's scale: lr per step at most
    before = weight.detach().clone()
    weight.grad = 1e4 * torch.randn(8, 4, generator=g)
    lamb.step()
    assert (weight.detach() - before).norm() / before.norm() == pytest.approx(0.05, rel=1e-4)


def test_lamb_trains_through_the_module_and_its_state_resumes():
    torch.manual_seed(0)
    # lr: a share of each norm
    model = classifier(optimizer=OptimConfig(name="lamb", lr=5e-2, schedule="inverse_sqrt", warmup=10))
    params = [p for p in model.parameters() if p.requires_grad]
    built = build_optimizer([{"params": params, "weight_decay": 0.01}], model.optim_config, total_steps=60)
    optimizer = built["optimizer"]
    assert isinstance(optimizer, Lamb)
    ids, labels = torch.randint(5, 60, (12, 10)), torch.arange(12) % 3
    batch = {"task": "t", "input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    losses = []
    for _ in range(60):
        optimizer.zero_grad()
        loss = model(batch, "train")
        loss.backward()
        optimizer.step()
        built["lr_scheduler"]["scheduler"].step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
    again = Lamb([{"params": params, "weight_decay": 0.01}])
    # plain tensors: checkpoints load safely
    again.load_state_dict(torch.load(_saved(optimizer.state_dict()), weights_only=True))
    assert again.state[params[0]]["step"].item() == 60


def _saved(state: dict):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_text_and_image_tasks_share_one_backbone():
    model = TrunkModule(
        {
            "words": SequenceClassification(),
            "pictures": ImageClassification(image_size=8, patch_size=4),
            "mlm": MaskedLanguageModeling(),
        },
        trunk=TINY,
        task_info={"words": {"label_names": ["a", "b"]}, "pictures": {"label_names": ["x", "y", "z"]}, "mlm": {}},
    )
    assert set(model.trunk.stems) == {"text", "image"}
    assert model.objectives["mlm"].head.decoder.weight is model.trunk.stems["text"].token.weight
    images = {"task": "pictures", "pixel_values": torch.randn(2, 1, 8, 8), "labels": torch.tensor([0, 2])}
    text = {
        "task": "words",
        "input_ids": torch.randint(5, 60, (2, 6)),
        "attention_mask": torch.ones(2, 6, dtype=torch.long),
        "labels": torch.tensor([0, 1]),
    }
    (model(images, "train") + model(text, "train")).backward()
    assert all(p.grad is not None for p in model.trunk.backbone.parameters())


def test_bad_task_configurations_are_clear_errors():
    with pytest.raises(ValueError, match="at least 2 labels"):
        classifier(["only"])
    with pytest.raises(ValueError, match=r"model.tasks names \['t'\] but data.tasks names \['u'\]"):
        TrunkModule({"t": SequenceClassification()}, trunk=TINY, task_info={"u": {"label_names": ["a", "b"]}})
    with pytest.raises(
        ValueError, match="feeds token_classification objectives, but model.tasks.t is SequenceClassification"
    ):
        TrunkModule({"t": SequenceClassification()}, trunk=TINY,
                    task_info={"t": {"kinds": ["token_classification"], "label_names": ["O", "B-X", "I-X"]}})
    with pytest.raises(ValueError, match="task_weights names \\['nope'\\]"):
        classifier(task_weights={"nope": 1.0})
    with pytest.raises(ValueError, match="task_weights must be >= 0"):
        classifier(task_weights={"t": -1.0})
    with pytest.raises(ValueError, match="share one stem"):
        TrunkModule(
            {
                "a": ImageClassification(image_size=8, patch_size=4),
                "b": ImageClassification(image_size=8, patch_size=2),
            },
            trunk=TINY,
            task_info={"a": {"label_names": ["x", "y"]}, "b": {"label_names": ["x", "y"]}},
        )
    with pytest.raises(ValueError, match="No task named 'nope'"):
        classifier().objective("nope")
    with pytest.raises(ValueError, match="complete BIO label set"):
        TrunkModule({"t": TokenClassification()}, trunk=TINY, task_info={"t": {"label_names": ["O", "I-X"]}})


def test_a_head_without_a_batch_since_the_last_step_is_not_updated():
    """Under DDP the reducer gives unused heads zero gradients; AdamW must skip them, as in one process."""
    model = TrunkModule({"words": SequenceClassification(), "mlm": MaskedLanguageModeling()}, trunk=TINY,
                        task_info={"words": {"label_names": ["a", "b"]}, "mlm": {}})
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    model._trained_tasks.add("words")
    model.on_before_optimizer_step(None)
    assert all(p.grad is not None for p in model.objectives["words"].parameters())
    mlm_head = model.objectives["mlm"].head
    assert mlm_head.dense.weight.grad is None and mlm_head.decoder.bias.grad is None
    assert mlm_head.decoder.weight.grad is not None  # tied to the trunk's embeddings: the trunk's gradient stays
    assert not model._trained_tasks
