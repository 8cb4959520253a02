"""Measurements in a fresh process of its own: whose memory is then its own (what it built and ran, nothing of the
parent's), shared by the benchmarks that report peak memory; and whose OpenMP is set as a setting asks, beside a busy
core or not (``inference.py --only busy``, ``loop_overhead.py --under-load``)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

from trunk.training.threads import SPIN_COUNT, SPIN_COUNT_VARIABLES


def resident_mib(field: str = "VmHWM") -> float:
    """This process's memory from /proc/self/status, in MiB: ``VmHWM`` its peak resident memory so far, ``VmRSS`` now
    (ru_maxrss would include the parent's memory from before exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def in_fresh_process(target, *args):
    """``target(*args, queue)`` in a new (spawned) process; what it puts on the queue."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(*args, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


THREAD_SETTINGS = {  # threads and OpenMP waiting -> a child's environment
    "1 thread": {"OMP_NUM_THREADS": "1", "GOMP_SPINCOUNT": SPIN_COUNT},
    "Trunk's (all usable cores, short spinning)": {"GOMP_SPINCOUNT": SPIN_COUNT},  # what the `trunk` command sets
    "all cores, OpenMP's default spinning": {},
}


def beside_busy_core(argv: list[str]) -> list[tuple[str, str, object]]:
    """``argv`` (a child printing its result as JSON on its last line) run quiet, then with another process spinning on
    one core (``while True: pass``), once per thread setting: (other load, setting, result). A child process each:
    OpenMP reads its environment once, when torch loads it."""
    results = []
    for load_beside in ("quiet", "one core busy"):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load_beside != "quiet" else None
        try:
            for setting, env in THREAD_SETTINGS.items():
                clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", *SPIN_COUNT_VARIABLES)}
                out = subprocess.run(argv, env={**clean, **env}, capture_output=True, text=True)
                if out.returncode:
                    raise RuntimeError(f"{' '.join(argv)} failed:\n{out.stderr[-2000:]}")
                results.append((load_beside, setting, json.loads(out.stdout.strip().splitlines()[-1])))
        finally:
            if hog:
                hog.kill()
                hog.wait()
    return results
