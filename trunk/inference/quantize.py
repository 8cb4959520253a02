"""int8 inference: the trunk's linear layers compute in int8 (``load(path, quantize="int8")``, ``trunk predict |
validate | test --quantize int8``, ``trunk serve --quantize int8``).

Each linear layer of the trunk's blocks keeps its weight as int8 with one scale per output row; its input is quantized
as it arrives, one scale per token (the rows' ranges differ by 10x and more in a trained transformer, and a scale per
token keeps each row's precision); the product is ``torch._int_mm`` (int8 x int8 -> int32, oneDNN's VNNI / AMX kernels
on x86) and is scaled back to float. Everything else (embeddings, norms, attention's softmax, the heads, the task
deltas) stays in float: the heads read the trunk's output once per input (a small share of the cost) and their logits
are what a prediction is made of.

Written here rather than taken from a library in ~40 lines: torch.ao's eager dynamic quantization is deprecated (it
warns on use and is to be removed), and torchao's equivalent (per-token int8 activations, per-row int8 weights over
``torch._int_mm``) would be a dependency for this one layer. ONNX graphs are quantized by ONNX Runtime itself
(``trunk.formats.onnx``).
"""

from __future__ import annotations

import torch
from lightning.pytorch import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from trunk.training.precision import int8_is_native

QUANTIZE = (None, "int8")  # what `quantize` takes: None (float) or "int8"


class Int8Linear(nn.Module):
    """An ``nn.Linear`` for inference with its weight in int8 (one scale per output row) and its input quantized per
    token as it arrives. ``weight`` gives the float weight back (what a DoRA delta reads), from the int8 one."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        # (in, out): the layout _int_mm reads fastest
        self.register_buffer("weight_int8", torch.zeros(in_features, out_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @classmethod
    @torch.no_grad()
    def from_float(cls, linear: nn.Linear) -> Int8Linear:
        weight = linear.weight.detach().float()
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None).to(weight.device)
        int8, scale = quantize_rows(weight)
        layer.weight_int8.copy_(int8.t())
        layer.weight_scale.copy_(scale[:, 0])
        if linear.bias is not None:
            layer.bias.copy_(linear.bias.detach().float())
        return layer

    @property
    def weight(self) -> torch.Tensor:
        return self.weight_int8.t().float() * self.weight_scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.training):
            raise RuntimeError(
                "This model's trunk is quantized to int8, which is for inference only: its weights cannot learn. "
                "Train (or fine-tune) the float checkpoint, and quantize it when predicting or serving."
            )
        inputs, scale = quantize_rows(x.reshape(-1, self.in_features).float())
        # in place: a (tokens, out) product scale would cost a pass over memory as large as the output
        out = torch._int_mm(inputs, self.weight_int8).to(torch.float32).mul_(scale).mul_(self.weight_scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, C) float rows as int8 with one scale per row, (R, 1): symmetric, so 0 is exact, as padding needs."""
    scale = rows.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127)
    return (rows / scale).round_().to(torch.int8), scale


def check_quantize(mode: str | None) -> None:
    if mode not in QUANTIZE:
        raise ValueError(f"quantize={mode!r}: choose 'int8', or leave it out for float weights.")


def quantize_trunk(model: nn.Module, mode: str | None) -> str | None:
    """Quantize a ``TrunkModule``'s trunk in place for inference (``mode``: one of ``QUANTIZE``), and say in a line
    what runs in int8 (``None`` when nothing changes); warn where the CPU has no int8 units. The tasks' delta hooks move
    to the new layers."""
    check_quantize(mode)
    if mode is None:
        return None
    if model.device.type != "cpu":
        raise ValueError(
            f"quantize=int8 runs on CPUs; this model is on {model.device.type}, where bf16 (precision bf16-mixed) is "
            "the fast path: drop --quantize, or load the model on the CPU."
        )
    backbone = model.trunk.backbone
    linears = quantize_blocks(backbone)
    if not linears:
        return None
    model.router.reattach(backbone)  # the tasks' delta hooks sat on the float layers
    float_weights = sum(linear.weight.numel() for _, linear in linears)
    native, why = int8_is_native()
    if not native:
        rank_zero_warn(f"quantize=int8: {why}, so int8 will not be faster here; leave --quantize out.")
    return (f"Quantized: int8 weights and per-token int8 inputs for the trunk's {len(linears)} linear layers "
            f"({float_weights:,} weights); embeddings, norms, attention scores, heads and deltas in float.")


def quantize_blocks(backbone: nn.Module, make=Int8Linear.from_float) -> list[tuple[str, nn.Linear]]:
    """Put ``make(linear)`` (an ``Int8Linear``) in place of each linear layer of a backbone's blocks; the float layers
    replaced, by name."""
    linears = [(name, m) for name, m in backbone.named_modules()
               if isinstance(m, nn.Linear) and name.startswith("blocks.")]
    for name, linear in linears:
        parent, _, leaf = name.rpartition(".")
        setattr(backbone.get_submodule(parent), leaf, make(linear))
    return linears


class QuantizeForEvaluation(Callback):
    """``trunk validate | test | predict --quantize int8``: the trunk is quantized when the evaluation starts, after
    Lightning has restored the checkpoint's float weights into it."""

    def __init__(self, mode: str) -> None:
        check_quantize(mode)
        self.mode = mode

    def _quantize(self, trainer, pl_module) -> None:
        if not any(isinstance(m, Int8Linear) for m in pl_module.modules()):
            said = quantize_trunk(pl_module, self.mode)
            if said:
                rank_zero_info(said)

    on_validation_start = on_test_start = on_predict_start = _quantize
