"""Masked-language-model pretraining: predict the hidden tokens of a block from both sides."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy

from trunk.core.codec import IGNORE_INDEX, MASK, required_id
from trunk.core.contract import TaskSpec
from trunk.core.masking import mask_tokens
from trunk.models import MaskedLMHead, Trunk, TrunkConfig
from trunk.tasks.objectives.base import Objective, soft_cross_entropy


class Perplexity(Metric):
    """exp(mean negative log-likelihood) over all predicted tokens of an epoch, synced across processes."""

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("nll_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll: torch.Tensor) -> None:
        self.nll_sum += nll.detach().double().sum()
        self.count += nll.numel()

    def compute(self) -> torch.Tensor:
        return torch.exp(self.nll_sum / self.count.clamp(min=1))


def masked_token_nll(
    head: MaskedLMHead, hidden: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Vocabulary logits and NLL at the masked positions only (labels != -100), plus the (B, T) mask.

    The vocabulary projection is the largest matmul; about 15% of positions need it.
    """
    selected = targets != IGNORE_INDEX
    logits = head(hidden[selected]).float()  # (N, V)
    return logits, F.cross_entropy(logits, targets[selected], reduction="none"), selected


def tied_mlm_head(trunk: Trunk) -> MaskedLMHead:
    """BERT's MLM head whose decoder is the trunk's token embedding (one matrix reads and writes tokens)."""
    cfg = trunk.cfg
    if "text" not in trunk.stems:
        raise ValueError("Masked-LM needs the trunk's text stem.")
    return MaskedLMHead(trunk.stems["text"].token, cfg.activation, cfg.layer_norm_eps, cfg.init_std, cfg.d_model,
                        cfg.bias)


def check_aux_mlm(weight, objectives: dict, tokenizer: Tokenizer | None) -> None:
    """``model.aux_mlm``: a loss weight >= 0; other than 0, a run with a text task whose tokenizer has a [MASK]."""
    if not (isinstance(weight, (int, float)) and weight >= 0):
        raise ValueError(f"model.aux_mlm={weight!r} must be a loss weight >= 0 (0: off).")
    if weight and not any(o.stem == "text" for o in objectives.values()):
        raise ValueError("model.aux_mlm masks the tokens of text tasks' batches; this run has no text task. Set it "
                         "to 0.")
    if weight and tokenizer is not None:
        required_id(tokenizer, MASK, "model.aux_mlm (masking the text tasks' tokens)")


def auxiliary_mlm_loss(head: MaskedLMHead, trunk: Trunk, batch: dict, special_ids: dict[str, int | None]
                       ) -> torch.Tensor:
    """``model.aux_mlm``: the masked-LM loss of a text task's own training batch, masked afresh as BERT does (the task's
    loss saw it whole). ``special_ids``: the run's tokenizer's id of each of ``SPECIAL_TOKENS`` (never masked; None:
    the tokenizer lacks it)."""
    ids, mask = batch["input_ids"], batch.get("attention_mask")
    # choices: rows
    ids, mask = (ids.reshape(-1, ids.shape[-1]), None if mask is None else mask.reshape(-1, mask.shape[-1]))
    specials = torch.tensor([i for i in special_ids.values() if i is not None], device=ids.device)
    masked, targets = mask_tokens(ids, specials, special_ids[MASK], trunk.cfg.vocab_size)
    _, nll, _ = masked_token_nll(head, trunk(masked, mask), targets)
    return nll.mean()


class MaskedLanguageModeling(Objective):
    """BERT-style pretraining of the trunk on ``CorpusData`` blocks (masking happens in the collator).

    Logs the loss, perplexity (``ppl``) and accuracy (``acc``, the primary) over the masked tokens.
    A run with a pretraining objective ends ``fit`` by exporting the trunk as a pretrained-trunk
    directory (``ExportTrunk``; default ``<default_root_dir>/trunk``).

    Args:
        label_smoothing: the share of each target's probability spread over the other tokens of the vocabulary
            (perplexity stays the true one): a regulariser against over-confidence (0: none).
        enhanced_mask_decoder: the rows of a table of absolute positions (the longest input the head reads; 0: off)
            for DeBERTa's enhanced mask decoder: the head reads the last block run twice on the layer below it, its
            queries first those positions plus that layer's output, then its own first output; so a trunk that sees
            no absolute positions (disentangled ones) predicts with them. DeBERTa-v2's and v3's masked-LM heads were
            pretrained so (512); an imported one comes with it where the checkpoint has the table.
    """

    kind = "masked_lm"
    exports_trunk = True

    def __init__(self, label_smoothing: float = 0.0, enhanced_mask_decoder: int = 0) -> None:
        super().__init__(label_smoothing=label_smoothing, enhanced_mask_decoder=enhanced_mask_decoder)
        if not (isinstance(enhanced_mask_decoder, int) and enhanced_mask_decoder >= 0):
            raise ValueError(f"enhanced_mask_decoder={enhanced_mask_decoder!r} must be the rows of its position table "
                             "(the longest input it decodes; DeBERTa's: 512), or 0 for none.")
        self.label_smoothing, self.enhanced_mask_decoder = label_smoothing, enhanced_mask_decoder

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        self.head = tied_mlm_head(trunk)
        rows = self.enhanced_mask_decoder
        self.decoder_positions = nn.Embedding(rows, cfg.d_model) if rows else None
        if self.decoder_positions is not None:
            nn.init.normal_(self.decoder_positions.weight, std=cfg.init_std)

    def no_weight_decay(self) -> set[str]:
        """The decoder's table is positions, as position tables are (timm's convention)."""
        return set() if self.decoder_positions is None else {"decoder_positions.weight"}

    def encode(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        if self.decoder_positions is None:
            return super().encode(trunk, batch)
        ids = batch[self.input_key]
        if ids.shape[1] > self.decoder_positions.num_embeddings:
            raise ValueError(f"Task '{self.name}': inputs of {ids.shape[1]} tokens, and the enhanced mask decoder's "
                             f"position table has {self.decoder_positions.num_embeddings} rows. Set the data's "
                             "max_length to at most that.")
        return trunk(ids, batch.get("attention_mask"), stem=self.stem,
                     decoder_positions=self.decoder_positions.weight[: ids.shape[1]])

    def make_metrics(self, stage: str) -> dict[str, Metric]:
        return {
            "ppl": Perplexity(),
            "acc": MulticlassAccuracy(self.head.decoder.out_features, average="micro", validate_args=False),
        }

    def forward(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """All positions' vocabulary logits (B, T, V), for inspection; training scores masked positions only."""
        return self.head(self.encode(trunk, batch))

    targets_per_row = False  # answers at the masked positions, drawn anew every epoch

    def distill_output(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """(N, vocabulary) logits at the N masked positions (labels != -100)."""
        return self.head(self.encode(trunk, batch)[batch["labels"] != IGNORE_INDEX]).float()

    def soft_targets(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        return self.distill_output(trunk, batch).softmax(-1)

    def distill_loss(self, output, targets: torch.Tensor, batch: dict, temperature: float) -> torch.Tensor:
        return soft_cross_entropy(output, targets, temperature)

    def loss(self, trunk: Trunk, batch: dict, stage: str, output=None) -> torch.Tensor:
        logits = self.distill_output(trunk, batch) if output is None else output
        targets = batch["labels"][batch["labels"] != IGNORE_INDEX]
        nll = F.cross_entropy(logits, targets, reduction="none")
        self.metrics(stage)["ppl"].update(nll)
        self.metrics(stage)["acc"].update(logits.argmax(-1), targets)
        if not self.label_smoothing:
            return nll.mean()
        # smoothing over the whole vocabulary, from the NLL at hand: mean(-log p) = nll + logit of the target -
        # mean(logits)
        spread = nll + logits.gather(-1, targets[:, None]).squeeze(-1) - logits.mean(-1)
        return ((1 - self.label_smoothing) * nll + self.label_smoothing * spread).mean()

    def predict(self, trunk: Trunk, batch: dict) -> list[dict]:
        """The most probable token at each masked position (label != -100), as ids."""
        logits, _, selected = masked_token_nll(self.head, self.encode(trunk, batch), batch["labels"])
        predicted, rows = logits.argmax(-1).tolist(), selected.nonzero()[:, 0].tolist()
        return [{"masked_predictions": [p for p, r in zip(predicted, rows) if r == i]} for i in range(len(selected))]
