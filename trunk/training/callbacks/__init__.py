"""Callbacks, one per file. ``run_callbacks`` lists the ones every run of the ``trunk`` command gets (unless
the config gives its own of the same kind, or switches the feature off); ``TrunkModule.configure_callbacks``
adds the model's own (gradual unfreezing, the trunk export of pretraining); ``FaultTolerance`` and
``PredictionWriter`` are options of the command (``fault_tolerance.*``, ``predictions.*``)."""

from __future__ import annotations

from lightning.pytorch.callbacks import LearningRateMonitor, ModelSummary, ProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

from trunk.training.callbacks.checkpoint import TrunkCheckpoint
from trunk.training.callbacks.config import LogConfigCallback
from trunk.training.callbacks.export import ExportTrunk
from trunk.training.callbacks.norms import Norms
from trunk.training.callbacks.predictions import PredictionWriter
from trunk.training.callbacks.progress import Throttle, ThrottledBar, TrunkProgressBar, TrunkTQDMProgressBar
from trunk.training.callbacks.run_length import RunLength
from trunk.training.callbacks.samples import PredictionSamples
from trunk.training.callbacks.summary import TrunkModelSummary
from trunk.training.callbacks.throughput import Throughput


def check_monitors(callbacks: list, tasks: list[str]) -> None:
    """A checkpoint or early stopping that monitors a metric the run never logs fails at the start, not after an epoch:
    metrics are ``<stage>/<task>/<metric>`` of the run's ``tasks``, or a stage's score."""
    for callback in callbacks:
        monitor = getattr(callback, "monitor", None)
        if not monitor:
            continue
        parts = monitor.split("/")
        if len(parts) == 3 and parts[1] not in tasks:
            raise ValueError(f"{type(callback).__name__} monitors {monitor!r}, but this run has no task {parts[1]!r}; "
                             f"its tasks are {sorted(tasks)}. Monitor val/<task>/<metric> or val/score.")
        if len(parts) < 3 and monitor not in ("val/score", "test/score", "train/loss"):
            raise ValueError(f"{type(callback).__name__} monitors {monitor!r}: metrics are named "
                             f"<stage>/<task>/<metric> (e.g. val/{tasks[0]}/acc) or val/score (the mean of every "
                             "task's primary metric).")


def run_callbacks(trainer_options: dict, given: list) -> list:
    """The callbacks a run gets beside the ``given`` ones (the config's): what the run's length means (``RunLength``),
    a model summary and a progress bar where those are on; with a logger, learning rates per optimizer group,
    throughput and validation prediction samples. A kind the config already has is not added twice."""
    def missing(kind: type) -> bool:
        return not any(isinstance(c, kind) for c in given)

    added = [RunLength()] if missing(RunLength) else []
    if trainer_options.get("enable_model_summary", True) is not False and missing(ModelSummary):
        added.append(TrunkModelSummary())
    if trainer_options.get("enable_progress_bar", True) is not False and missing(ProgressBar):
        added.append(TrunkProgressBar() if _RICH_AVAILABLE else TrunkTQDMProgressBar())
    if trainer_options.get("logger") is not False and trainer_options.get("logger") != []:
        if missing(LearningRateMonitor):
            added.append(LearningRateMonitor(logging_interval="step"))  # per optimizer group, by name
        if missing(Throughput):
            added.append(Throughput())
        if missing(PredictionSamples):
            added.append(PredictionSamples())
    return added


__all__ = [
    "check_monitors",
    "ExportTrunk",
    "LogConfigCallback",
    "TrunkCheckpoint",
    "Norms",
    "PredictionSamples",
    "PredictionWriter",
    "RunLength",
    "Throttle",
    "ThrottledBar",
    "Throughput",
    "TrunkModelSummary",
    "TrunkProgressBar",
    "TrunkTQDMProgressBar",
    "run_callbacks",
]
