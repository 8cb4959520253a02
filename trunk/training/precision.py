"""The precision a run computes in: bf16 where the hardware has bf16 units, fp32 where it does not; and whether the CPU
has int8 dot-product units (for ``--quantize int8``, ``trunk.inference.quantize``).

bf16-mixed halves the cost of a matmul only on devices that multiply bf16 natively: CUDA GPUs from
Ampere on, and CPUs with AMX or AVX512-BF16. Elsewhere (AVX2 laptops and cloud machines, AVX512
servers without BF16) torch converts bf16 element by element and a matmul runs 10-100x slower than
in fp32. ``precision: auto`` (Trunk's default) therefore picks bf16-mixed only where it is native,
and an explicit bf16 precision on a CPU without bf16 units runs as asked, with a warning.
"""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

AUTO = "auto"
# /proc/cpuinfo flags of the x86 bf16 matrix units, best first.
BF16_FLAGS = {"amx_bf16": "AMX", "avx512_bf16": "AVX512-BF16"}
# /proc/cpuinfo flags of int8 dot products: x86 (VNNI, AMX) and ARM's "Features" (SDOT, I8MM)
INT8_FLAGS = {"amx_int8": "AMX-INT8", "avx512_vnni": "AVX512-VNNI", "avx_vnni": "AVX-VNNI", "i8mm": "I8MM",
              "asimddp": "DOTPROD"}
VECTOR_FLAGS = {"avx512f": "AVX512", "avx2": "AVX2"}


@dataclass(frozen=True)
class CpuInfo:
    """What a CPU can compute fast. ``native_bf16`` / ``native_int8`` are None where its flags do not say (not Linux;
    ``native_bf16`` also on ARM). ``int8``: its int8 dot-product units, best first ("" for none or unknown)."""

    name: str
    capability: str  # AMX, AVX512-BF16, AVX512, AVX2, or torch's own name for what it found
    native_bf16: bool | None
    native_int8: bool | None = None
    int8: str = ""

    def __str__(self) -> str:
        return f"{self.name} ({self.capability})"


def read_cpu_info(text: str | None = None) -> CpuInfo:
    """The CPU from ``/proc/cpuinfo``'s text (read when not given), or from torch and ``platform`` elsewhere."""
    if text is None:
        try:
            with open("/proc/cpuinfo") as f:
                text = f.read()
        except OSError:
            text = ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    flags = set(fields.get("flags", "").split())
    features = flags or set(fields.get("Features", "").split())  # ARM names its units under Features
    int8 = ", ".join(label for flag, label in INT8_FLAGS.items() if flag in features)
    native_int8 = bool(int8) if features else None
    if not flags:  # ARM (its "Features" line names no bf16 units torch uses), macOS, Windows: measure instead
        return CpuInfo(name, torch.backends.cpu.get_cpu_capability(), None, native_int8, int8)
    units = [label for flag, label in {**BF16_FLAGS, **VECTOR_FLAGS}.items() if flag in flags]
    return CpuInfo(
        name,
        units[0] if units else torch.backends.cpu.get_cpu_capability(),
        bool(flags & BF16_FLAGS.keys()),
        native_int8,
        int8,
    )


@functools.cache
def cpu_info() -> CpuInfo:
    return read_cpu_info()


def fastest_times(sides: dict[str, Callable[[], object]], repeats: int = 5) -> dict[str, float]:
    """Each side's fastest time of ``repeats``, after three warm-ups that pick kernels and fill caches: one thread, the
    sides alternating, so a busy machine (another process on a core, which stalls a multi-threaded matmul) does not
    decide it."""
    times = {name: [] for name in sides}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(3 + repeats):
            for name, run in sides.items():
                start = time.perf_counter()
                run()
                if i >= 3:
                    times[name].append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return {name: min(seconds) for name, seconds in times.items()}


