"""What every task's data shares (``TaskData``), and the base of the text tasks (``TextDataModule``).

A task's data turns rows into batches; ``MultiTaskData`` (``trunk/datamodules/multitask.py``) combines
one or more of them into the run's datamodule, builds the one tokenizer of the run and hands it to
each (``connect``), and decides which task the next training batch comes from.

Batch contract (every objective reads these keys; see docs/configuration.md, "Batches"):
    task            str           the task the batch belongs to (added by ``MultiTaskData``)
    input_ids       (B, T) long   token ids, padded with the tokenizer's [PAD] id (0) to the batch's longest
    attention_mask  (B, T) long   1 at real tokens, 0 at padding
    labels          task-specific: (B,) class ids, or (B, T) with -100 where no loss is taken
    text            list[str]     the raw inputs (kept for predictions)
    rows            list[str]     training batches: each row's split and index ("train/12"), which kept teacher answers
                                  are found by; ``unlabelled: True`` marks a batch of ``unlabelled`` inputs
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import itertools
import json
import os
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar, Literal

import datasets
import pyarrow.compute as pc
import torch
from lightning.pytorch.utilities import rank_zero_warn
from tokenizers import Encoding, Tokenizer
from torch.utils.data import DataLoader, DistributedSampler

from trunk.core.codec import PAD, fingerprint, special_id
from trunk.core.labels import alike_across, alike_groups, check_fold, describe_alike, fold_label
from trunk.datamodules.encoded import encoded_split
from trunk.datamodules.sources import (
    BUILTIN_PREFIX,
    FileReading,
    check_columns,
    column,
    empty_split_error,
    expand_sources,
    load_split,
    select_rows,
    source_key,
)
from trunk.datamodules.tokenizer import cut_long_texts

ROLES = ("train", "validation", "test", "predict", "unlabelled")
# the splits read without labels, as the user's own files: inputs to predict, and training inputs teachers label
UNLABELLED_ROLES = ("predict", "unlabelled")
STAGE_ROLES = {"fit": ("train", "validation", "unlabelled"), "validate": ("validation",), "test": ("test",),
               "predict": ("predict",)}


def pad(sequences: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    """Right-pad to the longest sequence: (B, T_max)."""
    return torch.nn.utils.rnn.pad_sequence([torch.as_tensor(s, dtype=torch.long) for s in sequences], batch_first=True,
                                           padding_value=value)


def hold_out(n: int, fraction: float, seed: int = 0, strata: Sequence | None = None,
             units: Sequence | None = None, split: str = "validation") -> tuple[list[int], list[int]]:
    """Split ``range(n)`` into (train, validation) indices, ``fraction`` held out at random with a fixed
    seed; with ``strata`` (one label per row) each label keeps its share in both parts. (Not
    ``Dataset.train_test_split(stratify_by_column=)``: that needs a ClassLabel column, refuses labels seen
    once, and would hold out other rows than the published results used.) With ``units`` (one value per row:
    an article, a document, a speaker) whole units are held out, about ``fraction`` of them, so no unit has
    rows on both sides."""
    rng = random.Random(seed)
    if units is not None:
        names = sorted(set(units), key=str)
        rng.shuffle(names)
        held_units = set(names[: max(1, round(len(names) * fraction))])
        if len(held_units) >= len(names):
            raise ValueError(
                f"Only {len(names)} distinct values to hold out by: too few for a {split} share of {fraction:.3g}."
            )
        validation = [i for i in range(n) if units[i] in held_units]
        return [i for i in range(n) if units[i] not in held_units], validation
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
        raise ValueError(f"Only {n} training rows: too few to hold out a {split} share of {fraction:.3g}. "
                         f"Give more data, or a {split} split.")
    held = set(validation)
    return [i for i in range(n) if i not in held], sorted(validation)


def split_off(n: int, fractions: dict[str, float], strata: Sequence | None = None,
              units: Sequence | None = None) -> dict[str, list[int]]:
    """``range(n)`` as each held-out split's indices (``fractions``: split -> its share of all ``n`` rows) and the
    training rows left, held out in order, each from the rows the ones before left, with a seed of its own (the
    validation rows first, so holding out a test share too keeps them as they were)."""
    parts, rest = {}, list(range(n))
    for seed, (split, fraction) in enumerate(fractions.items()):
        share = fraction if len(rest) == n else fraction * n / len(rest)  # of the rows left
        try:
            keep, held = hold_out(len(rest), share, seed,
                                  strata=[strata[i] for i in rest] if strata is not None else None,
                                  units=[units[i] for i in rest] if units is not None else None, split=split)
        except ValueError as err:
            if share == fraction:
                raise
            raise ValueError(f"{err} ({fraction:g} of all rows is {share:.3g} of those the {' and '.join(parts)} "
                             "split left.)") from None
        parts[split], rest = [rest[i] for i in held], [rest[i] for i in keep]
    return {**parts, "train": rest}


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


def length_order(lengths: Sequence[int]) -> list[int]:
    """Prediction's order: shortest first (ties in input order), so each batch pads little. ``trunk predict`` and
    the Python API batch in this one order, so the two give the same batches and the same records."""
    return sorted(range(len(lengths)), key=lengths.__getitem__)


def checked_label_names(names: Sequence | None, option: str = "label_names", fold: str = "none"
                        ) -> list[str] | None:
    """Configured class names as the model will know them: surrounding spaces dropped and folded as ``fold`` says
    (``normalize_labels``), as the data's labels are; an empty or repeated name is refused, since two ids of one name
    would split a class, or merge two, silently."""
    if names is None:
        return None
    stripped = [fold_label(str(name), fold) for name in names]
    if "" in stripped:
        raise ValueError(f"{option} has an empty name (position {stripped.index('') + 1}): name every class.")
    repeated = sorted({name for name in stripped if stripped.count(name) > 1})
    if repeated:
        raise ValueError(
            f"{option} lists {repeated} more than once ({stripped}): each class needs one name of its own."
        )
    warn_alike(stripped, option)
    return stripped


def warn_alike(names: Iterable, where: str) -> None:
    """Warn, naming them and how they differ, of class names that print alike ('Pos' and 'pos'; 'pos' and 'pos' with a
    zero-width space; composed and decomposed accents): each stays a class of its own (folding them is the user's
    call, ``normalize_labels``), which is seldom what the data meant."""
    groups = alike_groups(names)
    if groups:
        rank_zero_warn(f"{where}: the labels {groups[:5]} print alike, so each is a class of its own: "
                       f"{describe_alike(groups)}")


PAIR_CUTS = {
    "longest_first": "pairs lose tokens from the longer text first",
    "only_first": "pairs lose tokens from the first text only",
    "only_second": "pairs lose tokens from the second text only",
}
CHUNK = 1000  # rows per datasets.map batch
NOTES = "__trunk_notes__"  # a column of the encoded files: the chunk's truncation counts (JSON), on its first row
RAW = "__raw__"  # prefix of the raw columns while they are encoded


def _encode_chunk(data: TextDataModule, role: str, features: datasets.Features, chunk: dict) -> dict:
    """datasets.map's function: a chunk of raw rows (columns) -> encoded examples (columns)."""
    data._notes = []
    try:
        chunk = {name[len(RAW) :]: values for name, values in chunk.items()}
        examples = data.encode(datasets.Dataset.from_dict(chunk, features=features), role)
        notes = data._notes
    finally:
        data._notes = None
    columns = {
        name: [e[name].tolist() if isinstance(e[name], torch.Tensor) else e[name] for e in examples]
        for name in examples[0]
    }
    columns[NOTES] = [json.dumps(notes) if i == 0 else "" for i in range(len(examples))]
    return columns


