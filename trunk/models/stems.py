"""Stems turn raw inputs into the (B, T, C) vectors the backbone consumes."""

from __future__ import annotations

import math

import torch
from torch import nn

from trunk.core.codec import SEP, SPECIAL_IDS
from trunk.models.kernels import Dropout
from trunk.models.positions import POSITIONS
from trunk.models.trunk import Backbone, Trunk, TrunkConfig, init_weights, norm_layer


class TokenStem(nn.Module):
    """Token embedding + position embedding (learned or sinusoidal; none for rope) + segment embedding (with
    ``cfg.segments``), then dropout.

    Post-LN models (BERT) also normalise the embeddings (``cfg.embedding_norm``); pre-LN models leave that to the first
    block. Embeddings narrower than the trunk (``cfg.embedding_size``, ELECTRA-small's) are projected up after that.
    A token's segment is the number of [SEP]s before it (``separator_id``: the run's tokenizer's, set by
    ``TrunkModule.connect``), so every sentence-pair task gets BERT's token types from its ids alone.
    While training, ``token_dropout`` of the tokens lose their embedding (their position stays): the model
    cannot lean on any one word, a regulariser for small sets (token cutoff, Shen et al. 2020).
    """

    def __init__(self, cfg: TrunkConfig) -> None:
        super().__init__()
        self.max_len, self.position_offset = cfg.max_len, cfg.position_offset
        width = cfg.embedding_size
        self.token = nn.Embedding(cfg.vocab_size, width)
        self.token_scale = math.sqrt(width) if cfg.scale_embedding else 1.0
        self.scheme = POSITIONS[cfg.positions]  # learned, sinusoidal: a table here; rope, alibi, t5: in attention
        self.scheme.add_token_table(self, cfg.position_offset + cfg.max_len, width)
        self.segment = nn.Embedding(cfg.segments, width) if cfg.segments else None
        self.separator_id = SPECIAL_IDS[SEP]  # Trunk's own tokenizers'; an imported one's is set by connect()
        self.norm = norm_layer(cfg, width) if cfg.embedding_norm else nn.Identity()
        self.drop = Dropout(cfg.dropout)
        self.project = nn.Linear(width, cfg.d_model) if width != cfg.d_model else None
        self.token_dropout = cfg.token_dropout

    def no_weight_decay(self) -> set[str]:
        """Position tables are offsets the model reads, not features to shrink (timm's convention)."""
        return {"position.weight"} if hasattr(self, "position") else set()

    def connect(self, separator_id: int | None) -> None:
        """The run's tokenizer's [SEP] id, which segments are read off (None: it has none)."""
        if self.segment is not None and separator_id is None:
            raise ValueError("The trunk has segment embeddings, read off the [SEP] tokens of each input, and the "
                             "tokenizer has no [SEP] (or </s>).")
        self.separator_id = separator_id

    def segments(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) segment ids: the [SEP]s strictly before each token, capped at the last segment."""
        separators = (input_ids == self.separator_id).long()
        return (separators.cumsum(1) - separators).clamp(max=self.segment.num_embeddings - 1)

    def forward(self, input_ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """input_ids: (B, T) -> (B, T, C). ``offset``: the position of the first token (incremental decoding)."""
        T = offset + input_ids.shape[1]
        if self.max_len < T:
            raise ValueError(
                f"Sequence length {T} exceeds the trunk's max_len={self.max_len}: truncate the inputs "
                "(the datamodules do this via their max_length option) or build the trunk with a larger max_len."
            )
        x = self.token(input_ids)
        if self.token_scale != 1.0:
            x = x * self.token_scale
        if self.training and self.token_dropout > 0:
            x = x * (torch.rand(input_ids.shape, device=x.device) >= self.token_dropout).unsqueeze(-1).to(x.dtype)
        table = self.scheme.token_table(self, self.position_offset + offset, self.position_offset + T)
        if table is not None:
            x = x + table
        if self.segment is not None:
            x = x + self.segment(self.segments(input_ids))
        x = self.drop(self.norm(x))
        return x if self.project is None else self.project(x)


class PatchStem(nn.Module):
    """ViT stem: images (B, C, H, W) -> [CLS] (unless ``cfg.cls_token`` is false, as SigLIP's), ``cfg.registers``
    register tokens and one vector per non-overlapping patch, (B, 1 + R + N, d_model).

    Each p x p patch is flattened and projected linearly (a convolution with stride p computes
    exactly that). Positions follow ``cfg.positions``: ``learned`` or ``sinusoidal`` add a 2-D
    table over the patch grid; ``rope`` adds none (attention rotates by the patches' raster
    order). Images of another size than ``image_size`` work when the patch size divides them: the
    learned table is resized bicubically (as in timm / DeiT) and the sinusoidal one recomputed.
    """

    def __init__(self, cfg: TrunkConfig, image_size: int, patch_size: int, channels: int) -> None:
        super().__init__()
        if image_size % patch_size:
            raise ValueError(
                f"patch_size={patch_size} does not divide image_size={image_size}: choose a patch size that divides it "
                f"(for {image_size}: {[p for p in range(1, image_size + 1) if image_size % p == 0]})."
            )
        self.patch_size, self.channels, self.resize_antialias = patch_size, channels, cfg.resize_antialias
        self.grid = image_size // patch_size
        self.proj = nn.Conv2d(channels, cfg.d_model, kernel_size=patch_size, stride=patch_size)
        if cfg.cls_token:
            self.cls = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
            nn.init.normal_(self.cls, std=cfg.init_std)
        if cfg.registers:
            self.registers = nn.Parameter(torch.zeros(1, cfg.registers, cfg.d_model))
            nn.init.normal_(self.registers, std=cfg.init_std)
        self.scheme = POSITIONS[cfg.positions]
        self.scheme.add_grid_table(self, self.grid, cfg.d_model, cfg.init_std)
        self.norm = norm_layer(cfg) if cfg.embedding_norm else nn.Identity()
        self.drop = Dropout(cfg.dropout)

    def no_weight_decay(self) -> set[str]:
        return {"cls", "registers", "position"} & {name for name, _ in self.named_parameters()}

    def positions(self, rows: int, cols: int) -> torch.Tensor | None:
        """The (1, rows * cols, d_model) position table for a grid of patches; None where the scheme adds none."""
        return self.scheme.grid_table(self, rows, cols)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if pixels.ndim != 4 or pixels.shape[1] != self.channels:
            raise ValueError(
                f"Expected images shaped (batch, {self.channels}, height, width), got {tuple(pixels.shape)}: the model "
                f"takes {self.channels}-channel images (the objective's channels). Set the task's data "
                f"channels={self.channels} to convert the images, or build the model for their channel count."
            )
        H, W = pixels.shape[-2:]
        if H % self.patch_size or W % self.patch_size:
            raise ValueError(f"Images of {H}x{W} pixels do not split into {self.patch_size}x{self.patch_size} patches: "
                             f"resize them (data.tasks.<task>.image_size) to a multiple of the patch size.")
        x = self.proj(pixels).flatten(2).transpose(1, 2)  # (B, N, d_model), patches in raster order
        table = self.positions(H // self.patch_size, W // self.patch_size)
        if table is not None:
            x = x + table
        extra = [getattr(self, name) for name in ("cls", "registers") if hasattr(self, name)]  # no positions
        x = torch.cat([*(t.expand(x.shape[0], -1, -1).to(x.dtype) for t in extra), x], dim=1)
        return self.drop(self.norm(x))


STEM_KINDS = ("text", "image")


def build_stem(kind: str, cfg: TrunkConfig, options: dict | None = None) -> nn.Module:
    """A stem by modality: ``text`` (a ``TokenStem``) or ``image`` (a ``PatchStem``; ``options``: image_size,
    patch_size, channels)."""
    if kind == "text":
        stem = TokenStem(cfg)
        init_weights(stem, cfg.init_std)
        return stem
    if kind == "image":
        # initialises its own [CLS] and positions; the projection keeps conv init
        return PatchStem(cfg, **(options or {}))
    raise ValueError(f"Unknown stem {kind!r}; stems are {STEM_KINDS}.")


def build_trunk(cfg: TrunkConfig, stems: dict[str, dict] | None = None) -> Trunk:
    """A freshly initialised trunk: ``stems`` maps each modality it reads to its options ({"text": {}} by default)."""
    stems = {"text": {}} if stems is None else stems
    built = {kind: build_stem(kind, cfg, options) for kind, options in stems.items()}
    return Trunk(Backbone(cfg), built)  # the backbone initialises itself
