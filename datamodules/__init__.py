"""Data: raw rows (hub, local files, built-in) -> tokenized, dynamically padded batches.

The batch contract shared by every task is documented in ``datamodules/text.py`` and the README.
"""

from datamodules.corpus import CorpusData, TokenMasker
from datamodules.images import ImageClassificationData
from datamodules.sources import read_conll
from datamodules.text import LengthBucketBatchSampler, TextDataModule
from datamodules.text_classification import TextClassificationData
from datamodules.token_classification import TokenClassificationData
from datamodules.translation import TranslationData

__all__ = ["CorpusData", "ImageClassificationData", "LengthBucketBatchSampler", "TextClassificationData", "TextDataModule", "TokenClassificationData", "TokenMasker",
           "TranslationData", "read_conll"]
