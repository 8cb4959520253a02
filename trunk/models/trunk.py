"""The trunk: a transformer encoder written from scratch.

Read top to bottom: ``TrunkConfig`` -> ``Attention`` -> ``FeedForward`` -> ``Block`` -> ``Backbone``.
A *stem* (see ``stems.py``) turns raw inputs into vectors, the ``Backbone`` mixes them, and a *head*
(see ``heads.py``) turns them into task outputs. ``Trunk`` is stem + backbone: the part that is
pretrained once and shared by every task. The kernels the blocks run on (a faster CPU dropout, the
real-token layout of padded batches) are in ``kernels.py``.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from trunk.core.checkpoint import load_checkpoint
from trunk.models.kernels import Dropout, LengthGroups, Unpadded, attend, tracing
from trunk.models.local_attention import SlidingWindow, local_mask, sliding_window, sliding_window_attention
from trunk.models.positions import POSITIONS, QUERY_SCALE, Disentangled, PositionBias, PositionScheme, scheme

# Named architectures (litgpt's ``Config.from_name``): a recipe says ``trunk: {preset: base}`` instead of retyping the
# shape; fields it gives itself win. Without a preset the unset shape fields take ``SHAPE_DEFAULTS``.
PRESETS: dict[str, dict] = {
    "tiny": dict(d_model=64, n_layers=2, n_heads=4, d_ff=128),
    "small": dict(d_model=128, n_layers=2, n_heads=4, d_ff=512),
    # configs/pretrain.yaml's
    "base": dict(d_model=256, n_layers=4, n_heads=4, d_ff=1024, max_len=128, positions="rope"),
}
SHAPE_DEFAULTS = dict(
    d_model=256, n_layers=4, n_heads=4, d_ff=1024, max_len=512, positions="learned", norm="pre", activation="gelu"
)


@dataclass
class TrunkConfig:
    """Architecture of the trunk. ``vocab_size`` and ``max_len`` size the text stem only. The shape fields left unset
    (None) take the ``preset``'s values, else ``SHAPE_DEFAULTS``; built, a config holds every value."""

    vocab_size: int = 8192
    d_model: int | None = None  # width
    n_layers: int | None = None  # depth
    n_heads: int | None = None
    d_ff: int | None = None  # feed-forward width, usually 4 * d_model
    dropout: float = 0.1
    attn_dropout: float = 0.1
    token_dropout: float = 0.0  # training only: this share of input tokens gets a zero embedding ("token cutoff")
    max_len: int | None = None
    # learned / sinusoidal: tables added to the embeddings; rope: rotary, inside attention; alibi / t5: a bias on the
    # attention scores from the query-key distance (trunk/models/positions/), t5's in relative_buckets learned buckets;
    # disentangled: DeBERTa's content-to-position and position-to-content scores over relative_buckets embeddings
    positions: str | None = None  # a name of trunk.models.positions.POSITIONS
    norm: Literal["pre", "post"] | None = None  # pre-LN (GPT-2) trains stably without warmup tricks; post-LN is BERT
    # gelu_tanh: GPT-2's and ELECTRA's; quick_gelu: x * sigmoid(1.702 x), OpenAI CLIP's
    activation: Literal["gelu", "gelu_tanh", "quick_gelu", "relu", "silu"] | None = None
    layer_norm_eps: float = 1e-5
    # The text stem, for checkpoints pretrained elsewhere (trunk/formats/hf.py) and for Trunk's own trunks alike:
    # segments: token-type embeddings (BERT's 2), a token's type being the number of [SEP]s before it, so a sentence
    # pair reads [CLS] a [SEP] as 0 and b [SEP] as 1 (0: none); embedding_norm: a LayerNorm on the embeddings (None:
    # with post-LN, as BERT); position_offset: learned position rows before the first token's (RoBERTa's 2);
    # embedding_size: the width of the embedding tables when narrower than d_model, projected up (ELECTRA-small's 128);
    # scale_embedding: token embeddings times sqrt(their width) before positions are added (Vaswani et al.'s, Marian's,
    # NLLB's)
    segments: int = 0
    embedding_norm: bool | None = None
    scale_embedding: bool = False
    # T5's: RMSNorm (a gain, no mean, no bias) wherever the trunk normalises; a gated feed-forward,
    # act(x W_gate) * x W_in (T5 v1.1's gated GELU, LLaMA's SwiGLU with silu)
    rms_norm: bool = False
    gated_ff: bool = False
    # False: the blocks' linear layers and norms have no biases (ModernBERT's; litgpt's ``bias``): fewer parameters,
    # and a model that transformers' bias-free families hold exactly
    bias: bool = True
    # ALBERT's cross-layer sharing: the n_layers layers apply this many distinct blocks, consecutive layers sharing one
    # (1: one block applied n_layers times; 0: every layer a block of its own). Freezing, layer-wise rates and deltas
    # see the distinct blocks; the compute is still n_layers blocks'.
    shared_blocks: int = 0
    position_offset: int = 0
    embedding_size: int | None = None
    init_std: float = 0.02
    relative_buckets: int = 32  # positions=t5, disentangled: buckets of distance (half each way in an encoder)
    relative_max_distance: int = 128  # positions=t5, disentangled: distances from here on share the last bucket
    # local attention (trunk/models/local_attention.py): each token sees the tokens at most local_window positions away
    # (0:
    # all of them), and the first global_tokens positions ([CLS]; raise it to cover a QA question) see and are seen by
    # all
    local_window: int = 0
    global_tokens: int = 1
    # with local_window: blocks 0, n, 2n, ... attend globally, the others locally (ModernBERT's 3; 0: every block local)
    global_every: int = 0
    # rope's base (theta) in global blocks, and in local ones (None: the same; ModernBERT: 160,000 and 10,000)
    rope_base: float = 10000.0
    rope_base_local: float | None = None
    # False: the first block reads the (normed) embeddings without a norm of its own before attention (ModernBERT)
    first_block_norm: bool = True
    # layer scale (CaiT, DINOv2): each block's attention and feed-forward outputs times a learned per-channel vector
    # before the residual sum, started at this value (0: none)
    layer_scale: float = 0.0
    # the patch stem: learned tokens between [CLS] and the patches, without positions, that attention may use as
    # scratch space ("Vision Transformers Need Registers"; DINOv2 with registers' 4)
    registers: int = 0
    # the patch stem prepends a [CLS] token (ViT's, DINOv2's, CLIP's); SigLIP's has none (its heads pool by attention)
    cls_token: bool = True
    # a learned patch position table read at another grid size is resized bicubically, antialiased (PIL's kernel, as
    # DINOv2 with registers resizes) or not (timm's, ViT's)
    resize_antialias: bool = False
    preset: Literal["tiny", "small", "base"] | None = None  # a named shape (PRESETS)

    def __post_init__(self) -> None:
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"TrunkConfig.preset={self.preset!r}: the presets are {', '.join(PRESETS)}.")
        for name, value in {**SHAPE_DEFAULTS, **PRESETS.get(self.preset, {})}.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.embedding_norm is None:
            self.embedding_norm = self.norm == "post"
        if self.embedding_size is None:
            self.embedding_size = self.d_model
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                "choose n_heads so that each head gets d_model / n_heads channels."
            )
        scheme(self.positions).check(self)
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"TrunkConfig.activation={self.activation!r}: choose {', '.join(ACTIVATIONS)}.")
        for name in ("local_window", "global_tokens", "segments", "position_offset", "global_every", "registers",
                     "shared_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrunkConfig.{name} must be >= 0, got {getattr(self, name)}.")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len", "embedding_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrunkConfig.{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("dropout", "attn_dropout", "token_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"TrunkConfig.{name} must be a probability in [0, 1), got {getattr(self, name)}.")
        shared = self.shared_blocks
        if shared and (self.n_layers % shared or self.local_window or not self.first_block_norm):
            raise ValueError(f"TrunkConfig.shared_blocks={shared} must divide n_layers={self.n_layers}, and shared "
                             "blocks are alike at every layer: no local_window, first_block_norm true.")
        if self.layer_scale < 0:
            raise ValueError(f"TrunkConfig.layer_scale must be >= 0 (0: none), got {self.layer_scale}.")
        for name in ("layer_norm_eps", "init_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"TrunkConfig.{name} must be > 0, got {getattr(self, name)}.")

    @property
    def n_blocks(self) -> int:
        """The distinct blocks (weights) of the stack: ``shared_blocks``, else one per layer."""
        return self.shared_blocks or self.n_layers

    def block_of(self, layer: int) -> int:
        """The block that layer ``layer`` applies (ALBERT's group of a layer)."""
        return layer * self.n_blocks // self.n_layers

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_name(cls, name: str, **overrides) -> TrunkConfig:
        """A preset's architecture (``PRESETS``), with ``overrides`` on top: ``TrunkConfig.from_name("base",
        dropout=0.2)``."""
        return cls(preset=name, **overrides)

    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides) -> TrunkConfig:
        """The architecture of a pretrained-trunk directory (its config.json) or of a Trunk checkpoint,
        with ``overrides`` on top (``dropout=0.2``): plain Python, as litgpt's ``Config.from_file``."""
        path = Path(path)
        if path.is_dir():
            values = json.loads((path / "config.json").read_text())["trunk"]
        else:
            values = load_checkpoint(path)["hyper_parameters"]["trunk"]
        return cls.from_dict({**dict(values), **overrides})

    @classmethod
    def from_dict(cls, values: dict) -> TrunkConfig:
        """A config from stored values; fields written by a later version are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the sigmoid approximation of GELU OpenAI's CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {"gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "quick_gelu": QuickGELU,
               "relu": nn.ReLU, "silu": nn.SiLU}


def norm_layer(cfg: TrunkConfig, width: int | None = None) -> nn.Module:
    """The trunk's normalisation of ``width`` (d_model) channels: LayerNorm (without a bias where ``cfg.bias`` is
    False), or RMSNorm with ``cfg.rms_norm``."""
    if cfg.rms_norm:
        return nn.RMSNorm(width or cfg.d_model, eps=cfg.layer_norm_eps)
    return nn.LayerNorm(width or cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)


def position_bias(cfg: TrunkConfig, causal: bool = False) -> nn.Module | None:
    """The stack-wide attention bias of ``cfg.positions`` (alibi, t5); None for the others."""
    return POSITIONS[cfg.positions].bias(cfg, causal)


class Attention(nn.Module):
    """Multi-head attention on ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels).

    Self-attention when ``context`` is None, cross-attention on ``context`` otherwise; the same
    weights layout serves both, so the decoder reuses this class unchanged. Self-attention hands its queries and keys
    to the position scheme's ``rotate`` when it ``rotates`` (rope).

    For incremental decoding, ``cache`` (a dict owned by the caller, one per layer and kind) keeps
    keys and values between calls: self-attention appends the new tokens' and attends to all of
    them, cross-attention projects ``context`` once and reuses it. A step then costs one token.
    ``position_bias`` (1, H, T, S) is added to the scores (ALiBi, T5: ``trunk/models/positions/biases.py``), or
    computed from this layer's queries and keys (DeBERTa's ``Disentangled``).
    """

    def __init__(
        self, d_model: int, n_heads: int, dropout: float = 0.0, positions: type[PositionScheme] = PositionScheme,
        rope_base: float = 10000.0, bias: bool = True,
    ) -> None:
        super().__init__()
        self.n_heads, self.rope_base = n_heads, rope_base
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.positions = positions if positions.rotates else None
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=bias)  # keys and values in one matmul
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        causal: bool = False,
        cache: dict | None = None,
        unpadded: Unpadded | None = None,
        position_bias: torch.Tensor | PositionBias | None = None,
        local: SlidingWindow | tuple[int, int] | None = None,
        query: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, T, C), or its (N, C) real tokens with ``unpadded``. key_padding_mask: (B, S) bool, True at
        real keys. context: (B, S, C). ``local``: sliding-window self-attention (``trunk/models/local_attention.py``),
        whose layout holds the padding, causal and position-bias masks; traced (ONNX), its (radius, global tokens)
        instead, written out as a (T, T) mask. ``query``: self-attention's queries from these vectors (x's shape), its
        keys and values from x (DeBERTa's enhanced mask decoder)."""
        p = self.dropout if self.training else 0.0
        # the cheap conditions first: a model that never groups (position biases, local windows) never builds groups
        plain = unpadded is not None and context is None and cache is None and position_bias is None and local is None
        if plain and unpadded.groups is not None:
            y = self.attend_by_length(x, query, unpadded.groups, key_padding_mask is not None, causal, p)
            return self.out_proj(y)
        pad = unpadded.pad if unpadded is not None else (lambda t: t)  # (N, ·) real tokens -> (B, T, ·)
        q = pad(self.q_proj(x if query is None else query))
        T = q.shape[1]
        q = self.split_heads(q)[0]
        if context is not None and cache is not None and "k" in cache:
            k, v = cache["k"], cache["v"]  # the context's keys and values, projected at the first step
        else:
            kv = pad(self.kv_proj(x)) if context is None else self.kv_proj(context)
            k, v = self.split_heads(kv, 2)
            if context is None:
                offset = cache["k"].shape[2] if cache is not None and "k" in cache else 0  # tokens already cached
                if self.positions is not None:
                    q, k = (self.positions.rotate(t, offset, self.rope_base) for t in (q, k))
                if offset:
                    k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            if cache is not None:  # contiguous: else every later step's attention products copy them
                k, v = k.contiguous(), v.contiguous()
                cache["k"], cache["v"] = k, v
        S = k.shape[2]
        if isinstance(local, SlidingWindow):
            return self.out_proj(self.merge_heads(sliding_window_attention(q, k, v, local, p), unpadded))

        # traced: the same attention, as a (T, T) mask
        mask = (None if local is None else local_mask(T, *local, x.device))
        if key_padding_mask is not None:
            padding = key_padding_mask[:, None, None, :]  # (B, 1, 1, S): broadcast over heads and queries
            mask = padding if mask is None else mask & padding
            if local is not None:  # a padding query far from every real key sees itself: a row of -inf would be NaN,
                # reaching real tokens through the next layer's values (the chunked layout floors instead)
                mask = mask | torch.eye(T, S, dtype=torch.bool, device=x.device)
        if causal and T > 1:
            # SDPA refuses attn_mask together with is_causal, so fold both into one boolean mask.
            # Queries are the last T of the S positions (earlier ones may come from the cache).
            seen = causal_mask(T, S, x.device)
            mask = seen if mask is None else mask & seen
        if position_bias is not None:  # one float mask: the bias, -inf at the keys a query must not see
            # DeBERTa's reads this layer's queries, keys and projections (and scales the content scores by its
            # 1/sqrt(3 D)); the others are one tensor for every layer
            if isinstance(position_bias, Disentangled):
                bias, q = position_bias.scores(self, q, k), q * QUERY_SCALE
            else:
                bias = position_bias.to(q.dtype)
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        # written out when exporting a float mask: the ONNX exporter mis-strides SDPA's output then (a view of it fails)
        y = attend(q, k, v, mask, p, written_out=(position_bias is not None or local is not None) and tracing())
        return self.out_proj(self.merge_heads(y, unpadded))

    def attend_by_length(self, x: torch.Tensor, query: torch.Tensor | None, groups: LengthGroups, masked: bool,
                         causal: bool, p: float) -> torch.Tensor:
        """Self-attention of (N, C) real-token rows, each group of like-length examples padded to its own longest
        (``LengthGroups``): the function of the padded batch's, at a fraction of its cost. ``masked``: padding keys
        are masked (a decoder's causal mask alone keeps its real queries from the padding after them)."""
        ys = []
        for q, kv, group in zip(groups.pad(self.q_proj(x if query is None else query)),
                                groups.pad(self.kv_proj(x)), groups.parts):
            (q,), (k, v), T = self.split_heads(q), self.split_heads(kv, 2), q.shape[1]
            if self.positions is not None:
                q, k = (self.positions.rotate(t, 0, self.rope_base) for t in (q, k))
            mask = group.mask if masked else None
            if causal and T > 1:
                seen = causal_mask(T, T, x.device)
                mask = seen if mask is None else mask & seen
            ys.append(self.merge_heads(attend(q, k, v, mask, p), None))
        return groups.unpad(ys)

    def split_heads(self, x: torch.Tensor, n: int = 1) -> torch.Tensor:
        """(B, T, n x H x D) projections -> (n, B, H, T, D): queries (n = 1), or keys and values (n = 2). H: this
        process's heads under tensor parallelism."""
        B, T, _ = x.shape
        return x.view(B, T, n, -1, self.head_dim).permute(2, 0, 3, 1, 4)

    @staticmethod
    def merge_heads(y: torch.Tensor, unpadded: Unpadded | None) -> torch.Tensor:
        """(B, H, T, D) -> (B, T, H * D), or its real tokens (N, H * D) with ``unpadded``."""
        B, H, T, D = y.shape
        y = y.transpose(1, 2).reshape(B, T, H * D)
        return y if unpadded is None else unpadded.unpad(y)


