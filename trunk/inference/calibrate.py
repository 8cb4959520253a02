"""``precision="auto"`` at inference on a CPU: the form of a model this CPU runs fastest, chosen by measurement.

A model can compute in four forms on a CPU: fp32, bf16 (``bf16-mixed``, where the CPU multiplies bf16 natively),
int8 (``quantize="int8"``: the trunk's linear layers in int8, the rest in fp32, where it has int8 dot products), and
int8 with bf16 around it. Which is fastest depends on the CPU's units and on the model's shape, not on flags alone: on
an AMD EPYC with AVX512-VNNI and AVX512-BF16 int8 beats bf16 on MiniLM, on an Intel Xeon with AMX bf16 ran 1.4-1.9x as
fast as int8 (``benchmarks/int8.py``). So ``auto`` times each form the CPU has units for on a stack of the model's
own blocks (random weights of its shape: the time of a form depends on the shape, not on the values) and takes the
fastest; the most exact form wins unless another is more than ``TIE`` faster. The times are cached per CPU, torch
version, thread count and shape (``$TRUNK_CACHE/calibration/calibration.json``), so a model is measured once per
machine; a cache written on another CPU or torch is ignored and measured anew, said in one line.

``TRUNK_CALIBRATE=0`` keeps ``auto`` to the rule of training runs (bf16 where the CPU multiplies it natively, else fp32,
never int8): the same outputs on every machine, at the cost of speed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from trunk.core.atomic import atomic_write
from trunk.core.codec import cache_folder
from trunk.inference.quantize import check_quantize, quantize_blocks
from trunk.models.trunk import Backbone, TrunkConfig
from trunk.training.precision import (
    choose_precision,
    cpu_bf16_is_native,
    cpu_info,
    int8_is_native,
    resolve_precision,
)

# form -> (precision, quantize); in order of exactness: ties go to the first
FORMS = {"fp32": ("32-true", None), "bf16": ("bf16-mixed", None), "int8": ("32-true", "int8"),
         "int8 + bf16": ("bf16-mixed", "int8")}
TIE = 0.03  # a less exact form is taken only when it is this much faster: nearer is within the timing's noise
# the calibration input: batches as `predict` makes them, of sentences' lengths (each of a length sorted close to
# its neighbours', so a little padding), short to long, their times summed: a form's speed-up differs by 10-20% from
# one batch shape to the next, so one shape alone can pick the wrong form. Two blocks time what n do in 1/n of the
# time. Rounds: at least ROUNDS, and more (up to MAX_ROUNDS) until each form has run SPAN seconds, so a small model's
# times are not one stall's.
BATCH, LENGTHS, BLOCKS, ROUNDS, MAX_ROUNDS, SPAN = 32, (12, 24, 48), 2, 5, 40, 0.3
# the fields of TrunkConfig the forms' ratios depend on (not the depth: every block costs what the others do)
SHAPE_FIELDS = ("d_model", "n_heads", "d_ff", "positions", "norm", "activation", "rms_norm", "gated_ff", "bias",
                "local_window", "global_tokens", "global_every", "layer_scale", "relative_buckets")
CACHE_VERSION = 2


@dataclass(frozen=True)
class Calibration:
    """Seconds of a pass over the calibration batches per form, on this CPU; ``cached``: read, not measured now."""

    seconds: dict[str, float]
    cached: bool = False

    def fastest(self, quantize: str | None = None) -> str:
        """The fastest form (of the int8 ones for ``quantize="int8"``), exactness breaking near-ties."""
        forms = [f for f in self.seconds if not quantize or FORMS[f][1] == quantize]
        best = min(self.seconds[f] for f in forms)
        return next(f for f in forms if self.seconds[f] <= best * (1 + TIE))

    def speedups(self) -> str:
        """Each form's speed against fp32, in words."""
        return ", ".join(f"{form} {self.seconds['fp32'] / s:.2f}x" for form, s in self.seconds.items())


def choose_form(cfg: TrunkConfig, device: torch.device | str, precision: str = "auto",
                quantize: str | None = None) -> tuple[str, str | None, str | None]:
    """The (precision, quantize) a model of trunk shape ``cfg`` predicts in on ``device``, and what was chosen and why
    in words where ``precision`` was ``auto`` (else None), for the caller to say. ``auto`` on a CPU: the fastest form
    measured (``calibrate``), within ``quantize`` where one is asked for; elsewhere, or with ``TRUNK_CALIBRATE=0``, the
    rule of training runs. An explicit ``quantize="int8"`` on a CPU where bf16 runs this shape faster warns with both
    factors."""
    check_quantize(quantize)
    device = torch.device(device)
    # a CPU with neither bf16 nor int8 units has one fast form, fp32: the rule says so without a timing
    timed = (device.type == "cpu" and os.environ.get("TRUNK_CALIBRATE", "1") != "0" and len(candidate_forms()) > 1
             and (precision == "auto" or (quantize and "bf16" in candidate_forms())))
    calibration = calibrate(cfg) if timed else None
    if calibration is not None and quantize and "bf16" in calibration.seconds:
        best_int8 = calibration.fastest(quantize)
        if calibration.seconds[best_int8] > calibration.seconds["bf16"]:
            fp32 = calibration.seconds["fp32"]
            rank_zero_warn(f"quantize={quantize}: on this CPU, {cpu_info()}, this model's trunk runs "
                           f"{fp32 / calibration.seconds[best_int8]:.2f}x fp32 in {best_int8} but "
                           f"{fp32 / calibration.seconds['bf16']:.2f}x in bf16 (measured): leave quantize out, with "
                           "precision auto or bf16-mixed.")
    if precision != "auto":
        return resolve_precision(precision, device.type), quantize, None
    if calibration is None:
        chosen, why = choose_precision(device.type)
        return chosen, quantize, f"{chosen} (auto: {why})"
    form = calibration.fastest(quantize)
    threads = torch.get_num_threads()
    said = (f"{form} (auto: {'cached' if calibration.cached else 'measured'} on this model's shape, {cpu_info()}, "
            f"{threads} thread{'s' * (threads > 1)}: {calibration.speedups()})")
    return *FORMS[form], said


