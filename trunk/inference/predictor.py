"""Inference in plain Python, without the CLI:

    from trunk.tasks import load
    model = load("runs/sst2/lightning_logs/version_0/checkpoints/last.ckpt")     # or a trunk directory with heads
    model.predict(["a gripping film", "a dull plot"], task="sst2")
    # [{"text": "a gripping film", "label": "positive", "probs": {...}}, ...]  (the records of `trunk predict`)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info

from trunk.assembly.run import read_run_checkpoint, resolve
from trunk.core.checkpoint import is_sharded_checkpoint
from trunk.datamodules import TaskSet
from trunk.datamodules.text import Preprocessor, TaskData, length_order
from trunk.formats.artifacts import resolve_init_from
from trunk.formats.task_dir import read_trunk
from trunk.formats.trunk_dir import without_splits
from trunk.inference.calibrate import choose_form
from trunk.inference.quantize import check_quantize, quantize_trunk
from trunk.inference.runtimes import Runtime, TorchRuntime, open_runtime
from trunk.tasks.registry import check_stored_tasks, stored_spec_class
from trunk.training.module import TrunkModule
from trunk.training.precision import resolve_precision
from trunk.training.threads import cap_threads

INFERENCE_PRECISIONS = ("auto", "32-true", "bf16-mixed")


class Predictor:
    """A trained model, the runtime that computes it, and per task the preprocessor that turns raw inputs into its
    batches (``TaskData.preprocessor``).

    ``precision``: ``auto`` computes in bf16 where the device does so natively and in fp32 elsewhere
    (the rule of training runs, ``trunk.training.precision``); ``32-true`` or ``bf16-mixed`` force one. (``load``
    measures instead: its ``auto`` is the fastest form on a CPU, int8 included, ``trunk.inference.calibrate``.)"""

    def __init__(self, model: TrunkModule, preprocessors: dict[str, Preprocessor | TaskData], precision: str = "auto",
                 runtime: Runtime | None = None) -> None:
        """``preprocessors``: task -> its ``Preprocessor``, or its data (which hands one over)."""
        if precision not in INFERENCE_PRECISIONS:
            raise ValueError(f"precision={precision!r}: inference runs in one of {list(INFERENCE_PRECISIONS)}.")
        self.preprocessors = {name: p if isinstance(p, Preprocessor) else p.preprocessor()
                              for name, p in preprocessors.items()}
        self.model, self.runtime = model.eval(), runtime or TorchRuntime()
        self.precision = self.runtime.precision or resolve_precision(precision, model.device.type)

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
        for i, x in enumerate(inputs):
            unreadable = not_unicode(x)
            if unreadable:
                raise ValueError(f"input {i} is not valid Unicode: {unreadable}; send the character itself, or drop it")
        return self.preprocessors[task].encode(inputs)

    @torch.inference_mode()
    def predict_encoded(
        self, examples: dict[str, list], batch_size: int = 64, shared: bool = True
    ) -> dict[str, list[dict]]:
        """Each task's records of its examples (from ``encode``), in their order. ``shared``: every task's examples are
        of the same inputs, and a batch holds the same inputs for every task; else each task brings its own inputs
        (requests for different tasks) and a batch mixes them. Batches follow the order of length, and each is one
        trunk pass for all its tasks (``TrunkOnce``)."""
        def length(name: str, i: int) -> int:
            return self.preprocessors[name].length(examples[name][i])

        if shared:
            first = next(iter(examples))
            units = [[(name, i) for name in examples] for i in range(len(examples[first]))]  # an input, for every task
            # each takes rows of its own above the fork
            deltas = sum(name in self.model.router.deltas for name in examples)
            # so a pass holds ~batch_size rows
            batch_size = max(1, batch_size // max(1, deltas + (deltas < len(examples))))
        else:
            units = [[(name, i)] for name in examples for i in range(len(examples[name]))]
        units = [units[k] for k in length_order([length(*unit[0]) for unit in units])]
        answers = {name: [None] * len(task_examples) for name, task_examples in examples.items()}
        bf16 = (
            torch.autocast(self.model.device.type, dtype=torch.bfloat16)
            if self.precision == "bf16-mixed"
            else contextlib.nullcontext()
        )
        for start in range(0, len(units), batch_size):
            members: dict[str, list[int]] = {}
            for name, i in (pair for unit in units[start : start + batch_size] for pair in unit):
                members.setdefault(name, []).append(i)
            with bf16:
                records = self._predict_batch({name: self.preprocessors[name].collate([examples[name][i] for i in rows])
                                               for name, rows in members.items()})
            for name, rows in members.items():
                for i, record in zip(rows, records[name]):
                    truncated = isinstance(examples[name][i], dict) and examples[name][i].get("truncated")
                    answers[name][i] = {**record, "truncated": True} if truncated else record
        return answers

    def check_tasks(self, task: str | list[str] | None) -> list[str]:
        if task is None and len(self.tasks) != 1:
            raise ValueError(
                f"This model has the tasks {self.tasks}: name one with task=..., or several with task=[...]."
            )
        names = self.tasks if task is None else [task] if isinstance(task, str) else list(task)
        unknown = [name for name in names if name not in self.preprocessors]
        if unknown or not names:
            raise ValueError(
                f"No task named {', '.join(map(repr, unknown)) or '(none given)'}; this model's tasks are {self.tasks}."
            )
        self.runtime.check(names)
        return names

    def _predict_batch(self, batches: dict[str, dict]) -> dict[str, list[dict]]:
        """Each task's records of its batch, computed by the runtime (torch: as few trunk passes as ``TrunkOnce``
        needs)."""
        device = self.model.device
        batches = {
            name: {"task": name, **{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}}
            for name, batch in batches.items()
        }
        return self.runtime.predict(self.model, batches)


def load(path: str | Path | list, data: dict | None = None, map_location: str = "cpu", precision: str = "auto",
         runtime: str = "torch", merge: bool = False, quantize: str | None = None,
         options: dict[str, dict] | None = None) -> Predictor:
    """A ``Predictor`` from a checkpoint written by ``trunk fit`` or from a trunk directory with heads, read
    once (``trunk.assembly.run``: labels in the order the heads were trained in, tokenizer and lengths as stored).
    ``path`` may be a list: a trunk (directory or checkpoint) and task directories (``trunk export CKPT DIR --task
    NAME``), each task answered on the one trunk.

    ``data``: task name -> its ``TaskData``, for checkpoints of runs built in Python (the CLI's
    checkpoints store each task's data settings). ``precision``: ``auto`` is the form this device runs the model
    fastest in: on a CPU fp32, bf16 or int8 as measured on the model's shape (``trunk.inference.calibrate``), on a GPU
    bf16 where it has bf16 tensor cores; ``32-true`` or ``bf16-mixed`` force one. ``runtime="onnx"``: the
    tasks' graphs run in ONNX Runtime (a trunk directory exported with ``trunk export CKPT DIR --onnx``); the choices
    are ``trunk.inference.runtimes.RUNTIMES``.
    ``merge``: a model of one task with a LoRA delta has the delta written into the trunk's weights, so a forward costs
    what the trunk's does. ``quantize="int8"``: the trunk's linear layers compute in int8 (``trunk.inference.quantize``;
    with ``runtime="onnx"``, the int8 graphs of ``trunk export --onnx --quantize int8``). ``options``: task -> options
    that change its predictions but not its weights, set anew (``{"t": {"target_language": "fra_Latn"}}``; each
    objective's ``inference_options``)."""
    check_quantize(quantize)
    if str(map_location) == "cpu":
        cap_threads()
    paths = list(path) if isinstance(path, (list, tuple)) else [path]
    path = resolve_init_from(paths[0]) if len(paths) == 1 else None  # one model; else a trunk and task directories
    # before the model loads: a missing piece (graphs, a package) is said first
    runtime = open_runtime(runtime, path, quantize)
    if path is None or path.is_dir() and not is_sharded_checkpoint(path):
        pretrained = read_trunk(paths if path is None else path)
        if not pretrained.heads:
            raise ValueError(
                f"'{pretrained.path}' holds a trunk without heads: there is nothing to predict. Fine-tune it first, or "
                "export a fine-tuned checkpoint with `trunk export CKPT DIR`."
            )
        heads = {name: head["meta"] for name, head in pretrained.heads.items()}
        for name, head in pretrained.heads.items():  # the classes they name, before anything is built from them
            check_stored_tasks(str(head.get("source", pretrained.path)), {name: head["meta"]["objective"]},
                               {name: head["meta"].get("data")}, {name: head["meta"]["kind"]})
        tasks = _task_data(pretrained.path, {name: meta.get("data") for name, meta in heads.items()},
                           {name: meta.get("data_state", {}) for name, meta in heads.items()}, data)
        run = TaskSet(tasks)  # the tasks' data without a datamodule: resolve() connects the directory's tokenizer
        for name, meta in heads.items():
            if meta.get("label_names") is not None:
                run.tasks[name].use_labels_of(meta["label_names"], f"'{pretrained.path}'")
        # heads trained with a delta bring it
        peft = {name: meta["peft"] for name, meta in heads.items() if meta.get("peft")}
        model = resolve(
            {"tasks": {name: meta["objective"] for name, meta in heads.items()}, **({"peft": peft} if peft else {})},
            run,
            init_from=pretrained,
        ).model
    else:
        ckpt = read_run_checkpoint(path)
        specs = (ckpt.get("datamodule_hyper_parameters") or {}).get("data_tasks") or {}
        tasks = _task_data(path, specs, {}, data)  # their state comes from the checkpoint in resolve
        model = resolve({}, TaskSet(tasks), ckpt_path=path, checkpoint=ckpt).model
        model.on_load_checkpoint(ckpt)  # refuses non-finite weights
        model.load_state_dict(ckpt["state_dict"])
    for name, chosen in (options or {}).items():
        if name not in model.objectives:
            raise ValueError(f"options name the task '{name}', which the model lacks; its tasks: "
                             f"{list(model.objectives)}.")
        model.objectives[name].set_inference_options(chosen)
    if merge:
        merge_delta(model)
    model = model.to(map_location)
    if runtime.name == "torch":
        precision, quantize, said = choose_form(model.trunk.cfg, model.device, precision, quantize)
        if said:
            rank_zero_info(f"Precision: {said}.")
        if quantize:
            rank_zero_info(quantize_trunk(model, quantize))
    for name, member in tasks.items():
        if member.stem == "image" and member.image_size is None:  # any image at the size the model was trained on:
            member.image_size = model.objective(name).image_size  # a huge one costs what a small one does
    return Predictor(
        model, {name: member.preprocessor() for name, member in tasks.items()}, precision, runtime
    )


def merge_delta(model: TrunkModule) -> None:
    """Write the LoRA of a one-task model into the trunk's weights, for inference: a forward then costs what the trunk's
    does. With several tasks the trunk is shared, so it must stay as it is."""
    lora = [name for name, delta in model.router.deltas.items() if delta.config.method == "lora"]
    if len(model.objectives) != 1 or len(lora) != 1:
        raise ValueError(
            "merge writes one task's LoRA into the trunk, which needs a model of that one task; this model has the "
            f"tasks {list(model.objectives)}, with LoRA on {lora or 'none'}. Load it without merge (or load the trunk "
            "with only that task's directory)."
        )
    model.router.merge(model.trunk.backbone, lora[0])


def _task_data(path: Path, specs: dict, states: dict, given: dict | None) -> dict[str, TaskData]:
    """The stored tasks' data settings (as the run configured them, without their splits and sources), or the
    ``given`` ones, with their stored state (label names, image statistics)."""
    tasks = {**{name: _instantiate(without_splits(spec)) for name, spec in specs.items() if spec}, **(given or {})}
    missing = sorted(set(specs) - set(tasks))
    if missing:
        raise ValueError(
            f"'{path}' holds no data settings for the tasks {missing} (a run built in Python): pass them as load(path, "
            "data={task: TextClassificationData(...), ...})."
        )
    for name, member in tasks.items():
        if name in states:
            member.load_state_dict(states[name])
    return tasks


def _instantiate(spec: dict) -> TaskData:
    return stored_spec_class(spec, TaskData)(**spec.get("init_args", {}))


def not_unicode(x) -> str | None:
    """Where a text of an input (a string, or lists and dicts of them) cannot be written as UTF-8, in words: a lone
    surrogate such as JSON's ``"\\ud800"`` decodes to a Python string that no tokenizer reads (its error does not say
    which input)."""
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError as err:
            before = x[max(0, err.start - 30) : err.start]
            return f"{err.reason}, {x[err.start]!r} at character {err.start} after {before!r}"
        return None
    values = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else ()
    return next(filter(None, map(not_unicode, values)), None)
