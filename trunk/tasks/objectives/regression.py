"""Sequence regression: one or several real-valued targets per text (or text pair), from a pooled trunk vector."""

from __future__ import annotations

import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.regression import MeanAbsoluteError, MeanSquaredError, PearsonCorrCoef, SpearmanCorrCoef

from trunk.core.contract import TaskSpec
from trunk.models import Pooling, Trunk, TrunkConfig
from trunk.tasks.objectives.pooled import PooledObjective

REGRESSION_METRICS = ("pearson", "spearman", "mse", "mae")


class SequenceRegression(PooledObjective):
    """Predict real values (similarity scores, ratings) from the [CLS] vector or the mean of the token vectors.

    The head learns standardised targets (each minus the training split's mean, over its standard
    deviation; both stored with the model), so a target on a 0-5 or a 0-100 scale trains alike; predictions
    are mapped back to the data's scale. Metrics, on that scale: ``pearson``, ``spearman``, ``mse``, ``mae``
    (with several targets: their mean, and ``<metric>_<target>`` each). Predictions: ``{text, score}``
    (several targets: ``{text, scores: {target: value}}``).

    Args:
        pooling: ``cls`` (the first token), ``mean`` (average over real tokens), ``max`` (each channel's
            maximum over real tokens, as a CNN pools) or ``attention`` (a learned probe attends over them).
        head_dropout: dropout inside the head.
        loss: ``mse``, or ``huber`` (less pulled by outlying targets).
        huber_delta: where the Huber loss turns from squared to linear, in standard deviations of the target.
        standardize: learn standardised targets (see above); false: the raw values.
        primary_metric: the metric that stands for the task in ``val/score`` (``mse`` and ``mae`` count negated:
            lower is better).
        pooler: a dense + tanh pooler before the output layer (false: the output layer reads the pooled vector).
        pooler_norm: the pooler's output normed with the trunk's norm (ModernBERT's head).
    """

    kind = "sequence_regression"
    lower_is_better = frozenset({"loss", "mse", "mae"})
    label_keys = (*PooledObjective.label_keys, "target_mean", "target_std")

    def __init__(self, pooling: Pooling = "cls", head_dropout: float = 0.1, loss: Literal["mse", "huber"] = "mse",
                 huber_delta: float = 1.0, standardize: bool = True,
                 primary_metric: Literal["pearson", "spearman", "mse", "mae"] = "pearson", pooler: bool = True,
                 pooler_norm: bool = False) -> None:
        super().__init__(
            pooling,
            head_dropout,
            pooler,
            pooler_norm,
            loss=loss,
            huber_delta=huber_delta,
            standardize=standardize,
            primary_metric=primary_metric,
        )
        if loss not in ("mse", "huber"):
            raise ValueError(f"loss must be 'mse' or 'huber', got {loss!r}.")
        if not huber_delta > 0:
            raise ValueError(f"huber_delta must be > 0, got {huber_delta}.")
        if primary_metric not in REGRESSION_METRICS:
            raise ValueError(f"primary_metric={primary_metric!r}: choose one of {list(REGRESSION_METRICS)}.")
        self.loss_kind, self.huber_delta, self.standardize, self.primary = (
            loss,
            huber_delta,
            standardize,
            primary_metric,
        )

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        if not self.label_names:
            raise ValueError(
                f"Task '{self.name}': regression needs the names of its targets (the data's label columns)."
            )
        super().build_head(cfg, trunk, info)
        n = len(self.label_names)
        statistics = info.statistics or {}
        mean = statistics.get("target_mean") if self.standardize else None
        std = statistics.get("target_std") if self.standardize else None
        # Stored with the model: a checkpoint maps its outputs back with the figures it was trained with.
        self.register_buffer("target_mean", torch.tensor(mean if mean is not None else [0.0] * n, dtype=torch.float))
        self.register_buffer(
            "target_std", torch.tensor(std if std is not None else [1.0] * n, dtype=torch.float).clamp(min=1e-6)
        )

    def make_metrics(self, stage: str) -> dict[str, Metric]:
        n = len(self.label_names)
        # "SpearmanCorrcoef will save all targets and predictions": evaluation sets are small
        with (warnings.catch_warnings()):
            warnings.simplefilter("ignore")
            spearman = SpearmanCorrCoef(num_outputs=n)
        return {"pearson": PearsonCorrCoef(num_outputs=n), "spearman": spearman, "mse": MeanSquaredError(num_outputs=n),
                "mae": MeanAbsoluteError(num_outputs=n)}

    def epoch_warnings(self, stage: str) -> list[str]:
        spearman = self.metrics(stage)["spearman"]
        if not spearman.update_called:
            return []
        # Spearman keeps every prediction and target (its states ``preds``, ``target``): their spread, per target
        preds, target = (torch.cat(spearman.preds).float(), torch.cat(spearman.target).float())
        if len(preds) < 20:
            return []
        spread, wanted = preds.std(0).reshape(-1), target.std(0).reshape(-1)
        flat = [name for name, a, b in zip(self.label_names, spread.tolist(), wanted.tolist()) if a < 0.1 * b]
        if not flat:
            return []
        return [f"Task '{self.name}': on {len(preds)} validation examples the predictions of {flat} barely vary (their "
                f"spread is under a tenth of the targets'): the model predicts about the mean. Train longer or with a "
                "higher learning rate, or check that the targets and inputs line up."]

    onnx_output = "scores"  # (batch, targets), on the data's scale

    def export_forward(self, trunk: Trunk, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.scores(trunk, {"input_ids": input_ids, "attention_mask": attention_mask})

    def scores(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """(B, n_targets) predictions on the data's scale."""
        return self(trunk, batch).float() * self.target_std + self.target_mean

    def loss(self, trunk: Trunk, batch: dict, stage: str, output=None) -> torch.Tensor:
        outputs, targets = (self(trunk, batch) if output is None else output).float(), batch["labels"].float()
        predicted = outputs.detach() * self.target_std + self.target_mean
        if targets.shape[-1] == 1:  # torchmetrics takes one target as (B,)
            predicted, targets_seen = predicted.squeeze(-1), targets.squeeze(-1)
        else:
            targets_seen = targets
        for metric in self.metrics(stage).values():
            metric.update(predicted, targets_seen)
        standardized = (targets - self.target_mean) / self.target_std
        if self.loss_kind == "huber":
            return F.huber_loss(outputs, standardized, delta=self.huber_delta)
        return F.mse_loss(outputs, standardized)

    def soft_targets(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        return self.scores(trunk, batch)  # on the data's scale: a student standardises them with its own figures

    def distill_loss(self, output, targets: torch.Tensor, batch: dict, temperature: float) -> torch.Tensor:
        return F.mse_loss(output.float(), (targets.float() - self.target_mean) / self.target_std)

    def compute_metrics(self, stage: str) -> dict[str, torch.Tensor]:
        """Scalars: each metric's mean over the targets, and per target ``<metric>_<target>`` when there are several."""
        values: dict[str, torch.Tensor] = {}
        for name, metric in self.metrics(stage).items():
            if not metric.update_called:
                continue
            value = metric.compute().reshape(-1)
            metric.reset()
            values[name] = value.mean()
            if len(value) > 1:
                values.update({f"{name}_{target}": v for target, v in zip(self.label_names, value)})
        return values

    def records(self, batch: dict, scores: torch.Tensor) -> list[dict]:
        records = []
        for i, row in enumerate(scores.float().tolist()):
            answer = {"score": row[0]} if len(row) == 1 else {"scores": dict(zip(self.label_names, row))}
            records.append(self.record(batch, i, **answer))
        return records

    def samples(self, trunk: Trunk, batch: dict) -> list[dict]:
        predicted, gold = self.scores(trunk, batch).tolist(), batch["labels"].float().tolist()
        return [self.record(batch, i, gold=_plain(g), predicted=_plain([round(v, 4) for v in p]))
                for i, (g, p) in enumerate(zip(gold, predicted))]


def _plain(values: list[float]) -> float | list[float]:
    return values[0] if len(values) == 1 else values
