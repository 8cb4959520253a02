"""The pretrained-trunk directory: what one run hands to the next.

    <dir>/config.json        {"format": "trunk", "format_version": 2, "trunk": {TrunkConfig},
                              "stems": {"text": {}, "image": {...}}, "heads": {task: {kind, label_names, objective}}}
    <dir>/model.safetensors  "trunk.*" (stems and backbone), "heads.<task>.*" (each task's head) and, from a model
                             pretrained elsewhere, "pooler.*" (BERT's pooler: it starts every [CLS]-pooled head)
    <dir>/tokenizer.json     the tokenizer the text stem was trained with (when it has one)
    <dir>/target_tokenizer.<task>.json   a translation task's own target vocabulary, if any

Written at the end of pretraining (``ExportTrunk``) or from any checkpoint (``trunk export CKPT
DIR``); read by ``model.init_from``, which also takes a checkpoint (``.ckpt``) directly: a new run
from a fine-tuned model's weights. Format version 1 directories (trunk only, text stem) are read too.
Every check names both sides of a mismatch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from trunk.core.atomic import followed, replace_directory, temporary_path
from trunk.core.checkpoint import check_readable, is_sharded_checkpoint, load_checkpoint
from trunk.core.codec import Codec, load_tokenizer
from trunk.models import POSITIONS, TrunkConfig, build_trunk

FORMAT_NAME, FORMAT_VERSION = "trunk", 2
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"
TARGET_TOKENIZER_FILE = "target_tokenizer.{task}.json"
SETTINGS_DIGEST = "config_sha256"  # in the weights' header: the digest of config.json's settings
# The fields that fix the shapes and the computation; dropout and init_std may differ per run.
ARCHITECTURE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len", "positions", "norm",
                       "activation", "layer_norm_eps", "segments", "embedding_norm", "position_offset",
                       "embedding_size", "rms_norm", "gated_ff", "relative_buckets", "relative_max_distance",
                       "layer_scale", "rope_base", "rope_base_local", "first_block_norm", "scale_embedding",
                       "registers", "resize_antialias", "cls_token", "bias", "shared_blocks")
# how the pretrained trunk attended (ModernBERT's local blocks): taken where a run leaves them at their defaults, but a
# run may choose otherwise (local attention on a trunk pretrained without it, for long inputs)
ATTENTION_FIELDS = ("local_window", "global_tokens", "global_every")
# what only the text stem depends on
TEXT_STEM_FIELDS = ("vocab_size", "max_len", "segments", "position_offset", "embedding_size")


def architecture_fields(pretrained: TrunkConfig) -> tuple[str, ...]:
    """The fields a run must share with these trained weights. ``max_len`` sizes a learned position table only: a trunk
    with rotary, ALiBi, T5 or sinusoidal positions reads other lengths with the same weights (how well beyond its
    training length is the extrapolation question; local attention keeps every query-key distance within it)."""
    fixed = POSITIONS[pretrained.positions].fixes_max_len
    return ARCHITECTURE_FIELDS if fixed else tuple(f for f in ARCHITECTURE_FIELDS if f != "max_len")


@dataclass
class PretrainedTrunk:
    """A trunk, its heads and its tokenizers, as read from a directory or a checkpoint."""

    path: Path
    config: TrunkConfig
    stems: dict[str, dict]  # stem kind -> its options
    trunk_weights: dict[str, torch.Tensor]  # keys as in ``Trunk.state_dict()``
    # task -> {"meta": {kind, label_names, objective}, "state": {...}}; "source": its task directory, if read from one
    heads: dict[str, dict] = field(default_factory=dict)
    codec: Codec = field(default_factory=Codec)
    pooler: dict[str, torch.Tensor] = field(default_factory=dict)  # a pretrained pooler's dense layer: weight, bias


def select_layers(pretrained: PretrainedTrunk, layers: list[int] | str) -> PretrainedTrunk:
    """A shallower trunk of some of ``pretrained``'s blocks, in the order given, renumbered 0, 1, ... (``model.
    init_layers``): the way a distilled student starts from its teacher (DistilBERT took every other layer).
    ``every_other``: blocks 0, 2, 4, ..."""
    n = pretrained.config.n_layers
    chosen = list(range(0, n, 2)) if layers == "every_other" else list(layers)
    where = f"model.init_layers={layers!r}"
    if isinstance(layers, str) and layers != "every_other" or not chosen or any(
            not isinstance(i, int) or not 0 <= i < n for i in chosen) or len(set(chosen)) != len(chosen):
        raise ValueError(f"{where}: give every_other, or a list of distinct block numbers of the {n} of "
                         f"'{pretrained.path}' (0 to {n - 1}).")
    pattern = [name for name, on in (("shared_blocks", pretrained.config.shared_blocks),
                                     ("local_window", pretrained.config.local_window)) if on]
    if pattern:
        raise ValueError(f"{where}: the blocks of '{pretrained.path}' are not alike at every depth ({pattern[0]}="
                         f"{getattr(pretrained.config, pattern[0])}: which blocks share weights or attend locally "
                         "follows their number), so a subset of them is another model. Leave model.init_layers unset.")
    with_deltas = sorted(name for name, head in pretrained.heads.items() if head["meta"].get("peft"))
    if with_deltas:
        raise ValueError(f"{where}: the heads {with_deltas} of '{pretrained.path}' bring deltas on every one of its "
                         f"{n} blocks. Start from the trunk without their task directories.")
    renumbered = {str(old): str(new) for new, old in enumerate(chosen)}
    block = re.compile(r"^backbone\.blocks\.(\d+)\.")
    weights = {}
    for key, value in pretrained.trunk_weights.items():
        found = block.match(key)
        if found is None:
            weights[key] = value
        elif found.group(1) in renumbered:
            weights[f"backbone.blocks.{renumbered[found.group(1)]}.{key[found.end():]}"] = value
    config = dataclasses.replace(pretrained.config, n_layers=len(chosen))
    return dataclasses.replace(pretrained, config=config, trunk_weights=weights)


def check_writable(directory: Path, overwrite: bool) -> None:
    """Refuse to replace anything but a Trunk directory, and that only with ``overwrite``: a directory
    is replaced whole, so whatever else it held would be lost."""
    if not directory.exists() and not directory.is_symlink():
        return
    if not directory.is_dir():
        raise FileExistsError(f"'{directory}' exists and is not a directory. Choose another output path.")
    contents = sorted(p.name for p in directory.iterdir())
    exported = CONFIG_FILE in contents  # then its model card and ONNX graphs are the export's too, not a user's files
    foreign = [
        name for name in contents if not _is_trunk_file(name) and not (exported and name in ("README.md", "onnx"))
    ]
    if foreign:
        raise FileExistsError(
            f"'{directory}' exists and holds files that are not part of a trunk directory ({foreign[:5]}). Trunk never "
            "deletes them: choose a new or empty directory."
        )
    if contents and not overwrite:
        raise FileExistsError(
            f"'{directory}' already holds a trunk. Pass --overwrite to replace it, or choose another directory."
        )


def _is_trunk_file(name: str) -> bool:
    return name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE) or (
        name.startswith("target_tokenizer.") and name.endswith(".json")
    )


def save_pretrained(directory: str | Path, pretrained: PretrainedTrunk, overwrite: bool = False) -> Path:
    """Write a trunk directory, atomically. An existing trunk directory is replaced only with
    ``overwrite``; any other existing content is an error."""
    directory = Path(directory)
    directory = followed(Path(directory))
    check_writable(directory, overwrite)
    check_weights(pretrained.config, pretrained.stems, pretrained.trunk_weights, directory)
    codec = pretrained.codec
    if "text" in pretrained.stems:
        if codec.tokenizer is None:
            raise ValueError("A trunk with a text stem needs its tokenizer.")
        if codec.tokenizer.get_vocab_size() != pretrained.config.vocab_size:
            raise ValueError(
                f"The tokenizer has {codec.tokenizer.get_vocab_size()} tokens but the trunk's vocab_size is "
                f"{pretrained.config.vocab_size}."
            )
    tensors = {f"trunk.{k}": v for k, v in pretrained.trunk_weights.items()}
    for task, head in pretrained.heads.items():
        tensors.update({f"heads.{task}.{k}": v for k, v in head["state"].items()})
    tensors.update({f"pooler.{k}": v for k, v in pretrained.pooler.items()})
    tensors, tied = _untie(tensors)
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "trunk": pretrained.config.to_dict(),
        "stems": pretrained.stems,
        "heads": {task: head["meta"] for task, head in pretrained.heads.items()},
        "tied": tied,
    }
    tmp = temporary_path(directory)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if codec.tokenizer is not None and "text" in pretrained.stems:
        codec.tokenizer.save(str(tmp / TOKENIZER_FILE))
    for task, tokenizer in codec.targets.items():
        if task in pretrained.heads:
            tokenizer.save(str(tmp / TARGET_TOKENIZER_FILE.format(task=task)))
    write_weights_and_config(tmp, tensors, meta)
    replace_directory(tmp, directory)  # a reader never sees a half-written trunk; a crash keeps the old one
    return directory


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def settings_digest(meta: dict) -> str:
    """sha256 of config.json's settings (all but the files' checksums) as JSON reads them back."""
    settings = json.loads(json.dumps({k: v for k, v in meta.items() if k != "sha256"}))
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def write_weights_and_config(tmp: Path, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """The weights, whose header holds the digest of config.json's settings, then config.json with the checksum of
    every file in ``tmp``: one changed byte in a weight, a label name or an option is refused on reading
    (``verify_files``)."""
    header = {"format": meta["format"], "format_version": str(meta["format_version"]),
              SETTINGS_DIGEST: settings_digest(meta)}
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / WEIGHTS_FILE), metadata=header)
    meta["sha256"] = {p.name: file_sha256(p) for p in sorted(tmp.iterdir())}
    (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def verify_files(directory: Path, meta: dict) -> None:
    """Every file config.json lists must have the checksum written with it, and config.json's settings the digest
    written into the weights' header (directories written before it have none)."""
    for name, digest in (meta.get("sha256") or {}).items():
        if (directory / name).is_file() and file_sha256(directory / name) != digest:
            raise ValueError(
                f"'{directory / name}' does not match the checksum in {directory / CONFIG_FILE}: the file was "
                "corrupted (a damaged disk, an incomplete copy) or replaced. Copy or export the trunk again."
            )
    try:
        with safe_open(str(directory / WEIGHTS_FILE), "pt") as weights:
            stored = (weights.metadata() or {}).get(SETTINGS_DIGEST)
    except (SafetensorError, OSError):
        return  # the reader of the weights says what is wrong with them
    if stored is not None and stored != settings_digest(meta):
        raise ValueError(
            f"'{directory / CONFIG_FILE}' changed after it was written: its settings (label names, data options, "
            f"architecture) do not match the digest stored with the weights in {WEIGHTS_FILE}. Restore the file as "
            "Trunk wrote it, or export the directory again."
        )


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


