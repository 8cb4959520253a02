"""Weights into a built model: a pretrained trunk (a trunk directory or checkpoint, with task directories) and the
heads it stores, matched to the run's tasks by name, kind and labels. What ``model.init_from`` does in a run."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from trunk.formats.hf import is_hf_folder, model_values
from trunk.formats.task_dir import read_trunk
from trunk.formats.trunk_dir import (
    TEXT_STEM_FIELDS,
    PretrainedTrunk,
    architecture_fields,
    check_architecture,
    pretrained_trunk_config,
)
from trunk.models import SequenceClassificationHead, TrunkConfig, init_weights
from trunk.models.deltas import DeltaConfig
from trunk.models.positions import resize_grid
from trunk.tasks.objectives.base import Objective
from trunk.tasks.registry import stems_of
from trunk.training.module import TrunkModule


@dataclass
class HeadReuse:
    """How stored heads start the run's tasks (the ``model.*`` options of the same names).

    Args:
        reinit_mismatched_heads: a stored head whose labels differ from the data's keeps its body and gets a fresh
            classifier (else: an error naming both label sets).
        heads_from: {new task: stored head} for tasks that start from a head of another name.
        label_map: task -> {its label: the stored one}, for label names that differ (``Objective.load_head``).
        keep_shared_labels: a stored head whose labels differ keeps the rows of the labels in both.
    """

    reinit_mismatched_heads: bool = False
    heads_from: dict[str, str] | None = None
    label_map: dict[str, dict[str, str]] | None = None
    keep_shared_labels: bool = False


def from_pretrained(
    source: str | Path | PretrainedTrunk,
    tasks: dict[str, Objective],
    *,
    reuse: HeadReuse | None = None,
    trunk: TrunkConfig | dict | None = None,
    **options,
) -> TrunkModule:
    """A model whose trunk, and each task's head where ``source`` stores one of the same name and kind (labels matched
    by name), start from a trunk directory or a checkpoint. Fields of ``trunk`` left at their defaults take the
    pretrained values; ``options``: the rest of ``TrunkModule``'s arguments."""
    pretrained = source if isinstance(source, PretrainedTrunk) else read_trunk(source)
    codec = options.pop("codec", None) or pretrained.codec
    vocab_size = codec.tokenizer.get_vocab_size() if codec.tokenizer is not None else pretrained.config.vocab_size
    model = TrunkModule(
        tasks, trunk=pretrained_trunk_config(trunk, pretrained.config, vocab_size), codec=codec, **options
    )
    load_weights(model, pretrained, reuse)
    return model


INPUTS = {"text": "text", "image": "images"}  # a stem's kind, as a model's inputs are named in messages


