"""ONNX export of a trained model: one graph per task, token ids and attention mask in, the task's raw outputs
out (classification and multi-label logits, regression scores on the data's scale, NER per-token logits),
with dynamic batch and sequence axes. The tokenizer and the labels are the trunk directory's, beside it.

    trunk export CKPT DIR --onnx      # DIR/onnx/<task>.onnx
    trunk.tasks.load(DIR, runtime="onnx")   # the same records, computed by ONNX Runtime (also `trunk serve --runtime
    onnx`)
    trunk export CKPT DIR --onnx --quantize int8   # and DIR/onnx/<task>.int8.onnx: load(DIR, runtime="onnx",
    quantize="int8")

The int8 graphs are ONNX Runtime's dynamic quantization of the fp32 ones: every matrix product with a weight, and the
embedding tables, in int8 (weights per output column), activations quantized as they arrive; the heads' final
``Gemm`` stays in float. Each graph's listing holds the checksum of the weights it was made from, so graphs left
beside other weights are refused.

Needs ``pip install trunk[onnx]`` (onnx, onnxscript for torch's exporter, onnxruntime to run the graphs).
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from trunk.core.codec import CLS, PAD, SEP, special_id
from trunk.formats.trunk_dir import CONFIG_FILE, WEIGHTS_FILE


class TaskGraph(nn.Module):
    """The trunk and one task's head (with its delta, ``model.peft``) as one module of (input_ids, attention_mask): what
    is exported. The delta's route is set around the forward, so tracing records the delta's operations."""

    def __init__(self, model: nn.Module, task: str) -> None:
        super().__init__()
        self.trunk, self.objective, self.route = model.trunk, model.objective(task), lambda: model.route(task)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        with self.route():
            return self.objective.export_forward(self.trunk, input_ids, attention_mask)


def export_onnx(
    model: nn.Module, directory: str | Path, opset: int = 18, quantize: str | None = None
) -> dict[str, Path]:
    """Write ``directory/onnx/<task>.onnx`` for every exportable head of ``model`` (a ``TrunkModule`` in fp32, as
    loaded from the trunk directory ``directory``, written by ``trunk export``), and ``onnx/tasks.json`` naming each
    graph's inputs, output and labels. ``quantize="int8"``: also ``<task>.int8.onnx``, the same graph in int8."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401

        if quantize:
            import onnxruntime.quantization  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"ONNX export needs the onnx extra ({err.name} is missing): pip install 'trunk[onnx]'."
        ) from None
    directory = Path(directory)
    tokenizer = model.codec.tokenizer
    exportable = {name: o for name, o in model.objectives.items() if o.onnx_output is not None}
    if not exportable:
        raise ValueError(
            f"'{directory}' has no task that exports to ONNX (classification, multi-label, regression, NER); its tasks "
            f"are {list(model.objectives)}."
        )
    out = directory / "onnx"
    out.mkdir(exist_ok=True)
    cls, sep, pad = (special_id(tokenizer, t) for t in (CLS, SEP, PAD))
    word = tokenizer.get_vocab_size() - 1
    first, last = (word if i is None else i for i in (cls, sep))  # a tokenizer without them: words there
    # with padding: the mask's path is traced
    example = torch.tensor([[first, word, word, word, last], [first, word, last, pad, pad]])
    mask = (example != pad).long()
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", min=2, max=model.trunk.cfg.max_len)
    written, listing, weights = {}, {}, weights_sha256(directory)
    for name, objective in exportable.items():
        path = out / f"{name}.onnx"
        with warnings.catch_warnings():  # the exporter's notes on its own internals
            warnings.simplefilter("ignore")
            torch.onnx.export(
                TaskGraph(model, name).eval(),
                (example, mask),
                str(path),
                dynamo=True,
                opset_version=opset,
                input_names=["input_ids", "attention_mask"],
                output_names=[objective.onnx_output],
                dynamic_shapes=({0: batch, 1: length}, {0: batch, 1: length}),
                external_data=False,
                verbose=False,
            )
        written[name] = path
        if quantize:
            written[f"{name} (int8)"] = int8 = quantize_graph(path)
        listing[name] = {
            "file": path.name,
            **({"int8": int8.name} if quantize else {}),
            "weights_sha256": weights,
            "inputs": ["input_ids", "attention_mask"],
            "output": objective.onnx_output,
            "kind": objective.kind,
            "label_names": objective.label_names,
            "max_length": model.trunk.cfg.max_len,
            "tokenizer": "../tokenizer.json",
        }
    (out / "tasks.json").write_text(json.dumps(listing, indent=2) + "\n")
    return written


def quantize_graph(path: Path) -> Path:
    """``<task>.int8.onnx`` beside the fp32 graph ``path``: ONNX Runtime's dynamic quantization (int8 weights per output
    column; ``Gemm``, the heads' last layer, is not among the ops it quantizes dynamically)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target = path.with_suffix(".int8.onnx")
    # ONNX Runtime advises shape pre-processing on the root logger (configuring logging for the whole process when
    # nothing has): its symbolic shape inference fails on torch's graphs, and the rest changed no quantized op in them
    root = logging.getLogger()
    guard = logging.NullHandler() if not root.handlers else None

    def advice(record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()

    root.addFilter(advice)
    if guard:
        root.addHandler(guard)
    try:
        quantize_dynamic(path, target, per_channel=True, weight_type=QuantType.QInt8)
    finally:
        root.removeFilter(advice)
        if guard:
            root.removeHandler(guard)
    return target


def weights_sha256(directory: Path) -> str | None:
    """The checksum of a trunk directory's weights, as its config.json lists it."""
    config = json.loads((Path(directory) / CONFIG_FILE).read_text())
    return (config.get("sha256") or {}).get(WEIGHTS_FILE)
