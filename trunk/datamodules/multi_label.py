"""Multi-label text data: each text (or text pair) with a set of labels, possibly empty."""

from __future__ import annotations

from collections import Counter

import datasets
import torch

from trunk.core.labels import alike_across, fold_label
from trunk.datamodules.sources import column
from trunk.datamodules.text import UNLABELLED_ROLES, checked_label_names, warn_alike
from trunk.datamodules.text_rows import TextRowsData


class MultiLabelTextData(TextRowsData):
    """Rows with a text column (optionally a second one) and a label column holding a list of labels, or
    one string of labels separated by ``label_delimiter`` ("joy,surprise"); an empty cell or list is a row
    with no label. Labels are names, or whole numbers that stand for ``label_names[i]`` when the names are
    words (GoEmotions ships ids). Label names come from ``label_names``, else the sorted labels of the
    training split.

    Args:
        text_column: the column holding the text.
        text_pair_column: a second text column for sentence-pair tasks.
        label_column: the column holding each row's labels.
        label_delimiter: what separates labels in a string cell.
        label_names: label names in id order; unset: taken from the data.
        **kwargs: see ``TextDataModule`` and ``TaskData`` (dataset, splits, select, val_fraction, max_length, batch
        size, ...).
    """

    kinds = ("multi_label_classification",)

    def __init__(self, text_column: str = "text", text_pair_column: str | None = None, label_column: str = "labels",
                 label_delimiter: str = ",", label_names: list[str] | None = None, **kwargs) -> None:
        super().__init__(text_column, text_pair_column, label_column, **kwargs)
        if not label_delimiter:
            raise ValueError("label_delimiter must be a non-empty string (the separator of labels in one cell).")
        self.label_delimiter = label_delimiter
        self._label_names = checked_label_names(label_names, fold=self.normalize_labels)

    @property
    def label_names(self) -> list[str]:
        if self._label_names is None:
            names = {name for labels in self.label_sets(self.raw("train"), "train") for name in labels}
            if not names:
                raise ValueError(
                    f"{self.option('train')} has no labels in column '{self.label_column}': nothing to learn."
                )
            self._label_names = sorted(names)
            warn_alike(names, self.option("train"))
        return self._label_names

    def training_statistics(self) -> dict:
        counts = Counter(name for labels in self.label_sets(self.raw("train"), "train") for name in labels)
        return {"label_counts": [counts[name] for name in self.label_order]}

    def check(self, ds: datasets.Dataset, role: str) -> None:
        super().check(ds, role)
        if role not in UNLABELLED_ROLES and self._label_names is not None:
            self.targets(ds, role)  # every row of the file as read (before any hold-out), so row numbers are the file's

    def label_sets(self, ds: datasets.Dataset, role: str) -> list[list[str]]:
        """Each row's labels as names (ids mapped through the configured names)."""
        sets = []
        for i, cell in enumerate(column(ds, self.label_column)):
            if cell is None:
                labels = []
            elif isinstance(cell, (list, tuple)):
                labels = [fold_label(str(v), self.normalize_labels) for v in cell]
            else:
                labels = [fold_label(v, self.normalize_labels) for v in str(cell).split(self.label_delimiter)]
            labels = [v for v in labels if v]
            if self._label_names is not None and labels and all(v.lstrip("-").isdigit() for v in labels) \
                    and not any(n.lstrip("-").isdigit() for n in self._label_names):
                bad = [v for v in labels if not 0 <= int(v) < len(self._label_names)]
                if bad:
                    raise ValueError(f"{self.option(role)}: row {i + 1} has label ids {bad}, but label_names has "
                                     f"{len(self._label_names)} names (ids 0-{len(self._label_names) - 1}).")
                labels = [self._label_names[int(v)] for v in labels]
            sets.append(labels)
        return sets

    def targets(self, ds: datasets.Dataset, role: str) -> list[list[int]]:
        """A 0/1 row per example in ``label_order``; a label outside it is an error naming the row and label."""
        index = {name: i for i, name in enumerate(self.label_order)}
        rows = []
        for i, labels in enumerate(self.label_sets(ds, role)):
            unknown = [v for v in labels if v not in index]
            if unknown:
                alike = alike_across(unknown, index)
                raise ValueError(
                    f"{self.option(role)}: row {i + 1} has the labels {unknown}, which are not among the label names "
                    f"{self.label_order}{f' (they only look listed: {alike})' if alike else ''}. Fix the row, or list "
                    f"every label in {self.option('label_names')}"
                    f"{', or set normalize_labels: nfkc to fold them' if alike else ''}."
                )
            row = [0] * len(index)
            for name in labels:
                row[index[name]] = 1
            rows.append(row)
        return rows

    def label_tensor(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float)
