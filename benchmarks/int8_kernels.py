"""Where int8 inference's time goes on this CPU, kernel by kernel: what bounds int8 against bf16.

Two tables, every side alternating with the others in one process (median of the rounds):

- **per linear layer** of a trunk's blocks (MiniLM's shapes by default), on ``--tokens`` rows (a batch of 32
  sentences of 24 tokens): fp32 and bf16 ``F.linear``; Trunk's ``Int8Linear`` whole, and its three parts (quantizing
  each token's input, ``torch._int_mm``, scaling the int32 product back with the bias); oneDNN's int8 product with its
  weight packed ahead for the CPU's units (``onednn.qlinear_pointwise``, what inductor's x86 int8 lowering calls, bf16
  out, bias fused), on an input already in int8: the floor of any int8 layer built on the kernels torch ships;
- **per block stack** (two blocks of the shape over ``calibrate``'s batches of 12, 24 and 48 tokens): fp32, bf16,
  Trunk's int8 and int8 + bf16, a layer on oneDNN's packed product in bf16, and, with ``--compile``, that layer and
  bf16 through ``torch.compile`` (inductor with freezing: the quantize passes fused into the ops around them).

    python benchmarks/int8_kernels.py [--tokens 768] [--rounds 40] [--compile]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch
import torch.nn.functional as F
from inference import table
from torch import nn

from trunk.inference.calibrate import BATCH, LENGTHS, calibration_batches
from trunk.inference.quantize import Int8Linear, quantize_blocks, quantize_rows
from trunk.models.trunk import Backbone, TrunkConfig
from trunk.training.precision import cpu_info


def alternate(sides: dict, rounds: int) -> dict[str, float]:
    """Median milliseconds of each side's call, the sides taking turns (after two warm-up rounds)."""
    times = {name: [] for name in sides}
    for round_ in range(rounds + 2):
        for name, call in sides.items():
            start = time.perf_counter()
            call()
            if round_ >= 2:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


class PackedInt8Linear(nn.Module):
    """An int8 layer on oneDNN's packed product: per-token input scales as ``Int8Linear``'s, the weight packed once
    for the CPU's int8 units, the product out in the input's dtype and scaled back per token."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        int8, scale = quantize_rows(linear.weight.detach().float())
        self.register_buffer("packed", torch.ops.onednn.qlinear_prepack(int8, None))
        self.register_buffer("weight_scale", scale[:, 0])
        self.register_buffer("zero", torch.zeros(len(scale), dtype=torch.int64))
        self.register_buffer("bias", linear.bias.detach().float() if linear.bias is not None else None)
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inputs, scale = quantize_rows(x.reshape(-1, x.shape[-1]).float())
        product = torch.ops.onednn.qlinear_pointwise(
            inputs, 1.0, 0, self.packed, self.weight_scale, self.zero, None, 1.0, 0, x.dtype, "none", [], "") * scale
        out = product if self.bias is None else product + self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def packed_product_error(rows: int = 64, size: int = 256) -> float:
    """How far oneDNN's packed int8 product is from the exact integer product on this CPU, on full-range int8 (the
    largest difference over the largest value): 0 where it is exact. Measured here rather than assumed: on a CPU
    without int8 dot-product units (VNNI, AMX) it was not (an AMD EPYC with AVX2 only: 23% off)."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randint(-127, 128, (rows, size), dtype=torch.int8, generator=generator)
    weight = torch.randint(-127, 128, (size, size), dtype=torch.int8, generator=generator)
    exact = torch._int_mm(inputs, weight.t().contiguous()).float()
    ones, zero = torch.ones(size), torch.zeros(size, dtype=torch.int64)
    product = torch.ops.onednn.qlinear_pointwise(inputs, 1.0, 0, torch.ops.onednn.qlinear_prepack(weight, None), ones,
                                                 zero, None, 1.0, 0, torch.float32, "none", [], "")
    return ((product - exact).abs().max() / exact.abs().max()).item()


