"""Callbacks: prediction files, the resolved config for every logger, and the pretrained-trunk export."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.callbacks import BasePredictionWriter, Callback
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info

from trunk.tasks.pretrained import check_writable, export_checkpoint, save_pretrained


class PredictionWriter(BasePredictionWriter):
    """Write ``trunk predict`` results as JSON lines, one record per example, as batches arrive.

    Args:
        output: the file to write; unset: ``predictions.jsonl`` in the run's log directory. Under
            several processes each writes its own ``.rank<N>`` file.
        field: write only this field of each record, as plain text, one line per example (for
            example ``translation``: a file to hand to sacrebleu).
    """

    def __init__(self, output: str | None = None, field: str | None = None) -> None:
        super().__init__(write_interval="batch")
        self.output = output
        self.field = field
        self._file = None

    def path(self, trainer: L.Trainer) -> Path:
        path = Path(self.output) if self.output else Path(trainer.log_dir or ".") / ("predictions.txt" if self.field else "predictions.jsonl")
        return path.with_suffix(f".rank{trainer.global_rank}{path.suffix}") if trainer.world_size > 1 else path

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = self.path(trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w", encoding="utf-8")

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx) -> None:
        for record in prediction:
            if self.field is None:
                self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
                continue
            if self.field not in record:
                raise ValueError(f"predictions.field={self.field!r} is not in this task's predictions; its fields are {sorted(record)}.")
            self._file.write(str(record[self.field]).replace("\n", " ") + "\n")

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._file.close()
        print(f"Wrote predictions to {self.path(trainer)}")


class LogConfigCallback(SaveConfigCallback):
    """Save config.yaml in the log directory (Lightning's default) and log the resolved config to every logger."""

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))  # plain types only
        config.pop("config", None)  # the paths of the YAML files themselves
        for logger in trainer.loggers:
            logger.log_hyperparams({"config": config})


class ExportTrunk(Callback):
    """At the end of ``fit``, write the pretrained-trunk directory that fine-tuning takes as ``model.init_from``.

    The weights come from the best checkpoint when a ``ModelCheckpoint`` monitors a metric, else
    from the final model.

    Args:
        dirpath: where to write; unset: ``<trainer.default_root_dir>/trunk``.
        with_head: also store the task head's weights (``head.*`` in model.safetensors).
    """

    def __init__(self, dirpath: str | None = None, with_head: bool = False) -> None:
        self.dirpath = dirpath
        self.with_head = with_head

    def path(self, trainer: L.Trainer) -> Path:
        return Path(self.dirpath) if self.dirpath else Path(trainer.default_root_dir) / "trunk"

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:  # fail before training, not after it, when the output path is taken
            check_writable(self.path(trainer), overwrite=True)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            checkpoint = trainer.checkpoint_callback
            best = checkpoint.best_model_path if checkpoint is not None and checkpoint.monitor else ""
            if best:
                path = export_checkpoint(best, self.path(trainer), self.with_head, overwrite=True)
            else:
                head = pl_module.head.state_dict() if self.with_head else None
                path = save_pretrained(self.path(trainer), pl_module.trunk_config, pl_module.trunk.state_dict(),
                                       trainer.datamodule.tokenizer, head, type(pl_module).__module__ + "." + type(pl_module).__name__,
                                       overwrite=True)
            rank_zero_info(f"Exported the pretrained trunk{' (from ' + best + ')' if best else ''} to {path}; "
                           f"fine-tune from it with --model.init_from={path}")
        trainer.strategy.barrier()
