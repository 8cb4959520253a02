"""Extractive question answering data (SQuAD style): a question, a context, the answer's span in the context."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import torch
from lightning.pytorch.utilities import rank_zero_warn

from trunk.core.codec import IGNORE_INDEX
from trunk.datamodules.sources import check_columns, column, file_format
from trunk.datamodules.text import UNLABELLED_ROLES, TextDataModule, pad


class QuestionAnsweringData(TextDataModule):
    """Rows with a question, a context and the answers (a ``{"text": [...], "answer_start": [...]}`` cell, as
    SQuAD on the hub has it; an empty list: no answer). SQuAD-format JSON files (``data[].paragraphs[].qas[]``)
    are read as they ship. Each question is encoded with its context as a pair, [CLS] question [SEP] context
    [SEP]; a context longer than ``max_length`` is cut into windows that overlap by ``doc_stride`` tokens, and
    every window of a question stays in one batch, so the answer is chosen across all of them. Training takes
    the first answer: its start and end token in each window that holds it whole, else [CLS] (no answer here).
    An answer whose text is not at its ``answer_start`` in the context is not trained on, and counted in a
    warning.

    Args:
        question_column / context_column / answers_column / id_column: the columns (``id``: optional).
        doc_stride: tokens shared by consecutive windows of a long context.
        **kwargs: see ``TextDataModule`` and ``TaskData`` (dataset, splits, select, max_length, batch size: questions,
        ...).
    """

    reads_unlabelled = True

    input_form = '{"question": ..., "context": ...}'

    kinds = ("extractive_qa",)

    def __init__(
        self,
        question_column: str = "question",
        context_column: str = "context",
        answers_column: str = "answers",
        id_column: str = "id",
        doc_stride: int = 32,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not 0 <= doc_stride < self.max_length // 2:
            raise ValueError(
                f"doc_stride={doc_stride} must be in [0, max_length / 2) = [0, {self.max_length // 2}): the tokens two "
                "windows share."
            )
        self.question_column, self.context_column, self.answers_column, self.id_column = (
            question_column,
            context_column,
            answers_column,
            id_column,
        )
        self.doc_stride = doc_stride

    # -- reading ---------------------------------------------------------------------------------
    def load(self, spec: str, role: str) -> datasets.Dataset:
        path = Path(spec).expanduser()
        if self.dataset is None and path.is_file() and file_format(path) == ".json":
            with path.open(encoding="utf-8") as f:
                top = json.load(f)
            if isinstance(top, dict) and isinstance(top.get("data"), list):
                return datasets.Dataset.from_list(squad_rows(top["data"]))
        return super().load(spec, role)

    def input_columns(self) -> dict[str, str | None]:
        return {"question_column": self.question_column, "context_column": self.context_column}

    def check(self, ds: datasets.Dataset, role: str) -> None:
        self.check_inputs(ds, role)
        if role not in UNLABELLED_ROLES:
            check_columns(ds, {"answers_column": self.answers_column}, self.option(role))

    def tokenizer_columns(self) -> list[str]:
        return [self.question_column, self.context_column]

    # -- encoding ------------------------------------------------------------------------------------
    def encode(self, ds: datasets.Dataset, role: str) -> list[dict]:
        questions, contexts = column(ds, self.question_column), column(ds, self.context_column)
        ids = column(ds, self.id_column) if self.id_column in ds.column_names else [None] * len(ds)
        answers = column(ds, self.answers_column) if role not in UNLABELLED_ROLES else [None] * len(ds)
        examples, misaligned = [], []
        for i, (question, context, answer, qid) in enumerate(zip(questions, contexts, answers, ids)):
            example = self.encode_row(question, context, answer, role, i)
            if example.pop("misaligned"):
                misaligned.append(qid if qid is not None else f"row {i + 1}")
            examples.append({**example, "id": str(qid) if qid is not None else f"{i}"})
        if misaligned:
            rank_zero_warn(
                f"{self.option(role)}: {len(misaligned)} answer(s) are not at their answer_start in the context (e.g. "
                f"{misaligned[:3]}); those questions are evaluated but not trained on. Fix answer_start in the data."
            )
        return examples

    def encode_row(self, question: str, context: str, answer: dict | None, role: str, row: int) -> dict:
        """One question's windows: token ids, each token's span in the context (-1 outside it), the answer's tokens."""
        tokenizer = self.tokenizer
        # measure the whole question (the shared tokenizer may hold another task's truncation)
        tokenizer.no_truncation()
        room = self.max_length - len(tokenizer.encode(question, add_special_tokens=False).ids) - 3
        if room < 8:
            raise ValueError(
                f"{self.option(role)}: row {row + 1}'s question takes {self.max_length - room - 3} tokens, leaving "
                f"{max(room, 0)} for the context at max_length={self.max_length}. Raise {self.option('max_length')} or "
                "shorten the question."
            )
        tokenizer.enable_truncation(self.max_length, stride=min(self.doc_stride, room - 1), strategy="only_second")
        first = tokenizer.encode(question, context)
        windows = [first, *first.overflowing]
        texts = list((answer or {}).get("text") or [])
        starts = list((answer or {}).get("answer_start") or [])
        span, misaligned = None, False
        if texts and starts:
            start = int(starts[0])
            if context[start : start + len(texts[0])] == texts[0]:
                span = (start, start + len(texts[0]))
            else:
                misaligned = True
        out = {"input_ids": [], "span_starts": [], "span_ends": [], "start": [], "end": []}
        for window in windows:
            in_context = [s == 1 for s in window.sequence_ids]
            out["input_ids"].append(window.ids)
            out["span_starts"].append([o[0] if c else -1 for o, c in zip(window.offsets, in_context)])
            out["span_ends"].append([o[1] if c else -1 for o, c in zip(window.offsets, in_context)])
            start_token = end_token = 0  # [CLS]: not in this window (or no answer)
            if answer is None:  # nothing to learn: raw inputs to predict
                start_token = end_token = None
            elif misaligned:
                start_token = end_token = IGNORE_INDEX
            elif span is not None:
                tokens = [t for t, c in enumerate(in_context) if c]
                if tokens and window.offsets[tokens[0]][0] <= span[0] and window.offsets[tokens[-1]][1] >= span[1]:
                    start_token = next(t for t in tokens if window.offsets[t][1] > span[0])
                    end_token = next(t for t in reversed(tokens) if window.offsets[t][0] < span[1])
            out["start"].append(start_token)
            out["end"].append(end_token)
        return {**out, "text": question, "context": context, "answers": texts, "misaligned": misaligned}

    def input_examples(self, inputs: list) -> list[dict]:
        """Predict examples from raw ``{"question": ..., "context": ...}`` dicts (or (question, context) tuples)."""
        rows = [x if isinstance(x, dict) else {"question": x[0], "context": x[1]} for x in inputs]
        return [
            {**self.encode_row(r["question"], r["context"], None, "predict", i), "id": str(r.get("id", i))}
            for i, r in enumerate(rows)
        ]

    def collate(self, examples: list[dict]) -> dict:
        flat = [w for e in examples for w in e["input_ids"]]  # every window of every question: (M, T)
        input_ids = pad(flat, self.pad_id)
        batch = {
            "input_ids": input_ids,
            "attention_mask": (input_ids != self.pad_id).long(),
            "window_counts": torch.tensor([len(e["input_ids"]) for e in examples]),
            "span_starts": pad([s for e in examples for s in e["span_starts"]], -1),
            "span_ends": pad([s for e in examples for s in e["span_ends"]], -1),
            "text": [e["text"] for e in examples],
            "context": [e["context"] for e in examples],
            "id": [e["id"] for e in examples],
            "answers": [list(e["answers"]) for e in examples],
        }
        if all(s is not None for e in examples for s in e["start"]):
            batch["start_positions"] = torch.tensor([s for e in examples for s in e["start"]])
            batch["end_positions"] = torch.tensor([s for e in examples for s in e["end"]])
        return batch


def squad_rows(articles: list[dict]) -> list[dict]:
    """SQuAD JSON's nested articles -> one row per question (the hub's columns; ``is_impossible`` or no answers: [])."""
    rows = []
    for article in articles:
        for paragraph in article.get("paragraphs", []):
            for qa in paragraph.get("qas", []):
                answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                rows.append(
                    {
                        "id": str(qa.get("id", len(rows))),
                        "title": article.get("title", ""),
                        "context": paragraph["context"],
                        "question": qa["question"],
                        "answers": {
                            "text": [a["text"] for a in answers],
                            "answer_start": [int(a["answer_start"]) for a in answers],
                        },
                    }
                )
    return rows
