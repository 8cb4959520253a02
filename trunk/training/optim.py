"""Optimisation: AdamW or LAMB, which parameters decay, and the warmup + decay learning-rate schedule (per step)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn


@dataclass
class OptimConfig:
    """AdamW (or LAMB) with decay / no-decay groups, linear warmup, then a decay (per step).

    ``name``: ``adamw``, or ``lamb`` (You et al. 2020: Adam's step scaled per weight tensor by ||w|| / ||step||, so
    every layer moves by the same fraction of its size; the optimiser for very large batches). ``schedule`` after the
    warmup: ``cosine`` or ``linear`` decay to ``lr * min_lr_ratio`` at the last step, ``constant``, or
    ``inverse_sqrt`` (the Transformer paper's: lr * sqrt(warmup / step), peaking at ``lr`` when the warmup ends;
    ``lr = d_model**-0.5 * warmup_steps**-0.5`` gives the paper's d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)).
    """

    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup: float = 0.06  # below 1: a fraction of all training steps; from 1 up: a number of steps
    schedule: Literal["cosine", "linear", "constant", "inverse_sqrt"] = "cosine"
    min_lr_ratio: float = 0.0  # the decay ends at lr * min_lr_ratio
    name: Literal["adamw", "lamb"] = "adamw"

    def __post_init__(self) -> None:
        problems = [f"lr={self.lr} (must be > 0)" if not self.lr > 0 else "",
                    f"weight_decay={self.weight_decay} (must be >= 0)" if not self.weight_decay >= 0 else "",
                    f"betas={tuple(self.betas)} (each in [0, 1))" if not all(0 <= b < 1 for b in self.betas) else "",
                    f"eps={self.eps} (must be > 0)" if not self.eps > 0 else "",
                    f"warmup={self.warmup} (a fraction below 1, or a step count)" if not self.warmup >= 0 else "",
                    f"min_lr_ratio={self.min_lr_ratio} (must be in [0, 1])" if not 0 <= self.min_lr_ratio <= 1 else "",
                    f"schedule={self.schedule!r} (one of {list(SCHEDULES)})" if self.schedule not in SCHEDULES else "",
                    f"name={self.name!r} (adamw or lamb)" if self.name not in ("adamw", "lamb") else "",
                    "schedule='inverse_sqrt' with warmup=0 (its decay is sqrt(warmup / step): give a warmup)"
                    if self.schedule == "inverse_sqrt" and self.warmup == 0 else ""]
        problems = [p for p in problems if p]
        if problems:
            raise ValueError(f"model.optimizer: {', '.join(problems)}.")


SCHEDULES = ("cosine", "linear", "constant", "inverse_sqrt")


def lr_lambda(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Multiplier on the base learning rate at ``step`` (0-based: the first step is step 1 of the formulas)."""
    warmup_steps = int(cfg.warmup * total_steps) if cfg.warmup < 1 else int(cfg.warmup)
    if cfg.schedule == "inverse_sqrt":
        warmup_steps = max(1, warmup_steps)  # a fraction of a short run may round to none
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "inverse_sqrt":
        shape = math.sqrt(warmup_steps / (step + 1))
    else:
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

    def state_dict(self) -> dict:
        # Plain values only (checkpoints load with weights_only=True), and no total_steps: a resumed run
        # re-plans the schedule for its own length, so extending max_steps keeps the lr above zero.
        return {k: v for k, v in super().state_dict().items() if k not in ("cfg", "total_steps")}


def no_decay_ids(model: nn.Module) -> set[int]:
    """The parameters weight decay leaves alone: vectors (biases, norm scales; nanoGPT / BERT) and what a
    module names in its ``no_weight_decay()`` (timm's convention: position tables, [CLS])."""
    ids = {id(p) for p in model.parameters() if p.ndim < 2}
    for module in model.modules():
        if hasattr(module, "no_weight_decay"):
            ids |= {id(module.get_parameter(name)) for name in module.no_weight_decay()}
    return ids


def decay_groups(
    params: list[nn.Parameter], no_decay: set[int], weight_decay: float, lr: float, name: str
) -> list[dict]:
    """AdamW groups for ``params`` at one learning rate: ``name`` decays, ``name``_no_decay does not."""
    groups = [
        {"params": [p for p in params if id(p) not in no_decay], "weight_decay": weight_decay, "lr": lr, "name": name},
        {"params": [p for p in params if id(p) in no_decay], "weight_decay": 0.0, "lr": lr, "name": f"{name}_no_decay"},
    ]
    return [g for g in groups if g["params"]]


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2020, Algorithm 2): Adam's bias-corrected step plus decoupled weight decay, ``u = m / (sqrt(v)
    + eps) + weight_decay * w``, scaled per tensor by the trust ratio ||w|| / ||u|| (1 where either is 0), so each
    layer moves by a share of its own norm whatever the batch size. As in BERT's LAMB, tensors without weight decay
    (biases, norm scales) take the plain Adam step. Sharded (FSDP2) tensors: the norms are over all their shards.
    Hand-written: torch ships no LAMB, and apex's and timm's would be a dependency for 30 lines."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    # a tensor, as torch's Adam keeps it (checkpoints)
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                state["step"] += 1
                t = state["step"].item()
                state["exp_avg"].lerp_(p.grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                update = (state["exp_avg"] / (1 - beta1**t)) / (
                    (state["exp_avg_sq"] / (1 - beta2**t)).sqrt() + group["eps"]
                )
                ratio = 1.0
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                    w_norm, u_norm = _global_norm(p), _global_norm(update)
                    ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                _local(p).add_(_local(update) * ratio, alpha=-group["lr"])
        return loss


def _local(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) tensor's own shard; a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _global_norm(t: torch.Tensor) -> torch.Tensor:
    """The 2-norm of a whole tensor, over every shard of a sharded one, as a plain tensor."""
    norm = torch.linalg.vector_norm(t)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def depth_param_groups(model, modules: list[nn.Module], depth: int, exclude: set[int] | None = None) -> list[dict]:
    """Optimizer groups for the trainable parameters of ``modules`` at ``depth`` of ``model.depth_groups()``, at the
    layer-decayed learning rate (``finetune.layer_decay``); ``decay_groups``: vectors, position tables and [CLS] do not
    decay; frozen and held parameters get no optimizer state. ``exclude``: ids already in a group (updated)."""
    exclude = set() if exclude is None else exclude
    held = model.freezer.held_ids()
    params = [p for m in modules for p in m.parameters() if model.freezer.trains(p, held) and id(p) not in exclude]
    params = list({id(p): p for p in params}.values())  # tied weights (MLM decoder) appear once
    exclude.update(id(p) for p in params)
    lr = model.optim_config.lr * model.finetune.layer_decay ** (len(model.depth_groups()) - 1 - depth)
    return decay_groups(params, no_decay_ids(model), model.optim_config.weight_decay, lr, f"depth{depth}")


def build_optimizer(groups: list[dict], cfg: OptimConfig, total_steps: int) -> dict:
    """AdamW (fused where it takes the parameters) or LAMB, and the per-step schedule, as ``configure_optimizers``
    returns them."""
    if cfg.name == "lamb":
        optimizer = Lamb(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    else:
        optimizer = torch.optim.AdamW(
            groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused_adamw_fits(groups) or None
        )
    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": WarmupDecayLR(optimizer, total_steps, cfg), "interval": "step"},
    }


def fused_adamw_fits(groups: list[dict]) -> bool:
    """Whether torch's fused AdamW (one kernel over every parameter: 4 ms a step instead of 12 ms for the
    default foreach on 5M parameters, 2 CPU cores) takes these parameters: plain floating-point tensors
    on CPU or CUDA, not sharded ones (DTensor, which has ``placements``)."""
    params = [p for g in groups for p in g["params"]]
    return all(
        p.device.type in ("cpu", "cuda") and p.is_floating_point() and not hasattr(p, "placements") for p in params
    )
