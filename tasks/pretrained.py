"""The pretrained-trunk directory: what pretraining hands to every fine-tuning run.

    <dir>/config.json        {"format": "trunk", "format_version": 1, "trunk": {TrunkConfig}, ...}
    <dir>/model.safetensors  the trunk's weights as "trunk.*" (and optionally a head's as "head.*")
    <dir>/tokenizer.json     the tokenizer the weights were trained with

Written at the end of pretraining (``ExportTrunk``) or from any Lightning checkpoint
(``trunk export CKPT DIR``); read by ``model.init_from`` with checks that name both sides of any
mismatch.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from trunk.datamodules.tokenizer import load_tokenizer, tokenizer_from_checkpoint
from trunk.models import TrunkConfig

FORMAT_NAME, FORMAT_VERSION = "trunk", 1
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"
# The fields that fix the shapes and the computation; dropout and init_std may differ per run.
ARCHITECTURE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len", "positions", "norm",
                       "activation", "layer_norm_eps")


@dataclass
class PretrainedTrunk:
    path: Path
    config: TrunkConfig
    trunk_weights: dict[str, torch.Tensor]  # keys as in ``Trunk.state_dict()``
    head_weights: dict[str, torch.Tensor]  # keys as in the exporting task's ``head.state_dict()``
    tokenizer: Tokenizer
    meta: dict


def check_writable(directory: Path, overwrite: bool) -> None:
    """Refuse to replace anything but a Trunk directory, and that only with ``overwrite``: a directory
    is replaced whole, so whatever else it held would be lost."""
    if not directory.exists() and not directory.is_symlink():
        return
    if not directory.is_dir():
        raise FileExistsError(f"'{directory}' exists and is not a directory. Choose another output path.")
    contents = sorted(p.name for p in directory.iterdir())
    foreign = [name for name in contents if name not in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)]
    if foreign:
        raise FileExistsError(
            f"'{directory}' exists and holds files that are not part of a trunk directory ({foreign[:5]}). Trunk never "
            "deletes them: choose a new or empty directory."
        )
    if contents and not overwrite:
        raise FileExistsError(f"'{directory}' already holds a trunk. Pass --overwrite to replace it, or choose another directory.")


def save_pretrained(directory: str | Path, config: TrunkConfig, trunk_weights: dict[str, torch.Tensor],
                    tokenizer: Tokenizer, head_weights: dict[str, torch.Tensor] | None = None, task: str | None = None,
                    overwrite: bool = False) -> Path:
    """Write a trunk's weights (and optionally its task head's) to ``directory``, atomically.

    An existing trunk directory is replaced only with ``overwrite``; any other existing content is an error."""
    directory = Path(directory)
    check_writable(directory, overwrite)
    check_weights(config, trunk_weights, directory)
    if tokenizer.get_vocab_size() != config.vocab_size:
        raise ValueError(f"The tokenizer has {tokenizer.get_vocab_size()} tokens but the trunk's vocab_size is {config.vocab_size}.")
    tensors = {f"trunk.{k}": v for k, v in trunk_weights.items()}
    tensors.update({f"head.{k}": v for k, v in (head_weights or {}).items()})
    tensors, tied = _untie(tensors)
    meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "trunk": config.to_dict(),
            "task": task, "has_head": bool(head_weights), "tied": tied}
    tmp = directory.parent / f".{directory.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / WEIGHTS_FILE),
              metadata={"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION)})
    tokenizer.save(str(tmp / TOKENIZER_FILE))
    # Swap whole directories, so a reader never sees a half-written trunk and a crash keeps the old one.
    old = directory.parent / f".{directory.name}.old{os.getpid()}"
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def _untie(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """safetensors refuses shared storage: keep the first name of each tied tensor, record the rest."""
    kept, tied, seen = {}, {}, {}
    for name, tensor in tensors.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            tied[name] = seen[key]
        else:
            seen[key] = name
            kept[name] = tensor
    return kept, tied


def read_config(directory: str | Path) -> tuple[TrunkConfig, dict]:
    """The architecture of a trunk directory, after checking that all its files are there."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"No pretrained trunk directory at '{directory}'. Pretraining writes one (see configs/pretrain.yaml), "
            "and `trunk export CKPT DIR` makes one from any checkpoint."
        )
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE) if not (directory / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"Trunk directory '{directory}' is missing {missing}; a complete one holds {CONFIG_FILE}, "
            f"{WEIGHTS_FILE} and {TOKENIZER_FILE}. Re-export it with `trunk export CKPT {directory}`."
        )
    try:
        meta = json.loads((directory / CONFIG_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"'{directory / CONFIG_FILE}' is not valid JSON ({err}). Re-export the trunk.") from err
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME or "trunk" not in meta:
        raise ValueError(f"'{directory / CONFIG_FILE}' is not a Trunk config (no \"format\": \"trunk\").")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"Trunk directory '{directory}' has format version {meta['format_version']}, newer than this Trunk "
            f"reads ({FORMAT_VERSION}). Upgrade Trunk."
        )
    known = {f.name for f in fields(TrunkConfig)}
    return TrunkConfig(**{k: v for k, v in meta["trunk"].items() if k in known}), meta


