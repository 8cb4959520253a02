"""Never lose work, never train on garbage.

* ``AtomicCheckpointIO``: every checkpoint is written to a temporary file beside its destination,
  flushed, then renamed over it, with a digest of its tensors that every load verifies.
* ``FaultTolerance`` (on in every ``trunk fit``, options under ``fault_tolerance.``):
  - a checkpoint (``last.ckpt``) at least every ``save_every_minutes`` of training, every
    ``save_every_steps`` steps if set, and at the last step;
  - SIGTERM (a scheduler's preemption) and SIGINT (Ctrl+C) finish the current step, save, print the
    command that resumes, and exit with 128 + the signal number (143, 130); a second Ctrl+C stops at once.
    During a validation they stop after the current batch and save the step before it (the resumed run
    validates again, whole, then trains on); during the
    sanity check, validate, test or predict they stop after the current batch (nothing to save).
    SIGUSR1 (SLURM's notice of preemption) does the same, then requeues the job (``scontrol requeue``);
    the requeued job's `trunk fit` resumes from ``last.ckpt`` by itself (exit 138);
  - a non-finite loss or gradient is never applied: the run stops with an error naming the step and
    the task (or skips up to ``skip_bad_batches`` such steps), so no checkpoint ever holds NaN weights;
  - a run folder moved before its resume keeps its best score and best checkpoint (the saved paths follow it);
  - the random state (dropout) is saved and restored, so a resumed run continues exactly as the
    uninterrupted one would have (the training stream skips the batches already trained on: see
    ``MultiTaskStream``).
"""

from __future__ import annotations

import copy
import math
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_warn

from trunk.core.atomic import atomic_write
from trunk.core.checkpoint import DIGEST_KEY, load_checkpoint, stored_digest
from trunk.core.interrupts import interrupted

# SIGUSR1: SLURM's advance notice of preemption (#SBATCH --signal=USR1@90): save, requeue the job, stop
EXIT_CODES = {
    sig: 128 + sig for sig in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR1", None)) if sig is not None
}


def pass_on(signum: int, frame, handler) -> None:
    """A signal to the handler it would have reached: nothing for SIG_IGN, the default action for SIG_DFL (delivered
    again with it: SIGTERM ends the process), else the function (Python's SIGINT handler raises KeyboardInterrupt)."""
    if handler is signal.SIG_IGN:
        return
    if handler in (signal.SIG_DFL, None):
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    handler(signum, frame)


