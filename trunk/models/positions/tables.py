"""Absolute positions: a table added to the embeddings, trained (``learned``: BERT's, ViT's) or fixed (``sinusoidal``:
"Attention Is All You Need"'s; MAE's 2-D form for patches). A learned table fixes the longest input; on a patch grid of
another size it is resized bicubically (timm / DeiT) and the sinusoidal one recomputed."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trunk.models.positions.base import PositionScheme


def sinusoidal_positions(n_positions: int, dim: int) -> torch.Tensor:
    """The fixed sin/cos table of "Attention Is All You Need": (n_positions, dim)."""
    position = torch.arange(n_positions, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


def sinusoidal_positions_2d(rows: int, cols: int, dim: int) -> torch.Tensor:
    """Fixed 2-D positions (MAE / MoCo v3): half the channels encode the row, half the column. (rows * cols, dim)."""
    if dim % 4:
        raise ValueError(f"2-D sinusoidal positions need d_model divisible by 4, got {dim}.")
    row = sinusoidal_positions(rows, dim // 2)[:, None, :].expand(rows, cols, dim // 2)
    col = sinusoidal_positions(cols, dim // 2)[None, :, :].expand(rows, cols, dim // 2)
    return torch.cat([row, col], dim=-1).reshape(rows * cols, dim)


def resize_grid(table: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A learned (1, grid * grid, d) patch position table resized bicubically to a rows x cols grid (timm's and
    transformers' ``interpolate_pos_encoding``): images of another size than the table was trained for."""
    grid = math.isqrt(table.shape[1])
    square = table.reshape(1, grid, grid, -1).permute(0, 3, 1, 2)  # (1, d, grid, grid)
    square = F.interpolate(square.float(), size=(rows, cols), mode="bicubic", align_corners=False)
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
        return stem.position if (rows, cols) == (stem.grid, stem.grid) else resize_grid(stem.position, rows, cols)


class Sinusoidal(PositionScheme):
    name = "sinusoidal"

    @staticmethod
    def add_token_table(stem: nn.Module, max_len: int, dim: int) -> None:
        stem.register_buffer("position_table", sinusoidal_positions(max_len, dim), persistent=False)

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
