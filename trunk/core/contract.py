"""The run contract: what the model must know of each task's data, decided once per run by
``trunk.assembly.run.resolve`` and saved with the model (a checkpoint's ``hyper_parameters.task_info``)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def check_task_names(names) -> None:
    """A task's name is a key of the config, of metric names (``val/<task>/acc``) and of file names in the run's folder:
    an identifier (letters, digits, ``_`` and ``-``; not a path, which would write outside the run)."""
    bad = [name for name in names if not (isinstance(name, str) and TASK_NAME.fullmatch(name))]
    if bad:
        raise ValueError(
            f"Task names {bad} are not identifiers: a task name is letters, digits, '_' and '-', starting with a "
            "letter or '_' (e.g. sst2, conll_ner). Rename the task in model.tasks and data.tasks."
        )


@dataclass(frozen=True)
class TaskSpec:
    """One task's facts, as the data reports them (``TaskData.info``) after any reconciliation with a trained model.

    kinds: the objective kinds the data can feed (None: not checked); stem: the trunk stem its inputs take;
    label_names: the labels in the order of the ids batches carry; max_length / target_max_length: the
    longest inputs / translation targets; target_vocab_size: a translation task's own target vocabulary;
    statistics: figures of the training split an objective uses (``label_counts`` for balanced class
    weights, ``target_mean`` / ``target_std`` for standardised regression targets); None without one."""

    kinds: tuple[str, ...] | None = None
    stem: str = "text"
    label_names: tuple[str, ...] | None = None
    max_length: int | None = None
    target_max_length: int | None = None
    target_vocab_size: int | None = None
    statistics: dict | None = None

    @classmethod
    def of(cls, value: TaskSpec | dict | None) -> TaskSpec:
        """A spec from itself or its stored dict form (fields a later version added are ignored)."""
        if isinstance(value, TaskSpec):
            return value
        known = {f.name for f in fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in (value or {}).items() if k in known}
        return cls(**values)

    def to_dict(self) -> dict:
        """Plain values (lists, not tuples), as checkpoints store them."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def loss_weights(weights: dict[str, float], objectives: dict) -> dict[str, float]:
    """Every task's loss weight (``model.task_weights``; 1 where not given), checked."""
    unknown = sorted(set(weights) - set(objectives))
    if unknown:
        raise ValueError(f"model.task_weights names {unknown}, which are not tasks of this run {sorted(objectives)}.")
    bad = {k: v for k, v in weights.items() if not v >= 0}
    if bad:
        raise ValueError(f"model.task_weights must be >= 0, got {bad}.")
    return {name: float(weights.get(name, 1.0)) for name in objectives}


def pair_specs(objectives: dict, task_info: dict[str, TaskSpec | dict] | None) -> dict[str, TaskSpec]:
    """Each task's spec: the model's tasks (name -> objective) and the data's must be the same, each objective fed by
    data of its kind (``objective.kind`` among the spec's ``kinds``)."""
    if not objectives:
        raise ValueError("model.tasks is empty: name at least one task and its objective.")
    task_info = {name: TaskSpec.of(spec) for name, spec in (task_info or {name: None for name in objectives}).items()}
    if set(task_info) != set(objectives):
        raise ValueError(
            f"model.tasks names {sorted(objectives)} but data.tasks names {sorted(task_info)}: every task needs both "
            "an objective (model.tasks.<name>) and data (data.tasks.<name>), under the same name."
        )
    for name, objective in objectives.items():
        kinds = task_info[name].kinds
        if kinds is not None and objective.kind not in kinds:
            raise ValueError(
                f"Task '{name}': its data feeds {' or '.join(kinds)} objectives, but model.tasks.{name} is "
                f"{type(objective).__name__} ({objective.kind}). Pair each objective with data of its kind."
            )
    return task_info
