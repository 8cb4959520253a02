"""The kinds people bring beyond the first five (regression, multi-label, multiple choice) and the
classification options: each kind's metrics against formulas written out here (scikit-learn's and the
reference scripts' definitions), learning through the CLI on generated data, bad input, and the run's
score direction."""

import math

import pytest
import torch
import torch.nn.functional as F

from trunk.cli import run_cli
from trunk.datamodules import MultiLabelTextData
from trunk.models import TrunkConfig
from trunk.tasks import (
    MultiLabelClassification,
    MultipleChoice,
    SequenceClassification,
    SequenceRegression,
    TrunkModule,
    load,
)

TINY = TrunkConfig(vocab_size=60, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=16, dropout=0.0, attn_dropout=0.0)
LABELS = ["a", "b", "c"]


def classifier(counts=None, **options) -> TrunkModule:
    info = {"label_names": LABELS, "statistics": {"label_counts": counts} if counts else None}
    return TrunkModule({"t": SequenceClassification(head_dropout=0.0, **options)}, trunk=TINY, task_info={"t": info})


def random_batches(n_batches: int = 4, size: int = 24, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "task": "t",
            "input_ids": torch.randint(5, 60, (size, 8), generator=g),
            "attention_mask": torch.ones(size, 8, dtype=torch.long),
            "labels": torch.randint(0, len(LABELS), (size,), generator=g),
        }
        for _ in range(n_batches)
    ]


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


def test_a_perfect_binary_epoch_logs_its_metrics_as_floats():
    """torchmetrics' MCC of a perfect binary epoch is an integer tensor; logged as it is, Lightning warns that it
    "needs to be floating" in every first run on easy data."""
    objective = TrunkModule({"t": SequenceClassification()}, trunk=TINY,
                            task_info={"t": {"label_names": ["no", "yes"]}}).objectives["t"]
    gold = torch.tensor([0, 1, 1, 0])
    for metric in objective.metrics("val").values():
        metric.update(F.one_hot(gold, 2).float(), gold)
    values = objective.compute_metrics("val")
    assert values["mcc"].item() == 1.0 and all(v.is_floating_point() for v in values.values())


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
    ({"label_smoothing": 1.0}, r"label_smoothing must be in \[0, 1\)"),
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


def test_label_smoothing_spreads_the_target_over_the_other_labels():
    """With smoothing e over 3 labels, the target is 1 - e + e/3 on the gold label and e/3 on each other one."""
    smoothed, plain = classifier(label_smoothing=0.3), classifier()
    with torch.no_grad():
        # confident: smoothing matters
        smoothed.objectives["t"].head.classifier.bias.copy_(torch.tensor([3.0, 0.0, -3.0]))
    plain.load_state_dict(smoothed.state_dict())
    batch = random_batches(1)[0]
    logits = smoothed.objectives["t"](smoothed.trunk, batch).float()
    target = torch.full_like(logits, 0.1).scatter_(1, batch["labels"][:, None], 0.8)
    expected = -(target * logits.log_softmax(-1)).sum(-1).mean()
    assert smoothed.objectives["t"].loss(smoothed.trunk, batch, "train").item() == pytest.approx(
        expected.item(), rel=1e-5
    )
    assert plain.objectives["t"].loss(plain.trunk, batch, "train").item() == pytest.approx(
        F.cross_entropy(logits, batch["labels"]).item(), rel=1e-5
    )
    assert abs(plain.objectives["t"].loss(plain.trunk, batch, "train").item() - expected.item()) > 0.01


def test_masked_lm_smoothing_is_torchs_smoothed_cross_entropy_at_the_masked_tokens():
    from trunk.tasks import MaskedLanguageModeling, TrunkModule

    torch.manual_seed(0)
    model = TrunkModule(
        {"m": MaskedLanguageModeling(label_smoothing=0.2)},
        trunk={"vocab_size": 40, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1, "max_len": 16},
        task_info={"m": {}},
    ).eval()  # no dropout: two passes agree
    ids = torch.randint(5, 40, (3, 12))
    labels = torch.where(torch.rand(3, 12) < 0.3, ids, -100)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    logits = model.objectives["m"](model.trunk, batch).float()[labels != -100]
    expected = F.cross_entropy(logits, labels[labels != -100], label_smoothing=0.2)
    assert model.objectives["m"].loss(model.trunk, batch, "train").item() == pytest.approx(expected.item(), rel=1e-5)


