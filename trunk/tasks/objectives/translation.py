"""Sequence-to-sequence translation: the trunk encodes the source, a decoder with cross-attention writes the target."""

from __future__ import annotations

import re
from dataclasses import asdict, replace

import torch
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import SacreBLEUScore

from trunk.core.codec import IGNORE_INDEX, token_id
from trunk.core.contract import TaskSpec
from trunk.datamodules.text import pad
from trunk.models import Decoder, GenerationConfig, SpecialIds, Trunk, TrunkConfig, beam_search, greedy_search
from trunk.tasks.objectives.base import Objective, cross_entropy, soft_cross_entropy


class Translation(Objective):
    """Encoder-decoder translation with teacher forcing, label smoothing and BLEU; data from ``TranslationData``.

    The trunk (optionally pretrained, ``init_from``) is the encoder. The decoder has the trunk's
    architecture (``decoder_layers`` deep) with causal self-attention, cross-attention on the
    encoder output and an output projection tied to its token embeddings; with a joint vocabulary
    and ``share_embeddings`` those are the trunk's text embeddings too (one matrix, three uses).

    Metrics: next-token accuracy under teacher forcing (``acc``), and on validation and test
    sacreBLEU (``bleu``: 13a tokenization, cased, 0-100) of generated, detokenized text against
    the references; the primary is BLEU / 100. Validation generates greedily by default
    (``val_beam_size``), test and predict with ``generation``. Prediction writes ``{source, translation}``.

    Args:
        decoder_layers: decoder depth; unset: the trunk's ``n_layers``.
        share_embeddings: one embedding matrix for source, target and output (joint vocabulary only).
        tied_output: the decoder's logits read its target embeddings; false: an output projection of its own (T5
            v1.1's, flan-t5's).
        label_smoothing: the target distribution's mass spread over the vocabulary.
        generation: beam size, length penalty and length limits for test and predict.
        val_beam_size: beam size when generating for validation BLEU (1: greedy, the quickest).
        decoder_start: the token the decoder starts from; unset: [CLS] (``<s>``) where the target vocabulary has one,
            else the padding token (T5's, Marian's). A pretrained decoder's own start comes with its head (BART,
            mBART and NLLB start from ``</s>``).
        target_language: a language-code token of the target vocabulary that every target starts with, written first
            when generating (NLLB's ``deu_Latn``, mBART-50's ``de_DE``, M2M100's ``__de__``): a multilingual decoder's
            choice of output language, which predict and serve may set anew.
    """

    kind = "translation"
    primary = "bleu_fraction"
    inference_options = ("generation", "val_beam_size", "target_language")
    targets_per_row = False  # word-level answers are per target position of a batch (sequence-level ones: per row)
    carried_options = ("decoder_start",)  # a stored head's, where the run leaves them unset

    def __init__(self, decoder_layers: int | None = None, share_embeddings: bool = True, label_smoothing: float = 0.1,
                 generation: GenerationConfig = GenerationConfig(), val_beam_size: int = 1,
                 tied_output: bool = True, decoder_start: str | None = None,
                 target_language: str | None = None) -> None:
        generation = GenerationConfig(**generation) if isinstance(generation, dict) else generation
        super().__init__(
            decoder_layers=decoder_layers,
            share_embeddings=share_embeddings,
            label_smoothing=label_smoothing,
            generation=asdict(generation),
            val_beam_size=val_beam_size,
            tied_output=tied_output,
            decoder_start=decoder_start,
            target_language=target_language,
        )
        self.decoder_start, self.target_language = decoder_start, target_language
        self.decoder_layers, self.share_embeddings, self.label_smoothing, self.tied_output = (
            decoder_layers,
            share_embeddings,
            label_smoothing,
            tied_output,
        )
        self.generation, self.val_beam_size = generation, val_beam_size

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        self.target_vocab_size = info.target_vocab_size or cfg.vocab_size
        if self.share_embeddings and cfg.embedding_size != cfg.d_model:
            raise ValueError(
                f"Task '{self.name}': share_embeddings reads the decoder's logits off the trunk's token embeddings, "
                f"which are {cfg.embedding_size} wide in a {cfg.d_model}-wide trunk (embedding_size). Set "
                "share_embeddings=false."
            )
        if self.share_embeddings and self.target_vocab_size != cfg.vocab_size:
            raise ValueError(
                f"Task '{self.name}': share_embeddings needs one vocabulary for both sides, but the source has "
                f"{cfg.vocab_size} tokens and the target {self.target_vocab_size}. Set joint_vocabulary=true in the "
                "task's data, or share_embeddings=false."
            )
        self.decoder = Decoder(
            # targets are one segment, embedded at the width the logits read; every decoder layer its own block
            replace(cfg, vocab_size=self.target_vocab_size, n_layers=self.decoder_layers or cfg.n_layers, segments=0,
                    embedding_size=None, shared_blocks=0),
            self.tied_output,
        )
        if self.share_embeddings:
            self.decoder.stem.token = trunk.stems["text"].token

    def set_inference_options(self, options: dict) -> None:
        """``generation`` may name some of its fields: the others stay as they were."""
        if isinstance(options.get("generation"), dict):
            options = {**options, "generation": {**asdict(self.generation), **options["generation"]}}
        super().set_inference_options(options)
        if isinstance(self.generation, dict):
            self.generation = GenerationConfig(**self.generation)
        if self.codec is not None:
            self.generation_ids  # noqa: B018 (a target language the vocabulary lacks is named now)

    def connect(self, codec) -> None:
        super().connect(codec)
        if codec is not None and codec.tokenizer is not None:
            self.generation_ids  # noqa: B018 (names a start or language token the target vocabulary lacks, now)

    def framed(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The batch's decoder inputs and labels (None: a batch without) as this decoder reads them: from its own start
        token, with the target language first (the data writes ``start target`` and ``target end``)."""
        inputs, labels = batch["decoder_input_ids"], batch.get("labels")
        if self.decoder_start is None and self.target_language is None:
            return inputs, labels
        ids = self.generation_ids
        column = lambda rows, token: rows.new_full((len(rows), 1), token)  # noqa: E731
        inputs = torch.cat([column(inputs, ids.bos), *[column(inputs, t) for t in ids.forced], inputs[:, 1:]], 1)
        if labels is not None:
            labels = torch.cat([*[column(labels, t) for t in ids.forced], labels], 1)
        return inputs, labels

    def make_metrics(self, stage: str) -> dict[str, Metric]:
        metrics = {"acc": MulticlassAccuracy(self.target_vocab_size, average="micro", ignore_index=IGNORE_INDEX)}
        if stage != "train":
            metrics["bleu"] = SacreBLEUScore(tokenize="13a")
        return metrics

    def compute_metrics(self, stage: str) -> dict[str, torch.Tensor]:
        values = super().compute_metrics(stage)
        if "bleu" in values:
            values["bleu_fraction"] = values["bleu"]  # in [0, 1], for the run's score
            values["bleu"] = 100 * values["bleu"]  # sacreBLEU's 0-100 scale
        return values

    def forward(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """Teacher forcing: (B, S) sources and (B, U) shifted targets -> (B, U, target vocab) logits."""
        memory = self.encode(trunk, batch)
        return self.decoder(self.framed(batch)[0], memory, batch["attention_mask"].bool())

    def distill_output(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """(N, target vocab) logits at the N real target positions, under teacher forcing (the decoder and its output
        layer skip the padding)."""
        decoder_inputs, labels = self.framed(batch)
        scored = labels != IGNORE_INDEX
        hidden = self.decoder.hidden(
            decoder_inputs, self.encode(trunk, batch), batch["attention_mask"].bool(), target_mask=scored
        )
        return self.decoder.logits(hidden[scored]).float()

    def soft_targets(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        return self.distill_output(trunk, batch).softmax(-1)  # word-level: each target position's next-token guess

    @torch.no_grad()
    def teacher_sequences(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """(B, L) this model's translations of the batch's sources (its generation settings: beam search), as target
        ids each ending with the end token, 0s after: sequence-level distillation's targets (Kim & Rush 2016)."""
        ids = self.generation_ids
        tokens = self.generate(trunk, batch["input_ids"], batch["attention_mask"]).tolist()
        rows = [row[len(ids.forced):] for row in tokens]  # without the target language's code
        rows = [[*(row[: row.index(ids.eos)] if ids.eos in row else row), ids.eos] for row in rows]
        return pad(rows, 0).to(batch["input_ids"].device)

    def with_targets(self, batch: dict, sequences: torch.Tensor) -> dict:
        """The batch with ``sequences`` (``teacher_sequences``') as its targets, framed as the data frames references
        (in: [start, *ids]; out: [*ids, end]) and cut to the positions this decoder has."""
        ids = SpecialIds.of(self.codec.target(self.name))
        room = self.decoder.cfg.max_len - 1 - len(self.generation_ids.forced)
        rows = [row[: min(row.index(ids.eos), room)] for row in sequences.tolist()]
        kept = {key: value for key, value in batch.items() if key not in ("target", "decoder_input_ids", "labels")}
        return {**kept, "decoder_input_ids": pad([[ids.bos, *row] for row in rows], ids.pad).to(sequences.device),
                "labels": pad([[*row, ids.eos] for row in rows], IGNORE_INDEX).to(sequences.device)}

    def distill_loss(self, output, targets: torch.Tensor, batch: dict, temperature: float) -> torch.Tensor:
        return soft_cross_entropy(output, targets, temperature)

    def loss(self, trunk: Trunk, batch: dict, stage: str, output=None) -> torch.Tensor:
        logits = self.distill_output(trunk, batch) if output is None else output  # (N, V)
        labels = self.framed(batch)[1]
        labels = labels[labels != IGNORE_INDEX]
        metrics = self.metrics(stage)
        metrics["acc"].update(logits.argmax(-1), labels)
        if "bleu" in metrics:
            beam_size = self.val_beam_size if stage == "val" else self.generation.beam_size
            metrics["bleu"].update(
                self.translate(trunk, batch, beam_size), [[reference] for reference in batch["target"]]
            )
        return cross_entropy(logits, labels, self.label_smoothing)

    @property
    def generation_ids(self) -> SpecialIds:
        tokenizer = None if self.codec is None else self.codec.target(self.name)
        ids = SpecialIds.of(tokenizer)
        start, language = (None if token is None else token_id(tokenizer, token, f"Task '{self.name}': {option}")
                           for token, option in ((self.decoder_start, "decoder_start"),
                                                 (self.target_language, "target_language")))
        return replace(ids, bos=ids.bos if start is None else start, forced=() if language is None else (language,))

    @torch.no_grad()
    def generate(
        self,
        trunk: Trunk,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        beam_size: int | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Target token ids (B, L), ending with [SEP] (unless cut by the length limit), padded after it."""
        beam_size = beam_size or self.generation.beam_size
        memory, memory_mask = trunk(input_ids, attention_mask), attention_mask.bool()
        # no longer than the decoder has positions for (its start token takes the first)
        steps = min(self.generation.steps(int(attention_mask.sum(1).max())), self.decoder.cfg.max_len)
        if beam_size == 1:
            return greedy_search(self.decoder, memory, memory_mask, self.generation_ids, steps, use_cache)
        return beam_search(
            self.decoder,
            memory,
            memory_mask,
            self.generation_ids,
            steps,
            beam_size,
            self.generation.length_penalty,
            use_cache,
        )

    def translate(self, trunk: Trunk, batch: dict, beam_size: int | None = None) -> list[str]:
        """Detokenized translations (decoded with the task's target tokenizer)."""
        if self.codec is None:
            raise RuntimeError(
                f"Task '{self.name}' has no tokenizer to decode with: the model was built without a codec."
            )
        tokens = self.generate(trunk, batch["input_ids"], batch["attention_mask"], beam_size).tolist()
        ids = self.generation_ids
        tokens = [row[len(ids.forced):] for row in tokens]  # without the target language's code
        cut = [row[: row.index(ids.eos)] if ids.eos in row else row for row in tokens]
        return self.codec.target(self.name).decode_batch(cut, skip_special_tokens=True)

    def samples(self, trunk: Trunk, batch: dict) -> list[dict]:
        """Source, reference, hypothesis (greedy or ``val_beam_size``) and the sentence's sacreBLEU: add-one
        smoothed, up to the n-gram order the hypothesis has (else a sentence of 3 tokens always scores 0)."""
        from torchmetrics.functional.text import sacre_bleu_score

        def sentence_bleu(hypothesis: str, reference: str) -> float:
            # n-grams the sentence has (sacreBLEU's "effective order")
            order = max(1, min(4, len(re.findall(r"\w+|[^\w\s]", hypothesis))))
            return round(100 * float(sacre_bleu_score([hypothesis], [[reference]], n_gram=order, smooth=True)), 2)

        hypotheses = self.translate(trunk, batch, self.val_beam_size)
        return [
            {
                "source": source,
                "reference": reference,
                "hypothesis": hypothesis,
                "bleu": sentence_bleu(hypothesis, reference),
            }
            for source, reference, hypothesis in zip(batch["source"], batch["target"], hypotheses)
        ]

    def predict(self, trunk: Trunk, batch: dict) -> list[dict]:
        translations = self.translate(trunk, batch)
        return [
            {"source": source, "translation": translation} for source, translation in zip(batch["source"], translations)
        ]
