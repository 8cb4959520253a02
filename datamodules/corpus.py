"""Raw text for masked-language-model pretraining: documents -> packed blocks -> masked batches."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import datasets
import torch
from lightning.pytorch.utilities import rank_zero_warn
from tokenizers import Tokenizer
from trunk.datamodules.sources import (
    FILE_FORMATS,
    check_columns,
    empty_split_error,
    file_format,
    load_split,
    read_conll,
    read_text,
)
from trunk.datamodules.text import TextDataModule, pad
from trunk.datamodules.tokenizer import CLS, IGNORE_INDEX, MASK, SEP, SPECIAL_TOKENS


class TokenMasker:
    """BERT's dynamic masking: choose ``probability`` of the maskable tokens; of those, 80% become
    [MASK], 10% a random token, 10% stay. Special and padding tokens are never chosen.

    With ``whole_word`` the choice is per word (a word-start token and the ``##`` pieces after it),
    so a word is masked completely or not at all; the expected share of masked tokens is unchanged.
    """

    def __init__(self, tokenizer: Tokenizer, probability: float = 0.15, whole_word: bool = False) -> None:
        if not 0.0 < probability < 1.0:
            raise ValueError(f"data.mlm_probability must be between 0 and 1, got {probability}.")
        vocab = tokenizer.get_vocab()
        self.probability, self.whole_word = probability, whole_word
        self.mask_id = vocab[MASK]
        self.special = torch.zeros(len(vocab), dtype=torch.bool)
        self.special[[vocab[t] for t in SPECIAL_TOKENS]] = True
        self.word_start = torch.ones(len(vocab), dtype=torch.bool)
        for token, index in vocab.items():
            if token.startswith("##"):  # WordPiece's continuing-subword prefix
                self.word_start[index] = False
        self.normal_ids = (~self.special).nonzero().squeeze(1)  # what a "random token" is drawn from

    def __call__(self, input_ids: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) ids -> (masked ids, labels): labels hold the original id where masked, else -100."""
        maskable = ~self.special[input_ids]
        if self.whole_word:
            starts = self.word_start[input_ids] | ~maskable  # specials are words of their own
            word_index = starts.long().cumsum(-1)  # (B, T): which word of its row each token is in
            chosen_word = torch.rand(input_ids.shape[0], input_ids.shape[1] + 1, generator=generator) < self.probability
            chosen = chosen_word.gather(1, word_index) & maskable
        else:
            chosen = (torch.rand(input_ids.shape, generator=generator) < self.probability) & maskable
        if not chosen.any() and maskable.any():  # a loss needs at least one target
            candidates = maskable.flatten().nonzero().squeeze(1)
            chosen.view(-1)[candidates[torch.randint(len(candidates), (1,), generator=generator)]] = True
        labels = torch.where(chosen, input_ids, IGNORE_INDEX)
        roll = torch.rand(input_ids.shape, generator=generator)
        random_ids = self.normal_ids[torch.randint(len(self.normal_ids), input_ids.shape, generator=generator)]
        masked = torch.where(chosen & (roll < 0.8), self.mask_id, input_ids)
        masked = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), random_ids, masked)
        return masked, labels


