"""How long a run is, said before it starts: a ``max_steps`` that ``max_epochs`` cuts short, and a logging interval a
short run would never reach."""

from __future__ import annotations

import math

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

LOGS_PER_RUN = 10  # a short run logs its loss, rate and throughput at least this often


class RunLength(L.Callback):
    """Before training: warn when ``trainer.max_epochs`` stops the run before ``trainer.max_steps`` (a small file's
    epochs are short: 6 steps of the 20 asked), and lower ``trainer.log_every_n_steps`` for a run shorter than ten
    intervals or an epoch shorter than one, so ``metrics.csv`` holds its loss (one line says so)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        batches = self._batches_per_epoch(trainer) if stage == "fit" else None
        if not batches:
            return
        steps_per_epoch = max(batches // trainer.accumulate_grad_batches, 1)
        epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else math.inf
        by_epochs = epochs * steps_per_epoch
        steps = min(by_epochs, trainer.max_steps if trainer.max_steps > 0 else math.inf)
        if trainer.max_steps > 0 and by_epochs < trainer.max_steps:
            rank_zero_warn(
                f"trainer.max_steps={trainer.max_steps}, but trainer.max_epochs={trainer.max_epochs} epochs of "
                f"{steps_per_epoch} steps end the run at step {by_epochs}. Set --trainer.max_epochs=-1 to train "
                f"{trainer.max_steps} steps."
            )
        configured = trainer.log_every_n_steps
        every = max(1, int(min(configured, steps_per_epoch, steps // LOGS_PER_RUN)))  # inf // 10: inf
        if every < configured:
            trainer.log_every_n_steps = every
            rank_zero_info(f"Logging every {every} steps (not trainer.log_every_n_steps={configured}): the run takes "
                           f"{steps if steps < math.inf else 'unbounded'} steps of {steps_per_epoch} an epoch.")

    @staticmethod
    def _batches_per_epoch(trainer: L.Trainer) -> int | None:
        """Training batches an epoch as the datamodule draws them, within ``limit_train_batches`` (None: unknown, a
        stream without an epoch size, or a datamodule that is not Trunk's)."""
        count = getattr(trainer.datamodule, "steps_per_epoch", None)
        try:
            batches = count() if callable(count) else None
        except (TypeError, ValueError):
            return None
        limit = trainer.limit_train_batches
        if batches and limit is not None:
            batches = min(batches, limit) if isinstance(limit, int) else max(int(batches * limit), 1)
        return batches
