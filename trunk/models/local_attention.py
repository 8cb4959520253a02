"""Local (sliding-window) attention with global tokens, as Longformer's (Beltagy et al. 2020): each query sees the
keys at most ``radius`` positions away, the first ``n_global`` positions ([CLS], a question) see every key and are
seen by every query. Memory and time grow with length x (3 radius + globals) instead of length^2.

Written with tensor ops, not a kernel of its own: the input is cut into chunks of ``radius`` queries, each attending
to the global keys and its 3-chunk key window (an ``unfold`` of the keys) under one float mask, the chunks a batch
dimension of the same attention call full attention makes (``kernels.attend``: SDPA's fused kernel, which keeps no
(queries, keys) scores for backward). So it runs wherever PyTorch does (CPU, GPU, FSDP2), and a window that covers
the whole input is plain attention (``Backbone`` then takes the full path, so the two agree exactly). The ONNX
exporter gets the same attention as a (T, T) mask (``local_mask``): its graph takes any length, which the chunking's
shapes do not trace to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trunk.models.kernels import attend


@dataclass(frozen=True)
class SlidingWindow:
    """Local attention's layout at one input: built once per forward (``sliding_window``) and read by every block.
    ``mask``: (B * chunks, 1 or H, chunk, G + 3 chunk), the float mask of each chunk's queries against the global keys
    and its window (the position bias where a query sees a key, the dtype's lowest value elsewhere); ``global_mask``:
    (B, 1 or H, G, T), that of the global queries against every key."""

    chunk: int
    n_global: int
    mask: torch.Tensor
    global_mask: torch.Tensor | None


def sliding_window(key_padding_mask: torch.Tensor | None, batch: int, length: int, radius: int, n_global: int = 0,
                   causal: bool = False, position_bias=None, dtype: torch.dtype = torch.float32,
                   device: torch.device | None = None) -> SlidingWindow:
    """The ``SlidingWindow`` of a (batch, length) input; ``key_padding_mask`` (B, T) is True at real tokens.
    ``position_bias``: a ``PositionBias`` (ALiBi, T5), or None. ``dtype``: that of the attention scores (autocast's)."""
    c, G = radius, n_global  # chunk length: a chunk's queries see its own chunk and the two beside it
    n = -(-length // c)
    extra = n * c - length
    real = (
        key_padding_mask if key_padding_mask is not None else torch.ones(batch, length, dtype=torch.bool, device=device)
    )
    device = real.device
    query = torch.arange(n * c, device=device).view(n, 1, c, 1)
    window = (torch.arange(n * c + 2 * c, device=device) - c).unfold(0, 3 * c, c)  # (n, 3c): each window key's position
    key = torch.cat([torch.arange(G, device=device).expand(n, G), window], 1).view(n, 1, 1, G + 3 * c)
    slot_is_global = (torch.arange(G + 3 * c, device=device) < G).view(1, 1, 1, -1)
    # a global key is seen through its own slot only (not again in a window that holds it)
    reach = slot_is_global | (((key - query).abs() <= radius) & (key >= G))
    if causal:
        reach = reach & (key <= query)
    key_real = torch.cat([real[:, :G, None].expand(-1, -1, n).transpose(1, 2),
                          F.pad(real, (c, extra + c), value=False).unfold(1, 3 * c, c)], 2)  # (B, n, G + 3c)
    allowed = reach[None] & key_real[:, :, None, None, :]  # (B, n, 1, c, G + 3c)
    bias = 0.0 if position_bias is None else position_bias.of_distances((key - query)[:, 0])  # (n, H, c, G + 3c)
    mask = floor(allowed, bias, dtype).flatten(0, 1)
    if not G:
        return SlidingWindow(c, G, mask, None)
    allowed = real[:, None, None, :]  # the global queries: every real key (the past ones, causal)
    if causal:
        allowed = allowed & (torch.arange(length, device=device) <= torch.arange(G, device=device)[:, None])
    bias = 0.0 if position_bias is None else position_bias(G, length)
    return SlidingWindow(c, G, mask, floor(allowed, bias, dtype))


def floor(allowed: torch.Tensor, bias, dtype: torch.dtype) -> torch.Tensor:
    """The float mask: ``bias`` where ``allowed``, the dtype's lowest value elsewhere. Not -inf: a padding query far
    from every real token sees no key and averages what it gets, finite, where -inf would make NaN that would reach
    real tokens through the next layer's values (0 x NaN); a real query always sees a key, so the floor weighs
    nothing there."""
    return torch.where(allowed, torch.as_tensor(bias, dtype=dtype, device=allowed.device), torch.finfo(dtype).min)


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: SlidingWindow,
                             p: float = 0.0) -> torch.Tensor:
    """q, k, v: (B, H, T, D). Returns (B, H, T, D)."""
    B, H, T, D = q.shape
    c, G = window.chunk, window.n_global
    n = -(-T // c)
    extra = n * c - T

    def keys(x: torch.Tensor) -> torch.Tensor:  # (B * n, H, G + 3c, D): the global keys (values), then the window's
        windows = F.pad(x, (0, 0, c, extra + c)).unfold(2, 3 * c, c).permute(0, 2, 1, 4, 3)  # (B, n, H, 3c, D)
        return torch.cat([x[:, None, :, :G].expand(-1, n, -1, -1, -1), windows], 3).flatten(0, 1)

    chunks = F.pad(q, (0, 0, 0, extra)).view(B, H, n, c, D).transpose(1, 2).flatten(0, 1)  # (B * n, H, c, D)
    y = attend(chunks, keys(k), keys(v), window.mask, p)
    y = y.view(B, n, H, c, D).transpose(1, 2).reshape(B, H, n * c, D)[:, :, :T]
    if not G:
        return y
    rows = attend(q[:, :, :G], k, v, window.global_mask, p)  # the global queries against every key
    return torch.cat([rows, y[:, :, G:]], dim=2)


def local_mask(length: int, radius: int, n_global: int, device: torch.device | None = None) -> torch.Tensor:
    """The (length, length) boolean mask of the same attention (True: the query sees the key), for the written-out
    path where the chunked one cannot go: the ONNX exporter, whose graph takes any length."""
    i, j = torch.arange(length, device=device)[:, None], torch.arange(length, device=device)[None, :]
    return ((i - j).abs() <= radius) | (i < n_global) | (j < n_global)
