"""Reading a backbone's insides while it runs: chosen blocks' outputs and their attention's queries, keys and values,
for distillation's intermediate losses (TinyBERT's hidden states, MiniLM's self-attention relations). Forward hooks,
removed on leaving the ``with``; the backbone's code is not touched."""

from __future__ import annotations

import torch
from torch import nn

from trunk.models.kernels import Unpadded


class Taps:
    """``with Taps(backbone, [1, 3]) as taps: backbone(...)``; then ``taps.read(mask)``: per layer, its output
    (``hidden``) and its attention's ``q``, ``k``, ``v`` projections, each (B, T, C) with padding zeroed."""

    def __init__(self, backbone: nn.Module, layers: list[int]) -> None:
        self.backbone, self.layers, self.seen, self.handles = backbone, list(layers), {}, []
        self.mask: torch.Tensor | None = None

    def __enter__(self) -> Taps:
        for layer in self.layers:
            block = self.backbone.blocks[self.backbone.cfg.block_of(layer)]
            for module, name in ((block, "hidden"), (block.attn.q_proj, "q"), (block.attn.kv_proj, "kv")):
                self.handles.append(module.register_forward_hook(self._keep(layer, name)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _keep(self, layer: int, name: str):
        def hook(module, args, output) -> None:
            self.seen.setdefault(layer, {})[name] = output
        return hook

    def read(self, mask: torch.Tensor | None) -> dict[int, dict[str, torch.Tensor]]:
        """Each tapped layer's tensors as (B, T, C), float, 0 at padding. ``mask``: (B, T), True at real tokens (the
        backbone ran on its real tokens only, as (N, C) rows, where that paid: ``Unpadded``); None: all are real."""
        if mask is None:
            mask = torch.ones(next(iter(self.seen.values()))["hidden"].shape[:2], dtype=torch.bool)
        mask = self.mask = mask.bool()  # the one read with, for the losses
        unpadded = Unpadded(mask)
        out = {}
        for layer, seen in self.seen.items():
            full = {name: (unpadded.pad(t) if t.ndim == 2 else t).float() * mask[..., None].to(t.device)
                    for name, t in seen.items()}
            width = full["q"].shape[-1]
            out[layer] = {"hidden": full["hidden"], "q": full["q"], "k": full["kv"][..., :width],
                          "v": full["kv"][..., width:]}
        return out