def candidate_forms() -> list[str]:
    """The forms this CPU has units for, in ``FORMS``' order: fp32 always, bf16 and int8 where native."""
    bf16, int8 = cpu_bf16_is_native()[0], int8_is_native()[0]
    return [form for form in FORMS if ("bf16" not in form or bf16) and ("int8" not in form or int8)]


def calibrate(cfg: TrunkConfig) -> Calibration:
    """Each form's time on this CPU for trunk shape ``cfg``: from the cache where it holds this CPU, torch and shape,
    else measured (about 3 s for MiniLM at one thread) and cached."""
    machine = {"cpu": str(cpu_info()), "int8": cpu_info().int8, "torch": torch.__version__}
    shape = {field: getattr(cfg, field) for field in SHAPE_FIELDS}
    key = json.dumps({**shape, "threads": torch.get_num_threads()}, sort_keys=True)
    folder = cache_folder("calibration")
    path = folder / "calibration.json" if folder is not None else None
    entries = read_cache(path, machine)
    if key in entries:
        return Calibration(entries[key], cached=True)
    seconds = measure(cfg, candidate_forms())
    if path is not None:
        fresh = read_cache(path, machine, say=False)  # another process may have added shapes meanwhile
        atomic_write(path, lambda tmp: tmp.write_text(json.dumps(
            {"version": CACHE_VERSION, **machine, "entries": {**fresh, key: seconds}}, indent=1)))
    return Calibration(seconds)


def read_cache(path: Path | None, machine: dict, say: bool = True) -> dict[str, dict[str, float]]:
    """The cached entries (shape key -> seconds per form) where ``path`` holds this machine's; none, said in one line,
    where it holds another CPU's or torch's, or cannot be read."""
    if path is None or not path.is_file():
        return {}
    try:
        cache = json.loads(path.read_text())
        theirs = {k: cache.get(k) for k in machine}
        entries = dict(cache["entries"]) if cache.get("version") == CACHE_VERSION else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        if say:
            rank_zero_info(f"Calibration: '{path}' cannot be read ({err!r}); measuring anew.")
        return {}
    if theirs != machine:
        if say:
            rank_zero_info(f"Calibration: '{path}' holds the times of {theirs['cpu']} with torch {theirs['torch']}, "
                           f"not of this {machine['cpu']} with torch {machine['torch']}: ignored, measuring anew.")
        return {}
    return entries


def calibration_batches(cfg: TrunkConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, padding mask) batches of ``BATCH`` vectors of width ``cfg.d_model``, one per length of ``LENGTHS``,
    each row a little shorter than the longest, as ``predict``'s length-sorted batches are (drawn from torch's RNG)."""
    batches = []
    for length in sorted({min(length, cfg.max_len) for length in LENGTHS}):
        real = torch.randint(int(length * 0.85), length + 1, (BATCH,))
        real[0] = length
        batches.append((torch.randn(BATCH, length, cfg.d_model), torch.arange(length) < real[:, None]))
    return batches


def measure(cfg: TrunkConfig, forms: list[str]) -> dict[str, float]:
    """Seconds of a pass over the calibration batches per form through ``BLOCKS`` blocks of shape ``cfg``: the forms
    alternating in rounds after a warm-up, each form's median ratio to fp32's time in the same round, times fp32's
    fastest."""
    small = TrunkConfig(**{**cfg.to_dict(), "n_layers": min(BLOCKS, cfg.n_layers), "shared_blocks": 0, "preset": None})
    with torch.random.fork_rng():
        torch.manual_seed(0)
        stack = Backbone(small).eval()
        batches = calibration_batches(cfg)
    quantized = copy.deepcopy(stack) if any(FORMS[f][1] for f in forms) else None
    if quantized is not None:
        quantize_blocks(quantized)
    times = {form: [] for form in forms}
    with torch.inference_mode():
        for round_ in range(1 + MAX_ROUNDS):
            for form in forms:
                precision, quantize = FORMS[form]
                model = quantized if quantize else stack
                start = time.perf_counter()
                for inputs, mask in batches:
                    # an autocast region per batch, as predict's: each casts the weights to bf16 anew
                    with (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed"
                          else contextlib.nullcontext()):
                        model(inputs, mask)
                if round_:  # the first is a warm-up (kernels picked, caches filled)
                    times[form].append(time.perf_counter() - start)
            if round_ >= ROUNDS and min(sum(t) for t in times.values()) >= SPAN:
                break
    # paired by round: a form's time over fp32's in the same round, the median of those, times fp32's best: a busy
    # neighbour slows the rounds it overlaps, not one form's measure more than another's
    fp32 = times["fp32"]
    return {form: statistics.median(a / b for a, b in zip(t, fp32)) * min(fp32) for form, t in times.items()}
