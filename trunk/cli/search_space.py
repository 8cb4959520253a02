"""A search space for ``trunk tune``: a YAML file of config paths (any option ``trunk fit`` takes) and how to draw each.

    model.optimizer.lr: {log_uniform: [1.0e-5, 1.0e-3]}
    trainer.max_epochs: {int: [2, 4]}
    model.tasks.sst2.init_args.pooling: {choice: [cls, mean]}
    model.optimizer.schedule: {choice: [linear, cosine, constant]}
    model.optimizer.warmup: {uniform: [0.0, 0.2], step: 0.05, when: {model.optimizer.schedule: [linear, cosine]}}

Keys may also nest (``model: {optimizer: {lr: {log_uniform: [...]}}}``). ``when`` draws an entry only where the named
entries drew the given value (or one of a list of values). Drawn through Optuna's define-by-run trial, so a sampler
sees conditional entries as they are. Hand-written: Optuna has no file format for spaces."""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KINDS = ("uniform", "log_uniform", "int", "choice")
OPTIONS = {"uniform": {"step"}, "log_uniform": set(), "int": {"step", "log"}, "choice": set()}


class SpaceError(ValueError):
    """A search space that cannot be drawn from: the message says which entry and the fix."""


@dataclass(frozen=True)
class Entry:
    path: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    log: bool = False
    choices: tuple = ()
    when: dict[str, tuple] = field(default_factory=dict)

    def describe(self) -> dict:
        """The entry as the space file wrote it (what a study records, and compares on resume)."""
        drawn = {self.kind: list(self.choices) if self.kind == "choice" else [self.low, self.high]}
        drawn.update({"step": self.step} if self.step is not None else {})
        drawn.update({"log": True} if self.log and self.kind == "int" else {})
        drawn.update({"when": {k: list(v) for k, v in self.when.items()}} if self.when else {})
        return drawn

    def draw(self, trial) -> Any:
        if self.kind == "choice":
            return trial.suggest_categorical(self.path, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.path, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(self.path, self.low, self.high, step=self.step, log=self.kind == "log_uniform")


def _entry(path: str, spec: dict) -> Entry:
    kinds = [k for k in KINDS if k in spec]
    where = f"search space entry {path}"
    if len(kinds) != 1:
        raise SpaceError(f"{where}: {spec} names {'no' if not kinds else 'more than one'} way to draw it; give one of "
                         f"{', '.join(KINDS)} (e.g. {path}: {{uniform: [0.0, 0.3]}}).")
    kind, values = kinds[0], spec[kinds[0]]
    unknown = set(spec) - {kind, "when"} - OPTIONS[kind]
    if unknown:
        raise SpaceError(f"{where}: {kind} takes {sorted(OPTIONS[kind] | {'when'}) or 'nothing'} beside its values, "
                         f"not {sorted(unknown)}.")
    when = {key: tuple(v if isinstance(v, list) else [v]) for key, v in (spec.get("when") or {}).items()}
    if kind == "choice":
        if not isinstance(values, list) or not values:
            raise SpaceError(f"{where}: choice takes a non-empty list of values (e.g. {{choice: [cls, mean]}}).")
        return Entry(path, kind, choices=tuple(values), when=when)
    if not (isinstance(values, list) and len(values) == 2 and all(_number(v) for v in values)):
        raise SpaceError(f"{where}: {kind} takes [low, high], two numbers (got {values!r}).")
    low, high = values
    if kind == "int" and not all(float(v).is_integer() for v in values):
        raise SpaceError(f"{where}: int takes whole numbers (got {values}); use uniform for a real range.")
    if low > high:
        raise SpaceError(f"{where}: low {low} is above high {high}; write [{high}, {low}].")
    log = kind == "log_uniform" or bool(spec.get("log"))
    if log and low <= 0:
        raise SpaceError(f"{where}: a log range needs both ends above zero (got [{low}, {high}]); start it at a small "
                         f"positive value (e.g. [{high / 1000:g}, {high}]) or draw it uniform.")
    step = spec.get("step")
    if step is not None and (not _number(step) or step <= 0 or (kind == "int" and not float(step).is_integer())):
        raise SpaceError(f"{where}: step must be a positive {'whole ' if kind == 'int' else ''}number (got {step!r}).")
    if kind == "int":
        low, high, step = int(low), int(high), None if step is None else int(step)
    else:
        low, high = float(low), float(high)
    return Entry(path, kind, low, high, step, log, when=when)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _flatten(tree: dict, prefix: str = "") -> dict[str, dict]:
    """Nested keys to dotted paths, down to the dicts that name a way to draw."""
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if not isinstance(value, dict):
            raise SpaceError(f"search space entry {path}: {value!r} is not a range; write e.g. "
                             f"{path}: {{choice: [{value}]}} (one of {', '.join(KINDS)}).")
        if any(k in value for k in KINDS) or not any(isinstance(v, dict) for v in value.values()):
            flat[path] = value  # a way to draw (one misspelt is named as such by _entry)
        else:
            flat.update(_flatten(value, path + "."))
    return flat


@dataclass(frozen=True)
class SearchSpace:
    entries: tuple[Entry, ...]

    @classmethod
    def from_dict(cls, tree: dict) -> SearchSpace:
        if not isinstance(tree, dict) or not tree:
            raise SpaceError("the search space is empty: give at least one entry, e.g. "
                             "model.optimizer.lr: {log_uniform: [1.0e-5, 1.0e-3]}.")
        entries = tuple(_entry(path, spec) for path, spec in _flatten(tree).items())
        by_path = {e.path: e for e in entries}
        for entry in entries:
            for key, values in entry.when.items():
                if key not in by_path or key == entry.path:
                    raise SpaceError(f"search space entry {entry.path}: `when` names {key}, which is not another "
                                     f"entry of the space (its entries: {', '.join(by_path)}).")
                options = by_path[key].choices
                if options and (missing := [v for v in values if v not in options]):
                    raise SpaceError(f"search space entry {entry.path}: `when` asks {key} for {missing}, which it "
                                     f"never draws (its choices: {list(options)}).")
        space = cls(entries)
        space.order()  # no circles
        return space

    @classmethod
    def from_file(cls, path: str | Path) -> SearchSpace:
        try:
            tree = yaml.safe_load(Path(path).read_text())
        except OSError as err:
            raise SpaceError(f"cannot read the search space {path}: {err.strerror or err}.") from err
        except yaml.YAMLError as err:
            raise SpaceError(f"the search space {path} is not valid YAML: {str(err).splitlines()[0]}.") from err
        return cls.from_dict(tree)

    def describe(self) -> dict:
        return {e.path: e.describe() for e in self.entries}

    def draw(self, trial) -> dict[str, Any]:
        """One setting per entry whose conditions hold; an entry is drawn after the entries its conditions name."""
        drawn: dict[str, Any] = {}
        for entry in self.order():
            if all(drawn.get(key, _MISSING) in values for key, values in entry.when.items()):
                drawn[entry.path] = entry.draw(trial)
        return drawn

    def order(self) -> list[Entry]:
        """The entries, each after those its ``when`` names; conditions in a circle are refused."""
        ordered, pending = [], list(self.entries)
        while pending:
            ready = next((e for e in pending if all(k in {o.path for o in ordered} for k in e.when)), None)
            if ready is None:
                raise SpaceError("search space: the `when` conditions of " + ", ".join(e.path for e in pending)
                                 + " name each other in a circle; each entry can only depend on entries drawn before.")
            pending.remove(ready)
            ordered.append(ready)
        return ordered

    @property
    def paths(self) -> list[str]:
        return [e.path for e in self.entries]

    def check_paths(self, known: set[str]) -> SearchSpace:
        """Each path must be an option of the recipe (``known``: its parsed config's dotted keys). A task option written
        without ``init_args`` is taken as the one with it. Returns the space with the paths as the config has them."""
        fixed = []
        for entry in self.entries:
            path = entry.path if entry.path in known else _with_init_args(entry.path, known)
            if path is None:
                near = difflib.get_close_matches(entry.path, sorted(known), n=1, cutoff=0.5)
                hint = f"; the nearest is {near[0]}" if near else ""
                raise SpaceError(f"search space entry {entry.path} is not an option of this recipe{hint} "
                                 "(`trunk fit --config RECIPE --print_config` lists them all).")
            fixed.append(dataclasses.replace(entry, path=path))
        renamed = {e.path: f.path for e, f in zip(self.entries, fixed)}
        return SearchSpace(tuple(dataclasses.replace(f, when={renamed.get(k, k): v for k, v in f.when.items()})
                                 for f in fixed))


_MISSING = object()


def _with_init_args(path: str, known: set[str]) -> str | None:
    parts = path.split(".")
    for i in range(1, len(parts)):
        candidate = ".".join([*parts[:i], "init_args", *parts[i:]])
        if candidate in known:
            return candidate
    return None


def differences(stored: dict, given: dict) -> list[str]:
    """How the space a study was created with differs from the one given now, one phrase per entry."""
    said = [f"{path} is new" for path in given if path not in stored]
    said += [f"{path} is gone" for path in stored if path not in given]
    said += [f"{path} was {stored[path]}, now {given[path]}" for path in given
             if path in stored and stored[path] != given[path]]
    return said


def flat_keys(config, prefix: str = "") -> set[str]:
    """The dotted keys of a parsed config (jsonargparse Namespaces and dicts), every level."""
    items = config.items() if isinstance(config, dict) else vars(config).items()
    keys = set()
    for key, value in items:
        path = f"{prefix}{key}"
        keys.add(path)
        if isinstance(value, dict) or type(value).__name__ == "Namespace":
            keys |= flat_keys(value, path + ".")
    return keys
