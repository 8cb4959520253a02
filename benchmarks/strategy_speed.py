"""Step time of one process against DDP, FSDP2 and tensor parallelism with 2 processes, on this machine. Prints a table.

    python benchmarks/strategy_speed.py [--steps 30] [--precision bf16-mixed]

The masked-LM model of configs/pretrain.yaml (width 256, 4 blocks, FFN 1024, vocabulary 12,000),
trained at the same global batch (32 blocks of 128 tokens a step: one process takes all 32 with 2
threads; under DDP and FSDP2 each of 2 processes takes 16 with 1 thread, so both use the machine's 2 cores; under
tensor parallelism both take all 32, each computing half of every block's heads and feed-forward units). Each run is
its own `Trainer` in fresh processes; the first 5 steps are warm-up; the median step time counts.
On a 2-core machine DDP cannot be faster than one process using both cores: what it shows is the
cost of the gradient all-reduce (gloo), of FSDP2's gathers and of tensor parallelism's all-reduces (two per block,
forward and backward, of the activations).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from trunk.training.precision import cpu_info

GLOBAL_BATCH, LENGTH, WARMUP = 32, 128, 5


def run(mode: str, steps: int, precision: str, out: Path) -> None:
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.utils.data import DataLoader

    from trunk.tasks import MaskedLanguageModeling, TrunkModule
    from trunk.training.callbacks import ExportTrunk

    class NoExport(ExportTrunk):  # pretraining ends with an export (no tokenizer here): not what is timed
        def on_fit_end(self, trainer, pl_module) -> None:
            pass

    processes = 1 if mode == "one" else 2
    torch.set_num_threads(2 // processes)

    class Clock(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.times.append(time.perf_counter() - self.start)
            if trainer.global_step == steps and trainer.global_rank == 0:
                (out / "times.json").write_text(json.dumps(self.times[WARMUP:]))

    torch.manual_seed(0)
    trunk = {
        "vocab_size": 12000,
        "d_model": 256,
        "n_layers": 4,
        "n_heads": 4,
        "d_ff": 1024,
        "max_len": LENGTH,
        "dropout": 0.0,
        "attn_dropout": 0.0,
        "positions": "rope",
    }
    model = TrunkModule({"mlm": MaskedLanguageModeling()}, trunk=trunk, task_info={"mlm": {}})
    g = torch.Generator().manual_seed(0)
    # tensor-parallel processes share the batch
    per_process = (GLOBAL_BATCH if mode == "tp" else GLOBAL_BATCH // processes)
    batches = []
    for _ in range(steps):
        ids = torch.randint(5, 12000, (per_process, LENGTH), generator=g)
        labels = torch.where(torch.rand(ids.shape, generator=g) < 0.15, ids, -100)
        batches.append({"task": "mlm", "input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    strategy = {
        "one": "auto",
        "ddp": "ddp",
        "fsdp2": ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, save_distributed_checkpoint=False),
        "tp": ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2, save_distributed_checkpoint=False),
    }[mode]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=processes,
        strategy=strategy,
        max_steps=steps,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[Clock(), NoExport()],
    )
    trainer.fit(model, DataLoader(batches, batch_size=None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--precision", default="bf16-mixed", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--run", choices=["one", "ddp", "fsdp2", "tp"], help=argparse.SUPPRESS)  # internal: one run
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.run:
        run(options.run, options.steps, options.precision, options.out)
        return
    medians = {}
    for mode in ("one", "ddp", "fsdp2", "tp"):
        out = Path(tempfile.mkdtemp(prefix=f"trunk-{mode}-"))
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--run",
                mode,
                "--out",
                str(out),
                "--steps",
                str(options.steps),
                "--precision",
                options.precision,
            ],
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1" if mode != "one" else "2"},
        )
        medians[mode] = statistics.median(json.loads((out / "times.json").read_text()))
    print(
        f"machine: {os.cpu_count()} x {cpu_info()}, torch {torch.__version__}; masked-LM, width 256, 4 blocks, "
        f"{options.precision}, global batch {GLOBAL_BATCH} x {LENGTH} tokens; median of {options.steps - WARMUP} steps "
        f"after {WARMUP} warm-up"
    )
    print("| run | processes x threads | step time (ms) | tokens/s | relative to 1 process |")
    print("|---|---|---|---|---|")
    for mode, label, layout in (("one", "1 process", "1 x 2"), ("ddp", "DDP", "2 x 1"), ("fsdp2", "FSDP2", "2 x 1"),
                                ("tp", "tensor parallel", "2 x 1")):
        seconds = medians[mode]
        print(
            f"| {label} | {layout} | {1000 * seconds:.0f} | {GLOBAL_BATCH * LENGTH / seconds:,.0f} | "
            f"{medians['one'] / seconds:.2f}x |"
        )


if __name__ == "__main__":
    main()