def load_pretrained(directory: str | Path) -> PretrainedTrunk:
    """Read and check a trunk directory: files present, weights readable and shaped as configured,
    tokenizer vocabulary equal to the embedding table."""
    directory = Path(directory)
    config, meta = read_config(directory)
    weights_path = directory / WEIGHTS_FILE
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"'{weights_path}' is corrupted or not a safetensors file ({err}). Re-export the trunk.") from err
    for name, source in meta.get("tied", {}).items():
        tensors[name] = tensors[source]
    trunk_weights, head_weights = _strip(tensors, "trunk."), _strip(tensors, "head.")
    check_weights(config, trunk_weights, weights_path)
    tokenizer = load_tokenizer(directory / TOKENIZER_FILE)
    if tokenizer.get_vocab_size() != config.vocab_size:
        raise ValueError(
            f"Trunk directory '{directory}': {TOKENIZER_FILE} has {tokenizer.get_vocab_size()} tokens but the weights "
            f"were trained with vocab_size={config.vocab_size}. The tokenizer does not belong to these weights: "
            "re-export the trunk from its checkpoint."
        )
    return PretrainedTrunk(directory, config, trunk_weights, head_weights, tokenizer, meta)


def check_weights(config: TrunkConfig, weights: dict[str, torch.Tensor], source: Path) -> None:
    """Same names and shapes as a trunk built from ``config``, or an error listing the differences."""
    from trunk.tasks.base import build_text_trunk  # tasks.base imports this module's users, not the reverse

    with torch.device("meta"):  # shapes only, no memory, no init
        expected = {k: v.shape for k, v in build_text_trunk(config).state_dict().items()}
    missing = sorted(expected.keys() - weights.keys())
    unexpected = sorted(weights.keys() - expected.keys())
    wrong = [f"{k}: file {tuple(weights[k].shape)} vs config {tuple(expected[k])}"
             for k in expected.keys() & weights.keys() if weights[k].shape != expected[k]]
    if missing or unexpected or wrong:
        raise ValueError(
            f"'{source}' does not match its {CONFIG_FILE}: missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"wrong shapes {wrong[:5]}. Re-export the trunk."
        )


def check_architecture(wanted: TrunkConfig, pretrained: TrunkConfig, path: str | Path, names=ARCHITECTURE_FIELDS) -> None:
    """Fail, naming both sides, when the configured trunk cannot take the pretrained weights."""
    diffs = [f"{name}: model.trunk.{name}={getattr(wanted, name)!r} but '{path}' has {getattr(pretrained, name)!r}"
             for name in names if getattr(wanted, name) != getattr(pretrained, name)]
    if diffs:
        raise ValueError(
            "The configured trunk does not match the pretrained one:\n  " + "\n  ".join(diffs)
            + "\nRemove these model.trunk options (the pretrained values are used) or set them to the pretrained values."
        )


def load_checkpoint(ckpt_path: str | Path) -> dict:
    """A Lightning checkpoint's contents, unpickled with ``weights_only=True``: tensors and plain values
    only, so a crafted file cannot run code."""
    ckpt_path = Path(ckpt_path)
    if not ckpt_path.is_file():
        raise FileNotFoundError(f"Checkpoint '{ckpt_path}' does not exist. Pass a .ckpt written by `trunk fit`.")
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
    except (RuntimeError, EOFError, OSError) as err:
        raise ValueError(f"'{ckpt_path}' is not a readable checkpoint (truncated or corrupted?): {err}") from None
    if not isinstance(ckpt, dict):
        raise ValueError(f"'{ckpt_path}' is not a Lightning checkpoint (it holds a {type(ckpt).__name__}).")
    return ckpt


def export_checkpoint(ckpt_path: str | Path, directory: str | Path, with_head: bool = False, overwrite: bool = False) -> Path:
    """Write a trunk directory from a Lightning checkpoint written by any Trunk task."""
    ckpt_path, directory = Path(ckpt_path), Path(directory)
    if directory.resolve() in ckpt_path.resolve().parents:
        raise ValueError(f"The checkpoint '{ckpt_path}' is inside the output directory '{directory}', which export "
                         "replaces. Write the trunk to another directory.")
    ckpt = load_checkpoint(ckpt_path)
    hparams = ckpt.get("hyper_parameters", {})
    trunk_hparams = hparams.get("trunk")
    if trunk_hparams is None or "state_dict" not in ckpt:
        raise ValueError(f"'{ckpt_path}' was not written by a Trunk task: it has no trunk hyperparameters.")
    config = trunk_hparams if isinstance(trunk_hparams, TrunkConfig) else TrunkConfig(**dict(trunk_hparams))
    state = ckpt["state_dict"]
    return save_pretrained(directory, config, _strip(state, "trunk."), tokenizer_from_checkpoint(ckpt_path, ckpt),
                           _strip(state, "head.") if with_head else None, hparams.get("_class_path"), overwrite)


def _strip(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
