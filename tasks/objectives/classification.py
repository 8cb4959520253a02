"""What sequence and image classification share: one label per input from a pooled trunk vector, accuracy and
macro-F1, a confusion matrix at validation, label and probabilities per prediction."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score
from trunk.core.contract import TaskSpec
from trunk.models import SequenceClassificationHead, Trunk, TrunkConfig, init_weights
from trunk.tasks.objectives.base import Objective


class Classification(Objective):
    """Base of ``SequenceClassification`` and ``ImageClassification``: a head on the pooled trunk output.

    Args:
        pooling: ``cls`` (the first token) or ``mean`` (average over real tokens).
        head_dropout: dropout inside the classification head.
    """

    label_keys = ("head.classifier.weight", "head.classifier.bias")

    def __init__(self, pooling: Literal["cls", "mean"] = "cls", head_dropout: float = 0.1, **config) -> None:
        super().__init__(pooling=pooling, head_dropout=head_dropout, **config)
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}.")
        self.pooling, self.head_dropout = pooling, head_dropout

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        if not self.label_names or len(self.label_names) < 2:
            raise ValueError(f"Task '{self.name}': classification needs at least 2 labels, got {self.label_names!r}.")
        self.head = SequenceClassificationHead(cfg.d_model, len(self.label_names), self.pooling, self.head_dropout)
        init_weights(self.head, cfg.init_std)

    def make_metrics(self, stage: str) -> dict[str, Metric]:
        n = len(self.label_names)
        metrics = {"acc": MulticlassAccuracy(n, average="micro"), "f1": MulticlassF1Score(n, average="macro")}
        if stage == "val":  # (gold, predicted) counts: written by PredictionSamples, not logged as a scalar
            metrics["confusion"] = MulticlassConfusionMatrix(n)
        return metrics

    def forward(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """(B, num_labels) logits."""
        mask = batch.get("attention_mask")
        return self.head(self.encode(trunk, batch), mask)

    def loss(self, trunk: Trunk, batch: dict, stage: str) -> torch.Tensor:
        logits = self(trunk, batch)
        for metric in self.metrics(stage).values():
            metric.update(logits.argmax(-1), batch["labels"])
        return F.cross_entropy(logits.float(), batch["labels"])

    def predict(self, trunk: Trunk, batch: dict) -> list[dict]:
        probs = self(trunk, batch).float().softmax(-1)
        records = []
        for i, row in enumerate(probs.tolist()):
            best = max(range(len(row)), key=row.__getitem__)
            record = {"label": self.label_names[best], "probs": dict(zip(self.label_names, row))}
            for key in ("text", "id"):  # what the example was: its text, or its image's file / index
                if key in batch:
                    record = {key: batch[key][i], **record}
            records.append(record)
        return records

    def samples(self, trunk: Trunk, batch: dict) -> list[dict]:
        records = []
        for record, gold in zip(self.predict(trunk, batch), batch["labels"].tolist()):
            predicted = record["label"]
            records.append({**{k: v for k, v in record.items() if k in ("text", "id")}, "gold": self.label_names[gold],
                            "predicted": predicted, "probability": round(record["probs"][predicted], 4)})
        return records
