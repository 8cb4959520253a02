"""Local (sliding-window) attention with global tokens, as Longformer's (Beltagy et al. 2020): each query sees the
keys at most ``radius`` positions away, the first ``n_global`` positions ([CLS], a question) see every key and are
seen by every query. Memory and time grow with length x (3 radius + globals) instead of length^2.

Written with tensor ops (chunks of ``radius`` queries against their 3-chunk key windows, an ``unfold`` view), not a
kernel: it runs wherever PyTorch does (CPU, GPU, FSDP2), and a window that covers the whole input is plain attention
(``Backbone`` then takes the full path, so the two agree exactly). The ONNX exporter gets the same attention as a
(T, T) mask (``local_mask``): its graph takes any length, which the chunking's shapes do not trace to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from trunk.models.kernels import dropout


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None,
                             radius: int, n_global: int = 0, p: float = 0.0, causal: bool = False,
                             position_bias=None) -> torch.Tensor:
    """q, k, v: (B, H, T, D); key_padding_mask: (B, T), True at real tokens. ``position_bias``: a
    ``PositionBias`` (called as ``bias(queries, keys, offset)``), or None. Returns (B, H, T, D)."""
    B, H, T, D = q.shape
    c = radius  # chunk length: a chunk's queries see its own chunk and the two beside it
    n = -(-T // c)
    extra = n * c - T
    real = key_padding_mask if key_padding_mask is not None else torch.ones(B, T, dtype=torch.bool, device=q.device)
    q = q * D**-0.5

    # -- the window: chunk i's queries (positions i*c + a) against keys i*c - c + j, j < 3c ---------------------------
    def windows(x: torch.Tensor) -> torch.Tensor:  # (B, H, n, D, 3c), a view of the padded keys or values
        return F.pad(x, (0, 0, c, extra + c)).unfold(2, 3 * c, c)

    scores = F.pad(q, (0, 0, 0, extra)).view(B, H, n, c, D) @ windows(k)  # (B, H, n, c, 3c)
    offset = torch.arange(3 * c, device=q.device)[None, :] - c - torch.arange(c, device=q.device)[:, None]  # key - query
    near = (offset.abs() <= radius) & ((offset <= 0) if causal else True)  # (c, 3c)
    position = (torch.arange(n * c + 2 * c, device=q.device) - c).unfold(0, 3 * c, c)  # (n, 3c): each window key's position
    seen = F.pad(real, (c, extra + c), value=False).unfold(1, 3 * c, c) & (position >= n_global)  # (B, n, 3c); globals below
    allowed = near[None, None, None] & seen[:, None, :, None, :]  # (B, 1, n, c, 3c)
    if position_bias is not None:
        scores = scores + position_bias(c, 3 * c, c).to(scores.dtype)[:, :, None]
    never = torch.finfo(scores.dtype).min  # not -inf: see below
    scores = scores.masked_fill(~allowed, never).view(B, H, n * c, 3 * c)[:, :, :T]

    # -- every query against the global keys ----------------------------------------------------------------------------
    if n_global:
        global_scores = q @ k[:, :, :n_global].transpose(-1, -2)  # (B, H, T, G)
        global_allowed = real[:, None, None, :n_global]
        if causal:
            global_allowed = global_allowed & (torch.arange(n_global, device=q.device)[None, :] <= torch.arange(T, device=q.device)[:, None])
        if position_bias is not None:
            global_scores = global_scores + position_bias(T, n_global).to(scores.dtype)
        scores = torch.cat([global_scores.masked_fill(~global_allowed, never), scores], dim=-1)
    # A real query always sees a real key (itself, or its window's), so the finite floor weighs nothing there; a
    # padding query far from every real token sees none and averages what it gets: finite, where -inf would make NaN,
    # which would reach real tokens through the next layer's values (0 x NaN).
    probs = dropout(scores.softmax(-1), p)
    global_probs, probs = probs.split([n_global, 3 * c], dim=-1)
    probs = F.pad(probs, (0, 0, 0, extra)).view(B, H, n, c, 3 * c)
    y = (probs @ windows(v).transpose(-1, -2)).view(B, H, n * c, D)[:, :, :T]
    if not n_global:
        return y
    y = y + global_probs @ v[:, :, :n_global]

    # -- the global queries against every key -----------------------------------------------------------------------------
    rows = q[:, :, :n_global] @ k.transpose(-1, -2)  # (B, H, G, T)
    rows_allowed = real[:, None, None, :]
    if causal:
        rows_allowed = rows_allowed & (torch.arange(T, device=q.device)[None, :] <= torch.arange(n_global, device=q.device)[:, None])
    if position_bias is not None:
        rows = rows + position_bias(n_global, T).to(rows.dtype)
    rows = dropout(rows.masked_fill(~rows_allowed, never).softmax(-1), p) @ v
    return torch.cat([rows, y[:, :, n_global:]], dim=2)


def local_mask(length: int, radius: int, n_global: int, device: torch.device | None = None) -> torch.Tensor:
    """The (length, length) boolean mask of the same attention (True: the query sees the key), for the written-out
    path where the chunked one cannot go: the ONNX exporter, whose graph takes any length."""
    i, j = torch.arange(length, device=device)[:, None], torch.arange(length, device=device)[None, :]
    return ((i - j).abs() <= radius) | (i < n_global) | (j < n_global)
