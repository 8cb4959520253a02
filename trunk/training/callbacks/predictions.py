"""``trunk predict``'s files: JSON lines per task, written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from trunk.core.atomic import check_output_file, temporary_path
from trunk.core.locks import hold_output, release


class PredictionWriter(BasePredictionWriter):
    """Write ``trunk predict`` results as JSON lines, one record per example, in the input file's order.

    Args:
        output: the file to write; unset: ``predictions.jsonl`` in the run's log directory. When
            several tasks predict, each gets its own file, ``<output>.<task>.jsonl``. Under several
            processes each writes its own ``.rank<N>`` file.
        field: write only this field of each record, as plain text, one line per example (for
            example ``translation``: a file to hand to sacrebleu).
        overwrite: replace an existing file. Never a file the run reads (the checkpoint, a data file), nor one another
            process is writing (each output has one writer: the second is refused, naming the first).
    """

    def __init__(self, output: str | None = None, field: str | None = None, overwrite: bool = False) -> None:
        super().__init__(write_interval="batch")
        self.output = output
        self.field = field
        self.overwrite = overwrite
        self._lines: dict[str, list[tuple[int, str]]] = {}  # task -> (row, line)
        self.tasks: list[str] = []  # the tasks that predict (the CLI sets them): several get a file each
        self._locks: list[Path] = []  # the outputs this process holds from the check until they are written

    def path(self, trainer: L.Trainer, task: str | None = None) -> Path:
        path = (
            Path(self.output).expanduser()
            if self.output
            else Path(trainer.log_dir or ".") / ("predictions.txt" if self.field else "predictions.jsonl")
        )
        if task is not None and len(self.tasks) > 1:
            path = path.with_suffix(f".{task}{path.suffix}")
        return path.with_suffix(f".rank{trainer.global_rank}{path.suffix}") if trainer.world_size > 1 else path

    def check(self, trainer: L.Trainer, inputs: list[Path]) -> None:
        """Refuse, before any prediction, an output that names a folder, is one of the run's ``inputs``, exists
        (without ``overwrite``), cannot be written, or is being written by another process; hold it until written."""
        if self.output and self.output.endswith(("/", os.sep)):  # Path() would drop the slash: a file named so
            raise ValueError(f"predictions.output='{self.output}' names a directory: give a file path "
                             f"({Path(self.output) / 'predictions.jsonl'}).")
        self.release()
        try:
            for task in self.tasks or [None]:
                path = self.path(trainer, task)
                check_output_file(path, self.overwrite, inputs, "predictions.output")
                self._locks.append(hold_output(path, "predictions.output"))
                # again, held: a writer that finished between the two has made the file this run must not replace
                check_output_file(path, self.overwrite, inputs, "predictions.output")
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give up the outputs this process holds."""
        for lock in self._locks:
            release(lock)
        self._locks = []

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._lines = {}

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ) -> None:
        # Batches come in order of length: each line is kept with its row's place and written in the file's order at the
        # end.
        lines = self._lines.setdefault(batch["task"], [])
        for index, record in zip(batch.get("index") or range(len(lines), len(lines) + len(prediction)), prediction):
            if self.field is None:
                try:
                    lines.append((index, json.dumps(record, ensure_ascii=False, allow_nan=False)))
                except ValueError:  # bare NaN would make the file invalid JSON
                    raise ValueError(
                        f"Task '{batch['task']}': a prediction holds NaN or infinity ({record}): the model's outputs "
                        "are not finite, so its weights or inputs are broken. Predict with an earlier checkpoint."
                    ) from None
                continue
            if self.field not in record:
                raise ValueError(
                    f"predictions.field={self.field!r} is not in task '{batch['task']}''s predictions; its fields are "
                    f"{sorted(record)}."
                )
            lines.append((index, str(record[self.field]).replace("\n", " ")))

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Written under a temporary name and renamed: an interrupted run leaves the previous file as it was, never a
        # truncated one.
        for task, lines in self._lines.items():
            path = self.path(trainer, task)
            path.parent.mkdir(parents=True, exist_ok=True)
            with temporary_path(path).open("w", encoding="utf-8") as file:
                file.writelines(line + "\n" for _, line in sorted(lines, key=lambda pair: pair[0]))
                file.flush()
                os.fsync(file.fileno())
            os.replace(file.name, path)
            print(f"Wrote the predictions of task '{task}' to {path}")
        self._lines = {}
        self.release()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._lines = {}
        self.release()
