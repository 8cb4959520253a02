"""Long inputs: a training step (forward + backward) of the trunk with full attention against local attention
(``model.trunk.local_window``, ``global_tokens``) at several lengths. Prints a table.

    python benchmarks/long_inputs.py [--lengths 512 1024 2048 4096] [--window 128] [--globals 1] [--rounds 3]
    [--precision 32-true]

Time: both sides in this process, alternating, the median step of ``--rounds`` rounds (``--precision``: by default fp32
unless bf16 is native, the rule of ``trainer.precision: auto``). Memory: each side and length in a fresh process of its
own, one step, its peak resident memory above what it held before the step (VmHWM - VmRSS: activations, gradients and
the allocator's slack; the weights and libraries left out). The trunk is ``configs/pretrain.yaml``'s shape (width 256, 4
blocks, rotary positions), dropout off unless ``--dropout``, one sequence per step unless ``--batch``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from processes import in_fresh_process, resident_mib  # benchmarks/processes.py

TRUNK = dict(vocab_size=12000, d_model=256, n_layers=4, n_heads=4, d_ff=1024, positions="rope")


def build(length: int, window: int, n_global: int, dropout: float = 0.0) -> torch.nn.Module:
    from trunk.models import Backbone, TokenStem, Trunk, TrunkConfig, init_weights

    cfg = TrunkConfig(
        **TRUNK, max_len=length, local_window=window, global_tokens=n_global, dropout=dropout, attn_dropout=dropout
    )
    torch.manual_seed(0)
    trunk = Trunk(Backbone(cfg), {"text": TokenStem(cfg)})
    init_weights(trunk)
    return trunk


def step(trunk: torch.nn.Module, ids: torch.Tensor, dtype: torch.dtype | None) -> None:
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        loss = trunk(ids, torch.ones_like(ids)).float().square().mean()
    loss.backward()
    trunk.zero_grad(set_to_none=True)


def peak_memory(length: int, window: int, n_global: int, dropout: float, batch: int, dtype, queue) -> None:
    """In a fresh process: one step; the peak resident memory above the resident memory before it (MiB)."""
    trunk = build(length, window, n_global, dropout)
    ids = torch.randint(5, TRUNK["vocab_size"], (batch, length))
    before = resident_mib("VmRSS")
    step(trunk, ids, dtype)
    queue.put(resident_mib() - before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--window", type=int, default=128, help="local_window: keys at most this far each way")
    parser.add_argument("--globals", type=int, default=1, help="global_tokens")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="dropout and attention dropout (the fine-tuning recipes' 0.1: on CPU, full attention with dropout "
        "computes its (T, T) probabilities written out, not in SDPA's kernel)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", choices=["auto", "32-true", "bf16-mixed"], default="auto",
                        help="auto: bf16-mixed where bf16 is native, else 32-true (as trainer.precision: auto)")
    args = parser.parse_args()
    from trunk.training.precision import choose_precision, cpu_info

    precision = choose_precision("cpu")[0] if args.precision == "auto" else args.precision
    dtype = torch.bfloat16 if precision.startswith("bf16") else None
    print(f"{torch.get_num_threads()} threads, {cpu_info()}, torch {torch.__version__}, {precision}; trunk {TRUNK}; "
          f"window {args.window}, {args.globals} global token(s), batch {args.batch}, dropout {args.dropout}\n")
    print(
        "| tokens | full attention: ms per step | local: ms per step | local / full | full: peak MiB | local: peak "
        "MiB | local / full |"
    )
    print("|---|---|---|---|---|---|---|")
    for length in args.lengths:
        sides = {"full": (0, 0, args.dropout), "local": (args.window, args.globals, args.dropout)}
        trunks = {side: build(length, *spec) for side, spec in sides.items()}
        ids = torch.randint(5, TRUNK["vocab_size"], (args.batch, length))
        times = {side: [] for side in sides}
        for side in sides:  # warm-up: first-call allocations and kernel choices
            step(trunks[side], ids, dtype)
        for _ in range(args.rounds):
            for side in sides:
                started = time.perf_counter()
                step(trunks[side], ids, dtype)
                times[side].append(1000 * (time.perf_counter() - started))
        del trunks
        ms = {side: statistics.median(t) for side, t in times.items()}
        mib = {side: in_fresh_process(peak_memory, length, *spec, args.batch, dtype) for side, spec in sides.items()}
        print(
            f"| {length:,} | {ms['full']:,.0f} | {ms['local']:,.0f} | {ms['local'] / ms['full']:.2f} | "
            f"{mib['full']:,.0f} | {mib['local']:,.0f} | {mib['local'] / mib['full']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
