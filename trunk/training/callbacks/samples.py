"""The same validation examples every epoch, predicted: JSON lines beside the run's log, W&B tables."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_warn

from trunk.tasks.objectives.base import batch_size


class PredictionSamples(Callback):
    """At each validation, the first ``rows`` validation examples of every task, with the gold answer and
    the prediction: the same rows every epoch, so a table compares epochs. Written as JSON lines to ``<log
    dir>/samples/<task>.jsonl`` (the CSV logger's folder of the run where there is one; one line per example, with
    ``epoch``, ``step`` and ``id``, its position in the validation split; appended every validation), and logged as the
    W&B table ``samples/<task>`` when a ``WandbLogger`` is attached (images as images). The columns are the task's
    (``Objective.samples``): classification text, gold, predicted, probability; NER the sentence and its gold and
    predicted entities marked; translation source, reference, hypothesis and sentence BLEU; images the image, gold,
    predicted, probability. Pretraining tasks have no table. Classification tasks (text and images) also get the
    confusion matrix of the whole validation split, as ``<task>.confusion.jsonl`` beside the samples and the W&B plot
    ``confusion/<task>``. Under several processes the first process's rows are shown (its shard of the split). The CLI
    adds it to every logged run; costs one extra forward pass (translation: generation) of the first batches per task.
    """

    def __init__(self, rows: int = 16) -> None:
        if rows < 1:
            raise ValueError(f"PredictionSamples.rows must be >= 1, got {rows}.")
        self.rows = rows
        self._warned: set[str] = set()

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._taken: dict[str, list[dict]] = {}
        self._seen: dict[str, int] = {}

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if trainer.sanity_checking:
            return
        task = batch["task"]
        taken = self._taken.setdefault(task, [])
        start = self._seen.get(task, 0)
        # places of this process's shard, a repeated row left out of the batch included (EvalShard): every process
        # then runs the same extra forwards, as FSDP's gathers need
        self._seen[task] = start + batch_size(batch) + batch.get("repeated", 0)
        if start < self.rows:
            with torch.no_grad():
                records = pl_module(batch, "samples")
            taken += [{"id": start + i, **record} for i, record in enumerate(records[: self.rows - len(taken)])]

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        log_dir = trainer.log_dir  # a collective under DDP: every process asks
        confusions = {name: (objective.label_names, matrix) for name, objective in pl_module.objectives.items()
                      if (matrix := objective.confusion("val")) is not None}  # collectives too
        for task, taken in self._taken.items():
            if taken and len(taken) < self.rows and task not in self._warned:
                self._warned.add(task)
                rank_zero_warn(
                    f"PredictionSamples: task '{task}' has {self._seen[task]} validation examples (in this process), "
                    f"fewer than rows={self.rows}; its table shows all {len(taken)}."
                )
        if not trainer.is_global_zero:
            return
        # Beside the run's CSV log (its own version folder), where one is kept: W&B's log_dir is shared by its runs.
        log_dir = next((lg.log_dir for lg in trainer.loggers if isinstance(lg, CSVLogger)), log_dir)
        folder = Path(log_dir) / "samples" if log_dir else None
        if folder is not None and (self._taken or confusions):
            folder.mkdir(parents=True, exist_ok=True)
        wandb_loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        # the step Lightning's loggers stamp on this validation's metrics (one below global_step while training), so
        # samples/, metrics.csv and W&B name one validation alike
        epoch, step = trainer.current_epoch, getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped",
                                                     trainer.global_step)
        for task, taken in self._taken.items():
            if not taken:
                continue
            if folder is not None:
                with open(folder / f"{task}.jsonl", "a", encoding="utf-8") as f:
                    for row in taken:
                        record = {"epoch": epoch, "step": step, **{k: v for k, v in row.items() if k != "wandb_image"}}
                        f.write(json.dumps(record, ensure_ascii=False) + "\n")
            for logger in wandb_loggers:
                log_wandb_table(logger, f"samples/{task}", taken, epoch, step)
        for task, (labels, matrix) in confusions.items():
            counts = matrix.long().tolist()
            if folder is not None:
                with open(folder / f"{task}.confusion.jsonl", "a", encoding="utf-8") as f:
                    f.write(
                        json.dumps(
                            {"epoch": epoch, "step": step, "labels": labels, "rows_gold_columns_predicted": counts}
                        )
                        + "\n"
                    )
            if wandb_loggers:
                import wandb

                # one per example
                pairs = [(g, p) for g, row in enumerate(counts) for p, n in enumerate(row) for _ in range(n)]
                plot = wandb.plot.confusion_matrix(
                    y_true=[g for g, _ in pairs],
                    preds=[p for _, p in pairs],
                    class_names=labels,
                    title=f"{task}: validation",
                )
                for logger in wandb_loggers:
                    logger.experiment.log({f"confusion/{task}": plot, "trainer/global_step": step})


def log_wandb_table(logger, key: str, rows: list[dict], epoch: int, step: int) -> None:
    """One W&B table of ``rows`` (an ``image`` column for ``wandb_image`` tensors, scaled to [0, 1] per image)."""
    import wandb

    names = list(rows[0])
    columns = ["epoch", *("image" if n == "wandb_image" else n for n in names)]

    def cell(name, value):
        if name != "wandb_image":
            return value
        image = value.float().cpu()
        image = (image - image.min()) / (image.max() - image.min()).clamp(min=1e-8)
        return wandb.Image(image.permute(1, 2, 0).squeeze(-1).numpy())

    table = wandb.Table(columns=columns, data=[[epoch, *(cell(n, r[n]) for n in names)] for r in rows])
    logger.experiment.log({key: table, "trainer/global_step": step})  # on the x-axis WandbLogger logs metrics against
