"""What every one-answer-per-input kind shares: a head on one pooled trunk vector (classification,
multi-label classification, regression)."""

from __future__ import annotations

import torch

from trunk.core.contract import TaskSpec
from trunk.models import Pooling, SequenceClassificationHead, Trunk, TrunkConfig, check_pooling
from trunk.tasks.objectives.base import Objective


class PooledObjective(Objective):
    """A BERT-style head (pooler + linear layer) on the [CLS] vector or the mean of the token vectors,
    with one output per label (``label_names``: classes, or the names of regression targets).

    Args:
        pooling: ``cls`` (the first token), ``mean`` (average over real tokens), ``max`` (each channel's
            maximum over real tokens, as a CNN pools) or ``attention`` (a learned probe attends over the tokens, then
            an MLP: SigLIP's head, which a SigLIP checkpoint's starts).
        head_dropout: dropout inside the head.
        pooler: a BERT-style pooler (dense + tanh) before the output layer; false: the output layer reads the pooled
            vector (a head d_model times smaller: what a delta on a frozen trunk trains beside it).
        pooler_norm: the pooler's output normed with the trunk's norm (ModernBERT's head: dense, activation, norm),
            so that ``trunk export --format hf`` can write a ModernBERT trunk's head as ``ModernBertFor…``.
    """

    label_keys = ("head.classifier.weight", "head.classifier.bias")
    onnx_output = "logits"  # (batch, labels)
    raw_input_key, targets_by_label = "text", True

    def __init__(self, pooling: Pooling = "cls", head_dropout: float = 0.1, pooler: bool = True,
                 pooler_norm: bool = False, **config) -> None:
        super().__init__(pooling=pooling, head_dropout=head_dropout, pooler=pooler, pooler_norm=pooler_norm, **config)
        check_pooling(pooling)
        self.pooling, self.head_dropout, self.pooler, self.pooler_norm = pooling, head_dropout, pooler, pooler_norm

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        if self.pooling == "cls" and self.stem == "image" and not cfg.cls_token:
            raise ValueError(f"Task '{self.name}': pooling='cls' reads the [CLS] token, which this trunk's image stem "
                             "does not have (cls_token: false, as SigLIP's). Use pooling: attention (SigLIP's own "
                             "head, started from the pretrained one) or mean.")
        self.head = SequenceClassificationHead.for_trunk(cfg, len(self.label_names), self.pooling, self.head_dropout,
                                                         self.pooler, self.pooler_norm)

    def forward(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """(B, len(label_names)) outputs."""
        return self.head(self.encode(trunk, batch), batch.get("attention_mask"))

    @staticmethod
    def record(batch: dict, i: int, **answer) -> dict:
        """A prediction record: what example ``i`` was (its text, or its image's file / index), then the answer."""
        return {**{key: batch[key][i] for key in ("text", "id") if key in batch}, **answer}
