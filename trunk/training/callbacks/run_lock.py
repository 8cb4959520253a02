"""One run per run folder: a ``trunk fit`` holds its ``version_N`` folder with a lock file that names its process and
host, so that two runs never write into one folder (interleaved ``metrics.csv``, each other's ``last.ckpt``).

A new run whose folder another live run holds takes the next version; a resume of a folder another live run holds is
refused, naming the holder. The lock is the kernel's (``flock``): it goes with the process however it ends, so a
killed run's folder is free for the next run at once, and two runs that start together cannot both take it. The file
only names the holder for the message. Hand-written: Lightning picks ``version_N`` by listing the folder, which two
runs starting together both see empty."""

from __future__ import annotations

import atexit
import json
import os
import re
import socket
import time
import warnings
from pathlib import Path

import lightning as L

LOCK_FILE = ".trunk.lock"
_HELD: dict[Path, int] = {}  # this process's locks: a fit that ended without its teardown does not lock out the next


def holder(lock: Path) -> dict:
    """Who holds ``lock``, as its file says: {pid, host, started} (``?`` where the file cannot tell)."""
    try:
        owner = json.loads(lock.read_text())
        return {"pid": int(owner["pid"]), "host": str(owner["host"]), "started": str(owner.get("started", "?"))}
    except (OSError, ValueError, KeyError, TypeError):  # being written, or not a lock file of Trunk's
        return {"pid": "?", "host": "?", "started": "?"}


def _alive(owner: dict) -> bool:
    """Whether the process a lock file names may be running (one of another host is taken to be)."""
    if owner["host"] != socket.gethostname():
        return owner["host"] != "?"
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True


def try_lock(folder: Path) -> dict | None:
    """Take ``folder``'s lock (creating the folder). Returns None when taken, else the live holder."""
    import fcntl  # POSIX; imported here so that the module loads everywhere

    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_FILE
    release(lock)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            for _ in range(100):  # the holder may be writing its name over a killed run's: a second at most
                owner = holder(lock)
                if _alive(owner):
                    break
                time.sleep(0.01)
            return owner
        except OSError as err:  # a file system without locks (some network ones): said, and the run goes on
            os.close(fd)
            warnings.warn(f"The file system of '{folder}' cannot lock files ({err}): two runs started in this folder "
                          "at once would not be kept apart.", stacklevel=2)
            return None
        try:
            if os.path.samestat(os.fstat(fd), os.stat(lock)):  # not a file its holder removed as we opened it
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                         "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
                _HELD[lock] = fd
                return None
        except FileNotFoundError:
            pass
        os.close(fd)


def release(lock: Path) -> None:
    """Give up ``lock`` if this process holds it: the file goes first, then the kernel's lock."""
    fd = _HELD.pop(lock, None)
    if fd is not None:
        try:
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)


@atexit.register
def _release_all() -> None:  # any exit, also one that skips the callbacks' teardown
    for lock in list(_HELD):
        release(lock)


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
                    f"{owner['started']}): two runs writing into one folder would mix their metrics and "
                    "checkpoints. Wait for it to end, or give this run another trainer.default_root_dir.")
            versioned._version = versioned.version + 1  # a new run: the next version, as if it had started later
            versioned._experiment = None  # made for the folder it had: made again for this one
        self.lock = folder / LOCK_FILE
        # the lock is what makes a new run's folder "not empty" to Lightning's loggers: nothing of an earlier run's
        warnings.filterwarnings("ignore", message=rf"Experiment logs directory {re.escape(str(folder))} exists and is "
                                                  "not empty")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.release()

    def release(self) -> None:
        if self.lock is not None:
            release(self.lock)
        self.lock = None
