"""Runtimes: what computes each task's outputs for a batch, behind one interface. ``Predictor`` holds one;
``load(runtime=...)`` and ``trunk serve --runtime`` take a name of ``RUNTIMES``. A new runtime is a ``Runtime`` subclass
here and a line in ``RUNTIMES`` (docs/architecture.md).

- ``torch``: the model itself, every task of a batch from as few trunk passes as ``TrunkOnce`` needs.
- ``onnx``: ONNX Runtime sessions over the graphs of ``trunk export CKPT DIR --onnx``; each task's records still come
  from its ``Objective.records``.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch


class Runtime:
    """Each task's prediction records of a batch. ``precision``: the one it computes in (``None``: the model's
    choice)."""

    name: str
    precision: str | None = None

    def check(self, tasks: list[str]) -> None:
        """Refuse, naming them, tasks this runtime cannot answer."""

    def predict(self, model: torch.nn.Module, batches: dict[str, dict]) -> dict[str, list[dict]]:
        raise NotImplementedError


class TorchRuntime(Runtime):
    """The model in PyTorch: tasks whose batches hold the same inputs share one trunk pass (``TrunkOnce``)."""

    name = "torch"

    def __init__(self, path: Path | None = None, quantize: str | None = None) -> None:
        pass  # nothing to open: the model is the runtime (``load`` quantizes it)

    def predict(self, model: torch.nn.Module, batches: dict[str, dict]) -> dict[str, list[dict]]:
        once = TrunkOnce(model, batches)
        return {name: model.objective(name).predict(once.view(name), batch) for name, batch in batches.items()}


class OnnxRuntime(Runtime):
    """ONNX Runtime sessions for the graphs of a trunk directory (``DIR/onnx``), one per task. They stand in for the
    trunk and head, in fp32 (``quantize="int8"``: the int8 graphs)."""

    name = "onnx"
    precision = "32-true"

    def __init__(self, directory: Path | None, quantize: str | None = None) -> None:
        if directory is None:
            raise ValueError(
                "runtime='onnx' runs the graphs of one exported trunk directory; task directories run in torch."
            )
        listing = Path(directory) / "onnx" / "tasks.json"
        if not listing.is_file():
            raise FileNotFoundError(f"'{directory}' holds no ONNX graphs ({listing} is missing): write them with "
                                    f"`trunk export CKPT {directory} --onnx`, or use the torch runtime.")
        try:
            import onnxruntime
        except ImportError:
            raise ImportError("The onnx runtime needs onnxruntime: pip install 'trunk[onnx]'.") from None
        from trunk.formats.onnx import weights_sha256  # here, not above: `trunk serve` reads its options without it

        self.listing = json.loads(listing.read_text())
        graphs = {name: spec.get("int8" if quantize else "file") for name, spec in self.listing.items()}
        if not all(graphs.values()):
            raise FileNotFoundError(f"'{directory}' holds no {quantize} ONNX graphs: write them with `trunk export "
                                    f"CKPT {directory} --onnx --quantize {quantize}`, or load the fp32 ones.")
        weights = weights_sha256(directory)
        stale = sorted(name for name, spec in self.listing.items() if spec.get("weights_sha256", weights) != weights)
        if stale:
            raise ValueError(f"The ONNX graphs of {stale} in '{directory}/onnx' were written from other weights than "
                             f"'{directory}' holds now: write them again with `trunk export CKPT {directory} --onnx"
                             f"{' --quantize ' + quantize if quantize else ''}`.")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()  # ORT would take every core of the machine, not the
        # process's share (load, fit_threads and serve's workers set torch's)
        self.sessions = {
            name: onnxruntime.InferenceSession(str(listing.parent / graph), options, providers=["CPUExecutionProvider"])
            for name, graph in graphs.items()
        }

    def check(self, tasks: list[str]) -> None:
        missing = [task for task in tasks if task not in self.sessions]
        if missing:
            raise ValueError(
                f"The tasks {missing} have no ONNX graph (the exported tasks are {sorted(self.sessions)}; QA, multiple "
                "choice, translation, image and pretraining heads are not exported): use the torch runtime for them."
            )

    def predict(self, model: torch.nn.Module, batches: dict[str, dict]) -> dict[str, list[dict]]:
        self.check(list(batches))
        return {
            name: model.objective(name).records(batch, self.outputs(name, batch)) for name, batch in batches.items()
        }

    def outputs(self, task: str, batch: dict) -> torch.Tensor:
        feeds = {"input_ids": batch["input_ids"].cpu().numpy(), "attention_mask": batch["attention_mask"].cpu().numpy()}
        return torch.from_numpy(self.sessions[task].run(None, feeds)[0])


RUNTIMES: dict[str, type[Runtime]] = {runtime.name: runtime for runtime in (TorchRuntime, OnnxRuntime)}


def open_runtime(name: str, path: Path | None, quantize: str | None = None) -> Runtime:
    """The runtime ``name`` for the model at ``path`` (``None``: a trunk with task directories), opened before the model
    loads so that a missing piece (graphs, a package) is said first."""
    if name not in RUNTIMES:
        raise ValueError(f"runtime={name!r}: choose {' or '.join(map(repr, RUNTIMES))}.")
    return RUNTIMES[name](path, quantize)


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
                by_stem.setdefault(objective.stem, []).append(
                    (name, batch[objective.input_key], batch.get("attention_mask"))
                )
        for stem, calls in by_stem.items():
            self._run(stem, calls)

    def view(self, task: str) -> TaskTrunk:
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
        # masked: pad to one length
        length = (max(x.shape[1] for x, _ in distinct) if distinct[0][1] is not None else None)
        inputs = torch.cat([_pad_to(x, length) for x, _ in distinct])
        mask = None if distinct[0][1] is None else torch.cat([_pad_to(m, length) for _, m in distinct])
        starts = torch.tensor([0, *[len(x) for x, _ in distinct]]).cumsum(0).tolist()
        rows = [torch.arange(starts[which], starts[which + 1]) for _, which, _ in segments]
        fork = None
        # an input read by several deltas: its rows repeat from the fork on
        if sum(len(r) for r in rows) != len(inputs):
            fork = (
                router.lowest_layer([route for route, _, _ in segments if route]),
                torch.cat(rows).to(inputs.device),
            )
        routed_mask = None if mask is None else mask.bool()[fork[1]] if fork else mask.bool()
        routes = [(route, len(r)) for (route, _, _), r in zip(segments, rows)]
        with router.route(routes, routed_mask) if any(route for route, _ in routes) else contextlib.nullcontext():
            out = self.model.trunk(inputs, mask, stem=stem, fork=fork)
        for (_, _, names), piece in zip(segments, out.split([len(r) for r in rows])):
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

    def __call__(
        self, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None, stem: str = "text", **options
    ) -> torch.Tensor:
        if options:  # a pass of its own (DeBERTa's enhanced mask decoder): the shared one computed another output
            with self.once.model.route(self.task):
                return self.once.model.trunk(inputs, attention_mask, stem=stem, **options)
        return self.once.output(self.task, inputs, attention_mask, stem)

    def __getattr__(self, name: str):
        return getattr(self.once.model.trunk, name)
