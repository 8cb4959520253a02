"""Positions as a bias on the attention scores, from the distance between a query and a key: ALiBi (Press et al.
2022: a fixed slope per head) and T5's relative positions (Raffel et al. 2020: a learned scalar per head and distance
bucket, shared by every layer). Neither adds anything to the embeddings; both see only distances, so they apply to
inputs longer than the training ones (the extrapolation ALiBi was made for). Under tensor parallelism each process
keeps the bias of its own heads (``PositionBias.keep_heads``).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from trunk.models.positions.base import PositionScheme
from trunk.models.positions.tables import Learned

BIASES = ("alibi", "t5")  # the kinds of PositionBias


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's head slopes: the geometric sequence 2^(-8/n), 2^(-16/n), ... for n heads; for a head count that is
    not a power of two, those of the power below plus every other one of the power above (the paper's recipe)."""
    def powers(n: int) -> list[float]:
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]

    below = 2 ** math.floor(math.log2(n_heads))
    return torch.tensor(powers(below) + powers(2 * below)[0::2][: n_heads - below])


def relative_buckets(relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bucket of each relative position (key minus query): half the buckets for keys after the query when
    ``bidirectional`` (none after it otherwise: a causal decoder never sees them); of each half, exact distances up to
    a quarter of the buckets, then buckets growing logarithmically up to ``max_distance``, beyond which all share the
    last one."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = num_buckets // 2
    logarithmic = (
        exact
        + (
            torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (num_buckets - exact)
        ).long()
    )
    return buckets + torch.where(distance < exact, distance, logarithmic.clamp(max=num_buckets - 1))


class PositionBias(nn.Module):
    """The (1, heads, queries, keys) bias added to attention scores: ALiBi's -slope * |query - key| (symmetric in
    an encoder, as MosaicBERT's; only the past is seen under a causal mask), or T5's learned bias of the distance's
    bucket. One module serves every layer of a stack."""

    def __init__(self, kind: Literal["alibi", "t5"], n_heads: int, causal: bool = False, num_buckets: int = 32,
                 max_distance: int = 128) -> None:
        super().__init__()
        if kind not in BIASES:
            raise ValueError(f"A position bias is one of {list(BIASES)}, got {kind!r}.")
        self.kind, self.n_heads, self.causal, self.num_buckets, self.max_distance = (
            kind,
            n_heads,
            causal,
            num_buckets,
            max_distance,
        )
        if kind == "t5":
            self.embedding = nn.Embedding(num_buckets, n_heads)
        else:
            self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def no_weight_decay(self) -> set[str]:
        """The bias table is an offset the model reads, as position tables are (timm's convention)."""
        return {"embedding.weight"} if self.kind == "t5" else set()

    def forward(self, queries: int, keys: int, offset: int = 0) -> torch.Tensor:
        """The bias of queries at positions ``offset`` .. ``offset + queries - 1`` (a decoder's cached steps come
        first) against keys at 0 .. ``keys - 1``."""
        device = self.embedding.weight.device if self.kind == "t5" else self.slopes.device
        relative = (
            torch.arange(keys, device=device)[None, :] - torch.arange(offset, offset + queries, device=device)[:, None]
        )
        return self.of_distances(relative)[None]

    def of_distances(self, relative: torch.Tensor) -> torch.Tensor:
        """The bias of (..., queries, keys) distances (key position minus query position): (..., heads, queries,
        keys)."""
        if self.kind == "alibi":
            return -self.slopes[:, None, None] * relative.abs()[..., None, :, :]
        buckets = relative_buckets(relative, not self.causal, self.num_buckets, self.max_distance)
        return self.embedding(buckets).movedim(-1, -3)

    def keep_heads(self, heads: slice, mesh) -> None:
        """Tensor parallelism: keep the bias of this process's ``heads`` (those of its share of the query and key/value
        projections, in order). ALiBi's slopes are a constant: each process keeps its heads'. T5's table (distance
        buckets x heads) stays whole on every process (replicated, as the fused key/value projection's weights), and
        each reads its heads' columns; their gradients, each process's share, are summed in backward."""
        from torch.distributed.tensor import Partial, Replicate, distribute_tensor

        if self.kind == "alibi":
            self.slopes = self.slopes[heads]
            return
        table = self.embedding
        table.weight = nn.Parameter(distribute_tensor(table.weight, mesh, [Replicate()]))

        def lookup(buckets: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.embedding(buckets, table.weight.to_local(grad_placements=[Partial()])[:, heads])

        table.forward = lookup


class Alibi(PositionScheme):
    name = "alibi"

    @staticmethod
    def bias(cfg, causal: bool = False) -> PositionBias:
        return PositionBias("alibi", cfg.n_heads, causal)


class T5(PositionScheme):
    name = "t5"

    @staticmethod
    def check(cfg) -> None:
        if not 4 <= cfg.relative_buckets < 2 * cfg.relative_max_distance:
            raise ValueError(f"TrunkConfig: relative_buckets={cfg.relative_buckets} must be at least 4 and below twice "
                             f"relative_max_distance={cfg.relative_max_distance}.")

    @staticmethod
    def bias(cfg, causal: bool = False) -> PositionBias:
        return PositionBias("t5", cfg.n_heads, causal, cfg.relative_buckets, cfg.relative_max_distance)


class LearnedRelative(Learned):
    """MPNet's: a learned table added to the embeddings and, beside it, T5's learned bias of the distance's bucket on
    the attention scores (one table for every layer)."""

    name = "learned_relative"

    check = T5.check
    bias = T5.bias
