"""What every task shares: building the trunk, the optimizer and schedule, metrics, checkpoints."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import lightning as L
import torch
from torch import nn
from torchmetrics import MetricCollection

from trunk.models import Backbone, TokenStem, Trunk, TrunkConfig, init_weights
from trunk.tasks.finetuning import FinetuneConfig, GradualUnfreezing, set_trainable
from trunk.tasks.pretrained import PretrainedTrunk, check_architecture, load_pretrained

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


class WarmupDecayLR(torch.optim.lr_scheduler.LRScheduler):
    """Each group's initial lr times ``lr_lambda(step)``. Unlike ``LambdaLR``, groups added during
    training (gradual unfreezing) follow the same curve from their own ``initial_lr``."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, cfg: OptimConfig) -> None:
        self.total_steps, self.cfg = total_steps, cfg
        super().__init__(optimizer)

    def factor(self, step: int) -> float:
        return lr_lambda(step, self.total_steps, self.cfg)

    def get_lr(self) -> list[float]:
        factor = self.factor(self.last_epoch)
        return [group.setdefault("initial_lr", group["lr"]) * factor for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:  # plain values only, so checkpoints load with weights_only=True
        return {k: v for k, v in super().state_dict().items() if k != "cfg"}


def as_config(cls: type, value):
    """A config dataclass from itself or from its dict form (as checkpoints store it)."""
    return cls(**value) if isinstance(value, dict) else value


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

    def __init__(
        self,
        trunk: TrunkConfig = TrunkConfig(),
        optimizer: OptimConfig = OptimConfig(),
        init_from: str | None = None,
        finetune: FinetuneConfig = FinetuneConfig(),
    ) -> None:
        super().__init__()
        trunk, optimizer, finetune = (as_config(cls, value) for cls, value in
                                      ((TrunkConfig, trunk), (OptimConfig, optimizer), (FinetuneConfig, finetune)))
        self.trunk_config = trunk
        self.optim_config = optimizer
        self.finetune = finetune
        self.trunk = self.build_trunk(trunk)
        if init_from:
            self.load_pretrained_trunk(load_pretrained(init_from))
        if finetune.freeze_layers > trunk.n_layers:
            raise ValueError(f"finetune.freeze_layers={finetune.freeze_layers} exceeds the trunk's {trunk.n_layers} blocks.")
        for depth in self.frozen_depths():
            set_trainable(self.depth_groups()[depth], False)
        if finetune.freeze_trunk:
            set_trainable([self.trunk.backbone.final_norm], False)
        metrics = self.make_metrics()
        for stage in STAGES:  # one independent copy per stage, so epochs of train/val never mix
            setattr(self, f"{stage}_metrics", metrics.clone(prefix=f"{stage}/"))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Plain values only (dataclasses as dicts), so every checkpoint loads with weights_only=True.
        hparams = checkpoint.get("hyper_parameters", {})
        for key, value in hparams.items():
            if dataclasses.is_dataclass(value):
                hparams[key] = dataclasses.asdict(value)

    # -- for subclasses ------------------------------------------------------------------------
    def build_trunk(self, cfg: TrunkConfig) -> Trunk:
        """The trunk this task trains: token stem + backbone (image tasks swap the stem)."""
        return build_text_trunk(cfg)

    def load_pretrained_trunk(self, pretrained: PretrainedTrunk) -> None:
        """Start from a pretrained trunk's weights (``init_from``), after checking the architectures match."""
        check_architecture(self.trunk_config, pretrained.config, pretrained.path)
        self.trunk.load_state_dict(pretrained.trunk_weights)

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
        batch_size = len(batch["labels"]) if "labels" in batch else None
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

    # -- depths: freezing and layer-wise learning rates ------------------------------------------
    def depth_groups(self) -> list[list[nn.Module]]:
        """The model bottom-up: [stem], [block 0], ..., [block L-1], [final norm, task head(s)]."""
        backbone = self.trunk.backbone
        heads = [m for name, m in self.named_children() if name != "trunk" and any(True for _ in m.parameters())]
        return [[self.trunk.stem], *([block] for block in backbone.blocks), [backbone.final_norm, *heads]]

    def frozen_depths(self) -> set[int]:
        """Depths frozen for the whole run by ``finetune`` (gradual unfreezing comes on top)."""
        cfg, n_layers = self.finetune, len(self.trunk.backbone.blocks)
        if cfg.freeze_trunk:
            return set(range(n_layers + 1))  # the final norm too, see __init__
        return ({0} if cfg.freeze_embeddings else set()) | set(range(1, 1 + cfg.freeze_layers))

    def train(self, mode: bool = True):
        """Frozen trunk parts stay in eval mode (no dropout); see tasks/finetuning.py."""
        super().train(mode)
        for module in (self.trunk.stem, *self.trunk.backbone.blocks, self.trunk.backbone.final_norm):
            if not any(p.requires_grad for p in module.parameters()):
                module.eval()
        return self

    def configure_callbacks(self):
        return [GradualUnfreezing(self.finetune.unfreeze_every)] if self.finetune.unfreeze_every else []

    # -- optimisation --------------------------------------------------------------------------
    def make_param_groups(self, modules: list[nn.Module], depth: int, exclude: set[int] | None = None) -> list[dict]:
        """Optimizer groups for the trainable parameters of ``modules`` at ``depth``: matrices decay,
        biases and norms do not (nanoGPT/BERT); frozen parameters get no optimizer state."""
        exclude = set() if exclude is None else exclude
        params = [p for m in modules for p in m.parameters() if p.requires_grad and id(p) not in exclude]
        params = list({id(p): p for p in params}.values())  # tied weights (MLM decoder) appear once
        exclude.update(id(p) for p in params)
        lr = self.optim_config.lr * self.finetune.layer_decay ** (len(self.depth_groups()) - 1 - depth)
        groups = [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": self.optim_config.weight_decay, "lr": lr,
             "name": f"depth{depth}"},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0, "lr": lr, "name": f"depth{depth}_no_decay"},
        ]
        return [g for g in groups if g["params"]]

    def param_groups(self) -> list[dict]:
        seen: set[int] = set()
        return [g for depth, modules in enumerate(self.depth_groups()) for g in self.make_param_groups(modules, depth, seen)]

    def lr_schedule_factor(self) -> float:
        """The schedule's current multiplier (for groups added mid-run)."""
        return self.lr_schedulers().factor(self.trainer.global_step)

    def configure_optimizers(self):
        cfg = self.optim_config
        optimizer = torch.optim.AdamW(self.param_groups(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
        total_steps = max(1, int(self.trainer.estimated_stepping_batches))
        scheduler = WarmupDecayLR(optimizer, total_steps, cfg)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

