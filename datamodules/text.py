"""What every task's data shares (``TaskData``), and the base of the text tasks (``TextDataModule``).

A task's data turns rows into batches; ``MultiTaskData`` (``datamodules/multitask.py``) combines
one or more of them into the run's datamodule, builds the one tokenizer of the run and hands it to
each (``connect``), and decides which task the next training batch comes from.

Batch contract (every objective reads these keys; see README "Batches"):
    task            str           the task the batch belongs to (added by ``MultiTaskData``)
    input_ids       (B, T) long   token ids, padded with the tokenizer's [PAD] id (0) to the batch's longest
    attention_mask  (B, T) long   1 at real tokens, 0 at padding
    labels          task-specific: (B,) class ids, or (B, T) with -100 where no loss is taken
    text            list[str]     the raw inputs (kept for predictions)
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import ClassVar

import datasets
import torch
from lightning.pytorch.utilities import rank_zero_warn
from tokenizers import Encoding, Tokenizer
from torch.utils.data import DataLoader
from trunk.datamodules.sources import empty_split_error, load_split, source_key
from trunk.datamodules.tokenizer import PAD

ROLES = ("train", "validation", "test", "predict")
STAGE_ROLES = {"fit": ("train", "validation"), "validate": ("validation",), "test": ("test",), "predict": ("predict",)}


def pad(sequences: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    """Right-pad to the longest sequence: (B, T_max)."""
    out = torch.full((len(sequences), max(len(s) for s in sequences)), value, dtype=torch.long)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


def hold_out(n: int, fraction: float, seed: int = 0, strata: Sequence | None = None) -> tuple[list[int], list[int]]:
    """Split ``range(n)`` into (train, validation) indices, ``fraction`` held out at random with a fixed
    seed; with ``strata`` (one label per row) each label keeps its share in both parts."""
    rng = random.Random(seed)
    groups: dict = {}
    for i in range(n):
        groups.setdefault(strata[i] if strata is not None else None, []).append(i)
    validation: list[int] = []
    for members in groups.values():
        rng.shuffle(members)
        validation += members[: round(len(members) * fraction)]
    if not validation and n > 1:  # tiny data: at least one row
        validation = [rng.randrange(n)]
    if len(validation) >= n:
        raise ValueError(f"Only {n} training rows: too few to hold out a validation share of {fraction}. "
                         "Give more data, or a validation split.")
    held = set(validation)
    return [i for i in range(n) if i not in held], sorted(validation)


def length_buckets(order: list[int], lengths: Sequence[int], batch_size: int, rng: random.Random,
                   pool_batches: int = 50) -> list[list[int]]:
    """Batches of similar length (less padding, fewer wasted FLOPs): take ``pool_batches * batch_size``
    indices of ``order`` at a time, sort them by length, cut them into batches, shuffle the batches."""
    batches: list[list[int]] = []
    pool_size = pool_batches * batch_size
    for start in range(0, len(order), pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: lengths[i])
        chunk = [pool[i : i + batch_size] for i in range(0, len(pool), batch_size)]
        rng.shuffle(chunk)
        batches += chunk
    return batches


class TaggedCollate:
    """Builds a batch of one split from a list of row indices and marks it with its task (picklable, for workers)."""

    def __init__(self, data: "TaskData", role: str, task: str) -> None:
        self.data, self.role, self.task = data, role, task

    def __call__(self, indices: list[int]) -> dict:
        return {"task": self.task, **self.data.make_batch(self.role, indices, train=False)}


class TaskData:
    """One task's data: its splits, how rows become batches, what the model must know about it.

    Subclasses read their sources (``prepare``), report their size (``size``) and build batches
    from row indices (``make_batch``). ``MultiTaskData`` does the rest: loaders, sampling across
    tasks, the tokenizer.

    Args:
        dataset: a hub dataset name (``glue``), a local dataset directory, a built-in ``trunk:<name>``,
            or unset: then ``train`` / ``validation`` / ... are file paths.
        dataset_config: the hub dataset's configuration (``sst2`` for ``glue``).
        train, validation, test, predict: split names when ``dataset`` is set (``train[:10%]``
            works), else file paths. Unset splits are skipped.
        val_fraction: with no validation split, hold out this share of the training rows (random
            with a fixed seed; classification keeps each label's share).
        batch_size: training batch size; ``eval_batch_size`` defaults to twice it.
        num_workers: dataloader worker processes for evaluation and prediction.
    """

    kinds: ClassVar[tuple[str, ...]] = ()  # the objective kinds this data feeds
    stem: ClassVar[str] = "text"  # the trunk stem its inputs go through

    def __init__(
        self,
        dataset: str | None = None,
        dataset_config: str | None = None,
        train: str | None = None,
        validation: str | None = None,
        test: str | None = None,
        predict: str | None = None,
        val_fraction: float = 0.0,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
    ) -> None:
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        self.dataset, self.dataset_config = dataset, dataset_config
        self.split_specs = {"train": train, "validation": validation, "test": test, "predict": predict}
        self.val_fraction = val_fraction
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or 2 * batch_size
        self.num_workers = num_workers
        self.name = "task"  # set by MultiTaskData: the task's name, for messages and batches

    def option(self, key: str) -> str:
        """How a user spells one of this task's options: ``data.tasks.<name>.<key>``."""
        return f"data.tasks.{self.name}.{key}"

    # -- for subclasses ------------------------------------------------------------------------------
    def prepare(self, role: str) -> None:
        """Read (and encode) one split, once."""
        raise NotImplementedError

    def size(self, role: str) -> int:
        raise NotImplementedError

    def make_batch(self, role: str, indices: list[int], train: bool, generator: torch.Generator | None = None) -> dict:
        """The batch of rows ``indices`` of split ``role``; ``train``: with training-time randomness (masks,
        augmentation) drawn from ``generator``."""
        raise NotImplementedError

    def info(self) -> dict:
        """What the model must know about this task's data: ``kinds``, and ``label_names`` where there are labels."""
        return {"kinds": list(self.kinds), "stem": self.stem}

    def train_batches(self, order: list[int], rng: random.Random) -> list[list[int]]:
        """Batches of training row indices, from a shuffled ``order`` (subclasses may bucket by length)."""
        return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    # -- shared ----------------------------------------------------------------------------------------
    def has_split(self, role: str) -> bool:
        held_out = role == "validation" and self.val_fraction > 0 and self.split_specs["train"] is not None
        return self.split_specs[role] is not None or held_out

    def spec(self, role: str):
        spec = self.split_specs[role]
        if spec is None:
            raise ValueError(f"No {role} split is configured for task '{self.name}': set {self.option(role)} "
                             "(a file path, or a split name with dataset).")
        return spec

    def loader(self, role: str) -> DataLoader:
        """An evaluation / prediction loader over one split, in order; batches carry the task's name."""
        self.prepare(role)
        return DataLoader(range(self.size(role)), batch_size=self.eval_batch_size, shuffle=False,
                          collate_fn=TaggedCollate(self, role, self.name), num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, generator=torch.Generator())  # not the global RNG (see train_dataloader)


class TextDataModule(TaskData):
    """Text tasks: rows (hub, local files or built-in) tokenized with the run's tokenizer.

    Subclasses implement ``tokenizer_columns()``, ``encode(ds, role) -> list[dict]`` (one dict of
    python values per example) and ``collate(examples) -> batch``.

    Args:
        max_length: longer inputs are truncated (with one warning per split).
        bucket_by_length: batch training examples of similar length together.
        **kwargs: see ``TaskData`` (dataset, splits, val_fraction, batch sizes, workers).
    """

    tokenizer_model: ClassVar[str] = "wordpiece"  # translation wants "bpe" (exact detokenization)

    def __init__(self, max_length: int = 128, bucket_by_length: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.max_length = max_length
        self.bucket_by_length = bucket_by_length
        self._raw: dict[str, datasets.Dataset] = {}
        self._encoded: dict[str, list[dict]] = {}
        self._tokenizer: Tokenizer | None = None
        self.lowercase = False

    def connect(self, tokenizer: Tokenizer, lowercase: bool = False) -> None:
        """Hand this task the run's tokenizer (and the run's lowercasing, for tokenizers it trains itself)."""
        if self._tokenizer is not None and self._tokenizer.get_vocab() != tokenizer.get_vocab():
            self._encoded.clear()  # encoded with another tokenizer
        self._tokenizer, self.lowercase = tokenizer, lowercase

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise RuntimeError(f"Task '{self.name}' has no tokenizer yet: MultiTaskData connects one before encoding.")
        return self._tokenizer

    # -- splits ----------------------------------------------------------------------------------
    def raw(self, role: str) -> datasets.Dataset:
        """The rows of one split, loaded once and checked for emptiness."""
        if role not in self._raw:
            if role in ("train", "validation") and self.split_specs["validation"] is None and self.val_fraction > 0:
                rows = self.load(self.spec("train"), self.option("train"))
                if len(rows) == 0:
                    raise empty_split_error(self.option("train"), self.spec("train"))
                self.check(rows, "train")
                train, validation = hold_out(len(rows), self.val_fraction, strata=self.strata(rows))
                self._raw["train"], self._raw["validation"] = rows.select(train), rows.select(validation)
            else:
                ds = self.load(self.spec(role), self.option(role))
                if len(ds) == 0:
                    raise empty_split_error(self.option(role), str(self.spec(role)))
                self.check(ds, role)
                self._raw[role] = ds
        return self._raw[role]

    def load(self, spec: str, role: str) -> datasets.Dataset:
        """Read one split's rows (``role`` names the option, for errors). Subclasses read other formats."""
        return load_split(self.dataset, self.dataset_config, spec, role)

    def check(self, ds: datasets.Dataset, role: str) -> None:
        """Validate a freshly loaded split (columns present, ...). Subclasses extend."""

    def strata(self, rows: datasets.Dataset) -> list | None:
        """One value per row to stratify the held-out validation share by (classification: the label)."""
        return None

    # -- tokenizer -------------------------------------------------------------------------------
    def tokenizer_columns(self) -> list[str]:
        """The columns whose text trains the tokenizer."""
        raise NotImplementedError

    def tokenizer_key(self) -> list:
        """What the tokenizer trained on this task's text depends on (part of the tokenizer cache key)."""
        sources = [source_key(self.dataset, spec) for spec in self._train_specs()]
        return [type(self).__name__, self.dataset, self.dataset_config, sources, self.tokenizer_text_options()]

    def _train_specs(self) -> list[str]:
        spec = self.spec("train")
        return [spec] if isinstance(spec, str) else list(spec)

    def tokenizer_text_options(self) -> list:
        """Options that change which text trains the tokenizer (part of the cache key)."""
        return [*self.tokenizer_columns(), self.val_fraction, self.split_specs["validation"]]

    def texts_for_tokenizer(self) -> Iterator[str]:
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

    def warn_truncated(self, truncated: int, total: int, role: str, option: str = "max_length", consequence: str = "") -> None:
        if truncated:
            rank_zero_warn(
                f"{truncated} of {total} examples in {self.option(role)} are longer than {option}={getattr(self, option)} "
                f"tokens and were truncated{consequence}. Raise {self.option(option)} to keep them whole; it may not exceed "
                "model.trunk.max_len (the position table's length, fixed by a pretrained trunk), so raise that too when "
                "training from scratch."
            )

    # -- TaskData --------------------------------------------------------------------------------
    def info(self) -> dict:
        return {**super().info(), "max_length": self.max_length}

    def prepare(self, role: str) -> None:
        if role not in self._encoded:
            self._encoded[role] = self.encode(self.raw(role), role)

    def size(self, role: str) -> int:
        return len(self._encoded[role])

    def make_batch(self, role: str, indices: list[int], train: bool, generator: torch.Generator | None = None) -> dict:
        examples = self._encoded[role]
        return self.collate([examples[i] for i in indices])

    def train_batches(self, order: list[int], rng: random.Random) -> list[list[int]]:
        if not self.bucket_by_length:
            return super().train_batches(order, rng)
        lengths = [len(e["input_ids"]) for e in self._encoded["train"]]
        return length_buckets(order, lengths, self.batch_size, rng)

    def encode(self, ds: datasets.Dataset, role: str) -> list[dict]:
        raise NotImplementedError

    def collate(self, examples: list[dict]) -> dict:
        raise NotImplementedError

    def encode_inputs(self, inputs: list) -> dict:
        """A predict batch from raw inputs (texts, or what the task's predict rows hold): for the Python API."""
        raise NotImplementedError(f"{type(self).__name__} does not predict from raw inputs.")
