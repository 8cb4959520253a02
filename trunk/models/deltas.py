"""Per-task deltas on a shared, frozen trunk (parameter-efficient fine-tuning): LoRA on the blocks' linear layers and
bottleneck adapters after their feed-forward sublayers, one set per task. Either can also shift the trunk's LayerNorm
gains and biases (LN tuning), and a LoRA can be a DoRA.

A task's delta is a module of its own (``TaskDelta``), owned by the task like its head, so a task file is its head
plus its delta, and the trunk's weights and state-dict keys never change. The trunk runs the deltas through forward
hooks on its layers (``DeltaRouter``); which task's delta a row of the batch takes is set around each forward
(``router.route``) as contiguous slices of the batch, as AdapterHub's ``BatchSplit``: a training step is one slice,
a predict batch of several tasks one slice per task. Under the real-token path (``Unpadded``) an example's tokens are
contiguous rows, so slices of examples map to slices of tokens.

Trunk writes these rather than depending on ``peft``: peft requires transformers and accelerate at install, wraps
the layers it adapts (changing the trunk's state-dict keys), and routes mixed batches row by row in Python lists.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

LORA_TARGETS = ("q_proj", "kv_proj", "out_proj", "fc_in", "fc_gate", "fc_out")  # the linear layers of a block, by name
NORMS = ("norm_attn", "norm_ff", "final_norm")  # the backbone's LayerNorms, by name
METHODS = ("lora", "adapter")


@dataclass(frozen=True)
class DeltaConfig:
    """One task's delta. ``lora``: rank ``r``, scaling ``alpha / r``, ``dropout`` on the LoRA path, on the
    ``targets`` of every block (or of ``layers``). ``adapter``: a bottleneck of width ``r`` after each block's
    feed-forward sublayer (Pfeiffer placement), its up-projection starting at zero so the trunk starts unchanged.
    ``norms``: also learn a shift of every LayerNorm's gain and bias in those blocks and of the final one (2 x d_model
    weights a norm; peft's LNTuning trains the norms themselves, which here are the trunk every task shares). ``dora``:
    LoRA as DoRA (Liu et al.
    2024; peft's ``use_dora``): the adapted weight's rows are rescaled to learned lengths (one weight per output)."""

    method: str = "lora"
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "kv_proj", "out_proj", "fc_in", "fc_out")
    layers: tuple[int, ...] | None = (
        None  # the blocks that get a delta (None: all); the blocks below the lowest are shared
    )
    norms: bool = False
    dora: bool = False
    # other tasks' trained deltas this one adds, frozen, each weighted per block by a learned mix (from 1 / their
    # number):
    # task -> its options; in a config a list of names, whose options ``model.init_from``'s task directories give
    compose: dict[str, dict] | None = None

    @classmethod
    def from_dict(cls, options: dict | None) -> DeltaConfig:
        """From a config's or a stored head's options (lists for ``targets`` and ``layers``)."""
        return cls(
            **{k: tuple(v) if k in ("targets", "layers") and v is not None else v for k, v in (options or {}).items()}
        )

    def fits(self, other: DeltaConfig) -> bool:
        """Whether a delta trained with ``other`` computes as one built with these options (dropout aside)."""
        return dataclasses.replace(self, dropout=0.0) == dataclasses.replace(other, dropout=0.0)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"peft method {self.method!r}: choose one of {list(METHODS)}.")
        if not (isinstance(self.r, int) and self.r > 0):
            raise ValueError(f"peft r={self.r!r}: the rank (or bottleneck width) must be a positive integer.")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"peft dropout={self.dropout!r} must be a probability in [0, 1).")
        unknown = sorted(set(self.targets) - set(LORA_TARGETS))
        if self.method == "lora" and (unknown or not self.targets):
            raise ValueError(
                f"peft targets {unknown or '(none)'} match no layer of a block; the layers are {list(LORA_TARGETS)}."
            )
        if self.dora and self.method != "lora":
            raise ValueError(f"peft dora=true is a form of LoRA; method {self.method!r} cannot take it.")
        if self.compose is not None and not (isinstance(self.compose, dict) and self.compose):
            raise ValueError(
                f"peft compose={self.compose!r}: compose takes the names of tasks whose deltas model.init_from brings "
                "(their task directories), e.g. compose: [sst2, conll], with model.init_from: [TRUNK, SST2_TASK_DIR, "
                "CONLL_TASK_DIR]."
            )


class LoRA(nn.Module):
    """``x -> B(A(dropout(x))) * alpha / r`` beside a frozen ``in_features -> out_features`` layer; B starts at zero.

    With ``dora``, the layer computes ``(W + BA) x * scale + b`` instead, ``scale`` taking each row of ``W + BA`` to
    the length of ``W``'s row times ``1 + magnitude`` (zero at the start: the layer as it was). The lengths of
    ``W + BA`` count as constants in backward, as the DoRA paper trains them (less memory, the same results)."""

    def __init__(
        self, in_features: int, out_features: int, r: int, alpha: float, dropout: float, dora: bool = False
    ) -> None:
        super().__init__()
        if r > min(in_features, out_features):
            raise ValueError(
                f"peft r={r} is larger than the layer it adapts ({in_features} -> {out_features}): use at most "
                f"{min(in_features, out_features)}."
            )
        self.A = nn.Parameter(torch.empty(r, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, r))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # as nn.Linear (and peft) initialise
        self.scaling, self.dropout = alpha / r, nn.Dropout(dropout)
        self.magnitude = nn.Parameter(torch.zeros(out_features)) if dora else None

    def forward(self, x: torch.Tensor, layer: nn.Linear, output: torch.Tensor) -> torch.Tensor:
        """What this delta adds to ``layer``'s ``output`` for the input ``x``."""
        added = (
            (self.dropout(x) @ self.A.t()) * self.scaling
        ) @ self.B.t()  # scaled at rank r: a pass over r columns, not out
        if self.magnitude is None:
            return added
        scale = self.row_scale(layer.weight).to(output.dtype)
        plain = output if layer.bias is None else output - layer.bias.to(output.dtype)
        return plain * (scale - 1) + added * scale  # (W x + BA x) * scale + b, less the layer's own W x + b

    def row_scale(self, weight: torch.Tensor) -> torch.Tensor:
        """DoRA's per-output factor on ``W + BA``: each row's length taken to ``|W row| * (1 + magnitude)``."""
        with torch.no_grad():
            lengths = weight.norm(dim=1) / (weight + self.weight_delta()).norm(dim=1).clamp(min=1e-12)
        return lengths * (1 + self.magnitude)

    def weight_delta(self) -> torch.Tensor:
        """The (out, in) matrix this delta adds to its layer's weight (before DoRA's rescaling)."""
        return (self.B @ self.A) * self.scaling


class Bottleneck(nn.Module):
    """``h -> h + up(gelu(down(h)))``: an adapter after a sublayer; ``up`` starts at zero."""

    def __init__(self, width: int, r: int) -> None:
        super().__init__()
        if r > width:
            raise ValueError(f"peft r={r} is wider than the model ({width}): a bottleneck adapter needs r <= {width}.")
        self.down, self.up = nn.Linear(width, r), nn.Linear(r, width)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor, layer: nn.Module, output: torch.Tensor) -> torch.Tensor:
        """What it adds to its sublayer's ``output`` (read from the output, not the sublayer's input ``x``)."""
        return self.up(torch.nn.functional.gelu(self.down(output)))


