"""One tiny fp32 training run under a given strategy, for tests/training/test_scaling.py (run as a script:
Lightning's launcher re-runs it once per process).

    python tests/parallel_run.py {one,ddp,fsdp2,tp,tp_fsdp2} STEPS OUT.pt [--resume CKPT] [--save CKPT]

Every step's global batch is the same 16 rows whatever the number of processes: with 2 data-parallel ones, each takes
its half; tensor-parallel processes (tp: 2 processes splitting every block; tp_fsdp2: 4, two tensor-parallel pairs
sharded by FSDP2) share theirs. Dropout is off, so 1 process, DDP-2 and FSDP2-2 must end with the same weights.
"""

import argparse

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader

from trunk.datamodules.multitask import data_parallel_replica
from trunk.tasks import SequenceClassification, TrunkModule

TRUNK = {"vocab_size": 100, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "max_len": 32, "dropout": 0.0,
         "attn_dropout": 0.0}


def global_batches(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(5, 100, (16, 12), generator=g)
        # padded rows: the unpadded path too
        mask = (torch.arange(12) < torch.randint(4, 13, (16, 1), generator=g)).long()
        out.append(
            {
                "task": "s",
                "input_ids": ids * mask,
                "attention_mask": mask,
                "labels": torch.randint(0, 3, (16,), generator=g),
            }
        )
    return out


class HalfBatches(L.LightningDataModule):
    """Each process takes its slice of every global batch (no sampler: the slicing is the sharding)."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps

    def train_dataloader(self):
        rank, world = data_parallel_replica(self.trainer)  # tensor-parallel processes: one replica
        rows = 16 // world
        batches = global_batches(self.steps)
        done = self.trainer.global_step  # resumed mid-epoch, Lightning counts on from `done`: start with the next batch
        mine = [{k: (v[rank * rows:(rank + 1) * rows] if torch.is_tensor(v) else v) for k, v in b.items()}
                for b in batches[done:] + batches[:done]]
        return DataLoader(mine, batch_size=None)


class StopAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        trainer.should_stop = trainer.global_step >= self.step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["one", "ddp", "fsdp2", "tp", "tp_fsdp2"])
    parser.add_argument("steps", type=int)
    parser.add_argument("out")
    parser.add_argument("--resume")
    parser.add_argument("--save")
    parser.add_argument("--stop-at", type=int, help="stop after this many steps (the schedule still plans STEPS)")
    parser.add_argument("--checkpointing-and-layer-decay", action="store_true",
                        help="activation checkpointing and layer-wise learning rates (0.8 per depth)")
    parser.add_argument("--peft", action="store_true", help="a LoRA delta on the frozen trunk (model.peft)")
    parser.add_argument(
        "--lamb", action="store_true", help="LAMB and the inverse-square-root schedule (model.optimizer)"
    )
    parser.add_argument(
        "--local", action="store_true", help="local attention: a window of 3 tokens each way, [CLS] global"
    )
    parser.add_argument("--positions", help="model.trunk.positions (the trunk's own by default)")
    parser.add_argument("--accelerator", default="cpu", help="gpu: the GPU check's one-device runs (tests/gpu)")
    parser.add_argument("--devices", type=int, help="processes (default: what the mode needs, 1, 2 or 4)")
    options = parser.parse_args()
    torch.manual_seed(0)
    extra = (
        {"activation_checkpointing": True, "finetune": {"layer_decay": 0.8}}
        if options.checkpointing_and_layer_decay
        else {}
    )
    extra.update({"peft": {"s": {"method": "lora", "r": 4, "dropout": 0.0}}} if options.peft else {})
    extra.update(
        {"optimizer": {"name": "lamb", "lr": 2e-2, "schedule": "inverse_sqrt", "warmup": 4}} if options.lamb else {}
    )
    trunk = {**TRUNK, "local_window": 3, "global_tokens": 1} if options.local else TRUNK
    trunk = {**trunk, "positions": options.positions} if options.positions else trunk
    model = TrunkModule(
        {"s": SequenceClassification(head_dropout=0.0)},
        trunk=trunk,
        task_info={"s": {"label_names": ["a", "b", "c"]}},
        **extra,
    )
    devices = options.devices or {"one": 1, "tp_fsdp2": 4}.get(options.mode, 2)
    strategy = {
        "one": "auto",
        "ddp": "ddp",
        "fsdp2": ModelParallelStrategy(
            data_parallel_size=devices, tensor_parallel_size=1, save_distributed_checkpoint=False
        ),
        "tp": ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2, save_distributed_checkpoint=False),
        "tp_fsdp2": ModelParallelStrategy(
            data_parallel_size=2, tensor_parallel_size=2, save_distributed_checkpoint=False
        ),
    }
    trainer = L.Trainer(accelerator=options.accelerator, devices=devices, strategy=strategy[options.mode],
                        max_steps=options.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, use_distributed_sampler=False, precision="32-true",
                        callbacks=[StopAt(options.stop_at)] if options.stop_at else [])
    trainer.fit(model, datamodule=HalfBatches(options.steps), ckpt_path=options.resume)
    if options.save:
        trainer.save_checkpoint(options.save)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if trainer.is_global_zero:
        torch.save({k: v.detach().clone() for k, v in state.items()}, options.out)


if __name__ == "__main__":
    main()
