"""Text (or text-pair) classification data: one label per example."""

from __future__ import annotations

from collections import Counter

import datasets
import torch

from trunk.core.labels import alike_across, fold_label
from trunk.datamodules.sources import column
from trunk.datamodules.text import checked_label_names, warn_alike
from trunk.datamodules.text_rows import TextRowsData


class TextClassificationData(TextRowsData):
    """Rows with a text column (and optionally a second text column) and a label column.

    Labels may be strings or integers. Label names come from the dataset's ``ClassLabel`` feature
    when it has one, else from the sorted distinct labels of the training split; ``label_names``
    fixes them (and their order) explicitly. Integer labels with word ``label_names`` (0/1 with
    negative/positive) are positions in ``label_names``; otherwise labels match names as text.
    The model learns the names, and the training split's label counts, from ``info()``.

    Args:
        text_column: the column holding the text.
        text_pair_column: a second text column for sentence-pair tasks (encoded as [CLS] a [SEP] b [SEP]).
        label_column: the column holding the label (not needed in the predict split).
        label_names: class names in id order; unset: taken from the data.
        **kwargs: see ``TextDataModule`` and ``TaskData`` (dataset, splits, val_fraction, max_length, batch size, ...).
    """

    kinds = ("sequence_classification",)

    def __init__(
        self,
        text_column: str = "text",
        text_pair_column: str | None = None,
        label_column: str = "label",
        label_names: list[str] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(text_column, text_pair_column, label_column, **kwargs)
        self._label_names = checked_label_names(label_names, fold=self.normalize_labels)
        self._configured_label_names = label_names is not None

    def training_statistics(self) -> dict:
        """How many training rows carry each label (for balanced class weights)."""
        counts = Counter(self.targets(self.raw("train"), "train"))
        return {"label_counts": [counts[i] for i in range(len(self.label_order))]}

    def use_labels_of(self, stored: list[str], source: str) -> str | None:
        note = super().use_labels_of(stored, source)
        self._configured_label_names = True  # fixed: a row with another label is an error, as with configured names
        return note

    def strata(self, rows: datasets.Dataset) -> list:
        return [str(v) for v in rows[self.label_column]]

    @property
    def label_names(self) -> list[str]:
        if self._label_names is None:
            train = self.raw("train")
            feature = train.features[self.label_column]
            if isinstance(feature, datasets.ClassLabel):
                self._label_names = list(feature.names)
            else:
                values = _check_labels(column(train, self.label_column), self.option("train"), self.label_column,
                                       self.normalize_labels)
                self._label_names = sorted({str(v) for v in values}, key=_natural_key)
                warn_alike(self._label_names, self.option("train"))
        return self._label_names

    def targets(self, ds: datasets.Dataset, role: str) -> list[int]:
        feature = ds.features[self.label_column]
        values = column(ds, self.label_column)
        if values and all(v in (-1, "-1", None, "") for v in values):
            raise self.unlabelled(role, f"has no labels: every row's '{self.label_column}' is -1 or empty")
        if isinstance(feature, datasets.ClassLabel):
            if -1 in values:
                raise ValueError(
                    f"{self.option(role)} has unlabelled rows (label -1) among labelled ones; remove them."
                )
            values = [feature.names[v] for v in values]
        index = {name: i for i, name in enumerate(self.label_order)}
        if not isinstance(feature, datasets.ClassLabel):
            values = _check_labels(values, self.option(role), self.label_column, self.normalize_labels)
        if _names_by_position(values, self.label_names):
            values = [self.label_names[v] if 0 <= v < len(self.label_names) else v for v in values]
        unknown = sorted({str(v) for v in values} - index.keys())
        alike = alike_across(unknown, index)
        if unknown and self._configured_label_names:
            raise ValueError(
                f"{self.option(role)} has labels {unknown[:10]} that are not in the configured label_names "
                f"{self.label_names}{f' (they only look listed: {alike})' if alike else ''}. Remove "
                f"{self.option('label_names')} to take the names from the data, or list every label there"
                f"{', or set normalize_labels: nfkc to fold them' if alike else ''}."
            )
        if unknown:
            raise ValueError(
                f"{self.option(role)} has labels {unknown[:10]} that the training split never has; the known labels "
                f"are {self.label_names}{f' ({alike})' if alike else ''}. Fix the labels in {self.option(role)}, or "
                f"set {self.option('label_names')} to the full label set."
            )
        return [index[str(v)] for v in values]

    def label_tensor(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long)


def _check_labels(values: list, where: str, column: str, fold: str = "none") -> list:
    """Class labels must be classes: whole numbers or names, one kind per column. Real numbers (a
    regression target, or scores) and a mix of numbers and names (0/1 beside negative/positive) would
    otherwise become one class per distinct value, silently. Names are folded as ``fold`` says (``normalize_labels``).
    """
    if any(v is None for v in values):
        raise ValueError(f"{where}: column '{column}' has empty label cells; label every row or remove those rows.")
    several = next((v for v in values if isinstance(v, (list, tuple, dict))), None)
    if several is not None:
        raise ValueError(
            f"{where}: column '{column}' holds lists ({several!r}), not one class per row. Rows with several labels "
            "are multi-label: use trunk.tasks.MultiLabelClassification with trunk.datamodules.MultiLabelTextData, "
            "or point label_column at a column of single labels."
        )
    floats = [v for v in values if isinstance(v, float)]
    if any(not v.is_integer() for v in floats):
        examples = sorted({v for v in floats if not v.is_integer()})[:3]
        raise ValueError(
            f"{where}: column '{column}' holds real numbers ({', '.join(map(str, examples))}, ...), not class labels. "
            "Classification needs whole-number or named classes: bin the values into classes, or point label_column "
            "at the column that holds the classes."
        )
    values = [int(v) if isinstance(v, float) else v for v in values]  # 1.0 (a csv column with gaps) is class 1
    # "pos " is "pos": a stray space makes no class
    values = [fold_label(v, fold) if isinstance(v, str) else v for v in values]
    as_text = {str(v) for v in values}
    numbers = sorted(t for t in as_text if t.lstrip("-").isdigit())
    names = sorted(as_text - set(numbers))
    if numbers and names:
        raise ValueError(
            f"{where}: column '{column}' mixes numbers {numbers[:5]} and names {names[:5]} as labels, which would make "
            "them different classes. Write every label one way (all names, or all numbers with label_names giving the "
            "name of each number in order)."
        )
    return values


def _names_by_position(values: list, label_names: list[str]) -> bool:
    """Integer labels with word names (0/1 with negative/positive): label i means label_names[i]."""
    return bool(values) and isinstance(values[0], int) and not any(n.lstrip("-").isdigit() for n in label_names)


def _natural_key(label: str) -> tuple:
    """Sort "2" before "10" when labels are numbers, else alphabetically."""
    return (0, int(label), "") if label.lstrip("-").isdigit() else (1, 0, label)
