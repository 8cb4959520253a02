"""The pretrained-trunk directory written at the end of pretraining."""

from __future__ import annotations

import shutil
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from trunk.formats.artifacts import log_trunk_artifact
from trunk.formats.trunk_dir import check_writable, export_checkpoint


class ExportTrunk(Callback):
    """At the end of ``fit``, write the pretrained-trunk directory that later runs take as ``model.init_from``.

    The weights come from the best checkpoint when a ``ModelCheckpoint`` monitors a metric, else
    from the final model. An existing trunk directory at the path is replaced; anything else there
    stops the run before training.

    Args:
        dirpath: where to write; unset: ``<trainer.default_root_dir>/trunk``.
        heads: also store every task's head (by task name, with its label names).
        artifact_name: with a ``WandbLogger``, the directory is also logged as a version of this W&B
            artifact (type ``trunk``; aliases ``latest``, and ``best`` when it holds the best checkpoint);
            default ``trunk-<name of trainer.default_root_dir>``.
    """

    def __init__(self, dirpath: str | None = None, heads: bool = True, artifact_name: str | None = None) -> None:
        self.dirpath = dirpath
        self.heads = heads
        self.artifact_name = artifact_name

    def path(self, trainer: L.Trainer) -> Path:
        return Path(self.dirpath) if self.dirpath else Path(trainer.default_root_dir) / "trunk"

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # fail before training, not after it, when the output path is taken (a dry run exports nothing)
        if trainer.is_global_zero and not trainer.fast_dev_run:
            check_writable(self.path(trainer), overwrite=True)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fast_dev_run:  # a dry run's one step must not replace a trunk exported before
            rank_zero_info(f"fast_dev_run: the trunk is not exported (to {self.path(trainer)}).")
            return
        checkpoint = trainer.checkpoint_callback
        best = checkpoint.best_model_path if checkpoint is not None and checkpoint.monitor else ""
        # Without a best checkpoint, the final model goes through a checkpoint too (written by every process:
        # a collective under FSDP2), so the directory gets the data settings the checkpoint holds: one export path.
        final = self.path(trainer).parent / f".{self.path(trainer).name}.final.ckpt"
        if not best:
            trainer.save_checkpoint(final)
        if trainer.is_global_zero:
            path = export_checkpoint(best or final, self.path(trainer), self.heads, overwrite=True)
            if not best:
                shutil.rmtree(final) if final.is_dir() else final.unlink()
            rank_zero_info(f"Exported the pretrained trunk{' (from ' + best + ')' if best else ''} to {path}; "
                           f"start a run from it with --model.init_from={path}")
            for logger in (lg for lg in trainer.loggers if isinstance(lg, WandbLogger)):
                name = self.artifact_name or f"trunk-{Path(trainer.default_root_dir).name}"
                log_trunk_artifact(logger.experiment, path, name, ["latest", "best"] if best else ["latest"])
        trainer.strategy.barrier()
