"""The one LightningModule: a trunk, a named objective per task, and how they train together.

A single-task run is the one-entry case. Every batch says which task it belongs to
(``batch["task"]``); the module runs that task's objective on the shared trunk, weights its loss,
and logs everything under the task's name: ``<stage>/<task>/<metric>`` (``val/sst2/acc``). At the
end of each evaluation it also logs ``<stage>/score``, the mean of every task's primary metric, each
negated where lower is better (``Objective.score``), which a checkpoint can monitor (mode max).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
import torch
from torch import nn
from trunk.core.codec import MASK, SPECIAL_IDS, SPECIAL_TOKENS, Codec
from trunk.core.masking import mask_tokens
from trunk.core.contract import TaskSpec
from trunk.models import STEM_KINDS, Block, TrunkConfig, build_trunk, init_weights
from trunk.models.deltas import DeltaConfig, DeltaRouter, TaskDelta
from trunk.training.finetuning import FinetuneConfig, GradualUnfreezing, apply_freezing, keep_frozen_in_eval
from trunk.tasks.objectives.base import Objective, batch_size
from trunk.tasks.objectives.masked_lm import masked_token_nll, tied_mlm_head
from trunk.training.optim import OptimConfig, build_optimizer, decay_groups, no_decay_ids
from trunk.training.sharding import shard
from trunk.formats.trunk_dir import (
    architecture_fields,
    TEXT_STEM_FIELDS,
    PretrainedTrunk,
    check_architecture,
    pretrained_trunk_config,
    trunk_config,
)
from trunk.formats.task_dir import read_trunk


def as_config(cls: type, value):
    """A config dataclass from itself or from its dict form (as checkpoints store it)."""
    return cls(**value) if isinstance(value, dict) else value


def objective_class(class_path: str) -> type[Objective]:
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError:
        if module.startswith("trunk.tasks."):  # stored by a version whose objectives lived in other files
            return getattr(importlib.import_module("trunk.tasks"), name)
        raise


def as_objective(value) -> Objective:
    """An objective from itself or from its stored ``{"class_path", "init_args"}`` form."""
    if isinstance(value, Objective):
        return value
    if isinstance(value, dict) and "class_path" in value:
        return objective_class(value["class_path"])(**value.get("init_args", {}))
    raise TypeError(f"model.tasks entries must be objectives (class_path + init_args), got {value!r}.")


class TrunkModule(L.LightningModule):
    """A trunk shared by named task objectives, trained jointly (or alone: one entry).

    Args:
        tasks: task name -> objective (``SequenceClassification``, ``TokenClassification``,
            ``MaskedLanguageModeling``, ``ReplacedTokenDetection``, ``Translation``,
            ``ImageClassification``). The names must be those of ``data.tasks``.
        trunk: the architecture (``vocab_size`` is linked from the data's tokenizer).
        optimizer: AdamW and its warmup + decay schedule, over the trunk and every head.
        finetune: freezing, gradual unfreezing and layer-wise learning rates.
        task_weights: task -> weight of its loss (default 1 each).
        task_info: task -> its ``TaskSpec`` (or the spec's dict form): what the data says of it (objective
            kinds, label names, lengths); decided by ``trunk.assembly.run.resolve``.
        codec: the run's tokenizers, for decoding; linked from the data, stored in checkpoints.
        activation_checkpointing: recompute each block's activations in backward instead of keeping
            them (trunk and translation decoder): less memory for about a third more compute.
        compile: ``torch.compile`` each block (trunk and decoder). Off by default: on the reference
            2-core CPU it made the step slower (0.93x in bf16, after a 38 s warm-up; docs/speed.md);
            try it on GPUs.
        peft: task -> its delta on a frozen trunk, ``{method: lora | adapter, r, alpha, dropout, targets, layers, norms, dora}``
            (``trunk.models.deltas.DeltaConfig``): the trunk is frozen, and each listed task trains only its delta and
            its head (tasks not listed train their head alone). A task's delta is kept with its head.
        aux_mlm: the weight of an auxiliary masked-LM loss on every text task's own training batches (0: off;
            0.5 is common). Each training batch is masked as BERT does (15% of its ordinary tokens) and run
            through the trunk a second time; an MLM head tied to the token embeddings predicts the hidden
            tokens. On small sets it keeps the trunk learning the language of the task, not only its labels.
    """

    def __init__(
        self,
        tasks: dict[str, Objective],
        trunk: TrunkConfig = TrunkConfig(),
        optimizer: OptimConfig = OptimConfig(),
        finetune: FinetuneConfig = FinetuneConfig(),
        task_weights: dict[str, float] | None = None,
        task_info: dict[str, TaskSpec | dict] | None = None,
        codec: Codec | None = None,
        activation_checkpointing: bool = False,
        compile: bool = False,
        aux_mlm: float = 0.0,
        peft: dict[str, dict] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["codec"])
        objectives = {name: as_objective(o) for name, o in tasks.items()}
        self.hparams.update(tasks={name: o.spec() for name, o in objectives.items()})  # plain values, current class paths
        self.trunk_config = trunk_config(trunk) if isinstance(trunk, dict) else trunk
        self.optim_config, self.finetune = as_config(OptimConfig, optimizer), as_config(FinetuneConfig, finetune)
        self.task_weights = self._check_weights(task_weights or {}, objectives)
        task_info = self._check_tasks(objectives, task_info)
        self.hparams.update(task_info={name: spec.to_dict() for name, spec in task_info.items()})  # plain values
        self.trunk = build_trunk(self.trunk_config, self._stems(objectives))
        for name, objective in objectives.items():
            objective.build(name, self.trunk, task_info[name])
        self.router = self._deltas(peft or {}, objectives)
        self.objectives = nn.ModuleDict(objectives)
        self.aux_mlm, self.aux_mlm_head = self._aux_mlm_head(aux_mlm, objectives)
        for stack in (m for m in self.modules() if hasattr(m, "set_grad_checkpointing")):  # the backbone, decoders
            stack.set_grad_checkpointing(activation_checkpointing)
        if compile:
            for block in (m for m in self.modules() if isinstance(m, Block)):
                block.compile()
        self._trained_tasks: set[str] = set()  # tasks with a batch since the last optimizer step
        self._held: set[str] = set()  # names of parameters held frozen under DDP / FSDP2 (trunk/training/finetuning.py)
        self.connect(codec)
        apply_freezing(self.depth_groups(), self.finetune, self.trunk.backbone.final_norm)

    @classmethod
    def from_pretrained(cls, source: str | Path | PretrainedTrunk, tasks: dict[str, Objective], *,
                        reinit_mismatched_heads: bool = False, heads_from: dict[str, str] | None = None,
                        label_map: dict[str, dict[str, str]] | None = None, keep_shared_labels: bool = False,
                        trunk: TrunkConfig | dict | None = None, **options) -> "TrunkModule":
        """A model whose trunk, and each task's head where ``source`` stores one of the same name and kind (labels
        matched by name), start from a trunk directory or a checkpoint: what ``model.init_from`` does in a run.
        Fields of ``trunk`` left at their defaults take the pretrained values. ``reinit_mismatched_heads``: a
        stored head whose labels differ from the data's keeps its body and gets a fresh classifier (else: an
        error naming both label sets). ``heads_from``, ``label_map``, ``keep_shared_labels``: see ``load_pretrained``."""
        pretrained = source if isinstance(source, PretrainedTrunk) else read_trunk(source)
        codec = options.pop("codec", None) or pretrained.codec
        vocab_size = codec.tokenizer.get_vocab_size() if codec.tokenizer is not None else pretrained.config.vocab_size
        model = cls(tasks, trunk=pretrained_trunk_config(trunk, pretrained.config, vocab_size), codec=codec, **options)
        model.load_pretrained(pretrained, reinit_mismatched_heads, heads_from, label_map, keep_shared_labels)
        return model

    # -- building ----------------------------------------------------------------------------------
    def _deltas(self, peft: dict[str, dict], objectives: dict[str, Objective]) -> DeltaRouter:
        """Each ``peft`` task's delta, kept on its objective (``objective.delta``) and hooked into the trunk, which
        freezes."""
        unknown = sorted(set(peft) - set(objectives))
        if unknown:
            raise ValueError(f"model.peft names {unknown}, which are not tasks of this run {sorted(objectives)}.")
        router = DeltaRouter()
        for name, options in peft.items():
            if objectives[name].exports_trunk:
                raise ValueError(f"model.peft.{name}: task '{name}' ({objectives[name].kind}) pretrains the trunk itself, and a "
                                 "delta on a frozen trunk would leave the trunk it exports untrained. Leave it out of model.peft.")
            config = options if isinstance(options, DeltaConfig) else DeltaConfig.from_dict(options)
            objectives[name].delta = TaskDelta(self.trunk.backbone, config)
            router.add(name, objectives[name].delta)
        if peft:
            if self.finetune.unfreeze_every:
                raise ValueError("model.peft trains deltas on a frozen trunk; model.finetune.unfreeze_every would thaw it. Use one.")
            router.attach(self.trunk.backbone)
            self.finetune = dataclasses.replace(self.finetune, freeze_trunk=True)
        return router

    def route(self, task: str):
        """The context of a forward of ``task``'s batches: its delta added to the trunk's layers, if it has one."""
        return self.router.route([(task, None)]) if task in self.router.deltas else contextlib.nullcontext()

    def merge_delta(self) -> None:
        """Write the LoRA of a one-task model into the trunk's weights, for inference: a forward then costs what the
        trunk's does. With several tasks the trunk is shared, so it must stay as it is."""
        lora = [name for name, delta in self.router.deltas.items() if delta.config.method == "lora"]
        if len(self.objectives) != 1 or len(lora) != 1:
            raise ValueError(f"merge writes one task's LoRA into the trunk, which needs a model of that one task; this model has "
                             f"the tasks {list(self.objectives)}, with LoRA on {lora or 'none'}. Load it without merge (or load "
                             "the trunk with only that task's directory).")
        self.router.merge(self.trunk.backbone, lora[0])

    @staticmethod
    def _check_weights(weights: dict[str, float], objectives: dict) -> dict[str, float]:
        unknown = sorted(set(weights) - set(objectives))
        if unknown:
            raise ValueError(f"model.task_weights names {unknown}, which are not tasks of this run {sorted(objectives)}.")
        bad = {k: v for k, v in weights.items() if not v >= 0}
        if bad:
            raise ValueError(f"model.task_weights must be >= 0, got {bad}.")
        return {name: float(weights.get(name, 1.0)) for name in objectives}

    @staticmethod
    def _check_tasks(objectives: dict[str, Objective], task_info: dict[str, TaskSpec | dict] | None) -> dict[str, TaskSpec]:
        """The model's tasks and the data's must be the same, each objective fed by data of its kind."""
        if not objectives:
            raise ValueError("model.tasks is empty: name at least one task and its objective.")
        task_info = {name: TaskSpec.of(spec) for name, spec in (task_info or {name: None for name in objectives}).items()}
        if set(task_info) != set(objectives):
            raise ValueError(f"model.tasks names {sorted(objectives)} but data.tasks names {sorted(task_info)}: every task "
                             "needs both an objective (model.tasks.<name>) and data (data.tasks.<name>), under the same name.")
        for name, objective in objectives.items():
            kinds = task_info[name].kinds
            if kinds is not None and objective.kind not in kinds:
                raise ValueError(f"Task '{name}': its data feeds {' or '.join(kinds)} objectives, but model.tasks.{name} is "
                                 f"{type(objective).__name__} ({objective.kind}). Pair each objective with data of its kind.")
        return task_info

    @staticmethod
    def _stems(objectives: dict[str, Objective]) -> dict[str, dict]:
        """The stems the tasks read: one text stem, one image stem (its patch options must agree)."""
        stems: dict[str, dict] = {}
        for name, objective in objectives.items():
            options = objective.stem_options()
            if objective.stem in stems and stems[objective.stem] != options:
                raise ValueError(f"Task '{name}' needs an {objective.stem} stem with {options}, but another task of the run "
                                 f"needs {stems[objective.stem]}: the tasks share one stem, so give them the same options.")
            stems[objective.stem] = options
        return dict(sorted(stems.items(), key=lambda item: STEM_KINDS.index(item[0])))

    def connect(self, codec: Codec | None) -> None:
        """Hand the objectives the run's tokenizers (translation decodes with them)."""
        self.codec = codec
        tokenizer = codec.tokenizer if codec is not None else None
        self._special_ids = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] if tokenizer is not None else list(SPECIAL_IDS.values())
        for objective in self.objectives.values():
            objective.connect(codec)

    def load_pretrained(self, pretrained: PretrainedTrunk, reinit_mismatched_heads: bool = False, heads_from: dict[str, str] | None = None,
                        label_map: dict[str, dict[str, str]] | None = None, keep_shared_labels: bool = False) -> list[str]:
        """Start from a pretrained trunk (and its heads), after checking that the architectures match.
        Stems the directory lacks stay fresh (a ViT from a text trunk gets a new patch stem). Each task takes
        the stored head of its own name, or of the name ``heads_from`` gives it ({new_task: stored_task});
        ``label_map`` (task -> {its label: the stored one}) and ``keep_shared_labels``: see ``Objective.load_head``.
        Returns what was carried over, in words."""
        heads_from, label_map = heads_from or {}, label_map or {}
        for option, names in (("heads_from", heads_from), ("label_map", label_map)):
            unknown = sorted(set(names) - set(self.objectives))
            if unknown:
                raise ValueError(f"model.{option} names the tasks {unknown}, but this run's tasks are {sorted(self.objectives)}.")
        for task, stored in heads_from.items():
            if stored not in pretrained.heads:
                raise ValueError(f"model.heads_from: task '{task}' should start from the head '{stored}', but '{pretrained.path}' "
                                 f"stores the heads {sorted(pretrained.heads)}.")
            if pretrained.heads[stored]["meta"]["kind"] != self.objectives[task].kind:
                raise ValueError(f"model.heads_from: the head '{stored}' in '{pretrained.path}' is a "
                                 f"{pretrained.heads[stored]['meta']['kind']} head; task '{task}' is {self.objectives[task].kind}.")
        shared = [kind for kind in self.trunk.stems if kind in pretrained.stems]
        names = [n for n in architecture_fields(pretrained.config) if "text" in shared or n not in TEXT_STEM_FIELDS]
        check_architecture(self.trunk_config, pretrained.config, pretrained.path, names)
        if "image" in shared and pretrained.stems["image"] != self._stems(dict(self.objectives))["image"]:
            raise ValueError(f"'{pretrained.path}' has an image stem with {pretrained.stems['image']}, this run's image tasks "
                             f"need {self._stems(dict(self.objectives))['image']}.")
        state = {k: v for k, v in pretrained.trunk_weights.items()
                 if k.startswith("backbone.") or k.split(".")[1] in shared}
        missing, unexpected = self.trunk.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        fresh = sorted(set(self.trunk.stems) - set(shared))
        notes = []
        if self.finetune.reinit_top:
            blocks = self.trunk.backbone.blocks
            if self.finetune.reinit_top > len(blocks):
                raise ValueError(f"finetune.reinit_top={self.finetune.reinit_top} exceeds the trunk's {len(blocks)} blocks.")
            for block in blocks[len(blocks) - self.finetune.reinit_top:]:
                init_weights(block, self.trunk_config.init_std, n_layers=len(blocks))
            notes.append(f"the top {self.finetune.reinit_top} of {len(blocks)} blocks start afresh (finetune.reinit_top)")
        for name, objective in self.objectives.items():
            stored = heads_from.get(name, name)
            head = pretrained.heads.get(stored)
            if head is None or head["meta"]["kind"] != objective.kind:
                notes.append(f"task '{name}': a fresh head" + self._load_sources(name, pretrained))
                continue
            source = head.get("source", pretrained.path)  # a task directory's, or the trunk's
            state, fresh_delta = self._with_delta(name, head, source)
            how = objective.load_head(state, head["meta"].get("label_names"), reinit_mismatched_heads, str(source),
                                      label_map.get(name), keep_shared_labels)
            origin = f"the head '{stored}' from {source}" if stored != name else f"its head from {source}"
            notes.append(f"task '{name}': {origin}{f' ({how})' if how else ''}{f', {fresh_delta}' if fresh_delta else ''}")
        if fresh:
            notes.append(f"{pretrained.path} has no {fresh} stem: it starts from a fresh initialisation")
        return notes

    def _load_sources(self, name: str, pretrained: PretrainedTrunk) -> str:
        """A fresh task's composed delta: the deltas of the tasks it composes (``peft.compose``), from their stored heads."""
        delta = getattr(self.objectives[name], "delta", None)
        for task, source in (delta.sources.items() if delta is not None else ()):
            state = {k[len("delta."):]: v for k, v in pretrained.heads[task]["state"].items() if k.startswith("delta.")}
            source.load_state_dict(state)
        return f", composing the deltas of {list(delta.sources)}" if delta is not None and delta.sources else ""

    def _with_delta(self, name: str, head: dict, source: Path) -> tuple[dict, str | None]:
        """A stored head's weights for task ``name``, its delta matched to the run's ``model.peft``: a stored delta needs
        the same options; a task given a delta whose head was trained without one starts its delta fresh."""
        stored, delta = head["meta"].get("peft"), getattr(self.objectives[name], "delta", None)
        if stored and delta is None:
            raise ValueError(f"Task '{name}': the head in '{source}' was trained with a {stored['method']} delta on a frozen trunk. "
                             f"Give the task that delta to go on with it: --model.peft='{{{name}: {json.dumps(stored)}}}'.")
        if delta is None:
            return head["state"], None
        if not stored:
            return {**head["state"], **{f"delta.{k}": v for k, v in delta.state_dict().items()}}, f"a fresh {delta.config.method} delta"
        if not delta.config.fits(DeltaConfig.from_dict(stored)):
            raise ValueError(f"Task '{name}': the delta in '{source}' was trained with {stored}, but model.peft.{name} is "
                             f"{dataclasses.asdict(delta.config)}. Use the stored options, or another task name for a fresh delta.")
        return head["state"], None

    # -- checkpoints: plain values only, so every checkpoint loads with weights_only=True --------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        hparams = checkpoint.get("hyper_parameters", {})
        for key, value in hparams.items():
            if dataclasses.is_dataclass(value):
                hparams[key] = dataclasses.asdict(value)
        checkpoint["trunk_meta"] = {"stems": self._stems(dict(self.objectives)),
                                    "heads": {name: o.head_meta() for name, o in self.objectives.items()}}
        if self.codec is not None:
            checkpoint["codec"] = self.codec.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        bad = [k for k, v in checkpoint.get("state_dict", {}).items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if bad and not os.environ.get("TRUNK_ALLOW_NON_FINITE"):
            raise ValueError(f"The checkpoint has NaN or infinite weights in {bad[:5]}: the run that wrote it diverged. Use an "
                             "earlier checkpoint (or, to inspect these weights anyway, set TRUNK_ALLOW_NON_FINITE=1).")
        if "codec" in checkpoint and self.codec is None:
            self.connect(Codec.from_state(checkpoint["codec"]))

    # -- steps ---------------------------------------------------------------------------------------
    def objective(self, task: str) -> Objective:
        if task not in self.objectives:
            raise ValueError(f"No task named {task!r}; this model's tasks are {sorted(self.objectives)}.")
        return self.objectives[task]

    def forward(self, batch: dict, stage: str) -> torch.Tensor | list[dict]:
        """One batch of ``stage``: its task's weighted loss ("train", "val", "test"), its prediction
        records ("predict") or its gold-and-predicted records ("samples"). Every step goes through here: FSDP2 gathers the root's parameters (stems,
        heads) in hooks around ``forward``."""
        with self.route(batch["task"]):
            return self._forward(batch, stage)

    def _forward(self, batch: dict, stage: str) -> torch.Tensor | list[dict]:
        task = batch["task"]
        if stage == "predict":
            return self.objective(task).predict(self.trunk, batch)
        if stage == "samples":  # validation's prediction tables (PredictionSamples)
            return self.objective(task).samples(self.trunk, batch)
        with self.objective(task).in_file(batch.get("file")):  # a split read as several files, each with its own metrics
            loss = self.objective(task).loss(self.trunk, batch, stage)
        where = f"{task}/{batch['file']}" if batch.get("file") else task  # a file's loader logs its own loss (one key per loader)
        self.log(f"{stage}/{where}/loss", loss, on_step=stage == "train", on_epoch=True, batch_size=batch_size(batch),
                 sync_dist=stage != "train", add_dataloader_idx=False)
        loss = self.task_weights[task] * loss
        if stage == "train" and self.aux_mlm_head is not None and self.objective(task).stem == "text":
            aux = self._aux_mlm_loss(batch)
            self.log(f"train/{task}/aux_mlm_loss", aux, on_step=True, on_epoch=True, batch_size=batch_size(batch))
            loss = loss + self.aux_mlm * aux
        return loss

    def _aux_mlm_head(self, weight: float, objectives: dict[str, Objective]) -> tuple[float, nn.Module | None]:
        """``aux_mlm``'s head (tied to the token embeddings), when it is on."""
        if not (isinstance(weight, (int, float)) and weight >= 0):
            raise ValueError(f"model.aux_mlm={weight!r} must be a loss weight >= 0 (0: off).")
        if weight == 0:
            return 0.0, None
        if not any(o.stem == "text" for o in objectives.values()):
            raise ValueError("model.aux_mlm masks the tokens of text tasks' batches; this run has no text task. Set it to 0.")
        return float(weight), tied_mlm_head(self.trunk)

    def _aux_mlm_loss(self, batch: dict) -> torch.Tensor:
        """The masked-LM loss of this batch's own text, masked afresh (the task's loss saw it whole)."""
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        ids, mask = ids.reshape(-1, ids.shape[-1]), None if mask is None else mask.reshape(-1, mask.shape[-1])  # choices: rows
        specials = self._special_ids  # the run's tokenizer's (connect)
        masked, targets = mask_tokens(ids, torch.tensor(specials, device=ids.device), specials[SPECIAL_TOKENS.index(MASK)],
                                      self.trunk_config.vocab_size)
        _, nll, _ = masked_token_nll(self.aux_mlm_head, self.trunk(masked, mask), targets)
        return nll.mean()

    def batch_work(self, batch: dict) -> tuple[int, torch.Tensor, int]:
        """What the trunk computes on for ``batch``: (samples, real tokens as a 0-d tensor on the batch's
        device, the longest sequence). Padding is not work; an image is its patches and [CLS]."""
        if "pixel_values" in batch:
            images = batch["pixel_values"]
            patch = self.trunk.stems["image"].patch_size
            length = (images.shape[-2] // patch) * (images.shape[-1] // patch) + 1
            return images.shape[0], torch.tensor(images.shape[0] * length), length
        mask = batch["attention_mask"]
        return mask.shape[0], mask.sum(), mask.shape[1]

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self._trained_tasks.add(batch["task"])
        loss = self(batch, "train")
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=batch_size(batch))
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        """Heads of tasks that had no batch since the last step get no update, as in a one-process run.
        (Under DDP with several tasks, the reducer hands them zero gradients; AdamW would still move
        them with its momentum and weight decay.) Parameters the trunk shares (tied embeddings) stay."""
        shared = {id(p) for p in self.trunk.parameters()}
        for name, objective in self.objectives.items():
            if name not in self._trained_tasks:
                for p in objective.parameters():
                    if id(p) not in shared:
                        p.grad = None
        self._trained_tasks.clear()
        if self._held:  # held parameters (frozen under DDP / FSDP2): their averaged gradients are dropped
            for name, p in self.named_parameters():
                if name in self._held:
                    p.grad = None

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self(batch, "val")

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self(batch, "test")

    def predict_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> list[dict]:
        return self(batch, "predict")

    def _log_metrics(self, stage: str) -> None:
        """Each task's epoch metrics (already synced across processes), and the run's score."""
        primaries = []
        for name, objective in self.objectives.items():
            if stage == "val" and not self.trainer.sanity_checking:  # an untrained model's two batches prove nothing
                for warning in objective.epoch_warnings(stage):
                    rank_zero_warn(warning)
            values = objective.compute_metrics(stage)
            for key, value in values.items():
                self.log(f"{stage}/{name}/{key}", value, prog_bar=stage != "train" and key == objective.primary)
            for file in objective.files(stage):  # data.tasks.<name>.metrics_per_file
                for key, value in objective.file_metrics(stage, file).items():
                    self.log(f"{stage}/{name}/{file}/{key}", value)
            if (share := objective.score(values)) is not None:
                primaries.append(share)
        if primaries and stage != "train":
            self.log(f"{stage}/score", torch.stack(primaries).mean(), prog_bar=len(primaries) > 1)

    def on_train_epoch_end(self) -> None:
        self._log_metrics("train")

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    def monitorable(self) -> list[str]:
        """The metric names a checkpoint or early stopping may monitor."""
        names = ["val/score"]
        for name in self.objectives:
            names += [f"val/{name}/loss", f"val/{name}/<metric>", f"train/{name}/loss"]
        return names

    def on_fit_start(self) -> None:
        for callback in self.trainer.callbacks:
            monitor = getattr(callback, "monitor", None)
            if not monitor:
                continue
            parts = monitor.split("/")
            if len(parts) == 3 and parts[1] not in self.objectives:
                raise ValueError(f"{type(callback).__name__} monitors {monitor!r}, but this run has no task {parts[1]!r}; "
                                 f"its tasks are {sorted(self.objectives)}. Monitor val/<task>/<metric> or val/score.")
            if len(parts) < 3 and monitor not in ("val/score", "test/score", "train/loss"):
                raise ValueError(f"{type(callback).__name__} monitors {monitor!r}: metrics are named <stage>/<task>/<metric> "
                                 f"(e.g. val/{next(iter(self.objectives))}/acc) or val/score (the mean of every task's primary metric).")

    def configure_model(self) -> None:
        """Under Lightning's ``ModelParallelStrategy``: FSDP2 (``trunk/training/sharding.py``); a no-op otherwise."""
        mesh = getattr(self, "_device_mesh", None)
        if mesh is not None and not getattr(self, "_sharded", False):  # configure_model runs once per fit/test
            precision = str(getattr(self.trainer, "precision", "")) if self._trainer is not None else ""
            shard(self, mesh, bf16=precision == "bf16-mixed")
            self._sharded = True

    # -- depths: freezing and layer-wise learning rates ------------------------------------------------
    def depth_groups(self) -> list[list[nn.Module]]:
        """The model bottom-up: [stems], [block 0], ..., [block L-1], [final norm, every task's head]."""
        *below, top = self.trunk.depth_groups()
        return [*below, [*top, *self.objectives.values(), *([self.aux_mlm_head] if self.aux_mlm_head is not None else [])]]

    def train(self, mode: bool = True):
        """Frozen trunk parts stay in eval mode (no dropout); see trunk/training/finetuning.py."""
        super().train(mode)
        held = self._held_ids()
        keep_frozen_in_eval([*self.trunk.stems.values(), *self.trunk.backbone.blocks, self.trunk.backbone.final_norm],
                            lambda p: self.trains(p, held))
        return self

    def trains(self, p: nn.Parameter, held: set[int] | None = None) -> bool:
        """Whether the optimizer updates ``p``: neither frozen (``requires_grad=False``) nor held.
        ``held``: ``_held_ids()``, when asking about many parameters."""
        return p.requires_grad and id(p) not in (self._held_ids() if held is None else held)

    def _held_ids(self) -> set[int]:
        """The held parameters' current objects. Held parts are recorded by name, because FSDP2 replaces
        the parameters when it shards the model (after gradual unfreezing has chosen what to hold)."""
        return {id(p) for name, p in self.named_parameters() if name in self._held} if self._held else set()

    def _names(self, modules: list[nn.Module]) -> set[str]:
        ids = {id(p) for m in modules for p in m.parameters()}
        return {name for name, p in self.named_parameters() if id(p) in ids}

    def hold(self, modules: list[nn.Module]) -> None:
        """Freeze ``modules`` without touching ``requires_grad``: for parts thawed later under DDP or FSDP2
        (trunk/training/finetuning.py)."""
        self._held |= self._names(modules)
        for m in modules:
            m.eval()

    def release(self, modules: list[nn.Module]) -> None:
        self._held -= self._names(modules)

    def configure_callbacks(self):
        from trunk.training.callbacks import ExportTrunk

        callbacks = [GradualUnfreezing(self.finetune.unfreeze_every)] if self.finetune.unfreeze_every else []
        pretraining = any(o.exports_trunk for o in self.objectives.values())
        if pretraining and not any(isinstance(c, ExportTrunk) for c in self.trainer.callbacks):
            callbacks.append(ExportTrunk())  # pretraining always ends with a reusable trunk
        return callbacks

    # -- optimisation --------------------------------------------------------------------------------
    def make_param_groups(self, modules: list[nn.Module], depth: int, exclude: set[int] | None = None) -> list[dict]:
        """Optimizer groups for the trainable parameters of ``modules`` at ``depth`` (``decay_groups``: vectors,
        position tables and [CLS] do not decay); frozen parameters get no optimizer state."""
        exclude = set() if exclude is None else exclude
        held = self._held_ids()
        params = [p for m in modules for p in m.parameters() if self.trains(p, held) and id(p) not in exclude]
        params = list({id(p): p for p in params}.values())  # tied weights (MLM decoder) appear once
        exclude.update(id(p) for p in params)
        lr = self.optim_config.lr * self.finetune.layer_decay ** (len(self.depth_groups()) - 1 - depth)
        return decay_groups(params, no_decay_ids(self), self.optim_config.weight_decay, lr, f"depth{depth}")

    def param_groups(self) -> list[dict]:
        seen: set[int] = set()
        return [g for depth, modules in enumerate(self.depth_groups()) for g in self.make_param_groups(modules, depth, seen)]

    def lr_schedule_factor(self) -> float:
        """The schedule's current multiplier (for groups added mid-run)."""
        return self.lr_schedulers().factor(self.trainer.global_step)

    def configure_optimizers(self):
        return build_optimizer(self.param_groups(), self.optim_config, max(1, int(self.trainer.estimated_stepping_batches)))

    def num_parameters(self, trainable_only: bool = False) -> int:
        held = self._held_ids()
        return sum(p.numel() for p in self.parameters() if self.trains(p, held) or not trainable_only)

    # -- inference without the CLI ---------------------------------------------------------------------
    @property
    def tasks(self) -> list[str]:
        return list(self.objectives)

