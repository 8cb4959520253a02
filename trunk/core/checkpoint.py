"""The one reader of Lightning checkpoints: ``weights_only`` unpickling (a crafted file cannot run code),
the digest Trunk writes with every checkpoint verified, and sharded (distributed) checkpoints
gathered without running code either. ``AtomicCheckpointIO`` writes what this reads."""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
from pathlib import Path

import torch

DIGEST_KEY, DIGEST_V2 = "trunk_digest", "v2:"


def checkpoint_digest(obj, values: bool = True) -> str:
    """sha256 over a (nested) checkpoint: every tensor with its place, dtype and shape and, with ``values``, every
    other stored value with its place and type (label names, data settings, the architecture), so an edited label
    is caught like a flipped bit."""
    h = hashlib.sha256()

    def walk(value, place: str) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous().reshape(-1)
            h.update(f"{place}:{t.dtype}:{tuple(value.shape)};".encode())
            h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                if key != DIGEST_KEY:
                    walk(value[key], f"{place}/{key}")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{place}[{i}]")
        elif values:
            shown = repr(sorted(value, key=repr)) if isinstance(value, (set, frozenset)) else repr(value)
            h.update(f"{place}={type(value).__name__}:{shown};".encode())

    walk(obj, "")
    return h.hexdigest()


def stored_digest(ckpt: dict) -> str:
    """The digest to write with ``ckpt``: "v2:<tensors>:<everything>", so a reader can say which part changed."""
    return f"{DIGEST_V2}{checkpoint_digest(ckpt, values=False)}:{checkpoint_digest(ckpt)}"


def verify_digest(ckpt: dict, path: Path) -> None:
    """Refuse a checkpoint that changed after it was written (bit rot, a bad copy, an edit)."""
    stored = ckpt.get(DIGEST_KEY)
    if stored is None:
        return
    tensors, _, everything = stored.removeprefix(DIGEST_V2).partition(":")  # Trunk before v2: tensors only
    if tensors != checkpoint_digest(ckpt, values=False):
        raise ValueError(
            f"'{path}' is corrupted: its tensors do not match the digest written with them (a damaged disk or an "
            "incomplete copy). Use another checkpoint, e.g. an earlier one or best-*.ckpt."
        )
    if everything and everything != checkpoint_digest(ckpt):
        raise ValueError(
            f"'{path}' changed after it was written: its stored settings (label names, data options, architecture) "
            "do not match the digest written with them (an edit, or a damaged copy). Use the checkpoint as Trunk "
            "wrote it, or another one (e.g. best-*.ckpt)."
        )


def check_readable(*paths: Path) -> None:
    """A file that is there but closed to this user is a permission problem, not a damaged file: say which, and the
    fix."""
    for path in paths:
        if path.is_file() and not os.access(path, os.R_OK):
            mode = stat.filemode(path.stat().st_mode)
            raise PermissionError(
                f"'{path}' is there but this user cannot read it (its mode is {mode}): ask its owner to make it "
                f"readable (chmod a+r '{path}'), or copy it somewhere you can read."
            )


