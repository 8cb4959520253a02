"""LightningModules: one per task, sharing ``TrunkTask`` for the trunk, optimisation and metrics."""

from tasks.base import OptimConfig, TrunkTask
from tasks.finetuning import FinetuneConfig
from tasks.masked_lm import MaskedLanguageModeling
from tasks.sequence_classification import SequenceClassification

__all__ = ["FinetuneConfig", "MaskedLanguageModeling", "OptimConfig", "SequenceClassification", "TrunkTask"]
