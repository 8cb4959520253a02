"""Each kind's metrics against formulas written out here (scikit-learn's definitions), the run's score
direction, and the classification options for imbalanced labels."""

import math

import pytest
import torch
import torch.nn.functional as F
from trunk.models import TrunkConfig
from trunk.tasks import SequenceClassification, TrunkModule
from trunk.tasks.cli import run_cli

TINY = TrunkConfig(vocab_size=60, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=16, dropout=0.0, attn_dropout=0.0)
LABELS = ["a", "b", "c"]


def classifier(counts=None, **options) -> TrunkModule:
    info = {"label_names": LABELS, "statistics": {"label_counts": counts} if counts else None}
    return TrunkModule({"t": SequenceClassification(head_dropout=0.0, **options)}, trunk=TINY, task_info={"t": info})


def random_batches(n_batches: int = 4, size: int = 24, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"task": "t", "input_ids": torch.randint(5, 60, (size, 8), generator=g), "attention_mask": torch.ones(size, 8, dtype=torch.long),
             "labels": torch.randint(0, len(LABELS), (size,), generator=g)} for _ in range(n_batches)]


def f1(gold: list[int], predicted: list[int], label: int) -> float:
    tp = sum(g == p == label for g, p in zip(gold, predicted))
    fp = sum(p == label != g for g, p in zip(gold, predicted))
    fn = sum(g == label != p for g, p in zip(gold, predicted))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews(gold: list[int], predicted: list[int], n: int) -> float:
    """The multiclass Matthews correlation (Gorodkin 2004), as scikit-learn computes it."""
    s = len(gold)
    c = sum(g == p for g, p in zip(gold, predicted))
    t = [gold.count(k) for k in range(n)]
    p = [predicted.count(k) for k in range(n)]
    denominator = math.sqrt((s * s - sum(x * x for x in p)) * (s * s - sum(x * x for x in t)))
    return (c * s - sum(a * b for a, b in zip(t, p))) / denominator if denominator else 0.0


def test_classification_metrics_match_their_definitions_on_random_predictions():
    torch.manual_seed(0)
    model = classifier(positive_label="b").eval()
    objective = model.objectives["t"]
    gold, predicted = [], []
    with torch.no_grad():
        for batch in random_batches():
            objective.loss(model.trunk, batch, "val")
            gold += batch["labels"].tolist()
            predicted += objective(model.trunk, batch).argmax(-1).tolist()
    assert len(set(predicted)) > 1  # a random model, not a constant one
    values = objective.compute_metrics("val")
    assert values["acc"].item() == pytest.approx(sum(g == p for g, p in zip(gold, predicted)) / len(gold))
    assert values["f1_macro"].item() == pytest.approx(sum(f1(gold, predicted, k) for k in range(3)) / 3, abs=1e-6)
    assert values["mcc"].item() == pytest.approx(matthews(gold, predicted, 3), abs=1e-5)
    assert values["f1_positive"].item() == pytest.approx(f1(gold, predicted, LABELS.index("b")), abs=1e-6)
    assert "f1" not in values  # macro-F1 is logged under a name that says so


def test_primary_metric_stands_for_the_task_in_the_score():
    model = classifier(primary_metric="mcc")
    values = {"acc": torch.tensor(0.9), "mcc": torch.tensor(-0.2)}
    assert model.objectives["t"].score(values).item() == pytest.approx(-0.2)
    objective = model.objectives["t"]
    objective.primary = "loss"  # lower is better: the score negates it, so the score stays higher-is-better
    assert objective.score({"loss": torch.tensor(0.7)}).item() == pytest.approx(-0.7)


@pytest.mark.parametrize("options, message", [
    ({"primary_metric": "f1_positive"}, "needs positive_label"),
    ({"primary_metric": "auc"}, "choose one of"),
    ({"class_weights": "inverse"}, "'balanced' or one weight per label"),
])
def test_bad_classification_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        SequenceClassification(**options)


def test_unknown_positive_label_and_wrong_weight_count_name_the_labels():
    with pytest.raises(ValueError, match=r"positive_label='yes' is not one of its labels \['a', 'b', 'c'\]"):
        classifier(positive_label="yes")
    with pytest.raises(ValueError, match="class_weights has 2 values, but the task has 3 labels"):
        classifier(class_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="needs the training split's label counts"):
        classifier(class_weights="balanced")


def test_balanced_class_weights_follow_the_training_counts():
    model = classifier(counts=[60, 30, 10], class_weights="balanced")
    objective = model.objectives["t"]
    assert objective.class_weight.tolist() == pytest.approx([100 / 180, 100 / 90, 100 / 30])
    batch = random_batches(1)[0]
    logits = objective(model.trunk, batch)
    expected = F.cross_entropy(logits.float(), batch["labels"], weight=objective.class_weight)
    assert objective.loss(model.trunk, batch, "train").item() == pytest.approx(expected.item())
    plain = classifier(counts=[60, 30, 10])
    assert plain.objectives["t"].class_weight is None


def test_balanced_weights_come_from_the_data_through_the_cli(tiny_cli_args):
    cli = run_cli([*tiny_cli_args, "--model.tasks.sentiment.init_args.class_weights=balanced"], run=False)
    counts = cli.model.hparams.task_info["sentiment"]["statistics"]["label_counts"]
    assert sum(counts) == 256 and len(counts) == 2
    assert cli.model.objectives["sentiment"].class_weight.tolist() == pytest.approx([256 / (2 * c) for c in counts])


def test_a_model_predicting_one_class_for_everything_is_reported(tiny_cli_args):
    cli = run_cli(tiny_cli_args, run=False)
    with torch.no_grad():
        cli.model.objectives["sentiment"].head.classifier.bias.copy_(torch.tensor([50.0, 0.0]))
    with pytest.warns(UserWarning, match="predicted 'negative' for every one of the 64 validation examples"):
        cli.trainer.validate(cli.model, datamodule=cli.datamodule)
