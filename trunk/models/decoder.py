"""The decoder of sequence-to-sequence models, built from the trunk's own parts.

A ``DecoderBlock`` is a trunk ``Block`` whose self-attention is causal, plus a cross-attention on
the encoder's output (the *memory*) between it and the feed-forward. The ``Decoder`` embeds target
tokens with a ``TokenStem`` and reads logits off the same embedding matrix (tied output
projection). ``KVCache`` holds each layer's keys and values between generation steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trunk.models.kernels import Unpadded
from trunk.models.stems import TokenStem
from trunk.models.trunk import Attention, Block, TrunkConfig, init_weights, norm_layer, position_bias, run_block


class KVCache:
    """Keys and values of every decoder layer, kept between generation steps.

    Each layer has a ``self`` dict (the generated tokens' keys and values, growing by one token per
    step) and a ``cross`` dict (the memory's, projected once). ``reorder`` follows beam search as
    it moves hypotheses between beams.
    """

    def __init__(self, n_layers: int) -> None:
        self.layers = [{"self": {}, "cross": {}} for _ in range(n_layers)]

    def __len__(self) -> int:
        """The number of tokens cached so far."""
        keys = self.layers[0]["self"].get("k") if self.layers else None
        return 0 if keys is None else keys.shape[2]

    def reorder(self, index: torch.Tensor, memory_rows: torch.Tensor | None = None) -> None:
        """Keep rows ``index`` (B',) of the batch, in that order. The memory's keys and values are taken
        at ``memory_rows`` when given (beam search widening from one hypothesis per sentence to K);
        otherwise they stay: beam search moves hypotheses only among the beams of one sentence, whose
        memories are equal."""
        for layer in self.layers:
            for kind, rows in (("self", index), ("cross", memory_rows)):
                if rows is not None:
                    for name in ("k", "v"):
                        layer[kind][name] = layer[kind][name].index_select(0, rows)


class DecoderBlock(Block):
    """Causal self-attention, cross-attention on the memory, feed-forward; each a residual sublayer."""

    def __init__(self, cfg: TrunkConfig, index: int = 0) -> None:
        super().__init__(cfg, index)
        # no rotation: no shared positions
        self.cross_attn = Attention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, bias=cfg.bias)
        self.norm_cross = norm_layer(cfg)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None = None,
        cache: dict | None = None,
        unpadded: Unpadded | None = None,
        position_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, U, C), or its (N, C) real tokens with ``unpadded`` (training)."""
        x = self.residual(
            x,
            lambda h: self.attn(
                h,
                causal=True,
                cache=None if cache is None else cache["self"],
                unpadded=unpadded,
                position_bias=position_bias,
            ),
            self.norm_attn,
            self.scale_attn,
        )
        x = self.residual(
            x,
            lambda h: self.cross_attn(
                h, memory_mask, context=memory, cache=None if cache is None else cache["cross"], unpadded=unpadded
            ),
            self.norm_cross,
        )
        return self.residual(x, self.ff, self.norm_ff, self.scale_ff)


class Decoder(nn.Module):
    """Target tokens (B, U) + memory (B, S, C) -> next-token logits (B, U, vocab).

    ``cfg`` gives the target vocabulary, depth and every other architecture field (the encoder's,
    usually). Right-padded targets need no self-attention padding mask: the causal mask already
    keeps every real token from seeing the padding after it. ``tied_output``: the logits read the target embeddings
    (else a projection of their own).
    """

    def __init__(self, cfg: TrunkConfig, tied_output: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.stem = TokenStem(cfg)
        # the output projection: the target embeddings themselves, or (T5 v1.1's) a matrix of its own
        self.output = None if tied_output else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.blocks = nn.ModuleList(DecoderBlock(cfg, i) for i in range(cfg.n_layers))
        self.final_norm = norm_layer(cfg) if cfg.norm == "pre" else nn.Identity()
        self.output_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.position_bias = position_bias(cfg, causal=True)  # alibi, t5: the decoder's own, for its self-attention
        self.grad_checkpointing = False
        init_weights(self, cfg.init_std)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute block activations in backward when training (``run_block``)."""
        self.grad_checkpointing = enable

    def forward(self, input_ids: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """With ``cache``, ``input_ids`` are only the tokens after the cached ones."""
        return self.logits(self.hidden(input_ids, memory, memory_mask, cache))

    def hidden(self, input_ids: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
               cache: KVCache | None = None, target_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The last block's normalised output (B, U, C). With ``target_mask`` (B, U), True at real target
        tokens, padded targets are computed on their real tokens only (zeros at the padding)."""
        offset = 0 if cache is None else len(cache)
        x = self.stem(input_ids, offset=offset)
        U = input_ids.shape[1]
        bias = None if self.position_bias is None else self.position_bias(U, offset + U, offset)
        unpadded = Unpadded(target_mask) if cache is None and Unpadded.pays(target_mask) else None
        if unpadded is not None:
            x = unpadded.unpad(x)
        for i, block in enumerate(self.blocks):
            x = run_block(
                block,
                self.grad_checkpointing,
                x,
                memory,
                memory_mask,
                None if cache is None else cache.layers[i],
                unpadded,
                bias,
            )
        x = self.final_norm(x)
        return x if unpadded is None else unpadded.pad(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., target vocab), through the target embeddings (tied) or the output projection."""
        return F.linear(hidden, (self.stem.token if self.output is None else self.output).weight, self.output_bias)

    def new_cache(self) -> KVCache:
        return KVCache(len(self.blocks))
