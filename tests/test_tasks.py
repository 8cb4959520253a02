"""Task modules: learning on a tiny batch, optimizer groups, and the learning-rate schedule."""

import pytest
import torch

from trunk.models import TrunkConfig
from trunk.tasks import OptimConfig, SequenceClassification
from trunk.tasks.base import lr_lambda

TINY = TrunkConfig(vocab_size=60, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=16, dropout=0.0, attn_dropout=0.0)


def test_a_small_batch_overfits_to_near_zero_loss():
    torch.manual_seed(0)
    model = SequenceClassification(["a", "b", "c"], trunk=TINY, head_dropout=0.0)
    ids = torch.randint(5, 60, (12, 10))
    mask = torch.ones_like(ids)
    mask[6:, 7:] = 0
    labels = torch.randint(0, 3, (12,))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(model(ids, mask), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.01
    assert (model(ids, mask).argmax(-1) == labels).all()


def test_weight_decay_groups_exclude_biases_and_norms():
    model = SequenceClassification(["a", "b"], trunk=TINY, optimizer=OptimConfig(weight_decay=0.1))
    groups = model.param_groups()
    decay = [p for g in groups if g["weight_decay"] == 0.1 for p in g["params"]]
    no_decay = [p for g in groups if g["weight_decay"] == 0.0 for p in g["params"]]
    assert all(p.ndim >= 2 for p in decay) and all(p.ndim == 1 for p in no_decay)
    assert len(decay) + len(no_decay) == len(list(model.parameters()))
    assert all(g["lr"] == model.optim_config.lr for g in groups)  # no layer decay by default
    model.trunk.stem.requires_grad_(False)  # frozen parameters get no optimizer state
    assert sum(len(g["params"]) for g in model.param_groups()) == len([p for p in model.parameters() if p.requires_grad])


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


def test_too_few_labels_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 2 labels"):
        SequenceClassification(["only"], trunk=TINY)
