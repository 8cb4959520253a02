"""Memory per process of DDP against FSDP2 for a model of about 110M parameters, 2 processes on CPU. Prints a table.

    python benchmarks/sharding_memory.py [--width 1024] [--blocks 8] [--steps 3]

Each strategy trains the same model (width 1024, 8 blocks, 16 heads, FFN 4096, vocabulary 8,000:
about 110M parameters; sequence classification, fp32, batches of 4 x 128 tokens per process) for a
few steps in its own run of 2 processes (gloo). Each process reports, just before its last optimizer
step, the bytes of what it holds of the parameters, their gradients and AdamW's state (exact: the
tensors' own sizes; under FSDP2 its shards), and its peak resident memory (VmHWM: the above plus
activations, a gathered block under FSDP2, and the libraries).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from trunk.training.precision import cpu_info

MIB = 2**20


def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this process's shard
        total += t.numel() * t.element_size()
    return total


def run(strategy_name: str, width: int, blocks: int, steps: int, out: Path) -> None:
    """One training run under ``strategy_name``; every process writes its figures to ``out``/rank<N>.json."""
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.utils.data import DataLoader

    from trunk.tasks import SequenceClassification, TrunkModule

    class Report(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            if trainer.global_step != steps - 1:
                return
            params = list(pl_module.parameters())
            state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
            lines = Path("/proc/self/status").read_text().splitlines()
            status = dict(line.split(":", 1) for line in lines if ":" in line)
            figures = {
                "parameters": local_bytes(params),
                "gradients": local_bytes(p.grad for p in params if p.grad is not None),
                "optimizer": local_bytes(state),
                "peak_rss": int(status["VmHWM"].split()[0]) * 1024,
                "total_parameters": sum(p.numel() for p in params),
            }
            (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(figures))

    torch.manual_seed(0)
    trunk = {
        "vocab_size": 8000,
        "d_model": width,
        "n_layers": blocks,
        "n_heads": width // 64,
        "d_ff": 4 * width,
        "max_len": 128,
    }
    model = TrunkModule({"s": SequenceClassification()}, trunk=trunk, task_info={"s": {"label_names": ["a", "b"]}})
    g = torch.Generator().manual_seed(0)
    batches = [
        {
            "task": "s",
            "input_ids": torch.randint(5, 8000, (4, 128), generator=g),
            "attention_mask": torch.ones(4, 128, dtype=torch.long),
            "labels": torch.randint(0, 2, (4,), generator=g),
        }
        for _ in range(steps)
    ]
    strategy = (ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, save_distributed_checkpoint=False)
                if strategy_name == "fsdp2" else "ddp")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[Report()],
    )
    trainer.fit(model, DataLoader(batches, batch_size=None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--run", choices=["ddp", "fsdp2"], help=argparse.SUPPRESS)  # internal: one run
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.run:
        run(options.run, options.width, options.blocks, options.steps, options.out)
        return
    results = {}
    for name in ("ddp", "fsdp2"):
        out = Path(tempfile.mkdtemp(prefix=f"trunk-{name}-"))
        subprocess.run([sys.executable, __file__, "--run", name, "--out", str(out), "--width", str(options.width),
                        "--blocks", str(options.blocks), "--steps", str(options.steps)], check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
        results[name] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    n = results["ddp"][0]["total_parameters"]
    print(
        f"machine: {os.cpu_count()} x {cpu_info()}, torch {torch.__version__}; {n / 1e6:.0f}M parameters, fp32, 2 "
        "processes, per process (MiB), the larger of the two"
    )
    print("| strategy | parameters | gradients | AdamW state | parameters + gradients + AdamW | peak resident memory |")
    print("|---|---|---|---|---|---|")
    held = {}
    for name, ranks in results.items():
        worst = {k: max(r[k] for r in ranks) for k in ("parameters", "gradients", "optimizer", "peak_rss")}
        held[name] = worst["parameters"] + worst["gradients"] + worst["optimizer"]
        print(
            f"| {name} | {worst['parameters'] / MIB:,.0f} | {worst['gradients'] / MIB:,.0f} | "
            f"{worst['optimizer'] / MIB:,.0f} | {held[name] / MIB:,.0f} | {worst['peak_rss'] / MIB:,.0f} |"
        )
    print(f"FSDP2 / DDP, parameters + gradients + AdamW state: {held['fsdp2'] / held['ddp']:.2f}")


if __name__ == "__main__":
    main()
