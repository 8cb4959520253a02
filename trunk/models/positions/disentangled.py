"""DeBERTa's disentangled attention (He et al. 2021): positions scored apart from content. One table of relative
position embeddings (``relative_buckets`` rows: half for keys before the query, half after; LayerNorm'd) serves every
layer; each layer projects it with its own query and key projections, and adds to the content scores q_i . k_j a
content-to-position term q_i . K_r[d(i, j)] and a position-to-content term k_j . Q_r[d(i, j)], d being the bucket of
the distance i - j: exact up to a quarter of the table, logarithmic up to ``relative_max_distance``, then the last
(``relative_max_distance`` 0: exact up to half the table).
Nothing is added to the embeddings, so inputs of any length read the same table.

All three terms are divided by sqrt(3 D), DeBERTa's scale (three terms of D channels each), where plain attention
divides by sqrt(D): the layer hands SDPA its queries times ``QUERY_SCALE``.
"""

from __future__ import annotations

import torch
from torch import nn

from trunk.models.kernels import dropout, tracing
from trunk.models.positions.base import PositionScheme

QUERY_SCALE = 3 ** -0.5  # 1 / sqrt(3): the content scores' share of DeBERTa's sqrt(3 D)


def log_buckets(relative: torch.Tensor, span: int, max_distance: int) -> torch.Tensor:
    """DeBERTa's bucket of each distance (query minus key): exact below span / 2, then growing logarithmically so that
    ``max_distance`` lands on the last bucket (``make_log_bucket_position``, in its float32 steps); ``max_distance``
    0: exact throughout (clamped at the table's ends by the caller)."""
    if max_distance <= 0:
        return relative
    mid = span // 2
    distance = torch.where((relative < mid) & (relative > -mid), torch.full_like(relative, mid - 1), relative.abs())
    logarithmic = torch.ceil(torch.log(distance / mid) / torch.log(torch.tensor((max_distance - 1) / mid))
                             * (mid - 1)) + mid
    return torch.where(distance <= mid, relative, (logarithmic * torch.sign(relative)).long())


class RelativeTable(nn.Module):
    """The stack-wide relative position embeddings and their norm; called with a length, the layers' ``Disentangled``
    bias for it."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.span, self.max_distance, self.dropout = cfg.relative_buckets // 2, cfg.relative_max_distance, cfg.dropout
        self.embedding = nn.Embedding(cfg.relative_buckets, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)

    def no_weight_decay(self) -> set[str]:
        """The table is positions, as position tables are (timm's convention)."""
        return {"embedding.weight"}

    def forward(self, queries: int, keys: int, offset: int = 0) -> Disentangled:
        device = self.embedding.weight.device
        relative = torch.arange(offset, offset + queries, device=device)[:, None] - torch.arange(keys, device=device)
        rows = (log_buckets(relative, self.span, self.max_distance) + self.span).clamp(0, 2 * self.span - 1)
        if tracing():  # the graph keeps the whole table (its slice would be fixed at the traced length)
            return Disentangled(self.norm(self.embedding.weight), rows, self.dropout)
        # only the rows these distances read (the norm is per row): the layers project these alone, a few dozen of
        # the 512 of DeBERTa-v3 for a sentence, where transformers projects them all
        first, last = int(rows.min()), int(rows.max())
        return Disentangled(self.norm(self.embedding.weight[first : last + 1]), rows - first, self.dropout)


class Disentangled:
    """One forward's relative table (normed) and the table row of each (query, key) pair; ``scores`` is what a layer
    adds to its attention scores. In training each layer drops out the table's entries (``dropout``: the hidden
    dropout, as DeBERTa's ``pos_dropout``)."""

    def __init__(self, table: torch.Tensor, rows: torch.Tensor, dropout: float = 0.0) -> None:
        self.table, self.rows, self.dropout = table, rows, dropout

    def scores(self, attention: nn.Module, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """(B, H, T, S) content-to-position + position-to-content terms of a layer (``attention``: its projections)
        with queries q (B, H, T, D) and keys k (B, H, S, D), divided by sqrt(3 D)."""
        H, D = q.shape[1], q.shape[-1]
        table = dropout(self.table, self.dropout, attention.training).to(q.dtype)
        positions_as_queries = attention.q_proj(table).view(-1, H, D).transpose(0, 1)  # (H, R, D)
        positions_as_keys = attention.kv_proj(table)[:, : H * D].view(-1, H, D).transpose(0, 1)
        B, T, S = q.shape[0], q.shape[2], k.shape[2]
        content_to_position = (q @ positions_as_keys.transpose(-1, -2)).gather(-1, self.rows.expand(B, H, T, S))
        position_to_content = (k @ positions_as_queries.transpose(-1, -2)).gather(-1, self.rows.T.expand(B, H, S, T))
        return (content_to_position + position_to_content.transpose(-1, -2)) * (QUERY_SCALE * D ** -0.5)


class DisentangledPositions(PositionScheme):
    name = "disentangled"

    @staticmethod
    def check(cfg) -> None:
        if cfg.relative_buckets < 4 or cfg.relative_buckets % 2 or cfg.relative_max_distance < 0:
            raise ValueError(f"TrunkConfig: positions=disentangled needs an even relative_buckets of at least 4 (half "
                             f"for each direction; got {cfg.relative_buckets}) and a relative_max_distance >= 0 (0: "
                             f"exact distances; got {cfg.relative_max_distance}).")
        if cfg.local_window:
            raise ValueError("TrunkConfig: positions=disentangled scores every query against every key's position; "
                             "it does not combine with local_window. Set local_window: 0, or another positions.")

    @staticmethod
    def bias(cfg, causal: bool = False) -> RelativeTable:
        """The stack's table; a decoder's (``causal``) is its own, of which the causal mask leaves the past half."""
        return RelativeTable(cfg)
