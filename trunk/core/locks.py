"""One writer per output: a lock file that names its holder (process, host, start), held with the kernel's ``flock`` so
that it goes with the process however it ends (a killed writer frees its output at once) and two processes that start
together cannot both take it. Run folders (``trunk fit``), prediction files, exported and imported directories and
benchmark ledgers are held so. Hand-written: ``flock`` is the whole mechanism; the file only names the holder for the
message.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trunk.core.atomic import check_output_dir

_HELD: dict[Path, int] = {}  # this process's locks: released at exit, however the work ended


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


def try_lock(lock: Path) -> dict | None:
    """Take the lock file ``lock`` (creating its folder). Returns None when taken, else the live holder."""
    import fcntl  # POSIX; imported here so that the module loads everywhere

    lock.parent.mkdir(parents=True, exist_ok=True)
    release(lock)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            for _ in range(100):  # the holder may be writing its name over a killed one's: a second at most
                owner = holder(lock)
                if _alive(owner):
                    break
                time.sleep(0.01)
            return owner
        except OSError as err:  # a file system without locks (some network ones): said, and the work goes on
            os.close(fd)
            warnings.warn(f"The file system of '{lock.parent}' cannot lock files ({err}): two processes writing there "
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
def _release_all() -> None:  # any exit, also one that skips the code that would release
    for lock in list(_HELD):
        release(lock)


def output_lock(path: Path) -> Path:
    """The lock file of an output file or directory: beside it, hidden."""
    path = path.expanduser().absolute()
    return path.parent / f".{path.name}.trunk.lock"


def hold_output(path: Path, option: str) -> Path:
    """Hold the output ``path`` (a file or a directory) for this process, or refuse it naming the process that writes
    it: two writers would leave one's output and both say they wrote it. Returns the lock, to ``release``."""
    lock = output_lock(Path(path))
    owner = try_lock(lock)
    if owner is not None:
        raise FileExistsError(f"{option}='{path}' is being written by process {owner['pid']} on {owner['host']} "
                              f"(since {owner['started']}): two writers would leave only one's output. Wait for it "
                              "to end, or write elsewhere.")
    return lock


@contextmanager
def writing_output_dir(path: Path, option: str) -> Iterator[None]:
    """Before any work, refuse an output directory this process cannot create or another process writes
    (``check_output_dir``, ``hold_output``); hold it for the block."""
    check_output_dir(Path(path), option)
    lock = hold_output(Path(path), option)
    try:
        yield
    finally:
        release(lock)
