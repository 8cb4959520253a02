"""Writes that never leave a half-written file, and never remove the previous good one.

Every file Trunk writes for later runs (checkpoints, trunk directories, cached tokenizers) goes to a
temporary name in the destination directory (the same filesystem, so the final rename is atomic),
is flushed to disk, then renamed over the destination. A kill at any moment leaves either the old
file or the new one, never a truncated one; a temporary file left behind by a kill is ignored and
replaced by the next write.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

TMP_MARK = ".tmp"  # temporary names: .<name>.tmp<pid>


def temporary_path(path: Path) -> Path:
    return path.parent / f".{path.name}{TMP_MARK}{os.getpid()}"


def check_output_file(path: Path, overwrite: bool, inputs: list[Path], option: str) -> None:
    """Before any work: refuse an output ``path`` that is one of the run's ``inputs`` (whatever ``overwrite`` says), a
    directory, an existing file without ``overwrite``, or a place this user cannot write; ``option`` is the setting
    that names it."""
    resolved = path.expanduser().resolve()
    for source in inputs:
        if resolved == Path(source).expanduser().resolve():
            raise ValueError(f"{option}='{path}' is '{source}', which this run reads: writing there would lose it. "
                             "Choose another output path.")
    if path.is_dir():
        raise ValueError(f"{option}='{path}' is a directory: give a file path.")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{option}='{path}' exists: Trunk never replaces a file without being told to. Choose "
                              f"another path, or pass {option.rsplit('.', 1)[0]}.overwrite=true.")
    parent = next((p for p in resolved.parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{option}='{path}': this user cannot create files in '{parent}'. Choose a folder you "
                              "can write to.")


def check_output_dir(path: Path, option: str) -> None:
    """Before any work: refuse an output directory ``path`` whose nearest existing folder this process cannot create
    folders in (tried for real: write permission says nothing for root, nor on /proc or a read-only mount)."""
    parent = next((p for p in path.expanduser().resolve().parents if p.exists()), None)
    try:
        if parent is None or not parent.is_dir():
            raise NotADirectoryError(f"'{parent}' is not a folder")
        os.rmdir(tempfile.mkdtemp(prefix=f".{path.name}{TMP_MARK}", dir=parent))
    except OSError as err:
        raise PermissionError(f"{option}='{path}': no folder can be created in '{parent}' ({err.strerror or err}). "
                              "Choose a folder you can write to.") from None


def usual_mode(path: Path) -> None:
    """Give a written file the mode of any file the user creates (0666 less the umask): some writers (safetensors)
    create theirs owner-only, and a trunk directory shared with others would then be unreadable to them."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            usual_mode(path)
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
    fsync_directory(directory)


class DiskFull(OSError):
    """A write that ran out of space: what was not written, and what was kept."""


def _out_of_space(err: BaseException, directory: Path) -> bool:
    # torch.save reports a full disk as a RuntimeError of its zip writer ("file write failed", "unexpected pos ..."):
    # taken as one when the partial file has left the disk (nearly) without room
    if isinstance(err, OSError):
        return err.errno == errno.ENOSPC
    return isinstance(err, RuntimeError) and shutil.disk_usage(directory).free < 2**20


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """``with atomic_path(p) as tmp: write(tmp)``: the content appears at ``p`` whole, or not at all. A full disk
    is a ``DiskFull`` error that says where, and that the previous file (if any) is kept."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        yield tmp
        usual_mode(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except (OSError, RuntimeError) as err:
        if not _out_of_space(err, path.parent):
            raise
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        free = shutil.disk_usage(path.parent).free
        kept = f"the previous '{path.name}' there is kept as it was" if path.exists() else "nothing was there before"
        full = DiskFull(
            f"The disk holding '{path.parent}' is full ({free / 2**20:.1f} MiB free): '{path.name}' was not written, "
            f"and {kept}. Free some space or write elsewhere (trainer.default_root_dir), then resume with --ckpt_path "
            "last."
        )
        full.errno = errno.ENOSPC
        raise full from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` and move the result to ``path`` atomically."""
    with atomic_path(path) as tmp:
        write(tmp)
    return Path(path)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def followed(path: Path) -> Path:
    """Where a directory output goes: a symbolic link is followed, so the link stays and shows the new content where it
    points (and the temporary copy is made beside the target, on its filesystem)."""
    return path.resolve() if path.is_symlink() else path


def replace_directory(tmp: Path, directory: Path) -> None:
    """Move the finished directory ``tmp`` to ``directory``, replacing what is there. Where the OS can
    swap two directories atomically (Linux), a reader always finds a whole directory, old or new;
    elsewhere there is a moment with none, but never a mixed or half-written one."""
    fsync_tree(tmp)
    if directory.is_dir() and not directory.is_symlink() and _exchange(tmp, directory):
        shutil.rmtree(tmp, ignore_errors=True)  # now holds the old content
    else:
        old = directory.parent / f".{directory.name}.old{os.getpid()}"
        if directory.exists():
            os.replace(directory, old)
        os.replace(tmp, directory)
        shutil.rmtree(old, ignore_errors=True)
    fsync_directory(directory.parent)
