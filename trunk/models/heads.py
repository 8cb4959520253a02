"""Task heads: small modules that map trunk outputs (B, T, C) to task outputs."""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import nn

from trunk.models.kernels import Dropout
from trunk.models.trunk import ACTIVATIONS, Attention, FeedForward, TrunkConfig, init_weights, norm_layer

Pooling = Literal["cls", "mean", "max", "attention"]


def check_pooling(pooling: str) -> None:
    """The one check of a ``pooling`` option, run where a task is configured (before any data is read)."""
    if pooling not in get_args(Pooling):
        raise ValueError(f"pooling must be one of {', '.join(get_args(Pooling))}; got {pooling!r}.")


class AttentionPool(nn.Module):
    """Pooling by attention (SigLIP's multi-head attention pooling head, the Set Transformer's PMA): a learned probe
    attends over the real tokens with the trunk's heads, then an MLP of the trunk's shape is added after a norm.
    (B, T, C) -> (B, C)."""

    def __init__(self, cfg: TrunkConfig) -> None:
        super().__init__()
        self.probe = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        self.attn = Attention(cfg.d_model, cfg.n_heads, bias=cfg.bias)
        self.norm = norm_layer(cfg)
        self.ff = FeedForward.for_trunk(cfg)
        init_weights(self, cfg.init_std)
        nn.init.normal_(self.probe, std=cfg.init_std)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        probe = self.probe.expand(hidden.shape[0], -1, -1).to(hidden.dtype)
        x = self.attn(probe, None if attention_mask is None else attention_mask.bool(), context=hidden)
        return (x + self.ff(self.norm(x)))[:, 0]


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, how: Pooling) -> torch.Tensor:
    """(B, T, C) -> (B, C): the first ([CLS]) vector, or the mean or the per-channel maximum over real
    (unpadded) tokens. Max pooling is a CNN's max-over-time: each channel says whether its feature occurs
    anywhere in the text. (``attention`` pooling has weights: ``AttentionPool``.)"""
    if how == "cls":
        return hidden[:, 0]
    if attention_mask is None:
        return hidden.amax(dim=1) if how == "max" else hidden.mean(dim=1)
    real = attention_mask.bool().unsqueeze(-1)  # (B, T, 1)
    if how == "max":
        return hidden.masked_fill(~real, torch.finfo(hidden.dtype).min).amax(dim=1)
    weights = real.to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class SequenceClassificationHead(nn.Module):
    """Pool the sequence, then a BERT-style pooler (dense + tanh; then ``norm``, ModernBERT's head) and a linear
    classifier; without ``pooler`` the classifier reads the pooled vector itself (a d_model-times smaller head: what a
    delta on a frozen trunk trains beside it). Dropout acts on the classifier's input alone, as in
    ``BertForSequenceClassification``: a dropout before the pooler too (RoBERTa's head) cost OpenBookQA 1.4 points of
    accuracy from MiniLM (docs/results.md). Every head initialises itself (``init_std``: the trunk's)."""

    def __init__(
        self,
        d_model: int,
        num_labels: int,
        pooling: Pooling = "cls",
        dropout: float = 0.1,
        pooler: bool = True,
        init_std: float = 0.02,
        attention_pool: AttentionPool | None = None,
        norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        check_pooling(pooling)
        if (pooling == "attention") != (attention_pool is not None):
            raise ValueError("pooling='attention' pools through an AttentionPool, which only it takes.")
        if norm is not None and not pooler:
            raise ValueError("pooler_norm: true norms the pooler's output, and this head has none (pooler: false).")
        self.pooling = pooling
        self.dense = nn.Linear(d_model, d_model) if pooler else None
        self.norm = norm
        self.drop = Dropout(dropout)
        self.classifier = nn.Linear(d_model, num_labels)
        init_weights(self, init_std)
        self.attention_pool = attention_pool  # initialised by itself

    @classmethod
    def for_trunk(cls, cfg: TrunkConfig, num_labels: int, pooling: Pooling, dropout: float, pooler: bool,
                  pooler_norm: bool = False) -> SequenceClassificationHead:
        """The head on a trunk of ``cfg`` (its width and init; an ``AttentionPool`` of its shape for ``attention``; the
        trunk's norm after the pooler with ``pooler_norm``)."""
        return cls(cfg.d_model, num_labels, pooling, dropout, pooler, cfg.init_std,
                   AttentionPool(cfg) if pooling == "attention" else None, norm_layer(cfg) if pooler_norm else None)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """hidden: (B, T, C) -> logits (B, num_labels)."""
        x = pool(hidden, attention_mask, self.pooling) if self.attention_pool is None else self.attention_pool(
            hidden, attention_mask)
        if self.dense is not None:  # the pooler reads the trunk's output as it is (BERT's and ModernBERT's heads)
            x = torch.tanh(self.dense(x))
            x = x if self.norm is None else self.norm(x)
        return self.classifier(self.drop(x))  # dropout on the classifier's input only


class MaskedLMHead(nn.Module):
    """BERT's MLM head: dense + activation + LayerNorm (bias-free with ``norm_bias=False``, as a bias-free trunk's),
    then a decoder onto the vocabulary whose weight is the token embedding (tied: one matrix for reading and writing
    tokens)."""

    def __init__(self, token_embedding: nn.Embedding, activation: str = "gelu", eps: float = 1e-5,
                 init_std: float = 0.02, d_model: int | None = None, norm_bias: bool = True) -> None:
        super().__init__()
        vocab_size, width = token_embedding.weight.shape  # d_model (None: the same) -> width (ELECTRA's 256 -> 128)
        self.dense = nn.Linear(d_model or width, width)
        self.act = ACTIVATIONS[activation]()
        self.norm = nn.LayerNorm(width, eps=eps, bias=norm_bias)
        self.decoder = nn.Linear(width, vocab_size)
        self.decoder.weight = token_embedding.weight
        init_weights(self.dense, init_std)  # not the decoder: its weight is the embedding

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (..., C) at the positions to predict (the masked ones only) -> (..., vocab) logits."""
        return self.decoder(self.norm(self.act(self.dense(hidden))))


class ReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator head: dense + activation, then one logit per token ("was this token replaced?"). With
    ``norm`` (DeBERTa-v3's head), each token's vector plus the first token's ([CLS]) is normed before the dense layer:
    every token is judged in the context of the whole input."""

    def __init__(self, d_model: int, activation: str = "gelu", init_std: float = 0.02, norm: nn.Module | None = None
                 ) -> None:
        super().__init__()
        self.norm = norm
        self.dense = nn.Linear(d_model, d_model)
        self.act = ACTIVATIONS[activation]()
        self.out = nn.Linear(d_model, 1)
        init_weights(self, init_std)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (B, T, C) -> logits (B, T)."""
        if self.norm is not None:
            hidden = self.norm(hidden[:, :1] + hidden)
        return self.out(self.act(self.dense(hidden))).squeeze(-1)


class TokenClassificationHead(nn.Module):
    """Per-token labels: dropout and a linear classifier on every position's vector; with ``norm`` (ModernBERT's token
    head), first a dense layer, the trunk's ``activation`` and that norm."""

    def __init__(self, d_model: int, num_labels: int, dropout: float = 0.1, init_std: float = 0.02,
                 norm: nn.Module | None = None, activation: str = "gelu") -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model) if norm is not None else None
        self.act = ACTIVATIONS[activation]() if norm is not None else None
        self.norm = norm
        self.drop = Dropout(dropout)
        self.classifier = nn.Linear(d_model, num_labels)
        init_weights(self, init_std)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (B, T, C) -> logits (B, T, num_labels)."""
        if self.norm is not None:
            hidden = self.norm(self.act(self.dense(hidden)))
        return self.classifier(self.drop(hidden))


class SpanHead(nn.Linear):
    """Extractive QA: a start and an end logit per token, (B, T, C) -> (B, T, 2)."""

    def __init__(self, d_model: int, init_std: float = 0.02) -> None:
        super().__init__(d_model, 2)
        init_weights(self, init_std)
