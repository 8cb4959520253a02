"""The one LightningModule: a trunk, a named objective per task, and how they train together.

A single-task run is the one-entry case. Every batch says which task it belongs to (``batch["task"]``); the module
runs that task's objective on the shared trunk, weights its loss, and logs everything under the task's name:
``<stage>/<task>/<metric>`` (``val/sst2/acc``). At the end of each evaluation it also logs ``<stage>/score``, the mean
of every task's primary metric, each negated where lower is better (``Objective.score``), which a checkpoint can
monitor (mode max). Its jobs: build, steps, logging, checkpoint hooks, the sharding hook (weights come in through
``trunk.assembly.weights``; what trains is the ``Freezer``'s; optimizer groups are ``trunk.training.optim``'s)."""

from __future__ import annotations

import contextlib
import dataclasses
import os

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from trunk.core.codec import SEP, SPECIAL_TOKENS, Codec, special_id
from trunk.core.contract import TaskSpec, loss_weights, pair_specs
from trunk.models import Block, TrunkConfig, build_trunk
from trunk.models.deltas import DeltaConfig, DeltaRouter
from trunk.models.taps import Taps
from trunk.tasks.objectives.base import Objective, batch_size
from trunk.tasks.objectives.masked_lm import auxiliary_mlm_loss, check_aux_mlm, tied_mlm_head
from trunk.tasks.registry import as_objective, stems_of
from trunk.training.callbacks import check_monitors
from trunk.training.distill import Teachers, distill_configs, intermediate_loss, mixed
from trunk.training.finetuning import FinetuneConfig, Freezer, GradualUnfreezing, apply_freezing
from trunk.training.optim import OptimConfig, build_optimizer, depth_param_groups
from trunk.training.sharding import shard


def as_config(cls: type, value):
    """A config dataclass from itself or from its dict form (as checkpoints store it)."""
    return cls(**value) if isinstance(value, dict) else value


