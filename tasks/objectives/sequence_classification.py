"""Sequence classification: one label per text (or text pair) from a pooled trunk vector."""

from __future__ import annotations

from trunk.tasks.objectives.classification import Classification


class SequenceClassification(Classification):
    """Classify a sequence from its [CLS] vector or the mean of its token vectors.

    Metrics: accuracy (``acc``, the task's primary) and macro-F1 (``f1``). Predictions:
    ``{text, label, probs}`` per example. Label names come from the task's data.

    Args:
        pooling: ``cls`` (the first token) or ``mean`` (average over real tokens).
        head_dropout: dropout inside the classification head.
    """

    kind = "sequence_classification"
