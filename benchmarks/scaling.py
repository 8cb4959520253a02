"""How the cost of a training step grows with the model's width and the sequence length. Prints a table.

    python benchmarks/scaling.py [--widths 128 256 512 1024] [--lengths 64 128 256 512] [--steps 3] [--precision bf16]

Each cell trains Trunk's masked-LM path (the pretraining step: forward, backward, fused AdamW) with
4 blocks, heads of 64 channels, FFN 4 x width, vocabulary 8000 and 15% masked tokens, on batches of
4,096 tokens (batch = 4096 / length), in a fresh process: the median step after one warm-up step
gives tokens/s and MFU (model FLOPs: 6 x matmul parameters per token plus attention, over the
measured peak of a 2048^3 ``torch.mm`` in the same precision), and the process's peak resident
memory (VmHWM: weights, AdamW state, one step's activations, and the imported libraries, printed first).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from processes import in_fresh_process, resident_mib  # benchmarks/processes.py
from throughput import matmul_peak  # benchmarks/throughput.py

from trunk.training.precision import cpu_info

TOKENS_PER_BATCH, DEPTH, VOCAB = 4096, 4, 8000


def flops_per_step(width: int, length: int, masked: int) -> float:
    per_token = 2 * DEPTH * 12 * width * width + 2 * DEPTH * 2 * length * width  # matmuls; attention's two products
    head = 2 * masked * (width * width + width * VOCAB)
    return 3 * (TOKENS_PER_BATCH * per_token + head)


def measure(width: int, length: int, steps: int, precision: str, queue) -> None:
    from trunk.models import TrunkConfig
    from trunk.tasks import MaskedLanguageModeling, TrunkModule

    if width == 0:  # the baseline: a process that imported everything and built nothing
        queue.put((0.0, 0, resident_mib()))
        return
    torch.manual_seed(0)
    cfg = TrunkConfig(
        vocab_size=VOCAB, d_model=width, n_layers=DEPTH, n_heads=width // 64, d_ff=4 * width, max_len=length
    )
    module = TrunkModule({"mlm": MaskedLanguageModeling()}, trunk=cfg, task_info={"mlm": {}}).train()
    optimizer = torch.optim.AdamW(module.param_groups(), lr=1e-4, fused=True)
    batch_size = TOKENS_PER_BATCH // length
    ids = torch.randint(5, VOCAB, (batch_size, length))
    labels = torch.where(torch.rand(ids.shape) < 0.15, ids, -100)
    batch = {"task": "mlm", "input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        with autocast:
            loss = module.objectives["mlm"].loss(module.trunk, batch, "train")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    queue.put((statistics.median(times[1:]), int((labels != -100).sum()), resident_mib()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    options = parser.parse_args()
    peak = matmul_peak(options.precision)
    print(
        f"machine: {os.cpu_count()} x {cpu_info()}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"{options.precision}; torch.mm peak {peak / 1e9:.0f} GFLOP/s; batches of {TOKENS_PER_BATCH} tokens, medians "
        f"of {options.steps} steps"
    )
    baseline = in_fresh_process(measure, 0, 0, 0, options.precision)[2]
    print(f"A process that imported torch and Trunk and built nothing peaks at {baseline:.0f} MiB.")
    print(
        "| width | parameters | length | ms per step | tokens/s | MFU | peak memory (MiB) "
        "|\n|---|---|---|---|---|---|---|"
    )
    for width in options.widths:
        params = DEPTH * 12 * width * width + VOCAB * width
        for length in options.lengths:
            seconds, masked, memory = in_fresh_process(measure, width, length, options.steps, options.precision)
            mfu = flops_per_step(width, length, masked) / seconds / peak
            print(
                f"| {width} | {params / 1e6:.1f}M | {length} | {1000 * seconds:.0f} | "
                f"{TOKENS_PER_BATCH / seconds:,.0f} | {mfu:.1%} | {memory:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
