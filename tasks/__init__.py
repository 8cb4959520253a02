"""LightningModules: one per task, sharing ``TrunkTask`` for the trunk, optimisation and metrics."""

from tasks.base import OptimConfig, TrunkTask
from tasks.finetuning import FinetuneConfig
from tasks.image_classification import ImageClassification
from tasks.masked_lm import MaskedLanguageModeling
from tasks.replaced_token_detection import ReplacedTokenDetection
from tasks.sequence_classification import SequenceClassification
from tasks.token_classification import EntityF1, TokenClassification
from tasks.translation import Translation

__all__ = ["EntityF1", "FinetuneConfig", "ImageClassification", "MaskedLanguageModeling", "OptimConfig", "ReplacedTokenDetection", "SequenceClassification", "TokenClassification",
           "Translation", "TrunkTask"]