def test_smoothed_cross_entropy_is_torchs_and_gives_no_share_to_entries_that_are_no_candidates():
    from trunk.core.codec import IGNORE_INDEX
    from trunk.tasks.objectives.base import cross_entropy

    g = torch.Generator().manual_seed(0)
    logits, weight = torch.randn(6, 5, generator=g), torch.rand(5, generator=g) + 0.5
    labels = torch.tensor([0, 4, 2, IGNORE_INDEX, 1, 3])
    for w in (None, weight):
        expected = F.cross_entropy(logits, labels, weight=w, ignore_index=IGNORE_INDEX, label_smoothing=0.2)
        assert cross_entropy(logits, labels, 0.2, w).item() == pytest.approx(expected.item(), rel=1e-6)
    # a row scoring its last two entries -inf (padding, missing choices) is smoothed as the row of its 3 candidates
    masked = logits.clone()
    masked[:, 3:] = float("-inf")
    kept = torch.tensor([0, 2, 4])  # rows whose gold is among the first 3
    assert F.cross_entropy(masked[kept], labels[kept], label_smoothing=0.2).isinf()  # why Trunk has its own
    expected = F.cross_entropy(logits[kept, :3], labels[kept], label_smoothing=0.2)
    assert cross_entropy(masked[kept], labels[kept], 0.2).item() == pytest.approx(expected.item(), rel=1e-6)
    assert cross_entropy(masked[kept].reshape(3, 1, 5), labels[kept].reshape(3, 1), 0.2).item() == pytest.approx(
        expected.item(), rel=1e-6
    )


@pytest.mark.parametrize(
    "kind",
    [
        "TokenClassification",
        "MultipleChoice",
        "ExtractiveQuestionAnswering",
        "MultiLabelClassification",
        "MaskedLanguageModeling",
        "Translation",
        "ImageClassification",
    ],
)
def test_every_classification_like_kind_takes_label_smoothing_and_refuses_a_bad_one(kind):
    import trunk.tasks

    assert getattr(trunk.tasks, kind)(label_smoothing=0.1).spec()["init_args"]["label_smoothing"] == 0.1
    with pytest.raises(ValueError, match=rf"{kind}: label_smoothing must be in \[0, 1\), got 1.0"):
        getattr(trunk.tasks, kind)(label_smoothing=1.0)


def test_multiple_choice_and_multi_label_smoothing_follow_their_targets():
    torch.manual_seed(0)
    model = TrunkModule(
        {"q": MultipleChoice(head_dropout=0.0, label_smoothing=0.3)}, trunk=TINY, task_info={"q": {}}
    ).eval()
    g = torch.Generator().manual_seed(0)
    batch = {
        "task": "q",
        "input_ids": torch.randint(5, 60, (7, 6), generator=g),
        "attention_mask": torch.ones(7, 6, dtype=torch.long),
        "choice_counts": torch.tensor([4, 3]),
        "labels": torch.tensor([3, 2]),
    }
    scores = model.objectives["q"](model.trunk, batch)
    logp = [scores[0].log_softmax(-1), scores[1, :3].log_softmax(-1)]  # the second row has 3 candidates: 0.1 each
    expected = sum(-(0.7 * p[y] + 0.3 * p.mean()) for p, y in zip(logp, [3, 2])) / 2
    assert model.objectives["q"].loss(model.trunk, batch, "train").item() == pytest.approx(expected.item(), rel=1e-5)

    model = TrunkModule({"m": MultiLabelClassification(head_dropout=0.0, label_smoothing=0.2)}, trunk=TINY,
                        task_info={"m": {"label_names": ["a", "b", "c"]}}).eval()
    batch = {
        "task": "m",
        "input_ids": torch.randint(5, 60, (4, 6), generator=g),
        "attention_mask": torch.ones(4, 6, dtype=torch.long),
        "labels": torch.tensor([[1, 0, 0], [0, 1, 1], [0, 0, 0], [1, 1, 1]]),
    }
    logits = model.objectives["m"](model.trunk, batch).float()
    # 1 -> 0.9, 0 -> 0.1; summed over the 3 labels, averaged over the 4 examples
    expected = F.binary_cross_entropy_with_logits(logits, batch["labels"] * 0.8 + 0.1, reduction="sum") / 4
    assert model.objectives["m"].loss(model.trunk, batch, "train").item() == pytest.approx(expected.item(), rel=1e-5)


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


