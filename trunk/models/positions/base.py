"""The interface of a position scheme: how the trunk knows where each token is. A scheme may add a table to the stems'
embeddings (``token_table``, ``grid_table``), rotate attention's queries and keys (``rotate``), or bias the attention
scores by distance (``bias``, a module that also says how tensor parallelism splits it: ``keep_heads``); it says
whether it fixes the longest input (``fixes_max_len``: a learned table has no row beyond it). Schemes register by
``name``; ``TrunkConfig.positions`` picks one. A new scheme is one file in this folder and its import in
``__init__.py``."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

POSITIONS: dict[str, type[PositionScheme]] = {}  # name -> scheme, filled as the scheme files are imported


class PositionScheme:
    """Stateless: each method gets what it works on. The stems keep a scheme's tables under the names ``position``
    (trained) and ``position_table`` (fixed), which checkpoints store."""

    name: ClassVar[str] = ""
    fixes_max_len: ClassVar[bool] = False  # a pretrained trunk reads no longer inputs than it was built for
    rotates: ClassVar[bool] = False  # self-attention turns queries and keys (``rotate``)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        POSITIONS[cls.name] = cls

    @staticmethod
    def check(cfg) -> None:
        """Refuse a config whose fields this scheme cannot use (a ``TrunkConfig``)."""

    @staticmethod
    def add_token_table(stem: nn.Module, max_len: int, dim: int) -> None:
        """Give a token stem this scheme's table of ``max_len`` positions, if it has one."""

    @staticmethod
    def token_table(stem: nn.Module, start: int, stop: int) -> torch.Tensor | None:
        """The (stop - start, dim) vectors added to the embeddings of positions start .. stop - 1; None: nothing
        added."""
        return None

    @staticmethod
    def add_grid_table(stem: nn.Module, grid: int, dim: int, init_std: float) -> None:
        """Give a patch stem this scheme's table of a grid x grid patch layout, if it has one."""

    @staticmethod
    def grid_table(stem: nn.Module, rows: int, cols: int) -> torch.Tensor | None:
        """The (1, rows * cols, dim) vectors added to a rows x cols grid of patches; None: nothing added."""
        return None

    @staticmethod
    def rotate(x: torch.Tensor, offset: int = 0, base: float = 10000.0) -> torch.Tensor:
        """Queries or keys (B, H, T, D) of positions offset .. offset + T - 1, as attention reads them (``base``: a
        rotary scheme's, per layer)."""
        return x

    @staticmethod
    def bias(cfg, causal: bool = False) -> nn.Module | None:
        """The stack-wide (1, heads, queries, keys) bias on attention scores; None: no bias. Its module implements
        ``keep_heads(heads, mesh)`` for tensor parallelism (trunk/training/sharding.py)."""
        return None


def scheme(name: str) -> type[PositionScheme]:
    if name not in POSITIONS:
        raise ValueError(f"TrunkConfig.positions={name!r}: choose {', '.join(POSITIONS)}.")
    return POSITIONS[name]