def rows(ds: datasets.Dataset, indices: list[int]) -> list[dict]:
    """Rows ``indices`` of an encoded split as a list of examples (one Arrow take, not a read per row)."""
    columns = ds[indices]
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*columns.values())]


class TaggedCollate:
    """Builds a batch of one split from a list of row indices and marks it with its task (picklable, for workers)."""

    def __init__(self, data: TaskData, role: str, task: str, file: str | None = None, indexed: bool = False) -> None:
        self.data, self.role, self.task, self.file, self.indexed = data, role, task, file, indexed

    def __call__(self, indices: list[int]) -> dict:
        # rows an evaluation shard repeats are left out; a replica with no row of its own scores one (EvalShard)
        own = [i for i in indices if not isinstance(i, Repeated)] or [int(i) for i in indices]
        batch = {"task": self.task, **self.data.make_batch(self.role, own, train=False)}
        if len(own) < len(indices):  # the shard's places it stands for: every replica's are alike (PredictionSamples)
            batch["repeated"] = len(indices) - len(own)
        if self.indexed:  # the rows' places in the split (prediction batches come in order of length)
            batch["index"] = list(own)
        return {**batch, "file": self.file} if self.file is not None else batch


class Repeated(int):
    """A row an evaluation shard gives a replica a second time (``EvalShard``): it is in no batch."""


class PaddedRows(Sequence):
    """An evaluation split's rows, and past their end the rows ``DistributedSampler`` repeats to give every replica as
    many, marked ``Repeated``."""

    def __init__(self, rows: Sequence[int]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, place: int) -> int:
        return self.rows[place] if place < len(self.rows) else Repeated(self.rows[place % len(self.rows)])


class EvalShard(DistributedSampler):
    """One data-parallel replica's share of an evaluation split, as Lightning's sampler deals it (rows in turn, every
    replica as many places, hence as many batches: the collectives of FSDP, tensor parallelism and the metrics' sync
    need every replica in each), except that a place past the split's end, where that sampler repeats a row, holds a
    ``Repeated`` one that the batch leaves out: each row counts once in the metrics, as on one device. That place comes
    first, so its batch keeps the replica's own rows beside it."""

    def __init__(self, rows: PaddedRows, rank: int, replicas: int) -> None:
        super().__init__(rows, num_replicas=replicas, rank=rank, shuffle=False)

    def __iter__(self) -> Iterator[int]:
        places = list(range(self.rank, self.total_size, self.num_replicas))
        return iter(places[-1:] + places[:-1] if places and places[-1] >= len(self.dataset) else places)


@dataclasses.dataclass(frozen=True)
class Preprocessor:
    """A task's data as inference needs it, without its file sources: raw inputs -> examples (``encode``: tokenized,
    paired, windowed; images as they are), examples -> a batch (``collate``), and each example's token count
    (``length``: batches go in order of length). ``input_form`` says what one raw input is (``trunk serve`` shows it);
    ``stem``: the trunk stem it reads; ``settings``: what its batches hold beyond the inputs themselves (an image
    task's normalisation and size), which a teacher reading a student's batches converts from the student's. Bad inputs
    raise ValueError (or TypeError, KeyError)."""

    encode: Callable[[list], list]
    collate: Callable[[list], dict]
    length: Callable[[object], int]
    input_form: str
    stem: str
    settings: dict = dataclasses.field(default_factory=dict)


