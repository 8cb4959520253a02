"""Models fine-tuned separately from one pretrained trunk, combined into one model with every task's head, without
training (``trunk export A.ckpt B.ckpt DIR --merge ties --base PRETRAINED``).

Each model's change to the trunk is its *task vector*, its weights minus the base's (Ilharco et al., 2023, "Editing
models with task arithmetic"). ``task_arithmetic`` adds ``scale`` times their sum to the base (``scale`` 1/n: the
average of the models). ``ties`` (Yadav et al., 2023, "TIES-merging") first keeps each task vector's ``density``
largest entries per tensor, then elects each entry's sign by the sum of what is kept, and averages only the kept
values that agree with it, so two tasks' small, opposite changes do not cancel a third's real one; the result is
added at ``scale`` (1 by default). Heads are taken as they are, one per task; the trunk gets the merged weights.
``deltas`` combines models trained as deltas (``model.peft``: LoRA, DoRA, adapters), or heads alone, on the frozen
base: nothing is averaged, each task keeps its own delta beside the others on the base's trunk, so the model answers
every task exactly as its separate model did (what a merge of full fine-tunes cannot promise).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from trunk.core.codec import Codec
from trunk.formats.trunk_dir import PretrainedTrunk, architecture_fields

MERGE_METHODS = ("task_arithmetic", "ties", "deltas")


def ties_merge(vectors: list[torch.Tensor], density: float) -> torch.Tensor:
    """TIES' trim, elect and disjoint mean of one tensor's task vectors."""
    stacked = torch.stack([v.float() for v in vectors])
    keep = max(1, round(density * stacked[0].numel()))
    flat = stacked.reshape(len(vectors), -1)
    size = flat.abs()
    # each vector's ``keep`` largest magnitudes (ties at the threshold kept)
    threshold = size.kthvalue(flat.shape[1] - keep + 1, dim=1, keepdim=True).values
    trimmed = torch.where(size >= threshold, flat, torch.zeros_like(flat))
    sign = torch.sign(trimmed.sum(dim=0))
    agree = (torch.sign(trimmed) == sign) & (trimmed != 0)
    total = (trimmed * agree).sum(dim=0)
    count = agree.sum(dim=0).clamp(min=1)
    return (total / count).reshape(stacked.shape[1:])


def check_mergeable(base: PretrainedTrunk, models: list[PretrainedTrunk], method: str) -> None:
    """Every model from the base's trunk (architecture, tokenizer, weight names and shapes), no task twice; for
    ``deltas`` the base's trunk unchanged (its tasks deltas or heads alone), for the others no delta (it has no task
    vector)."""
    vocabulary = base.codec.tokenizer.get_vocab() if base.codec.tokenizer is not None else None
    owners: dict[str, PretrainedTrunk] = {}
    for model in models:
        diffs = [f"{name} {getattr(model.config, name)!r} against {getattr(base.config, name)!r}"
                 for name in architecture_fields(base.config)
                 if getattr(model.config, name) != getattr(base.config, name)]
        if diffs or model.trunk_weights.keys() != base.trunk_weights.keys():
            raise ValueError(f"'{model.path}' has another trunk than the base '{base.path}' "
                             f"({'; '.join(diffs) or 'other weights'}): merging needs models fine-tuned from the base.")
        shapes = [k for k, v in model.trunk_weights.items() if v.shape != base.trunk_weights[k].shape]
        if shapes:
            raise ValueError(f"'{model.path}' has weights of other shapes than the base '{base.path}': {shapes[:3]}.")
        tokenizer = model.codec.tokenizer.get_vocab() if model.codec.tokenizer is not None else None
        if tokenizer != vocabulary:
            raise ValueError(f"'{model.path}' uses another tokenizer than the base '{base.path}': merged weights "
                             "would read other token ids. Merge models fine-tuned from the same base.")
        if method == "deltas":
            changed = [k for k, v in model.trunk_weights.items()
                       if not torch.equal(v.to(base.trunk_weights[k].dtype), base.trunk_weights[k])]
            if changed:
                raise ValueError(f"'{model.path}' changed the trunk of the base '{base.path}' ({changed[:3]}): "
                                 "--merge deltas combines models whose trunk stayed frozen (model.peft). Merge fully "
                                 "fine-tuned models with --merge ties or task_arithmetic.")
        for task, head in model.heads.items():
            if head["meta"].get("peft") and method != "deltas":
                raise ValueError(f"Task '{task}' of '{model.path}' was trained as a delta ({head['meta']['peft']}) "
                                 f"on a frozen trunk: it has no task vector to {method}-merge. Combine models "
                                 "trained as deltas with --merge deltas (each task keeps its own).")
            if task in owners:
                other = owners[task].heads[task]["meta"].get("label_names")
                labels = head["meta"].get("label_names")
                differ = f" with other labels ({other} against {labels})" if other != labels else ""
                raise ValueError(f"Two models have a task named '{task}'{differ}: '{owners[task].path}' and "
                                 f"'{model.path}'. A merged model keeps one head per task: merge models of different "
                                 "tasks.")
            owners[task] = model


def merge_trunks(base: PretrainedTrunk, models: list[PretrainedTrunk], method: str = "ties",
                 scale: float | None = None, density: float = 0.2) -> PretrainedTrunk:
    """One trunk with every model's heads, its weights the base's plus the models' merged task vectors."""
    if method not in MERGE_METHODS:
        raise ValueError(f"merge method {method!r}: choose one of {', '.join(MERGE_METHODS)}.")
    if len(models) < 2:
        raise ValueError(f"Merging takes two or more fine-tuned models; got {len(models)}.")
    if not 0 < density <= 1:
        raise ValueError(f"density={density}: the share of each task vector TIES keeps, in (0, 1].")
    if scale is not None and method == "deltas":
        raise ValueError(f"scale={scale}: --merge deltas adds nothing up (each task keeps its own delta); leave out "
                         "the scale.")
    if scale is not None and not scale > 0:
        raise ValueError(f"scale={scale}: the factor the merged task vector is added with must be > 0.")
    check_mergeable(base, models, method)
    heads = {task: head for model in models for task, head in model.heads.items()}
    targets = {task: t for model in models for task, t in model.codec.targets.items() if task in heads}
    codec = Codec(base.codec.tokenizer, targets)
    if method == "deltas":  # each task's delta comes with its head; the trunk is the base's
        return replace(base, path=Path(models[0].path), heads=heads, codec=codec)
    scale = scale if scale is not None else (1.0 / len(models) if method == "task_arithmetic" else 1.0)
    weights = {}
    for name, start in base.trunk_weights.items():
        if not start.is_floating_point():  # integer buffers (position ids): the base's
            weights[name] = start
            continue
        vectors = [model.trunk_weights[name].float() - start.float() for model in models]
        merged = torch.stack(vectors).sum(dim=0) if method == "task_arithmetic" else ties_merge(vectors, density)
        weights[name] = (start.float() + scale * merged).to(start.dtype)
    return replace(base, path=Path(models[0].path), trunk_weights=weights, heads=heads, codec=codec)
