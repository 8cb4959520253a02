"""Multiple choice: one score per (context, candidate) pair from a pooled trunk vector, softmax over a row's
candidates."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric, Metric

from trunk.core.contract import TaskSpec
from trunk.models import Pooling, SequenceClassificationHead, Trunk, TrunkConfig, check_pooling
from trunk.tasks.objectives.base import Objective, cross_entropy, soft_cross_entropy


class MultipleChoice(Objective):
    """Pick the right candidate answer (SWAG, ARC, OpenBookQA): each candidate is encoded with the context,
    a head on its pooled vector gives one score, and cross-entropy runs over the row's candidates (rows may
    have different numbers of them). Metric: ``acc``. Predictions: ``{text, choices, answer, answer_index,
    probs}``.

    Args:
        pooling: ``cls`` (the first token), ``mean`` (average over real tokens), ``max`` (each channel's
            maximum over real tokens, as a CNN pools) or ``attention`` (a learned probe attends over them).
        head_dropout: dropout inside the head. label_smoothing: the share of each target's probability spread over the
        other candidates: a regulariser against over-confidence (0: none). pooler: a dense + tanh pooler before the
        output layer (false: the output layer reads the pooled vector); pooler_norm: the pooler's output normed with the
        trunk's norm (ModernBERT's head).
    """

    kind = "multiple_choice"

    def __init__(
        self, pooling: Pooling = "cls", head_dropout: float = 0.1, label_smoothing: float = 0.0, pooler: bool = True,
        pooler_norm: bool = False,
    ) -> None:
        super().__init__(pooling=pooling, head_dropout=head_dropout, label_smoothing=label_smoothing, pooler=pooler,
                         pooler_norm=pooler_norm)
        check_pooling(pooling)
        self.pooling, self.head_dropout, self.label_smoothing = pooling, head_dropout, label_smoothing
        self.pooler, self.pooler_norm = pooler, pooler_norm

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        self.head = SequenceClassificationHead.for_trunk(cfg, 1, self.pooling, self.head_dropout, self.pooler,
                                                         self.pooler_norm)

    def make_metrics(self, stage: str) -> dict[str, Metric]:
        return {"acc": MeanMetric()}

    def forward(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """(B, most candidates) scores; a row's missing candidates score -inf."""
        scores = self.head(self.encode(trunk, batch), batch.get("attention_mask")).squeeze(-1).float()  # (M,)
        counts = batch["choice_counts"].to(scores.device)
        width = int(counts.max())
        slots = torch.arange(width, device=scores.device)
        present = slots[None, :] < counts[:, None]  # (B, width)
        out = torch.full(present.shape, float("-inf"), device=scores.device)
        return out.masked_scatter(present, scores)  # row-major: each row's candidates in order

    def loss(self, trunk: Trunk, batch: dict, stage: str, output=None) -> torch.Tensor:
        scores, labels = self(trunk, batch) if output is None else output, batch["labels"]
        self.metrics(stage)["acc"].update((scores.argmax(-1) == labels).float())
        return cross_entropy(scores, labels, self.label_smoothing)

    def soft_targets(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        return self(trunk, batch).softmax(-1)  # (B, most candidates); a row's missing ones 0

    def distill_loss(self, output, targets: torch.Tensor, batch: dict, temperature: float) -> torch.Tensor:
        width = output.shape[-1]  # cached answers may be padded to another batch's most candidates (with 0s)
        targets = F.pad(targets[:, :width], (0, max(0, width - targets.shape[-1])))
        return soft_cross_entropy(output, targets, temperature)

    def predict(self, trunk: Trunk, batch: dict) -> list[dict]:
        records = []
        for i, (row, choices) in enumerate(zip(self(trunk, batch).softmax(-1).tolist(), batch["choices"])):
            probs = row[: len(choices)]
            best = max(range(len(probs)), key=probs.__getitem__)
            records.append(
                {
                    "text": batch["text"][i],
                    "choices": list(choices),
                    "answer": choices[best],
                    "answer_index": best,
                    "probs": probs,
                }
            )
        return records

    def samples(self, trunk: Trunk, batch: dict) -> list[dict]:
        return [
            {
                "text": r["text"],
                "gold": r["choices"][gold],
                "predicted": r["answer"],
                "probability": round(r["probs"][r["answer_index"]], 4),
            }
            for r, gold in zip(self.predict(trunk, batch), batch["labels"].tolist())
        ]
