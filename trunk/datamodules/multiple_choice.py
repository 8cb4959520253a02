"""Multiple-choice data (SWAG / ARC / OpenBookQA style): a context, candidate answers, the right one."""

from __future__ import annotations

import re
import string
from collections.abc import Iterator

import datasets
import torch

from trunk.datamodules.sources import check_columns, check_filled, column
from trunk.datamodules.text import UNLABELLED_ROLES, TextDataModule, pad

PACKED = re.compile(r"\(([A-Za-z0-9])\)\s*")  # "(A) red (B) blue": OpenBookQA's TSV packs the choices in one cell


class MultipleChoiceData(TextDataModule):
    """Rows with a context (a question, or a sentence to complete), its candidate answers and the right one.
    Each candidate is encoded with the context as a pair, [CLS] context [SEP] (question) candidate [SEP];
    the model scores every candidate and the highest wins.

    Candidates come from ``choices_column``, one cell per row holding a list of texts, a dict with ``text``
    and ``label`` lists (the hub's ARC / OpenBookQA), or a string of packed choices "(A) ... (B) ..."
    (OpenBookQA's TSV); or from ``choice_columns``, one column per candidate (SWAG's ending0-3). Rows may
    have different numbers of candidates: a batch scores each row's own (missing ones never win). The
    answer (``label_column``) is the right candidate's position from 0, its label (A, B, ... or the labels
    the row gives), or its text.

    Args:
        context_column: the column holding the context or question.
        question_column: a second column put before every candidate (SWAG's sent2, the start of each ending).
        choices_column: the column holding each row's candidates (see above).
        choice_columns: instead, one column per candidate.
        label_column: the column holding the answer (not needed in the predict split).
        **kwargs: see ``TextDataModule`` and ``TaskData`` (dataset, splits, select, file_type, max_length, batch size,
        ...).
    """

    reads_unlabelled = True

    input_form = '{"context": ..., "choices": [two or more texts]}, with an optional "question"'

    kinds = ("multiple_choice",)

    def __init__(
        self,
        context_column: str = "question",
        question_column: str | None = None,
        choices_column: str | None = "choices",
        choice_columns: list[str] | None = None,
        label_column: str = "answer",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if choice_columns is not None and len(choice_columns) < 2:
            raise ValueError(f"choice_columns needs at least 2 columns (one per candidate), got {choice_columns}.")
        self.context_column, self.question_column, self.label_column = context_column, question_column, label_column
        self.choices_column = None if choice_columns is not None else choices_column
        self.choice_columns = list(choice_columns) if choice_columns is not None else None
        if self.choices_column is None and self.choice_columns is None:
            raise ValueError(
                "Name the candidates: choices_column (one cell per row) or choice_columns (one column each)."
            )

    def input_columns(self) -> dict[str, str | None]:
        columns = {"context_column": self.context_column, "question_column": self.question_column,
                   "choices_column": self.choices_column}
        return {**columns, **{f"choice_columns[{i}]": name for i, name in enumerate(self.choice_columns or [])}}

    def check(self, ds: datasets.Dataset, role: str) -> None:
        self.check_inputs(ds, role)
        if role not in UNLABELLED_ROLES:
            check_columns(ds, {"label_column": self.label_column}, self.option(role))

    def tokenizer_columns(self) -> list[str]:
        return [c for c in (self.context_column, self.question_column) if c is not None]

    def texts_for_tokenizer(self) -> Iterator[str]:
        yield from super().texts_for_tokenizer()
        for choices, _ in self.candidates(self.raw("train"), "train"):
            yield from choices

    # -- rows -> candidates and answers --------------------------------------------------------------
    def candidates(self, ds: datasets.Dataset, role: str) -> list[tuple[list[str], list[str]]]:
        """Each row's candidate texts and their labels (A, B, ... unless the row names them)."""
        if self.choice_columns is not None:  # an empty cell drops its candidate; the others keep their letters
            cells = zip(*(column(ds, name) for name in self.choice_columns))
            kept = [[(str(c), letter) for c, letter in zip(cell, string.ascii_uppercase)
                     if c is not None and str(c).strip()] for cell in cells]
            rows = [([text for text, _ in row], [letter for _, letter in row]) for row in kept]
        else:
            rows = [_unpack(cell) for cell in column(ds, self.choices_column)]
        for i, (texts, _) in enumerate(rows):
            if len(texts) < 2:
                raise ValueError(
                    f"{self.option(role)}: row {i + 1} has {len(texts)} candidate answer(s) ({texts}); a "
                    "multiple-choice row needs at least 2. Check "
                    f"{self.option('choices_column' if self.choice_columns is None else 'choice_columns')}."
                )
        return rows

    def answers(self, ds: datasets.Dataset, role: str, rows: list[tuple[list[str], list[str]]]) -> list[int]:
        """The right candidate's position in each row, from its position, label or text."""
        answers = []
        for i, (cell, (texts, labels)) in enumerate(zip(column(ds, self.label_column), rows)):
            value = str(cell).strip() if cell is not None else ""
            position = int(value) if value.lstrip("-").isdigit() else None
            if self.choice_columns is not None and position is not None and 0 <= position < len(string.ascii_uppercase):
                value = string.ascii_uppercase[position]  # a column's position: its letter, whatever cells are empty
            if value in labels:
                answers.append(labels.index(value))
            elif self.choice_columns is None and position is not None and 0 <= position < len(texts):
                answers.append(position)
            elif value in texts:
                answers.append(texts.index(value))
            else:
                raise ValueError(
                    f"{self.option(role)}: row {i + 1} has the answer {cell!r}, which is none of its candidates' "
                    f"labels {labels}, positions 0-{len(texts) - 1} or texts. Fix the row, or point "
                    f"{self.option('label_column')} at the answer column."
                )
        return answers

    def encode(self, ds: datasets.Dataset, role: str) -> list[dict]:
        contexts = column(ds, self.context_column)
        check_filled(contexts, self.context_column, self.option(role))
        questions = column(ds, self.question_column) if self.question_column else [None] * len(contexts)
        rows = self.candidates(ds, role)
        answers = self.answers(ds, role, rows) if role not in UNLABELLED_ROLES else [None] * len(rows)
        return self.encode_rows(contexts, questions, [texts for texts, _ in rows], answers, role)

    def encode_rows(
        self, contexts: list[str], questions: list, choices: list[list[str]], answers: list, role: str
    ) -> list[dict]:
        pairs = [
            (c, f"{q} {choice}" if q else choice)
            for c, q, texts in zip(contexts, questions, choices)
            for choice in texts
        ]
        encodings = iter(self.tokenize(pairs, role))
        return [{"input_ids": [next(encodings).ids for _ in texts], "label": answer, "text": context, "choices": texts}
                for context, texts, answer in zip(contexts, choices, answers)]

    def input_examples(self, inputs: list) -> list[dict]:
        """Predict examples from raw ``{"context": ..., "choices": [...]}`` dicts (or (context, choices) tuples)."""
        rows = [x if isinstance(x, dict) else {"context": x[0], "choices": x[1]} for x in inputs]
        for row in rows:
            if not isinstance(row.get("choices"), (list, tuple)) or len(row["choices"]) < 2:
                raise ValueError(f"Each multiple-choice input needs a context and at least 2 choices, got {row!r}.")
        return self.encode_rows([r["context"] for r in rows], [r.get("question") for r in rows],
                                [list(r["choices"]) for r in rows], [None] * len(rows), "predict")

    def collate(self, examples: list[dict]) -> dict:
        # every candidate of every row: (M, T)
        input_ids = pad([ids for e in examples for ids in e["input_ids"]], self.pad_id)
        batch = {"input_ids": input_ids, "attention_mask": (input_ids != self.pad_id).long(),
                 "choice_counts": torch.tensor([len(e["input_ids"]) for e in examples]),
                 "text": [e["text"] for e in examples], "choices": [e["choices"] for e in examples]}
        if examples[0]["label"] is not None:
            batch["labels"] = torch.tensor([e["label"] for e in examples], dtype=torch.long)
        return batch


def _unpack(cell) -> tuple[list[str], list[str]]:
    """Candidate texts and labels from a list, a {"text": [...], "label": [...]} dict, or packed "(A) ... (B) ..."
    text."""
    if isinstance(cell, dict):
        texts = [str(t) for t in cell.get("text") or []]
        labels = [str(x) for x in cell.get("label") or string.ascii_uppercase[: len(texts)]]
        return texts, labels
    if isinstance(cell, (list, tuple)):
        texts = [str(t) for t in cell]
        return texts, list(string.ascii_uppercase[: len(texts)])
    text = "" if cell is None else str(cell)
    parts = PACKED.split(text)
    if len(parts) >= 3 and not parts[0].strip():  # "", "A", "red ", "B", "blue"
        return [t.strip() for t in parts[2::2]], parts[1::2]
    return [], []