def load_weights(model: TrunkModule, pretrained: PretrainedTrunk, reuse: HeadReuse | None = None) -> list[str]:
    """Start ``model`` from a pretrained trunk (and its heads), after checking that the architectures match. Stems the
    directory lacks stay fresh (a ViT from a text trunk gets a new patch stem). Each task takes the stored head of its
    own name, or of the name ``reuse.heads_from`` gives it. Returns what was carried over, in words."""
    reuse = reuse or HeadReuse()
    heads_from, label_map, objectives = reuse.heads_from or {}, reuse.label_map or {}, model.objectives
    for option, names in (("heads_from", heads_from), ("label_map", label_map)):
        unknown = sorted(set(names) - set(objectives))
        if unknown:
            raise ValueError(
                f"model.{option} names the tasks {unknown}, but this run's tasks are {sorted(objectives)}."
            )
    for task, stored in heads_from.items():
        if stored not in pretrained.heads:
            raise ValueError(
                f"model.heads_from: task '{task}' should start from the head '{stored}', but '{pretrained.path}' "
                f"stores the heads {sorted(pretrained.heads)}."
            )
        if pretrained.heads[stored]["meta"]["kind"] != objectives[task].kind:
            raise ValueError(
                f"model.heads_from: the head '{stored}' in '{pretrained.path}' is a "
                f"{pretrained.heads[stored]['meta']['kind']} head; task '{task}' is {objectives[task].kind}."
            )
    trunk = model.trunk
    shared = [kind for kind in trunk.stems if kind in pretrained.stems]
    if not shared and is_hf_folder(pretrained.path):  # Trunk's own trunks lend their blocks across modalities
        model_type = model_values(Path(pretrained.path)).get("model_type")
        reads = lambda stems: " and ".join(INPUTS.get(kind, kind) for kind in sorted(stems))  # noqa: E731
        raise ValueError(
            f"'{pretrained.path}' is a {model_type} model that reads {reads(pretrained.stems)}, and this run's tasks "
            f"read {reads(trunk.stems)}: nothing it learnt about its inputs would be used. Start these tasks from a "
            f"model that reads {reads(trunk.stems)}, or give this one tasks on {reads(pretrained.stems)}."
        )
    names = [n for n in architecture_fields(pretrained.config) if "text" in shared or n not in TEXT_STEM_FIELDS]
    check_architecture(model.trunk_config, pretrained.config, pretrained.path, names)
    state = {
        k: v for k, v in pretrained.trunk_weights.items() if k.startswith("backbone.") or k.split(".")[1] in shared
    }
    notes = []
    if "image" in shared and pretrained.stems["image"] != stems_of(dict(objectives))["image"]:
        notes.append(_resize_image_stem(state, pretrained, stems_of(dict(objectives))["image"]))
    missing, unexpected = trunk.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    # only a stem the pretrained trunk has not may start fresh: a block left at its init would be silently untrained
    fresh_blocks = [k for k in missing if k.startswith("backbone.")]
    if fresh_blocks:
        raise ValueError(f"'{pretrained.path}' has no weights for {fresh_blocks[:4]} of this run's trunk: its "
                         "architecture differs in a way the run's config does not say. Leave model.trunk's shape "
                         "fields to the pretrained trunk.")
    if model.finetune.reinit_top:
        blocks = trunk.backbone.blocks
        if model.finetune.reinit_top > len(blocks):
            raise ValueError(
                f"finetune.reinit_top={model.finetune.reinit_top} exceeds the trunk's {len(blocks)} blocks."
            )
        for block in blocks[len(blocks) - model.finetune.reinit_top:]:
            init_weights(block, model.trunk_config.init_std, n_layers=len(blocks))
        notes.append(f"the top {model.finetune.reinit_top} of {len(blocks)} blocks start afresh (finetune.reinit_top)")
    for name, objective in objectives.items():
        stored = heads_from.get(name, name)
        head = pretrained.heads.get(stored)
        if head is None or head["meta"]["kind"] != objective.kind:
            pooler = ", its pooler the pretrained one" if _start_pooler(objective, pretrained.pooler) else ""
            notes.append(f"task '{name}': a fresh head{pooler}" + _composed_sources(objective, pretrained))
            continue
        source = head.get("source", pretrained.path)  # a task directory's, or the trunk's
        state, fresh_delta = _with_delta(objective, head, source)
        stored_options = {k: v for k, v in (head["meta"].get("objective") or {}).get("init_args", {}).items()
                          if objective.config.get(k) != v
                          and k not in (*objective.inference_options, *objective.carried_options)}
        try:
            how = objective.load_head(state, head["meta"].get("label_names"), reuse.reinit_mismatched_heads,
                                      str(source), label_map.get(name), reuse.keep_shared_labels)
        except ValueError as err:  # a head of another shape: the stored options that differ say which
            raise ValueError(f"{err} The stored head was built with {stored_options}: give the task these options."
                             if stored_options and "does not fit" in str(err) else str(err)) from None
        taken = objective.adopt((head["meta"].get("objective") or {}).get("init_args", {}))
        if taken:
            model.hparams["tasks"][name] = objective.spec()  # stored with the run's checkpoints
            how = ", ".join([*([how] if how else []), *(f"{k}={v!r} as stored" for k, v in taken.items())])
        origin = f"the head '{stored}' from {source}" if stored != name else f"its head from {source}"
        notes.append(f"task '{name}': {origin}{f' ({how})' if how else ''}{f', {fresh_delta}' if fresh_delta else ''}")
    fresh = sorted(set(trunk.stems) - set(shared))
    if fresh:
        notes.append(f"{pretrained.path} has no {fresh} stem: it starts from a fresh initialisation")
    return notes


