"""Plain PyTorch models: no Lightning, no data, no files. Start reading at ``trunk.py``."""

from models.decoder import Decoder, DecoderBlock, KVCache
from models.generation import GenerationConfig, SpecialIds, beam_search, greedy_search
from models.heads import MaskedLMHead, ReplacedTokenHead, SequenceClassificationHead, TokenClassificationHead, pool
from models.stems import PatchStem, TokenStem, sinusoidal_positions, sinusoidal_positions_2d
from models.trunk import Attention, Backbone, Block, FeedForward, Trunk, TrunkConfig, init_weights

__all__ = [
    "Attention",
    "Backbone",
    "Block",
    "Decoder",
    "DecoderBlock",
    "GenerationConfig",
    "KVCache",
    "SpecialIds",
    "beam_search",
    "greedy_search",
    "FeedForward",
    "MaskedLMHead",
    "PatchStem",
    "ReplacedTokenHead",
    "SequenceClassificationHead",
    "TokenClassificationHead",
    "TokenStem",
    "Trunk",
    "TrunkConfig",
    "init_weights",
    "pool",
    "sinusoidal_positions",
    "sinusoidal_positions_2d",
]
