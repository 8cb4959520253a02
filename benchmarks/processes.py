"""Measurements in a fresh process of its own, whose memory is then its own (what it built and ran, nothing of the
parent's). Shared by the benchmarks that report peak memory."""

from __future__ import annotations

import multiprocessing


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