def _resize_image_stem(state: dict[str, torch.Tensor], pretrained: PretrainedTrunk, wanted: dict) -> str:
    """A patch stem trained at another image size: its learned position table resized to the run's patch grid (the
    patches and channels must be the same)."""
    stored = pretrained.stems["image"]
    if {k: v for k, v in stored.items() if k != "image_size"} != {k: v for k, v in wanted.items() if k != "image_size"}:
        raise ValueError(f"'{pretrained.path}' has an image stem with {stored}, this run's image tasks need {wanted}: "
                         "the patch size and the channels must be the trunk's (the image size may differ).")
    grid = wanted["image_size"] // wanted["patch_size"]
    if "stems.image.position" in state:
        state["stems.image.position"] = resize_grid(state["stems.image.position"], grid, grid,
                                                    pretrained.config.resize_antialias)
    old = stored["image_size"] // stored["patch_size"]
    return f"its patch positions resized from a {old}x{old} grid to {grid}x{grid} (image_size {wanted['image_size']})"


def _start_pooler(objective: Objective, pooler: dict[str, torch.Tensor]) -> bool:
    """A fresh [CLS]-pooled head starts its pooler (dense + tanh) from a pretrained one, as ``transformers``' task
    models do; a head that pools by attention starts its ``AttentionPool`` from a pretrained one (SigLIP's)."""
    head = getattr(objective, "head", None)
    pool = {k.removeprefix("attention_pool."): v for k, v in pooler.items() if k.startswith("attention_pool.")}
    if isinstance(head, SequenceClassificationHead) and head.attention_pool is not None and pool:
        if head.attention_pool.probe.shape != pool["probe"].shape:
            return False
        head.attention_pool.load_state_dict(pool)
        return True
    pooler = {k: v for k, v in pooler.items() if not k.startswith("attention_pool.")}
    dense = getattr(head, "dense", None) if isinstance(head, SequenceClassificationHead) else None
    if not pooler or dense is None or head.pooling != "cls" or dense.weight.shape != pooler["weight"].shape:
        return False
    dense.load_state_dict(pooler)
    return True


def _composed_sources(objective: Objective, pretrained: PretrainedTrunk) -> str:
    """A fresh task's composed delta: the deltas of the tasks it composes (``peft.compose``), from their stored
    heads."""
    delta = objective.delta
    for task, source in (delta.sources.items() if delta is not None else ()):
        state = {k[len("delta."):]: v for k, v in pretrained.heads[task]["state"].items() if k.startswith("delta.")}
        source.load_state_dict(state)
    return f", composing the deltas of {list(delta.sources)}" if delta is not None and delta.sources else ""


def _with_delta(objective: Objective, head: dict, source: Path) -> tuple[dict, str | None]:
    """A stored head's weights for ``objective``, its delta matched to the run's ``model.peft``: a stored delta needs
    the same options; a task given a delta whose head was trained without one starts its delta fresh."""
    name, stored, delta = objective.name, head["meta"].get("peft"), objective.delta
    if stored and delta is None:
        raise ValueError(
            f"Task '{name}': the head in '{source}' was trained with a {stored['method']} delta on a frozen trunk. "
            f"Give the task that delta to go on with it: --model.peft='{{{name}: {json.dumps(stored)}}}'."
        )
    if delta is None:
        return head["state"], None
    if not stored:
        return {
            **head["state"],
            **{f"delta.{k}": v for k, v in delta.state_dict().items()},
        }, f"a fresh {delta.config.method} delta"
    if not delta.config.fits(DeltaConfig.from_dict(stored)):
        raise ValueError(
            f"Task '{name}': the delta in '{source}' was trained with {stored}, but model.peft.{name} is "
            f"{dataclasses.asdict(delta.config)}. Use the stored options, or another task name for a fresh delta."
        )
    return head["state"], None
