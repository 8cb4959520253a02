"""ELECTRA pretraining (Clark et al., 2020): a small generator fills the masked tokens, and the trunk
learns to tell, at every position, whether the token it sees is the original or a replacement.

Masked-LM learns from the ~15% of positions it hides; replaced-token detection gives the trunk a
signal at every position, which is what makes it learn more per step of compute on small budgets.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torchmetrics import MetricCollection
from torchmetrics.classification import BinaryAccuracy, BinaryF1Score, MulticlassAccuracy

from trunk.models import Backbone, MaskedLMHead, ReplacedTokenHead, init_weights
from trunk.tasks.masked_lm import Perplexity, PretrainingTask, masked_token_nll


class ReplacedTokenDetection(PretrainingTask):
    """ELECTRA on ``CorpusData`` blocks; the trunk is the discriminator, and the one that is exported.

    The generator is a shallow backbone of the trunk's width that shares the trunk's stem (its token
    embeddings, which also serve as its tied MLM decoder), as in ELECTRA. It predicts the masked
    tokens (a masked-LM loss); its samples replace them, and the trunk with ``self.head`` classifies
    every real token as original or replaced. A sample equal to the original counts as original.
    The generator is not exported: it exists only to make hard replacements.

    Args:
        generator_layers: the generator's depth. ELECTRA works best with a generator well below the
            discriminator's size (a quarter to a half); one too strong makes the task too hard.
        discriminator_weight: the weight of the detection loss against the generator's MLM loss
            (ELECTRA: 50; the binary loss is much smaller than a vocabulary-wide one).
        **kwargs: see ``TrunkTask``: ``trunk``, ``optimizer``, ``init_from``, ``finetune``.
    """

    def __init__(self, generator_layers: int = 1, discriminator_weight: float = 50.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        cfg = self.trunk_config
        if not 1 <= generator_layers <= cfg.n_layers:
            raise ValueError(f"generator_layers must be between 1 and the trunk's n_layers={cfg.n_layers}, got {generator_layers}.")
        if discriminator_weight <= 0:
            raise ValueError(f"discriminator_weight must be positive, got {discriminator_weight}.")
        self.discriminator_weight = discriminator_weight
        self.generator = Backbone(dataclasses.replace(cfg, n_layers=generator_layers))
        self.generator_head = MaskedLMHead(self.trunk.stem.token, cfg.activation, cfg.layer_norm_eps)
        self.head = ReplacedTokenHead(cfg.d_model, cfg.activation)
        init_weights(self.generator, cfg.init_std)
        init_weights(self.generator_head.dense, cfg.init_std)  # not the decoder: its weight is the embedding
        init_weights(self.head, cfg.init_std)

    def make_metrics(self) -> MetricCollection:
        vocab = self.trunk_config.vocab_size
        return MetricCollection({
            "ppl": Perplexity(),  # the generator's, on the masked tokens
            "gen_acc": MulticlassAccuracy(vocab, average="micro", validate_args=False),
            "disc_acc": BinaryAccuracy(validate_args=False),  # over all real tokens
            "disc_f1": BinaryF1Score(validate_args=False),  # of "replaced": the rarer, harder class
        })

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) ids -> (B, T) logits that each token was replaced."""
        return self.head(self.trunk(input_ids, attention_mask))

    def replace(self, masked_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor):
        """Run the generator; returns its logits and NLL at the masked positions, the discriminator's
        input (the original tokens with generator samples at the masked positions) and the (B, T)
        replaced / not-replaced targets."""
        key_padding_mask = attention_mask.bool()
        hidden = self.generator(self.trunk.stem(masked_ids), key_padding_mask)
        logits, nll, selected = masked_token_nll(self.generator_head, hidden, labels)
        with torch.no_grad():  # sampling is not differentiable: no detection gradient reaches the generator
            gumbel = -torch.log(-torch.log(torch.rand_like(logits).clamp(1e-9, 1.0)))
            sampled = (logits + gumbel).argmax(-1)
        original = torch.where(selected, labels, masked_ids)
        corrupted = original.clone()
        corrupted[selected] = sampled
        return logits, nll, selected, corrupted, corrupted != original

    def step(self, batch: dict, stage: str) -> torch.Tensor:
        labels, attention_mask = batch["labels"], batch["attention_mask"]
        gen_logits, nll, selected, corrupted, replaced = self.replace(batch["input_ids"], labels, attention_mask)
        real = attention_mask.bool()  # padding is neither original nor replaced
        disc_logits, replaced = self(corrupted, attention_mask).float()[real], replaced[real]
        gen_loss = nll.mean()
        disc_loss = F.binary_cross_entropy_with_logits(disc_logits, replaced.float())
        metrics = self.metrics(stage)
        metrics["ppl"].update(nll)
        metrics["gen_acc"].update(gen_logits.argmax(-1), labels[selected])
        for name in ("disc_acc", "disc_f1"):
            metrics[name].update(disc_logits.sigmoid(), replaced.long())
        self.log(f"{stage}/gen_loss", gen_loss, on_step=False, on_epoch=True, batch_size=len(labels))
        self.log(f"{stage}/disc_loss", disc_loss, on_step=False, on_epoch=True, batch_size=len(labels))
        return gen_loss + self.discriminator_weight * disc_loss
