"""What sequence and image classification share: one label per input from a pooled trunk vector, accuracy,
macro-F1 and Matthews correlation (and the F1 of a positive class), class weights for imbalanced labels, a
confusion matrix at validation, label and probabilities per prediction."""

from __future__ import annotations

from typing import Literal

import torch
from torchmetrics import Metric
from torchmetrics.classification import (
    BinaryF1Score,
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassMatthewsCorrCoef,
)

from trunk.core.contract import TaskSpec
from trunk.models import Pooling, Trunk, TrunkConfig
from trunk.tasks.objectives.base import cross_entropy, soft_cross_entropy
from trunk.tasks.objectives.pooled import PooledObjective

CLASSIFICATION_METRICS = ("acc", "f1_macro", "mcc", "f1_positive")


class Classification(PooledObjective):
    """Base of ``SequenceClassification`` and ``ImageClassification``: a head on the pooled trunk output.

    Metrics: ``acc``, ``f1_macro`` (the mean of every class's F1), ``mcc`` (Matthews correlation, in
    [-1, 1]: 0 for a model that predicts one class for everything), and with ``positive_label``
    ``f1_positive``, the F1 of that class (paraphrase-style tasks report it).

    Args:
        pooling: ``cls`` (the first token), ``mean`` (average over real tokens), ``max`` (each channel's
            maximum over real tokens, as a CNN pools) or ``attention`` (a learned probe attends over them).
        head_dropout: dropout inside the classification head.
        primary_metric: the metric that stands for the task in ``val/score`` and on the progress bar.
        positive_label: the label whose F1 is ``f1_positive``.
        class_weights: weights of the classes in the loss, for imbalanced labels: ``balanced`` (each class
            weighted by n_examples / (n_classes x its count) in the training split, as scikit-learn's), or one
            number per label in ``label_names`` order. None: every example counts the same.
        label_smoothing: the share of each target's probability spread over the other labels (0.1 is common): a
            regulariser that keeps a model trained on few examples from growing over-confident.
        pooler: a BERT-style pooler (dense + tanh) before the output layer; false: the output layer reads the pooled
            vector (a head d_model times smaller: what a delta on a frozen trunk trains beside it).
        pooler_norm: the pooler's output normed with the trunk's norm (ModernBERT's head, which ``trunk export --format
            hf`` then writes as ``ModernBertForSequenceClassification``).
    """

    def __init__(
        self,
        pooling: Pooling = "cls",
        head_dropout: float = 0.1,
        primary_metric: Literal["acc", "f1_macro", "mcc", "f1_positive"] = "acc",
        positive_label: str | None = None,
        class_weights: Literal["balanced"] | list[float] | None = None,
        label_smoothing: float = 0.0,
        pooler: bool = True,
        pooler_norm: bool = False,
        **config,
    ) -> None:
        super().__init__(pooling, head_dropout, pooler, pooler_norm, primary_metric=primary_metric,
                         positive_label=positive_label, class_weights=class_weights, label_smoothing=label_smoothing,
                         **config)
        if primary_metric not in CLASSIFICATION_METRICS:
            raise ValueError(f"primary_metric={primary_metric!r}: choose one of {list(CLASSIFICATION_METRICS)}.")
        if primary_metric == "f1_positive" and positive_label is None:
            raise ValueError("primary_metric=f1_positive needs positive_label: the label whose F1 it is.")
        if isinstance(class_weights, str) and class_weights != "balanced":
            raise ValueError(f"class_weights={class_weights!r}: give 'balanced' or one weight per label.")
        self.primary = primary_metric
        self.positive_label, self.class_weights, self.label_smoothing = positive_label, class_weights, label_smoothing

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        if not self.label_names or len(self.label_names) < 2:
            raise ValueError(f"Task '{self.name}': classification needs at least 2 labels, got {self.label_names!r}.")
        if self.positive_label is not None and self.positive_label not in self.label_names:
            raise ValueError(
                f"Task '{self.name}': positive_label={self.positive_label!r} is not one of its labels "
                f"{self.label_names}."
            )
        super().build_head(cfg, trunk, info)
        # Decided by this run's data (not stored: a checkpoint's task_info holds the counts it came from).
        self.register_buffer("class_weight", self.weights_of(info), persistent=False)

    def weights_of(self, info: TaskSpec) -> torch.Tensor | None:
        if self.class_weights is None:
            return None
        n = len(self.label_names)
        if self.class_weights == "balanced":
            counts = (info.statistics or {}).get("label_counts")
            if counts is None:
                raise ValueError(
                    f"Task '{self.name}': class_weights=balanced needs the training split's label counts, which this "
                    "task's data does not report. Give one weight per label instead."
                )
            counts = torch.tensor(counts, dtype=torch.float)
            return counts.sum() / (n * counts.clamp(min=1))
        if len(self.class_weights) != n or not all(w >= 0 for w in self.class_weights):
            raise ValueError(
                f"Task '{self.name}': class_weights has {len(self.class_weights)} values, but the task has {n} labels "
                f"{self.label_names}: give one non-negative weight per label, in that order."
            )
        return torch.tensor(self.class_weights, dtype=torch.float)

    def make_metrics(self, stage: str) -> dict[str, Metric]:
        n = len(self.label_names)
        metrics = {"acc": MulticlassAccuracy(n, average="micro"), "f1_macro": MulticlassF1Score(n, average="macro"),
                   "mcc": MulticlassMatthewsCorrCoef(n)}
        if self.positive_label is not None:
            metrics["f1_positive"] = BinaryF1Score()
        if stage == "val":  # (gold, predicted) counts: written by PredictionSamples, not logged as a scalar
            metrics["confusion"] = MulticlassConfusionMatrix(n)
        return metrics

    def loss(self, trunk: Trunk, batch: dict, stage: str, output=None) -> torch.Tensor:
        logits = self(trunk, batch) if output is None else output
        predicted, labels = logits.argmax(-1), batch["labels"]
        for name, metric in self.metrics(stage).items():
            if name == "f1_positive":
                positive = self.label_names.index(self.positive_label)
                metric.update((predicted == positive).long(), (labels == positive).long())
            else:
                metric.update(predicted, labels)
        return cross_entropy(logits, labels, self.label_smoothing, self.class_weight)

    def soft_targets(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        return self(trunk, batch).float().softmax(-1)  # (B, labels)

    def distill_loss(self, output, targets: torch.Tensor, batch: dict, temperature: float) -> torch.Tensor:
        return soft_cross_entropy(output, targets, temperature)

    def epoch_warnings(self, stage: str) -> list[str]:
        confusion = self.confusion(stage)
        if confusion is None or confusion.sum() < 2:
            return []
        total, predicted, gold = int(confusion.sum()), confusion.sum(0).float(), confusion.sum(1).float()
        top = int(predicted.argmax())
        label, share, truth = self.label_names[top], float(predicted[top]) / total, float(gold[top]) / total
        if (predicted > 0).sum() != 1:  # near-constant: all but a handful, far more than the labels hold
            if total < 20 or share < 0.95 or share - truth < 0.1:
                return []
            return [
                f"Task '{self.name}': the model predicted '{label}' for {share:.0%} of the {total} validation examples "
                f"(the labels have {truth:.0%} of it): it barely tells the classes apart. On imbalanced labels set "
                f"model.tasks.{self.name}.init_args.class_weights=balanced, and pick checkpoints by mcc or f1_macro."
            ]
        return [
            f"Task '{self.name}': the model predicted '{label}' for every one of the {int(confusion.sum())} validation "
            "examples, so its accuracy is the share of that label. On imbalanced labels set "
            f"model.tasks.{self.name}.init_args.class_weights=balanced, and pick checkpoints by a metric such a model "
            "cannot win (primary_metric: mcc or f1_macro)."
        ]

    def records(self, batch: dict, logits: torch.Tensor) -> list[dict]:
        probs = logits.float().softmax(-1)
        records = []
        for i, row in enumerate(probs.tolist()):
            best = max(range(len(row)), key=row.__getitem__)
            records.append(self.record(batch, i, label=self.label_names[best], probs=dict(zip(self.label_names, row))))
        return records

    def samples(self, trunk: Trunk, batch: dict) -> list[dict]:
        records = []
        for record, gold in zip(self.predict(trunk, batch), batch["labels"].tolist()):
            predicted = record["label"]
            records.append({**{k: v for k, v in record.items() if k in ("text", "id")}, "gold": self.label_names[gold],
                            "predicted": predicted, "probability": round(record["probs"][predicted], 4)})
        return records