class FeedForward(nn.Module):
    """Position-wise MLP: expand, activate, project back. No dropout inside (as BERT and GPT-2): on the
    d_ff-wide activations it cost about a seventh of a training step; the block's residual dropout follows.
    ``gated``: the activation of a second projection gates the first, act(x W_gate) * x W_in (GLU variants)."""

    def __init__(self, d_model: int, d_ff: int, activation: str, gated: bool = False, bias: bool = True) -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias)
        self.fc_gate = nn.Linear(d_model, d_ff, bias=bias) if gated else None
        self.act = ACTIVATIONS[activation]()
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)

    @classmethod
    def for_trunk(cls, cfg: TrunkConfig) -> FeedForward:
        """The feed-forward of a trunk of ``cfg``'s shape."""
        return cls(cfg.d_model, cfg.d_ff, cfg.activation, cfg.gated_ff, cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fc_gate is not None:
            return self.fc_out(self.act(self.fc_gate(x)) * self.fc_in(x))
        return self.fc_out(self.act(self.fc_in(x)))


class LayerScale(nn.Module):
    """A learned per-channel scale (CaiT's layer scale, DINOv2's), kept as ``weight`` as a norm keeps its gain."""

    def __init__(self, width: int, value: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((width,), value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class Block(nn.Module):
    """One residual block: attention then feed-forward, each wrapped in a norm (``norm_layer``) + residual (with
    ``cfg.layer_scale``, each output scaled per channel before the sum)."""

    def __init__(self, cfg: TrunkConfig, index: int = 0) -> None:
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        # with local attention, whether this block attends locally (``cfg.global_every``: every n-th attends globally)
        self.local = bool(cfg.local_window) and not (cfg.global_every and index % cfg.global_every == 0)
        base = cfg.rope_base_local if self.local and cfg.rope_base_local is not None else cfg.rope_base
        self.attn = Attention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, POSITIONS[cfg.positions], base, cfg.bias)
        self.norm_attn = norm_layer(cfg) if cfg.first_block_norm or index else nn.Identity()
        self.ff = FeedForward.for_trunk(cfg)
        self.norm_ff = norm_layer(cfg)
        self.drop = Dropout(cfg.dropout)
        scale = (lambda: LayerScale(cfg.d_model, cfg.layer_scale)) if cfg.layer_scale else nn.Identity
        self.scale_attn, self.scale_ff = scale(), scale()

    def residual(self, x: torch.Tensor, sublayer, norm: nn.Module, scale: nn.Module = nn.Identity()) -> torch.Tensor:
        if self.pre_norm:  # x + f(LN(x)): the residual stream is never normalised
            return x + self.drop(scale(sublayer(norm(x))))
        return norm(x + self.drop(scale(sublayer(x))))  # post-LN (BERT): LN(x + f(x))

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, causal: bool = False,
                unpadded: Unpadded | None = None, position_bias: torch.Tensor | PositionBias | None = None,
                local: SlidingWindow | tuple[int, int] | None = None, query: torch.Tensor | None = None
                ) -> torch.Tensor:
        """x: (B, T, C), or (N, C) real tokens with ``unpadded``. ``local``: see ``Attention.forward``. ``query``
        (x's shape): the residual stream and the attention's queries, x only its keys and values (DeBERTa's enhanced
        mask decoder)."""
        keys = x if query is None or not self.pre_norm else self.norm_attn(x)  # normed as the queries are

        def attention(h: torch.Tensor) -> torch.Tensor:
            return self.attn(h if query is None else keys, key_padding_mask, causal=causal, unpadded=unpadded,
                             position_bias=position_bias, local=local, query=None if query is None else h)

        x = self.residual(x if query is None else query, attention, self.norm_attn, self.scale_attn)
        return self.residual(x, self.ff, self.norm_ff, self.scale_ff)


def causal_mask(queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """(queries, keys) bool, True where a query may see a key: the queries are the last of the keys' positions (earlier
    keys may come from a cache)."""
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)


def scores_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype attention's scores will have for hidden states ``x``: autocast's where it is on."""
    return torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype


def run_block(block: nn.Module, grad_checkpointing: bool, *args, replay=None):
    """``block(*args)``; with ``grad_checkpointing`` (in training), its activations are not kept but
    recomputed in backward: less memory for about a third more compute. The random state is replayed,
    so dropout draws the same masks both times, and so is ``replay()`` (a context holding, at recompute time,
    state that hooks read in forward: the deltas' routes)."""
    if grad_checkpointing and block.training and torch.is_grad_enabled():
        context = (
            (lambda: (contextlib.nullcontext(), replay()))
            if replay is not None
            else torch.utils.checkpoint.noop_context_fn
        )
        return torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False, context_fn=context)
    return block(*args)


def take_examples(x: torch.Tensor, key_padding_mask: torch.Tensor | None, unpadded: Unpadded | None,
                  rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, Unpadded | None]:
    """The examples ``rows`` of a batch inside the backbone: of (B, T, C) hidden states, or of the (N, C) real-token
    rows (an example's tokens are consecutive rows), with their mask."""
    mask = None if key_padding_mask is None else key_padding_mask.index_select(0, rows)
    if unpadded is None:
        return x.index_select(0, rows), mask, None
    lengths = key_padding_mask.sum(1)
    taken = lengths.index_select(0, rows)
    shift = (lengths.cumsum(0) - lengths).index_select(0, rows) - (taken.cumsum(0) - taken)  # source start - new start
    tokens = torch.arange(int(taken.sum()), device=x.device) + torch.repeat_interleave(shift, taken)
    unpadded = Unpadded(mask)
    rounding = unpadded.index.numel() - unpadded.real  # rows that round the new count: any values (dropped by pad)
    return nn.functional.pad(x.index_select(0, tokens), (0, 0, 0, rounding)), mask, unpadded


class Backbone(nn.Module):
    """The encoder stack shared by every modality: (B, T, C) vectors in, (B, T, C) vectors out."""

    def __init__(self, cfg: TrunkConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_blocks))
        # Pre-LN leaves the residual stream unnormalised, so it needs one norm at the very end.
        self.final_norm = norm_layer(cfg) if cfg.norm == "pre" else nn.Identity()
        self.position_bias = position_bias(cfg)  # alibi, t5, disentangled: one for every block
        self.grad_checkpointing = False
        self.replay = None  # set by whatever adds state-reading hooks (trunk/models/deltas.py): see run_block
        init_weights(self, cfg.init_std)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute block activations in backward (``run_block``)."""
        self.grad_checkpointing = enable

    def local_span(self, length: int) -> tuple[int, int] | None:
        """(radius, global tokens) of local attention at this input length; None where every query would see every key
        anyway (a window covering the input, or all of it global): full attention, the same function, is then used."""
        radius, n_global = self.cfg.local_window, self.cfg.global_tokens
        if not radius or (not tracing() and (length <= radius + 1 or length <= n_global)):
            return None
        return radius, n_global  # traced (ONNX): local at every length, as the graph's length is not fixed

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, causal: bool = False,
                fork: tuple[int, torch.Tensor] | None = None, decoder_positions: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Padded batches compute on their real tokens only (``Unpadded``); outputs at padding are zeros.
        ``fork=(layer, rows)``: from block ``layer`` on, the batch is its examples ``rows`` (an index, repeats allowed):
        several tasks' deltas on shared inputs, the blocks below computed once per input. The output has ``len(rows)``
        examples. With ``cfg.local_window``, inputs longer than the window attend locally (``local_span``).
        ``decoder_positions`` (T, C), DeBERTa's enhanced mask decoder: the last block runs twice on the layer below
        it, its queries first these absolute positions plus that layer's output, then its own first output."""
        B, T = x.shape[:2]
        span = self.local_span(T)
        windowed = span is not None and not tracing()

        def local_layout(mask: torch.Tensor | None, batch: int) -> SlidingWindow | tuple[int, int] | None:
            """Local attention's masks (the position bias in them) for every block; traced, its (radius, globals)."""
            return (
                sliding_window(mask, batch, T, *span, causal, self.position_bias, scores_dtype(x), x.device)
                if windowed
                else span
            )

        local = local_layout(key_padding_mask, B)
        # the full-attention bias, for every block when none is windowed, else for the global ones (cfg.global_every)
        globals_too = not windowed or any(not block.local for block in self.blocks)
        bias = self.position_bias(T, T) if self.position_bias is not None and globals_too else None
        unpadded = Unpadded(key_padding_mask) if Unpadded.pays(key_padding_mask) else None
        if unpadded is not None:
            x = unpadded.unpad(x)
        for i in range(self.cfg.n_layers):
            block = self.blocks[self.cfg.block_of(i)]
            if fork is not None and i == fork[0]:
                x, key_padding_mask, unpadded = take_examples(x, key_padding_mask, unpadded, fork[1])
                local = local_layout(key_padding_mask, len(fork[1]))
            block_args = (key_padding_mask, causal, unpadded, None if windowed and block.local else bias,
                          local if block.local else None)
            if decoder_positions is not None and i == self.cfg.n_layers - 1:
                positions = decoder_positions.expand(x.shape[0] if unpadded is None else unpadded.batch, -1, -1)
                query = x + (positions if unpadded is None else unpadded.unpad(positions))
                for _ in range(2):
                    query = run_block(block, self.grad_checkpointing, x, *block_args, query, replay=self.replay)
                x = query
                break
            x = run_block(block, self.grad_checkpointing, x, *block_args, replay=self.replay)
        x = self.final_norm(x)
        return x if unpadded is None else unpadded.pad(x)


