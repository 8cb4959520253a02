"""Sequence classification: one label per text (or text pair), from a pooled trunk vector."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from trunk.models import SequenceClassificationHead, init_weights
from trunk.tasks.base import TrunkTask


class SequenceClassification(TrunkTask):
    """Classify a sequence from its [CLS] vector or the mean of its token vectors.

    Args:
        label_names: class names in label-id order; linked from the datamodule by the CLI.
        pooling: ``cls`` (the first token) or ``mean`` (average over real tokens).
        head_dropout: dropout inside the classification head.
        **kwargs: see ``TrunkTask``: ``trunk`` (architecture), ``optimizer``, ``init_from`` (a
            pretrained trunk directory) and ``finetune`` (freezing, layer-wise learning rates).
    """

    def __init__(
        self,
        label_names: list[str],
        pooling: Literal["cls", "mean"] = "cls",
        head_dropout: float = 0.1,
        **kwargs,
    ) -> None:
        if len(label_names) < 2:
            raise ValueError(f"Classification needs at least 2 labels, got {label_names!r}.")
        self.label_names = list(label_names)
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.head = SequenceClassificationHead(self.trunk_config.d_model, len(label_names), pooling, head_dropout)
        init_weights(self.head, self.trunk_config.init_std)

    def make_metrics(self) -> MetricCollection:
        n = len(self.label_names)
        return MetricCollection({"acc": MulticlassAccuracy(n, average="micro"), "f1": MulticlassF1Score(n, average="macro")})

    input_key = "input_ids"  # the batch entry the trunk reads (images: pixel_values)

    def forward(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids (or what the stem takes) -> (B, num_labels) logits."""
        return self.head(self.trunk(inputs, attention_mask), attention_mask)

    def step(self, batch: dict, stage: str) -> torch.Tensor:
        logits = self(batch[self.input_key], batch.get("attention_mask"))
        loss = F.cross_entropy(logits.float(), batch["labels"])
        self.metrics(stage).update(logits.argmax(-1), batch["labels"])
        return loss

    def predict_step(self, batch: dict, batch_idx: int) -> list[dict]:
        probs = self(batch[self.input_key], batch.get("attention_mask")).float().softmax(-1)
        records = []
        for i, row in enumerate(probs.tolist()):
            best = max(range(len(row)), key=row.__getitem__)
            record = {"label": self.label_names[best], "probs": dict(zip(self.label_names, row))}
            for key in ("text", "id"):  # what the example was: its text, or its image's file / index
                if key in batch:
                    record = {key: batch[key][i], **record}
            records.append(record)
        return records
