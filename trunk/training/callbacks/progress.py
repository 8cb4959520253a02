"""The CLI's progress bars, redrawn at most twice a second (every redraw cost 6-8% of a small model's step)."""

from __future__ import annotations

import time

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


class Throttle:
    """Says when a progress display is due: at most every ``interval`` seconds, and at the last batch."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self._drawn = 0.0

    def due(self, batch_idx: int, total: float) -> bool:
        now = time.monotonic()
        if now - self._drawn < self.interval and batch_idx + 1 != total:
            return False
        self._drawn = now
        return True


class ThrottledBar:
    """Redraws a Lightning progress bar at most every ``interval`` seconds and at the last batch of each
    epoch. Redrawn after every step, the rich bar cost 8% of a training step and the tqdm bar (which
    also formats the logged metrics every step) 6% (width 256, 2 CPU cores: ``benchmarks/loop_overhead.py``).
    The bars show absolute positions, so a skipped draw loses nothing."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__()
        self.throttle = Throttle(interval)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.throttle.due(batch_idx, self.total_train_batches):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.throttle.due(batch_idx, self.total_val_batches_current_dataloader):
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def get_metrics(self, trainer, pl_module) -> dict:
        # Lightning's rich bar formats every number as a metric (".3f"): the run's version read "v_num: 0.000".
        metrics = super().get_metrics(trainer, pl_module)
        if isinstance(metrics.get("v_num"), int):
            metrics["v_num"] = str(metrics["v_num"])
        return metrics


class TrunkProgressBar(ThrottledBar, RichProgressBar):
    """Lightning's rich bar, throttled: the CLI's bar where rich is installed and the trainer is given no other."""


class TrunkTQDMProgressBar(ThrottledBar, TQDMProgressBar):
    """Lightning's tqdm bar, throttled: the CLI's bar where rich is not installed."""
