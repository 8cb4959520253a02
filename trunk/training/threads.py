"""Threads for the cores a process really has, and OpenMP waiting that yields a core another process needs.

torch's default thread count is the machine's cores, which in a container limited to 2 of 64 cores starts 64 threads
that take turns on 2; a run here takes the cores of its CPU affinity capped by its cgroup's CPU quota, shared among its
processes. And OpenMP's threads spin between parallel regions (libgomp: 300,000 turns) so that the next region starts
at once: beside another process's busy core, a spinning thread holds the core its partner waits for, and 2 threads ran
a third slower than 1 (``benchmarks/inference.py --only busy``). Spinning 1,000 turns (libgomp's own count when it
knows its threads outnumber the cores) kept the quiet speed and ran the busy case as fast as 1 thread.

This module imports neither torch nor Lightning at the top: the ``trunk`` command sets OpenMP's environment before
torch loads its OpenMP runtime, which reads it once."""

from __future__ import annotations

import math
import os
from pathlib import Path

SPIN_COUNT = "1000"  # libgomp's spin turns before a waiting thread sleeps (its default is 300,000)
SPIN_COUNT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # the user's choice of waiting, either way
_CHOSEN_THREADS: str | None = None  # the OMP_NUM_THREADS fit_threads set in this process (any other is the user's)


def shorten_openmp_spinning() -> None:
    """Before torch is imported: OpenMP threads wait ``SPIN_COUNT`` turns, then sleep, unless the user chose a wait
    policy (``OMP_WAIT_POLICY``) or a spin count (``GOMP_SPINCOUNT``)."""
    if not any(name in os.environ for name in SPIN_COUNT_VARIABLES):
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in cores (a container's ``--cpus``), or None where there is none: cgroup
    v2's ``cpu.max`` ("max 100000" or "150000 100000"), else v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``."""
    try:
        if (root / "cpu.max").is_file():
            quota, period = (root / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        for folder in (root / "cpu", root / "cpu,cpuacct"):
            if (folder / "cpu.cfs_quota_us").is_file():
                quota = int((folder / "cpu.cfs_quota_us").read_text())
                return None if quota <= 0 else quota / int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError, ZeroDivisionError):
        return None  # unreadable: no quota known
    return None


def usable_cores(root: Path = Path("/sys/fs/cgroup")) -> tuple[int, str]:
    """The cores this process may use, and why: its CPU affinity (``taskset``, a scheduler's allocation), capped by its
    cgroup's CPU quota."""
    machine = os.cpu_count() or 1
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else machine
    why = f"{affinity} of the machine's {machine} cores (CPU affinity)" if affinity < machine else f"{machine} cores"
    quota = cgroup_cpu_quota(root)
    if quota is not None and math.ceil(quota) < affinity:
        return max(1, math.ceil(quota)), f"a CPU quota of {quota:g} cores (cgroup) on {why}"
    return affinity, why


def threads_per_process(processes: int) -> tuple[int, str]:
    """The usable cores shared among ``processes`` processes (a CPU run's, a server's workers), and why."""
    cores, why = usable_cores()
    return max(1, cores // processes), why


def user_threads() -> int | None:
    """The thread count the user chose with ``OMP_NUM_THREADS`` (not the one ``fit_threads`` set), or None."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    return int(given) if given.isdigit() and int(given) > 0 and given != _CHOSEN_THREADS else None


def fit_threads(processes: int = 1) -> None:
    """Threads per process for a CPU run of ``processes`` processes: the usable cores shared among them, said in one
    line. ``OMP_NUM_THREADS`` set by the user (or inherited from the run that launched this process) wins; the one
    set here stops Lightning's launcher from choosing by core count, and the next run in this process chooses again."""
    import torch
    from lightning.pytorch.utilities import rank_zero_info

    global _CHOSEN_THREADS
    if user_threads() is not None:
        return
    threads, why = threads_per_process(processes)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = _CHOSEN_THREADS = str(threads)
    each = f", {processes} processes" if processes > 1 else ""
    rank_zero_info(f"Threads: {threads} per process ({why}{each}; set OMP_NUM_THREADS to choose).")


def cap_threads() -> None:
    """For ``load()``, a call inside the user's program: torch's thread count is left as the program set it, unless it
    exceeds the cores the process may use (a container's quota), then it is lowered to them and that is said."""
    import torch
    from lightning.pytorch.utilities import rank_zero_info

    cores, why = usable_cores()
    if "OMP_NUM_THREADS" not in os.environ and torch.get_num_threads() > cores:
        rank_zero_info(f"Threads: {cores}, not torch's {torch.get_num_threads()} ({why}; set OMP_NUM_THREADS or "
                       "torch.set_num_threads to choose).")
        torch.set_num_threads(cores)