@functools.cache
def bf16_slowdown(size: int = 256, repeats: int = 5) -> float:
    """How many times longer a bf16 matmul takes than an fp32 one on this CPU (about a tenth of a second, once per
    process): above 1, bf16 is emulated."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a16, b16 = a.bfloat16(), b.bfloat16()
    times = fastest_times({"fp32": lambda: torch.mm(a, b), "bf16": lambda: torch.mm(a16, b16)}, repeats)
    return times["bf16"] / times["fp32"]


@functools.cache
def int8_speedup(size: int = 256, repeats: int = 5) -> float:
    """How many times faster an int8 matmul (``torch._int_mm``, int32 sums) runs than an fp32 one on this CPU, once per
    process."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a8, b8 = (torch.randint(-127, 128, (size, size), dtype=torch.int8) for _ in range(2))
    times = fastest_times({"fp32": lambda: torch.mm(a, b), "int8": lambda: torch._int_mm(a8, b8)}, repeats)
    return times["fp32"] / times["int8"]


def int8_is_native() -> tuple[bool, str]:
    """Whether this CPU computes int8 dot products natively (VNNI, AMX; SDOT / I8MM on ARM), and why: its flags where
    they say, else a measurement."""
    cpu = cpu_info()
    if cpu.native_int8:
        return True, f"this CPU, {cpu}, has int8 dot-product units ({cpu.int8})"
    speedup = int8_speedup()
    measured = f"an int8 matmul ran {speedup:.2g}x as fast as an fp32 one here"
    if cpu.native_int8 is False:
        return False, f"this CPU, {cpu}, has no int8 dot-product units (VNNI or AMX): {measured}"
    return speedup > 1.3, f"on this CPU, {cpu}, {measured}"


def cpu_bf16_is_native() -> tuple[bool, str]:
    """Whether this CPU multiplies bf16 natively, and why that is the answer."""
    cpu = cpu_info()
    if cpu.native_bf16 is not None:
        units = "has bf16 matrix units" if cpu.native_bf16 else "has no bf16 matrix units (AMX or AVX512-BF16)"
        return cpu.native_bf16, f"this CPU, {cpu}, {units}"
    slowdown = bf16_slowdown()
    native = slowdown < 0.8  # mixed precision pays for its casts only where bf16 matmuls are clearly faster
    return native, f"on this CPU, {cpu}, a bf16 matmul took {slowdown:.2g}x the time of an fp32 one"


def on_cuda(accelerator) -> bool:
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    return name in ("gpu", "cuda") or "cuda" in name or (name == "auto" and torch.cuda.is_available())


def choose_precision(accelerator="auto") -> tuple[str, str]:
    """``precision: auto`` for a run on ``accelerator``: (the precision, why, in a few words)."""
    if on_cuda(accelerator):
        if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0):
            return "bf16-mixed", "this GPU has bf16 tensor cores"
        return "32-true", "this GPU has no bf16 tensor cores (before Ampere)"
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    if name not in ("cpu", "auto") and "cpu" not in name:
        return "32-true", f"bf16 is chosen automatically on CUDA GPUs and CPUs only, not on {name}"
    native, why = cpu_bf16_is_native()
    return ("bf16-mixed" if native else "32-true"), why


def resolve_precision(precision, accelerator="auto"):
    """The precision Lightning runs: ``auto`` chosen for the hardware (said in one line); an explicit bf16
    precision on a CPU that emulates bf16 is kept, with a warning (once per process) that says what it costs."""
    if precision == AUTO:
        chosen, why = choose_precision(accelerator)
        rank_zero_info(f"Precision: {chosen} (auto: {why}).")
        return chosen
    if str(precision).startswith("bf16") and not on_cuda(accelerator):
        _warn_emulated_bf16(str(precision))
    return precision


@functools.cache
def _warn_emulated_bf16(precision: str) -> None:
    if cpu_bf16_is_native()[0]:
        return
    rank_zero_warn(
        f"precision={precision}, but this CPU, {cpu_info()}, has no bf16 matrix units: torch emulates bf16, and a bf16 "
        f"matmul took {bf16_slowdown():.2g}x the time of an fp32 one here, so training runs several times slower. Use "
        "--trainer.precision=auto (Trunk's default: 32-true on this CPU) or 32-true."
    )
