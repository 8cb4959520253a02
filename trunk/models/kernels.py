"""Kernels the trunk runs on: a faster CPU dropout, the real-token (unpadded) layout of a padded batch, and
self-attention by groups of like-length examples. They change how the blocks compute, not what: ``trunk.py`` reads
without them."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout``, about twice as fast on CPU (benchmarks/throughput.py).

    On CPU, torch draws one 32-bit random number per element for dropout's Bernoulli mask, and the
    draw costs far more than the multiply: dropout took about a third of a training step. Here one
    32-bit draw serves two elements (two 15-bit halves), and the mask is made already scaled, so the
    forward and the backward are one multiply each. The keep probability is 1 - round(32768 p) / 32768,
    within 2e-5 of 1 - p. The saved mask has x's dtype (F.dropout keeps a bool one). On other
    devices, where dropout is a fused kernel, this is ``F.dropout``.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, training)
    n = x.numel()
    # uniform in [0, 32768)
    bits = (torch.empty((n + 1) // 2, dtype=torch.int32).random_().view(torch.int16)[:n] & 0x7FFF)
    keep_scaled = torch.where(bits >= round(p * 32768), 1.0 / (1.0 - p), 0.0).to(x.dtype)
    return x * keep_scaled.view(x.shape)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, p: float,
           written_out: bool = False) -> torch.Tensor:
    """softmax(QK^T / sqrt(D) + mask) V, dropout ``p`` on the probabilities: SDPA (its flash / memory-efficient kernels
    keep no (queries, keys) scores for backward), or the same steps written out (``written_out``, and on CPU where SDPA
    is slow: with dropout it falls back to these steps but draws its mask with the slow Bernoulli; for one query, a
    decoding step, its flash kernel costs 1.2x these steps in fp32, 5x in bf16)."""
    if written_out or (q.device.type == "cpu" and (p > 0 or q.shape[-2] == 1)):
        return attention_written_out(q, k, v, mask, p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


def attention_written_out(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, p: float
) -> torch.Tensor:
    """``attend``'s steps written out (a bool mask: False is -inf; a float one is added)."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return dropout(scores.softmax(-1), p) @ v


