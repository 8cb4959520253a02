"""Absolute positions: a table added to the embeddings, trained (``learned``: BERT's, ViT's) or fixed (``sinusoidal``:
"Attention Is All You Need"'s; MAE's 2-D form for patches; ``sinusoidal_halves``: Marian's, every sine then every
cosine; ``sinusoidal_t2t``: tensor2tensor's and fairseq's, M2M100's and NLLB's, the same halves over frequencies spaced
to reach 1/10000 at the last). A learned table fixes the longest input; on a patch grid of
another size it is resized bicubically (timm / DeiT) and the sinusoidal one recomputed."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trunk.models.positions.base import PositionScheme


def sinusoidal_positions(n_positions: int, dim: int, layout: str = "interleaved") -> torch.Tensor:
    """A fixed sin/cos table (n_positions, dim). ``interleaved``: "Attention Is All You Need"'s, sine and cosine of each
    frequency side by side; ``halves``: the same frequencies, every sine then every cosine (Marian's); ``t2t``: every
    sine then every cosine of frequencies 10000^(-k / (dim/2 - 1)) (tensor2tensor's, fairseq's, M2M100's)."""
    # each layout computed in the precision of its reference (Marian's in float64, the others in float32), so that
    # long positions agree to the last bit
    dtype = torch.float64 if layout == "halves" else torch.float32
    position = torch.arange(n_positions, dtype=dtype)[:, None]
    if layout == "t2t":
        half = dim // 2
        angles = position * torch.exp(torch.arange(half, dtype=dtype) * (-math.log(10000.0) / (half - 1)))
        return torch.cat([torch.sin(angles), torch.cos(angles), torch.zeros(n_positions, dim % 2)], dim=1)
    angles = position * torch.exp(torch.arange(0, dim, 2, dtype=dtype) * (-math.log(10000.0) / dim))
    if layout == "halves":
        return torch.cat([torch.sin(angles), torch.cos(angles[:, : dim // 2])], dim=1).float()
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return table
    angles = position * torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    if layout == "halves":
        return torch.cat([torch.sin(angles), torch.cos(angles[:, : dim // 2])], dim=1).float()
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return table.float()


def sinusoidal_positions_2d(rows: int, cols: int, dim: int) -> torch.Tensor:
    """Fixed 2-D positions (MAE / MoCo v3): half the channels encode the row, half the column. (rows * cols, dim)."""
    if dim % 4:
        raise ValueError(f"2-D sinusoidal positions need d_model divisible by 4, got {dim}.")
    row = sinusoidal_positions(rows, dim // 2)[:, None, :].expand(rows, cols, dim // 2)
    col = sinusoidal_positions(cols, dim // 2)[None, :, :].expand(rows, cols, dim // 2)
    return torch.cat([row, col], dim=-1).reshape(rows * cols, dim)


def resize_grid(table: torch.Tensor, rows: int, cols: int, antialias: bool = False) -> torch.Tensor:
    """A learned (1, grid * grid, d) patch position table resized bicubically to a rows x cols grid (timm's and
    transformers' ``interpolate_pos_encoding``): images of another size than the table was trained for."""
    grid = math.isqrt(table.shape[1])
    square = table.reshape(1, grid, grid, -1).permute(0, 3, 1, 2)  # (1, d, grid, grid)
    square = F.interpolate(square.float(), size=(rows, cols), mode="bicubic", align_corners=False, antialias=antialias)
    return square.permute(0, 2, 3, 1).reshape(1, rows * cols, -1).to(table.dtype)


class Learned(PositionScheme):
    name = "learned"
    fixes_max_len = True

    @staticmethod
    def add_token_table(stem: nn.Module, max_len: int, dim: int) -> None:
        stem.position = nn.Embedding(max_len, dim)

    @staticmethod
    def token_table(stem: nn.Module, start: int, stop: int) -> torch.Tensor:
        return stem.position.weight[start:stop]

    @staticmethod
    def add_grid_table(stem: nn.Module, grid: int, dim: int, init_std: float) -> None:
        stem.position = nn.Parameter(torch.zeros(1, grid * grid, dim))
        nn.init.normal_(stem.position, std=init_std)

    @staticmethod
    def grid_table(stem: nn.Module, rows: int, cols: int) -> torch.Tensor:
        if (rows, cols) == (stem.grid, stem.grid):
            return stem.position
        return resize_grid(stem.position, rows, cols, stem.resize_antialias)


class Sinusoidal(PositionScheme):
    name = "sinusoidal"
    layout = "interleaved"

    @classmethod
    def add_token_table(cls, stem: nn.Module, max_len: int, dim: int) -> None:
        stem.register_buffer("position_table", sinusoidal_positions(max_len, dim, cls.layout), persistent=False)

    @staticmethod
    def token_table(stem: nn.Module, start: int, stop: int) -> torch.Tensor:
        return stem.position_table[start:stop]

    @staticmethod
    def add_grid_table(stem: nn.Module, grid: int, dim: int, init_std: float) -> None:
        stem.register_buffer("position_table", sinusoidal_positions_2d(grid, grid, dim)[None], persistent=False)

    @staticmethod
    def grid_table(stem: nn.Module, rows: int, cols: int) -> torch.Tensor:
        if (rows, cols) == (stem.grid, stem.grid):
            return stem.position_table
        return sinusoidal_positions_2d(rows, cols, stem.position_table.shape[-1]).to(stem.position_table.device)[None]


class SinusoidalHalves(Sinusoidal):
    """Marian's token table (its patch grids as ``sinusoidal``'s)."""

    name = "sinusoidal_halves"
    layout = "halves"


class SinusoidalT2T(Sinusoidal):
    """tensor2tensor's and fairseq's token table: M2M100's, NLLB's (its patch grids as ``sinusoidal``'s)."""

    name = "sinusoidal_t2t"
    layout = "t2t"
