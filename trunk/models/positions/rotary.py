"""Rotary positions (RoFormer): no table; self-attention turns each query and key by its position. Images use their
patches' raster order."""

from __future__ import annotations

import functools

import torch

from trunk.models.kernels import tracing
from trunk.models.positions.base import PositionScheme


def rotate(x: torch.Tensor, offset: int = 0, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (RoFormer; GPT-NeoX's half-split layout) of (B, H, T, D) queries or keys.

    Channel pair i of position t turns by the angle t * base^(-2i/D), so a query-key dot product
    depends on the two positions only through their distance. A model can attend "one word to the
    left" from its first steps, which learned absolute positions must discover first.
    """
    T, D = x.shape[-2], x.shape[-1]
    if tracing():  # computed in the graph, not read from a Python cache
        cos, sin = rotary_table.__wrapped__(offset + T, D, x.device, x.dtype, base)
    else:  # every layer and call of a length reuses one table (a power of two long, so decoding steps share it too)
        cos, sin = rotary_table(1 << (offset + T - 1).bit_length(), D, x.device, x.dtype, base)
    cos, sin = cos[offset : offset + T], sin[offset : offset + T]
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@functools.lru_cache(maxsize=64)
def rotary_table(
    length: int, dim: int, device: torch.device, dtype: torch.dtype, base: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles of positions 0 .. length-1: (length, dim/2) each. Made outside inference
    mode even when first asked for there, so that training may use the same cached tensors afterwards."""
    with torch.inference_mode(False), torch.no_grad():
        inv_freq = base ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
        angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)
        return angles.cos().to(dtype), angles.sin().to(dtype)


class Rotary(PositionScheme):
    name = "rope"
    rotates = True

    @staticmethod
    def check(cfg) -> None:
        if (cfg.d_model // cfg.n_heads) % 2:
            raise ValueError(
                f"Rotary positions need an even head width; d_model / n_heads = {cfg.d_model // cfg.n_heads}."
            )

    @staticmethod
    def rotate(x: torch.Tensor, offset: int = 0, base: float = 10000.0) -> torch.Tensor:
        return rotate(x, offset, base)