class CorpusData(TextDataModule):
    """Raw text, tokenized and packed into blocks of ``max_length`` tokens for masked-LM pretraining.

    Every document is followed by [SEP]; the token stream is cut into blocks of ``max_length - 1``
    and each block starts with [CLS], as fine-tuning inputs do. Blocks are full, so batches carry no
    padding (a final partial block is dropped unless it is the only one). Training batches are
    masked afresh each time (dynamic masking); validation blocks are masked once, with a fixed
    seed, so validation loss is comparable across evaluations.

    Args:
        train: text file(s) (plain or ``.gz``; a list for several), tabular file(s) (csv, tsv,
            json, jsonl, parquet; read from ``text_column``), or a split name with ``dataset``
            (e.g. ``dataset: wikitext``, ``dataset_config: wikitext-103-raw-v1``, ``train: train``).
        validation: the same kinds of source; unset: ``val_fraction`` of the training documents
            are held out (chosen with a fixed seed).
        documents: ``line``: every non-empty line is a document (a paragraph, a sentence);
            ``blank_line``: documents are separated by blank lines. Applies to text files; a
            CoNLL column file (one starting with ``-DOCSTART-``) gives its sentences' words.
        text_column: the text column of tabular files and hub datasets.
        val_fraction: share of training documents held out when ``validation`` is unset.
        mlm_probability: share of tokens chosen for prediction (BERT: 0.15).
        whole_word_masking: choose whole words rather than single word pieces.
        max_length: the block length in tokens, [CLS] included.
        **kwargs: see ``TextDataModule`` and ``TaskData`` (batch_size, ...).
    """

    kinds = ("masked_lm", "replaced_token_detection")

    def __init__(
        self,
        train: str | list[str] | None = None,
        validation: str | list[str] | None = None,
        documents: Literal["line", "blank_line"] = "line",
        text_column: str = "text",
        val_fraction: float = 0.02,
        mlm_probability: float = 0.15,
        whole_word_masking: bool = False,
        max_length: int = 128,
        **kwargs,
    ) -> None:
        super().__init__(train=train, validation=validation, max_length=max_length, val_fraction=val_fraction, **kwargs)
        if documents not in ("line", "blank_line"):
            raise ValueError(f"documents must be 'line' or 'blank_line', got {documents!r}.")
        if max_length < 8:
            raise ValueError(f"max_length={max_length} is too short for a pretraining block; use 64 or more.")
        self.documents, self.text_column = documents, text_column
        self.mlm_probability, self.whole_word_masking = mlm_probability, whole_word_masking
        self._masker: TokenMasker | None = None

    # -- documents -------------------------------------------------------------------------------
    def load(self, spec: str | list[str], role: str) -> datasets.Dataset:
        texts: list[str] = []
        for source in [spec] if isinstance(spec, str) else spec:
            texts += self._read_source(source, role)
        if not texts:
            raise empty_split_error(role, str(spec))
        return datasets.Dataset.from_dict({"text": texts})

    def _read_source(self, source: str, role: str) -> list[str]:
        path = Path(source).expanduser()
        if self.dataset is not None or file_format(path) in FILE_FORMATS:  # rows with a text column
            ds = load_split(self.dataset, self.dataset_config, source, role)
            check_columns(ds, {"text_column": self.text_column}, role)
            return [t.strip() for t in ds[self.text_column] if t and t.strip()]
        content = read_text(path, role)
        if content.lstrip().startswith("-DOCSTART-"):  # a CoNLL column file: its sentences, words re-joined
            return [" ".join(words) for words in read_conll(path, role=role)["tokens"]]
        if self.documents == "line":
            return [line.strip() for line in content.splitlines() if line.strip()]
        paragraphs, current = [], []
        for line in content.splitlines() + [""]:
            if line.strip():
                current.append(line.strip())
            elif current:
                paragraphs.append(" ".join(current))
                current = []
        return paragraphs

    def tokenizer_columns(self) -> list[str]:
        return ["text"]

    def tokenizer_text_options(self) -> list:
        return [self.text_column, self.documents, *super().tokenizer_text_options()]

    # -- blocks and masking ----------------------------------------------------------------------
    @property
    def masker(self) -> TokenMasker:
        if self._masker is None:
            self._masker = TokenMasker(self.tokenizer, self.mlm_probability, self.whole_word_masking)
        return self._masker

    def encode(self, ds: datasets.Dataset, role: str) -> list[dict]:
        blocks = self.pack(ds["text"], role)
        if role == "train":
            return [{"input_ids": block} for block in blocks]
        masked, labels = self.masker(blocks, torch.Generator().manual_seed(1234))  # the same masks every evaluation
        return [{"input_ids": i, "labels": y} for i, y in zip(masked, labels)]

    def pack(self, texts: list[str], role: str) -> torch.Tensor:
        """Documents -> (N, max_length) blocks: [CLS] + max_length - 1 tokens of the [SEP]-joined stream."""
        tokenizer = self.tokenizer
        tokenizer.no_truncation()
        sep = tokenizer.token_to_id(SEP)
        stream = [i for e in tokenizer.encode_batch(texts, add_special_tokens=False) for i in (*e.ids, sep)]
        body = self.max_length - 1
        n_blocks = len(stream) // body
        if n_blocks == 0:
            rank_zero_warn(f"{self.option(role)} has only {len(stream)} tokens, less than one block of {self.max_length}.")
            n_blocks, stream = 1, stream + [self.pad_id] * (body - len(stream))
        blocks = torch.tensor(stream[: n_blocks * body], dtype=torch.long).view(n_blocks, body)
        cls = torch.full((n_blocks, 1), tokenizer.token_to_id(CLS), dtype=torch.long)
        return torch.cat([cls, blocks], dim=1)

    def collate(self, examples: list[dict]) -> dict:
        input_ids = pad([e["input_ids"] for e in examples], self.pad_id)
        attention_mask = (input_ids != self.pad_id).long()  # masking never touches or produces [PAD]
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "labels" in examples[0]:  # validation: masked once in encode()
            batch["labels"] = pad([e["labels"] for e in examples], IGNORE_INDEX)
        return batch

    def make_batch(self, role: str, indices: list[int], train: bool, generator: torch.Generator | None = None) -> dict:
        batch = super().make_batch(role, indices, train, generator)
        if "labels" not in batch:  # training blocks: fresh masks every time a block is drawn
            batch["input_ids"], batch["labels"] = self.masker(batch["input_ids"], generator)
        return batch
