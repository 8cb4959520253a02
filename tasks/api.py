"""Inference in plain Python, without the CLI:

    from trunk.tasks import load
    model = load("runs/sst2/lightning_logs/version_0/checkpoints/last.ckpt")     # or a trunk directory with heads
    model.predict(["a gripping film", "a dull plot"], task="sst2")
    # [{"text": "a gripping film", "label": "positive", "probs": {...}}, ...]  (the records of `trunk predict`)
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path

import torch
from trunk.core.checkpoint import is_sharded_checkpoint
from trunk.datamodules import MultiTaskData
from trunk.datamodules.text import length_order
from trunk.tasks.artifacts import resolve_init_from
from trunk.tasks.module import TrunkModule
from trunk.tasks.onnx_export import OnnxGraphs
from trunk.tasks.precision import resolve_precision
from trunk.tasks.pretrained import load_pretrained, without_splits
from trunk.tasks.run import read_run_checkpoint, resolve


INFERENCE_PRECISIONS = ("auto", "32-true", "bf16-mixed")


class Predictor:
    """A trained model and, per task, the data class that turns raw inputs into its batches.

    ``precision``: ``auto`` computes in bf16 where the device does so natively and in fp32 elsewhere
    (the rule of training runs, ``trunk.tasks.precision``); ``32-true`` or ``bf16-mixed`` force one."""

    def __init__(self, model: TrunkModule, data: dict, precision: str = "auto", graphs: OnnxGraphs | None = None) -> None:
        if precision not in INFERENCE_PRECISIONS:
            raise ValueError(f"precision={precision!r}: inference runs in one of {list(INFERENCE_PRECISIONS)}.")
        self.model, self.data, self.graphs = model.eval(), data, graphs
        self.precision = "32-true" if graphs else resolve_precision(precision, model.device.type)

    @property
    def tasks(self) -> list[str]:
        return list(self.model.objectives)

    @torch.inference_mode()
    def predict(self, inputs: list, task: str | list[str] | None = None, batch_size: int = 64) -> list[dict]:
        """One record per input, in input order, as ``trunk predict`` writes them. ``inputs``: texts (or (text, pair)
        tuples) for classification, sentences (strings or word lists) for NER, source sentences for translation,
        image paths / PIL images / arrays for image tasks. ``task`` may be left out when the model has one task.

        Text inputs are tokenized at once and batched in order of length (as ``trunk predict`` batches a file), so
        a batch pads little. ``task`` as a list of names: each record is ``{task: its record}``, and tasks whose
        batches hold the same tokens (classification and NER of one sentence, say) share one trunk pass per batch,
        each head reading it. An input cut to fit the model's ``max_length`` has ``"truncated": true`` in its record."""
        tasks = self.check_tasks(task)
        inputs = list(inputs)
        records = self.predict_encoded({name: self.encode(name, inputs) for name in tasks}, batch_size)
        if isinstance(task, list):
            return [{name: records[name][i] for name in tasks} for i in range(len(inputs))]
        return records[tasks[0]]

    def encode(self, task: str, inputs: list) -> list:
        """One task's examples of raw inputs (``predict``'s): tokenized texts, or images as they are. Bad inputs
        raise ValueError (or TypeError, KeyError for a wrong type or a missing field)."""
        if self._tokenized(task):
            return self.data[task].input_examples(inputs)
        return [(x, str(x) if isinstance(x, (str, Path)) else i) for i, x in enumerate(inputs)]  # an image and its record's id

    @torch.inference_mode()
    def predict_encoded(self, examples: dict[str, list], batch_size: int = 64) -> dict[str, list[dict]]:
        """Each task's records of its examples (from ``encode``, of the same inputs for every task), in their order.
        Batches follow the order of length; the tasks whose batches hold the same tokens share one trunk pass."""
        first, tokenized = next(iter(examples.values())), all(self._tokenized(name) for name in examples)
        order = length_order([len(e["input_ids"]) for e in first]) if tokenized else list(range(len(first)))  # images: one size
        answers = {name: [None] * len(first) for name in examples}
        bf16 = torch.autocast(self.model.device.type, dtype=torch.bfloat16) if self.precision == "bf16-mixed" else contextlib.nullcontext()
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batches = {name: self._collate(name, [examples[name][i] for i in chunk]) for name in examples}
            with bf16:
                records = self._predict_batch(batches)
            for name, task_records in records.items():
                for i, record in zip(chunk, task_records):
                    answers[name][i] = {**record, "truncated": True} if tokenized and examples[name][i].get("truncated") else record
        return answers

    def _tokenized(self, task: str) -> bool:
        return hasattr(self.data[task], "input_examples")

    def _collate(self, task: str, examples: list) -> dict:
        data = self.data[task]
        return data.collate(examples) if self._tokenized(task) else data.encode_inputs(*map(list, zip(*examples)))

    def check_tasks(self, task: str | list[str] | None) -> list[str]:
        if task is None and len(self.tasks) != 1:
            raise ValueError(f"This model has the tasks {self.tasks}: name one with task=..., or several with task=[...].")
        names = self.tasks if task is None else [task] if isinstance(task, str) else list(task)
        unknown = [name for name in names if name not in self.data]
        if unknown or not names:
            raise ValueError(f"No task named {', '.join(map(repr, unknown)) or '(none given)'}; this model's tasks are {self.tasks}.")
        if self.graphs:
            self.graphs.check(names)
        return names

    def _predict_batch(self, batches: dict[str, dict]) -> dict[str, list[dict]]:
        """Each task's records of its batch; one trunk pass serves every task whose tokens are the same."""
        once, device, records = TrunkOnce(self.model, list(batches)), self.model.device, {}
        for name, batch in batches.items():
            batch = {"task": name, **{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}}
            objective = self.model.objective(name)
            records[name] = objective.records(batch, self.graphs.run(name, batch)) if self.graphs else objective.predict(once.view(name), batch)
        return records


