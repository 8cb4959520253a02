"""The floors of the house (docs/architecture.md): every import of a ``trunk`` module, at the top of a file or inside a
function, goes to its own floor or one below, and no modules import each other in a circle. Read from the source
(``ast``), so it holds for imports that only run on some paths too."""

import ast
from pathlib import Path

from conftest import REPO

# Bottom up; a floor may import the floors before it. tasks and datamodules share a level in the design notes; tasks
# (objectives) read datamodules' batch contract, never the other way, so datamodules sit first.
FLOORS = ["core", "models", "datamodules", "tasks", "formats", "training", "assembly", "inference", "cli"]
PACKAGE = REPO / "trunk"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def trunk_imports(path: Path) -> set[str]:
    """The ``trunk.*`` modules (or names in them) a file imports anywhere."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("trunk.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trunk.") and node.level == 0:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # a submodule, or a name in the module
    return found


def floor(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else None


def known(name: str, modules: set[str]) -> str | None:
    """The module ``name`` is, or the module it is a name in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def graph() -> dict[str, set[str]]:
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(files)
    # A module's own packages are not counted: Python runs a package's face before any file in it, whatever it imports.
    return {
        name: {
            m
            for m in (known(i, modules) for i in trunk_imports(path))
            if m and not (name == m or name.startswith(m + "."))
        }
        for name, path in files.items()
    }


def test_every_module_is_on_a_floor():
    assert {name for name in graph() if name != "trunk" and floor(name) is None} == set()


def test_imports_run_downward_only():
    upward = sorted(f"{name} -> {target}" for name, targets in graph().items() if name != "trunk" for target in targets
                    if FLOORS.index(floor(target)) > FLOORS.index(floor(name)))
    assert upward == []


def test_no_modules_import_each_other_in_a_circle():
    edges = graph()
    circles = []

    def reach(start: str, node: str, path: list[str], seen: set[str]) -> None:
        for target in edges.get(node, ()):
            if target == start:
                circles.append(" -> ".join([*path, start]))
            elif target not in seen and target > start:  # each circle once, from its smallest module
                seen.add(target)
                reach(start, target, [*path, target], seen)

    for name in sorted(edges):
        reach(name, name, [name], set())
    assert circles == []
