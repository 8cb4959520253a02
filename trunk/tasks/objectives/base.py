"""What a task kind is to the model: an ``Objective`` holds its head, its loss, its metrics and its
predictions. Plain PyTorch: no Lightning, no datamodule. Whatever it needs from the data (label
names, the tokenizer it decodes with) it is given in ``build``.

``TrunkModule`` (``trunk/training/module.py``) owns the trunk and one objective per named task, and calls
``loss`` / ``predict`` with the trunk and a batch of that task.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric

from trunk.core.codec import IGNORE_INDEX, Codec
from trunk.core.contract import TaskSpec
from trunk.core.labels import alike_across
from trunk.models import Trunk, TrunkConfig
from trunk.models.deltas import DeltaConfig, TaskDelta

STAGES = ("train", "val", "test")


class Objective(nn.Module):
    """Base of every task kind.

    Subclasses set ``kind`` (matched against what the task's data feeds), ``stem`` (the trunk stem
    their inputs take), ``primary`` (the metric that stands for the task in the run's ``score``; a
    class default or an instance's choice) and ``lower_is_better`` (metrics such as errors), and
    implement ``build_head``, ``make_metrics``, ``loss`` and ``predict``. Their constructor
    arguments are plain values, passed on to ``super().__init__(**config)`` so a checkpoint can
    rebuild them; ``inference_options`` names those that change predictions but not the trained
    model (a run evaluating a checkpoint may set them anew).
    """

    kind: ClassVar[str] = ""
    stem: ClassVar[str] = "text"
    input_key: ClassVar[str] = "input_ids"
    primary: ClassVar[str] = "acc"
    lower_is_better: ClassVar[frozenset[str]] = frozenset({"loss"})
    inference_options: ClassVar[tuple[str, ...]] = ()
    # options a stored head brings to a task that leaves them unset (a pretrained decoder's start token): how the head
    # was trained to be read, not a shape
    carried_options: ClassVar[tuple[str, ...]] = ()
    label_keys: ClassVar[tuple[str, ...]] = ()  # state entries with one row per label (reordered / reset on reuse)
    # parts of the head a stored one may lack, which then start fresh (a released discriminator's absent generator)
    fresh_parts: ClassVar[tuple[str, ...]] = ()
    exports_trunk: ClassVar[bool] = False  # pretraining: fit ends by writing a trunk directory
    # distillation: the batch key of the raw inputs a teacher with another tokenizer encodes anew (None: a teacher must
    # share the student's tokenizer and reads its batches as they are), and whether soft targets have a last dimension
    # of labels (a teacher's are put in the student's label order, by name)
    raw_input_key: ClassVar[str | None] = None
    targets_by_label: ClassVar[bool] = False
    # False: soft targets that are not one fixed answer per training row (QA's per window, masked-LM's per masked
    # position drawn anew each epoch), which a cache cannot keep by row
    targets_per_row: ClassVar[bool] = True
    onnx_output: ClassVar[str | None] = None  # what ``export_forward`` returns, by name; None: no ONNX export

    def __init__(self, **config) -> None:
        super().__init__()
        for key, value in config.items():  # every objective's dropouts, checked where they are declared, by their name
            if key.endswith("dropout") and not (isinstance(value, (int, float)) and 0 <= value < 1):
                raise ValueError(f"{type(self).__name__}: {key}={value!r} must be a probability in [0, 1).")
        if not 0.0 <= config.get("label_smoothing", 0.0) < 1.0:
            raise ValueError(
                f"{type(self).__name__}: label_smoothing must be in [0, 1), got {config['label_smoothing']}."
            )
        self.config = config
        self.name = ""
        self.label_names: list[str] | None = None
        self.codec: Codec | None = None
        self.delta: TaskDelta | None = None  # the task's delta on a frozen trunk (``add_delta``), kept with its head
        self._file: tuple[str, str] | None = None  # ("update" | "read", file) while one file's metrics are in play
        self._file_metrics: dict[tuple[str, str], dict[str, Metric]] = {}  # (stage, file) -> that file's metrics

    def spec(self) -> dict:
        """The class path and constructor arguments that rebuild this objective (plain values)."""
        import trunk.tasks

        name = type(self).__qualname__  # Trunk's own by their public name, which outlives any file layout
        module = "trunk.tasks" if getattr(trunk.tasks, name, None) is type(self) else type(self).__module__
        return {"class_path": f"{module}.{name}", "init_args": dict(self.config)}

    def stem_options(self) -> dict:
        """Options of the stem this objective's inputs go through (image size, patches ...)."""
        return {}

    # -- building ------------------------------------------------------------------------------------
    def build(self, name: str, trunk: Trunk, info: TaskSpec) -> None:
        """Create the head for the task ``name`` on ``trunk``; ``info`` is what the data says of the task."""
        self.name = name
        self.label_names = list(info.label_names) if info.label_names is not None else None
        self.build_head(trunk.cfg, trunk, info)
        for stage in STAGES:  # one independent set per stage, so epochs of train / val never mix
            setattr(self, f"{stage}_metrics", nn.ModuleDict(self.make_metrics(stage)))

    def build_head(self, cfg: TrunkConfig, trunk: Trunk, info: TaskSpec) -> None:
        raise NotImplementedError

    def add_delta(self, backbone: nn.Module, config: DeltaConfig) -> TaskDelta:
        """Give the task a delta on the frozen ``backbone`` (``model.peft.<task>``), trained and stored with its
        head."""
        self.delta = TaskDelta(backbone, config)
        return self.delta

    def make_metrics(self, stage: str) -> dict[str, Metric]:
        raise NotImplementedError

    def metrics(self, stage: str) -> nn.ModuleDict | dict:
        """The metrics ``loss`` updates and ``compute_metrics`` reads. While a batch of one file of a split read as
        several (``metrics_per_file``) is scored (``in_file``), updates go to the split's metrics and that file's;
        while a file's are computed (``file_metrics``), they are the ones read."""
        overall = getattr(self, f"{stage}_metrics")
        if self._file is None:
            return overall
        mode, file = self._file
        key = (stage, file)
        if key not in self._file_metrics:  # made on first use, on the device of the split's
            self._file_metrics[key] = {name: metric.clone() for name, metric in overall.items()}
            for metric in self._file_metrics[key].values():
                metric.reset()
        own = self._file_metrics[key]
        return own if mode == "read" else {name: _Both(overall[name], own[name]) for name in overall}

    @contextlib.contextmanager
    def in_file(self, file: str | None):
        """Score batches of ``file`` (None: the split is one file) into that file's metrics too."""
        self._file = ("update", file) if file is not None else None
        try:
            yield
        finally:
            self._file = None

    def files(self, stage: str) -> list[str]:
        """The files of ``stage`` whose metrics were kept apart, in the order first seen."""
        return [file for (kept, file) in self._file_metrics if kept == stage]

    def file_metrics(self, stage: str, file: str) -> dict[str, torch.Tensor]:
        """``compute_metrics`` of one file's batches (synced, then reset)."""
        self._file = ("read", file)
        try:
            return self.compute_metrics(stage)
        finally:
            self._file = None

    def connect(self, codec: Codec | None) -> None:
        self.codec = codec

    def set_inference_options(self, options: dict) -> None:
        """Set ``inference_options`` anew on a trained model (a translation's ``target_language`` at predict time); any
        other option is refused by name."""
        wrong = sorted(set(options) - set(self.inference_options))
        if wrong:
            raise ValueError(f"Task '{self.name}' ({type(self).__name__}): {wrong} cannot be set on a trained model; "
                             f"what can: {list(self.inference_options) or 'nothing'}.")
        self._set(options)

    def adopt(self, stored: dict) -> dict:
        """Take a stored head's ``carried_options`` (its objective's init args) that this task leaves unset; returns
        those taken."""
        taken = {k: v for k, v in stored.items() if k in self.carried_options and v is not None
                 and self.config.get(k) is None}
        self._set(taken)
        return taken

    def _set(self, options: dict) -> None:
        """Options changed after construction, kept in ``config`` (what checkpoints store) and on the objective."""
        for key, value in options.items():
            self.config[key] = value
            setattr(self, key, value)

    # -- running ---------------------------------------------------------------------------------------
    def loss(self, trunk: Trunk, batch: dict, stage: str, output=None) -> torch.Tensor:
        """The loss of one batch; updates ``self.metrics(stage)``. ``output``: this batch's ``forward`` output, where
        the caller has it already (a distilled task's step scores it against its teachers too)."""
        raise NotImplementedError

    # -- distillation ------------------------------------------------------------------------------------
    @property
    def distills(self) -> bool:
        """Whether this kind can learn from teachers (it has ``soft_targets`` and ``distill_loss``)."""
        return type(self).soft_targets is not Objective.soft_targets

    def distill_output(self, trunk: Trunk, batch: dict):
        """What a distilled step scores against its labels (``loss``'s ``output``) and its teachers alike: ``forward``'s
        output, or only the positions a kind scores (masked tokens, real target tokens)."""
        return self(trunk, batch)

    def soft_targets(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """What this task's model, as a teacher, answers to a batch: probabilities (per example, word or candidate) or
        values on the data's scale, a form an ensemble's members are averaged in and a student of another tokenizer
        reads."""
        raise NotImplementedError(f"{type(self).__name__} has no distillation loss")

    def distill_loss(self, output, targets: torch.Tensor, batch: dict, temperature: float) -> torch.Tensor:
        """The student's loss against its teachers' (averaged) ``soft_targets``, from its ``forward`` ``output``."""
        raise NotImplementedError

    def predict(self, trunk: Trunk, batch: dict) -> list[dict]:
        """One JSON-ready record per example: by default ``records`` of ``export_forward``'s output, so the graph
        run elsewhere (ONNX Runtime) gives the same records. Kinds whose records need more than one output override
        it."""
        return self.records(batch, self.export_forward(trunk, batch[self.input_key], batch.get("attention_mask")))

    def records(self, batch: dict, output: torch.Tensor) -> list[dict]:
        """The records of a batch from its ``onnx_output`` (what ``export_forward`` returns)."""
        raise NotImplementedError

    def samples(self, trunk: Trunk, batch: dict) -> list[dict]:
        """One record per example of a labelled batch: the input, the gold answer and the prediction, for the
        prediction tables of validation (``PredictionSamples``). Values are strings and numbers (and a
        ``wandb_image`` tensor for images). None: the task has no such table (pretraining)."""
        return []

    def export_forward(self, trunk: Trunk, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The task's ``onnx_output`` from token ids alone: the graph ``trunk export --onnx`` writes."""
        return self(trunk, {self.input_key: input_ids, "attention_mask": attention_mask})

    def encode(self, trunk: Trunk, batch: dict) -> torch.Tensor:
        """The trunk's output for this task's inputs: (B, T, C)."""
        return trunk(batch[self.input_key], batch.get("attention_mask"), stem=self.stem)

    def compute_metrics(self, stage: str) -> dict[str, torch.Tensor]:
        """The epoch's metrics of ``stage`` (synced across processes), then reset; {} when none was updated."""
        values: dict[str, torch.Tensor] = {}
        for name, metric in self.metrics(stage).items():
            if not metric.update_called:
                continue
            value = metric.compute()
            values.update({k: v for k, v in value.items()} if isinstance(value, dict) else {name: value})
            metric.reset()
        # scalars (a confusion matrix is read by confusion()), floating: torchmetrics' MCC of a perfect binary epoch is
        # an integer tensor, which Lightning warns about when it logs it
        return {k: v if v.is_floating_point() else v.float() for k, v in values.items() if v.ndim == 0}

    def epoch_warnings(self, stage: str) -> list[str]:
        """Problems the epoch's metrics show that a number alone hides (a classifier predicting one class
        for everything), before ``compute_metrics`` resets them. Every process calls it (metrics sync)."""
        return []

    def score(self, values: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """This task's share of the run's ``<stage>/score``: its primary metric, negated when lower is better
        (so the score is always higher-is-better); None when the primary was not computed."""
        if self.primary not in values:
            return None
        value = values[self.primary].float()
        return -value if self.primary in self.lower_is_better else value

    def confusion(self, stage: str) -> torch.Tensor | None:
        """The epoch's (gold, predicted) count matrix so far, synced across processes (every process must
        call this); None for tasks without one."""
        metrics = self.metrics(stage)
        metric = metrics["confusion"] if "confusion" in metrics else None  # noqa: SIM401 (a ModuleDict has no get)
        return metric.compute() if metric is not None and metric.update_called else None

    # -- heads that carry over ------------------------------------------------------------------------
    def head_state(self) -> dict[str, torch.Tensor]:
        """What a trunk directory stores of this task (metrics hold no persistent state)."""
        return {k: v for k, v in self.state_dict().items() if not is_metric_state(k)}

    def head_meta(self) -> dict:
        """What a trunk directory stores of this task beside its weights; ``peft``: its delta's options."""
        return {"kind": self.kind, "label_names": self.label_names, "objective": self.spec(),
                **({"peft": dataclasses.asdict(self.delta.config)} if self.delta is not None else {})}

    def load_head(self, state: dict[str, torch.Tensor], label_names: list[str] | None, reinit_mismatched: bool,
                  source: str, label_map: dict[str, str] | None = None, keep_shared_labels: bool = False) -> str | None:
        """Load a stored head. Per-label rows follow the labels by *name* (any order); ``label_map`` pairs this
        task's names with stored ones that differ ({person: PER}; for tags, by type: B-person takes B-PER's row).
        Another label set: with ``keep_shared_labels`` the rows of labels in both are kept, new labels start
        fresh and stored-only ones are dropped; with ``reinit_mismatched`` the whole classifier starts fresh;
        else an error. Returns how the labels were matched, when not one to one."""
        state = dict(state)
        how = None
        if label_map and label_names is not None and self.label_names is not None:
            _check_label_map(self.name, label_map, self.label_names, label_names)
        # this task's labels as stored
        stored = [_stored_name(name, label_map or {}) for name in self.label_names or []]
        if self.label_keys and label_names is not None and self.label_names is not None and label_names != stored:
            shared = [i for i, name in enumerate(stored) if name in label_names]
            if sorted(label_names) == sorted(stored):
                order = torch.tensor([label_names.index(name) for name in stored])
                state.update({k: state[k][order] for k in self.label_keys if k in state})
                how = f"label rows matched by name to {self.label_names}"
            elif keep_shared_labels and shared:
                own = self.head_state()
                for k in self.label_keys:
                    if k in state:
                        rows = own[k].clone()
                        rows[shared] = state[k][[label_names.index(stored[i]) for i in shared]].to(rows.dtype)
                        state[k] = rows
                kept = [self.label_names[i] for i in shared]
                fresh = [name for i, name in enumerate(self.label_names) if i not in shared]
                dropped = [name for name in label_names if name not in stored]
                alike = alike_across(fresh, dropped)
                how = f"label rows kept for {kept}, fresh for {fresh}, dropped for {dropped}" + \
                    (f" ({alike}: normalize_labels: nfkc, or model.label_map, pairs them)" if alike else "")
            elif reinit_mismatched:
                own = self.head_state()
                state.update({k: own[k] for k in self.label_keys})
                how = f"a fresh classifier: trained on {label_names}, now {self.label_names}"
            else:
                alike = alike_across(stored, label_names)
                raise ValueError(
                    f"Task '{self.name}': the head in '{source}' was trained on the labels {label_names}, but this "
                    f"run's data has {self.label_names}{f' (some only look the same: {alike})' if alike else ''}. "
                    "Set model.reinit_mismatched_heads=true to keep the rest of "
                    "the head and start its classifier afresh, model.keep_shared_labels=true to keep the rows of the "
                    "labels in both (pair names that differ with model.label_map), or give the task another name to "
                    "start a new head."
                )
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [k for k in missing if not is_metric_state(k)]
        fresh = sorted({k.split(".")[0] for k in missing if k.startswith(self.fresh_parts)})
        missing = [k for k in missing if not k.startswith(self.fresh_parts)]
        if fresh:
            how = ", ".join([*([how] if how else []), f"its {' and '.join(fresh)} fresh"])
        if missing or unexpected:
            raise ValueError(
                f"Task '{self.name}': the head in '{source}' does not fit this objective (missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}). Were they trained with other head options?"
            )
        return how


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0,
                  weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over the last dimension, labels equal to IGNORE_INDEX skipped: F.cross_entropy's, except
    that label smoothing spreads a target's share over the row's candidates only. Entries scored -inf (padding, a row's
    missing choices) are none: F.cross_entropy's smoothing would give them mass, and the loss would be infinite."""
    logits = logits.float()
    if not label_smoothing:
        return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), weight=weight, ignore_index=IGNORE_INDEX)
    labels = labels.flatten()
    kept = labels != IGNORE_INDEX
    logp, labels = logits.flatten(0, -2)[kept].log_softmax(-1), labels[kept]
    candidates = logp > float("-inf")
    weight = torch.ones_like(logp[0]) if weight is None else weight.to(logp)
    nll = -logp.gather(-1, labels[:, None]).squeeze(-1) * weight[labels]
    # -log p, averaged over candidates
    spread = -(logp.masked_fill(~candidates, 0.0) * weight).sum(-1) / candidates.sum(-1)
    return ((1 - label_smoothing) * nll + label_smoothing * spread).sum() / weight[labels].sum()


def soft_cross_entropy(logits: torch.Tensor, probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Hinton et al.'s distillation loss over the last dimension, averaged over rows: KL(teacher || student), both
    softened by ``temperature`` (the teacher's probabilities p as p^(1/T), normalised) and scaled by T^2, so its
    gradients keep their size as T changes. Entries a teacher gives no probability (a row's missing candidates,
    scored -inf by the student too) count nothing."""
    logp = (logits.float() / temperature).log_softmax(-1)
    target = (probs.float().clamp_min(1e-30).log() / temperature).masked_fill(probs <= 0, float("-inf")).softmax(-1)
    kl = torch.where(target > 0, target * (target.clamp_min(1e-30).log() - logp), 0.0).sum(-1)
    return kl.mean() * temperature**2


def is_metric_state(key: str) -> bool:
    return key.startswith(tuple(f"{stage}_metrics." for stage in STAGES))


def batch_size(batch: dict) -> int:
    """The number of examples in a batch (for averaging logged values)."""
    for key in ("labels", "input_ids", "pixel_values"):
        if key in batch:
            return len(batch[key])
    raise KeyError(f"Cannot tell the batch size of a batch with keys {sorted(batch)}.")


def _check_label_map(task: str, label_map: dict[str, str], ours: list[str], stored: list[str]) -> None:
    """Every ``label_map`` entry pairs a label (or tag type) of this task with one of the stored head; one that names
    neither would be ignored, silently; one that only looks like a label says how it differs."""
    def with_types(names: list[str]) -> set[str]:
        return set(names) | {name.partition("-")[2] for name in names if "-" in name}

    for side, names, known, whose in (("keys", list(label_map), with_types(ours), "this task's labels"),
                                      ("values", list(label_map.values()), with_types(stored), "the stored head's")):
        unknown = sorted(set(map(str, names)) - known)
        if unknown:
            alike = alike_across(unknown, known)
            raise ValueError(f"Task '{task}': model.label_map's {side} {unknown} are not among {whose} "
                             f"{sorted(known)}{f' (they only look so: {alike})' if alike else ''}. Map this task's "
                             "labels (or tag types) to the stored head's.")


def _stored_name(name: str, label_map: dict[str, str]) -> str:
    """A label's name in a stored head, by ``label_map`` ({new: stored}); a tag maps by its type (B-person -> B-PER)."""
    if name in label_map:
        return label_map[name]
    prefix, _, kind = name.partition("-")
    return f"{prefix}-{label_map[kind]}" if kind and kind in label_map else name


class _Both:
    """A metric update that goes to two metrics: the split's and one file's (the inputs are computed once)."""

    def __init__(self, split: Metric, file: Metric) -> None:
        self.split, self.file = split, file

    def update(self, *args, **kwargs) -> None:
        self.split.update(*args, **kwargs)
        self.file.update(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.split, name)