class NormShift(nn.Module):
    """``x -> LN(x) * gain + bias`` with the frozen norm's own shape and eps: what shifting that norm's gain and bias by
    ``gain`` and ``bias`` (both starting at zero) adds to its output. An RMSNorm (and a bias-free LayerNorm) has a gain
    only."""

    def __init__(self, norm: nn.LayerNorm | nn.RMSNorm) -> None:
        super().__init__()
        self.shape, self.eps, self.rms = norm.normalized_shape, norm.eps, isinstance(norm, nn.RMSNorm)
        self.gain = nn.Parameter(torch.zeros(self.shape))
        self.bias = None if self.rms or norm.bias is None else nn.Parameter(torch.zeros(self.shape))

    def forward(self, x: torch.Tensor, layer: nn.Module, output: torch.Tensor) -> torch.Tensor:
        """What it adds to the norm's ``output`` for its input ``x``."""
        if self.rms:
            return nn.functional.rms_norm(x, self.shape, self.gain, self.eps)
        return nn.functional.layer_norm(x, self.shape, self.gain, self.bias, self.eps)


class TaskDelta(nn.Module):
    """One task's delta for every block of a trunk: ``parts`` maps a layer's name in the backbone
    (``blocks.0.attn.q_proj``, ``blocks.0.ff``) to what it adds to that layer's output. With ``config.compose``, other
    tasks' deltas (``sources``, frozen) add theirs too, each scaled per block by ``mix`` (learned): a new task starts
    from the average of tasks it may share something with, and learns how much of each to keep (LoraHub; AdapterHub's
    ``Average``)."""

    def __init__(self, backbone: nn.Module, config: DeltaConfig) -> None:
        super().__init__()
        self.config = config
        n_layers = len(backbone.blocks)
        self.sources = nn.ModuleDict(
            {
                task: TaskDelta(backbone, dataclasses.replace(DeltaConfig.from_dict(options), dropout=0.0))
                for task, options in (config.compose or {}).items()
            }
        ).requires_grad_(False)
        self.mix = (
            nn.Parameter(torch.full((len(self.sources), n_layers), 1 / len(self.sources))) if self.sources else None
        )
        layers = set(range(n_layers)) if config.layers is None else set(config.layers)
        outside = sorted(layer for layer in layers if not 0 <= layer < n_layers)
        if outside or not layers:
            raise ValueError(f"peft layers {outside or '(none)'}: this trunk's blocks are 0 .. {n_layers - 1}.")
        parts = {}
        for name, module in backbone.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            # the final norm sits above every block
            in_layers = (leaf == "final_norm" or block_of(name, n_layers) in layers)
            if config.norms and leaf in NORMS and isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and in_layers:
                parts[name] = NormShift(module)
            if not name.startswith("blocks.") or not in_layers:
                continue
            if config.method == "lora" and leaf in config.targets and isinstance(module, nn.Linear):
                parts[name] = LoRA(
                    module.in_features, module.out_features, config.r, config.alpha, config.dropout, config.dora
                )
            elif config.method == "adapter" and leaf == "ff":
                parts[name] = Bottleneck(backbone.cfg.d_model, config.r)
        if not parts:
            raise ValueError(f"peft {config.method}: no layer of this trunk matches.")
        # ModuleDict keys have no dots
        self.parts = nn.ModuleDict({key.replace(".", "__"): part for key, part in parts.items()})
        self.n_layers = n_layers

    def part(self, layer: str) -> nn.Module | None:
        key = layer.replace(".", "__")
        return self.parts[key] if key in self.parts else None  # noqa: SIM401 (a ModuleDict has no get)

    def blocks(self) -> set[int]:
        """The blocks this delta (with its sources) changes."""
        own = {block_of(key.replace("__", "."), self.n_layers) for key in self.parts}
        return own.union(*(source.blocks() for source in self.sources.values()))

    def touches(self, layer: str) -> bool:
        return self.part(layer) is not None or any(source.touches(layer) for source in self.sources.values())

    def forward(self, layer: str, module: nn.Module, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """What this delta adds to the output of ``layer`` (``module``; ``x``: its input; an adapter reads the
        output)."""
        part = self.part(layer)
        added = part(x, module, output) if part is not None else 0  # every part: (input, layer, output) -> what it adds
        for i, source in enumerate(self.sources.values()):
            if source.touches(layer):
                added = added + self.mix[i, block_of(layer, self.n_layers)] * source(layer, module, x, output)
        return added


def block_of(layer: str, n_layers: int) -> int:
    """The block a backbone layer belongs to (``blocks.2.attn.q_proj``: 2); the final norm counts as the top block's."""
    return int(layer.split(".")[1]) if layer.startswith("blocks.") else n_layers - 1


class DeltaRouter:
    """The hooks that add each task's delta to the trunk's layers, and the routes of the running forward.

    ``attach(backbone)`` hooks every block layer once; ``add(task, delta)`` registers a task's delta (the module stays
    where its owner keeps it); ``with router.route([(task, rows), ...], key_padding_mask)`` sets the routes for the
    forwards inside: ``rows`` consecutive examples per task, in order, covering the batch (one route: the whole batch,
    ``rows`` unused). A route's task ``None`` (or a task without a delta) leaves its rows to the trunk alone."""

    def __init__(self) -> None:
        self.deltas: dict[str, TaskDelta] = {}
        self.routes: list[tuple[str, int]] | None = None
        self.token_counts: list[int] | None = None  # real tokens per route, for the (N, C) rows of the real-token path
        self.handles: list = []
        self.merged: str | None = None  # the task whose LoRA is written into the trunk's weights (one-task inference)
        self.dora_scales: dict[str, torch.Tensor] = {}  # the merged task's DoRA row factors, per layer

    def attach(self, backbone: nn.Module) -> None:
        if self.handles:
            return
        self._attach(backbone)

    def reattach(self, backbone: nn.Module) -> None:
        """Hook the backbone's layers again, after some were replaced (``trunk.inference.quantize``); a router that was
        never attached stays so."""
        if not self.handles:
            return
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self._attach(backbone)

    def _attach(self, backbone: nn.Module) -> None:
        for name, module in backbone.named_modules():
            if name.rsplit(".", 1)[-1] in (*LORA_TARGETS, "ff", *NORMS):
                self.handles.append(module.register_forward_hook(self._hook(name)))
        backbone.replay = self.replay

    def replay(self):
        """A context that sets the routes of now again when entered: activation checkpointing recomputes a block in
        backward, after the forward's routes are gone (``run_block``)."""
        return self._using(self.routes, self.token_counts)

    @contextlib.contextmanager
    def _using(self, routes: list | None, token_counts: list[int] | None):
        previous = self.routes, self.token_counts
        self.routes, self.token_counts = routes, token_counts
        try:
            yield
        finally:
            self.routes, self.token_counts = previous

    def add(self, task: str, delta: TaskDelta) -> None:
        self.deltas[task] = delta

    def route(self, routes: list[tuple[str, int | None]], key_padding_mask: torch.Tensor | None = None):
        unknown = [task for task, _ in routes if task is not None and task not in self.deltas]
        if unknown:
            raise KeyError(f"No delta for the tasks {unknown}; the tasks with deltas are {sorted(self.deltas)}.")
        token_counts = None
        if key_padding_mask is not None and len(routes) > 1:
            per_example = key_padding_mask.sum(1)
            bounds = torch.tensor([0, *[rows for _, rows in routes]]).cumsum(0).tolist()
            token_counts = [int(per_example[a:b].sum()) for a, b in zip(bounds, bounds[1:])]
        return self._using(routes, token_counts)

    @torch.no_grad()
    def merge(self, backbone: nn.Module, task: str) -> None:
        """Write ``task``'s LoRA into the trunk's weights, so a forward costs no more than the trunk's: for serving one
        task. Its routes then add nothing; ``unmerge`` restores the weights."""
        if self.merged is not None:
            raise RuntimeError(f"Task {self.merged!r} is merged into the trunk; unmerge it first.")
        self._write(backbone, task, +1)
        self.merged = task

    @torch.no_grad()
    def unmerge(self, backbone: nn.Module) -> None:
        if self.merged is not None:
            self._write(backbone, self.merged, -1)
            self.merged = None

    def _write(self, backbone: nn.Module, task: str, sign: int) -> None:
        delta = self.deltas[task]
        if delta.config.method != "lora" or delta.sources:
            raise ValueError(
                f"Task {task!r} has a {'composed' if delta.sources else delta.config.method} delta: only a LoRA of its "
                "own merges into the weights."
            )
        for name, module in backbone.named_modules():
            part = delta.part(name)
            if isinstance(part, LoRA) and part.magnitude is None:
                module.weight += sign * part.weight_delta().to(module.weight.dtype)
            elif isinstance(part, LoRA):  # DoRA: rows rescaled, by factors kept to undo it
                delta_weight = part.weight_delta().to(module.weight.dtype)
                if sign > 0:
                    self.dora_scales[name] = part.row_scale(module.weight).to(module.weight.dtype)[:, None]
                    module.weight.copy_((module.weight + delta_weight) * self.dora_scales[name])
                else:
                    module.weight.copy_(module.weight / self.dora_scales.pop(name) - delta_weight)
            elif isinstance(part, NormShift):
                module.weight += sign * part.gain.to(module.weight.dtype)
                if part.bias is not None:
                    module.bias += sign * part.bias.to(module.bias.dtype)

    def lowest_layer(self, tasks: list[str]) -> int:
        """The lowest block where any of ``tasks`` has a delta: the blocks below give every task the same output."""
        return min(block for task in tasks if task in self.deltas for block in self.deltas[task].blocks())

    def _hook(self, layer: str):
        def add_deltas(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
            if self.merged is not None:  # the trunk's weights are the merged task's: any other forward would be wrong
                if not self.routes or any(task != self.merged for task, _ in self.routes):
                    raise RuntimeError(
                        f"Task {self.merged!r} is merged into the trunk: a forward of other tasks (or of the trunk "
                        "alone) needs it unmerged."
                    )
                return output
            deltas = [
                self.deltas[task] if task is not None and self.deltas[task].touches(layer) else None
                for task, _ in self.routes or ()
            ]
            if not any(delta is not None for delta in deltas):
                return output
            x = inputs[0]
            sizes = (
                self.token_counts
                if x.dim() == 2 and self.token_counts is not None
                else [rows for _, rows in self.routes]
            )
            if len(deltas) == 1:  # the whole batch, one task (a training step): no slicing
                return output + deltas[0](layer, module, x, output)
            pieces, start = [], 0
            for delta, size in zip(deltas, sizes):
                rows = output.narrow(0, start, size)
                added = None if delta is None else delta(layer, module, x.narrow(0, start, size), rows)
                if output.requires_grad:  # autograd keeps inputs for backward: a new tensor, glued back
                    pieces.append(rows if added is None else rows + added)
                elif added is not None:  # inference: each task's rows take their delta in place, no copy of the batch
                    rows.add_(added)
                start += size
            if pieces and start < output.shape[0]:  # the rows that round the real-token path's count (Unpadded)
                pieces.append(output.narrow(0, start, output.shape[0] - start))
            return torch.cat(pieces) if pieces else output
        return add_deltas