def read_config(path: str | Path) -> tuple[TrunkConfig, dict]:
    """The architecture (and the rest of config.json) of a trunk directory or a checkpoint, after
    checking that the files are there."""
    path = Path(path)
    if path.is_file() or is_sharded_checkpoint(path):
        ckpt = load_checkpoint(path)
        return _checkpoint_config(ckpt, path), _checkpoint_meta(ckpt, path)
    if not path.is_dir():
        # runs/<recipe>/trunk is what `trunk fit --config configs/<recipe>.yaml` writes when it pretrains
        recipe = Path("configs", f"{path.parent.name}.yaml") if path.name == "trunk" else None
        first = (f" It is written by `trunk fit --config {recipe}` (a pretraining run): run that first."
                 if recipe is not None and recipe.is_file() else "")
        raise FileNotFoundError(
            f"No pretrained trunk directory or checkpoint at '{path}'.{first} Pretraining writes a directory (see "
            "configs/pretrain.yaml), `trunk export CKPT DIR` makes one from any checkpoint, and a .ckpt works too."
        )
    if not (path / CONFIG_FILE).is_file():  # not an incomplete export: a folder of something else, or a wrong one
        held = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
        raise FileNotFoundError(
            f"'{path}' is neither a Trunk directory nor a Hugging Face model folder: it has no {CONFIG_FILE} (it holds "
            f"{held[:8] + ['...'] if len(held) > 8 else held or 'nothing'}). model.init_from takes a Trunk directory "
            f"(`trunk export CKPT DIR` writes one), a .ckpt, a transformers model's folder (its {CONFIG_FILE} names "
            "its model_type), a sentence-transformers model's, or hf://ORG/NAME."
        )
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"Trunk directory '{path}' is missing {missing}; a complete one holds {CONFIG_FILE}, "
            f"{WEIGHTS_FILE} and (with a text stem) {TOKENIZER_FILE}. Re-export it with `trunk export CKPT {path}`."
        )
    check_readable(*(path / name for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)))
    try:
        meta = json.loads((path / CONFIG_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"'{path / CONFIG_FILE}' is not valid JSON ({err}). Re-export the trunk.") from err
    if isinstance(meta, dict) and meta.get("format") == "trunk-task":
        raise ValueError(
            f"'{path}' is a task directory (task '{meta.get('task')}'), without a trunk: give it with the trunk it was "
            f"trained on, as [TRUNK_DIR, '{path}']."
        )
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME or "trunk" not in meta:
        raise ValueError(f"'{path / CONFIG_FILE}' is not a Trunk config (no \"format\": \"trunk\").")
    version = meta.get("format_version", 0)
    if version > FORMAT_VERSION:
        raise ValueError(f"Trunk directory '{path}' has format version {version}, newer than this Trunk reads "
                         f"({FORMAT_VERSION}). Upgrade Trunk.")
    if version < 2:  # version 1: a text trunk, weights named stem.*, one unnamed head without label names
        meta = {**meta, "stems": {"text": {}}, "heads": {}, "v1_head": bool(meta.get("has_head"))}
    if "text" in meta["stems"] and not (path / TOKENIZER_FILE).is_file():
        raise FileNotFoundError(f"Trunk directory '{path}' has a text stem but no {TOKENIZER_FILE}. Re-export it with "
                                f"`trunk export CKPT {path}`.")
    return trunk_config(meta["trunk"]), meta


def trunk_config(values: dict | TrunkConfig) -> TrunkConfig:
    return values if isinstance(values, TrunkConfig) else TrunkConfig.from_dict(dict(values))


def pretrained_trunk_config(
    configured: TrunkConfig | dict | None, pretrained: TrunkConfig, vocab_size: int, source: str | Path = "the weights"
) -> TrunkConfig:
    """The pretrained architecture for every field left at its default; fields set to other values stay,
    for ``check_architecture`` to refuse naming both sides. ``vocab_size``: the run's tokenizer's. ``max_len`` of a
    trunk without a learned position table: the longer of the run's and the trained one."""
    defaults = TrunkConfig().to_dict()
    given = (
        {}
        if configured is None
        else (configured.to_dict() if isinstance(configured, TrunkConfig) else dict(configured))
    )
    # what TrunkConfig fills in from other fields when built (a recipe's d_model sizes its embeddings): not chosen
    filled_in = {"embedding_size": given.get("d_model"), "embedding_norm": given.get("norm") == "post"}
    given.update({name: None for name, value in filled_in.items() if name in given and given[name] == value})
    values = {**defaults, **given}
    for name in ARCHITECTURE_FIELDS:
        if name == "max_len" and name not in architecture_fields(pretrained):
            # no position table to size: the longer of the run's max_len (its default included) and the trained one, so
            # an explicit max_len equal to the default is not mistaken for an unset one
            values[name] = max(values[name] or defaults[name], pretrained.max_len)
        # None: unset (TrunkConfig's shape fields)
        elif name != "vocab_size" and values[name] in (None, defaults[name]):
            values[name] = getattr(pretrained, name)
    for name in ATTENTION_FIELDS:
        if name not in given or given[name] == defaults[name]:
            values[name] = getattr(pretrained, name)
    values["vocab_size"] = vocab_size
    try:
        return trunk_config(values)
    except ValueError:  # the run's shape mixed with the weights' does not hold together (a recipe's d_model, 12 heads)
        names = [name for name in architecture_fields(pretrained) if name != "vocab_size"]
        check_architecture(values, pretrained, source, names)
        raise


def check_architecture(wanted: TrunkConfig | dict, pretrained: TrunkConfig, path: str | Path, names=None) -> None:
    """Fail, naming both sides, when the configured trunk (or its values) cannot take the pretrained weights."""
    names = architecture_fields(pretrained) if names is None else names
    values = wanted if isinstance(wanted, dict) else wanted.to_dict()
    differing = [name for name in names if values[name] != getattr(pretrained, name)]
    diffs = [f"{name}: model.trunk.{name}={values[name]!r} but '{path}' has {getattr(pretrained, name)!r}"
             for name in differing]
    if diffs:
        ours = " ".join(f"--model.trunk.{name}={getattr(pretrained, name)}" for name in differing)
        raise ValueError(
            "The configured trunk does not match the pretrained one:\n  "
            + "\n  ".join(diffs)
            + "\nRemove these model.trunk options (the pretrained values are used) or set them to the pretrained "
              f"values. A recipe written to train from scratch sets them: take one written for pretrained weights "
              f"(configs/minilm_*.yaml), or give the pretrained values on the command line: {ours}."
        )


def load_pretrained(path: str | Path) -> PretrainedTrunk:
    """Read and check a trunk directory or a checkpoint: files present, weights readable and shaped
    as configured, tokenizer vocabulary equal to the embedding table."""
    path = Path(path)
    if (
        path.is_file()
        and path.name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)
        and (path.parent / CONFIG_FILE).is_file()
    ):
        raise ValueError(f"'{path}' is one file of the trunk directory '{path.parent}': give the directory itself "
                         f"(model.init_from={path.parent}).")
    if path.is_file() or is_sharded_checkpoint(path):
        return _pretrained_from_checkpoint(path)
    config, meta = read_config(path)
    verify_files(path, meta)
    weights_path = path / WEIGHTS_FILE
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(
            f"'{weights_path}' is corrupted or not a safetensors file ({err}). Re-export the trunk."
        ) from err
    for name, source in meta.get("tied", {}).items():
        tensors[name] = tensors[source]
    if meta["format_version"] < 2:
        tensors = {
            ("trunk.stems.text." + k[len("trunk.stem.") :] if k.startswith("trunk.stem.") else k): v
            for k, v in tensors.items()
        }
        if meta.get("v1_head"):
            from lightning.pytorch.utilities import rank_zero_warn  # here: reading a trunk needs no Lightning

            rank_zero_warn(
                f"'{path}' is a format-1 trunk directory: its head has no task name or label names and is not reused. "
                "Re-export the checkpoint to carry heads over."
            )
    trunk_weights = _strip(tensors, "trunk.")
    check_weights(config, meta["stems"], trunk_weights, weights_path)
    heads = {
        task: {"meta": head_meta, "state": _strip(tensors, f"heads.{task}.")}
        for task, head_meta in meta["heads"].items()
    }
    codec = Codec(load_tokenizer(path / TOKENIZER_FILE) if "text" in meta["stems"] else None)
    for task in heads:
        target = path / TARGET_TOKENIZER_FILE.format(task=task)
        if target.is_file():
            codec.targets[task] = load_tokenizer(target)
    if codec.tokenizer is not None and codec.tokenizer.get_vocab_size() != config.vocab_size:
        raise ValueError(
            f"Trunk directory '{path}': {TOKENIZER_FILE} has {codec.tokenizer.get_vocab_size()} tokens but the weights "
            f"were trained with vocab_size={config.vocab_size}. The tokenizer does not belong to these weights: "
            "re-export the trunk from its checkpoint."
        )
    return PretrainedTrunk(path, config, meta["stems"], trunk_weights, heads, codec, _strip(tensors, "pooler."))


