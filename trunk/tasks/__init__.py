"""The model side: one LightningModule (``TrunkModule``) and an objective per task kind (``objectives/``)."""

from trunk.tasks.api import Predictor, load
from trunk.tasks.finetuning import FinetuneConfig
from trunk.tasks.module import TrunkModule
from trunk.tasks.objectives import (
    EntityF1,
    ExtractiveQuestionAnswering,
    ImageClassification,
    MaskedLanguageModeling,
    MultiLabelClassification,
    MultipleChoice,
    Objective,
    ReplacedTokenDetection,
    SequenceClassification,
    SequenceRegression,
    TokenClassification,
    Translation,
)
from trunk.tasks.optim import OptimConfig

__all__ = ["EntityF1", "ExtractiveQuestionAnswering", "FinetuneConfig", "ImageClassification", "MaskedLanguageModeling", "MultiLabelClassification", "MultipleChoice", "Objective", "OptimConfig", "Predictor",
           "ReplacedTokenDetection", "SequenceClassification", "SequenceRegression", "TokenClassification", "Translation", "TrunkModule", "load"]
