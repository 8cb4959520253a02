"""The task kinds: each objective paired with the data class that feeds it, in one table that the run, the tests
(tests/kinds.py) and the README's table of kinds (tests/test_architecture.py) read. A data class says which
objective kinds it feeds (``TaskData.kinds``); this table is their index, so a new kind is its objective's file,
its data class and one line here (docs/architecture.md)."""

from __future__ import annotations

import inspect
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


EXAMPLES = {Objective: "trunk.tasks.SequenceClassification", TaskData: "trunk.datamodules.TextClassificationData"}


def stored_class(class_path: str, base: type, source: str | None = None) -> type:
    """The class a stored file (a checkpoint, a trunk or task directory, a download) or a config names, found among
    the ``base`` classes already loaded: Trunk's own (this module imports them all) and those the user's code or
    config imported. Naming a class imports nothing and calls nothing, so a crafted file cannot run code through it
    (docs/reliability.md, the threat model). ``source``: the file that names it, for the message."""
    cls = _find(class_path, base)
    if cls is None:
        other = next((b for b in EXAMPLES if b is not base and _find(class_path, b) is not None), None)
        what = f" (it is a {other.__name__} class, where an {base.__name__} class belongs)" if other else ""
        raise ValueError(f"{f'{source!r}: ' if source else ''}{class_path!r} is not a {base.__name__} class Trunk "
                         f"knows{what}: a stored file may name only Trunk's own {base.__name__} classes (e.g. "
                         f"{EXAMPLES.get(base, base.__name__)}) or one your code has imported. For your own class, "
                         "import its module before loading, or name it in your config (class_path).")
    return cls


def _find(class_path: str, base: type) -> type | None:
    known = loaded_subclasses(base)
    cls = known.get(class_path)
    if cls is None and class_path.startswith("trunk."):  # stored when Trunk's classes lived elsewhere: by name
        name = class_path.rpartition(".")[2]
        cls = next((c for path, c in known.items() if path.startswith("trunk.") and c.__name__ == name), None)
    return cls


def accepted_options(cls: type, base: type) -> set[str] | None:
    """The options ``cls(...)`` takes by name, through the ``**kwargs`` its ``__init__`` hands to its parents' (an
    objective's base records them only); None: any."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is Objective:
            return names
        params = inspect.signature(init).parameters
        names |= {n for n, p in params.items() if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return names
    return None


def stored_spec_class(spec: dict, base: type, source: str | None = None, what: str = "") -> type:
    """The class of a stored ``{"class_path", "init_args"}``, after checking that it takes those options: a file that
    names another class than its options were written for (a token classifier's class for a sequence classifier's
    head) is refused naming the file, the class and which of Trunk's classes take them."""
    if not isinstance(spec, dict) or not isinstance(spec.get("class_path"), str):
        raise ValueError(f"{f'{source!r}: ' if source else ''}{what or 'a stored class'} is {spec!r}, not a "
                         "{class_path, init_args} entry. Use the file as Trunk wrote it.")
    cls = stored_class(spec["class_path"], base, source)
    options = spec.get("init_args") or {}
    accepted = accepted_options(cls, base)
    unknown = sorted(set(options) - accepted) if accepted is not None else []
    if unknown:
        kinds = [kind.objective if base is Objective else kind.data for kind in KINDS.values()]
        takers = sorted({c.__name__ for c in kinds if (accepted_options(c, base) or set()) >= set(options)})
        by = f"; they are options of {', '.join(takers[:3])}" if takers else ""
        raise ValueError(f"{f'{source!r} stores ' if source else ''}{what or 'a class'} as {spec['class_path']} with "
                         f"the options {unknown}, which {cls.__name__} does not take{by}: the file names another class "
                         "than its options were written for. Use the file as Trunk wrote it, or give the task's class "
                         "in your config.")
    return cls


def check_stored_tasks(source: str, objectives: dict[str, dict], data: dict[str, dict | None],
                       kinds: dict[str, str] | None = None) -> None:
    """Before anything is built from a stored file: each task's objective and data class exist, take their stored
    options, and fit together and with the stored head's kind (``kinds``); one line naming the file, the stored class
    and what it must be."""
    for task, spec in objectives.items():
        objective = stored_spec_class(spec, Objective, source, f"task '{task}''s objective")
        kind = (kinds or {}).get(task)
        if kind and kind != objective.kind:
            wanted = KINDS[kind].objective if kind in KINDS else None
            raise ValueError(f"{source!r} stores task '{task}''s head as a {kind} head and its objective as "
                             f"{spec['class_path']} ({objective.kind}): it must be "
                             f"{wanted.__name__ if wanted else f'a {kind} objective'}. Use the file as Trunk wrote it.")
        if data.get(task):
            feeder = stored_spec_class(data[task], TaskData, source, f"task '{task}''s data")
            if objective.kind not in feeder.kinds:
                wanted = KINDS[objective.kind].data.__name__ if objective.kind in KINDS else "a data class of its kind"
                raise ValueError(f"{source!r} stores task '{task}''s data as {data[task]['class_path']}, which feeds "
                                 f"{list(feeder.kinds)}; its objective {spec['class_path']} ({objective.kind}) needs "
                                 f"{wanted}. Use the file as Trunk wrote it.")


def objective_class(class_path: str) -> type[Objective]:
    return stored_class(class_path, Objective)


def as_objective(value) -> Objective:
    """An objective from itself or from its stored ``{"class_path", "init_args"}`` form."""
    if isinstance(value, Objective):
        return value
    if isinstance(value, dict) and "class_path" in value:
        return stored_spec_class(value, Objective)(**value.get("init_args", {}))
    raise TypeError(f"model.tasks entries must be objectives (class_path + init_args), got {value!r}.")
