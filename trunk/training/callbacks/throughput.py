"""Samples and real tokens per second, and MFU where a peak is known."""

from __future__ import annotations

import time

import torch
from lightning.pytorch.callbacks import Callback


def batch_work(trunk, batch: dict) -> tuple[int, torch.Tensor, int]:
    """What the trunk computes on for ``batch``: (samples, real tokens as a 0-d tensor on the batch's device, the
    longest sequence). Padding is not work; an image is its patches and [CLS]."""
    if "pixel_values" in batch:
        images = batch["pixel_values"]
        patch = trunk.stems["image"].patch_size
        length = (images.shape[-2] // patch) * (images.shape[-1] // patch) + 1
        return images.shape[0], torch.tensor(images.shape[0] * length), length
    mask = batch["attention_mask"]
    return mask.shape[0], mask.sum(), mask.shape[1]


class Throughput(Callback):
    """Training throughput, logged every ``trainer.log_every_n_steps`` batches under ``perf/``:
    ``samples_per_sec`` and ``tokens_per_sec`` (real tokens the trunk computes on, padding excluded;
    the first process's rate times the number of processes), and ``mfu``, the trunk's training FLOPs
    (``Trunk.flops_per_token``; heads and decoders not counted) over the devices' peak:
    ``peak_flops`` per device when given, else Lightning's table of GPU peaks (none for CPUs: no MFU).
    A window holds training batches only (a validation in between starts a new one), data loading
    included. Tokens are summed on the device and read once per window: no sync per step.
    (Not Lightning's ``ThroughputMonitor``: it takes one constant ``flops_per_batch``, while a batch's
    FLOPs here follow its real tokens and length, and it knows no CPU peak.)
    """

    def __init__(self, peak_flops: float | None = None) -> None:
        self.peak_flops = peak_flops
        self._start: float | None = None

    def _peak(self, trainer) -> float | None:
        if self.peak_flops:
            return self.peak_flops
        from lightning.fabric.utilities.throughput import get_available_flops

        dtype = (
            torch.bfloat16
            if "bf16" in str(trainer.precision)
            else torch.float16
            if "16" in str(trainer.precision)
            else torch.float32
        )
        return get_available_flops(trainer.strategy.root_device, dtype)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        samples, tokens, length = batch_work(pl_module.trunk, batch)
        if self._start is None:
            self._start, self._samples, self._tokens, self._flops = time.perf_counter(), 0, 0, 0
        self._samples += samples
        self._tokens = self._tokens + tokens
        self._flops = self._flops + tokens * pl_module.trunk.flops_per_token(length)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self._start is None or (batch_idx + 1) % max(trainer.log_every_n_steps, 1):
            return
        seconds = time.perf_counter() - self._start
        tokens, flops = float(self._tokens), float(self._flops)  # the window's one device sync
        world = trainer.world_size
        rates = {
            "perf/samples_per_sec": world * self._samples / seconds,
            "perf/tokens_per_sec": world * tokens / seconds,
        }
        peak = self._peak(trainer)
        if peak:
            rates["perf/mfu"] = flops / seconds / peak  # this device's FLOPs over its peak
        pl_module.log_dict(rates, on_step=True, on_epoch=False, batch_size=1)
        self._start = None

    def on_validation_start(self, trainer, pl_module) -> None:
        self._start = None  # evaluation time is not training throughput