def layer_table(cfg: TrunkConfig, tokens: int, rounds: int) -> None:
    shapes = [(cfg.d_model, cfg.d_model), (cfg.d_model, 2 * cfg.d_model), (cfg.d_model, cfg.d_ff),
              (cfg.d_ff, cfg.d_model)]  # query and output, keys and values, the feed-forward's two
    rows, totals = [], {}
    with torch.inference_mode():
        for d_in, d_out in shapes:
            linear = nn.Linear(d_in, d_out)
            layer = Int8Linear.from_float(linear)
            x = torch.randn(tokens, d_in) * torch.rand(tokens, 1) * 4  # tokens of other ranges, as a trunk's are
            x16, w16, b16 = x.bfloat16(), linear.weight.detach().bfloat16(), linear.bias.detach().bfloat16()
            x8, scale = quantize_rows(x)
            product = torch._int_mm(x8, layer.weight_int8)
            packed = PackedInt8Linear(linear)
            sides = {
                "fp32": lambda: F.linear(x, linear.weight, linear.bias),
                "bf16": lambda: F.linear(x16, w16, b16),
                "Int8Linear": lambda: layer(x),
                "quantize": lambda: quantize_rows(x),
                "_int_mm": lambda: torch._int_mm(x8, layer.weight_int8),
                "scale back": lambda: product.to(torch.float32).mul_(scale).mul_(layer.weight_scale).add_(layer.bias),
                "oneDNN packed int8 product": lambda: torch.ops.onednn.qlinear_pointwise(
                    x8, 1.0, 0, packed.packed, packed.weight_scale, packed.zero, packed.bias, 1.0, 0, torch.bfloat16,
                    "none", [], ""),
            }
            ms = alternate(sides, rounds)
            for name, value in ms.items():
                totals[name] = totals.get(name, 0.0) + value
            rows.append([f"{d_in} -> {d_out}", *ms.values()])
    rows.append(["all four", *totals.values()])
    rows.append(["bf16 / side (x)", *(totals["bf16"] / v for v in totals.values())])
    table(f"one linear layer, {tokens} tokens (ms, median of {rounds} rounds)", ["shape", *totals], rows)


def block_table(cfg: TrunkConfig, rounds: int, compile_: bool) -> None:
    small = TrunkConfig(**{**cfg.to_dict(), "n_layers": 2, "preset": None})
    torch.manual_seed(0)
    stack = Backbone(small).eval()
    int8, packed = copy.deepcopy(stack), copy.deepcopy(stack)
    quantize_blocks(int8)
    quantize_blocks(packed, PackedInt8Linear)
    batches = calibration_batches(cfg)
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    fp32 = contextlib.nullcontext
    forms = {"fp32": (stack, fp32), "bf16": (stack, bf16), "Trunk int8": (int8, fp32),
             "Trunk int8 + bf16": (int8, bf16), "oneDNN packed int8 + bf16": (packed, bf16)}
    if compile_:
        import torch._inductor.config as inductor

        inductor.freezing = True  # oneDNN's packed weights as the graph's constants, as its int8 lowering needs
        forms["bf16, compiled"] = (torch.compile(copy.deepcopy(stack), dynamic=True), bf16)
        forms["oneDNN packed int8 + bf16, compiled"] = (torch.compile(packed, dynamic=True), bf16)

    def run(model, context):
        for inputs, mask in batches:
            with context():
                model(inputs, mask)

    with torch.inference_mode():
        ms = alternate({name: (lambda m=m, c=c: run(m, c)) for name, (m, c) in forms.items()}, rounds)
    table(f"two {cfg.d_model}-wide blocks over {BATCH} inputs of {', '.join(map(str, LENGTHS))} tokens (ms, median of "
          f"{rounds} rounds)", ["form", "ms", "of fp32's speed", "of bf16's speed"],
          [[name, value, ms["fp32"] / value, ms["bf16"] / value] for name, value in ms.items()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d-model", type=int, default=384, help="the trunk's width (MiniLM's by default)")
    parser.add_argument("--d-ff", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=768, help="rows of the per-layer table")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--compile", action="store_true", help="also the block stack through torch.compile")
    options = parser.parse_args()
    print(f"machine: {cpu_info()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    error = packed_product_error()
    if error > 0:
        print(f"oneDNN's packed int8 product is not exact on this CPU (up to {error:.1%} of the largest value off): "
              "its times below are of a kernel that computes something else here.")
    cfg = TrunkConfig(d_model=options.d_model, n_heads=options.heads, d_ff=options.d_ff, n_layers=2, max_len=512,
                      vocab_size=1000)
    layer_table(cfg, options.tokens, options.rounds)
    block_table(cfg, max(5, options.rounds // 4), options.compile)


if __name__ == "__main__":
    main()
