"""Plain PyTorch models: no Lightning, no data, no files. Start reading at ``trunk.py``."""

from models.heads import MaskedLMHead, SequenceClassificationHead, TokenClassificationHead, pool
from models.stems import TokenStem, sinusoidal_positions
from models.trunk import Attention, Backbone, Block, FeedForward, Trunk, TrunkConfig, init_weights

__all__ = [
    "Attention",
    "Backbone",
    "Block",
    "FeedForward",
    "MaskedLMHead",
    "SequenceClassificationHead",
    "TokenClassificationHead",
    "TokenStem",
    "Trunk",
    "TrunkConfig",
    "init_weights",
    "pool",
    "sinusoidal_positions",
]
