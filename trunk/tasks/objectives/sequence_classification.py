"""Sequence classification: one label per text (or text pair) from a pooled trunk vector."""

from __future__ import annotations

from trunk.tasks.objectives.classification import Classification


class SequenceClassification(Classification):
    """Classify a sequence from its [CLS] vector or the mean of its token vectors.

    Metrics: accuracy (``acc``, the primary unless ``primary_metric`` says otherwise), macro-F1 (``f1_macro``),
    Matthews correlation (``mcc``) and, with ``positive_label``, that label's F1 (``f1_positive``). Predictions:
    ``{text, label, probs}`` per example. Label names come from the task's data.

    Args:
        pooling: ``cls`` (the first token), ``mean`` (average over real tokens), ``max`` (each channel's
            maximum over real tokens, as a CNN pools) or ``attention`` (a learned probe attends over them).
        head_dropout: dropout inside the classification head. primary_metric: the metric that stands for the task in
        ``val/score``: acc, f1_macro, mcc or f1_positive. positive_label: the label whose F1 is logged as
        ``f1_positive``. class_weights: ``balanced`` (by the training split's label counts) or one weight per label, for
        imbalanced labels. label_smoothing: the share of each target's probability spread over the other labels (0:
        none). pooler: a dense + tanh pooler before the output layer (false: the output layer reads the pooled vector).
    """

    kind = "sequence_classification"
