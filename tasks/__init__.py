"""LightningModules: one per task, sharing ``TrunkTask`` for the trunk, optimisation and metrics."""

from trunk.tasks.base import OptimConfig, TrunkTask
from trunk.tasks.finetuning import FinetuneConfig
from trunk.tasks.image_classification import ImageClassification
from trunk.tasks.masked_lm import MaskedLanguageModeling
from trunk.tasks.replaced_token_detection import ReplacedTokenDetection
from trunk.tasks.sequence_classification import SequenceClassification
from trunk.tasks.token_classification import EntityF1, TokenClassification
from trunk.tasks.translation import Translation

__all__ = ["EntityF1", "FinetuneConfig", "ImageClassification", "MaskedLanguageModeling", "OptimConfig", "ReplacedTokenDetection", "SequenceClassification", "TokenClassification",
           "Translation", "TrunkTask"]