class Trunk(nn.Module):
    """Stems + backbone: the pretrained, shareable part of every model.

    One backbone, and one stem per input modality (``text``: a ``TokenStem``; ``image``: a
    ``PatchStem``), so text and image tasks can train one set of blocks in the same run.
    """

    def __init__(self, backbone: Backbone, stems: dict[str, nn.Module]) -> None:
        super().__init__()
        if not stems:
            raise ValueError("A trunk needs at least one stem (text or image).")
        self.stems = nn.ModuleDict(stems)
        self.backbone = backbone

    @property
    def cfg(self) -> TrunkConfig:
        return self.backbone.cfg

    def forward(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None, stem: str = "text",
                fork: tuple[int, torch.Tensor] | None = None, decoder_positions: torch.Tensor | None = None
                ) -> torch.Tensor:
        """inputs: whatever the stem takes (token ids (B, T), pixels (B, C, H, W)). Returns (B, T, C) (``fork`` and
        ``decoder_positions``: see ``Backbone.forward``)."""
        key_padding_mask = None if attention_mask is None else attention_mask.bool()
        return self.backbone(self.stems[stem](inputs), key_padding_mask, fork=fork,
                             decoder_positions=decoder_positions)

    def depth_groups(self) -> list[list[nn.Module]]:
        """The trunk bottom-up, for freezing and layer-wise learning rates: [stems (and a position bias: the positions
        every block reads)], [block 0], ..., [block L-1], [final norm]."""
        bottom = [
            *self.stems.values(),
            *([self.backbone.position_bias] if self.backbone.position_bias is not None else []),
        ]
        return [bottom, *([block] for block in self.backbone.blocks), [self.backbone.final_norm]]

    def flops_per_token(self, length: int, train: bool = True) -> float:
        """FLOPs per token at sequence ``length``: 2 per multiply-add of the blocks' matmuls and attention's
        two products (over the keys a query is scored against: a local window's 3 chunks and the globals); x3 when
        training (forward and backward). Stems and heads are not counted."""
        c = self.cfg
        local = self.backbone.local_span(length)
        keys = length if local is None else 3 * local[0] + local[1]
        ff_matrices = 3 if c.gated_ff else 2
        forward = (
            2 * c.n_layers * (4 * c.d_model * c.d_model + ff_matrices * c.d_model * c.d_ff)
            + c.n_layers * 4 * keys * c.d_model
        )
        return 3 * forward if train else forward


def init_weights(module: nn.Module, std: float = 0.02, n_layers: int | None = None) -> None:
    """BERT/GPT initialisation: N(0, std) for matrices and embeddings, zero biases, unit LayerNorms."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.LayerNorm, nn.RMSNorm)):
            nn.init.ones_(m.weight)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
    # GPT-2: scale the projections that write into the residual stream by 1/sqrt(2 * depth), so the
    # stream's variance does not grow with depth.
    n_layers = n_layers or sum(isinstance(m, Block) for m in module.modules())  # given: one block of a deeper stack
    for name, p in module.named_parameters():
        if name.endswith(("attn.out_proj.weight", "ff.fc_out.weight")):
            nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * max(n_layers, 1)))