def check_weights(config: TrunkConfig, stems: dict[str, dict], weights: dict[str, torch.Tensor], source: Path) -> None:
    """Same names and shapes as a trunk built from ``config`` and ``stems``, or an error listing the differences."""
    with torch.device("meta"):  # shapes only, no memory, no init
        expected = {k: v.shape for k, v in build_trunk(config, stems).state_dict().items()}
    missing = sorted(expected.keys() - weights.keys())
    unexpected = sorted(weights.keys() - expected.keys())
    wrong = [f"{k}: file {tuple(weights[k].shape)} vs config {tuple(expected[k])}"
             for k in expected.keys() & weights.keys() if weights[k].shape != expected[k]]
    if missing or unexpected or wrong:
        raise ValueError(
            f"'{source}' does not match its {CONFIG_FILE}: missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"wrong shapes {wrong[:5]}. Re-export the trunk."
        )
    bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad and not os.environ.get("TRUNK_ALLOW_NON_FINITE"):
        raise ValueError(
            f"'{source}' has NaN or infinite values in {bad[:5]}: the run that wrote it diverged. Use an earlier "
            "checkpoint (or, to inspect these weights anyway, set TRUNK_ALLOW_NON_FINITE=1)."
        )


# -- checkpoints ---------------------------------------------------------------------------------------
def _checkpoint_meta(ckpt: dict, path: Path) -> dict:
    meta = ckpt.get("trunk_meta")
    if meta is None or "state_dict" not in ckpt:
        raise ValueError(f"'{path}' was not written by a Trunk run of this version (it has no trunk_meta): "
                         "an older checkpoint, or not Trunk's.")
    return meta


