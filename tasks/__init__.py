"""The model side: one LightningModule (``TrunkModule``) and an objective per task kind."""

from trunk.tasks.api import Predictor, load
from trunk.tasks.finetuning import FinetuneConfig
from trunk.tasks.image_classification import ImageClassification
from trunk.tasks.masked_lm import MaskedLanguageModeling
from trunk.tasks.module import TrunkModule
from trunk.tasks.objective import Objective
from trunk.tasks.optim import OptimConfig
from trunk.tasks.replaced_token_detection import ReplacedTokenDetection
from trunk.tasks.sequence_classification import SequenceClassification
from trunk.tasks.token_classification import EntityF1, TokenClassification
from trunk.tasks.translation import Translation

__all__ = ["EntityF1", "FinetuneConfig", "ImageClassification", "MaskedLanguageModeling", "Objective", "OptimConfig", "Predictor",
           "ReplacedTokenDetection", "SequenceClassification", "TokenClassification", "Translation", "TrunkModule", "load"]
