"""What every task shares: building the trunk, the optimizer and schedule, metrics, checkpoints."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import lightning as L
import torch
from torchmetrics import MetricCollection

from models import Backbone, TokenStem, Trunk, TrunkConfig, init_weights

STAGES = ("train", "val", "test")


@dataclass
class OptimConfig:
    """AdamW with decay / no-decay groups, linear warmup, then cosine or linear decay (per step)."""

    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup: float = 0.06  # below 1: a fraction of all training steps; from 1 up: a number of steps
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = 0.0  # the decay ends at lr * min_lr_ratio


def lr_lambda(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Multiplier on the base learning rate at ``step``."""
    warmup_steps = int(cfg.warmup * total_steps) if cfg.warmup < 1 else int(cfg.warmup)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_text_trunk(cfg: TrunkConfig) -> Trunk:
    trunk = Trunk(TokenStem(cfg), Backbone(cfg))
    init_weights(trunk, cfg.init_std)
    return trunk


class TrunkTask(L.LightningModule):
    """Base LightningModule: a trunk, a task head (``self.head``), metrics and optimisation.

    A task subclass builds ``self.head``, implements ``forward`` and ``step`` (loss + metric updates
    for one batch), and ``make_metrics``. Everything else (optimizer groups, schedule, logging of
    metric objects per epoch) lives here once.
    """

    def __init__(self, trunk: TrunkConfig, optimizer: OptimConfig) -> None:
        super().__init__()
        self.trunk_config = trunk
        self.optim_config = optimizer
        self.trunk = build_text_trunk(trunk)
        metrics = self.make_metrics()
        for stage in STAGES:  # one independent copy per stage, so epochs of train/val never mix
            setattr(self, f"{stage}_metrics", metrics.clone(prefix=f"{stage}/"))

    # -- for subclasses ------------------------------------------------------------------------
    def make_metrics(self) -> MetricCollection:
        raise NotImplementedError

    def step(self, batch: dict, stage: str) -> torch.Tensor:
        """Loss for one batch; updates ``self.metrics(stage)``."""
        raise NotImplementedError

    def setup(self, stage: str) -> None:
        max_length = getattr(self.trainer.datamodule, "max_length", None)
        if max_length is not None and max_length > self.trunk_config.max_len:
            raise ValueError(
                f"data.max_length={max_length} is longer than the trunk's max_len={self.trunk_config.max_len}: "
                "lower data.max_length, or raise model.trunk.max_len (a pretrained trunk's max_len is fixed)."
            )

    # -- shared loop ---------------------------------------------------------------------------
    def metrics(self, stage: str) -> MetricCollection:
        return getattr(self, f"{stage}_metrics")

    def _run_stage(self, batch: dict, stage: str) -> torch.Tensor:
        loss = self.step(batch, stage)
        batch_size = batch["input_ids"].shape[0] if "input_ids" in batch else None
        self.log(f"{stage}/loss", loss, on_step=stage == "train", on_epoch=True, prog_bar=True, batch_size=batch_size,
                 sync_dist=stage != "train")  # epoch-level eval loss averaged over all processes
        # Logging the Metric objects lets Lightning compute them over the whole epoch (synced
        # across processes) and reset them, instead of averaging per-batch values.
        self.log_dict(self.metrics(stage), on_step=False, on_epoch=True, prog_bar=stage != "train", batch_size=batch_size)
        return loss

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self._run_stage(batch, "train")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._run_stage(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._run_stage(batch, "test")

    # -- optimisation --------------------------------------------------------------------------
    def param_groups(self) -> list[dict]:
        """Trainable parameters in two groups: matrices decay, biases and norms do not (nanoGPT/BERT)."""
        params = [p for p in self.parameters() if p.requires_grad]  # frozen ones get no optimizer state
        return [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": self.optim_config.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]

    def configure_optimizers(self):
        cfg = self.optim_config
        groups = [g for g in self.param_groups() if g["params"]]
        optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
        total_steps = max(1, int(self.trainer.estimated_stepping_batches))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_lambda(step, total_steps, cfg))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

