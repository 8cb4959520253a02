"""The recipe files, read once before LightningCLI parses them: not YAML, a key given twice (PyYAML would keep the
last silently), or a later file's ``model.tasks`` / ``data.tasks`` replacing an earlier file's whole: each a one-line
error."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml


def _repeated_key(node: yaml.Node) -> yaml.Node | None:
    """The first key given twice in one mapping of a composed YAML tree (PyYAML keeps the last one silently)."""
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key, _ in node.value:
            if key.value in seen:
                return key  # the second one: the line to fix
            seen.add(key.value)
        children = [value for _, value in node.value]
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
    return next((found for child in children if (found := _repeated_key(child)) is not None), None)


def check_config_files(args: list[str]) -> None:
    """Fail clearly on a config file that is not YAML, names a task (or any key) twice, or drops an earlier file's
    tasks, before LightningCLI reads it: each file is read once here."""
    paths = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"] + [
        a.split("=", 1)[1] for a in args if a.startswith("--config=")
    ]
    named: dict[str, tuple[str, set]] = {}  # section -> (the file that set its tasks, their names)
    for path in paths:
        if not Path(path).is_file():
            continue  # LightningCLI reports it
        try:
            tree = yaml.compose(Path(path).read_text(), Loader=yaml.SafeLoader)  # nodes only: nothing is constructed
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            sys.exit(
                f"error: {path}{where}: not valid YAML ({getattr(err, 'problem', None) or err}). Fix the file's syntax "
                "(indentation, a missing ':' or closing bracket)."
            )
        except UnicodeDecodeError:
            sys.exit(f"error: {path} is not UTF-8 text: a config must be a YAML text file.")
        repeated = _repeated_key(tree) if tree is not None else None
        if repeated is not None:
            sys.exit(
                f"error: {path}, line {repeated.start_mark.line + 1}: the key {repeated.value!r} appears twice. Task "
                "names (and every other key) must be unique: rename one of them."
            )
        # A later file's model.tasks / data.tasks replaces the earlier files' whole (the parser does not merge dicts):
        # a preset that adds a task would silently drop the recipe's. (Command-line --model.tasks.<name> adds.)
        for section in ("model", "data"):
            tasks = _mapping_keys(tree, section, "tasks")
            if tasks is None:
                continue
            earlier, names = named.get(section, ("", set()))
            if names - set(tasks):
                sys.exit(
                    f"error: {path} sets {section}.tasks, which replaces the {section}.tasks of {earlier} whole "
                    f"(config files do not merge them), so {sorted(names - set(tasks))} would not be trained. Name "
                    f"every task in the later file, or add a task on the command line (--{section}.tasks.<name>=...)."
                )
            named[section] = (str(path), set(tasks))


def _mapping_keys(node: yaml.Node | None, *path: str) -> list[str] | None:
    """The keys of the mapping at ``path`` in a composed YAML tree; None where there is none."""
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        node = next((value for k, value in node.value if k.value == key), None)
    return [k.value for k, _ in node.value] if isinstance(node, yaml.MappingNode) else None
