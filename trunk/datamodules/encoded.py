"""Encoded splits on disk: each split is tokenized once into Arrow files, then memory-mapped.

A split's encoding depends on its rows, the tokenizer and the task's options; ``encoded_split``
keys the cache by all three (``TextDataModule.encoding_key``). The next run, and every other
process of a distributed run, maps the same files instead of tokenizing again, and a split far
larger than memory costs only the pages a batch touches.

A cache entry is a directory ``<cache>/encoded/<digest>/`` holding the Arrow files and
``trunk_cache.json`` (the key, the files with their sizes and CRC-32 checksums, the row count, the
warnings the encoding gave). It is built in a temporary directory and renamed into place whole, so
a killed build leaves no entry. An entry that fails its checks (missing, resized or altered files,
another key, unreadable Arrow) is deleted and built again, with a warning; it is never used. The
checksums cost one read of the files per run (CRC-32 runs at a few GB/s).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import socket
import tempfile
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path

import datasets
from lightning.pytorch.utilities import rank_zero_warn

from trunk.core.atomic import atomic_write
from trunk.core.codec import cache_folder

CACHE_VERSION = 4  # bump when the layout of encoded examples, how files are read, or how sources are keyed changes
META = "trunk_cache.json"


class DamagedCache(Exception):
    pass


def key_digest(key: list) -> str:
    return hashlib.sha256(json.dumps(key, default=str, sort_keys=True).encode()).hexdigest()[:24]


def encoded_split(key: list, build: Callable[[Path], list[str]], what: str,
                  origin: tuple[list, list] | None = None) -> tuple[datasets.Dataset, list[str]]:
    """The encoded split for ``key``: loaded from the cache, else built by ``build(directory)``, which
    writes Arrow files there and returns the warnings to give (they are given again on every hit).

    Returns the memory-mapped dataset and those warnings. ``what`` names the split in messages. ``origin``: (the split
    by name, which version of its files it reads); where another version was read last, the rebuild says so.
    """
    key = [CACHE_VERSION, *key]
    folder = cache_folder("encoded")
    if folder is None:  # no usable cache: built in a folder of this run's own, gone at its end
        scratch = Path(tempfile.mkdtemp(prefix="trunk-encoded-"))
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        notes = build(scratch)
        return _arrow(sorted(scratch.glob("*.arrow"))), notes
    path = folder / key_digest(key)
    record, version = (None, None) if origin is None else (folder / "origins" / key_digest([CACHE_VERSION, *origin[0]]),
                                                           json.dumps(origin[1], default=str))
    if path.exists():
        try:
            found = _load(path, key)
            _record(record, version)
            return found
        except DamagedCache as err:
            rank_zero_warn(f"The encoded-data cache {path} for {what} is damaged ({err}); encoding {what} again.")
            shutil.rmtree(path, ignore_errors=True)
    elif record is not None and record.is_file() and record.read_text() != version:
        rank_zero_warn(f"{what}: its source changed since it was last encoded (its files hold other bytes); encoding "
                       "it again.")
    _remove_abandoned_builds(path)
    tmp = path.parent / f".{path.name}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir(parents=True)
    try:
        notes = build(tmp)
        files = sorted(p.name for p in tmp.glob("*.arrow"))
        meta = {
            "key": json.loads(json.dumps(key, default=str)),
            "files": {f: [(tmp / f).stat().st_size, crc32(tmp / f)] for f in files},
            "rows": sum(len(datasets.Dataset.from_file(str(tmp / f))) for f in files),
            "warnings": notes,
        }
        (tmp / META).write_text(json.dumps(meta, sort_keys=True))
        try:
            os.rename(tmp, path)  # atomic: readers see no entry or a whole one
        except OSError:  # another process (another node on a shared disk) finished first: use its entry
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _record(record, version)
    return _load(path, key)


def _record(record: Path | None, version: str | None) -> None:
    """Note ``version`` as the one of its split's files read last (``record``), replaced whole."""
    if record is None or (record.is_file() and record.read_text() == version):
        return
    atomic_write(record, lambda tmp: tmp.write_text(version))


def _load(path: Path, key: list) -> tuple[datasets.Dataset, list[str]]:
    try:
        meta = json.loads((path / META).read_text())
        meta["files"], meta["rows"], meta["warnings"]  # noqa: B018
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DamagedCache(f"no readable {META}: {err}") from None
    if meta.get("key") != json.loads(json.dumps(key, default=str)):
        raise DamagedCache("it was written for other data or options")
    for name, (size, checksum) in meta["files"].items():
        actual = (path / name).stat().st_size if (path / name).is_file() else None
        if actual != size:
            raise DamagedCache(f"{name} is {'missing' if actual is None else f'{actual} bytes, not {size}'}")
        if crc32(path / name) != checksum:
            raise DamagedCache(f"{name} does not match its checksum")
    try:
        ds = _arrow([path / name for name in sorted(meta["files"])])
    except Exception as err:  # pyarrow's errors for a file that is not Arrow
        raise DamagedCache(f"unreadable Arrow data: {type(err).__name__}: {err}") from None
    if len(ds) != meta["rows"]:
        raise DamagedCache(f"{len(ds)} rows, not {meta['rows']}")
    return ds, meta["warnings"]


def _arrow(files: list[Path]) -> datasets.Dataset:
    """Arrow files as one memory-mapped dataset, in their order."""
    parts = [datasets.Dataset.from_file(str(file)) for file in files]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def crc32(path: Path) -> int:
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            value = zlib.crc32(chunk, value)
    return value


def _remove_abandoned_builds(path: Path) -> None:
    """Temporary directories of builds on this machine whose process is gone (killed mid-build)."""
    host = socket.gethostname()
    for tmp in path.parent.glob(f".{path.name}.{host}.*.tmp"):
        pid = int(tmp.name.split(".")[-3])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass
