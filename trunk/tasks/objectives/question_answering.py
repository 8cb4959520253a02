"""Extractive question answering: the answer's start and end token in the context, chosen across a question's
windows."""

from __future__ import annotations

import collections
import re
import string

import torch
from torchmetrics import MeanMetric, Metric

from trunk.core.codec import IGNORE_INDEX
from trunk.core.contract import TaskSpec
from trunk.models import SpanHead, TokenClassificationHead, Trunk, TrunkConfig
from trunk.models.trunk import norm_layer
from trunk.tasks.objectives.base import Objective, cross_entropy, soft_cross_entropy


class ExtractiveQuestionAnswering(Objective):
    """Find the answer to a question as a span of its context (SQuAD): a linear layer gives every token a start
    and an end score; the answer is the span (start <= end, inside the context, at most ``max_answer_length``
    tokens) with the highest start + end score over all of the question's windows. With
    ``allow_unanswerable`` (SQuAD 2.0), "no answer" ([CLS]'s start + end score, the lowest over the windows)
    wins when it scores higher than the best span. Metrics, with SQuAD's normalisation (lower case, no
    punctuation or articles, single spaces), each the best over the gold answers: ``exact_match`` and ``f1``
    (token overlap), in [0, 1]. Predictions: ``{id, text (the question), answer, score}``.

    Args:
        max_answer_length: the longest answer, in tokens. allow_unanswerable: predict "no answer" when it scores higher
        than every span. label_smoothing: the share of each target's probability spread over the other tokens of the
        window (start and end alike): a regulariser against over-confidence (0: none). head_norm: a dense layer, the
        trunk's activation and its norm before the span scores (ModernBERT's head, which ``trunk export --format hf``
        then writes as ``ModernBertForQuestionAnswering``).
    """

    kind = "extractive_qa"
    primary = "f1"
    inference_options = ("max_answer_length", "allow_unanswerable")

    def __init__(
        self, max_answer_length: int = 30, allow_unanswerable: bool = False, label_smoothing: float = 0.0,
        head_norm: bool = False,
    ) -> None:
        super().__init__(max_answer_length=max_answer_length, allow_unanswerable=allow_unanswerable,
                         label_smoothing=label_smoothing, head_norm=head_norm)
        self.head_norm = head_norm
        if max_answer_length < 1:
            raise ValueError(f"max_answer_length must be >= 1 (tokens), got {max_answer_length}.")
        self.max_answer_length, self.allow_unanswerable, self.label_smoothing = (
            max_answer_length,
            allow_unanswerable,
            label_smoothing,
        )

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        # with head_norm, a token classifier of two labels (start, end) with its dense layer and norm before
        self.head = (TokenClassificationHead(cfg.d_model, 2, 0.0, cfg.init_std, norm_layer(cfg), cfg.activation)
                     if self.head_norm else SpanHead(cfg.d_model, cfg.init_std))

    def make_metrics(self, stage: str) -> dict[str, Metric]:
        return {"exact_match": MeanMetric(), "f1": MeanMetric()}

    targets_per_row = False  # one answer per window: a row's windows follow the batch's max_length and stride

    def soft_targets(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        return torch.stack(self(trunk, batch), 1).softmax(-1)  # (windows, 2, T): where each answer starts and ends

    def distill_loss(self, output, targets: torch.Tensor, batch: dict, temperature: float) -> torch.Tensor:
        return soft_cross_entropy(torch.stack(output, 1), targets, temperature)

    def forward(self, trunk: Trunk, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end scores, (M windows, T) each; padding scores -inf."""
        logits = self.head(self.encode(trunk, batch)).float()
        padding = batch["attention_mask"] == 0
        start, end = (x.squeeze(-1).masked_fill(padding, float("-inf")) for x in logits.split(1, dim=-1))
        return start, end

    def loss(self, trunk: Trunk, batch: dict, stage: str, output=None) -> torch.Tensor:
        start, end = self(trunk, batch) if output is None else output
        if stage != "train":
            for record, gold in zip(self.decode(batch, start, end), batch["answers"]):
                em, f1 = best_scores(record["answer"], gold)
                self.metrics(stage)["exact_match"].update(em)
                self.metrics(stage)["f1"].update(f1)
        targets = batch["start_positions"], batch["end_positions"]
        if (targets[0] == IGNORE_INDEX).all():  # nothing to learn in this batch (misaligned answers only)
            return start.new_zeros(()) + 0.0 * sum(p.sum() for p in self.head.parameters())
        return (
            cross_entropy(start, targets[0], self.label_smoothing)
            + cross_entropy(end, targets[1], self.label_smoothing)
        ) / 2

    @torch.no_grad()
    def decode(self, batch: dict, start: torch.Tensor, end: torch.Tensor) -> list[dict]:
        """Each question's best answer over its windows."""
        in_context = batch["span_starts"] >= 0  # (M, T)
        length = start.shape[1]
        i, j = torch.arange(length, device=start.device)[:, None], torch.arange(length, device=start.device)[None, :]
        allowed = (j >= i) & (j - i < self.max_answer_length)  # (T, T)
        scores = start[:, :, None] + end[:, None, :]  # (M, T, T)
        scores = scores.masked_fill(~(allowed[None] & in_context[:, :, None] & in_context[:, None, :]), float("-inf"))
        best, flat = scores.flatten(1).max(-1)  # each window's best span
        null = start[:, 0] + end[:, 0]
        records, first = [], 0
        for q, count in enumerate(batch["window_counts"].tolist()):
            window = first + int(best[first : first + count].argmax())
            answer, score = "", float(best[window])
            if score > float("-inf"):
                a, b = divmod(int(flat[window]), length)
                answer = batch["context"][q][int(batch["span_starts"][window, a]) : int(batch["span_ends"][window, b])]
            no_answer = float(null[first : first + count].min())
            if self.allow_unanswerable and no_answer > score:
                answer, score = "", no_answer
            records.append({"id": batch["id"][q], "text": batch["text"][q], "answer": answer, "score": score})
            first += count
        return records

    def predict(self, trunk: Trunk, batch: dict) -> list[dict]:
        return self.decode(batch, *self(trunk, batch))

    def samples(self, trunk: Trunk, batch: dict) -> list[dict]:
        return [{"text": r["text"], "gold": " | ".join(gold), "predicted": r["answer"]}
                for r, gold in zip(self.predict(trunk, batch), batch["answers"])]


# SQuAD's evaluation script (v1.1 and v2.0): the answer normalisation, exact match and token F1
def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    predicted, truth = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not truth:  # v2.0: no answer is right only against no answer
        return float(predicted == truth)
    same = sum((collections.Counter(predicted) & collections.Counter(truth)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(truth)
    return 2 * precision * recall / (precision + recall)


def best_scores(prediction: str, golds: list[str]) -> tuple[float, float]:
    """(exact match, F1), each the best over the gold answers; no gold answer is the answer "" (SQuAD 2.0)."""
    golds = golds or [""]
    return (max(float(normalize_answer(prediction) == normalize_answer(g)) for g in golds),
            max(token_f1(prediction, g) for g in golds))
