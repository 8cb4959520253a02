"""``trunk predict``'s files: JSON lines per task, written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter
from trunk.core.atomic import temporary_path


class PredictionWriter(BasePredictionWriter):
    """Write ``trunk predict`` results as JSON lines, one record per example, as batches arrive.

    Args:
        output: the file to write; unset: ``predictions.jsonl`` in the run's log directory. When
            several tasks predict, each gets its own file, ``<output>.<task>.jsonl``. Under several
            processes each writes its own ``.rank<N>`` file.
        field: write only this field of each record, as plain text, one line per example (for
            example ``translation``: a file to hand to sacrebleu).
    """

    def __init__(self, output: str | None = None, field: str | None = None) -> None:
        super().__init__(write_interval="batch")
        self.output = output
        self.field = field
        self._files: dict[str, object] = {}
        self.tasks: list[str] = []  # the tasks that predict (the CLI sets them): several get a file each

    def path(self, trainer: L.Trainer, task: str | None = None) -> Path:
        path = Path(self.output) if self.output else Path(trainer.log_dir or ".") / ("predictions.txt" if self.field else "predictions.jsonl")
        if task is not None and len(self.tasks) > 1:
            path = path.with_suffix(f".{task}{path.suffix}")
        return path.with_suffix(f".rank{trainer.global_rank}{path.suffix}") if trainer.world_size > 1 else path

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._files = {}

    def _file(self, trainer: L.Trainer, task: str):
        # Written under a temporary name and renamed at the end: an interrupted run leaves the previous
        # predictions file as it was, never a truncated one.
        if task not in self._files:
            path = self.path(trainer, task)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._files[task] = temporary_path(path).open("w", encoding="utf-8")
        return self._files[task]

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx) -> None:
        file = self._file(trainer, batch["task"])
        for record in prediction:
            if self.field is None:
                try:
                    file.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
                except ValueError:  # bare NaN would make the file invalid JSON
                    raise ValueError(f"Task '{batch['task']}': a prediction holds NaN or infinity ({record}): the model's outputs "
                                     "are not finite, so its weights or inputs are broken. Predict with an earlier checkpoint.") from None
                continue
            if self.field not in record:
                raise ValueError(f"predictions.field={self.field!r} is not in task '{batch['task']}''s predictions; its fields "
                                 f"are {sorted(record)}.")
            file.write(str(record[self.field]).replace("\n", " ") + "\n")

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for task, file in self._files.items():
            file.flush()
            os.fsync(file.fileno())
            file.close()
            os.replace(file.name, self.path(trainer, task))
            print(f"Wrote the predictions of task '{task}' to {self.path(trainer, task)}")
        self._files = {}

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        for file in self._files.values():
            file.close()
            Path(file.name).unlink(missing_ok=True)
        self._files = {}
