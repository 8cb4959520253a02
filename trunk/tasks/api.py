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
from trunk.tasks.pretrained import without_splits
from trunk.tasks.task_files import read_trunk
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
    def predict_encoded(self, examples: dict[str, list], batch_size: int = 64, shared: bool = True) -> dict[str, list[dict]]:
        """Each task's records of its examples (from ``encode``), in their order. ``shared``: every task's examples are
        of the same inputs, and a batch holds the same inputs for every task; else each task brings its own inputs
        (requests for different tasks) and a batch mixes them. Batches follow the order of length, and each is one
        trunk pass for all its tasks (``TrunkOnce``)."""
        def length(name: str, i: int) -> int:
            return len(examples[name][i]["input_ids"]) if self._tokenized(name) else 0  # images: one size

        if shared:
            first = next(iter(examples))
            units = [[(name, i) for name in examples] for i in range(len(examples[first]))]  # an input, for every task
            deltas = sum(name in self.model.router.deltas for name in examples)  # each takes rows of its own above the fork
            batch_size = max(1, batch_size // max(1, deltas + (deltas < len(examples))))  # so a pass holds ~batch_size rows
        else:
            units = [[(name, i)] for name in examples for i in range(len(examples[name]))]
        units = [units[k] for k in length_order([length(*unit[0]) for unit in units])]
        answers = {name: [None] * len(task_examples) for name, task_examples in examples.items()}
        bf16 = torch.autocast(self.model.device.type, dtype=torch.bfloat16) if self.precision == "bf16-mixed" else contextlib.nullcontext()
        for start in range(0, len(units), batch_size):
            members: dict[str, list[int]] = {}
            for name, i in (pair for unit in units[start : start + batch_size] for pair in unit):
                members.setdefault(name, []).append(i)
            with bf16:
                records = self._predict_batch({name: self._collate(name, [examples[name][i] for i in rows]) for name, rows in members.items()})
            for name, rows in members.items():
                for i, record in zip(rows, records[name]):
                    truncated = self._tokenized(name) and examples[name][i].get("truncated")
                    answers[name][i] = {**record, "truncated": True} if truncated else record
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
        """Each task's records of its batch, from as few trunk passes as ``TrunkOnce`` needs."""
        device = self.model.device
        batches = {name: {"task": name, **{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}}
                   for name, batch in batches.items()}
        if self.graphs:
            return {name: self.model.objective(name).records(batch, self.graphs.run(name, batch)) for name, batch in batches.items()}
        once = TrunkOnce(self.model, batches)
        return {name: self.model.objective(name).predict(once.view(name), batch) for name, batch in batches.items()}


class TrunkOnce:
    """The trunk's outputs for one batch of several tasks, from one pass per stem.

    The tasks' inputs (each objective reads ``batch[input_key]`` with its stem) are deduplicated and stacked, padded to
    one length. Tasks without a delta that see the same inputs read one output. Tasks with a delta (``model.peft``) get
    rows of their own from the lowest delta block on (``Backbone.forward``'s ``fork``), each routed through its
    delta; the blocks below run once per distinct input. So ``predict(texts, task=[...])`` runs the shared blocks once,
    and requests for different tasks (``trunk serve``) share one pass. ``view(task)`` is what that task's objective
    calls as its trunk; a call with other inputs than its batch's (a translation's beam search) runs on its own."""

    def __init__(self, model: torch.nn.Module, batches: dict[str, dict]) -> None:
        self.model, self.outputs = model, {}
        by_stem: dict[str, list] = {}
        for name, batch in batches.items():
            objective = model.objective(name)
            if objective.input_key in batch:
                by_stem.setdefault(objective.stem, []).append((name, batch[objective.input_key], batch.get("attention_mask")))
        for stem, calls in by_stem.items():
            self._run(stem, calls)

    def view(self, task: str) -> "TaskTrunk":
        return TaskTrunk(self, task)

    def output(self, task: str, inputs: torch.Tensor, attention_mask: torch.Tensor | None, stem: str) -> torch.Tensor:
        seen = self.outputs.get(task)
        if seen is not None and seen[0] is inputs and seen[1] is attention_mask and seen[2] == stem:
            return seen[3]
        with self.model.route(task):
            return self.model.trunk(inputs, attention_mask, stem=stem)

    def _run(self, stem: str, calls: list[tuple[str, torch.Tensor, torch.Tensor | None]]) -> None:
        router = self.model.router
        distinct: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        segments: list[tuple[str | None, int, list[str]]] = []  # (delta task or None, distinct input, tasks reading it)
        own = {name: (inputs, mask) for name, inputs, mask in calls}  # what each objective will call the trunk with
        for name, inputs, mask in calls:
            which = next((i for i, (x, m) in enumerate(distinct) if _same(x, inputs) and _same(m, mask)), None)
            if which is None:
                which = len(distinct)
                distinct.append((inputs, mask))
            route = name if name in router.deltas else None
            shared = next((seg for seg in segments if route is None and seg[0] is None and seg[1] == which), None)
            if shared is None:
                segments.append((route, which, [name]))
            else:
                shared[2].append(name)
        unmasked = [x.shape[1:] for x, m in distinct if m is None]
        if len({x.shape[2:] for x, _ in distinct}) > 1 or 0 < len(unmasked) < len(distinct) or len(set(unmasked)) > 1:
            for route, which, names in segments:  # inputs that cannot stack (images of other sizes): one pass each
                with router.route([(route, None)]) if route else contextlib.nullcontext():
                    out = self.model.trunk(*distinct[which], stem=stem)
                for name in names:
                    self.outputs[name] = (*own[name], stem, out)
            return
        length = max(x.shape[1] for x, _ in distinct) if distinct[0][1] is not None else None  # masked: pad to one length
        inputs = torch.cat([_pad_to(x, length) for x, _ in distinct])
        mask = None if distinct[0][1] is None else torch.cat([_pad_to(m, length) for _, m in distinct])
        starts = torch.tensor([0, *[len(x) for x, _ in distinct]]).cumsum(0).tolist()
        rows = [torch.arange(starts[which], starts[which + 1]) for _, which, _ in segments]
        fork = None
        if sum(len(r) for r in rows) != len(inputs):  # an input read by several deltas: its rows repeat from the fork on
            fork = (router.lowest_layer([route for route, _, _ in segments if route]), torch.cat(rows).to(inputs.device))
        routed_mask = None if mask is None else mask.bool()[fork[1]] if fork else mask.bool()
        routes = [(route, len(r)) for (route, _, _), r in zip(segments, rows)]
        with router.route(routes, routed_mask) if any(route for route, _ in routes) else contextlib.nullcontext():
            out = self.model.trunk(inputs, mask, stem=stem, fork=fork)
        for (route, which, names), piece in zip(segments, out.split([len(r) for r in rows])):
            for name in names:
                self.outputs[name] = (*own[name], stem, piece[:, : own[name][0].shape[1]] if length else piece)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is b or (a is not None and b is not None and a.shape == b.shape and torch.equal(a, b))


def _pad_to(x: torch.Tensor, length: int | None) -> torch.Tensor:
    """Token ids or a mask (B, T), padded with zeros to ``length`` (the padding is masked out)."""
    return x if length is None or x.shape[1] == length else torch.nn.functional.pad(x, (0, length - x.shape[1]))


class TaskTrunk:
    """One task's view of a ``TrunkOnce``: called as the trunk is; everything else is the trunk's own."""

    def __init__(self, once: TrunkOnce, task: str) -> None:
        self.once, self.task = once, task

    def __call__(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None, stem: str = "text") -> torch.Tensor:
        return self.once.output(self.task, inputs, attention_mask, stem)

    def __getattr__(self, name: str):
        return getattr(self.once.model.trunk, name)


def load(path: str | Path | list, data: dict | None = None, map_location: str = "cpu", precision: str = "auto",
         runtime: str = "torch", merge: bool = False) -> Predictor:
    """A ``Predictor`` from a checkpoint written by ``trunk fit`` or from a trunk directory with heads, read
    once (``trunk.tasks.run``: labels in the order the heads were trained in, tokenizer and lengths as stored).
    ``path`` may be a list: a trunk (directory or checkpoint) and task directories (``trunk export CKPT DIR --task
    NAME``), each task answered on the one trunk.

    ``data``: task name -> its ``TaskData``, for checkpoints of runs built in Python (the CLI's
    checkpoints store each task's data settings). ``precision``: see ``Predictor``. ``runtime="onnx"``: the
    tasks' graphs run in ONNX Runtime (a trunk directory exported with ``trunk export CKPT DIR --onnx``).
    ``merge``: a model of one task with a LoRA delta has the delta written into the trunk's weights, so a forward costs
    what the trunk's does."""
    if runtime not in ("torch", "onnx"):
        raise ValueError(f"runtime={runtime!r}: choose 'torch' or 'onnx'.")
    paths = list(path) if isinstance(path, (list, tuple)) else [path]
    path = resolve_init_from(paths[0]) if len(paths) == 1 else None  # one model; else a trunk and task directories
    if runtime == "onnx" and path is None:
        raise ValueError("runtime='onnx' runs the graphs of one exported trunk directory; task directories run in torch.")
    graphs = OnnxGraphs(path) if runtime == "onnx" else None  # checks for the graphs before the model loads
    if path is None or path.is_dir() and not is_sharded_checkpoint(path):
        pretrained = read_trunk(paths if path is None else path)
        if not pretrained.heads:
            raise ValueError(f"'{pretrained.path}' holds a trunk without heads: there is nothing to predict. Fine-tune it first, "
                             "or export a fine-tuned checkpoint with `trunk export CKPT DIR`.")
        heads = {name: head["meta"] for name, head in pretrained.heads.items()}
        run = _run_data(pretrained.path, {name: meta.get("data") for name, meta in heads.items()},
                        {name: meta.get("data_state", {}) for name, meta in heads.items()}, data)
        for name, meta in heads.items():
            if meta.get("label_names") is not None:
                run.tasks[name].use_labels_of(meta["label_names"], f"'{pretrained.path}'")
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
    if merge:
        model.merge_delta()
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
