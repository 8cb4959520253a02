"""Faults caused for real inside a run (importable by `trunk fit` subprocesses: tests/ is on PYTHONPATH)."""

import os
import signal

from lightning.pytorch.callbacks import Callback


class SignalAt(Callback):
    """Send this process a signal (SIGKILL by default) once ``step`` optimizer steps are done."""

    def __init__(self, step: int, signum: int = int(signal.SIGKILL)) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.is_global_zero:
            os.kill(os.getpid(), self.signum)


class NaNGradientAt(Callback):
    """Make one gradient NaN in the backward pass of optimizer step ``step`` (a bad batch, caused for real)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_after_backward(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step:
            next(p for p in pl_module.parameters() if p.grad is not None).grad.view(-1)[0] = float("nan")


class StallAt(Callback):
    """The process of rank ``rank`` stops responding (sleeps) once ``step`` optimizer steps are done."""

    def __init__(self, step: int, rank: int = 1, seconds: float = 600.0) -> None:
        self.step, self.rank, self.seconds = step, rank, seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            import time

            time.sleep(self.seconds)
