"""The shared base of text datamodules: splits, the tokenizer, dynamic padding, length bucketing.

Batch contract (every task reads these keys; see README "Batches"):
    input_ids       (B, T) long   token ids, padded with the tokenizer's [PAD] id (0) to the batch's longest
    attention_mask  (B, T) long   1 at real tokens, 0 at padding
    labels          task-specific: (B,) class ids, or (B, T) with -100 where no loss is taken
    text            list[str]     the raw inputs (kept for predictions)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import datasets
import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tokenizers import Encoding, Tokenizer
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler

from trunk.datamodules.sources import empty_split_error, load_split
from trunk.datamodules.tokenizer import PAD, load_tokenizer, train_wordpiece


IGNORE_INDEX = -100  # label positions that take no loss (cross_entropy's default ignore_index)


def cache_dir() -> Path:
    """Where Trunk caches trained tokenizers: $TRUNK_CACHE, else ~/.cache/trunk."""
    return Path(os.environ.get("TRUNK_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trunk")


STAGE_ROLES = {"fit": ("train", "validation"), "validate": ("validation",), "test": ("test",), "predict": ("predict",)}


def pad(sequences: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    """Right-pad to the longest sequence: (B, T_max)."""
    out = torch.full((len(sequences), max(len(s) for s in sequences)), value, dtype=torch.long)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


class LengthBucketBatchSampler(BatchSampler):
    """Batches of similar length: less padding, so fewer wasted FLOPs.

    Draws ``pool_batches * batch_size`` indices from ``sampler`` (random, or Lightning's distributed
    sampler under DDP), sorts that pool by length, cuts it into batches and shuffles their order.
    """

    def __init__(self, sampler: Sampler, batch_size: int, drop_last: bool, lengths: Sequence[int], pool_batches: int = 50) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = lengths
        self.pool_batches = pool_batches

    def __iter__(self) -> Iterator[list[int]]:
        pool: list[int] = []
        for index in self.sampler:
            pool.append(index)
            if len(pool) == self.pool_batches * self.batch_size:
                yield from self._batches(pool)
                pool = []
        if pool:
            yield from self._batches(pool)

    def _batches(self, pool: list[int]) -> Iterator[list[int]]:
        pool.sort(key=lambda i: self.lengths[i])
        batches = [pool[i : i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
        if self.drop_last and len(batches[-1]) < self.batch_size:
            batches.pop()
        random.shuffle(batches)
        yield from batches


class SplitLoaders(L.LightningDataModule):
    """Lightning's four dataloader hooks from ``_loader(role, train)``, shared by text and image data.
    Validation is optional: without a loaded validation split, fit runs without it."""

    def _loader(self, role: str, train: bool = False) -> DataLoader:
        raise NotImplementedError

    def has_loaded(self, role: str) -> bool:
        raise NotImplementedError

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader | list:
        return self._loader("validation") if self.has_loaded("validation") else []

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict")


class TextDataModule(SplitLoaders):
    """Loads splits (hub, local files or built-in), provides the tokenizer and the dataloaders.

    Subclasses implement ``tokenizer_columns()``, ``encode(ds, role) -> list[dict]`` (one dict of
    python values per example) and ``collate(examples) -> batch``.

    Args:
        dataset: a hub dataset name (``glue``), a local dataset directory, ``trunk:sentiment`` for
            the built-in data, or unset: then ``train`` / ``validation`` / ... are file paths.
        dataset_config: the hub dataset's configuration (``sst2`` for ``glue``).
        train, validation, test, predict: split names when ``dataset`` is set, else file paths
            (csv, tsv, json, jsonl, parquet). Unset splits are skipped.
        tokenizer: a ``tokenizer.json``, a directory holding one, or a Trunk ``.ckpt``; unset:
            train a WordPiece tokenizer on the training split.
        tokenizer_vocab_size: vocabulary size when training the tokenizer.
        lowercase: lowercase text when training the tokenizer.
        max_length: longer inputs are truncated (with one warning per split).
        batch_size: training batch size; ``eval_batch_size`` defaults to twice it.
        bucket_by_length: batch training examples of similar length together.
        num_workers: dataloader worker processes.
    """

    def __init__(
        self,
        dataset: str | None = None,
        dataset_config: str | None = None,
        train: str | None = None,
        validation: str | None = None,
        test: str | None = None,
        predict: str | None = None,
        tokenizer: str | None = None,
        tokenizer_vocab_size: int = 8192,
        lowercase: bool = True,
        max_length: int = 128,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        bucket_by_length: bool = False,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.dataset, self.dataset_config = dataset, dataset_config
        self.split_specs = {"train": train, "validation": validation, "test": test, "predict": predict}
        self.tokenizer_path = tokenizer
        self.tokenizer_vocab_size = tokenizer_vocab_size
        self.lowercase = lowercase
        self.max_length = max_length
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or 2 * batch_size
        self.bucket_by_length = bucket_by_length
        self.num_workers = num_workers
        self._raw: dict[str, datasets.Dataset] = {}
        self._encoded: dict[str, list[dict]] = {}
        self._tokenizer: Tokenizer | None = None

    # -- splits ----------------------------------------------------------------------------------
    def raw(self, role: str) -> datasets.Dataset:
        """The rows of one split, loaded once and checked for emptiness."""
        if role not in self._raw:
            spec = self.split_specs[role]
            if spec is None:
                raise ValueError(f"No {role} split is configured: set data.{role} (a file path, or a split name with data.dataset).")
            ds = self.load(spec, f"data.{role}")
            if len(ds) == 0:
                raise empty_split_error(f"data.{role}", spec)
            self.check(ds, role)
            self._raw[role] = ds
        return self._raw[role]

    def load(self, spec: str, role: str) -> datasets.Dataset:
        """Read one split's rows (``role`` names the option, for errors). Subclasses read other formats."""
        return load_split(self.dataset, self.dataset_config, spec, role)

    def has_split(self, role: str) -> bool:
        return self.split_specs[role] is not None

    def check(self, ds: datasets.Dataset, role: str) -> None:
        """Validate a freshly loaded split (columns present, ...). Subclasses extend."""

    # -- tokenizer -------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.tokenizer_path) if self.tokenizer_path else self.cached_trained_tokenizer()
        return self._tokenizer

    def cached_trained_tokenizer(self, side: str = "input") -> Tokenizer:
        """Train on data.train (``texts_for_tokenizer(side)``) once per (data, options) and cache the result.

        WordPiece training is not deterministic across processes (hash-order tie breaks), so every
        DDP rank must read the same file rather than train its own: the launching process trains
        and caches before the other ranks start.
        """
        train_spec = self.split_specs["train"]
        if train_spec is None:
            raise ValueError("No tokenizer to use: set data.tokenizer (a tokenizer.json or trunk checkpoint), or data.train to train one.")
        sources = []  # local files are keyed by path, size and mtime: an edited file retrains
        for spec in [train_spec] if isinstance(train_spec, str) else train_spec:
            path = Path(spec).expanduser()
            stat = path.stat() if self.dataset is None and path.is_file() else None
            sources.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns] if stat else spec)
        key = json.dumps([type(self).__name__, self.dataset, self.dataset_config, sources, self.tokenizer_text_options(),
                          self.tokenizer_vocab_size, self.lowercase, *([side] if side != "input" else [])])
        path = cache_dir() / "tokenizers" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
        if path.is_file():
            return load_tokenizer(path)
        tokenizer = self.train_tokenizer(self.texts_for_tokenizer(side))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tokenizer.save(str(tmp))
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old state or the whole file
        rank_zero_info(f"Trained a tokenizer on data.train ({tokenizer.get_vocab_size()} tokens), cached at {path}.")
        return tokenizer

    def train_tokenizer(self, texts: Iterator[str]) -> Tokenizer:
        """A new tokenizer trained on ``texts``: WordPiece (translation overrides: BPE, for exact detokenization)."""
        return train_wordpiece(texts, self.tokenizer_vocab_size, self.lowercase)

    def tokenizer_columns(self) -> list[str]:
        """The columns whose text trains the tokenizer (part of the tokenizer cache key)."""
        raise NotImplementedError

    def tokenizer_text_options(self) -> list:
        """Options that change which text trains the tokenizer (part of the cache key)."""
        return self.tokenizer_columns()

    def texts_for_tokenizer(self, side: str = "input") -> Iterator[str]:
        train = self.raw("train")
        for column in self.tokenizer_columns():
            yield from (t for t in train[column] if t)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def pad_id(self) -> int:
        return self.tokenizer.token_to_id(PAD)

    def tokenize(self, texts: list, role: str, is_pretokenized: bool = False) -> list[Encoding]:
        """Encode texts (str, (str, str) pairs, or word lists with ``is_pretokenized``), truncating
        to max_length with one warning per split."""
        tokenizer = self.tokenizer
        tokenizer.enable_truncation(self.max_length)
        encodings = tokenizer.encode_batch(texts, is_pretokenized=is_pretokenized)
        self.warn_truncated(sum(1 for e in encodings if e.overflowing), len(texts), role)
        return encodings

    def warn_truncated(self, truncated: int, total: int, role: str, option: str = "max_length") -> None:
        if truncated:
            rank_zero_warn(
                f"{truncated} of {total} examples in data.{role} are longer than {option}={getattr(self, option)} "
                f"tokens and were truncated. Raise data.{option} to keep them whole."
            )

    # -- Lightning hooks -------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        for role in STAGE_ROLES[stage]:
            if role == "validation" and not self.has_split(role):
                continue  # training without validation is allowed
            if role not in self._encoded:
                self._encoded[role] = self.encode(self.raw(role), role)
        if stage == "fit" and self.trainer is not None:
            # Keep the tokenizer beside the run's logs, so the run can be reused without its checkpoint.
            log_dir = self.trainer.log_dir  # a collective under DDP: every rank must ask
            if log_dir and self.trainer.is_global_zero:
                Path(log_dir).mkdir(parents=True, exist_ok=True)
                self.tokenizer.save(str(Path(log_dir) / "tokenizer.json"))

    def encode(self, ds: datasets.Dataset, role: str) -> list[dict]:
        raise NotImplementedError

    def collate(self, examples: list[dict]) -> dict:
        raise NotImplementedError

    def _loader(self, role: str, train: bool = False) -> DataLoader:
        examples = self._encoded[role]
        size = self.batch_size if train else self.eval_batch_size
        options = dict(collate_fn=self.collate, num_workers=self.num_workers, persistent_workers=self.num_workers > 0)
        if train and self.bucket_by_length:
            # A BatchSampler subclass: under DDP Lightning re-creates it around its distributed sampler.
            batches = LengthBucketBatchSampler(RandomSampler(examples), size, False, [len(e["input_ids"]) for e in examples])
            return DataLoader(examples, batch_sampler=batches, **options)
        # batch_size + shuffle, never a plain BatchSampler: under DDP Lightning would rebuild that loader
        # with batch_size=1 (one example per step).
        return DataLoader(examples, batch_size=size, shuffle=train, **options)

    def has_loaded(self, role: str) -> bool:
        return role in self._encoded

    # -- checkpoints: the tokenizer travels inside every Lightning checkpoint ----------------------
    def state_dict(self) -> dict:
        return {"tokenizer_json": self.tokenizer.to_str()}

    def load_state_dict(self, state: dict) -> None:
        restored = Tokenizer.from_str(state["tokenizer_json"])
        if self._tokenizer is not None and restored.get_vocab() != self._tokenizer.get_vocab():
            raise ValueError(
                "The checkpoint's tokenizer differs from the one this datamodule built. Set data.tokenizer to "
                "the checkpoint path so that the same tokenizer is used."
            )
        self._tokenizer = restored