class TrunkOnce:
    """The trunk, run once per distinct input within one batch of several tasks. Tasks without a delta read one
    output. Tasks with deltas (``model.peft``) read one forked pass: the blocks below their lowest delta run once, the
    rest as one copy of the batch per task, each copy through its task's delta (``Backbone.forward``'s ``fork``).
    ``view(task)`` is what that task's objective calls as its trunk."""

    def __init__(self, model: torch.nn.Module, tasks: list[str]) -> None:
        self.trunk, self.router, self.outputs = model.trunk, model.router, []
        self.with_delta = [task for task in tasks if task in model.router.deltas]

    def view(self, task: str) -> "TaskTrunk":
        return TaskTrunk(self, task)

    def run(self, task: str, inputs: torch.Tensor, attention_mask: torch.Tensor | None, stem: str) -> torch.Tensor:
        group = self.with_delta if task in self.with_delta else None
        for (seen, mask, seen_stem, seen_group), outputs in self.outputs:
            if seen_group is group and seen_stem == stem and seen.shape == inputs.shape and torch.equal(seen, inputs) and (
                    mask is attention_mask or (mask is not None and attention_mask is not None and torch.equal(mask, attention_mask))):
                return outputs[task if group else None]
        if group is None:
            outputs = {None: self.trunk(inputs, attention_mask, stem=stem)}
        else:  # every task with a delta at once: one copy of the batch each, the blocks below their deltas shared
            k, rows = len(group), inputs.shape[0]
            mask = None if attention_mask is None else attention_mask.bool().repeat(k, 1)
            with self.router.route([(name, rows) for name in group], mask):
                out = self.trunk(inputs, attention_mask, stem=stem, fork=(self.router.lowest_layer(group), k))
            outputs = dict(zip(group, out.split(rows)))
        self.outputs.append(((inputs, attention_mask, stem, group), outputs))
        return outputs[task if group else None]


