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


class SignalDuringValidation(Callback):
    """A validation that takes ``seconds`` per batch (a long one, for real), and a signal to this process at its
    ``batch``-th batch; the time of the signal goes to ``stamp`` (a file), for the test to measure the stop."""

    def __init__(self, stamp: str, batch: int = 2, seconds: float = 1.0, signum: int = int(signal.SIGTERM),
                 stage: str = "validate") -> None:
        self.stamp, self.batch, self.seconds, self.signum, self.stage = stamp, batch, seconds, signum, stage

    def _maybe(self, trainer, batch_idx: int) -> None:
        import time

        time.sleep(self.seconds)
        if batch_idx == self.batch and not os.path.exists(self.stamp):
            with open(self.stamp, "w") as f:
                f.write(f"{time.time()} {trainer.global_step}")
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.stage == ("sanity" if trainer.sanity_checking else "validate"):
            self._maybe(trainer, batch_idx)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.stage == "test":
            self._maybe(trainer, batch_idx)
