"""Plain PyTorch models: no Lightning, no data, no files. Start reading at ``trunk.py``."""

from trunk.models.decoder import Decoder, DecoderBlock, KVCache
from trunk.models.generation import GenerationConfig, SpecialIds, beam_search, greedy_search
from trunk.models.heads import (
    AttentionPool,
    MaskedLMHead,
    Pooling,
    ReplacedTokenHead,
    SequenceClassificationHead,
    SpanHead,
    TokenClassificationHead,
    check_pooling,
    pool,
)
from trunk.models.kernels import Dropout, Unpadded, dropout
from trunk.models.positions import (
    POSITIONS,
    PositionBias,
    PositionScheme,
    alibi_slopes,
    sinusoidal_positions,
    sinusoidal_positions_2d,
)
from trunk.models.stems import (
    STEM_KINDS,
    PatchStem,
    TokenStem,
    build_stem,
    build_trunk,
)
from trunk.models.trunk import Attention, Backbone, Block, FeedForward, Trunk, TrunkConfig, init_weights

__all__ = [
    "Attention",
    "AttentionPool",
    "Backbone",
    "Block",
    "Decoder",
    "DecoderBlock",
    "Dropout",
    "GenerationConfig",
    "KVCache",
    "SpecialIds",
    "beam_search",
    "greedy_search",
    "FeedForward",
    "MaskedLMHead",
    "PatchStem",
    "POSITIONS",
    "PositionBias",
    "PositionScheme",
    "Pooling",
    "STEM_KINDS",
    "build_stem",
    "build_trunk",
    "check_pooling",
    "ReplacedTokenHead",
    "SequenceClassificationHead",
    "SpanHead",
    "TokenClassificationHead",
    "TokenStem",
    "Trunk",
    "TrunkConfig",
    "Unpadded",
    "alibi_slopes",
    "dropout",
    "init_weights",
    "pool",
    "sinusoidal_positions",
    "sinusoidal_positions_2d",
]
