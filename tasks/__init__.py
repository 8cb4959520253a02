"""LightningModules: one per task, sharing ``TrunkTask`` for the trunk, optimisation and metrics."""

from tasks.base import OptimConfig, TrunkTask
from tasks.sequence_classification import SequenceClassification

__all__ = ["OptimConfig", "SequenceClassification", "TrunkTask"]