class TaskTrunk:
    """One task's view of a ``TrunkOnce``: called as the trunk is; everything else is the trunk's own."""

    def __init__(self, once: TrunkOnce, task: str) -> None:
        self.once, self.task = once, task

    def __call__(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None, stem: str = "text") -> torch.Tensor:
        return self.once.run(self.task, inputs, attention_mask, stem)

    def __getattr__(self, name: str):
        return getattr(self.once.trunk, name)


def load(path: str | Path, data: dict | None = None, map_location: str = "cpu", precision: str = "auto",
         runtime: str = "torch") -> Predictor:
    """A ``Predictor`` from a checkpoint written by ``trunk fit`` or from a trunk directory with heads, read
    once (``trunk.tasks.run``: labels in the order the heads were trained in, tokenizer and lengths as stored).

    ``data``: task name -> its ``TaskData``, for checkpoints of runs built in Python (the CLI's
    checkpoints store each task's data settings). ``precision``: see ``Predictor``. ``runtime="onnx"``: the
    tasks' graphs run in ONNX Runtime (a trunk directory exported with ``trunk export CKPT DIR --onnx``)."""
    if runtime not in ("torch", "onnx"):
        raise ValueError(f"runtime={runtime!r}: choose 'torch' or 'onnx'.")
    path = resolve_init_from(path)  # hf://ORG/NAME and W&B artifact references too
    graphs = OnnxGraphs(path) if runtime == "onnx" else None  # checks for the graphs before the model loads
    if path.is_dir() and not is_sharded_checkpoint(path):
        pretrained = load_pretrained(path)
        if not pretrained.heads:
            raise ValueError(f"'{path}' holds a trunk without heads: there is nothing to predict. Fine-tune it first, or "
                             "export a fine-tuned checkpoint with `trunk export CKPT DIR`.")
        heads = {name: head["meta"] for name, head in pretrained.heads.items()}
        run = _run_data(path, {name: meta.get("data") for name, meta in heads.items()},
                        {name: meta.get("data_state", {}) for name, meta in heads.items()}, data)
        for name, meta in heads.items():
            if meta.get("label_names") is not None:
                run.tasks[name].use_labels_of(meta["label_names"], f"'{path}'")
        peft = {name: meta["peft"] for name, meta in heads.items() if meta.get("peft")}  # heads trained with a delta bring it
        model = resolve({"tasks": {name: meta["objective"] for name, meta in heads.items()}, **({"peft": peft} if peft else {})}, run,
                        init_from=pretrained).model
    else:
        ckpt = read_run_checkpoint(path)
        specs = (ckpt.get("datamodule_hyper_parameters") or {}).get("data_tasks") or {}
        run = _run_data(path, specs, next((v for k, v in ckpt.items() if k.endswith("MultiTaskData")), {}), data)
        model = resolve({}, run, ckpt_path=path, checkpoint=ckpt).model
        model.on_load_checkpoint(ckpt)  # refuses non-finite weights
        model.load_state_dict(ckpt["state_dict"])
    return Predictor(model.to(map_location), run.tasks, precision, graphs)


def _run_data(path: Path, specs: dict, states: dict, given: dict | None) -> MultiTaskData:
    """The stored tasks' data (as the run configured it, without its splits), or the ``given`` ones."""
    tasks = {**{name: _instantiate(without_splits(spec)) for name, spec in specs.items() if spec}, **(given or {})}
    missing = sorted(set(specs) - set(tasks))
    if missing:
        raise ValueError(f"'{path}' holds no data settings for the tasks {missing} (a run built in Python): pass them as "
                         "load(path, data={task: TextClassificationData(...), ...}).")
    run = MultiTaskData(tasks)
    for name, member in run.tasks.items():
        member.load_state_dict(states.get(name, {}))
    return run


def _instantiate(spec: dict):
    module, _, name = spec["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**spec.get("init_args", {}))
