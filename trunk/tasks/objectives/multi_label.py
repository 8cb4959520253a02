"""Multi-label classification: any number of labels per text (or text pair), each a yes/no from a pooled trunk
vector."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.classification import MultilabelExactMatch, MultilabelF1Score, MultilabelStatScores

from trunk.core.contract import TaskSpec
from trunk.models import Pooling, Trunk, TrunkConfig
from trunk.tasks.objectives.pooled import PooledObjective

MULTI_LABEL_METRICS = ("f1_micro", "f1_macro", "exact_match")


class MultiLabelClassification(PooledObjective):
    """One sigmoid per label on the [CLS] vector or the mean of the token vectors (binary cross-entropy, summed over
    the labels and averaged over the examples): a text may carry none, one or several labels (emotions, topics, tags).

    Metrics at ``threshold``: ``f1_micro`` (over every (example, label) decision; the primary by default),
    ``f1_macro`` (the mean of the labels' F1) and ``exact_match`` (the share of examples whose label set is
    exactly right). Predictions: ``{text, labels: {label: probability} for those at or above the threshold,
    probs: every label's}``.

    Args:
        pooling: ``cls`` (the first token), ``mean`` (average over real tokens), ``max`` (each channel's
            maximum over real tokens, as a CNN pools) or ``attention`` (a learned probe attends over them).
        head_dropout: dropout inside the head.
        threshold: a label is predicted when its probability is at least this.
        primary_metric: the metric that stands for the task in ``val/score``.
        label_smoothing: each yes/no target moved this far towards 0.5 (1 becomes 1 - s/2, 0 becomes s/2): a
            regulariser against over-confidence (0: none).
        pooler: a dense + tanh pooler before the output layer (false: the output layer reads the pooled vector).
        pooler_norm: the pooler's output normed with the trunk's norm (ModernBERT's head).
    """

    kind = "multi_label_classification"
    inference_options = ("threshold",)

    def __init__(
        self,
        pooling: Pooling = "cls",
        head_dropout: float = 0.1,
        threshold: float = 0.5,
        primary_metric: Literal["f1_micro", "f1_macro", "exact_match"] = "f1_micro",
        label_smoothing: float = 0.0,
        pooler: bool = True,
        pooler_norm: bool = False,
    ) -> None:
        super().__init__(
            pooling,
            head_dropout,
            pooler,
            pooler_norm,
            threshold=threshold,
            primary_metric=primary_metric,
            label_smoothing=label_smoothing,
        )
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}.")
        if primary_metric not in MULTI_LABEL_METRICS:
            raise ValueError(f"primary_metric={primary_metric!r}: choose one of {list(MULTI_LABEL_METRICS)}.")
        self.threshold, self.primary, self.label_smoothing = threshold, primary_metric, label_smoothing

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        if not self.label_names:
            raise ValueError(f"Task '{self.name}': multi-label classification needs its label names.")
        super().build_head(cfg, trunk, info)

    def make_metrics(self, stage: str) -> dict[str, Metric]:
        n, t = len(self.label_names), self.threshold
        return {
            "f1_micro": MultilabelF1Score(n, threshold=t, average="micro"),
            "f1_macro": MultilabelF1Score(n, threshold=t, average="macro"),
            "exact_match": MultilabelExactMatch(n, threshold=t),
            # per label (tp, fp, tn, fn, support): not logged, read by epoch_warnings
            **({"label_stats": MultilabelStatScores(n, threshold=t, average=None)} if stage == "val" else {}),
        }

    def epoch_warnings(self, stage: str) -> list[str]:
        metrics = self.metrics(stage)
        if "label_stats" not in metrics or not metrics["label_stats"].update_called:
            return []
        stats = metrics["label_stats"].compute()  # synced across processes
        predicted, examples = stats[:, 0] + stats[:, 1], int(stats[0, 0] + stats[0, 1] + stats[0, 2] + stats[0, 3])
        if int(predicted.sum()) == 0:
            return [f"Task '{self.name}': the model put no label above threshold={self.threshold} for any of the "
                    f"{examples} validation examples, so its F1 is 0 and its checkpoints cannot be told apart. Train "
                    f"longer or with a higher learning rate, or lower model.tasks.{self.name}.init_args.threshold."]
        never = [name for name, count in zip(self.label_names, predicted.tolist()) if count == 0]
        if len(never) > len(self.label_names) // 2:
            return [f"Task '{self.name}': {len(never)} of its {len(self.label_names)} labels were never predicted on "
                    f"the {examples} validation examples ({never[:8]}{' ...' if len(never) > 8 else ''})."]
        return []

    def loss(self, trunk: Trunk, batch: dict, stage: str, output=None) -> torch.Tensor:
        logits, labels = (self(trunk, batch) if output is None else output).float(), batch["labels"]
        probs, gold = logits.detach().sigmoid(), labels.long()
        for metric in self.metrics(stage).values():
            metric.update(probs, gold)
        # summed over the labels, averaged over the examples: one loss per example, as every other task's, so a joint
        # run's shared trunk hears it as loudly (the mean over GoEmotions' 28 labels scaled its pull down 28-fold and
        # cost it 16 points of macro-F1 jointly with SST-2; AdamW makes the scale moot when it trains alone)
        targets = labels.float() * (1 - self.label_smoothing) + self.label_smoothing / 2
        return F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1).mean()

    def soft_targets(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        return self(trunk, batch).float().sigmoid()  # (B, labels): each label's probability

    def distill_loss(self, output, targets: torch.Tensor, batch: dict, temperature: float) -> torch.Tensor:
        # binary cross-entropy to the teachers' probabilities less their entropy (so 0 for a student that agrees; the
        # same gradients), summed over labels as the task's own loss is
        p = targets.float().clamp(1e-7, 1 - 1e-7)
        entropy = F.binary_cross_entropy(p, p, reduction="none")
        bce = F.binary_cross_entropy_with_logits(output.float(), targets.float(), reduction="none")
        return (bce - entropy).sum(-1).mean()

    def records(self, batch: dict, logits: torch.Tensor) -> list[dict]:
        records = []
        for i, row in enumerate(logits.float().sigmoid().tolist()):
            chosen = sorted(((p, name) for name, p in zip(self.label_names, row) if p >= self.threshold), reverse=True)
            records.append(
                self.record(batch, i, labels={name: p for p, name in chosen}, probs=dict(zip(self.label_names, row)))
            )
        return records

    def samples(self, trunk: Trunk, batch: dict) -> list[dict]:
        records = []
        for record, gold in zip(self.predict(trunk, batch), batch["labels"].tolist()):
            records.append({**{k: v for k, v in record.items() if k in ("text", "id")},
                            "gold": ", ".join(name for name, g in zip(self.label_names, gold) if g),
                            "predicted": ", ".join(record["labels"])})
        return records
