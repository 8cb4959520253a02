"""Inference in plain Python, without the CLI:

    from trunk.tasks import load
    model = load("runs/sst2/csv/version_0/checkpoints/best.ckpt")     # or a trunk directory with heads
    model.predict(["a gripping film", "a dull plot"], task="sst2")
    # [{"text": "a gripping film", "label": "positive", "probs": {...}}, ...]  (the records of `trunk predict`)
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path

import torch
from trunk.datamodules.tokenizer import Codec
from trunk.tasks.module import TrunkModule
from trunk.tasks.precision import resolve_precision
from trunk.tasks.pretrained import load_checkpoint, load_pretrained


INFERENCE_PRECISIONS = ("auto", "32-true", "bf16-mixed")


class Predictor:
    """A trained model and, per task, the data class that turns raw inputs into its batches.

    ``precision``: ``auto`` computes in bf16 where the device does so natively and in fp32 elsewhere
    (the rule of training runs, ``trunk.tasks.precision``); ``32-true`` or ``bf16-mixed`` force one."""

    def __init__(self, model: TrunkModule, data: dict, precision: str = "auto") -> None:
        if precision not in INFERENCE_PRECISIONS:
            raise ValueError(f"precision={precision!r}: inference runs in one of {list(INFERENCE_PRECISIONS)}.")
        self.model, self.data = model.eval(), data
        self.precision = resolve_precision(precision, model.device.type)

    @property
    def tasks(self) -> list[str]:
        return list(self.model.objectives)

    @torch.no_grad()
    def predict(self, inputs: list, task: str | None = None, batch_size: int = 64) -> list[dict]:
        """One record per input, as ``trunk predict`` writes them. ``inputs``: texts (or (text, pair)
        tuples) for classification, sentences (strings or word lists) for NER, source sentences for
        translation, image paths / PIL images / arrays for image tasks. ``task`` may be left out
        when the model has one task."""
        if task is None:
            if len(self.tasks) != 1:
                raise ValueError(f"This model has the tasks {self.tasks}: name one with task=...")
            task = self.tasks[0]
        if task not in self.data:
            raise ValueError(f"No task named {task!r}; this model's tasks are {self.tasks}.")
        records: list[dict] = []
        device = self.model.device
        bf16 = torch.autocast(device.type, dtype=torch.bfloat16) if self.precision == "bf16-mixed" else contextlib.nullcontext()
        for start in range(0, len(inputs), batch_size):
            batch = {"task": task, **self.data[task].encode_inputs(list(inputs[start : start + batch_size]))}
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            with bf16:
                records += self.model.predict_step(batch, 0)
        return records


def load(path: str | Path, data: dict | None = None, map_location: str = "cpu", precision: str = "auto") -> Predictor:
    """A ``Predictor`` from a checkpoint written by ``trunk fit`` or from a trunk directory with heads.

    ``data``: task name -> its ``TaskData``, for checkpoints of runs built in Python (the CLI's
    checkpoints store each task's data settings). ``precision``: see ``Predictor``."""
    path = Path(path)
    if path.is_dir():
        return _from_directory(path, data, precision)
    ckpt = load_checkpoint(path)
    model = TrunkModule.load_from_checkpoint(path, map_location=map_location, weights_only=True)
    specs = (ckpt.get("datamodule_hyper_parameters") or {}).get("data_tasks") or {}
    data = {**{name: _instantiate(spec) for name, spec in specs.items() if spec}, **(data or {})}
    missing = sorted(set(model.objectives) - set(data))
    if missing:
        raise ValueError(f"'{path}' holds no data settings for the tasks {missing} (a run built in Python): pass them as "
                         "load(path, data={task: TextClassificationData(...), ...}).")
    data_state = next((v for k, v in ckpt.items() if k.endswith("MultiTaskData")), {})
    _connect(model.codec, model, data, data_state)
    return Predictor(model, data, precision)


def _from_directory(path: Path, data: dict | None, precision: str) -> Predictor:
    pretrained = load_pretrained(path)
    if not pretrained.heads:
        raise ValueError(f"'{path}' holds a trunk without heads: there is nothing to predict. Fine-tune it first, or "
                         "export a fine-tuned checkpoint with `trunk export CKPT DIR`.")
    tasks = {name: head["meta"]["objective"] for name, head in pretrained.heads.items()}
    info = {name: {"label_names": head["meta"].get("label_names"),
                   "target_vocab_size": pretrained.codec.targets[name].get_vocab_size() if name in pretrained.codec.targets else None}
            for name, head in pretrained.heads.items()}
    model = TrunkModule(tasks, trunk=pretrained.config, task_info=info, codec=pretrained.codec)
    model.load_pretrained(pretrained)
    data = {**{name: _instantiate(head["meta"]["data"]) for name, head in pretrained.heads.items() if head["meta"].get("data")},
            **(data or {})}
    missing = sorted(set(model.objectives) - set(data))
    if missing:
        raise ValueError(f"'{path}' holds no data settings for the tasks {missing}: pass them as load(path, data={{...}}).")
    _connect(pretrained.codec, model, data, {name: head["meta"].get("data_state", {}) for name, head in pretrained.heads.items()})
    return Predictor(model, data, precision)


def _instantiate(spec: dict):
    module, _, name = spec["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**spec.get("init_args", {}))


def _connect(codec: Codec | None, model: TrunkModule, data: dict, data_state: dict) -> None:
    for name, member in data.items():
        member.name = name
        member.load_state_dict(data_state.get(name, {}))
        if hasattr(member, "connect") and codec is not None and codec.tokenizer is not None:
            member.connect(codec.tokenizer)
            if name in codec.targets:
                member._target_tokenizer = codec.targets[name]
        labels = model.objectives[name].label_names
        if labels is not None and hasattr(member, "_label_names"):
            member._label_names = labels