def _checkpoint_config(ckpt: dict, path: Path) -> TrunkConfig:
    _checkpoint_meta(ckpt, path)
    return trunk_config(ckpt.get("hyper_parameters", {}).get("trunk", {}))


def _pretrained_from_checkpoint(path: Path, ckpt: dict | None = None) -> PretrainedTrunk:
    from trunk.tasks.objectives.base import is_metric_state  # the task kinds load torchmetrics' (seconds): not
    # on importing this module, so `trunk export` and `trunk import` answer a bad option at once

    ckpt = load_checkpoint(path) if ckpt is None else ckpt
    meta, config = _checkpoint_meta(ckpt, path), _checkpoint_config(ckpt, path)
    state = ckpt["state_dict"]
    trunk_weights = _strip(state, "trunk.")
    check_weights(config, meta["stems"], trunk_weights, path)
    heads = {task: {"meta": head_meta, "state": {k: v for k, v in _strip(state, f"objectives.{task}.").items()
                                                 if not is_metric_state(k)}}
             for task, head_meta in meta["heads"].items()}
    pretrained = PretrainedTrunk(
        path, config, meta["stems"], trunk_weights, heads, Codec.from_state(ckpt.get("codec", {}))
    )
    attach_data(
        pretrained,
        (ckpt.get("datamodule_hyper_parameters") or {}).get("data_tasks") or {},
        ckpt.get("MultiTaskData", {}),
    )
    return pretrained


