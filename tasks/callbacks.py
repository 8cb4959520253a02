"""Callbacks: prediction files, the resolved config for every logger, and the pretrained-trunk export."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import BasePredictionWriter, Callback, ModelSummary, RichProgressBar, TQDMProgressBar
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.model_summary import ModelSummary as Summary
from trunk.core.atomic import temporary_path
from trunk.tasks.artifacts import log_trunk_artifact
from trunk.tasks.objective import batch_size
from trunk.tasks.pretrained import attach_data, check_writable, export_checkpoint, save_pretrained


class Throttle:
    """Says when a progress display is due: at most every ``interval`` seconds, and at the last batch."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self._drawn = 0.0

    def due(self, batch_idx: int, total: float) -> bool:
        now = time.monotonic()
        if now - self._drawn < self.interval and batch_idx + 1 != total:
            return False
        self._drawn = now
        return True


class ThrottledBar:
    """Redraws a Lightning progress bar at most every ``interval`` seconds and at the last batch of each
    epoch. Redrawn after every step, the rich bar cost 8% of a training step and the tqdm bar (which
    also formats the logged metrics every step) 6% (width 256, 2 CPU cores: ``benchmarks/loop_overhead.py``).
    The bars show absolute positions, so a skipped draw loses nothing."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__()
        self.throttle = Throttle(interval)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.throttle.due(batch_idx, self.total_train_batches):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.throttle.due(batch_idx, self.total_val_batches_current_dataloader):
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)


class TrunkProgressBar(ThrottledBar, RichProgressBar):
    """Lightning's rich bar, throttled: the CLI's bar where rich is installed and the trainer is given no other."""


class TrunkTQDMProgressBar(ThrottledBar, TQDMProgressBar):
    """Lightning's tqdm bar, throttled: the CLI's bar where rich is not installed."""


class Throughput(Callback):
    """Training throughput, logged every ``trainer.log_every_n_steps`` batches under ``perf/``:
    ``samples_per_sec`` and ``tokens_per_sec`` (real tokens the trunk computes on, padding excluded;
    the first process's rate times the number of processes), and ``mfu``, the trunk's training FLOPs
    (``TrunkModule.training_flops_per_token``; heads and decoders not counted) over the devices' peak:
    ``peak_flops`` per device when given, else Lightning's table of GPU peaks (none for CPUs: no MFU).
    A window holds training batches only (a validation in between starts a new one), data loading
    included. Tokens are summed on the device and read once per window: no sync per step.
    """

    def __init__(self, peak_flops: float | None = None) -> None:
        self.peak_flops = peak_flops
        self._start: float | None = None

    def _peak(self, trainer) -> float | None:
        if self.peak_flops:
            return self.peak_flops
        from lightning.fabric.utilities.throughput import get_available_flops

        dtype = torch.bfloat16 if "bf16" in str(trainer.precision) else torch.float16 if "16" in str(trainer.precision) else torch.float32
        return get_available_flops(trainer.strategy.root_device, dtype)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        samples, tokens, length = pl_module.batch_work(batch)
        if self._start is None:
            self._start, self._samples, self._tokens, self._flops = time.perf_counter(), 0, 0, 0
        self._samples += samples
        self._tokens = self._tokens + tokens
        self._flops = self._flops + tokens * pl_module.training_flops_per_token(length)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self._start is None or (batch_idx + 1) % max(trainer.log_every_n_steps, 1):
            return
        seconds = time.perf_counter() - self._start
        tokens, flops = float(self._tokens), float(self._flops)  # the window's one device sync
        world = trainer.world_size
        rates = {"perf/samples_per_sec": world * self._samples / seconds, "perf/tokens_per_sec": world * tokens / seconds}
        peak = self._peak(trainer)
        if peak:
            rates["perf/mfu"] = flops / seconds / peak  # this device's FLOPs over its peak
        pl_module.log_dict(rates, on_step=True, on_epoch=False, batch_size=1)
        self._start = None

    def on_validation_start(self, trainer, pl_module) -> None:
        self._start = None  # evaluation time is not training throughput


class PredictionSamples(Callback):
    """At each validation, the first ``rows`` validation examples of every task, with the gold answer and
    the prediction: the same rows every epoch, so a table compares epochs. Written as JSON lines to
    ``<log dir>/samples/<task>.jsonl`` (the CSV logger's folder of the run where there is one; one line per example, with ``epoch``, ``step`` and ``id``, its
    position in the validation split; appended every validation), and logged as the W&B table
    ``samples/<task>`` when a ``WandbLogger`` is attached (images as images). The columns are the
    task's (``Objective.samples``): classification text, gold, predicted, probability; NER the sentence
    and its gold and predicted entities marked; translation source, reference, hypothesis and sentence
    BLEU; images the image, gold, predicted, probability. Pretraining tasks have no table. Classification
    tasks (text and images) also get the confusion matrix of the whole validation split, as
    ``<task>.confusion.jsonl`` beside the samples and the W&B plot ``confusion/<task>``. Under several
    processes the first process's rows are shown (its shard of the split). The CLI adds it to every
    logged run; costs one extra forward pass (translation: generation) of the first batches per task.
    """

    def __init__(self, rows: int = 16) -> None:
        if rows < 1:
            raise ValueError(f"PredictionSamples.rows must be >= 1, got {rows}.")
        self.rows = rows
        self._warned: set[str] = set()

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._taken: dict[str, list[dict]] = {}
        self._seen: dict[str, int] = {}

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking:
            return
        task = batch["task"]
        taken = self._taken.setdefault(task, [])
        start = self._seen.get(task, 0)
        self._seen[task] = start + batch_size(batch)
        if len(taken) < self.rows:
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
                rank_zero_warn(f"PredictionSamples: task '{task}' has {self._seen[task]} validation examples (in this process), "
                               f"fewer than rows={self.rows}; its table shows all {len(taken)}.")
        if not trainer.is_global_zero:
            return
        # Beside the run's CSV log (its own version folder), where one is kept: W&B's log_dir is shared by its runs.
        log_dir = next((lg.log_dir for lg in trainer.loggers if type(lg).__name__ == "CSVLogger"), log_dir)
        folder = Path(log_dir) / "samples" if log_dir else None
        if folder is not None and (self._taken or confusions):
            folder.mkdir(parents=True, exist_ok=True)
        wandb_loggers = [lg for lg in trainer.loggers if type(lg).__name__ == "WandbLogger"]
        epoch, step = trainer.current_epoch, trainer.global_step
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
                    f.write(json.dumps({"epoch": epoch, "step": step, "labels": labels, "rows_gold_columns_predicted": counts}) + "\n")
            if wandb_loggers:
                import wandb

                pairs = [(g, p) for g, row in enumerate(counts) for p, n in enumerate(row) for _ in range(n)]  # one per example
                plot = wandb.plot.confusion_matrix(y_true=[g for g, _ in pairs], preds=[p for _, p in pairs], class_names=labels,
                                                   title=f"{task}: validation")
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


class Norms(Callback):
    """Every ``every_n_steps`` optimizer steps, logs the gradient and weight norms (L2) of the whole model
    and of each part under ``norms/``: the stems, each trunk block, the final norm, each task's head.
    Off unless added (``--trainer.callbacks+=trunk.tasks.callbacks.Norms``): it reads every gradient."""

    def __init__(self, every_n_steps: int = 50) -> None:
        if every_n_steps < 1:
            raise ValueError(f"Norms.every_n_steps must be >= 1, got {every_n_steps}.")
        self.every_n_steps = every_n_steps

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step % self.every_n_steps:
            return
        parts = {"stems": pl_module.trunk.stems, "final_norm": pl_module.trunk.backbone.final_norm,
                 **{f"block{i}": block for i, block in enumerate(pl_module.trunk.backbone.blocks)},
                 **{f"head_{name}": objective for name, objective in pl_module.objectives.items()}}
        values = {}
        for name, part in [("all", pl_module), *parts.items()]:
            params = [p for p in part.parameters() if p.requires_grad]
            grads = [p.grad for p in params if p.grad is not None]
            if params:
                values[f"norms/{name}/weight"] = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(params)))
            if grads:
                values[f"norms/{name}/grad"] = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        pl_module.log_dict(values, on_step=True, on_epoch=False, batch_size=1)


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
        self._tasks: list[str] = []

    def path(self, trainer: L.Trainer, task: str | None = None) -> Path:
        path = Path(self.output) if self.output else Path(trainer.log_dir or ".") / ("predictions.txt" if self.field else "predictions.jsonl")
        if task is not None and len(self._tasks) > 1:
            path = path.with_suffix(f".{task}{path.suffix}")
        return path.with_suffix(f".rank{trainer.global_rank}{path.suffix}") if trainer.world_size > 1 else path

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Which tasks write files decides their names (one task: `output` itself), before any batch arrives.
        self._tasks = trainer.datamodule.predict_tasks if trainer.datamodule is not None else []
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


class _SharedOnceSummary(Summary):
    """A summary whose rows count a shared parameter once, in the first row (per nesting depth) that holds
    it: the MLM decoder is the token embedding, so the rows add up to the total."""

    @property
    def param_nums(self) -> list[int]:
        seen: dict[int, set[int]] = {}
        nums = []
        for name, layer in self._layer_summary.items():
            at_depth = seen.setdefault(name.count("."), set())
            params = [p for p in layer._module.parameters() if id(p) not in at_depth]
            at_depth.update(id(p) for p in params)
            nums.append(sum(p.numel() for p in params))
        return nums


class TrunkModelSummary(ModelSummary):
    """Lightning's model summary, with tied weights counted once (the CLI uses it in place of the default)."""

    def _summary(self, trainer: L.Trainer, pl_module: L.LightningModule):
        return _SharedOnceSummary(pl_module, max_depth=self._max_depth)


class LogConfigCallback(SaveConfigCallback):
    """Save config.yaml in the log directory (Lightning's default) and log the resolved config to every logger."""

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))  # plain types only
        config.pop("config", None)  # the paths of the YAML files themselves
        for logger in trainer.loggers:
            logger.log_hyperparams({"config": config})


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
        if trainer.is_global_zero:  # fail before training, not after it, when the output path is taken
            check_writable(self.path(trainer), overwrite=True)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        checkpoint = trainer.checkpoint_callback
        best = checkpoint.best_model_path if checkpoint is not None and checkpoint.monitor else ""
        state = None if best else pl_module.full_state_dict()  # every process: gathers the shards under FSDP2
        if trainer.is_global_zero:
            if best:
                path = export_checkpoint(best, self.path(trainer), self.heads, overwrite=True)
            else:
                pretrained = pl_module.export(state)
                data = trainer.datamodule
                if data is not None:
                    attach_data(pretrained, data.hparams.get("data_tasks") or {}, data.state_dict())
                if not self.heads:
                    pretrained.heads = {}
                path = save_pretrained(self.path(trainer), pretrained, overwrite=True)
            rank_zero_info(f"Exported the pretrained trunk{' (from ' + best + ')' if best else ''} to {path}; "
                           f"start a run from it with --model.init_from={path}")
            for logger in (lg for lg in trainer.loggers if type(lg).__name__ == "WandbLogger"):
                name = self.artifact_name or f"trunk-{Path(trainer.default_root_dir).name}"
                log_trunk_artifact(logger.experiment, path, name, ["latest", "best"] if best else ["latest"])
        trainer.strategy.barrier()
