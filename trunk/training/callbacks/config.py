"""The resolved config, saved beside the run and logged to every logger."""

from __future__ import annotations

import itertools
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.cli import SaveConfigCallback


class LogConfigCallback(SaveConfigCallback):
    """Save config.yaml in the log directory (Lightning's default) and log the resolved config to every logger."""

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))  # plain types only
        config.pop("config", None)  # the paths of the YAML files themselves
        for logger in trainer.loggers:
            logger.log_hyperparams({"config": config})

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "predict":  # predict logs nothing and opens no log folder: no config.yaml in the training run's
            return
        log_dir = trainer.log_dir  # a collective under DDP: every rank asks
        if stage == "fit" and log_dir and (Path(log_dir) / self.config_filename).exists():
            # a resumed run logs into the folder of the run it resumes: its config goes beside the original one
            resumes = itertools.count(1)
            while (Path(log_dir) / (name := f"config.resume{next(resumes)}.yaml")).exists():
                pass
            self.config_filename = name
        super().setup(trainer, pl_module, stage)
