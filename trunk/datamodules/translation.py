"""Translation data: pairs of sentences, source and target, for ``trunk.tasks.Translation``."""

from __future__ import annotations

from pathlib import Path

import datasets
from tokenizers import Tokenizer

from trunk.core.codec import IGNORE_INDEX, PAD, TARGET_KEY, fingerprint, load_tokenizer, special_id, with_first_token
from trunk.datamodules.sources import FILE_FORMATS, LINES, check_columns, column, load_split, read_text
from trunk.datamodules.text import UNLABELLED_ROLES, TextDataModule, pad
from trunk.datamodules.tokenizer import cached_tokenizer
from trunk.models import SpecialIds

LANG = "{lang}"  # the language placeholder of parallel-file paths: train.{lang}.gz


class TranslationData(TextDataModule):
    """Parallel sentences from line-aligned files, row files or a hub translation dataset.

    Each split is one of:
      * a path with ``{lang}`` in it, such as ``multi30k/train.{lang}.gz``: the line-aligned files
        for ``source_lang`` and ``target_lang`` (plain or gzip). For ``predict`` the source file
        alone is enough.
      * with ``dataset`` set, a split of a hub dataset whose ``translation`` column holds
        ``{lang: sentence}`` dicts (``wmt16`` / ``de-en``, ...); without, a json/jsonl/parquet/csv/tsv
        file with such a column, or with one column per language.
      * for ``predict`` only: a text file of source sentences, one per line.

    The direction is ``source_lang`` -> ``target_lang``. With ``joint_vocabulary`` the run's tokenizer serves both sides
    (the model can then share one embedding matrix); otherwise the target side has its own (``target_tokenizer``, or one
    trained on the targets). Tokenizers trained for a run with translation are SentencePiece-style BPE, whose decoding
    restores the original spacing (detokenized text for BLEU). Sources are encoded ``[CLS] ... [SEP]``; the decoder
    reads ``[CLS] target`` and predicts ``target [SEP]``: [CLS] starts and [SEP] ends every generated sentence.

    Batches: ``input_ids`` / ``attention_mask`` (sources), ``decoder_input_ids`` and ``labels``
    (targets, -100 at padding), ``source`` and ``target`` (the raw sentences).

    Args:
        source_lang, target_lang: language codes: file-name parts and translation-dict keys.
        joint_vocabulary: one tokenizer for both sides.
        target_tokenizer: the target side's tokenizer when the vocabularies are separate (a
            tokenizer.json, a directory or a Trunk .ckpt); unset: trained on the targets.
        target_tokenizer_vocab_size: its vocabulary size when it is trained here.
        target_max_length: longer targets are truncated (one warning per split); unset: max_length.
        source_language: a language-code token every source starts with (NLLB's ``eng_Latn``, mBART-50's ``en_XX``,
            M2M100's ``__en__``), in place of the one the tokenizer's template puts first; the target's is the
            objective's ``target_language``.
        **kwargs: see ``TextDataModule`` and ``TaskData`` (splits, max_length, batch_size, ...).
    """

    input_form = "a source sentence"

    kinds = ("translation",)
    tokenizer_model = "bpe"

    def __init__(
        self,
        source_lang: str,
        target_lang: str,
        translation_column: str = "translation",
        joint_vocabulary: bool = True,
        target_tokenizer: str | None = None,
        target_tokenizer_vocab_size: int = 8192,
        target_max_length: int | None = None,
        source_language: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if source_lang == target_lang:
            raise ValueError(f"source_lang and target_lang are both {source_lang!r}: name two languages.")
        if joint_vocabulary and target_tokenizer is not None:
            raise ValueError("target_tokenizer is set but joint_vocabulary is true (the run's tokenizer serves both "
                             "sides). Set joint_vocabulary=false to give the target side its own tokenizer.")
        self.target_tokenizer_vocab_size = target_tokenizer_vocab_size
        self.source_lang, self.target_lang = source_lang, target_lang
        self.translation_column = translation_column
        self.joint_vocabulary = joint_vocabulary
        self.target_tokenizer_path = target_tokenizer
        self.target_max_length = target_max_length or self.max_length
        self._target_tokenizer: Tokenizer | None = None
        self.source_language = source_language
        self._with_language: tuple[Tokenizer, Tokenizer] | None = None  # (the run's tokenizer, it with source_language)

    # -- rows: every source becomes (source: str, target: str | None) ---------------------------------
    def load(self, spec: str, role: str) -> datasets.Dataset:
        if self.dataset is None and LANG in spec:
            return self._read_parallel_files(spec, role)
        path = Path(spec).expanduser()
        if self.dataset is None and self.reading.suffix(path) not in (*FILE_FORMATS, LINES):
            if not role.endswith(".predict"):
                raise ValueError(
                    f"{role}='{spec}' names neither parallel files nor a row file. Write the path with '{LANG}' where "
                    f"the language code goes (e.g. train.{LANG}.gz, read as train.{self.source_lang}.gz and "
                    f"train.{self.target_lang}.gz), give a {'/'.join(FILE_FORMATS)} file, or set dataset."
                )
            return self._pairs(self._lines(path, role), None, role, path.name)
        return self._read_rows(load_split(self.dataset, self.dataset_config, spec, role, self.reading), role)

    def _read_parallel_files(self, spec: str, role: str) -> datasets.Dataset:
        paths = {lang: Path(spec.replace(LANG, lang)).expanduser() for lang in (self.source_lang, self.target_lang)}
        source_path, target_path = paths[self.source_lang], paths[self.target_lang]
        if not source_path.is_file():
            siblings = sorted(p.name for p in source_path.parent.glob(Path(spec).name.replace(LANG, "*")))
            raise FileNotFoundError(
                f"{role}: the source file '{source_path}' (source_lang={self.source_lang!r}) does not exist. Files "
                f"there that match: {siblings or 'none'}. Check the language codes."
            )
        if role.endswith(".predict") and not target_path.is_file():
            return self._pairs(self._lines(source_path, role), None, role, source_path.name)
        sources, targets = self._lines(source_path, role), self._lines(target_path, role)
        if len(sources) != len(targets):
            raise ValueError(f"{role}: the parallel files differ in length: '{source_path}' has {len(sources)} lines, "
                             f"'{target_path}' has {len(targets)}. Line i of one must translate line i of the other.")
        return self._pairs(sources, targets, role, f"{source_path.name} / {target_path.name}")

    def _read_rows(self, ds: datasets.Dataset, role: str) -> datasets.Dataset:
        needs_target = not role.endswith(".predict")
        if self.translation_column in ds.column_names:  # {lang: sentence} dicts (hub translation datasets)
            pairs = column(ds, self.translation_column)
            languages = sorted(pairs[0]) if pairs else []
            for lang in (self.source_lang, *([self.target_lang] if needs_target else [])):
                if lang not in languages:
                    raise ValueError(
                        f"{role}: the '{self.translation_column}' column has the languages {languages}, not {lang!r}. "
                        "Set source_lang and target_lang to two of them."
                    )
            targets = [p[self.target_lang] for p in pairs] if self.target_lang in languages else None
            return self._pairs([p[self.source_lang] for p in pairs], targets, role, "row")
        columns = {"source_lang": self.source_lang, "target_lang": self.target_lang if needs_target else None}
        try:
            check_columns(ds, columns, role)
        except KeyError as err:
            raise ValueError(
                f"{err.args[0]} Rows need a '{self.translation_column}' column of {{lang: sentence}} dicts "
                "(translation_column) or one column per language."
            ) from None
        targets = column(ds, self.target_lang) if self.target_lang in ds.column_names else None
        return self._pairs(column(ds, self.source_lang), targets, role, "row")

    def _lines(self, path: Path, role: str) -> list[str]:
        text = read_text(path, role, self.reading.encoding)
        lines = text.split("\n")  # only newlines end lines: other Unicode breaks may sit inside a sentence
        if lines and lines[-1] == "":
            lines.pop()
        return [line.rstrip("\r") for line in lines]

    @staticmethod
    def _pairs(sources: list, targets: list | None, role: str, where: str) -> datasets.Dataset:
        """Rows of stripped sentences; an empty one is an error that says where it is."""
        for side, sentences in (("source", sources), ("target", targets or ())):
            for i, sentence in enumerate(sentences):
                if not (sentence or "").strip():
                    position = f"line {i + 1}" if where != "row" else f"row {i}"
                    raise ValueError(f"{role}: {position} ({where}) has an empty {side} sentence. Remove that pair "
                                     "(from both files, keeping them line-aligned) or fill it in.")
        return datasets.Dataset.from_dict(
            {
                "source": [s.strip() for s in sources],
                "target": [t.strip() for t in targets] if targets is not None else [None] * len(sources),
            }
        )

    def check(self, ds: datasets.Dataset, role: str) -> None:
        if role not in UNLABELLED_ROLES and ds["target"][0] is None:
            raise ValueError(
                f"{self.option(role)} has source sentences only; training and evaluation need the target side too."
            )

    def files_of(self, source: str) -> list[str]:
        return [source.replace(LANG, lang) for lang in (self.source_lang, self.target_lang)] if LANG in source \
            else [source]

    # -- tokenizers --------------------------------------------------------------------------------
    def tokenizer_columns(self) -> list[str]:
        return ["source", "target"] if self.joint_vocabulary else ["source"]

    def tokenizer_text_options(self) -> list:
        return [self.source_lang, self.target_lang, self.translation_column, *super().tokenizer_text_options()]

    def tokenizer_fingerprints(self) -> list[str]:
        own = [] if self.target_tokenizer is self.tokenizer else [fingerprint(self.target_tokenizer)]
        return super().tokenizer_fingerprints() + own

    def info(self) -> dict:
        return {
            **super().info(),
            "target_vocab_size": None if self.joint_vocabulary else self.target_tokenizer.get_vocab_size(),
            "target_max_length": self.target_max_length,
        }

    def connect(self, tokenizer: Tokenizer, lowercase: bool = False, target: Tokenizer | None = None) -> None:
        """``target``: with separate vocabularies, the targets' tokenizer; with a joint one, a segmenter of the targets
        over the run's vocabulary (a pretrained model's own, Marian's ``target.spm``), else the run's tokenizer."""
        super().connect(tokenizer, lowercase)
        if self.joint_vocabulary and target is not None and target.get_vocab() != tokenizer.get_vocab():
            target = None
        if target is None and not self.joint_vocabulary:
            return
        previous = self._target_tokenizer
        if previous is not None and (target is None or target.to_str() != previous.to_str()):
            self._encoded.clear()  # encoded with another target tokenizer
        self._target_tokenizer = target

    @property
    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer, with ``source_language`` first where it is set."""
        run = super().tokenizer
        if self.source_language is None:
            return run
        if self._with_language is None or self._with_language[0] is not run:
            self._with_language = (run, with_first_token(run, self.source_language, self.option("source_language")))
        return self._with_language[1]

    def own_target_tokenizer(self) -> Tokenizer | None:
        target = self.target_tokenizer
        return None if target is self.tokenizer else target

    @property
    def target_tokenizer(self) -> Tokenizer:
        if self.joint_vocabulary:
            return self._target_tokenizer or self.tokenizer
        if self._target_tokenizer is None:
            if self.target_tokenizer_path:
                self._target_tokenizer = load_tokenizer(
                    self.target_tokenizer_path, checkpoint_key=f"{TARGET_KEY}/{self.name}"
                )
            else:
                self._target_tokenizer = cached_tokenizer(
                    [*self.tokenizer_key(), "target"],
                    lambda: column(self.raw("train"), "target"),
                    "bpe",
                    self.target_tokenizer_vocab_size,
                    self.lowercase,
                    f"the targets of task '{self.name}'",
                )
        return self._target_tokenizer

    # -- encoding ----------------------------------------------------------------------------------
    def encode(self, ds: datasets.Dataset, role: str) -> list[dict]:
        sources = self.tokenize(column(ds, "source"), role)
        examples = [{"input_ids": e.ids, "source": s} for e, s in zip(sources, column(ds, "source"))]
        if role in UNLABELLED_ROLES or ds["target"][0] is None:
            return examples
        target_tokenizer = self.target_tokenizer
        target_tokenizer.no_truncation()  # cut here, leaving room for [CLS] / [SEP]
        ids = SpecialIds.of(target_tokenizer)  # the decoder's start and end in the target vocabulary
        start, end = ids.bos, ids.eos
        targets = target_tokenizer.encode_batch(column(ds, "target"), add_special_tokens=False)
        room = self.target_max_length - 1
        truncated = 0
        for example, encoding, text in zip(examples, targets, column(ds, "target")):
            ids = encoding.ids[:room]
            truncated += len(encoding.ids) > room
            example.update(
                decoder_input_ids=[start, *ids],
                labels=[*ids, end],
                target=text,
            )
        self.warn_truncated(truncated, len(examples), f"{role} (targets)", "target_max_length")
        return examples

    def input_examples(self, inputs: list) -> list[dict]:
        """Predict examples from raw source sentences."""
        sources = [str(x).strip() for x in inputs]
        return [
            {"input_ids": e.ids, "source": s, "truncated": bool(e.overflowing)}
            for e, s in zip(self.tokenize(sources, "predict"), sources)
        ]

    def collate(self, examples: list[dict]) -> dict:
        input_ids = pad([e["input_ids"] for e in examples], self.pad_id)
        batch = {
            "input_ids": input_ids,
            "attention_mask": (input_ids != self.pad_id).long(),
            "source": [e["source"] for e in examples],
        }
        if "labels" in examples[0]:
            # no mask on the decoder side: what follows a target's end is never looked back at (causal attention)
            target_pad = special_id(self.target_tokenizer, PAD)
            batch["decoder_input_ids"] = pad([e["decoder_input_ids"] for e in examples], target_pad)
            batch["labels"] = pad([e["labels"] for e in examples], IGNORE_INDEX)
            batch["target"] = [e["target"] for e in examples]
        return batch
