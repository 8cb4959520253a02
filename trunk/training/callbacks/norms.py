"""Gradient and weight norms of the whole model, the stems, each block and each head."""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import grad_norm


class Norms(Callback):
    """Every ``every_n_steps`` optimizer steps, logs the gradient and weight norms (L2) of the whole model
    and of each part under ``norms/``: the stems, each trunk block, the final norm, each task's head.
    Off unless added (``--trainer.callbacks+=trunk.training.callbacks.Norms``): it reads every gradient."""

    def __init__(self, every_n_steps: int = 50) -> None:
        if every_n_steps < 1:
            raise ValueError(f"Norms.every_n_steps must be >= 1, got {every_n_steps}.")
        self.every_n_steps = every_n_steps

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step % self.every_n_steps:
            return
        parts = {"stems": pl_module.trunk.stems, "final_norm": pl_module.trunk.backbone.final_norm,
                 **{f"block{i}": block for i, block in enumerate(pl_module.trunk.backbone.blocks)},
                 **{f"head_{name}": objective for name, objective in pl_module.objectives.items()}}
        values = {}
        for name, part in [("all", pl_module), *parts.items()]:
            params = [p for p in part.parameters() if p.requires_grad]
            if params:
                values[f"norms/{name}/weight"] = torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(p) for p in params])
                )
            grads = grad_norm(part, norm_type=2)  # Lightning's: each gradient's norm and their total
            if grads:
                values[f"norms/{name}/grad"] = grads["grad_2.0_norm_total"]
        pl_module.log_dict(values, on_step=True, on_epoch=False, batch_size=1)
