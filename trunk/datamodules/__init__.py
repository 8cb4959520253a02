"""Data: raw rows (hub, local files, built-in) -> tokenized, dynamically padded batches, per task.

``MultiTaskData`` is the datamodule of every run; each of its tasks has a ``TaskData``. The batch
contract shared by every objective is documented in ``trunk/datamodules/text.py`` and docs/configuration.md.
"""

from trunk.datamodules.corpus import CorpusData, TokenMasker
from trunk.datamodules.images import ImageClassificationData
from trunk.datamodules.multi_label import MultiLabelTextData
from trunk.datamodules.multiple_choice import MultipleChoiceData
from trunk.datamodules.multitask import MultiTaskData, TaskSampler, TaskSet
from trunk.datamodules.question_answering import QuestionAnsweringData
from trunk.datamodules.sources import read_conll
from trunk.datamodules.text import TaskData, TextDataModule
from trunk.datamodules.text_classification import TextClassificationData
from trunk.datamodules.text_regression import TextRegressionData
from trunk.datamodules.token_classification import TokenClassificationData
from trunk.datamodules.translation import TranslationData

__all__ = [
    "CorpusData",
    "ImageClassificationData",
    "MultiLabelTextData",
    "MultipleChoiceData",
    "MultiTaskData",
    "QuestionAnsweringData",
    "TaskData",
    "TaskSampler",
    "TaskSet",
    "TextClassificationData",
    "TextDataModule",
    "TextRegressionData",
    "TokenClassificationData",
    "TokenMasker",
    "TranslationData",
    "read_conll",
]