class Unlabelled(list):
    """A training item of ``unlabelled`` rows (their indices): a batch without labels."""


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
        column_names: the columns of local csv / tsv files that have no header row (GLUE's CoLA, GoEmotions):
            their first row is then read as data.
        file_type: how to read local files whose suffix does not say: csv, tsv, json, jsonl, parquet or lines (SICK
            ships tab-separated rows as SICK.txt); unset: by the suffix.
        line_pattern: for files of one example per line in a shape of their own, a regular expression whose named
            groups are the columns (TREC's ``DESC:manner How did ...``: ``(?P<label>[A-Z]+):\\S+ (?P<text>.+)``).
        encoding: of the local text files (utf-8; latin-1 for older corpora such as TREC).
        delimiter: the one character between the cells of local csv files where it is not a comma (``;``, ``|``),
            predict files' too.
        select: per split, the rows to keep by column value, for files that hold several splits (SICK's
            ``SemEval_set``): ``{train: {SemEval_set: TRAIN}, test: {SemEval_set: TEST}}``; a list of values keeps any.
        val_fraction: with no validation split, hold out this share of the training rows (random
            with a fixed seed; classification keeps each label's share).
        test_fraction: with no test split, hold out this share of the training rows as the test split (after the
            validation share, the same way), for data sets that ship one split (XQuAD).
        hold_out_by: with ``val_fraction`` (``test_fraction``), hold out whole groups of rows by this column
            (articles for QA, documents, speakers), so the validation (test) rows share no group with the training
            rows.
        metrics_per_file: a validation or test split read from several files (different domains) also reports
            each file's metrics, as ``val/<task>/<file>/<metric>`` (the file's name without its suffix).
        batch_size: training batch size; ``eval_batch_size`` defaults to twice it.
        num_workers: dataloader worker processes for evaluation and prediction.
        normalize_labels: fold class names that print alike into one before they become classes (the data's labels,
            ``label_names``): ``nfc`` composes accents typed as two code points; ``nfkc`` also folds compatibility forms
            (full width, ligatures) and drops invisible characters (zero-width spaces and joiners); ``none`` (the
            default) keeps them apart, with a warning naming each such group and how its labels differ.
        predict_columns: the predict split's columns where they are not named as the training files' (option ->
            column: ``{text_column: review}``). Unset, a predict file's one text column stands in for the one the task
            reads. A predict file is the user's own: read by its suffix (a ``.txt``: one input per line), not as
            ``file_type`` / ``line_pattern`` / ``column_names`` say the data set's files are.
        unlabelled: inputs without labels (files read as ``predict`` files are, or a split name with ``dataset``) that
            train the task through its teachers' answers (``model.distill``), in batches of their own beside the
            labelled ones: the usual way a distilled model gets most of its gain.
    """

    kinds: ClassVar[tuple[str, ...]] = ()  # the objective kinds this data feeds
    # whether its rows can come without labels for teachers to answer (``unlabelled``): a kind whose teachers answer
    # from the inputs alone (not translation's, whose word-level answers need the target under teacher forcing)
    reads_unlabelled: ClassVar[bool] = False
    stem: ClassVar[str] = "text"  # the trunk stem its inputs go through
    input_form: ClassVar[str] = ""  # what one raw input of ``Predictor.predict`` is ("" : none); shown by `trunk serve`

    def __init__(
        self,
        dataset: str | None = None,
        dataset_config: str | None = None,
        train: str | list[str] | None = None,
        validation: str | list[str] | None = None,
        test: str | list[str] | None = None,
        predict: str | list[str] | None = None,
        select: dict[str, dict[str, str | int | list]] | None = None,
        hold_out_by: str | None = None,
        column_names: list[str] | None = None,
        file_type: str | None = None,
        line_pattern: str | None = None,
        encoding: str = "utf-8",
        delimiter: str | None = None,
        metrics_per_file: bool = False,
        val_fraction: float = 0.0,
        test_fraction: float = 0.0,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        normalize_labels: Literal["none", "nfc", "nfkc"] = "none",
        predict_columns: dict[str, str] | None = None,
        unlabelled: str | list[str] | None = None,
    ) -> None:
        for name, fraction in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 <= fraction < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {fraction}.")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(f"val_fraction {val_fraction} and test_fraction {test_fraction} hold out every training "
                             "row: their sum must be below 1.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        self.dataset, self.dataset_config = dataset, dataset_config
        if unlabelled is not None and not self.reads_unlabelled:
            raise ValueError(f"{type(self).__name__}: unlabelled inputs are read by text classification, "
                             "regression, multi-label, NER, multiple choice and question answering data, whose "
                             "teachers answer from the inputs alone. Remove unlabelled.")
        self.split_specs = {"train": train, "validation": validation, "test": test, "predict": predict,
                            "unlabelled": unlabelled}
        unknown = sorted(set(select or {}) - set(self.split_specs))
        if unknown:
            raise ValueError(f"select names the splits {unknown}; the splits are {list(self.split_specs)}.")
        self.select = dict(select or {})
        self.hold_out_by = hold_out_by
        self.reading = FileReading(tuple(column_names) if column_names is not None else None, file_type, line_pattern,
                                   encoding, delimiter=delimiter)
        self.metrics_per_file = metrics_per_file
        self._file_rows: dict[str, list[tuple[str, int]]] = {}  # split -> (file, rows) in order, when read from several
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or 2 * batch_size
        self.num_workers = num_workers
        self.normalize_labels = check_fold(normalize_labels)
        self.predict_columns = dict(predict_columns or {})
        self.name = "task"  # set by MultiTaskData: the task's name, for messages and batches

    def option(self, key: str) -> str:
        """How a user spells one of this task's options: ``data.tasks.<name>.<key>``."""
        return f"data.tasks.{self.name}.{key}"

    def columns_read(self) -> str | None:
        """What this task reads, in words, for the run's summary (None: nothing worth saying)."""
        return None

    def check_no_null_options(self) -> None:
        """Refuse an option that needs a value but holds None (``text_column: null``, or a value YAML read as a
        comment): the parser passes None into a class's options unchecked, and it would fail deep in the reading."""
        for cls in type(self).__mro__:
            if "__init__" not in cls.__dict__:
                continue
            for key, param in inspect.signature(cls.__dict__["__init__"]).parameters.items():
                hint = param.annotation if isinstance(param.annotation, str) else ""  # annotations are text here
                if hint and "None" not in hint and "Any" not in hint and getattr(self, key, ...) is None:
                    raise ValueError(
                        f"{self.option(key)} is null, and it needs a value ({hint}; its default: {param.default!r}). "
                        f"Set it, or remove it for the default; a value that starts with '#' must be quoted in YAML."
                    )

    def unlabelled(self, role: str, why: str) -> ValueError:
        """The one error for a split that carries no labels (a test split as GLUE ships it), from a file or the hub."""
        predict = self.split_specs[role] if self.dataset is None else role
        return ValueError(
            f"{self.option(role)} {why}. If it is unlabelled (a test split whose labels are hidden), it cannot be "
            "evaluated: evaluate on a labelled split, and predict this one with `trunk predict --ckpt_path CKPT "
            f"--{self.option('predict')}={predict}`, which takes it as it is."
        )

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

    def preprocessor(self) -> Preprocessor:
        """What ``trunk.tasks.load``'s predictor keeps of this task's data (its settings, connected to the run's
        codec)."""
        return Preprocessor(
            self.input_examples, self.collate, lambda example: len(example["input_ids"]), self.input_form, self.stem
        )

    # -- labels: the names as the config or the data give them, the ids in the order the model uses -----
    _label_names: list[str] | None = None  # set by subclasses with labels: configured, or read from the data
    label_option: ClassVar[str] = "label_names"  # the option that names them
    _label_order: list[str] | None = None

    @property
    def label_order(self) -> list[str]:
        """The label names in the order of the ids batches carry: a trained head's (``use_labels_of``), else the
        data's."""
        return self._label_order or self.label_names

    def use_labels_of(self, stored: list[str], source: str) -> str | None:
        """Carry labels as ids in the order of the trained head's ``stored`` names, matched by *name*: names
        the config leaves unset are taken from it; the same names in another order are reordered; another
        set of names is an error naming both. Returns what was matched, for the run's report."""
        if self._label_names is None:
            self._label_names = list(stored)
            return None
        own = list(self._label_names)
        if own == list(stored):
            return None
        if sorted(own) != sorted(stored):
            alike = alike_across(own, stored)
            raise ValueError(
                f"Task '{self.name}': {source} was trained on the labels {list(stored)}, but "
                f"{self.option(self.label_option)} is {own}{f' (they only look the same: {alike})' if alike else ''}. "
                f"Leave {self.option(self.label_option)} unset to use the trained labels, or list the same names (in "
                "any order)."
            )
        self._label_order = list(stored)
        return f"{self.option(self.label_option)} {own} matched by name to the trained order {list(stored)}"

    def train_batches(self, order: list[int], rng: random.Random) -> list[list[int]]:
        """Batches of training row indices, from a shuffled ``order`` (subclasses may bucket by length)."""
        return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    #: whether training data is streamed (no known size, read as it trains) rather than indexed rows
    streaming: bool = False

    def train_rows(self) -> int:
        """The rows an epoch of training reads: the training split's and the ``unlabelled`` inputs'."""
        return self.size("train") + (self.size("unlabelled") if self.has_split("unlabelled") else 0)

    def train_items(self, seed: str, epoch: int, rank: int, world: int, before: int) -> Iterator:
        """This process's endless training items for one epoch; ``train_batch`` makes each a batch. Here:
        passes over the rows, each shuffled with a seed every process shares, then cut into this
        process's shard. ``before``: this task's batches in earlier epochs (a stream continues after them).
        Unlabelled inputs (``unlabelled``) come in batches of their own, shuffled in among the labelled ones."""
        n = self.size("train")
        for passes in itertools.count():
            rng = random.Random(f"{seed}/{epoch}/{passes}")
            order = list(range(self.train_rows()))
            rng.shuffle(order)
            shard = order[rank::world] or order[:1]
            if len(order) == n:
                yield from self.train_batches(shard, rng)
                continue
            extra = [i - n for i in shard if i >= n]
            batches = self.train_batches([i for i in shard if i < n], rng) + [
                Unlabelled(extra[i : i + self.batch_size]) for i in range(0, len(extra), self.batch_size)]
            rng.shuffle(batches)
            yield from batches

    def train_batch(self, item, generator: torch.Generator) -> dict:
        """The training batch of one item of ``train_items``, its randomness drawn from ``generator``."""
        role = "unlabelled" if isinstance(item, Unlabelled) else "train"
        # each row by name: what a teacher's cached answers are kept under (model.distill's cache)
        batch = {**self.make_batch(role, list(item), train=True, generator=generator),
                 "rows": [f"{role}/{i}" for i in item]}
        return {**batch, "unlabelled": True} if role == "unlabelled" else batch

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    # -- shared ----------------------------------------------------------------------------------------
    def has_split(self, role: str) -> bool:
        return self.split_specs[role] is not None or role in self.held_out()

    def held_out(self) -> dict[str, float]:
        """The splits taken from the training rows (no split of their own given, a share to hold out): split ->
        share."""
        if self.split_specs["train"] is None:
            return {}
        shares = {"validation": self.val_fraction, "test": self.test_fraction}
        return {split: share for split, share in shares.items() if share > 0 and self.split_specs[split] is None}

    def cut_from_train(self, role: str) -> bool:
        """Whether ``role``'s rows are cut out of the training rows: a held-out split, or the training split itself
        when any split is held out of it (then they are read, and cut, together)."""
        held_out = self.held_out()
        return role in held_out or role == "train" and bool(held_out)

    def input_files(self, roles: Iterable[str] = ROLES) -> list[Path]:
        """The local files this task reads, of every split (which no output of the run may replace) or of ``roles``."""
        if self.dataset is not None:
            return []
        files = []
        for spec in (self.split_specs[role] for role in roles if self.split_specs[role] is not None):
            with contextlib.suppress(FileNotFoundError, ValueError):  # a pattern matching nothing reads nothing
                files += [Path(path) for source in expand_sources(None, spec, "") for path in self.files_of(source)]
        return files

    def files_of(self, source: str) -> list[str]:
        """The files one source path stands for (a translation's {lang} path: one per language)."""
        return [source]

    def spec(self, role: str):
        spec = self.split_specs[role]
        if spec is None:
            raise ValueError(f"No {role} split is configured for task '{self.name}': set {self.option(role)} "
                             "(a file path, or a split name with dataset).")
        return spec

    def lengths(self, role: str) -> list[int] | None:
        """Each row's length (its top-level input entries: tokens, or candidates and windows for nested rows), for
        batching by length; None: all rows alike (images)."""
        return None

    def loaders(self, role: str, by_length: bool = False, shard: tuple[int, int] | None = None) -> list[DataLoader]:
        """The evaluation / prediction loaders of one split, in order; batches carry the task's name. One loader,
        or with ``metrics_per_file`` one per file of a split read from several, its batches marked with the file.
        ``by_length`` (prediction): the rows in ``length_order``, each batch carrying its rows' places as "index".
        ``shard``: (rank, replicas) of a data-parallel run's evaluation: this replica's ``EvalShard`` of each loader's
        rows."""
        self.prepare(role)
        files = []
        if self.metrics_per_file and role in ("validation", "test"):
            self.raw(role)  # which rows come from which file (an encoded split read from the cache does not say)
            files = self._file_rows.get(role, [])
        if by_length:
            lengths = self.lengths(role)
            order = length_order(lengths) if lengths is not None else list(range(self.size(role)))
            return [self._loader(order, TaggedCollate(self, role, self.name, indexed=True))]
        if len(files) < 2:
            return [self._loader(range(self.size(role)), TaggedCollate(self, role, self.name), shard)]
        starts = itertools.accumulate([0] + [rows for _, rows in files])
        return [self._loader(range(start, start + rows), TaggedCollate(self, role, self.name, file), shard)
                for (file, rows), start in zip(files, starts)]

    def _loader(self, rows: Sequence[int], collate: TaggedCollate, shard: tuple[int, int] | None = None
                ) -> DataLoader:
        sampler = None
        if shard:
            rows = PaddedRows(rows)
            sampler = EvalShard(rows, *shard)
            if 0 < len(rows) < shard[1]:
                where = f"{self.option(collate.role)}{f' ({collate.file})' if collate.file else ''}"
                rank_zero_warn(f"{where}: {len(rows)} rows for {shard[1]} data-parallel replicas, so a replica without "
                               "a row of its own scores one another replica scores too (every replica takes part in "
                               "each evaluation batch): those rows count twice in its metrics. Evaluate on fewer "
                               "devices (trainer.devices) for exact numbers.")
        return DataLoader(
            rows,
            batch_size=self.eval_batch_size,
            shuffle=False,
            sampler=sampler,
            collate_fn=collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            generator=torch.Generator(),
        )  # not the global RNG (see train_dataloader)


class TextDataModule(TaskData):
    """Text tasks: rows (hub, local files or built-in) tokenized with the run's tokenizer.

    Subclasses implement ``tokenizer_columns()``, ``encode(ds, role) -> list[dict]`` (one dict of
    python values per example, for any slice of the split's rows) and ``collate(examples) -> batch``.

    Encoded splits live in an on-disk Arrow cache (``trunk/datamodules/encoded.py``), keyed by the rows,
    the tokenizer and every option of the task, and memory-mapped: the next run and every process
    of a distributed run read them instead of tokenizing again. They are built with
    ``datasets.map(batched=True)``, in ``num_proc`` processes.

    Args:
        max_length: longer inputs are truncated (with one warning per split).
        truncation: which side of a text pair is cut to fit ``max_length``: ``longest_first`` (a token from the
            longer text at a time, the tokenizers' default), ``only_first`` or ``only_second`` (keep the other whole;
            an error if that alone is too long). Single texts are cut at the end; QA windows its context instead.
        bucket_by_length: batch training examples of similar length together.
        num_proc: processes that encode a split (``datasets.map``'s ``num_proc``); unset: one, whose
            tokenizer already runs on every core.
        **kwargs: see ``TaskData`` (dataset, splits, val_fraction, batch sizes, workers).
    """

    tokenizer_model: ClassVar[str] = "wordpiece"  # translation wants "bpe" (exact detokenization)
    # Options that change how batches are drawn, not what a split encodes to: not part of the cache key.
    not_encoding: ClassVar[frozenset[str]] = frozenset(
        {"batch_size", "eval_batch_size", "num_workers", "num_proc", "bucket_by_length", "name"}
    )

    def __init__(
        self,
        max_length: int = 128,
        truncation: Literal["longest_first", "only_first", "only_second"] = "longest_first",
        bucket_by_length: bool = False,
        num_proc: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if num_proc is not None and num_proc < 1:
            raise ValueError(f"num_proc must be >= 1 (processes that encode a split), got {num_proc}.")
        if truncation not in PAIR_CUTS:
            raise ValueError(f"truncation={truncation!r}: choose one of {list(PAIR_CUTS)}.")
        self.max_length = max_length
        self.truncation = truncation
        self.bucket_by_length = bucket_by_length
        self.num_proc = num_proc
        self._raw: dict[str, datasets.Dataset] = {}
        self._encoded: dict[str, datasets.Dataset] = {}
        self._tokenizer: Tokenizer | None = None
        self._notes: list | None = None  # while encoding for the cache: truncation counts, reported once per split
        self.lowercase = False

    def connect(self, tokenizer: Tokenizer, lowercase: bool = False, target: Tokenizer | None = None) -> None:
        """Hand this task the run's tokenizer (and the run's lowercasing, for tokenizers it trains itself);
        ``target``: its own output tokenizer, where it has one (``own_target_tokenizer``)."""
        if self._tokenizer is not None and self._tokenizer.get_vocab() != tokenizer.get_vocab():
            self._encoded.clear()  # encoded with another tokenizer
        self._tokenizer, self.lowercase = tokenizer, lowercase

    def own_target_tokenizer(self) -> Tokenizer | None:
        """A tokenizer of this task's own for its outputs (translation with separate vocabularies), else None."""
        return None

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise RuntimeError(f"Task '{self.name}' has no tokenizer yet: MultiTaskData connects one before encoding.")
        return self._tokenizer

    # -- splits ----------------------------------------------------------------------------------
    def raw(self, role: str) -> datasets.Dataset:
        """The rows of one split, loaded once and checked for emptiness."""
        if role not in self._raw:
            if self.cut_from_train(role):
                rows = self.read("train")
                self.check(rows, "train")
                units = None
                if self.hold_out_by is not None:
                    check_columns(rows, {"hold_out_by": self.hold_out_by}, self.option("train"))
                    units = column(rows, self.hold_out_by)
                for split, index in split_off(len(rows), self.held_out(), self.strata(rows), units).items():
                    self._raw[split] = rows.select(index)
            else:
                ds = self.read(role)
                if role in UNLABELLED_ROLES:
                    ds = self.named_inputs(ds, role)
                self.check(ds, role)
                self._raw[role] = ds
        return self._raw[role]

    def read(self, role: str) -> datasets.Dataset:
        """One split's rows as configured: loaded (every file of a list or pattern, in order, as one split), narrowed by
        ``select``, and not empty."""
        self.reading.check(self.option("")[:-1])
        sources = expand_sources(self.dataset, self.spec(role), self.option(role))
        parts = [self.load(source, self.option(role)) for source in sources]
        for source, part in zip(sources[1:], parts[1:]):
            if part.column_names != parts[0].column_names:
                raise ValueError(
                    f"{self.option(role)}: '{source}' has the columns {part.column_names}, but '{sources[0]}' has "
                    f"{parts[0].column_names}: the files of one split must have the same columns."
                )
        if role in self.select:
            parts = [
                select_rows(part, self.select[role], self.option(f"select.{role}"), source)
                for part, source in zip(parts, sources)
            ]
        if len(parts) > 1:
            names = [Path(source).name.split(".")[0] for source in sources]  # dev_in.tsv.gz -> dev_in
            names = [name if names.count(name) == 1 else f"{name}_{i + 1}" for i, name in enumerate(names)]
            self._file_rows[role] = [(name, len(part)) for name, part in zip(names, parts)]
        ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets([p.cast(parts[0].features) for p in parts])
        if len(ds) == 0:
            raise empty_split_error(self.option(role), str(self.spec(role)))
        return ds

    def load(self, spec: str, role: str) -> datasets.Dataset:
        """Read one split's rows (``role`` names the option, for errors). Subclasses read other formats."""
        return load_split(self.dataset, self.dataset_config, spec, role, self.reading_of(spec, role))

    def reading_of(self, spec: str, role: str) -> FileReading:
        """How one file is read: as configured, except a predict input that is none of the data set's own files (the
        user's texts): by its suffix, a ``.txt`` (or no suffix) as one input per line, in the configured encoding and
        delimiter."""
        if not role.endswith(tuple(f".{r}" for r in UNLABELLED_ROLES)) or self.dataset is not None:
            return self.reading
        data_set = {path.expanduser().resolve() for path in self.input_files(("train", "validation", "test"))}
        if Path(spec).expanduser().resolve() in data_set:
            return self.reading
        return FileReading(encoding=self.reading.encoding, plain_text_as_lines=True, delimiter=self.reading.delimiter)

    def check(self, ds: datasets.Dataset, role: str) -> None:
        """Validate a freshly loaded split (columns present, ...). Subclasses extend."""

    def input_columns(self) -> dict[str, str | None]:
        """Option -> column of each input a row is read from (not its target): what a predict row needs."""
        return {}

    def named_inputs(self, ds: datasets.Dataset, role: str = "predict") -> datasets.Dataset:
        """A predict split's rows with its input columns renamed to the ones the task reads: as ``predict_columns``
        says, else a task that misses one input column takes the file's one other text column (a lines file's
        ``text``, a JSONL's only key) for it. What stays missing is left to ``check`` to name."""
        needed = {option: name for option, name in self.input_columns().items() if name is not None}
        unknown = sorted(set(self.predict_columns) - set(needed))
        if unknown:
            raise ValueError(f"{self.option('predict_columns')} names {unknown}, which this task does not read: it "
                             f"reads {sorted(needed) or 'no text columns'}.")
        renames = {}
        for option, name in self.predict_columns.items():
            check_columns(ds, {option: name}, self.option(role), prefix=self.option("predict_columns"))
            renames[name] = needed[option]
        missing = [name for option, name in needed.items() if name not in ds.column_names and option not in
                   self.predict_columns]
        texts = [c for c, feature in ds.features.items() if c not in renames and c not in needed.values()
                 and getattr(feature, "dtype", None) in ("string", "large_string")]
        if len(missing) == 1 and len(texts) == 1:
            renames[texts[0]] = missing[0]
        renames = {old: new for old, new in renames.items() if old != new}
        if not renames:
            return ds
        taken = [new for new in renames.values() if new in ds.column_names and new not in renames]  # not the input
        return ds.remove_columns(taken).rename_columns(renames)

    def check_inputs(self, ds: datasets.Dataset, role: str) -> None:
        """Fail early, naming the option to set, when a split lacks an input column (``input_columns``)."""
        if role not in UNLABELLED_ROLES:
            check_columns(ds, self.input_columns(), self.option(role))
            return
        missing = {option: name for option, name in self.input_columns().items()
                   if name is not None and name not in ds.column_names}
        if missing:
            example = ", ".join(f"{option}: COLUMN" for option in missing)
            raise ValueError(
                f"{self.option(role)} has no column {' or '.join(map(repr, missing.values()))} (the task's "
                f"{', '.join(missing)}); its columns are {ds.column_names}. Name the file's own with "
                f"--{self.option('predict_columns')} '{{{example}}}' (a file with one text column needs none)."
            )

    def strata(self, rows: datasets.Dataset) -> list | None:
        """One value per row to stratify the held-out validation share by (classification: the label)."""
        return None

    # -- tokenizer -------------------------------------------------------------------------------
    def tokenizer_columns(self) -> list[str]:
        """The columns whose text trains the tokenizer."""
        raise NotImplementedError

    def tokenizer_key(self) -> list:
        """What the tokenizer trained on this task's text depends on (part of the tokenizer cache key)."""
        sources = [source_key(self.dataset, spec) for spec in self._train_specs()]  # a hub dataset's name among them
        return [type(self).__name__, self.dataset_config, sources, self.tokenizer_text_options()]

    def _train_specs(self) -> list[str]:
        return expand_sources(self.dataset, self.spec("train"), self.option("train"))

    def tokenizer_text_options(self) -> list:
        """Options that change which text trains the tokenizer (part of the cache key)."""
        return [
            *self.tokenizer_columns(),
            self.val_fraction,
            self.test_fraction,
            self.split_specs["validation"],
            self.split_specs["test"],
            self.select.get("train"),
            self.hold_out_by,
            dataclasses.asdict(self.reading),
        ]

    def texts_for_tokenizer(self) -> Iterator[str]:
        train = self.raw("train")
        for name in self.tokenizer_columns():
            yield from (t for t in column(train, name) if t)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def pad_id(self) -> int:
        return special_id(self.tokenizer, PAD)

    def tokenize(self, texts: list, role: str, is_pretokenized: bool = False) -> list[Encoding]:
        """Encode texts (str, (str, str) pairs, or word lists with ``is_pretokenized``), truncating
        to max_length with one warning per split."""
        tokenizer = self.tokenizer
        pairs = bool(texts) and isinstance(texts[0], tuple)
        tokenizer.enable_truncation(self.max_length, strategy=self.truncation if pairs else "longest_first")
        try:
            if not is_pretokenized:
                texts = cut_long_texts(tokenizer, texts, self.max_length)
            encodings = tokenizer.encode_batch(texts, is_pretokenized=is_pretokenized)
        except Exception as err:  # tokenizers: "Truncation error: Second sequence not long enough to be truncated"
            if "Truncation error" not in str(err):
                raise
            raise ValueError(
                f"{self.option(role)}: with {self.option('truncation')}={self.truncation}, a pair's other text alone "
                f"is longer than {self.option('max_length')}={self.max_length} ({err}). Use truncation: longest_first, "
                "or a larger max_length."
            ) from None
        self.warn_truncated(sum(1 for e in encodings if e.overflowing), len(texts), role, pairs=pairs)
        return encodings

    def warn_truncated(
        self,
        truncated: int,
        total: int,
        role: str,
        option: str = "max_length",
        words_lost: int | None = None,
        pairs: bool = False,
    ) -> None:
        """One warning for the examples of a split cut to ``option`` tokens (``words_lost``: NER words left without
        sub-tokens; ``pairs``: text pairs, cut as ``truncation`` says). While a split is encoded in chunks, the counts
        are collected and summed (``report_truncation``)."""
        if self._notes is not None:
            self._notes.append([truncated, total, role, option, words_lost, pairs])
        elif truncated:
            consequence = (
                ""
                if words_lost is None
                else f" ({words_lost} words lost their sub-tokens: they are predicted O, and scored so)"
            )
            if pairs:
                consequence += f" ({PAIR_CUTS[self.truncation]}: {self.option('truncation')}={self.truncation})"
            rank_zero_warn(
                f"{truncated} of {total} examples in {self.option(role)} are longer than "
                f"{option}={getattr(self, option)} tokens and were truncated{consequence}. Raise {self.option(option)} "
                "to keep them whole; it may not exceed model.trunk.max_len (the position table's length, fixed by a "
                "pretrained trunk), so raise that too when training from scratch."
            )

    def report_truncation(self, notes: list) -> None:
        """Warn once per (split, option) for the truncation counts collected over a split's chunks."""
        totals: dict = {}
        for truncated, total, role, option, words_lost, *pairs in notes:
            entry = totals.setdefault((role, option, bool(pairs and pairs[0])), [0, 0, None])
            entry[0], entry[1] = entry[0] + truncated, entry[1] + total
            if words_lost is not None:
                entry[2] = (entry[2] or 0) + words_lost
        for (role, option, pairs), (truncated, total, words_lost) in totals.items():
            self.warn_truncated(truncated, total, role, option, words_lost, pairs)

    # -- TaskData --------------------------------------------------------------------------------
    def info(self) -> dict:
        return {**super().info(), "max_length": self.max_length}

    def prepare(self, role: str) -> None:
        """Encode one split into the cache, or map the cached encoding (``trunk/datamodules/encoded.py``)."""
        if role not in self._encoded:
            # the split by name (task class, role, files by path) and which version of its files it read
            origin = ([type(self).__qualname__, role, self.dataset, self.split_specs.get(role)], self.sources(role))
            ds, notes = encoded_split(self.encoding_key(role), functools.partial(self.build_encoded, role),
                                      self.option(role), origin)
            self.report_truncation(notes)
            self._encoded[role] = ds.remove_columns(NOTES) if NOTES in ds.column_names else ds  # a view: no rewrite

    def size(self, role: str) -> int:
        return len(self._encoded[role])

    def make_batch(self, role: str, indices: list[int], train: bool, generator: torch.Generator | None = None) -> dict:
        return self.collate(rows(self._encoded[role], indices))

    def train_batches(self, order: list[int], rng: random.Random) -> list[list[int]]:
        if not self.bucket_by_length:
            return super().train_batches(order, rng)
        return length_buckets(order, self.lengths("train"), self.batch_size, rng)

    def lengths(self, role: str) -> list[int]:
        return pc.list_value_length(self._encoded[role].data.column("input_ids")).to_pylist()

    # -- the encoded-split cache -------------------------------------------------------------------
    def encoding_key(self, role: str) -> list:
        """Everything a split's encoding depends on: the task class and its options, the rows' sources,
        what the model is told about the data (label names ...), and the tokenizers."""
        options = {}
        for name, value in sorted(vars(self).items()):
            # the rows' sources are keyed by what they hold (sources()), not where they lie: a copy is the same data
            if not name.startswith("_") and name not in self.not_encoding | {"dataset", "split_specs"}:
                value = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value  # how files are read
                with contextlib.suppress(TypeError, ValueError):  # not a plain option: left out
                    options[name] = json.loads(json.dumps(value))
        return [
            type(self).__module__,
            type(self).__qualname__,
            role,
            options,
            self.sources(role),
            self.info(),
            self.tokenizer_fingerprints(),
        ]

    def sources(self, role: str) -> list:
        """Which version of its sources a split reads (``source_key``; with a held-out share, the training split's
        too)."""
        roles = [role] + (["train"] if role in self.held_out() else [])
        sources = [[source_key(self.dataset, spec) for spec in expand_sources(self.dataset, s, self.option(r))]
                   for r, s in ((r, self.split_specs[r]) for r in roles) if s is not None]
        hub = (
            self.dataset is not None
            and not self.dataset.startswith(BUILTIN_PREFIX)
            and not Path(self.dataset).expanduser().is_dir()
        )
        if hub:  # a hub dataset's rows can change under the same name: key by its fingerprint too
            sources.append(self.raw(role)._fingerprint)
        return sources

    def tokenizer_fingerprints(self) -> list[str]:
        return [fingerprint(self.tokenizer)]

    #: whether ``encode`` may see any slice of the rows; False: it needs the whole split at once (document context)
    encodes_rows_independently: ClassVar[bool] = True

    def build_encoded(self, role: str, directory: Path) -> list:
        """Encode one split into Arrow files in ``directory`` (``datasets.map``, batched, ``num_proc``
        processes); returns the truncation counts to report."""
        raw = self.raw(role)
        self.info()  # label names and the like, worked out once here rather than in every process
        # Renamed inputs: datasets would cast an output column to the type of the input column of its name.
        source = raw.rename_columns({name: RAW + name for name in raw.column_names})
        encoded = self.map_rows(
            source,
            functools.partial(_encode_chunk, self, role, raw.features),
            directory / "encoded.arrow",
            f"Encoding {self.option(role)}",
            whole=not self.encodes_rows_independently,
        )
        return [n for chunk in column(encoded, NOTES) if chunk for n in json.loads(chunk)]

    def map_rows(self, ds: datasets.Dataset, function, path: Path, desc: str, whole: bool = False) -> datasets.Dataset:
        """``datasets.map(function, batched=True)`` over chunks of ``ds`` (the whole of it with ``whole``), written
        to ``path``: in ``num_proc`` processes where the split has a chunk for each."""
        procs = None if whole or (self.num_proc or 1) < 2 or len(ds) < 2 * CHUNK else self.num_proc
        previous = os.environ.get("TOKENIZERS_PARALLELISM")
        if procs:  # each process encodes on one core; no fork-after-threads warning from tokenizers
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            return ds.map(
                function,
                batched=True,
                batch_size=None if whole else CHUNK,
                num_proc=procs,
                remove_columns=ds.column_names,
                cache_file_name=str(path),
                new_fingerprint=hashlib.sha256(str(path).encode()).hexdigest()[:32],
                desc=desc,
            )
        finally:
            if procs:
                os.environ.pop("TOKENIZERS_PARALLELISM") if previous is None else os.environ.update(
                    TOKENIZERS_PARALLELISM=previous
                )

    def encode(self, ds: datasets.Dataset, role: str) -> list[dict]:
        raise NotImplementedError

    def collate(self, examples: list[dict]) -> dict:
        raise NotImplementedError

    def input_examples(self, inputs: list) -> list[dict]:
        """Encoded examples from raw inputs (texts, or what the task's predict rows hold): for the Python API,
        which sorts them by length before batching them with ``collate``. ``"truncated": True`` marks an input
        cut to fit ``max_length`` (its record says so)."""
        raise NotImplementedError(f"{type(self).__name__} does not predict from raw inputs.")

    def encode_inputs(self, inputs: list) -> dict:
        """A predict batch from raw inputs."""
        return self.collate(self.input_examples(inputs))
