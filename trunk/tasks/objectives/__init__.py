"""Task kinds: one ``Objective`` per file, each a plain ``nn.Module`` with its head, loss, metrics and
predictions. A new kind is a file here and a line in ``trunk/tasks/registry.py`` (docs/architecture.md)."""

from trunk.tasks.objectives.base import Objective
from trunk.tasks.objectives.image_classification import ImageClassification
from trunk.tasks.objectives.masked_lm import MaskedLanguageModeling
from trunk.tasks.objectives.multi_label import MultiLabelClassification
from trunk.tasks.objectives.multiple_choice import MultipleChoice
from trunk.tasks.objectives.question_answering import ExtractiveQuestionAnswering
from trunk.tasks.objectives.regression import SequenceRegression
from trunk.tasks.objectives.replaced_token_detection import ReplacedTokenDetection
from trunk.tasks.objectives.sequence_classification import SequenceClassification
from trunk.tasks.objectives.token_classification import EntityF1, TokenClassification
from trunk.tasks.objectives.translation import Translation

__all__ = [
    "EntityF1",
    "ExtractiveQuestionAnswering",
    "ImageClassification",
    "MaskedLanguageModeling",
    "MultiLabelClassification",
    "MultipleChoice",
    "Objective",
    "ReplacedTokenDetection",
    "SequenceClassification",
    "SequenceRegression",
    "TokenClassification",
    "Translation",
]