class Dropout(nn.Dropout):
    """``nn.Dropout`` on the fast ``dropout`` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


class Unpadded:
    """Where the real tokens of a padded (B, T) batch are, so the blocks compute on real tokens only.

    Fine-tuning batches are padded to their longest row; at SST-2's lengths most positions are
    padding. The backbone gathers the N real tokens into (N, C) once; every linear layer, norm and
    dropout then runs on N rows, and attention alone scatters queries, keys and values back into
    the padded (B, T) layout for its masked product (``pad``) and gathers its output (``unpad``).
    """

    def __init__(self, key_padding_mask: torch.Tensor) -> None:
        self.mask = key_padding_mask
        self.batch, self.length = key_padding_mask.shape
        flat = key_padding_mask.reshape(-1)
        real = flat.nonzero().squeeze(1)  # flat positions of the real tokens, example by example
        self.real = real.numel()
        # The rows are the real tokens, then padding positions up to a round count (computed along, dropped by pad):
        # batches of nearly the same size then allocate tensors of one size. Sizes that differ by every token
        # fragment the allocator's heap: a 3-epoch MiniLM fine-tune grew to 5.3 GB resident (2.4 GiB so rounded).
        rows = min(rounded(self.real), flat.numel())
        self.index = real if rows == self.real else torch.cat([real, (~flat).nonzero().squeeze(1)[: rows - self.real]])

    @functools.cached_property
    def groups(self) -> LengthGroups | None:
        """The batch's examples in groups of like length for self-attention (``LengthGroups``); None where one
        group, the padded batch, is about as cheap."""
        return LengthGroups.of(self)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (N, C): the real tokens' rows, then the padding rows that round N."""
        return x.reshape(-1, x.shape[-1]).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C) -> (B, T, C), zeros at the padding (the rounding rows' values dropped)."""
        out = x.new_zeros(self.batch * self.length, x.shape[-1])
        out.index_copy_(0, self.index[: self.real], x[: self.real])
        return out.view(self.batch, self.length, -1)

    @staticmethod
    def pays(key_padding_mask: torch.Tensor | None) -> bool:
        """Worth it from a tenth of padding up: below that, the gathers cost more than they save. Never while
        tracing (ONNX export, torch.export): the graph cannot branch on the mask's values."""
        if tracing():
            return False
        return (
            key_padding_mask is not None
            and key_padding_mask.numel() > 0
            and bool(key_padding_mask.float().mean() < 0.9)
        )


@dataclass(frozen=True)
class LengthGroup:
    """``size`` examples padded to ``length`` positions: rows ``start`` to ``start + size * length`` of the grouped
    layout. ``mask`` (size, 1, 1, length): True at real keys; None where every position is real."""

    start: int
    size: int
    length: int
    mask: torch.Tensor | None


class LengthGroups:
    """Self-attention by groups of examples of like length: each group padded to its own longest, not the batch's.

    A padded batch's attention costs batch x length^2 whatever its real lengths: at extractive QA's 256-token windows,
    64% real, most of a training step was attention over padding. Examples sorted by length, a group takes the
    next ones while they are at least ``KEEP`` of its longest, so each costs at most 1 / KEEP^2 its own length^2
    (varlen attention kernels, which skip all padding, are CUDA-only). An example keeps its positions (0 to its
    length), so position schemes that rotate queries and keys (rope) see the same positions as in the padded batch.
    """

    KEEP = 0.7  # an example joins a group while at least this share of the group's longest
    PAYS = 0.75  # grouped, when attention's work falls to at most this share of the padded batch's

    def __init__(self, groups: list[LengthGroup], slots: torch.Tensor, rows: int) -> None:
        self.parts, self.slots = groups, slots  # slots: each real token's row in the grouped layout
        self.total = groups[-1].start + groups[-1].size * groups[-1].length
        # unpad's rows: the real tokens', then any (row 0) for the rows that round their count (dropped by pad)
        self.back = torch.cat([slots, slots.new_zeros(rows - slots.numel())])

    @classmethod
    def of(cls, unpadded: Unpadded) -> LengthGroups | None:
        mask = unpadded.mask
        B, T = mask.shape
        positions = torch.arange(1, T + 1, device=mask.device)
        extents = (mask * positions).amax(1).tolist()  # each example's last real position + 1
        order = sorted(range(B), key=lambda b: -extents[b])
        members: list[list[int]] = []
        for b in order:
            if not members or extents[b] < cls.KEEP * extents[members[-1][0]]:
                members.append([])
            members[-1].append(b)
        lengths = [max(extents[group[0]], 1) for group in members]
        if sum(len(g) * n * n for g, n in zip(members, lengths)) > cls.PAYS * B * T * T:
            return None
        groups, base, start = [], [0] * B, 0
        for group, n in zip(members, lengths):
            for slot, b in enumerate(group):
                base[b] = start + slot * n
            taken = mask[torch.tensor(group, device=mask.device), :n]
            groups.append(LengthGroup(start, len(group), n, None if bool(taken.all()) else taken[:, None, None, :]))
            start += len(group) * n
        flat = unpadded.index[: unpadded.real]  # the real tokens' flat positions, b * T + t
        slots = torch.tensor(base, device=mask.device)[flat // T] + flat % T
        return cls(groups, slots, unpadded.index.numel())

    def pad(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(N, C) real-token rows -> one (size, length, C) tensor per group, zeros at the padding."""
        out = x.new_zeros(self.total, x.shape[-1])
        out.index_copy_(0, self.slots, x[: self.slots.numel()])
        return [out[g.start: g.start + g.size * g.length].view(g.size, g.length, -1) for g in self.parts]

    def unpad(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """One (size, length, C) tensor per group -> the (N, C) real-token rows (``Unpadded.unpad``'s count)."""
        return torch.cat([y.reshape(-1, y.shape[-1]) for y in parts]).index_select(0, self.back)


def rounded(tokens: int) -> int:
    """``tokens`` rounded up to a multiple of a sixteenth to a thirty-second of it (a power of two, at least 8): at
    most 1/16 more rows to compute, and a few sizes per doubling of the batch's tokens."""
    step = max(8, 1 << max(tokens.bit_length() - 5, 0))
    return -(-tokens // step) * step


def tracing() -> bool:
    """Whether the model is being traced into a graph (torch.compile, torch.export, ONNX export, TorchScript):
    then no Python branch may read tensor values, and no Python cache may hand out tensors."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