SPLITS = ("train", "validation", "test", "predict")


def without_splits(spec: dict) -> dict:
    """A task's data options without its split paths: how it turns raw inputs into batches, not where it read them."""
    return {
        "class_path": spec["class_path"],
        "init_args": {k: v for k, v in (spec.get("init_args") or {}).items() if k not in SPLITS},
    }


def attach_data(pretrained: PretrainedTrunk, specs: dict, states: dict) -> None:
    """Store with each head how its task's data turns raw inputs into batches (class, options without
    the split paths, and state such as image normalisation), so ``trunk.tasks.load`` can predict from
    the directory alone."""
    for task, head in pretrained.heads.items():
        spec = specs.get(task)
        if spec:
            head["meta"]["data"] = without_splits(spec)
            head["meta"]["data_state"] = states.get(task, {})


def export_checkpoint(ckpt_path: str | Path, directory: str | Path, heads: bool = True, overwrite: bool = False,
                      repo_id: str | None = None) -> Path:
    """Write a trunk directory from a checkpoint written by ``trunk fit``: the trunk, and (``heads``) every task's head,
    with a model card (README.md; ``repo_id``: the Hub repository it is for, which its loading examples name)."""
    ckpt_path, directory = Path(ckpt_path), Path(directory)
    if directory.resolve() in ckpt_path.resolve().parents:
        raise ValueError(f"The checkpoint '{ckpt_path}' is inside the output directory '{directory}', which export "
                         "replaces. Write the trunk to another directory.")
    ckpt = load_checkpoint(ckpt_path)
    pretrained = _pretrained_from_checkpoint(ckpt_path, ckpt)
    specs = (ckpt.get("datamodule_hyper_parameters") or {}).get("data_tasks") or {}
    if not heads:
        pretrained.heads = {}
    save_pretrained(directory, pretrained, overwrite)
    from trunk.formats.hub import write_model_card

    write_model_card(directory, checkpoint_metrics(ckpt), repo_id, specs)
    return directory


def checkpoint_metrics(ckpt: dict) -> dict:
    """What a checkpoint says of its training: the step, the epoch and each checkpoint callback's best monitored
    score."""
    metrics = {"global_step": ckpt.get("global_step"), "epoch": ckpt.get("epoch")}
    for state in (ckpt.get("callbacks") or {}).values():
        if isinstance(state, dict) and state.get("monitor") and state.get("best_model_score") is not None:
            metrics[f"best {state['monitor']}"] = float(state["best_model_score"])
    return {k: v for k, v in metrics.items() if v is not None}


def _strip(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

