"""Callbacks the CLI always adds: prediction files and the resolved config for every logger."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import SaveConfigCallback


class PredictionWriter(BasePredictionWriter):
    """Write ``trunk predict`` results as JSON lines, one record per example, as batches arrive.

    Args:
        output: the file to write; unset: ``predictions.jsonl`` in the run's log directory. Under
            several processes each writes its own ``.rank<N>`` file.
    """

    def __init__(self, output: str | None = None) -> None:
        super().__init__(write_interval="batch")
        self.output = output
        self._file = None

    def path(self, trainer: L.Trainer) -> Path:
        path = Path(self.output) if self.output else Path(trainer.log_dir or ".") / "predictions.jsonl"
        return path.with_suffix(f".rank{trainer.global_rank}{path.suffix}") if trainer.world_size > 1 else path

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = self.path(trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w", encoding="utf-8")

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx) -> None:
        for record in prediction:
            self._file.write(json.dumps(record, ensure_ascii=False) + "\n")

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