def without_option(args: list[str], option: str) -> list[str]:
    """A command line without one option, written either ``--option=value`` or ``--option value``."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            kept.append(arg)
    return kept


def slurm_job_id() -> str | None:
    """The SLURM job this process runs in (an array task as <array job>_<task>), or None."""
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def last_checkpoints(root: str | Path, stages: set[str] | frozenset[str] = frozenset()) -> list[Path]:
    """The ``last.ckpt`` files of the run in folder ``root``, oldest first; a joint run's ``--finetune_each`` stages
    (``stages``: its task names) write theirs in <root>/<task>, newer than the joint run's: they are left out, so
    resuming a joint run stopped in a stage resumes the joint run (whose end then runs the stages again)."""
    root = Path(root)
    return sorted((path for path in root.rglob("last.ckpt") if path.relative_to(root).parts[0] not in stages),
                  key=lambda path: path.stat().st_mtime)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints that are never half-written and always verified when read (with ``weights_only=True``).

    ``read_path`` / ``read``: a checkpoint already read (and verified) by ``trunk.assembly.run.resolve``;
    Lightning's restore of that path takes these contents instead of reading the file a second time."""

    def __init__(self, read_path: str | Path | None = None, read: dict | None = None) -> None:
        super().__init__()
        self._read = (Path(read_path).resolve(), read) if read_path is not None and read is not None else None

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        checkpoint = {**checkpoint, DIGEST_KEY: stored_digest(checkpoint)}
        atomic_write(path, lambda tmp: torch.save(checkpoint, tmp))

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        if self._read is not None and Path(path).resolve() == self._read[0]:
            contents, self._read = self._read[1], None  # once: a later load (another fit) reads the file as it is then
            return contents
        return load_checkpoint(path)


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient: the run stops instead of training on garbage."""


def _followed(path: str, old: Path, new: Path) -> str:
    """``path``, a file that was in the folder ``old``, in ``new`` where it is now (unchanged if it is not there)."""
    if not path or not Path(path).is_relative_to(old):
        return path
    there = new / Path(path).relative_to(old)
    return str(there) if there.exists() else path


class FaultTolerance(Callback):
    """Bounded loss on a kill, a clean stop on preemption, no NaN training (see the module docstring).

    Args:
        save_every_minutes: write ``last.ckpt`` when this much training time has passed since the last
            save (0: off). A SIGKILL loses at most this much work.
        save_every_steps: also every N optimizer steps (0: off).
        skip_bad_batches: drop the update of up to this many steps whose loss or gradients are not
            finite, with a warning each, before stopping (0: stop at the first).
        ddp_timeout_minutes: under DDP (``strategy: ddp*``), how long a process waits for the others
            in a collective before every process stops with an error (instead of hanging).
    """

    def __init__(self, save_every_minutes: float = 10.0, save_every_steps: int = 0, skip_bad_batches: int = 0,
                 ddp_timeout_minutes: float = 30.0) -> None:
        if min(save_every_minutes, save_every_steps, skip_bad_batches) < 0 or ddp_timeout_minutes <= 0:
            raise ValueError("fault_tolerance options must be >= 0 (0 turns one off); ddp_timeout_minutes must be > 0.")
        self.ddp_timeout_minutes = ddp_timeout_minutes  # read by the CLI when it builds the DDP strategy
        self.save_every_minutes, self.save_every_steps, self.skip_bad_batches = (
            save_every_minutes,
            save_every_steps,
            skip_bad_batches,
        )
        self.skipped = 0
        self._signal: int | None = None
        self._outer_handlers: dict = {}  # the handlers this run's replaced, put back when a stage ends
        self._handling = False
        self._last_save = (time.monotonic(), -1)  # (when, global step)
        self._loss: torch.Tensor | None = None
        self._task: str | None = None
        self._before_validation: tuple[dict, dict] | None = (
            None  # (loops, random state) at the start of fit's validation
        )
        self._saving_mid_validation = False
        # the run's own command-line arguments, set by the CLI: a script that runs the CLI (a benchmark, a
        # notebook) has argv of its own, which would make a resume command that is not this run's
        self.command: list[str] | None = None

    # -- where ---------------------------------------------------------------------------------------
    @staticmethod
    def dirpath(trainer: L.Trainer) -> Path:
        callback = trainer.checkpoint_callback
        if callback is not None and callback.dirpath:
            return Path(callback.dirpath)
        return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"

    def last_path(self, trainer: L.Trainer) -> Path:
        return self.dirpath(trainer) / "last.ckpt"

    def save(self, trainer: L.Trainer) -> None:
        """Write ``last.ckpt`` (every process takes part; the first writes): the full training state.
        Nothing when the run turned checkpointing off (``trainer.enable_checkpointing: false``) or is Lightning's dry
        run (``trainer.fast_dev_run``, which suppresses checkpointing)."""
        if trainer.checkpoint_callback is None or trainer.fast_dev_run:
            return
        path = self.last_path(trainer)
        trainer.save_checkpoint(path, weights_only=False)
        self._last_save = (time.monotonic(), trainer.global_step)
        callback = trainer.checkpoint_callback
        if callback is not None and callback.save_last and Path(callback.dirpath or "") == path.parent:
            callback.last_model_path = str(path)  # the same file: it replaces it, rather than writing last-v1.ckpt

    # -- signals ---------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # From the start of every stage (the sanity check, validate, test, predict): Lightning's own SIGTERM
        # handler, registered after this, calls this one too
        self._signal = None
        if interrupted():  # a Ctrl+C before this handler took over, which a library swallowed as it loaded
            if trainer.is_global_zero:
                stage = getattr(stage, "value", stage)  # TrainerFn.FITTING -> fit
                print(f"Stopped before {stage} began; nothing to save.", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_CODES[signal.SIGINT])
        self._install_handlers()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._signal, self._last_save = None, (time.monotonic(), trainer.global_step)
        self._install_handlers()  # alone while training: Lightning's would stop the step loop on its own terms

    def _install_handlers(self) -> None:
        """This run's handler for its signals; the ones it replaces are remembered when a stage begins (where one of
        them is this run's own, left by Lightning, the one that it had replaced)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if not self._handling:
            for sig in EXIT_CODES:
                found = signal.getsignal(sig)
                if found == self._on_signal:  # this run's own, left by Lightning: keep the one it had replaced
                    self._outer_handlers.setdefault(sig, signal.SIG_DFL)
                else:
                    self._outer_handlers[sig] = found
        for sig in EXIT_CODES:
            signal.signal(sig, self._on_signal)
        self._handling = True

    def _on_signal(self, signum: int, frame) -> None:
        if not self._handling:  # the stage is over; Lightning's teardown put this handler back after the stage's own
            return pass_on(signum, frame, self._outer_handlers.get(signum, signal.SIG_DFL))
        if self._signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl+C: stop now, saving nothing more
        self._signal = signum
        print(f"\nReceived {signal.Signals(signum).name}: saving a checkpoint after this step, then stopping "
              "(Ctrl+C again stops at once).", file=sys.stderr, flush=True)

    def _restore_handlers(self) -> None:
        """The handlers from before the stage. Lightning's teardown, which may come after this, puts back the ones
        it found, this run's: they pass a signal on to these (``_on_signal``), and the next stage's end or a script's
        next run sets them right."""
        if threading.current_thread() is threading.main_thread():
            for sig, handler in self._outer_handlers.items():
                signal.signal(sig, handler)
        self._handling = False

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._last_save[1] != trainer.global_step:
            self.save(trainer)  # the final steps are never lost

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore_handlers()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore_handlers()

    # -- a signal while evaluating: stop within a batch, not after the whole pass -------------------------
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Before a validation inside fit: the loops' and the random state as a checkpoint of the step just trained
        holds them, for a save that a signal may ask for halfway through this validation."""
        self._before_validation = None
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._before_validation = (copy.deepcopy(trainer.fit_loop.state_dict()), self._random_state())

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._stop_if_signalled(trainer, pl_module)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._stop_if_signalled(trainer, pl_module)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._stop_if_signalled(trainer, pl_module)

    def _stop_if_signalled(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        flag = torch.tensor([float(self._signal or 0)], device=pl_module.device)
        if trainer.world_size > 1:
            flag = trainer.strategy.reduce(flag, reduce_op="max")  # every process stops at the same batch
        signum = int(flag[0])
        if not signum:
            return
        if self._before_validation is None:  # the sanity check, validate, test, predict: nothing to save
            if trainer.is_global_zero:
                print(f"Stopped during {trainer.state.stage}; nothing to save.", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_CODES.get(signum, 128 + signum))
        self._saving_mid_validation = True  # the checkpoint of the step before this validation (on_save_checkpoint)
        try:
            self.save(trainer)
        finally:
            self._saving_mid_validation = False
        self._stop(trainer, signum)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if self._saving_mid_validation and self._before_validation is not None:
            # as if saved at the end of the step, with the validation after it started and none of its batches done:
            # a resume runs that validation again, whole, then trains on. Saved as at the step's end alone, Lightning
            # takes the validation for done and skips it (the run's best score and checkpoint miss it); counted
            # half-done, it would resume it with metrics over its second half only.
            state = copy.deepcopy(self._before_validation[0])
            for counts in state.get("epoch_loop.val_loop.batch_progress", {}).values():
                if isinstance(counts, dict):  # total and current: one batch started, none processed
                    counts["ready"] = counts["started"] = counts["completed"] + 1
                    counts["processed"] = counts["completed"]
            checkpoint["loops"]["fit_loop"] = state

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """A run folder moved (or copied) before its resume: each ModelCheckpoint's saved state names the old folder,
        and Lightning drops its best score and top-k for a folder it no longer writes to, so the next validation would
        count as the best, however it scores. Resumed from a checkpoint in the folder it now writes to, the saved paths
        follow the files there."""
        resumed = Path(trainer.ckpt_path or "").resolve().parent
        for callback in trainer.checkpoint_callbacks:
            state = checkpoint.get("callbacks", {}).get(callback.state_key)
            here = getattr(callback, "dirpath", None)
            if not state or not state.get("dirpath") or not here or resumed != Path(here).resolve():
                continue
            old, new = Path(state["dirpath"]), Path(here)
            checkpoint["callbacks"][callback.state_key] = {
                **state,
                **{key: _followed(state[key], old, new)
                   for key in ("best_model_path", "kth_best_model_path", "last_model_path") if key in state},
                "best_k_models": {_followed(path, old, new): score
                                  for path, score in state.get("best_k_models", {}).items()},
                "dirpath": here,
            }

    # -- every step ----------------------------------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._task = batch.get("task") if isinstance(batch, dict) else None

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        """Drop (or refuse) an update computed from a non-finite loss or gradient, before it reaches the weights."""
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        # One multi-tensor pass: a gradient with a NaN or inf has a non-finite norm (1 ms a step for 5M
        # parameters, against 7 ms for an isfinite per tensor).
        finite = torch.stack(torch._foreach_norm(grads)).isfinite().all() if grads else torch.tensor(True)
        if self._loss is not None:
            finite = finite & torch.isfinite(self._loss).all().to(finite.device)
        bad = not trainer.strategy.reduce_boolean_decision(bool(finite), all=True)  # every process decides the same
        if not bad:
            return
        step, loss = trainer.global_step, float(self._loss) if self._loss is not None else math.nan
        where = f"step {step} (task '{self._task}', loss {loss})" if self._task else f"step {step} (loss {loss})"
        if self.skipped < self.skip_bad_batches:
            self.skipped += 1
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None
            rank_zero_warn(f"Non-finite loss or gradients at {where}: this step's update was dropped "
                           f"({self.skipped} of fault_tolerance.skip_bad_batches={self.skip_bad_batches}).")
            return
        last = self.last_path(trainer)
        resume = (f"The last checkpoint, {last} (step {self._last_save[1]}), holds finite weights." if last.is_file()
                  else "No checkpoint was written yet.")
        raise TrainingDiverged(
            f"Training stopped at {where}: the loss or its gradients are not finite (NaN or inf). The update was not "
            f"applied, and no checkpoint holds non-finite weights. {resume} Lower model.optimizer.lr, clip gradients "
            "(--trainer.gradient_clip_val=1.0), or let up to N such steps be skipped with "
            "--fault_tolerance.skip_bad_batches=N."
        )

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._last_save[1]:
            return  # no optimizer step since the last save (gradient accumulation)
        due = (self.save_every_minutes > 0 and time.monotonic() - self._last_save[0] >= 60 * self.save_every_minutes
               and trainer.is_global_zero)  # the first process's clock decides
        flags = torch.tensor([float(due), float(self._signal or 0)], device=pl_module.device)
        if trainer.world_size > 1:
            flags = trainer.strategy.reduce(flags, reduce_op="max")  # every process saves and stops together
        due, signum = bool(flags[0]), int(flags[1])
        if (
            due
            or signum
            or self._is_final_step(trainer)
            or (self.save_every_steps and step % self.save_every_steps == 0)
        ):
            self.save(trainer)
        if signum:
            self._stop(trainer, signum)

    @staticmethod
    def _is_final_step(trainer: L.Trainer) -> bool:
        """The run's last optimizer step (max_steps, or the last batch of the last epoch). Saved here, in the
        middle of the loop's bookkeeping like any step, rather than after the loop has closed the epoch:
        a run extended from it continues exactly (and keeps its epoch count)."""
        if 0 < trainer.max_steps <= trainer.global_step:
            return True
        max_epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else None
        return bool(max_epochs and trainer.current_epoch + 1 >= max_epochs and trainer.is_last_batch)

    def _stop(self, trainer: L.Trainer, signum: int) -> None:
        last = self.last_path(trainer)
        args = without_option(sys.argv[1:] if self.command is None else self.command, "--ckpt_path")
        args = args[1:] if args[:1] == ["fit"] else args  # the subcommand is the command's own
        if trainer.is_global_zero and trainer.checkpoint_callback is None:
            print(
                f"Stopped at step {trainer.global_step}; checkpointing is off, so nothing was saved.",
                file=sys.stderr,
                flush=True,
            )
        elif trainer.is_global_zero:
            print(
                f"Saved {last} at step {trainer.global_step}. Resume with:\n  trunk fit {shlex.join(args)} "
                f"--ckpt_path={last}",
                file=sys.stderr,
                flush=True,
            )
            if signum == getattr(signal, "SIGUSR1", None) and slurm_job_id():
                self._requeue(slurm_job_id())
        raise SystemExit(EXIT_CODES.get(signum, 128 + signum))

    @staticmethod
    def _requeue(job: str) -> None:
        """Put the SLURM job back in the queue; when it starts again, `trunk fit` resumes from last.ckpt by itself."""
        try:
            done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            print(
                f"Could not requeue SLURM job {job} ({err}): resubmit it with --ckpt_path last.",
                file=sys.stderr,
                flush=True,
            )
            return
        if done.returncode == 0:
            print(
                f"Requeued SLURM job {job}: it resumes from the checkpoint when it starts again.",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(
                f"`scontrol requeue {job}` failed ({done.stderr.strip()[:200]}): resubmit the job with --ckpt_path "
                "last.",
                file=sys.stderr,
                flush=True,
            )

    # -- random state: a resumed run draws the same dropout masks as the uninterrupted one ---------------
    def state_dict(self) -> dict:
        """Every process's random state (each draws its own dropout masks): gathered to the first, which writes
        the checkpoint; each process restores its own."""
        random_state = (
            self._before_validation[1]
            if self._saving_mid_validation and self._before_validation
            else self._random_state()
        )
        if (
            torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1
        ):
            ranks = [None] * torch.distributed.get_world_size()
            # every process saves (dump_checkpoint runs on each)
            torch.distributed.all_gather_object(ranks, random_state)
            return {**random_state, "ranks": ranks, "skipped": self.skipped}
        return {**random_state, "skipped": self.skipped}

    @staticmethod
    def _random_state() -> dict:
        state = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.skipped = state.get("skipped", 0)
        ranks = state.get("ranks")
        if ranks:
            rank = (
                torch.distributed.get_rank()
                if torch.distributed.is_available() and torch.distributed.is_initialized()
                else 0
            )
            if len(ranks) != (torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1):
                rank_zero_warn(
                    f"The checkpoint holds the random state of {len(ranks)} processes, and this run has another "
                    "number: it resumes from the same weights and data position, but draws other dropout masks than "
                    "the uninterrupted run would have."
                )
            state = {**state, **ranks[rank % len(ranks)]}
        if "torch" in state:
            torch.set_rng_state(state["torch"])
        if "python" in state:
            version, internal, gauss = state["python"]
            random.setstate((version, tuple(internal), gauss))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
