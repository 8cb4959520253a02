"""Sequence-to-sequence translation: the trunk encodes the source, a decoder with cross-attention writes the target."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import SacreBLEUScore

from trunk.datamodules.text import IGNORE_INDEX
from trunk.datamodules.tokenizer import CLS, MASK, PAD, SEP, SPECIAL_TOKENS
from trunk.models import Decoder, GenerationConfig, SpecialIds, TrunkConfig, beam_search, greedy_search, init_weights
from trunk.tasks.base import TrunkTask, as_config

SPECIAL_IDS = SpecialIds(bos=SPECIAL_TOKENS.index(CLS), eos=SPECIAL_TOKENS.index(SEP), pad=SPECIAL_TOKENS.index(PAD),
                         banned=tuple(SPECIAL_TOKENS.index(t) for t in (PAD, CLS, MASK)))


class Translation(TrunkTask):
    """Encoder-decoder translation with teacher forcing, label smoothing and BLEU; data from ``TranslationData``.

    The trunk (optionally pretrained, ``init_from``) is the encoder. The decoder has the trunk's
    architecture (``decoder_layers`` deep) with causal self-attention, cross-attention on the
    encoder output and an output projection tied to its token embeddings; with a joint vocabulary
    and ``share_embeddings`` those are the encoder's embeddings too (one matrix, three uses).

    Validation and test report loss, token accuracy and sacreBLEU (13a tokenization, cased) of
    generated, detokenized text against the references. Validation generates greedily by default
    (``val_beam_size``), test with ``generation``. Prediction writes ``{source, translation}``.

    Args:
        target_vocab_size: the target vocabulary (linked from the data); unset: the trunk's.
        decoder_layers: decoder depth; unset: the trunk's ``n_layers``.
        share_embeddings: one embedding matrix for source, target and output (joint vocabulary only).
        label_smoothing: the target distribution's mass spread over the vocabulary.
        generation: beam size, length penalty and length limits for test and predict.
        val_beam_size: beam size when generating for validation BLEU (1: greedy, the quickest).
        trunk: the architecture of the encoder, and of the decoder but for its depth.
        **kwargs: see ``TrunkTask``: ``optimizer``, ``init_from`` and ``finetune`` (freezing applies to the encoder).
    """

    def __init__(
        self,
        target_vocab_size: int | None = None,
        decoder_layers: int | None = None,
        share_embeddings: bool = True,
        label_smoothing: float = 0.1,
        generation: GenerationConfig = GenerationConfig(),
        val_beam_size: int = 1,
        trunk: TrunkConfig = TrunkConfig(),
        **kwargs,
    ) -> None:
        trunk, generation = as_config(TrunkConfig, trunk), as_config(GenerationConfig, generation)
        source_vocab = trunk.vocab_size
        self.target_vocab_size = target_vocab = target_vocab_size or source_vocab
        super().__init__(trunk=trunk, **kwargs)
        self.save_hyperparameters()
        if share_embeddings and target_vocab != source_vocab:
            raise ValueError(f"model.share_embeddings needs one vocabulary for both sides, but the source has {source_vocab} "
                             f"tokens and the target {target_vocab}. Set data.joint_vocabulary=true, or model.share_embeddings=false.")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"model.label_smoothing must be in [0, 1), got {label_smoothing}.")
        self.label_smoothing, self.generation, self.val_beam_size = label_smoothing, generation, val_beam_size
        self.decoder = Decoder(replace(self.trunk_config, vocab_size=target_vocab, n_layers=decoder_layers or self.trunk_config.n_layers))
        init_weights(self.decoder, self.trunk_config.init_std)
        if share_embeddings:
            self.decoder.stem.token = self.trunk.stem.token
        self.bleu = nn.ModuleDict({stage: SacreBLEUScore(tokenize="13a") for stage in ("val", "test")})

    def make_metrics(self) -> MetricCollection:  # next-token accuracy under teacher forcing
        return MetricCollection({"acc": MulticlassAccuracy(self.target_vocab_size, average="micro", ignore_index=IGNORE_INDEX)})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: (B, S) sources and (B, U) shifted targets -> (B, U, target vocab) logits."""
        memory = self.trunk(input_ids, attention_mask)
        return self.decoder(decoder_input_ids, memory, attention_mask.bool())

    def step(self, batch: dict, stage: str) -> torch.Tensor:
        logits = self(batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"])
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX,
                               label_smoothing=self.label_smoothing)
        self.metrics(stage).update(logits.argmax(-1).flatten(), labels.flatten())
        if stage in self.bleu:
            beam_size = self.val_beam_size if stage == "val" else self.generation.beam_size
            self.bleu[stage].update(self.translate(batch["input_ids"], batch["attention_mask"], beam_size),
                                    [[reference] for reference in batch["target"]])
        return loss

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, beam_size: int | None = None,
                 use_cache: bool = True) -> torch.Tensor:
        """Target token ids (B, L), ending with [SEP] (unless cut by the length limit), padded after it."""
        beam_size = beam_size or self.generation.beam_size
        memory, memory_mask = self.trunk(input_ids, attention_mask), attention_mask.bool()
        steps = self.generation.steps(int(attention_mask.sum(1).max()))
        if beam_size == 1:
            return greedy_search(self.decoder, memory, memory_mask, SPECIAL_IDS, steps, use_cache)
        return beam_search(self.decoder, memory, memory_mask, SPECIAL_IDS, steps, beam_size, self.generation.length_penalty, use_cache)

    def translate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, beam_size: int | None = None) -> list[str]:
        """Detokenized translations (the datamodule's target tokenizer decodes them)."""
        tokens = self.generate(input_ids, attention_mask, beam_size).tolist()
        cut = [row[: row.index(SPECIAL_IDS.eos)] if SPECIAL_IDS.eos in row else row for row in tokens]
        return self.trainer.datamodule.decode(cut)

    def _log_bleu(self, stage: str) -> None:
        self.log(f"{stage}/bleu", 100 * self.bleu[stage].compute(), prog_bar=True)  # sacreBLEU's 0-100 scale
        self.bleu[stage].reset()

    def on_validation_epoch_end(self) -> None:
        self._log_bleu("val")

    def on_test_epoch_end(self) -> None:
        self._log_bleu("test")

    def predict_step(self, batch: dict, batch_idx: int) -> list[dict]:
        translations = self.translate(batch["input_ids"], batch["attention_mask"])
        return [{"source": source, "translation": translation} for source, translation in zip(batch["source"], translations)]