class TrunkModule(L.LightningModule):
    """A trunk shared by named task objectives, trained jointly (or alone: one entry).

    Args:
        tasks: task name -> objective (``SequenceClassification``, ``TokenClassification``, ...; the kinds of
            ``trunk.tasks.registry.KINDS``). The names must be those of ``data.tasks``.
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
        aux_mlm: the weight of an auxiliary masked-LM loss on every text task's own training batches (0: off;
            0.5 is common). Each training batch is masked as BERT does (15% of its ordinary tokens) and run
            through the trunk a second time; an MLM head tied to the token embeddings predicts the hidden
            tokens. On small sets it keeps the trunk learning the language of the task, not only its labels.
        peft: task -> its delta on a frozen trunk, ``{method: lora | adapter, r, alpha, dropout, targets, layers, norms,
            dora}`` (``trunk.models.deltas.DeltaConfig``): the trunk is frozen, and each listed task trains only its
            delta and its head (tasks not listed train their head alone). A task's delta is kept with its head.
        distill: task -> how it learns from trained models of it, ``{teachers: [paths], alpha, temperature, ...}``
            (``trunk.training.distill.DistillConfig``); the teachers are loaded by ``trunk fit``
            (``trunk.inference.teachers``), or handed over in Python with ``attach_teachers``.
    """

    def __init__(
        self,
        tasks: dict[str, Objective],
        trunk: TrunkConfig | None = None,
        optimizer: OptimConfig = OptimConfig(),
        finetune: FinetuneConfig = FinetuneConfig(),
        task_weights: dict[str, float] | None = None,
        task_info: dict[str, TaskSpec | dict] | None = None,
        codec: Codec | None = None,
        activation_checkpointing: bool = False,
        compile: bool = False,
        aux_mlm: float = 0.0,
        peft: dict[str, dict] | None = None,
        distill: dict[str, dict] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["codec"])
        objectives = {name: as_objective(o) for name, o in tasks.items()}
        # plain values, current class paths
        self.hparams.update(tasks={name: o.spec() for name, o in objectives.items()})
        self.trunk_config = TrunkConfig.from_dict(trunk) if isinstance(trunk, dict) else trunk or TrunkConfig()
        self.hparams.update(trunk=self.trunk_config)  # every value, a preset's and the defaults included
        self.optim_config, self.finetune = as_config(OptimConfig, optimizer), as_config(FinetuneConfig, finetune)
        self.task_weights, self.validation_warnings = loss_weights(task_weights or {}, objectives), []
        # the warnings printed at the latest validation, the tasks warned of and those the validation before warned
        # of: in fit a task's are printed once two validations in a row have them (a model one validation into its
        # training often predicts one class before it learns), once only, and the last validation's are said again
        # at the end unless they were just printed
        self.said_warnings: set[str] = set()
        self._warned_tasks: set[str] = set()
        self._degenerate_before: set[str] = set()
        task_info = pair_specs(objectives, task_info)
        self.hparams.update(task_info={name: spec.to_dict() for name, spec in task_info.items()})  # plain values
        self.trunk = build_trunk(self.trunk_config, stems_of(objectives))
        for name, objective in objectives.items():
            objective.build(name, self.trunk, task_info[name])
        self.router = self._deltas(peft or {}, objectives)
        self.distill = distill_configs(distill, objectives)
        self.teachers: dict[str, Teachers] = {}  # not modules of this one: never trained, saved or summed up
        # distill's hidden states of a narrower student: per task, its outputs to the teacher's width (trained and
        # checkpointed with the student, made when its teachers are attached; no part of the model it exports)
        self.projections = nn.ModuleDict()
        self.objectives = nn.ModuleDict(objectives)
        check_aux_mlm(aux_mlm, objectives, codec.tokenizer if codec is not None else None)
        self.aux_mlm, self.aux_mlm_head = float(aux_mlm), tied_mlm_head(self.trunk) if aux_mlm else None
        for stack in (m for m in self.modules() if hasattr(m, "set_grad_checkpointing")):  # the backbone, decoders
            stack.set_grad_checkpointing(activation_checkpointing)
        if compile:
            for block in (m for m in self.modules() if isinstance(m, Block)):
                block.compile()
        self._trained_tasks: set[str] = set()  # tasks with a batch since the last optimizer step
        self.freezer = Freezer(self)
        self.connect(codec)
        apply_freezing(self.depth_groups(), self.finetune, self.trunk.backbone.final_norm)

    def _deltas(self, peft: dict[str, dict], objectives: dict[str, Objective]) -> DeltaRouter:
        """Each ``peft`` task's delta (``Objective.add_delta``), hooked into the trunk, which freezes."""
        unknown = sorted(set(peft) - set(objectives))
        if unknown:
            raise ValueError(f"model.peft names {unknown}, which are not tasks of this run {sorted(objectives)}.")
        router = DeltaRouter()
        for name, options in peft.items():
            if objectives[name].exports_trunk:
                raise ValueError(f"model.peft.{name}: task '{name}' ({objectives[name].kind}) pretrains the trunk "
                                 "itself, and a delta on a frozen trunk would leave the trunk it exports untrained. "
                                 "Leave it out of model.peft.")
            config = options if isinstance(options, DeltaConfig) else DeltaConfig.from_dict(options)
            router.add(name, objectives[name].add_delta(self.trunk.backbone, config))
        if peft:
            if self.finetune.unfreeze_every:
                raise ValueError("model.peft trains deltas on a frozen trunk; model.finetune.unfreeze_every would "
                                 "thaw it. Use one.")
            router.attach(self.trunk.backbone)
            self.finetune = dataclasses.replace(self.finetune, freeze_trunk=True)
        return router

    def route(self, task: str):
        """The context of a forward of ``task``'s batches: its delta added to the trunk's layers, if it has one."""
        return self.router.route([(task, None)]) if task in self.router.deltas else contextlib.nullcontext()

    def connect(self, codec: Codec | None) -> None:
        """Hand the objectives the run's tokenizers (translation decodes with them)."""
        self.codec, tokenizer = codec, (codec.tokenizer if codec is not None else None)
        self._special_ids = {t: special_id(tokenizer, t) for t in SPECIAL_TOKENS}  # None: a role it lacks
        if "text" in self.trunk.stems:  # segments are read off the tokenizer's [SEP]
            self.trunk.stems["text"].connect(self._special_ids[SEP])
        for objective in self.objectives.values():
            objective.connect(codec)

    def attach_teachers(self, task: str, teachers: Teachers) -> None:
        """Hand ``task`` (one of ``model.distill``) its loaded teachers; a student narrower or wider than the teacher
        whose hidden states it learns gets its projection (before the optimizer and a resumed checkpoint's weights)."""
        if task not in self.distill:
            raise ValueError(f"Task '{task}' is not in model.distill {sorted(self.distill)}: it has no teachers.")
        self.teachers[task] = teachers
        mine, theirs = self.trunk_config.d_model, teachers.width
        if self.distill[task].hidden and theirs != mine and task not in self.projections:
            projection = nn.Linear(mine, theirs, bias=False)
            nn.init.normal_(projection.weight, std=mine ** -0.5)  # keeps the states' scale
            self.projections[task] = projection.to(self.device)

    @property
    def tasks(self) -> list[str]:
        return list(self.objectives)

    def objective(self, task: str) -> Objective:
        if task not in self.objectives:
            raise ValueError(f"No task named {task!r}; this model's tasks are {sorted(self.objectives)}.")
        return self.objectives[task]

    def depth_groups(self) -> list[list[nn.Module]]:
        """The model bottom-up, for freezing and layer-wise learning rates: [stems], [block 0], ..., [block L-1],
        [final norm, every task's head]."""
        *below, top = self.trunk.depth_groups()
        aux = [self.aux_mlm_head] if self.aux_mlm_head is not None else []
        return [*below, [*top, *self.objectives.values(), *aux, *self.projections.values()]]

    def train(self, mode: bool = True):
        """Frozen trunk parts stay in eval mode (no dropout); see trunk/training/finetuning.py."""
        super().train(mode)
        backbone = self.trunk.backbone
        self.freezer.keep_frozen_in_eval([*self.trunk.stems.values(), *backbone.blocks, backbone.final_norm])
        return self

    # -- checkpoints: plain values only, so every checkpoint loads with weights_only=True --------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        hparams = checkpoint.get("hyper_parameters", {})
        for key, value in hparams.items():
            if dataclasses.is_dataclass(value):
                hparams[key] = dataclasses.asdict(value)
        checkpoint["trunk_meta"] = {"stems": stems_of(dict(self.objectives)),
                                    "heads": {name: o.head_meta() for name, o in self.objectives.items()}}
        if self.codec is not None:
            checkpoint["codec"] = self.codec.state_dict()
        if self.teachers:  # which teachers the run learns from, by their contents: a resumed run must have the same
            checkpoint["distill_teachers"] = {task: teachers.digest for task, teachers in self.teachers.items()}
            checkpoint["distill_passes"] = {task: teachers.passes for task, teachers in self.teachers.items()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("state_dict", {})
        bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if bad and not os.environ.get("TRUNK_ALLOW_NON_FINITE"):
            raise ValueError(f"The checkpoint has NaN or infinite weights in {bad[:5]}: the run that wrote it "
                             "diverged. Use an earlier checkpoint (or, to inspect these weights anyway, set "
                             "TRUNK_ALLOW_NON_FINITE=1).")
        if "codec" in checkpoint and self.codec is None:
            self.connect(Codec.from_state(checkpoint["codec"]))
        for key in [k for k in state if k.startswith("projections.") and k.split(".")[1] not in self.projections]:
            del state[key]  # a distilled student evaluated, predicting or started from: its training-only projection

    # -- steps ---------------------------------------------------------------------------------------
    def forward(self, batch: dict, stage: str) -> torch.Tensor | list[dict]:
        """One batch of ``stage``: its task's weighted loss ("train", "val", "test"), its prediction records ("predict")
        or its gold-and-predicted records ("samples"). Every step goes through here: FSDP2 gathers the root's parameters
        (stems, heads) in hooks around ``forward``."""
        task = batch["task"]
        objective = self.objective(task)
        with self.route(task):
            if stage == "predict":
                return objective.predict(self.trunk, batch)
            if stage == "samples":  # validation's prediction tables (PredictionSamples)
                return objective.samples(self.trunk, batch)
            with objective.in_file(batch.get("file")):  # a split read as several files, each with its own metrics
                if stage == "train" and task in self.distill:
                    loss = self._distilled_loss(task, objective, batch)
                else:
                    loss = objective.loss(self.trunk, batch, stage)
            where = f"{task}/{batch['file']}" if batch.get("file") else task  # a file's loader logs its own loss
            self.log(f"{stage}/{where}/loss", loss, on_step=stage == "train", on_epoch=True,
                     batch_size=batch_size(batch), sync_dist=stage != "train", add_dataloader_idx=False)
            loss = self.task_weights[task] * loss
            if stage == "train" and self.aux_mlm_head is not None and objective.stem == "text":
                aux = auxiliary_mlm_loss(self.aux_mlm_head, self.trunk, batch, self._special_ids)
                self.log(f"train/{task}/aux_mlm_loss", aux, on_step=True, on_epoch=True, batch_size=batch_size(batch))
                loss = loss + self.aux_mlm * aux
            return loss

    def _distilled_loss(self, task: str, objective: Objective, batch: dict) -> torch.Tensor:
        """A training batch of a task with teachers: its own loss (where it has labels) mixed with the one against
        the teachers' answers (``trunk.training.distill``), from one forward of the student."""
        config, teachers = self.distill[task], self.teachers[task]

        def own(output=None) -> torch.Tensor | None:  # the task's loss on its labels, where the batch has them
            return None if batch.get("unlabelled") else objective.loss(self.trunk, batch, "train", output)

        if config.sequence:  # the teacher's translations as targets: the task's own loss on them
            with torch.no_grad():
                sequences = teachers.soft_targets(batch)
            distill = objective.loss(self.trunk, objective.with_targets(batch, sequences), "train")
            self.log(f"train/{task}/distill_loss", distill, on_step=True, on_epoch=True, batch_size=batch_size(batch))
            return mixed(own(), distill, config.alpha)
        taps = Taps(self.trunk.backbone, [s for s, _ in config.layers])  # config.layers: the blocks' insides too
        with taps:
            output = objective.distill_output(self.trunk, batch)
        with torch.no_grad():
            targets = teachers.soft_targets(batch)
        distill = objective.distill_loss(output, targets, batch, config.temperature)
        self.log(f"train/{task}/distill_loss", distill, on_step=True, on_epoch=True, batch_size=batch_size(batch))
        loss = mixed(own(output), distill, config.alpha)
        if config.layers:
            student = taps.read(batch.get("attention_mask"))
            inner = intermediate_loss(config, student, teachers.tapped, taps.mask,
                                      config.relation_heads or self.trunk_config.n_heads,
                                      self.projections[task] if task in self.projections else None)  # noqa: SIM401
            self.log(f"train/{task}/intermediate_loss", inner, on_step=True, on_epoch=True,
                     batch_size=batch_size(batch))
            loss = loss + inner
        return loss

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
        self.freezer.drop_held_gradients()

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self(batch, "val")

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self(batch, "test")

    def predict_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> list[dict]:
        return self(batch, "predict")

    def param_groups(self) -> list[dict]:
        """The optimizer's groups: each depth's trainable parameters at its learning rate (``depth_param_groups``)."""
        seen: set[int] = set()
        depths = enumerate(self.depth_groups())
        return [group for depth, modules in depths for group in depth_param_groups(self, modules, depth, seen)]

    def configure_optimizers(self):
        steps = max(1, int(self.trainer.estimated_stepping_batches))
        return build_optimizer(self.param_groups(), self.optim_config, steps)

    def configure_callbacks(self):
        from trunk.training.callbacks import ExportTrunk

        callbacks = [GradualUnfreezing(self.finetune.unfreeze_every)] if self.finetune.unfreeze_every else []
        pretraining = any(o.exports_trunk for o in self.objectives.values())
        if pretraining and not any(isinstance(c, ExportTrunk) for c in self.trainer.callbacks):
            callbacks.append(ExportTrunk())  # pretraining always ends with a reusable trunk
        return callbacks

    # -- logging -------------------------------------------------------------------------------------
    def _log_metrics(self, stage: str) -> None:
        """Each task's epoch metrics (already synced across processes), and the run's score."""
        # a sanity check's two batches, or fast_dev_run's one step, prove nothing about what the model predicts
        primaries, warned = [], stage == "val" and not (self.trainer.sanity_checking or self.trainer.fast_dev_run)
        if warned:  # kept for the run's summary at its end (trunk fit)
            fresh = {name: o.epoch_warnings(stage) for name, o in self.objectives.items()}
            self.validation_warnings, self.said_warnings = [w for found in fresh.values() for w in found], set()
            degenerate = {name for name, found in fresh.items() if found}
            fitting = self.trainer.state.fn == TrainerFn.FITTING
            persisting = degenerate & self._degenerate_before if fitting else degenerate
            self._degenerate_before = degenerate
            for name in sorted(persisting - self._warned_tasks):
                self._warned_tasks.add(name)
                self.said_warnings.update(fresh[name])
                for warning in fresh[name]:
                    rank_zero_warn(warning)
        for name, objective in self.objectives.items():
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

    def on_fit_start(self) -> None:
        check_monitors(self.trainer.callbacks, list(self.objectives))
        missing = sorted(set(self.distill) - set(self.teachers))
        if missing:
            raise ValueError(f"model.distill names {missing}, but no teachers were loaded for them: `trunk fit` loads "
                             "them; in Python, trunk.inference.teachers.attach_teachers(model) does.")
        for teachers in self.teachers.values():
            teachers.to(self.device)

    # -- the sharding hook ---------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """Under Lightning's ``ModelParallelStrategy``: FSDP2 (``trunk/training/sharding.py``); a no-op otherwise."""
        mesh = getattr(self, "_device_mesh", None)
        if mesh is not None and not getattr(self, "_sharded", False):  # configure_model runs once per fit/test
            precision = str(getattr(self.trainer, "precision", "")) if self._trainer is not None else ""
            shard(self, mesh, bf16=precision == "bf16-mixed")
            self._sharded = True

