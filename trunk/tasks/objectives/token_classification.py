"""Token classification (named-entity recognition): a label per word, scored by entity spans."""

from __future__ import annotations

from typing import Literal

import torch
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy

from trunk.core.codec import IGNORE_INDEX
from trunk.core.contract import TaskSpec
from trunk.core.tagging import allowed_transitions, constrained_decode, parse_label_names, spans_from_tags
from trunk.models import TokenClassificationHead, Trunk, TrunkConfig
from trunk.models.trunk import norm_layer
from trunk.tasks.objectives.base import Objective, cross_entropy, soft_cross_entropy


class EntityF1(Metric):
    """Entity-level precision, recall and F1: a predicted entity counts only if its words and type
    both match a gold entity exactly (CoNLL's measure, as in conlleval and seqeval's default mode).

    ``update`` takes tag strings per sentence, in any scheme (see ``trunk/core/tagging.py`` for
    how ill-formed sequences are read). ``compute`` returns micro-averaged ``precision``,
    ``recall`` and ``f1``, and ``f1_<TYPE>`` per entity type. Counts are summed across processes.
    """

    full_state_update = False

    def __init__(self, entity_types: list[str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.entity_types = sorted(entity_types)
        self._index = {t: i for i, t in enumerate(self.entity_types)}
        for name in ("correct", "predicted", "gold"):  # per type
            self.add_state(name, torch.zeros(len(self.entity_types), dtype=torch.long), dist_reduce_fx="sum")

    def _count(self, spans, state: torch.Tensor) -> None:
        for span in spans:
            if span.type not in self._index:
                raise ValueError(f"Entity type {span.type!r} is not one of {self.entity_types}.")
            state[self._index[span.type]] += 1

    def update(self, predicted_tags: list[list[str]], gold_tags: list[list[str]]) -> None:
        for predicted, gold in zip(predicted_tags, gold_tags, strict=True):
            predicted_spans, gold_spans = set(spans_from_tags(predicted)), set(spans_from_tags(gold))
            self._count(predicted_spans, self.predicted)
            self._count(gold_spans, self.gold)
            self._count(predicted_spans & gold_spans, self.correct)

    def compute(self) -> dict[str, torch.Tensor]:
        def f1(correct, predicted, gold):
            precision = correct / predicted if predicted else 0.0
            recall = correct / gold if gold else 0.0
            return precision, recall, 2 * precision * recall / (precision + recall) if precision + recall else 0.0

        precision, recall, micro_f1 = f1(self.correct.sum().item(), self.predicted.sum().item(), self.gold.sum().item())
        result = {"precision": precision, "recall": recall, "f1": micro_f1}
        for i, entity_type in enumerate(self.entity_types):
            result[f"f1_{entity_type}"] = f1(self.correct[i].item(), self.predicted[i].item(), self.gold[i].item())[2]
        return {k: torch.tensor(v, dtype=torch.float32) for k, v in result.items()}


def per_word(values: torch.Tensor, word_starts: torch.Tensor) -> torch.Tensor:
    """(B, T, C) per sub-token -> (B, W, C) at each word's first sub-token; words without one (cut off) all 0."""
    gathered = values.gather(1, word_starts.clamp(min=0).unsqueeze(-1).expand(-1, -1, values.shape[-1]))
    return gathered.masked_fill((word_starts < 0).unsqueeze(-1), 0.0)


class TokenClassification(Objective):
    """Label every word (NER), from each word's first sub-token; data comes from ``TokenClassificationData``.

    Metrics: token accuracy (``acc``) in every stage; entity precision / recall / F1 (micro, the
    task's primary, and ``f1_<TYPE>`` per type) on validation and test. Prediction writes, per
    sentence, the words, their tags and the entities as ``{type, start, end, text}`` with ``end``
    the index of the entity's last word.

    Args:
        head_dropout: dropout before the classifier.
        decoding: ``constrained``: the most probable well-formed tag sequence (Viterbi over the
            scheme's allowed transitions, no learned parameters); ``argmax``: each word's most
            probable label on its own.
        outside_weight: the weight of the ``O`` label's words in the loss. Below 1 (0.3 to 0.5), the model marks
            entities more readily: for small sets with rare entities, where a model trained from scratch finds few
            of them (recall far below precision).
        label_smoothing: the share of each target's probability spread over the other labels: a regulariser against
        over-confidence (0: none).
        head_norm: a dense layer, the trunk's activation and its norm before the classifier (ModernBERT's token head,
            which ``trunk export --format hf`` then writes as ``ModernBertForTokenClassification``).
    """

    kind = "token_classification"
    primary = "f1"
    inference_options = ("decoding",)
    label_keys = ("head.classifier.weight", "head.classifier.bias")
    onnx_output = "logits"  # (batch, tokens, labels): read at each word's first piece; decoding stays outside the graph
    raw_input_key, targets_by_label = "words", True

    def __init__(self, head_dropout: float = 0.1, decoding: Literal["constrained", "argmax"] = "constrained",
                 outside_weight: float = 1.0, label_smoothing: float = 0.0, head_norm: bool = False) -> None:
        super().__init__(head_dropout=head_dropout, decoding=decoding, outside_weight=outside_weight,
                         label_smoothing=label_smoothing, head_norm=head_norm)
        self.head_norm = head_norm
        if decoding not in ("constrained", "argmax"):
            raise ValueError(f"decoding must be 'constrained' or 'argmax', got {decoding!r}.")
        if not 0 < outside_weight <= 1:
            raise ValueError(
                f"outside_weight must be in (0, 1], got {outside_weight}: it scales the loss of the O label's words."
            )
        self.head_dropout, self.decoding, self.outside_weight, self.label_smoothing = (
            head_dropout,
            decoding,
            outside_weight,
            label_smoothing,
        )

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        _, self.entity_types = parse_label_names(self.label_names)
        self.head = TokenClassificationHead(cfg.d_model, len(self.label_names), self.head_dropout, cfg.init_std,
                                            norm_layer(cfg) if self.head_norm else None, cfg.activation)
        self.transitions = allowed_transitions(self.label_names)
        self.outside = self.label_names.index("O")
        weight = torch.ones(len(self.label_names))
        weight[self.outside] = self.outside_weight
        self.register_buffer("label_weight", weight if self.outside_weight != 1.0 else None, persistent=False)

    def make_metrics(self, stage: str) -> dict[str, Metric]:
        metrics = {"acc": MulticlassAccuracy(len(self.label_names), average="micro", ignore_index=IGNORE_INDEX)}
        if stage != "train":  # entity F1 needs decoding: evaluation only
            metrics["entities"] = EntityF1(self.entity_types)
        return metrics

    def forward(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """(B, T, num_labels) logits for every sub-token."""
        return self.head(self.encode(trunk, batch))

    def soft_targets(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """(B, words, labels): each word's label probabilities at its first sub-token, so a student of another
        tokenizer reads them word by word; words the teacher's length cut off have none (all 0)."""
        return per_word(self(trunk, batch).float().softmax(-1), batch["word_starts"])

    def distill_loss(self, output, targets: torch.Tensor, batch: dict, temperature: float) -> torch.Tensor:
        words = min(targets.shape[1], batch["word_starts"].shape[1])
        logits = per_word(output, batch["word_starts"])[:, :words]
        targets = targets[:, :words].to(logits.device)
        kept = (batch["word_starts"][:, :words] >= 0) & (targets.sum(-1) > 0)  # words both sides read
        return soft_cross_entropy(logits[kept], targets[kept], temperature)

    def decode(self, logits: torch.Tensor, word_starts: torch.Tensor, num_words: torch.Tensor) -> torch.Tensor:
        """Sub-token logits -> (B, W) label ids per word, read at each word's first sub-token.
        Words with no sub-token (truncated by max_length) are labelled O."""
        scores = (
            logits.float()
            .log_softmax(-1)
            .gather(1, word_starts.clamp(min=0).unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        )
        only_outside = torch.full_like(scores[0, 0], -1e4)
        only_outside[self.outside] = 0.0
        scores = torch.where((word_starts < 0).unsqueeze(-1), only_outside, scores)
        if self.decoding == "argmax":
            return scores.argmax(-1)
        return constrained_decode(scores, num_words, self.transitions)

    def tags(self, label_ids: torch.Tensor, num_words: torch.Tensor) -> list[list[str]]:
        return [[self.label_names[i] for i in row[:n]] for row, n in zip(label_ids.tolist(), num_words.tolist())]

    def loss(self, trunk: Trunk, batch: dict, stage: str, output=None) -> torch.Tensor:
        logits = self(trunk, batch) if output is None else output
        labels = batch["labels"]
        metrics = self.metrics(stage)
        metrics["acc"].update(logits.argmax(-1).flatten(), labels.flatten())
        if "entities" in metrics:
            predicted = self.decode(logits, batch["word_starts"], batch["num_words"])
            metrics["entities"].update(
                self.tags(predicted, batch["num_words"]), self.tags(batch["word_labels"], batch["num_words"])
            )
        return cross_entropy(logits, labels, self.label_smoothing, self.label_weight)

    def samples(self, trunk: Trunk, batch: dict) -> list[dict]:
        """The sentence with its gold and its predicted entities marked ``[PER Anna Petrova]``."""
        records = []
        for record, gold_ids, n in zip(
            self.predict(trunk, batch), batch["word_labels"].tolist(), batch["num_words"].tolist()
        ):
            gold = spans_from_tags([self.label_names[i] for i in gold_ids[:n]])
            predicted = spans_from_tags(record["tags"])
            records.append(
                {
                    "text": " ".join(record["words"]),
                    "gold": mark_entities(record["words"], gold),
                    "predicted": mark_entities(record["words"], predicted),
                    "correct": set(gold) == set(predicted),
                }
            )
        return records

    def records(self, batch: dict, logits: torch.Tensor) -> list[dict]:
        tags = self.tags(self.decode(logits, batch["word_starts"], batch["num_words"]), batch["num_words"])
        records = []
        for words, sentence_tags in zip(batch["words"], tags):
            entities = [{"type": s.type, "start": s.start, "end": s.end, "text": " ".join(words[s.start : s.end + 1])}
                        for s in spans_from_tags(sentence_tags)]
            records.append({"words": list(words), "tags": sentence_tags, "entities": entities})
        return records


def mark_entities(words: list[str], spans) -> str:
    """Words with each entity bracketed and typed: ``[PER Anna Petrova] visited [LOC Oslo]``."""
    out, starts, ends = [], {s.start: s for s in spans}, {s.end for s in spans}
    for i, word in enumerate(words):
        out.append(f"[{starts[i].type} {word}" if i in starts else word)
        if i in ends:
            out[-1] += "]"
    return " ".join(out)
