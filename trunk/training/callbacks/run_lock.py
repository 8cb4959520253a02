"""One run per run folder: a ``trunk fit`` holds its ``version_N`` folder with a lock file that names its process and
host, so that two runs never write into one folder (interleaved ``metrics.csv``, each other's ``last.ckpt``).

A new run whose folder another live run holds takes the next version; a resume of a folder another live run holds is
refused, naming the holder. The lock goes with the process (at any exit; a killed run's lock names a dead process,
which the next run takes over). Hand-written: Lightning picks ``version_N`` by listing the folder, which two runs
starting together both see empty."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import socket
import time
import warnings
from pathlib import Path

import lightning as L

LOCK_FILE = ".trunk.lock"


def holder(lock: Path) -> dict | None:
    """Who holds ``lock``: its {pid, host, started}, or None when nobody alive does (no file, a dead process of this
    host, an unreadable file)."""
    try:
        owner = json.loads(lock.read_text())
        pid, host = int(owner["pid"]), str(owner["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, another user's
    return owner


def try_lock(folder: Path) -> dict | None:
    """Take ``folder``'s lock (creating the folder), taking it over from a dead holder. Returns None when taken, else
    the live holder."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_FILE
    mine = folder / f".{LOCK_FILE}.{socket.gethostname()}.{os.getpid()}"
    mine.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                "started": time.strftime("%Y-%m-%d %H:%M:%S")}))
    try:
        for _ in range(3):
            try:
                os.link(mine, lock)  # appears whole or not at all; of two runs, one makes it
                return None
            except FileExistsError:
                owner = holder(lock)
                if owner is not None and owner.get("pid") != os.getpid():
                    return owner
                with contextlib.suppress(FileNotFoundError):  # a dead holder's (or our own earlier) lock
                    lock.unlink()
        return holder(lock)
    finally:
        mine.unlink()


class RunFolderLock(L.Callback):
    """Hold the run's folder for the whole fit (on the first process; the others write where it says). ``resume``: the
    run continues the folder of the checkpoint it resumes, which it may not leave for another."""

    def __init__(self, resume: bool = False) -> None:
        self.resume, self.lock = resume, None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or trainer.global_rank != 0:
            return
        versioned = next((lg for lg in trainer.loggers if hasattr(lg, "_version") and hasattr(lg, "root_dir")), None)
        while True:
            folder = Path(versioned.log_dir if versioned is not None else trainer.default_root_dir)
            owner = try_lock(folder)
            if owner is None:
                break
            if versioned is None or self.resume or not isinstance(versioned.version, int):
                raise FileExistsError(
                    f"The run folder '{folder}' is in use by process {owner['pid']} on {owner['host']} (since "
                    f"{owner.get('started', '?')}): two runs writing into one folder would mix their metrics and "
                    "checkpoints. Wait for it to end, or give this run another trainer.default_root_dir. (If that "
                    f"process is gone on another machine, delete '{folder / LOCK_FILE}'.)")
            versioned._version = versioned.version + 1  # a new run: the next version, as if it had started later
            versioned._experiment = None  # made for the folder it had: made again for this one
        self.lock = folder / LOCK_FILE
        atexit.register(self.release)  # any exit, also one that skips teardown
        # the lock is what makes a new run's folder "not empty" to Lightning's loggers: nothing of an earlier run's
        warnings.filterwarnings("ignore", message=rf"Experiment logs directory {re.escape(str(folder))} exists and is "
                                                  "not empty")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.release()

    def release(self) -> None:
        if self.lock is not None and (holder(self.lock) or {}).get("pid") == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                self.lock.unlink()
        self.lock = None
