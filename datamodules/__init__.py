"""Data: raw rows (hub, local files, built-in) -> tokenized, dynamically padded batches.

The batch contract shared by every task is documented in ``datamodules/text.py`` and the README.
"""

from trunk.datamodules.corpus import CorpusData, TokenMasker
from trunk.datamodules.images import ImageClassificationData
from trunk.datamodules.sources import read_conll
from trunk.datamodules.text import LengthBucketBatchSampler, TextDataModule
from trunk.datamodules.text_classification import TextClassificationData
from trunk.datamodules.token_classification import TokenClassificationData
from trunk.datamodules.translation import TranslationData

__all__ = ["CorpusData", "ImageClassificationData", "LengthBucketBatchSampler", "TextClassificationData", "TextDataModule", "TokenClassificationData", "TokenMasker",
           "TranslationData", "read_conll"]
