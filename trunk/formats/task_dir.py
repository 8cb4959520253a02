"""Task directories: one task's head (and its delta, ``model.peft``) without the trunk it runs on.

    <dir>/config.json        {"format": "trunk-task", "format_version": 1, "task": name, "head": {kind, label_names,
                              objective, peft, data, ...}, "trunk_fingerprint": sha256 of the trunk's weights, ...}
    <dir>/model.safetensors  the head's (and delta's) weights
    <dir>/target_tokenizer.<task>.json   a translation task's target vocabulary, if it has one

``trunk export CKPT DIR --task NAME`` writes one; ``trunk.tasks.load([TRUNK, TASK_DIR, ...])``,
``model.init_from: [TRUNK, TASK_DIR, ...]`` and ``trunk serve TRUNK TASK_DIR ...`` read a trunk (a trunk directory or a
checkpoint) with any number of them. A task directory answers only on the trunk it was trained on: its fingerprint
must equal that trunk's, or it is refused. Ten LoRA tasks on one trunk are one trunk's weights plus ten files of a few
hundred kilobytes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from trunk.core.atomic import followed, replace_directory, temporary_path
from trunk.core.codec import load_tokenizer
from trunk.formats.hf import convert, is_hf_folder
from trunk.formats.trunk_dir import (
    CONFIG_FILE,
    TARGET_TOKENIZER_FILE,
    WEIGHTS_FILE,
    PretrainedTrunk,
    _untie,
    check_writable,
    load_pretrained,
    verify_files,
    write_weights_and_config,
)

TASK_FORMAT_NAME, TASK_FORMAT_VERSION = "trunk-task", 1


def trunk_fingerprint(weights: dict[str, torch.Tensor]) -> str:
    """The sha256 of a trunk's weights (names, dtypes, shapes and values, in name order): which trunk a task was
    trained on, the same whether the trunk is read from a directory or a checkpoint."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # bytes, so bf16 (no numpy type) hashes too
    return digest.hexdigest()


def save_task(directory: str | Path, pretrained: PretrainedTrunk, task: str, overwrite: bool = False) -> Path:
    """Write ``task``'s head (with its delta, if it has one) as a task directory, atomically, fingerprinted with the
    trunk it was trained on."""
    directory = Path(directory)
    if task not in pretrained.heads:
        raise ValueError(f"'{pretrained.path}' has no task '{task}'; its tasks are {sorted(pretrained.heads)}.")
    directory = followed(Path(directory))
    check_writable(directory, overwrite)
    head = pretrained.heads[task]
    tensors, tied = _untie(dict(head["state"]))
    meta = {"format": TASK_FORMAT_NAME, "format_version": TASK_FORMAT_VERSION, "task": task, "head": head["meta"],
            "trunk_fingerprint": trunk_fingerprint(pretrained.trunk_weights), "tied": tied}
    tmp = temporary_path(directory)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if task in pretrained.codec.targets:
        pretrained.codec.targets[task].save(str(tmp / TARGET_TOKENIZER_FILE.format(task=task)))
    write_weights_and_config(tmp, tensors, meta)
    replace_directory(tmp, directory)
    return directory


def task_meta(path: Path) -> dict | None:
    """config.json of a task directory, or None when ``path`` is not one (a trunk directory, a checkpoint); a
    config.json that does not parse makes it neither, said as such."""
    try:
        meta = json.loads((path / CONFIG_FILE).read_text()) if (path / CONFIG_FILE).is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"'{path / CONFIG_FILE}' is not valid JSON ({err}), so '{path}' is neither a trunk nor a "
                         "task directory. Export it again.") from None
    except OSError:
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == TASK_FORMAT_NAME else None


def read_task(path: Path) -> tuple[str, dict, str, object | None]:
    """A task directory's task name, head ({"meta", "state"}), trunk fingerprint and target tokenizer (or None)."""
    meta = task_meta(path)
    if meta is None:
        raise ValueError(
            f'\'{path}\' is not a Trunk task directory (its {CONFIG_FILE} has no "format": "{TASK_FORMAT_NAME}"). '
            "Write one with `trunk export CKPT DIR --task NAME`."
        )
    if meta.get("format_version", 0) > TASK_FORMAT_VERSION:
        raise ValueError(
            f"Task directory '{path}' has format version {meta['format_version']}, newer than this Trunk reads "
            f"({TASK_FORMAT_VERSION}). Upgrade Trunk."
        )
    verify_files(path, meta)
    try:
        tensors = load_file(str(path / WEIGHTS_FILE))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(
            f"'{path / WEIGHTS_FILE}' is missing, corrupted or not a safetensors file ({err}). Export the task again."
        ) from err
    for name, source in meta.get("tied", {}).items():
        tensors[name] = tensors[source]
    task = meta["task"]
    target = path / TARGET_TOKENIZER_FILE.format(task=task)
    return (
        task,
        {"meta": meta["head"], "state": tensors},
        meta["trunk_fingerprint"],
        load_tokenizer(target) if target.is_file() else None,
    )


def load_trunk(path: Path) -> PretrainedTrunk:
    """A trunk directory or checkpoint, or a Hugging Face model folder read as one (``trunk.formats.hf``)."""
    if not is_hf_folder(path):
        return load_pretrained(path)
    from lightning.pytorch.utilities import rank_zero_info  # here: reading a trunk needs no Lightning

    pretrained, notes = convert(path)
    rank_zero_info(f"'{path}' is a Hugging Face model, read as a trunk" + (f": {'; '.join(notes)}" if notes else "."))
    return pretrained


def read_trunk(sources: str | Path | list | tuple) -> PretrainedTrunk:
    """A trunk (directory or checkpoint) with the heads of any task directories given beside it, in any order
    (``model.init_from``, ``load``). References (hf://, wandb-artifact://) are fetched first."""
    from trunk.formats.artifacts import resolve_init_from

    paths = [resolve_init_from(source) for source in (sources if isinstance(sources, (list, tuple)) else [sources])]
    if len(paths) == 1:
        return load_trunk(paths[0])  # (a task directory alone is refused there, with what to add)
    task_dirs = [p for p in paths if task_meta(p) is not None]
    trunks = [p for p in paths if p not in task_dirs]
    if len(trunks) != 1:
        raise ValueError(f"Give one trunk (a trunk directory or a checkpoint) and any number of task directories; "
                         f"{'none of' if not trunks else f'{len(trunks)} of'} {[str(p) for p in paths]} "
                         f"{'is a trunk' if not trunks else 'are trunks'}.")
    pretrained = load_trunk(trunks[0])
    fingerprint, origin = trunk_fingerprint(pretrained.trunk_weights), {name: trunks[0] for name in pretrained.heads}
    for path in task_dirs:
        task, head, trained_on, target = read_task(path)
        if trained_on != fingerprint:
            raise ValueError(
                f"The task directory '{path}' (task '{task}') was trained on another trunk than '{trunks[0]}' (its "
                f"weights' fingerprint {trained_on[:12]}… is not this trunk's {fingerprint[:12]}…). Load it with the "
                "trunk it was trained on (the run's model.init_from)."
            )
        if task in origin:
            raise ValueError(
                f"Two heads are named '{task}': in '{origin[task]}' and in '{path}'. Keep one (export a trunk without "
                "heads with `trunk export CKPT DIR --trunk-only`)."
            )
        origin[task] = path
        pretrained.heads[task] = {**head, "source": path}
        if target is not None:
            pretrained.codec.targets[task] = target
    return pretrained
