"""Callbacks that record what a run does, for tests that run `trunk fit` as a subprocess (tests/ is on PYTHONPATH)."""

import json

import torch
from lightning.pytorch.callbacks import Callback


class RecordChanges(Callback):
    """After every training epoch, the first process writes to ``path`` (JSON) which trunk parameters
    the epoch changed, and which trunk parts ran in train mode."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.epochs: list[dict] = []

    @staticmethod
    def weights(pl_module) -> dict:
        """Whole tensors, also under FSDP2 (gathering a DTensor is a collective: every process calls this)."""
        return {
            n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in pl_module.trunk.named_parameters()
        }

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._before = self.weights(pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 0:
            blocks = pl_module.trunk.backbone.blocks
            self._training = [pl_module.trunk.stems["text"].training, *(b.training for b in blocks)]

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        changed = sorted(n for n, p in self.weights(pl_module).items() if not torch.equal(p, self._before[n]))
        self.epochs.append({"changed": changed, "training": self._training})
        if trainer.is_global_zero:
            with open(self.path, "w") as f:
                json.dump(self.epochs, f)


class CountEncodes(Callback):
    """Appends one line to ``path`` (the process's rank and the split) every time a process encodes a
    split rather than reading the cache: patched in when the CLI builds the callbacks, in every process."""

    def __init__(self, path: str) -> None:
        import os

        from trunk.datamodules.text import TextDataModule

        build = TextDataModule.build_encoded

        def counting(data, role, directory):
            with open(path, "a") as f:
                f.write(f"{os.environ.get('LOCAL_RANK', '0')} {role}\n")
            return build(data, role, directory)

        TextDataModule.build_encoded = counting
