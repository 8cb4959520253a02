"""Fine-tuning a pretrained trunk: what to freeze, when to unfreeze, how fast each depth learns.

Depths, bottom to top: the stem (embeddings), block 0 ... block L-1, then the top (the final
LayerNorm and the task head). Layer-wise learning-rate decay gives depth d the learning rate
``lr * layer_decay ** (top - d)``.

Frozen parts run in eval mode: their dropout is off. A frozen part is a fixed feature extractor,
and dropout there would only add noise to the features the trained layers see (the choice made
for linear probes). A part that gradual unfreezing thaws gets its dropout back.

Two ways to freeze. In one process, a frozen parameter has ``requires_grad=False``: backward skips
it. Under DDP that works only for parts frozen for the whole run, because DDP fixes the parameters it
synchronises when it wraps the model: a part thawed later would never have its gradients averaged.
FSDP2 likewise builds its gradient reduction when it shards the model. So with several processes,
parts that gradual unfreezing will thaw are *held* instead (``Freezer.hold``): they keep
``requires_grad``, DDP / FSDP2 reduce their gradients, and the module drops those gradients before
each optimizer step; they are not in the optimizer and run in eval mode until thawed, which trains
exactly as one process does (tested for both). The cost: backward runs through the held parts as in
full fine-tuning, and their gradients are communicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
from lightning.pytorch.callbacks import BaseFinetuning
from torch import nn
from torch.optim import Optimizer

from trunk.training.optim import depth_param_groups


@dataclass
class FinetuneConfig:
    """Which parts of the trunk train, and at what learning rate.

    Args:
        freeze_embeddings: freeze the stem (token and position embeddings).
        freeze_layers: freeze the lowest N blocks.
        freeze_trunk: freeze the whole trunk; only the head trains (a linear probe).
        unfreeze_every: gradual unfreezing (ULMFiT): start with the trunk frozen, then every K
            epochs thaw one more depth, top-down: the top block (with the final norm), the next
            block, ..., the embeddings. Parts frozen by the options above stay frozen. 0: off.
        layer_decay: learning-rate factor per depth below the top (1.0: off; 0.8 is common).
        reinit_top: with ``model.init_from``, start the top N blocks afresh rather than from the pretrained weights
            (their features are the most specific to pretraining; Zhang et al. 2021, "Revisiting few-sample BERT
            fine-tuning"). 0: off.
    """

    freeze_embeddings: bool = False
    freeze_layers: int = 0
    freeze_trunk: bool = False
    unfreeze_every: int = 0
    layer_decay: float = 1.0
    reinit_top: int = 0

    def __post_init__(self) -> None:
        if self.freeze_layers < 0 or self.unfreeze_every < 0 or self.reinit_top < 0:
            raise ValueError("finetune.freeze_layers, finetune.unfreeze_every and finetune.reinit_top must be >= 0.")
        if not 0.0 < self.layer_decay <= 1.0:
            raise ValueError(f"finetune.layer_decay must be in (0, 1], got {self.layer_decay}.")
        if self.freeze_trunk and self.unfreeze_every:
            raise ValueError(
                "finetune.freeze_trunk keeps the trunk frozen, so finetune.unfreeze_every would never thaw anything: "
                "set only one of them."
            )


def frozen_depths(cfg: FinetuneConfig, n_layers: int) -> set[int]:
    """Depths frozen for the whole run (gradual unfreezing comes on top): 0 is the stems, 1..L the
    blocks; a frozen trunk also freezes the final norm (see ``apply_freezing``)."""
    if cfg.freeze_layers > n_layers:
        raise ValueError(f"finetune.freeze_layers={cfg.freeze_layers} exceeds the trunk's {n_layers} blocks.")
    if cfg.freeze_trunk:
        return set(range(n_layers + 1))
    return ({0} if cfg.freeze_embeddings else set()) | set(range(1, 1 + cfg.freeze_layers))


def apply_freezing(depths: list[list[nn.Module]], cfg: FinetuneConfig, final_norm: nn.Module) -> None:
    """Freeze the configured depths (``depths``: bottom-up module groups, as ``TrunkModule.depth_groups``)."""
    for depth in frozen_depths(cfg, len(depths) - 2):
        set_trainable(depths[depth], False)
    if cfg.freeze_trunk:
        set_trainable([final_norm], False)


def keep_frozen_in_eval(trunk_parts: list[nn.Module], trained) -> None:
    """Frozen trunk parts run in eval mode (no dropout): call after ``module.train()``. ``trained(p)``
    says whether a parameter trains (neither frozen nor held)."""
    for module in trunk_parts:
        if not any(trained(p) for p in module.parameters()):
            module.eval()


class Freezer:
    """Which parameters of ``model`` train: neither frozen (``requires_grad=False``) nor *held* (see above). The
    module asks it; ``GradualUnfreezing`` holds and releases through it."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.held: set[str] = set()  # by name: FSDP2 replaces the parameters when it shards the model

    def trains(self, p: nn.Parameter, held: set[int] | None = None) -> bool:
        """Whether the optimizer updates ``p``. ``held``: ``held_ids()``, when asking about many parameters."""
        return p.requires_grad and id(p) not in (self.held_ids() if held is None else held)

    def held_ids(self) -> set[int]:
        """The held parameters' current objects."""
        return {id(p) for name, p in self.model.named_parameters() if name in self.held} if self.held else set()

    def _names(self, modules: list[nn.Module]) -> set[str]:
        ids = {id(p) for m in modules for p in m.parameters()}
        return {name for name, p in self.model.named_parameters() if id(p) in ids}

    def hold(self, modules: list[nn.Module]) -> None:
        """Freeze ``modules`` without touching ``requires_grad``: for parts thawed later under DDP or FSDP2."""
        self.held |= self._names(modules)
        for m in modules:
            m.eval()

    def release(self, modules: list[nn.Module]) -> None:
        self.held -= self._names(modules)

    def drop_held_gradients(self) -> None:
        """Before an optimizer step: held parameters' (averaged) gradients are dropped."""
        if self.held:
            for name, p in self.model.named_parameters():
                if name in self.held:
                    p.grad = None

    def keep_frozen_in_eval(self, trunk_parts: list[nn.Module]) -> None:
        """After ``model.train()``: trunk parts with nothing that trains run in eval mode (no dropout)."""
        held = self.held_ids()
        keep_frozen_in_eval(trunk_parts, lambda p: self.trains(p, held))


def set_trainable(modules, trainable: bool) -> None:
    """Freeze (and switch to eval mode) or thaw ``modules``. Eval mode is set here, not only in
    ``TrunkModule.train``: Lightning restores each submodule's own mode after validation."""
    for module in modules:
        for p in module.parameters():
            p.requires_grad = trainable
        if not trainable:
            module.eval()


class GradualUnfreezing(BaseFinetuning):
    """Thaw the trunk top-down, one depth every ``every`` epochs (added by the task when configured).

    Thawed parameters join the optimizer as new groups with their layer-decayed learning rate and
    follow the same schedule as the rest. Idempotent per epoch, so resuming from a checkpoint
    restores exactly the parts that were thawed.
    """

    def __init__(self, every: int) -> None:
        super().__init__()
        self.every = every

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.hold = trainer.world_size > 1  # several processes: hold instead of freezing (see the module's docstring)
        super().setup(trainer, pl_module, stage)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # FSDP2 may leave the root's parameters gathered after validation; Lightning names the optimizer's
        # (sharded) parameters by the module's current ones, so put the shards back first.
        for module in pl_module.modules():
            if hasattr(module, "reshard") and hasattr(module, "unshard"):  # an FSDPModule
                module.reshard()
        super().on_train_epoch_start(trainer, pl_module)

    def thaw_order(self, pl_module) -> list[tuple[int, list]]:
        """(depth, modules) from the top block down to the stem, skipping parts frozen for good."""
        depths = pl_module.depth_groups()
        top = len(depths) - 1
        order = [(top - 1, depths[top - 1] + [pl_module.trunk.backbone.final_norm])]
        order += [(d, depths[d]) for d in range(top - 2, -1, -1)]
        frozen = frozen_depths(pl_module.finetune, len(pl_module.trunk.backbone.blocks))
        return [(d, modules) for d, modules in order if d not in frozen]

    def freeze_before_training(self, pl_module) -> None:
        for _, modules in self.thaw_order(pl_module):
            pl_module.freezer.hold(modules) if getattr(self, "hold", False) else set_trainable(modules, False)

    def finetune_function(self, pl_module, epoch: int, optimizer: Optimizer) -> None:
        thawed = epoch // self.every
        in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for depth, modules in self.thaw_order(pl_module)[:thawed]:
            pl_module.freezer.release(modules) if getattr(self, "hold", False) else set_trainable(modules, True)
            for module in modules:
                module.train(pl_module.training)  # its dropout comes back
            for group in depth_param_groups(pl_module, modules, depth, exclude=in_optimizer):
                group["initial_lr"] = group["lr"]  # the schedule scales this, like every other group
                group["lr"] = group["lr"] * pl_module.lr_schedulers().factor(pl_module.trainer.global_step)
                optimizer.add_param_group(group)
