"""Token classification (named-entity recognition) data: sentences as words, one tag per word."""

from __future__ import annotations

import dataclasses
import functools

import datasets
import torch

from trunk.core.codec import CLS, IGNORE_INDEX, SEP, special_id
from trunk.core.labels import alike_across, fold_label
from trunk.core.tagging import (
    Scheme,
    Span,
    label_names_for,
    parse_label_names,
    spans_from_tags,
    split_tag,
    tags_from_spans,
)
from trunk.datamodules.sources import (
    LINES,
    ROW_FORMATS,
    check_columns,
    column,
    load_split,
    read_conll,
    read_words,
)
from trunk.datamodules.text import UNLABELLED_ROLES, TextDataModule, pad, warn_alike


class TokenClassificationData(TextDataModule):
    """Sentences of words with one entity tag per word (IOB1, IOB2/BIO or BIOES), for ``TokenClassification``.

    Sources: CoNLL column files (any suffix but the row formats; plain or .gz), json/jsonl/parquet
    rows with a word-list and a tag-list column, or a hub dataset such as ``conll2003`` (tags may
    be class ids: their names come from the dataset's features). The predict split needs words
    only (a one-column file works).

    Tags of any input scheme are read as entity spans (see ``trunk/core/tagging.py``) and
    re-written in ``label_scheme`` for training. Words are split into sub-tokens; either the first
    sub-token of each word carries the word's label (the rest are ignored), or with
    ``label_all_subtokens`` every sub-token does (the entity is re-tagged over sub-tokens).
    Predictions are always read per word, from each word's first sub-token.

    With ``context_length`` > 0 each sentence is encoded with the text around it (document context,
    as in FLERT): up to that many sub-tokens of the neighbouring sentences of its document, split
    between left and right, within max_length. Context takes no loss and gets no predictions; it
    lets the model see, for example, that a name in a results table is a team. Documents come
    from ``-DOCSTART-`` lines in column files; rows and hub datasets are read as one document in
    their order.

    Args:
        tag_column: the tag's column in column files (CoNLL-2003: -1, the last).
        tokens_column, tags_column: the list columns of row files and hub datasets.
        label_scheme: ``bio`` or ``bioes``: how the model's labels spell entities.
        label_all_subtokens: label every sub-token, not only each word's first.
        label_names: the model's labels (``O``, ``B-LOC``, ...); unset: built from the entity
            types in the training split. A checkpoint's labels are reused when testing it.
        context_length: sub-tokens of document context around each sentence (0: none).
        **kwargs: see ``TextDataModule`` and ``TaskData`` (splits, val_fraction, max_length, batch_size, ...).
    """

    reads_unlabelled = True

    input_form = "a sentence: a string (split on spaces) or a list of words"

    kinds = ("token_classification",)

    def __init__(
        self,
        tag_column: int = -1,
        tokens_column: str = "tokens",
        tags_column: str = "ner_tags",
        label_scheme: Scheme = "bio",
        label_all_subtokens: bool = False,
        label_names: list[str] | None = None,
        context_length: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if self.reading.line_pattern is not None:
            raise ValueError(
                "line_pattern splits one example per line into columns; token classification reads CoNLL column files "
                "(one word per line) or rows with token and tag lists. Remove line_pattern."
            )
        if context_length < 0:
            raise ValueError(f"context_length must be >= 0 (sub-tokens of context), got {context_length}.")
        self.context_length = context_length
        label_names_for([], label_scheme)  # validates the scheme's name
        self.tag_column, self.tokens_column, self.tags_column = tag_column, tokens_column, tags_column
        self.label_scheme, self.label_all_subtokens = label_scheme, label_all_subtokens
        self._label_names = None
        if label_names is not None:
            self._label_names = [fold_label(str(name), self.normalize_labels) for name in label_names]
            self.label_scheme, _ = parse_label_names(self._label_names)

    # -- rows: every source becomes (tokens: list[str], tags: list[str] | None) -----------------------
    def load(self, spec: str, role: str) -> datasets.Dataset:
        ds = self._rows(spec, role)
        if self.normalize_labels == "none":
            return ds
        fold = functools.partial(fold_label, how=self.normalize_labels)
        return ds.map(lambda row: {"tags": None if row["tags"] is None else list(map(fold, row["tags"]))})

    def _rows(self, spec: str, role: str) -> datasets.Dataset:
        if self.dataset is None:
            if self.reading_of(spec, role).suffix(spec) == LINES:  # the user's own text to tag: columns or sentences
                return read_words(spec, self.tag_column, role, self.reading.encoding)
            if self.reading.suffix(spec) not in ROW_FORMATS:
                return read_conll(spec, self.tag_column, role, self.reading.encoding)
        ds = load_split(self.dataset, self.dataset_config, spec, role, self.reading)
        has_tags = self.tags_column in ds.column_names
        check_columns(
            ds,
            {
                "tokens_column": self.tokens_column,
                "tags_column": None if role.endswith(".predict") else self.tags_column,
            },
            role,
        )
        tags = column(ds, self.tags_column) if has_tags else [None] * len(ds)
        feature = (
            ds.features[self.tags_column].feature
            if has_tags and hasattr(ds.features[self.tags_column], "feature")
            else None
        )
        if isinstance(feature, datasets.ClassLabel):  # hub NER datasets store tag ids: name them
            tags = [[feature.names[t] for t in row] for row in tags]
        return datasets.Dataset.from_dict(
            {"tokens": column(ds, self.tokens_column), "tags": tags, "document": [0] * len(ds)}
        )

    def check(self, ds: datasets.Dataset, role: str) -> None:
        if role not in UNLABELLED_ROLES and any(t is None for t in column(ds, "tags")):
            raise ValueError(
                f"{self.option(role)} has no tags: its file has one column (words only). Give a file with a tag column "
                "for training and evaluation; words-only files are for data.predict."
            )
        for i, (tokens, tags) in enumerate(zip(column(ds, "tokens"), column(ds, "tags"))):
            if tags is not None and len(tokens) != len(tags):
                raise ValueError(f"{self.option(role)}: sentence {i} has {len(tokens)} words but {len(tags)} tags.")
            for tag in tags or ():
                try:
                    split_tag(tag)
                except ValueError as err:
                    raise ValueError(
                        f"{self.option(role)}, sentence {i} ({' '.join(tokens[:8])} ...): {err} Check "
                        f"{self.option('tag_column')} (now {self.tag_column}) or {self.option('tags_column')} (now "
                        f"{self.tags_column!r})."
                    ) from None

    @property
    def label_names(self) -> list[str]:
        if self._label_names is None:
            types = {span.type for tags in column(self.raw("train"), "tags") for span in spans_from_tags(tags)}
            if not types:
                raise ValueError(f"{self.option('train')} has no entities (every tag is O): nothing to learn. "
                                 f"Check {self.option('tag_column')}.")
            warn_alike(types, self.option("train"))
            self._label_names = label_names_for(types, self.label_scheme)
        return self._label_names

    def tokenizer_columns(self) -> list[str]:
        return ["tokens"]

    def tokenizer_text_options(self) -> list:
        return ["tokens", self.tag_column, self.tokens_column, dataclasses.asdict(self.reading)]

    def info(self) -> dict:
        return {**super().info(), "label_names": self.label_order}

    def use_labels_of(self, stored: list[str], source: str) -> str | None:
        note = super().use_labels_of(stored, source)
        self.label_scheme, _ = parse_label_names(self.label_order)  # the trained head's scheme
        return note

    def texts_for_tokenizer(self):
        return (" ".join(tokens) for tokens in column(self.raw("train"), "tokens"))

    # -- encoding ----------------------------------------------------------------------------------
    @property
    def encodes_rows_independently(self) -> bool:
        return self.context_length == 0  # context windows read the neighbouring sentences of the document

    def encode(self, ds: datasets.Dataset, role: str) -> list[dict]:
        label_ids = {name: i for i, name in enumerate(self.label_order)} if role not in UNLABELLED_ROLES else {}
        known_types = set(parse_label_names(self.label_names)[1]) if label_ids else set()
        examples = []
        for i, (words, tags, (input_ids, word_ids)) in enumerate(
            zip(column(ds, "tokens"), column(ds, "tags"), self._windows(ds, role))
        ):
            word_starts = [-1] * len(words)  # -1: the word was truncated away (predicted O)
            for position, word in enumerate(word_ids):
                if word is not None and word_starts[word] < 0:
                    word_starts[word] = position
            example = {"input_ids": input_ids, "word_starts": word_starts, "words": words}
            if tags is not None and role not in UNLABELLED_ROLES:
                spans = spans_from_tags(tags)
                unknown = {s.type for s in spans} - known_types
                if unknown:
                    alike = alike_across(unknown, known_types)
                    raise ValueError(
                        f"{self.option(role)}, sentence {i}: entity types {sorted(unknown)} never occur in training; "
                        f"the model knows {sorted(known_types)}{f' (they only look so: {alike})' if alike else ''}. "
                        f"Fix the tags, or set {self.option('label_names')} to a label set that includes them"
                        f"{', or normalize_labels: nfkc to fold them' if alike else ''}."
                    )
                example["word_labels"] = [label_ids[t] for t in tags_from_spans(spans, len(words), self.label_scheme)]
                example["labels"] = self._token_labels(spans, example["word_labels"], word_ids, word_starts, label_ids)
            examples.append(example)
        return examples

    def _windows(self, ds: datasets.Dataset, role: str) -> list[tuple[list[int], list[int | None]]]:
        """Each sentence's input ids, ``[CLS] left-context sentence right-context [SEP]``, and the word
        each position came from (None for [CLS], [SEP] and context)."""
        tokenizer = self.tokenizer
        tokenizer.no_truncation()  # the sentence is cut here, so that context never displaces it
        encodings = tokenizer.encode_batch(
            [list(t) for t in column(ds, "tokens")], is_pretokenized=True, add_special_tokens=False
        )
        pieces, word_ids = [e.ids for e in encodings], [e.word_ids for e in encodings]
        # [CLS] and [SEP] around each window, where the tokenizer has them (T5's has no [CLS])
        first, last = ([] if i is None else [i] for i in (special_id(tokenizer, CLS), special_id(tokenizer, SEP)))
        documents, room = column(ds, "document"), self.max_length - len(first) - len(last)
        windows = []
        for i, ids in enumerate(pieces):
            budget = min(self.context_length, max(room - len(ids), 0))
            left, right = (
                self._neighbours(pieces, documents, i, -1, budget),
                self._neighbours(pieces, documents, i, 1, budget),
            )
            n_left = min(len(left), max(budget // 2, budget - len(right)))  # an even split, unless one side runs short
            n_right = min(len(right), budget - n_left)
            left, right = left[len(left) - n_left :], right[:n_right]
            windows.append(
                (
                    [*first, *left, *ids[:room], *right, *last],
                    [None] * (len(first) + n_left) + word_ids[i][:room] + [None] * (n_right + len(last)),
                )
            )
        cut_words = sum(len(set(w)) - len(set(w[:room])) for ids, w in zip(pieces, word_ids) if len(ids) > room)
        self.warn_truncated(sum(len(ids) > room for ids in pieces), len(pieces), role, words_lost=cut_words)
        return windows

    @staticmethod
    def _neighbours(pieces: list[list[int]], documents: list[int], i: int, step: int, budget: int) -> list[int]:
        """Up to ``budget`` sub-tokens of the sentences before (step -1) or after (+1) sentence i, in its document."""
        tokens: list[int] = []
        j = i + step
        while len(tokens) < budget and 0 <= j < len(pieces) and documents[j] == documents[i]:
            tokens = tokens + pieces[j] if step > 0 else pieces[j] + tokens
            j += step
        return (tokens[:budget] if step > 0 else tokens[max(len(tokens) - budget, 0) :]) if budget else []

    def _token_labels(self, spans: list[Span], word_labels: list[int], word_ids: list, word_starts: list[int],
                      label_ids: dict[str, int]) -> list[int]:
        """Per-sub-token targets: the word's label at its first sub-token (ignored elsewhere), or the
        entities re-tagged over all sub-tokens."""
        labels = [IGNORE_INDEX] * len(word_ids)
        if not self.label_all_subtokens:
            for word, position in enumerate(word_starts):
                if position >= 0:
                    labels[position] = word_labels[word]
            return labels
        last_piece = {word: position for position, word in enumerate(word_ids) if word is not None}
        token_spans = [
            Span(s.type, word_starts[s.start], last_piece[max(w for w in range(s.start, s.end + 1) if w in last_piece)])
            for s in spans
            if word_starts[s.start] >= 0
        ]
        token_tags = tags_from_spans(token_spans, len(word_ids), self.label_scheme)
        return [label_ids[tag] if word is not None else IGNORE_INDEX for tag, word in zip(token_tags, word_ids)]

    def input_examples(self, inputs: list) -> list[dict]:
        """Predict examples from raw sentences: word lists, or strings split on whitespace."""
        words = [list(x) if isinstance(x, (list, tuple)) else str(x).split() for x in inputs]
        rows = datasets.Dataset.from_dict(
            {"tokens": words, "tags": [None] * len(words), "document": list(range(len(words)))}
        )
        return [{**e, "truncated": min(e["word_starts"], default=0) < 0} for e in self.encode(rows, "predict")]

    def collate(self, examples: list[dict]) -> dict:
        input_ids = pad([e["input_ids"] for e in examples], self.pad_id)
        batch = {
            "input_ids": input_ids,
            "attention_mask": (input_ids != self.pad_id).long(),
            "word_starts": pad([e["word_starts"] for e in examples], -1),
            "num_words": torch.tensor([len(e["words"]) for e in examples]),
            "words": [e["words"] for e in examples],
        }
        if "labels" in examples[0]:
            batch["labels"] = pad([e["labels"] for e in examples], IGNORE_INDEX)
            batch["word_labels"] = pad([e["word_labels"] for e in examples], IGNORE_INDEX)
        return batch
