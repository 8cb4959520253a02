"""Raw text for masked-language-model pretraining: documents -> packed blocks -> masked batches."""

from __future__ import annotations

import functools
import itertools
import random
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

import datasets
import torch
from datasets.arrow_writer import ArrowWriter
from lightning.pytorch.utilities import rank_zero_warn
from tokenizers import Tokenizer

from trunk.core.codec import CLS, IGNORE_INDEX, MASK, SEP, SPECIAL_TOKENS, required_id, special_id
from trunk.core.masking import corrupt, ensure_one
from trunk.datamodules.sources import (
    FILE_FORMATS,
    LINES,
    check_columns,
    column,
    empty_split_error,
    expand_sources,
    load_split,
    read_conll,
    stream_rows,
    text_lines,
)
from trunk.datamodules.text import CHUNK, TextDataModule, pad


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
        self.mask_id = required_id(tokenizer, MASK, "Masked-language-model data (masking)")
        self.special = torch.zeros(len(vocab), dtype=torch.bool)
        self.special[[i for i in (special_id(tokenizer, t) for t in SPECIAL_TOKENS) if i is not None]] = True
        self.word_start = torch.ones(len(vocab), dtype=torch.bool)
        for token, index in vocab.items():
            if token.startswith("##"):  # WordPiece's continuing-subword prefix
                self.word_start[index] = False
        self.normal_ids = (~self.special).nonzero().squeeze(1)  # what a "random token" is drawn from

    def __call__(
        self, input_ids: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) ids -> (masked ids, labels): labels hold the original id where masked, else -100."""
        maskable = ~self.special[input_ids]
        if self.whole_word:
            starts = self.word_start[input_ids] | ~maskable  # specials are words of their own
            word_index = starts.long().cumsum(-1)  # (B, T): which word of its row each token is in
            chosen_word = torch.rand(input_ids.shape[0], input_ids.shape[1] + 1, generator=generator) < self.probability
            chosen = chosen_word.gather(1, word_index) & maskable
        else:
            chosen = (torch.rand(input_ids.shape, generator=generator) < self.probability) & maskable
        return corrupt(input_ids, ensure_one(chosen, maskable, generator), self.mask_id, self.normal_ids, generator)


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
        streaming: read, tokenize and pack the training text as training goes, never the whole corpus
            at once: for corpora larger than memory (or than the patience for a first pass). Each
            process reads every document and tokenizes its share (every n-th document of n
            processes); blocks go through a shuffle buffer. Needs ``data.steps_per_epoch`` (the
            length is unknown), a tokenizer given to the run (``data.tokenizer`` or
            ``model.init_from``), and a ``validation`` split to evaluate (none is held out).
            Resuming passes over the batches trained before the checkpoint again (tokenizing them).
        shuffle_buffer: with ``streaming``, blocks held to shuffle among (0: stream order).
        **kwargs: see ``TextDataModule`` and ``TaskData`` (batch_size, num_proc, ...).
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
        streaming: bool = False,
        shuffle_buffer: int = 10_000,
        **kwargs,
    ) -> None:
        if streaming and validation is None:
            val_fraction = 0.0  # holding documents out would take a pass over the whole corpus
        super().__init__(train=train, validation=validation, max_length=max_length, val_fraction=val_fraction, **kwargs)
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0 (blocks), got {shuffle_buffer}.")
        if self.metrics_per_file:  # documents become blocks across file boundaries: no block belongs to one file
            raise ValueError(
                "metrics_per_file is not available for corpus text: evaluate each file as its own task instead."
            )
        if streaming and self.select:
            raise ValueError(
                "select is not applied to streamed text: give files that hold one split each, or streaming: false."
            )
        if documents not in ("line", "blank_line"):
            raise ValueError(f"documents must be 'line' or 'blank_line', got {documents!r}.")
        if max_length < 8:
            raise ValueError(f"max_length={max_length} is too short for a pretraining block; use 64 or more.")
        self.documents, self.text_column = documents, text_column
        self.mlm_probability, self.whole_word_masking = mlm_probability, whole_word_masking
        self.streaming, self.shuffle_buffer = streaming, shuffle_buffer
        self._masker: TokenMasker | None = None
        self._live: tuple | None = None  # the training stream and how many batches it has given

    # -- documents -------------------------------------------------------------------------------
    def load(self, spec: str | list[str], role: str) -> datasets.Dataset:
        texts = [
            text
            for source in expand_sources(self.dataset, spec, role)
            for text in self._source_documents(source, role, lazy=False)
        ]
        if not texts:
            raise empty_split_error(role, str(spec))
        return datasets.Dataset.from_dict({"text": texts})

    def iter_documents(self, role: str, rank: int = 0, world: int = 1) -> Iterator[str]:
        """A split's documents read one at a time; with ``world`` > 1, every world-th from ``rank``."""
        spec, index = self.spec(role), 0
        for source in expand_sources(self.dataset, spec, self.option(role)):
            for document in self._source_documents(source, self.option(role), lazy=self.streaming):
                if index % world == rank:
                    yield document
                index += 1

    def _source_documents(self, source: str, role: str, lazy: bool) -> Iterator[str]:
        """One source's documents; ``lazy``: tabular and hub rows streamed rather than loaded (text files are always
        read a line at a time)."""
        path = Path(source).expanduser()
        # rows
        if (self.dataset is not None or self.reading.file_type or self.reading.suffix(path) in (*FILE_FORMATS, LINES)):
            if not lazy:
                ds = load_split(self.dataset, self.dataset_config, source, role, self.reading)
                check_columns(ds, {"text_column": self.text_column}, role)
                yield from (t.strip() for t in column(ds, self.text_column) if t and t.strip())
                return
            for row in stream_rows(self.dataset, self.dataset_config, source, role, self.reading):
                if self.text_column not in row:
                    raise ValueError(
                        f"{role} has no column '{self.text_column}' (set by {role.rsplit('.', 1)[0]}.text_column). Its "
                        f"columns are {list(row)}: set text_column to one of them."
                    )
                text = row[self.text_column]
                if text and text.strip():
                    yield text.strip()
            return
        lines = text_lines(path, role, encoding=self.reading.encoding)
        first = next((line for line in lines if line.strip()), None)
        if first is None:
            return
        if first.lstrip().startswith("-DOCSTART-"):  # a CoNLL column file: its sentences, words re-joined
            yield from (
                " ".join(words) for words in read_conll(path, role=role, encoding=self.reading.encoding)["tokens"]
            )
            return
        lines = itertools.chain([first], lines)
        if self.documents == "line":
            yield from (line.strip() for line in lines if line.strip())
            return
        current = []
        for line in itertools.chain(lines, [""]):
            if line.strip():
                current.append(line.strip())
            elif current:
                yield " ".join(current)
                current = []

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

    def build_encoded(self, role: str, directory: Path) -> list:
        """Tokenize the documents (``datasets.map``, ``num_proc`` processes), then pack them into blocks
        written straight to Arrow: neither the token stream nor the blocks are ever held whole.
        Validation blocks are masked here, once, with a fixed seed: the same masks every evaluation."""
        raw = self.raw(role)
        self.tokenizer.no_truncation()
        documents = self.map_rows(
            raw,
            functools.partial(_document_ids, self.tokenizer),
            directory / "work" / "documents.arrow",
            f"Tokenizing {self.option(role)}",
        )
        generator = torch.Generator().manual_seed(1234)
        with ArrowWriter(path=str(directory / "blocks.arrow")) as writer:
            for blocks in batched(
                self.pack((ids for chunk in documents.iter(CHUNK) for ids in chunk["ids"]), role), CHUNK
            ):
                blocks = torch.tensor(blocks)
                if role == "train":
                    writer.write_batch({"input_ids": blocks.tolist()})
                else:
                    masked, labels = self.masker(blocks, generator)
                    writer.write_batch({"input_ids": masked.tolist(), "labels": labels.tolist()})
            writer.finalize()
        del documents
        shutil.rmtree(directory / "work")
        return []

    def pack(self, documents: Iterable[list[int]], role: str) -> Iterator[list[int]]:
        """Token ids of documents (each ending in [SEP]) -> blocks of ``max_length``: [CLS] + the next
        ``max_length - 1`` tokens of the stream (a tokenizer without [CLS]: ``max_length`` tokens). The last partial
        block is dropped, unless it is the only one."""
        cls = special_id(self.tokenizer, CLS)
        first = [] if cls is None else [cls]
        body, stream, blocks = self.max_length - len(first), [], 0
        for ids in documents:
            stream += ids
            while len(stream) >= body:
                yield [*first, *stream[:body]]
                del stream[:body]
                blocks += 1
        if blocks == 0:
            rank_zero_warn(
                f"{self.option(role)} has only {len(stream)} tokens, less than one block of {self.max_length}."
            )
            yield [*first, *stream, *[self.pad_id] * (body - len(stream))]

    # -- streaming ---------------------------------------------------------------------------------
    def prepare(self, role: str) -> None:
        if self.streaming and role == "train":  # nothing to encode up front: fail now on a missing or empty source
            if next(self.iter_documents("train"), None) is None:
                raise empty_split_error(self.option("train"), str(self.spec("train")))
            return
        super().prepare(role)

    def size(self, role: str) -> int:
        if self.streaming and role == "train":
            raise ValueError(f"{self.option('train')} is streamed: its size is unknown until a pass ends.")
        return super().size(role)

    def train_items(self, seed: str, epoch: int, rank: int, world: int, before: int) -> Iterator:
        if not self.streaming:
            return super().train_items(seed, epoch, rank, world, before)
        return self._continue_stream(seed, rank, world, before)

    def _continue_stream(self, seed: str, rank: int, world: int, before: int) -> Iterator[torch.Tensor]:
        """The stream of training blocks (B, max_length), from its ``before``-th batch: the live stream when it
        stands there (the next epoch of a run), else a new one that passes over ``before`` batches (a resumed run)."""
        if self._live is not None and self._live[0] == (seed, rank, world, before):
            batches = self._live[1]
        else:
            batches = self._stream_batches(seed, rank, world)
            for _ in range(before):
                next(batches)
        for count, batch in enumerate(batches, start=before + 1):
            self._live = ((seed, rank, world, count), batches)
            yield batch

    def _stream_batches(self, seed: str, rank: int, world: int) -> Iterator[torch.Tensor]:
        """Endless passes over this process's documents: tokenized a chunk at a time, packed, shuffled in a buffer."""
        tokenizer = self.tokenizer
        tokenizer.no_truncation()
        for passes in itertools.count():
            chunks = batched(self.iter_documents("train", rank, world), CHUNK)
            ids = (ids for chunk in chunks for ids in _document_ids(tokenizer, {"text": chunk})["ids"])
            blocks = shuffled(self.pack(ids, "train"), self.shuffle_buffer, random.Random(f"{seed}/{rank}/{passes}"))
            for batch in batched(blocks, self.batch_size):
                yield torch.tensor(batch)

    def train_batch(self, item, generator: torch.Generator) -> dict:
        if not self.streaming:
            return super().train_batch(item, generator)
        masked, labels = self.masker(item, generator)
        return {"input_ids": masked, "attention_mask": (item != self.pad_id).long(), "labels": labels}

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


def _document_ids(tokenizer: Tokenizer, rows: dict) -> dict:
    """datasets.map's function: documents -> their token ids, each followed by [SEP]."""
    sep = special_id(tokenizer, SEP)
    end = [] if sep is None else [sep]
    return {"ids": [[*e.ids, *end] for e in tokenizer.encode_batch(rows["text"], add_special_tokens=False)]}


def batched(items: Iterable, n: int) -> Iterator[list]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, n)):
        yield chunk


def shuffled(items: Iterable, size: int, rng: random.Random) -> Iterator:
    """Items in a random order drawn through a buffer of ``size``: memory bounded by the buffer, not the stream."""
    if size <= 1:
        yield from items
        return
    buffer: list = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        i = rng.randrange(size)
        yield buffer[i]
        buffer[i] = item
    rng.shuffle(buffer)
    yield from buffer
