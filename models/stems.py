"""Stems turn raw inputs into the (B, T, C) vectors the backbone consumes."""

from __future__ import annotations

import math

import torch
from torch import nn

from models.trunk import TrunkConfig


def sinusoidal_positions(n_positions: int, dim: int) -> torch.Tensor:
    """The fixed sin/cos table of "Attention Is All You Need": (n_positions, dim)."""
    position = torch.arange(n_positions, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


class TokenStem(nn.Module):
    """Token embedding + position embedding (learned or sinusoidal; none for rope), then dropout.

    Post-LN models (BERT) also normalise the embeddings; pre-LN models leave that to the first block.
    """

    def __init__(self, cfg: TrunkConfig) -> None:
        super().__init__()
        self.max_len = cfg.max_len
        self.token = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positions == "learned":
            self.position = nn.Embedding(cfg.max_len, cfg.d_model)
        elif cfg.positions == "sinusoidal":
            self.register_buffer("position_table", sinusoidal_positions(cfg.max_len, cfg.d_model), persistent=False)
        # "rope": no absolute positions here; attention rotates queries and keys (models/trunk.py)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm == "post" else nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """input_ids: (B, T) -> (B, T, C). ``offset``: the position of the first token (incremental decoding)."""
        T = offset + input_ids.shape[1]
        if T > self.max_len:
            raise ValueError(
                f"Sequence length {T} exceeds the trunk's max_len={self.max_len}: truncate the inputs "
                "(the datamodules do this via their max_length option) or build the trunk with a larger max_len."
            )
        x = self.token(input_ids)
        if hasattr(self, "position"):
            x = x + self.position.weight[offset:T]
        elif hasattr(self, "position_table"):
            x = x + self.position_table[offset:T]
        return self.drop(self.norm(x))
