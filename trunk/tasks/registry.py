"""The task kinds: each objective paired with the data class that feeds it, in one table that the run, the tests
(tests/kinds.py) and the README's table of kinds (tests/test_architecture.py) read. A data class says which
objective kinds it feeds (``TaskData.kinds``); this table is their index, so a new kind is its objective's file,
its data class and one line here (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass

from trunk.datamodules import (
    CorpusData,
    ImageClassificationData,
    MultiLabelTextData,
    MultipleChoiceData,
    QuestionAnsweringData,
    TextClassificationData,
    TextRegressionData,
    TokenClassificationData,
    TranslationData,
)
from trunk.datamodules.text import TaskData
from trunk.models import STEM_KINDS
from trunk.tasks import objectives as o
from trunk.tasks.objectives import Objective


@dataclass(frozen=True)
class TaskKind:
    objective: type[Objective]
    data: type[TaskData]


KINDS: dict[str, TaskKind] = {objective.kind: TaskKind(objective, data) for objective, data in (
    (o.SequenceClassification, TextClassificationData),
    (o.SequenceRegression, TextRegressionData),
    (o.MultiLabelClassification, MultiLabelTextData),
    (o.MultipleChoice, MultipleChoiceData),
    (o.ExtractiveQuestionAnswering, QuestionAnsweringData),
    (o.TokenClassification, TokenClassificationData),
    (o.MaskedLanguageModeling, CorpusData),
    (o.ReplacedTokenDetection, CorpusData),
    (o.Translation, TranslationData),
    (o.ImageClassification, ImageClassificationData),
)}


def stems_of(objectives: dict[str, Objective]) -> dict[str, dict]:
    """The stems the tasks read, with their options: one text stem, one image stem (the tasks must agree on its
    options), in ``STEM_KINDS`` order."""
    stems: dict[str, dict] = {}
    for name, objective in objectives.items():
        options = objective.stem_options()
        if objective.stem in stems and stems[objective.stem] != options:
            raise ValueError(
                f"Task '{name}' needs an {objective.stem} stem with {options}, but another task of the run needs "
                f"{stems[objective.stem]}: the tasks share one stem, so give them the same options."
            )
        stems[objective.stem] = options
    return dict(sorted(stems.items(), key=lambda item: STEM_KINDS.index(item[0])))


def loaded_subclasses(base: type) -> dict[str, type]:
    """Every class deriving from ``base`` whose module has been imported, by its class path."""
    found, todo = {}, list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        todo += cls.__subclasses__()
    return found


def stored_class(class_path: str, base: type) -> type:
    """The class a stored file (a checkpoint, a trunk or task directory, a download) or a config names, found among
    the ``base`` classes already loaded: Trunk's own (this module imports them all) and those the user's code or
    config imported. Naming a class imports nothing and calls nothing, so a crafted file cannot run code through it
    (docs/reliability.md, the threat model)."""
    known = loaded_subclasses(base)
    cls = known.get(class_path)
    if cls is None and class_path.startswith("trunk."):  # stored when Trunk's classes lived elsewhere: by name
        name = class_path.rpartition(".")[2]
        cls = next((c for path, c in known.items() if path.startswith("trunk.") and c.__name__ == name), None)
    if cls is None:
        raise ValueError(f"{class_path!r} is not a {base.__name__} class Trunk knows: a stored file may name only "
                         "Trunk's own (e.g. trunk.tasks.SequenceClassification, trunk.datamodules."
                         "TextClassificationData) or a class your code has imported. For your own class, import its "
                         "module before loading, or name it in your config (class_path).")
    return cls


def objective_class(class_path: str) -> type[Objective]:
    return stored_class(class_path, Objective)


def as_objective(value) -> Objective:
    """An objective from itself or from its stored ``{"class_path", "init_args"}`` form."""
    if isinstance(value, Objective):
        return value
    if isinstance(value, dict) and "class_path" in value:
        return objective_class(value["class_path"])(**value.get("init_args", {}))
    raise TypeError(f"model.tasks entries must be objectives (class_path + init_args), got {value!r}.")
