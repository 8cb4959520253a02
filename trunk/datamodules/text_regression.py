"""Text (or text-pair) regression data: one or several real-valued targets per example."""

from __future__ import annotations

import math

import datasets
import torch

from trunk.datamodules.sources import column
from trunk.datamodules.text import UNLABELLED_ROLES
from trunk.datamodules.text_rows import TextRowsData


class TextRegressionData(TextRowsData):
    """Rows with a text column (optionally a second one) and one or several number columns (similarity
    scores, ratings ...). The model learns the target names (the columns) and the training split's mean
    and standard deviation of each (to standardise the targets) from ``info()``.

    Args:
        text_column: the column holding the text.
        text_pair_column: a second text column for sentence-pair tasks (encoded as [CLS] a [SEP] b [SEP]).
        label_column: the column holding the target, or a list of columns for several targets.
        **kwargs: see ``TextDataModule`` and ``TaskData`` (dataset, splits, val_fraction, max_length, batch size, ...).
    """

    kinds = ("sequence_regression",)
    label_option = "label_column"

    def __init__(
        self,
        text_column: str = "text",
        text_pair_column: str | None = None,
        label_column: str | list[str] = "label",
        **kwargs,
    ) -> None:
        super().__init__(text_column, text_pair_column, label_column, **kwargs)
        # the targets' names
        self._label_names = ([label_column] if isinstance(label_column, str) else list(label_column))
        if not self._label_names:
            raise ValueError("label_column: give the column of the target (or a list of columns).")

    @property
    def label_names(self) -> list[str]:
        return self._label_names

    def target_columns(self) -> dict[str, str]:
        several = len(self.label_names) > 1
        return {f"label_column[{i}]" if several else "label_column": name for i, name in enumerate(self.label_names)}

    def training_statistics(self) -> dict:
        """The training split's mean and standard deviation of each target (for standardised targets)."""
        values = torch.tensor(self.targets(self.raw("train"), "train"), dtype=torch.float64)
        std = values.std(0, unbiased=False) if len(values) > 1 else torch.ones(values.shape[1], dtype=torch.float64)
        return {"target_mean": values.mean(0).tolist(), "target_std": std.tolist()}

    def check(self, ds: datasets.Dataset, role: str) -> None:
        super().check(ds, role)
        if role not in UNLABELLED_ROLES:
            self.targets(ds, role)  # every row of the file as read (before any hold-out), so row numbers are the file's

    def targets(self, ds: datasets.Dataset, role: str) -> list[list[float]]:
        """One list of floats per row, in ``label_order`` (a trained head's order of the targets); a cell that is
        not a finite number is an error naming the file, row and value."""
        columns = [column(ds, name) for name in self.label_order]
        rows = []
        for i, cells in enumerate(zip(*columns)):
            row = []
            for name, cell in zip(self.label_order, cells):
                value = _number(cell)
                if value is None:
                    what = (
                        f"no value in {name} (an empty cell, or a marker such as n/a or NA that the reader takes as "
                        "missing)"
                        if cell is None
                        else f"{name}={cell!r}, which is not a finite number"
                    )
                    raise ValueError(
                        f"{self.option(role)}: row {i + 1} of {self.source_name(role)} (counting data rows from 1) has "
                        f"{what}. Regression targets must be finite numbers: fix or remove the row, or point "
                        f"{self.option('label_column')} at the column that holds the scores."
                    )
                row.append(value)
            rows.append(row)
        return rows

    def source_name(self, role: str) -> str:
        spec = self.spec(role)
        source = f"'{spec}'" if self.dataset is None else f"split '{spec}' of '{self.dataset}'"
        return f"the rows of {source} that {self.option('select.' + role)} keeps" if role in self.select else source

    def label_tensor(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float)


def _number(cell) -> float | None:
    """A finite float from a number or a numeric string; None otherwise (booleans are not numbers)."""
    if isinstance(cell, bool) or cell is None:
        return None
    try:
        value = float(cell.strip() if isinstance(cell, str) else cell)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