# -- regression ------------------------------------------------------------------------------------------
def pearson(x: list[float], y: list[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def ranks(x: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank (as scipy.stats.rankdata)."""
    order = sorted(range(len(x)), key=x.__getitem__)
    out = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in order[i : j + 1]:
            out[k] = (i + j) / 2 + 1
        i = j + 1
    return out


def regressor(targets=("score",), statistics=None, **options) -> TrunkModule:
    info = {"label_names": list(targets), "statistics": statistics}
    return TrunkModule({"r": SequenceRegression(head_dropout=0.0, **options)}, trunk=TINY, task_info={"r": info})


def test_regression_metrics_match_their_definitions_on_the_data_scale():
    torch.manual_seed(0)
    model = regressor(("a", "b"), {"target_mean": [3.0, -1.0], "target_std": [2.0, 0.5]}).eval()
    objective = model.objectives["r"]
    g = torch.Generator().manual_seed(1)
    gold, predicted = [], []
    with torch.no_grad():
        for _ in range(3):
            batch = {
                "task": "r",
                "input_ids": torch.randint(5, 60, (20, 8), generator=g),
                "attention_mask": torch.ones(20, 8, dtype=torch.long),
                "labels": torch.randn(20, 2, generator=g) * torch.tensor([2.0, 0.5]) + torch.tensor([3.0, -1.0]),
            }
            objective.loss(model.trunk, batch, "val")
            gold += batch["labels"].tolist()
            predicted += objective.scores(model.trunk, batch).tolist()
    values = objective.compute_metrics("val")
    for k, name in enumerate("ab"):
        x, y = [p[k] for p in predicted], [t[k] for t in gold]
        assert values[f"pearson_{name}"].item() == pytest.approx(pearson(x, y), abs=1e-4)
        assert values[f"spearman_{name}"].item() == pytest.approx(pearson(ranks(x), ranks(y)), abs=1e-4)
        assert values[f"mse_{name}"].item() == pytest.approx(sum((a - b) ** 2 for a, b in zip(x, y)) / len(x), rel=1e-4)
        assert values[f"mae_{name}"].item() == pytest.approx(sum(abs(a - b) for a, b in zip(x, y)) / len(x), rel=1e-4)
    assert values["pearson"].item() == pytest.approx((values["pearson_a"] + values["pearson_b"]).item() / 2)
    # predictions are on the data's scale: the head's standardised output times the std, plus the mean
    raw = objective(model.trunk, batch).float()
    assert torch.allclose(
        objective.scores(model.trunk, batch), raw * torch.tensor([2.0, 0.5]) + torch.tensor([3.0, -1.0])
    )


def test_regression_loss_is_on_standardised_targets_and_errors_count_negated_in_the_score():
    model = regressor(
        statistics={"target_mean": [10.0], "target_std": [4.0]}, loss="huber", huber_delta=0.5, primary_metric="mae"
    )
    objective = model.objectives["r"]
    batch = random_batches(1)[0]
    batch = {**batch, "task": "r", "labels": torch.rand(len(batch["labels"]), 1) * 20}
    expected = F.huber_loss(objective(model.trunk, batch).float(), (batch["labels"] - 10.0) / 4.0, delta=0.5)
    assert objective.loss(model.trunk, batch, "train").item() == pytest.approx(expected.item(), rel=1e-5)
    assert objective.score({"mae": torch.tensor(0.3), "pearson": torch.tensor(0.9)}).item() == pytest.approx(-0.3)
    with pytest.raises(ValueError, match="choose one of"):
        SequenceRegression(primary_metric="r2")


def tiny_run_args(files, root, task: str, kind: list[str], *extra) -> list[str]:
    """A small fast run of one task on generated ``files``: ``kind``, its model and data options; ``extra``, options
    that override the defaults here."""
    from conftest import single_task

    return single_task(
        [
            *kind,
            "--model.trunk.d_model=64",
            "--model.trunk.n_layers=2",
            "--model.trunk.n_heads=4",
            "--model.trunk.d_ff=128",
            "--model.trunk.max_len=64",
            "--model.trunk.dropout=0.0",
            "--model.trunk.attn_dropout=0.0",
            "--model.optimizer.lr=1e-3",
            *(f"--data.{split}={files[split]}" for split in ("train", "validation", "test")),
            f"--data.predict={files['test']}",
            "--data.tokenizer_vocab_size=200",
            "--data.batch_size=16",
            "--data.max_length=64",
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
            "--trainer.precision=32-true",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={root}",
            "--seed_everything=0",
            *extra,
        ],
        task,
    )


def regression_args(files, root, *extra) -> list[str]:
    return tiny_run_args(
        files,
        root,
        "sim",
        [
            "--model=trunk.tasks.SequenceRegression",
            "--data=trunk.datamodules.TextRegressionData",
            "--data.text_pair_column=pair",
            "--data.label_column=score",
            "--model.head_dropout=0.0",
        ],
        *extra,
    )


def test_regression_learns_a_linear_target_through_the_cli(scores_files, tmp_path):
    fit = run_cli(["fit", *regression_args(scores_files, tmp_path / "run", "--trainer.max_epochs=12")])
    best = fit.trainer.checkpoint_callback.best_model_path
    tested = run_cli(
        ["test", *regression_args(scores_files, tmp_path / "run"), f"--ckpt_path={best}"]
    ).trainer.callback_metrics
    assert tested["test/sim/pearson"] > 0.9 and tested["test/sim/spearman"] > 0.85
    assert tested["test/score"].item() == pytest.approx(tested["test/sim/pearson"].item())
    statistics = fit.model.hparams.task_info["sim"]["statistics"]
    assert statistics["target_mean"][0] == pytest.approx(
        sum(float(r.split("\t")[2]) for r in scores_files["train"].read_text().splitlines()[1:]) / 400
    )
    records = load(best).predict([("superb film", "dull plot"), ("awful film", "superb music")])
    assert set(records[0]) == {"text", "score"} and records[0]["score"] > records[1]["score"] + 2  # 4.75 against -0.5


@pytest.mark.parametrize(
    "cell, message",
    [
        ("abc", "has score='abc', which is not a finite number"),
        ("", "has no value in score"),  # only an empty cell is missing
        ("n/a", "has score='n/a', which is not a finite number"),  # the texts NA, n/a, null ... are texts
        ("inf", "has score=inf, which is not a finite number"),
    ],
)
def test_non_numeric_regression_targets_name_the_file_row_and_value(scores_files, tmp_path, cell, message):
    lines = scores_files["train"].read_text().splitlines()
    cells = lines[5].split("\t")
    cells[2] = cell
    lines[5] = "\t".join(cells)
    scores_files["train"].write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"data.tasks.sim.train: row 5 of '.*scores_train.tsv' .*{message}"):
        run_cli(regression_args(scores_files, tmp_path / "run"), run=False)


# -- multi-label classification ------------------------------------------------------------------------
def test_multi_label_metrics_match_their_definitions_at_the_threshold():
    torch.manual_seed(0)
    model = TrunkModule({"m": MultiLabelClassification(head_dropout=0.0, threshold=0.5)}, trunk=TINY,
                        task_info={"m": {"label_names": ["w", "x", "y", "z"]}}).eval()
    objective = model.objectives["m"]
    with torch.no_grad():
        objective.head.classifier.bias.copy_(torch.tensor([0.3, -0.2, 0.0, 0.1]))  # a mix of yes and no at random
    g = torch.Generator().manual_seed(2)
    gold, predicted = [], []
    with torch.no_grad():
        for _ in range(3):
            batch = {
                "task": "m",
                "input_ids": torch.randint(5, 60, (20, 8), generator=g),
                "attention_mask": torch.ones(20, 8, dtype=torch.long),
                "labels": (torch.rand(20, 4, generator=g) < 0.4).float(),
            }
            objective.loss(model.trunk, batch, "val")
            gold += batch["labels"].long().tolist()
            predicted += (objective(model.trunk, batch).sigmoid() >= 0.5).long().tolist()
    values = objective.compute_metrics("val")
    flat_gold, flat_predicted = [v for row in gold for v in row], [v for row in predicted for v in row]
    assert 0 < sum(flat_predicted) < len(flat_predicted)
    assert values["f1_micro"].item() == pytest.approx(f1(flat_gold, flat_predicted, 1), abs=1e-6)
    per_label = [f1([r[k] for r in gold], [r[k] for r in predicted], 1) for k in range(4)]
    assert values["f1_macro"].item() == pytest.approx(sum(per_label) / 4, abs=1e-6)
    assert values["exact_match"].item() == pytest.approx(sum(g == p for g, p in zip(gold, predicted)) / len(gold))


def multi_label_args(files, root, *extra) -> list[str]:
    return tiny_run_args(
        files,
        root,
        "topics",
        [
            "--model=trunk.tasks.MultiLabelClassification",
            "--data=trunk.datamodules.MultiLabelTextData",
            "--model.head_dropout=0.0",
        ],
        *extra,
    )


def test_multi_label_learns_sets_of_topics_through_the_cli(topics_files, tmp_path):
    fit = run_cli(["fit", *multi_label_args(topics_files, tmp_path / "run", "--trainer.max_epochs=10")])
    best = fit.trainer.checkpoint_callback.best_model_path
    tested = run_cli(
        ["test", *multi_label_args(topics_files, tmp_path / "run"), f"--ckpt_path={best}"]
    ).trainer.callback_metrics
    assert tested["test/topics/f1_micro"] > 0.9 and tested["test/topics/exact_match"] > 0.7
    strict = run_cli(
        ["test", *multi_label_args(topics_files, tmp_path / "run", "--model.threshold=0.999"), f"--ckpt_path={best}"]
    ).trainer.callback_metrics  # an inference option: the same weights, another threshold
    assert strict["test/topics/f1_micro"] < tested["test/topics/f1_micro"]
    [record] = load(best).predict(["owl snow"])
    assert {"animal", "weather"} <= set(record["labels"]) and "sport" not in record["labels"]
    assert all(p >= 0.5 for p in record["labels"].values()) and list(record["labels"].values()) == sorted(
        record["labels"].values(), reverse=True
    )
    assert set(record["probs"]) == {"animal", "food", "sport", "weather"}


def test_multi_label_ids_stand_for_configured_names_and_unknown_labels_are_named(tmp_path):
    from conftest import write_rows

    rows = [{"text": "a b", "labels": "0,2"}, {"text": "c", "labels": ""}, {"text": "d", "labels": "1"}]
    member = MultiLabelTextData(train=str(write_rows(tmp_path / "ids.csv", rows)), label_names=["anger", "joy", "fear"])
    assert member.label_sets(member.raw("train"), "train") == [["anger", "fear"], [], ["joy"]]
    assert member.targets(member.raw("train"), "train") == [[1, 0, 1], [0, 0, 0], [0, 1, 0]]
    rows[2]["labels"] = "joy,envy"
    named = MultiLabelTextData(
        train=str(write_rows(tmp_path / "names.csv", rows)), label_names=["anger", "joy", "fear"]
    )
    with pytest.raises(ValueError, match=r"row 3 has the labels \['envy'\], which are not among the label names"):
        named.raw("train")


# -- multiple choice -----------------------------------------------------------------------------------
def test_multiple_choice_learns_to_pick_the_candidate_of_the_asked_topic(quiz_files, tmp_path):
    args = tiny_run_args(
        quiz_files,
        tmp_path / "run",
        "quiz",
        [
            "--model=trunk.tasks.MultipleChoice",
            "--data=trunk.datamodules.MultipleChoiceData",
            "--model.head_dropout=0.0",
        ],
        "--trainer.max_epochs=12",
        "--model.pooling=mean",
        "--model.optimizer.lr=3e-3",
    )
    fit = run_cli(["fit", *args])
    best = fit.trainer.checkpoint_callback.best_model_path
    tested = run_cli(["test", *args, f"--ckpt_path={best}"]).trainer.callback_metrics
    # chance is 0.25-0.33; this tiny model reaches 1.0 (at lr 1e-3 it stayed at chance on some vocabularies within 12
    # epochs)
    assert tested["test/quiz/acc"] > 0.6
    [record] = load(best).predict(
        [{"context": "which of these is about weather ?", "choices": ["golf", "snow", "bread"]}]
    )
    assert (
        record["choices"] == ["golf", "snow", "bread"] and record["answer"] == record["choices"][record["answer_index"]]
    )
    assert sum(record["probs"]) == pytest.approx(1.0, abs=1e-5)


def test_multiple_choice_scores_only_each_rows_own_candidates():
    torch.manual_seed(0)
    model = TrunkModule({"q": MultipleChoice(head_dropout=0.0)}, trunk=TINY, task_info={"q": {}}).eval()
    g = torch.Generator().manual_seed(0)
    batch = {
        "task": "q",
        "input_ids": torch.randint(5, 60, (7, 6), generator=g),
        "attention_mask": torch.ones(7, 6, dtype=torch.long),
        "choice_counts": torch.tensor([4, 3]),
        "labels": torch.tensor([3, 2]),
    }
    scores = model.objectives["q"](model.trunk, batch)
    alone = (
        model.objectives["q"]
        .head(model.trunk(batch["input_ids"], batch["attention_mask"]), batch["attention_mask"])
        .squeeze(-1)
    )
    assert scores.shape == (2, 4) and scores[1, 3] == float("-inf")
    assert torch.allclose(scores[0], alone[:4]) and torch.allclose(scores[1, :3], alone[4:])
    expected = F.cross_entropy(scores, batch["labels"])
    assert model.objectives["q"].loss(model.trunk, batch, "val").item() == pytest.approx(expected.item())


def test_multiple_choice_reads_packed_choices_letters_and_texts_and_names_bad_rows(tmp_path):
    from conftest import write_rows

    from trunk.datamodules.multiple_choice import MultipleChoiceData

    rows = [{"stem": "The sun is", "packed": "(A) cold (B) a star (C) a planet", "key": "B"},
            {"stem": "Water is", "packed": "(A) wet (B) dry", "key": "wet"},
            {"stem": "Owls", "packed": "(A) fly (B) swim (C) dig (D) sing", "key": "3"}]
    member = MultipleChoiceData(
        train=str(write_rows(tmp_path / "obqa.tsv", rows)),
        context_column="stem",
        choices_column="packed",
        label_column="key",
    )
    ds = member.raw("train")
    candidates = member.candidates(ds, "train")
    assert candidates[0] == (["cold", "a star", "a planet"], ["A", "B", "C"])
    assert member.answers(ds, "train", candidates) == [1, 0, 3]  # a label, a text, a position
    rows[1]["key"] = "E"
    bad = MultipleChoiceData(
        train=str(write_rows(tmp_path / "bad.tsv", rows)),
        context_column="stem",
        choices_column="packed",
        label_column="key",
    )
    with pytest.raises(
        ValueError, match=r"row 2 has the answer 'E', which is none of its candidates' labels \['A', 'B'\]"
    ):
        bad.answers(bad.raw("train"), "train", bad.candidates(bad.raw("train"), "train"))
    rows[1]["packed"] = "wet"
    one = MultipleChoiceData(
        train=str(write_rows(tmp_path / "one.tsv", rows)),
        context_column="stem",
        choices_column="packed",
        label_column="key",
    )
    with pytest.raises(ValueError, match="row 2 has 0 candidate answer"):
        one.candidates(one.raw("train"), "train")


def test_an_empty_candidate_column_keeps_every_other_candidate_at_its_position(tmp_path):
    """SWAG's layout (ending0-3, the answer a position or a letter) with an empty cell: the candidate is dropped, the
    answer still points at the candidate it named, and an answer naming the empty one is an error naming the row."""
    from conftest import write_rows

    from trunk.datamodules.multiple_choice import MultipleChoiceData

    rows = [{"ctx": "The sun is", "e0": "cold", "e1": "", "e2": "a star", "e3": "a planet", "key": "2"},
            {"ctx": "Owls", "e0": "fly", "e1": "swim", "e2": "", "e3": "sing", "key": "D"},
            {"ctx": "Water is", "e0": "dry", "e1": "wet", "e2": "hot", "e3": "", "key": "1"}]

    def member(name: str) -> MultipleChoiceData:
        return MultipleChoiceData(train=str(write_rows(tmp_path / name, rows)), context_column="ctx",
                                  choice_columns=["e0", "e1", "e2", "e3"], label_column="key")

    data = member("swag.csv")
    ds = data.raw("train")
    candidates = data.candidates(ds, "train")
    assert candidates[0] == (["cold", "a star", "a planet"], ["A", "C", "D"])
    answers = data.answers(ds, "train", candidates)
    assert [texts[i] for (texts, _), i in zip(candidates, answers)] == ["a star", "sing", "wet"]
    rows[0]["key"] = "1"  # the empty candidate
    bad = member("bad.csv")
    with pytest.raises(ValueError, match=r"row 1 has the answer '1', which is none of its candidates' labels "
                                         r"\['A', 'C', 'D'\]"):
        bad.answers(bad.raw("train"), "train", bad.candidates(bad.raw("train"), "train"))


# -- every kind in one run -------------------------------------------------------------------------------
def test_the_new_kinds_train_jointly_with_classification_and_ner_under_ddp(
    sentiment_files, ner_files, scores_files, topics_files, quiz_files, squad_files, tmp_path
):
    """Regression, multi-label, multiple choice and extractive QA beside classification and NER on one trunk, on 2 gloo
    processes; then the checkpoint validated on 2 processes equals 1 process, task by task."""
    import os
    import subprocess
    import sys

    from conftest import REPO
    from test_multitask import TRUNK, ner_task, sentiment_task, task

    args = [
        *TRUNK,
        *sentiment_task(sentiment_files),
        *ner_task(ner_files),
        *task("sim", "SequenceRegression", "TextRegressionData", scores_files, 16),
        "--data.tasks.sim.text_pair_column=pair",
        "--data.tasks.sim.label_column=score",
        *task("topics", "MultiLabelClassification", "MultiLabelTextData", topics_files, 16),
        *task("quiz", "MultipleChoice", "MultipleChoiceData", quiz_files, 8),
        *task("qa", "ExtractiveQuestionAnswering", "QuestionAnsweringData", squad_files, 8),
        "--data.tasks.qa.max_length=40",
        "--data.tasks.qa.doc_stride=8",
        "--data.tokenizer_vocab_size=300",
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=20",
        "--trainer.precision=32-true",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
        "--seed_everything=0",
    ]
    ddp = ["--config", str(REPO / "configs/trainer/ddp_cpu.yaml")]
    fit = subprocess.run(
        [sys.executable, "-m", "trunk.cli", "fit", *args, *ddp],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=os.environ.copy(),
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    ckpt = next((tmp_path / "run").rglob("*.ckpt"))
    one = run_cli(["validate", *args, "--trainer.devices=1", f"--ckpt_path={ckpt}"]).trainer.callback_metrics
    two = subprocess.run(
        [sys.executable, "-m", "trunk.cli", "validate", *args, *ddp, f"--ckpt_path={ckpt}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "COLUMNS": "200"},
    )  # a rich table prints numbers whole
    assert two.returncode == 0, two.stderr[-3000:]
    names = [
        "val/sentiment/acc",
        "val/ner/f1",
        "val/sim/pearson",
        "val/sim/mse",
        "val/topics/f1_micro",
        "val/quiz/acc",
        "val/qa/f1",
        "val/qa/exact_match",
        "val/score",
    ]
    # each row counts once on 2 ranks as on one (splits of odd sizes: tests/training/test_multitask.py)
    from conftest import logged_metrics

    logged = logged_metrics(tmp_path / "run" / "validate")  # the 2-process validation's, whole
    for name in (names):
        # 20 steps leave the regressor's outputs nearly constant: their Pearson is a ratio of tiny moments, which
        # rounding in differently padded batches moves in the fourth digit
        tolerance = {"rel": 1e-2} if name == "val/sim/pearson" else {"abs": 1e-5}
        if name == "val/score":  # the mean of the tasks' primaries, the Pearson among them
            tolerance = {"abs": 1e-5 + 1e-2 * abs(one["val/sim/pearson"].item()) / 6}
        assert logged[name] == pytest.approx(one[name].item(), **tolerance), name
    shares = [
        one["val/sentiment/acc"],
        one["val/ner/f1"],
        one["val/sim/pearson"],
        one["val/topics/f1_micro"],
        one["val/quiz/acc"],
        one["val/qa/f1"],
    ]
    assert one["val/score"].item() == pytest.approx(torch.stack(shares).mean().item(), abs=1e-6)


# -- extractive question answering -----------------------------------------------------------------------
@pytest.mark.parametrize("prediction, golds, em, f1_", [
    ("the Eiffel Tower", ["Eiffel tower"], 1.0, 1.0),  # articles, case
    ("Eiffel Tower!", ["the Eiffel Tower."], 1.0, 1.0),  # punctuation
    ("in Paris France", ["Paris"], 0.0, 0.5),  # precision 1/3, recall 1: F1 = 2 * (1/3) / (4/3)
    ("London", ["Paris", "London"], 1.0, 1.0),  # the best over the gold answers
    ("", [], 1.0, 1.0),  # SQuAD 2.0: no answer against no answer
    ("Paris", [], 0.0, 0.0),
    ("a an the", ["the"], 1.0, 1.0),  # both normalise to nothing
])
def test_squad_exact_match_and_f1_follow_the_official_evaluation_script(prediction, golds, em, f1_):
    from trunk.tasks.objectives.question_answering import best_scores

    assert best_scores(prediction, golds) == (pytest.approx(em), pytest.approx(f1_))


def qa_args(files, root, *extra) -> list[str]:
    return tiny_run_args(
        files,
        root,
        "qa",
        [
            "--model=trunk.tasks.ExtractiveQuestionAnswering",
            "--data=trunk.datamodules.QuestionAnsweringData",
            "--data.doc_stride=8",
        ],
        "--data.max_length=40",
        *extra,
    )


def test_question_answering_learns_templated_questions_across_windows(squad_files, tmp_path):
    fit = run_cli(
        ["fit", *qa_args(squad_files, tmp_path / "run", "--trainer.max_epochs=12", "--model.optimizer.lr=2e-3")]
    )
    data = fit.datamodule.tasks["qa"]
    data.prepare("test")
    assert max(len(w) for w in data._encoded["test"]["input_ids"]) > 1  # long contexts: several windows per question
    best = fit.trainer.checkpoint_callback.best_model_path
    tested = run_cli(["test", *qa_args(squad_files, tmp_path / "run"), f"--ckpt_path={best}"]).trainer.callback_metrics
    assert tested["test/qa/exact_match"] > 0.9 and tested["test/qa/f1"] >= tested["test/qa/exact_match"]
    context = ("left deal good . Greta works at Initech . on then the . Jonas lives in Buenos Aires . then Monday . "
               "Anna works at Hooli .")
    [record] = load(best).predict([{"question": "where does Jonas live ?", "context": context}])
    assert record["answer"] == "Buenos Aires"


def test_question_answering_data_windows_misaligned_answers_and_no_room(tmp_path):
    import json

    from trunk.datamodules import QuestionAnsweringData

    rows = [
        {
            "id": "a",
            "question": "where does Anna live ?",
            "context": "the deal was good . " * 6 + "Anna lives in Oslo .",
            "answers": {"text": ["Oslo"], "answer_start": [134]},
        },
        {
            "id": "b",
            "question": "where ?",
            "context": "Boris works at Hooli .",
            "answers": {"text": ["Hooli"], "answer_start": [3]},
        },
    ]
    path = tmp_path / "qa.json"
    path.write_text(
        json.dumps(
            {
                "data": [
                    {
                        "title": "t",
                        "paragraphs": [
                            {
                                "context": r["context"],
                                "qas": [
                                    {
                                        "id": r["id"],
                                        "question": r["question"],
                                        "answers": [
                                            {"text": t, "answer_start": s}
                                            for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])
                                        ],
                                    }
                                ],
                            }
                            for r in rows
                        ],
                    }
                ]
            }
        )
    )
    member = standalone_qa(QuestionAnsweringData(train=str(path), max_length=24, doc_stride=4))
    with pytest.warns(
        UserWarning, match=r"1 answer\(s\) are not at their answer_start in the context \(e.g. \['b'\]\)"
    ):
        examples = member.encode(member.raw("train"), "train")
    first, second = examples
    assert len(first["input_ids"]) > 1 and second["start"] == [-100]  # the misaligned answer is not trained on
    window = next(w for w, s in enumerate(first["start"]) if s > 0)  # the one window that holds "Oslo" whole
    span = (first["span_starts"][window][first["start"][window]], first["span_ends"][window][first["end"][window]])
    assert rows[0]["context"][span[0] : span[1]] == "Oslo"
    long_question = QuestionAnsweringData(train=str(path), max_length=12, doc_stride=2)
    standalone_qa(long_question)
    with pytest.raises(
        ValueError, match=r"row 1's question takes .* tokens, leaving .* for the context at max_length=12"
    ):
        long_question.encode_row("where does the person named in the text live these days ?", "x", None, "train", 0)


def standalone_qa(member):
    from conftest import standalone

    return standalone(member, "qa", tokenizer_vocab_size=200)


def test_degenerate_predictions_of_every_pooled_kind_are_warned_of_and_healthy_ones_not():
    """A multi-label model that never passes its threshold, a regressor that predicts about the mean, a classifier that
    predicts one class for all but a handful: each a warning at validation; predictions that vary are not."""
    import torch

    from trunk.core.contract import TaskSpec
    from trunk.models import TrunkConfig, build_trunk
    from trunk.tasks import MultiLabelClassification, SequenceClassification, SequenceRegression

    trunk = build_trunk(TrunkConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16))
    rng = torch.Generator().manual_seed(0)

    def built(objective, labels):
        objective.build("t", trunk, TaskSpec(label_names=labels))
        return objective

    gold = torch.randint(0, 2, (40, 3), generator=rng)
    for probs, message in ((torch.full((40, 3), 0.2), "put no label above threshold=0.5 for any of the 40"),
                           (gold * 0.9 + 0.05, None)):
        tags = built(MultiLabelClassification(), ["a", "b", "c"])
        tags.metrics("val")["label_stats"].update(probs, gold)
        warned = tags.epoch_warnings("val")
        assert (len(warned) == 1 and message in warned[0]) if message else warned == []
    targets = torch.rand(40, generator=rng) * 5
    for preds, flat in ((2.5 + torch.randn(40, generator=rng) * 0.01, True), (targets + 0.3, False)):
        score = built(SequenceRegression(), ["score"])
        score.metrics("val")["spearman"].update(preds, targets)
        assert any("barely vary" in m and "predicts about the mean" in m for m in score.epoch_warnings("val")) == flat
    labels = torch.tensor([0] * 24 + [1] * 16)
    for predicted, near in ((torch.tensor([0] * 39 + [1]), True), (labels, False)):
        classes = built(SequenceClassification(), ["neg", "pos"])
        classes.metrics("val")["confusion"].update(predicted, labels)
        expected = "predicted 'neg' for 98% of the 40 validation examples (the labels have 60% of it)"
        assert any(expected in m for m in classes.epoch_warnings("val")) == near