def not_a_torch_file(path: Path) -> str | None:
    """What a file is, in words, when its first bytes say it is not one ``torch.save`` writes (a zip archive, or a
    pickle in the legacy format); None when it may be one."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return None
    if not head:
        return "empty"
    try:
        first = head.decode("utf-8").splitlines()[0]
    except (UnicodeDecodeError, IndexError):
        return None  # binary: torch's own reading says what is wrong
    return f"a text file (its first line: {first[:60]!r})"


def load_checkpoint(ckpt_path: str | Path) -> dict:
    """A Lightning checkpoint's contents, unpickled with ``weights_only=True``: tensors and plain values
    only, so a crafted file cannot run code."""
    ckpt_path = Path(ckpt_path)
    if is_sharded_checkpoint(ckpt_path):
        return consolidate_sharded_checkpoint(ckpt_path)
    if ckpt_path.is_dir():
        raise ValueError(
            f"'{ckpt_path}' is a directory, not a checkpoint: pass a .ckpt file written by `trunk fit` (or the "
            "directory of a sharded checkpoint, which holds meta.pt)."
        )
    if not ckpt_path.is_file():
        raise FileNotFoundError(f"Checkpoint '{ckpt_path}' does not exist. Pass a .ckpt written by `trunk fit`.")
    check_readable(ckpt_path)
    foreign = not_a_torch_file(ckpt_path)
    if foreign:
        raise ValueError(f"'{ckpt_path}' is not a checkpoint: it is {foreign}. Give a .ckpt written by `trunk fit`.")
    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        unsafe = [line.strip() for line in str(err).splitlines() if "GLOBAL" in line or "Unsupported global" in line]
        if not unsafe:
            raise ValueError(f"'{ckpt_path}' is not a readable checkpoint (truncated or corrupted?).") from None
        raise ValueError(
            f"'{ckpt_path}' holds objects other than tensors and plain values, which Trunk refuses to unpickle (they "
            f"could run code); Trunk's own checkpoints never do. {unsafe[0]}"
        ) from None
    except Exception as err:  # torch raises many kinds on random bytes, and its advice (weights_only=False) runs code
        raise ValueError(f"'{ckpt_path}' is not a readable checkpoint (truncated or corrupted?): {type(err).__name__}: "
                         f"{str(err)[:200]}") from None
    if not isinstance(ckpt, dict):
        raise ValueError(f"'{ckpt_path}' is not a Lightning checkpoint (it holds a {type(ckpt).__name__}).")
    verify_digest(ckpt, ckpt_path)
    return ckpt


def is_sharded_checkpoint(path: Path) -> bool:
    """A distributed checkpoint directory, as Lightning's ModelParallelStrategy writes by default (one file of
    shards per process, plus meta.pt with everything that is not a tensor)."""
    return path.is_dir() and (path / "meta.pt").is_file() and (path / ".metadata").is_file()


class _ShardIndexUnpickler(pickle.Unpickler):
    """Reads a sharded checkpoint's index (``.metadata``, a plain pickle) allowing only the classes that
    ``torch.distributed.checkpoint`` writes there, so a crafted index cannot run code."""

    ALLOWED = {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    }

    MODULES = {module for module, _ in ALLOWED} | {"torch.distributed.checkpoint.metadata"}  # the only ones imported

    def find_class(self, module: str, name: str):
        import importlib

        # a module the file names is imported only if it is one of these: importing any other runs its top level
        found = getattr(importlib.import_module(module), name, None) if module in self.MODULES else None
        if (module, name) in self.ALLOWED or (module == "torch.distributed.checkpoint.metadata"
                                              and getattr(found, "__module__", None) == module):  # its own classes only
            return found
        found = getattr(torch, name, None) if module == "torch" else None
        if isinstance(found, (torch.dtype, torch.memory_format)):
            return found
        raise pickle.UnpicklingError(f"Unsupported global: {module}.{name}")


def consolidate_sharded_checkpoint(path: Path) -> dict:
    """A sharded checkpoint's contents, gathered into one process's memory, as a checkpoint file would hold
    them. Like Lightning's ``_load_distributed_checkpoint``, but nothing is unpickled that could run code:
    the index through ``_ShardIndexUnpickler`` first, meta.pt with ``weights_only=True``."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    try:
        with (path / ".metadata").open("rb") as f:
            _ShardIndexUnpickler(f).load()
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"'{path}' is not a sharded checkpoint Trunk will read: its index (.metadata) holds objects other than "
            f"torch.distributed.checkpoint's, which could run code ({err})."
        ) from None
    ckpt: dict = {}
    try:
        _load_state_dict(
            ckpt, storage_reader=FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(), no_dist=True
        )
        ckpt.update(torch.load(path / "meta.pt", map_location="cpu", weights_only=True))
    except Exception as err:  # a missing or damaged shard
        raise ValueError(
            f"'{path}' is a sharded checkpoint that cannot be read whole ({type(err).__name__}: {str(err)[:200]}): a "
            "shard file is missing or damaged."
        ) from None
    ckpt.pop("optimizer_0", None)  # the optimizer's shards: not needed to export or start from the weights
    return ckpt
