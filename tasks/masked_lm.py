"""Masked-language-model pretraining: predict the hidden tokens of a block from both sides."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from trunk.datamodules.text import IGNORE_INDEX
from trunk.models import MaskedLMHead, init_weights
from trunk.tasks.base import TrunkTask


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


class PretrainingTask(TrunkTask):
    """What the pretraining objectives share: fit always ends by exporting the trunk (``ExportTrunk``)."""

    def configure_callbacks(self):
        from trunk.tasks.callbacks import ExportTrunk

        callbacks = super().configure_callbacks()
        if not any(isinstance(c, ExportTrunk) for c in self.trainer.callbacks):
            callbacks.append(ExportTrunk())  # pretraining always ends with a reusable trunk
        return callbacks


def masked_token_nll(head: MaskedLMHead, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Vocabulary logits and NLL at the masked positions only (labels != -100), plus the (B, T) mask.

    The vocabulary projection is the largest matmul; about 15% of positions need it.
    """
    selected = targets != IGNORE_INDEX
    logits = head(hidden[selected]).float()  # (N, V)
    return logits, F.cross_entropy(logits, targets[selected], reduction="none"), selected


class MaskedLanguageModeling(PretrainingTask):
    """BERT-style pretraining of the trunk on ``CorpusData`` blocks (masking happens in the collator).

    Logs the loss, perplexity and accuracy over the masked tokens. At the end of ``fit`` the trunk
    is exported as a pretrained-trunk directory (``ExportTrunk``; default ``<default_root_dir>/trunk``).

    Args:
        **kwargs: see ``TrunkTask``: ``trunk`` (architecture; ``vocab_size`` is linked from the
            data), ``optimizer``, ``init_from`` (continue pretraining a trunk) and ``finetune``.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        cfg = self.trunk_config
        self.head = MaskedLMHead(self.trunk.stem.token, cfg.activation, cfg.layer_norm_eps)
        init_weights(self.head.dense, cfg.init_std)  # not the decoder: its weight is the embedding

    def make_metrics(self) -> MetricCollection:
        vocab = self.trunk_config.vocab_size
        return MetricCollection({"ppl": Perplexity(), "acc": MulticlassAccuracy(vocab, average="micro", validate_args=False)})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """All positions' vocabulary logits (B, T, V), for inspection; training scores masked positions only."""
        return self.head(self.trunk(input_ids, attention_mask))

    def step(self, batch: dict, stage: str) -> torch.Tensor:
        hidden = self.trunk(batch["input_ids"], batch["attention_mask"])
        logits, nll, selected = masked_token_nll(self.head, hidden, batch["labels"])
        self.metrics(stage).update(preds=logits.argmax(-1), target=batch["labels"][selected], nll=nll)
        return nll.mean()
