"""Rows of one text (or a text pair) and a target: what classification, regression and multi-label data share."""

from __future__ import annotations

import datasets
import torch

from trunk.datamodules.sources import check_columns, check_filled, column, looks_like_data
from trunk.datamodules.text import UNLABELLED_ROLES, TextDataModule, pad


class TextRowsData(TextDataModule):
    """Rows with a text column, optionally a second text column, and a target column (not needed to predict).

    Subclasses turn a split's target cells into per-example values (``targets``), a batch's values into
    the ``labels`` tensor (``label_tensor``), and may report figures of the training split the objective
    uses (``training_statistics``: label counts, target mean / std), worked out once per label order.

    Args:
        text_column: the column holding the text.
        text_pair_column: a second text column for sentence-pair tasks (encoded as [CLS] a [SEP] b [SEP]).
        label_column: the column holding the target (not needed in the predict split).
        **kwargs: see ``TextDataModule`` and ``TaskData`` (dataset, splits, val_fraction, max_length, batch size, ...).
    """

    reads_unlabelled = True

    input_form = "a text, or a [text, pair] list of two texts (sentence-pair tasks)"

    def __init__(
        self, text_column: str = "text", text_pair_column: str | None = None, label_column: str = "label", **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.text_column, self.text_pair_column, self.label_column = text_column, text_pair_column, label_column
        self._statistics: dict[tuple, dict] = {}  # label order -> training_statistics()

    def info(self) -> dict:
        info = {**super().info(), "label_names": self.label_order}
        order = tuple(self.label_order)
        if order not in self._statistics and self.has_split("train"):
            self._statistics[order] = self.training_statistics()
        if order in self._statistics:
            info["statistics"] = self._statistics[order]
        return info

    # The training split's figures travel with the model: a checkpoint predicts without its training files.
    def state_dict(self) -> dict:
        return {"statistics": [[list(order), values] for order, values in self._statistics.items()]}

    def load_state_dict(self, state: dict) -> None:
        self._statistics.update({tuple(order): values for order, values in state.get("statistics", [])})

    def training_statistics(self) -> dict:
        """Figures of the training split (in ``label_order``) that the objective uses."""
        return {}

    def target_columns(self) -> dict[str, str]:
        """Option name -> column, for the column check."""
        return {"label_column": self.label_column}

    def input_columns(self) -> dict[str, str | None]:
        return {"text_column": self.text_column, "text_pair_column": self.text_pair_column}

    def check(self, ds: datasets.Dataset, role: str) -> None:
        if role in UNLABELLED_ROLES:
            self.check_inputs(ds, role)
            return
        missing = {
            option: c for option, c in self.target_columns().items() if c is not None and c not in ds.column_names
        }
        inputs = [c for c in self.input_columns().values() if c is not None]
        if missing and role != "train" and not looks_like_data(ds.column_names) and set(inputs) <= set(ds.column_names):
            option, name = next(iter(missing.items()))
            raise self.unlabelled(
                role,
                f"has no column '{name}' (set by {self.option(option)}; its columns are {ds.column_names}): if the "
                f"labels are in another column, set {self.option(option)} to it",
            )
        check_columns(ds, {**self.input_columns(), **self.target_columns()}, self.option(role))  # every one missing

    def columns_read(self) -> str:
        """In words, for the run's summary: the text column(s) and the target."""
        texts = f"pairs of '{self.text_column}' and '{self.text_pair_column}'" if self.text_pair_column else (
            f"texts of '{self.text_column}'")
        return f"{texts}, targets of {self.label_column!r}"

    def tokenizer_columns(self) -> list[str]:
        return [c for c in (self.text_column, self.text_pair_column) if c is not None]

    def targets(self, ds: datasets.Dataset, role: str) -> list:
        """One plain value per row: the target as batches carry it."""
        raise NotImplementedError

    def label_tensor(self, values: list) -> torch.Tensor:
        raise NotImplementedError

    def encode(self, ds: datasets.Dataset, role: str) -> list[dict]:
        texts = column(ds, self.text_column)
        check_filled(texts, self.text_column, self.option(role))
        if self.text_pair_column is not None:
            check_filled(column(ds, self.text_pair_column), self.text_pair_column, self.option(role))
        inputs = texts if self.text_pair_column is None else list(zip(texts, column(ds, self.text_pair_column)))
        ids = [e.ids for e in self.tokenize(inputs, role)]
        labels = self.targets(ds, role) if role not in UNLABELLED_ROLES else [None] * len(ids)
        return [{"input_ids": i, "label": y, "text": t} for i, y, t in zip(ids, labels, inputs)]

    def input_examples(self, inputs: list) -> list[dict]:
        """Predict examples from raw texts (or (text, pair) tuples)."""
        inputs = [tuple(x) if isinstance(x, (list, tuple)) else x for x in inputs]
        encodings = self.tokenize(inputs, "predict")
        return [
            {"input_ids": e.ids, "label": None, "text": t, "truncated": bool(e.overflowing)}
            for e, t in zip(encodings, inputs)
        ]

    def collate(self, examples: list[dict]) -> dict:
        input_ids = pad([e["input_ids"] for e in examples], self.pad_id)
        batch = {
            "input_ids": input_ids,
            "attention_mask": (input_ids != self.pad_id).long(),
            "text": [e["text"] for e in examples],
        }
        if examples[0]["label"] is not None:
            batch["labels"] = self.label_tensor([e["label"] for e in examples])
        return batch
