"""ELECTRA pretraining (Clark et al., 2020): a small generator fills the masked tokens, and the trunk
learns to tell, at every position, whether the token it sees is the original or a replacement.

Masked-LM learns from the ~15% of positions it hides; replaced-token detection gives the trunk a
signal at every position, which is what makes it learn more per step of compute on small budgets.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import BinaryAccuracy, BinaryF1Score, MulticlassAccuracy

from trunk.core.contract import TaskSpec
from trunk.models import Backbone, ReplacedTokenHead, Trunk, TrunkConfig
from trunk.models.trunk import norm_layer
from trunk.tasks.objectives.base import Objective
from trunk.tasks.objectives.masked_lm import Perplexity, masked_token_nll, tied_mlm_head


class ReplacedTokenDetection(Objective):
    """ELECTRA on ``CorpusData`` blocks; the trunk is the discriminator, and the one that is exported.

    The generator is a shallow backbone of the trunk's width that shares the trunk's text stem (its
    token embeddings, which also serve as its tied MLM decoder), as in ELECTRA. It predicts the
    masked tokens (a masked-LM loss); its samples replace them, and the trunk with ``self.head``
    classifies every real token as original or replaced. A sample equal to the original counts as
    original. The generator exists only to make hard replacements.

    Args:
        generator_layers: the generator's depth. ELECTRA works best with a generator well below the
            discriminator's size (a quarter to a half); one too strong makes the task too hard.
        discriminator_weight: the weight of the detection loss against the generator's MLM loss
            (ELECTRA: 50; the binary loss is much smaller than a vocabulary-wide one).
        cls_context: the detection head reads each token's vector plus [CLS]'s, normed (DeBERTa-v3's head; an
            imported DeBERTa-v3 discriminator's head is stored with it).

    A discriminator imported with its head (ELECTRA's, DeBERTa-v3's: stored as the task ``electra``) goes on training
    from it; their generators are not released, so the generator starts fresh (``fresh_parts``).
    """

    kind = "replaced_token_detection"
    primary = "disc_acc"
    exports_trunk = True
    fresh_parts = ("generator.", "generator_head.")

    def __init__(self, generator_layers: int = 1, discriminator_weight: float = 50.0, cls_context: bool = False
                 ) -> None:
        super().__init__(generator_layers=generator_layers, discriminator_weight=discriminator_weight,
                         cls_context=cls_context)
        if discriminator_weight <= 0:
            raise ValueError(f"discriminator_weight must be positive, got {discriminator_weight}.")
        self.generator_layers, self.discriminator_weight = generator_layers, discriminator_weight
        self.cls_context = cls_context

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        if not 1 <= self.generator_layers <= cfg.n_layers:
            raise ValueError(
                f"generator_layers must be between 1 and the trunk's n_layers={cfg.n_layers}, got "
                f"{self.generator_layers}."
            )
        self.generator = Backbone(dataclasses.replace(cfg, n_layers=self.generator_layers))
        self.generator_head = tied_mlm_head(trunk)
        self.head = ReplacedTokenHead(cfg.d_model, cfg.activation, cfg.init_std,
                                      norm_layer(cfg) if self.cls_context else None)

    def make_metrics(self, stage: str) -> dict[str, Metric]:
        return {
            "ppl": Perplexity(),  # the generator's, on the masked tokens
            "gen_acc": MulticlassAccuracy(
                self.generator_head.decoder.out_features, average="micro", validate_args=False
            ),
            "disc_acc": BinaryAccuracy(validate_args=False),  # over all real tokens
            "disc_f1": BinaryF1Score(validate_args=False),  # of "replaced": the rarer, harder class
            "gen_loss": MeanMetric(),
            "disc_loss": MeanMetric(),  # the two parts of the loss
        }

    def forward(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """(B, T) logits that each token was replaced."""
        return self.head(self.encode(trunk, batch))

    def replace(self, trunk: Trunk, masked_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor):
        """Run the generator; returns its logits and NLL at the masked positions, the discriminator's
        input (the original tokens with generator samples at the masked positions) and the (B, T)
        replaced / not-replaced targets."""
        hidden = self.generator(trunk.stems["text"](masked_ids), attention_mask.bool())
        logits, nll, selected = masked_token_nll(self.generator_head, hidden, labels)
        with torch.no_grad():  # sampling is not differentiable: no detection gradient reaches the generator
            gumbel = -torch.log(-torch.log(torch.rand_like(logits).clamp(1e-9, 1.0)))
            sampled = (logits + gumbel).argmax(-1)
        original = torch.where(selected, labels, masked_ids)
        corrupted = original.clone()
        corrupted[selected] = sampled
        return logits, nll, selected, corrupted, corrupted != original

    def loss(self, trunk: Trunk, batch: dict, stage: str) -> torch.Tensor:
        labels, attention_mask = batch["labels"], batch["attention_mask"]
        gen_logits, nll, selected, corrupted, replaced = self.replace(trunk, batch["input_ids"], labels, attention_mask)
        real = attention_mask.bool()  # padding is neither original nor replaced
        disc_logits = self(trunk, {"input_ids": corrupted, "attention_mask": attention_mask}).float()[real]
        replaced = replaced[real]
        disc_loss = F.binary_cross_entropy_with_logits(disc_logits, replaced.float())
        metrics = self.metrics(stage)
        metrics["ppl"].update(nll)
        metrics["gen_acc"].update(gen_logits.argmax(-1), labels[selected])
        for name in ("disc_acc", "disc_f1"):
            metrics[name].update(disc_logits.sigmoid(), replaced.long())
        gen_loss = nll.mean()
        metrics["gen_loss"].update(gen_loss.detach())
        metrics["disc_loss"].update(disc_loss.detach())
        return gen_loss + self.discriminator_weight * disc_loss

    def predict(self, trunk: Trunk, batch: dict) -> list[dict]:
        """Per example, the probability that each token was replaced."""
        probs = self(trunk, batch).float().sigmoid()
        mask = batch["attention_mask"].bool()
        return [{"replaced_probs": row[m].tolist()} for row, m in zip(probs, mask)]
