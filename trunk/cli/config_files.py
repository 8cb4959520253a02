"""The recipe files, read once before LightningCLI parses them (or, for a checkpoint given without one, the recipe its
run saved): not YAML, a key given twice (PyYAML would keep the
last silently), or a later file's ``model.tasks`` / ``data.tasks`` replacing an earlier file's whole: each a one-line
error. And the loader the parser reads each value with (``PARSER_MODE``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml
from jsonargparse import set_loader
from jsonargparse._loaders_dumpers import yaml_load  # the loader of jsonargparse's "yaml" mode, kept but for one case

PARSER_MODE = "trunk_yaml"
YAML_NULLS = ("", "~", "null", "Null", "NULL")


def load_value(text: str, path: str | None = None):
    """jsonargparse's YAML loading of a value, except that a one-line value YAML reads as nothing but a comment stays
    the text it is (a config file, which comes with its ``path``, is read as YAML says). jsonargparse reads the value
    of a ``str | None`` option as YAML, so a column named ``#2 String`` (quoted in the file or on the command line)
    became None: a sentence pair's second column was dropped, the pairs trained as single sentences, nothing said."""
    value = yaml_load(text)
    if value is None and path is None and isinstance(text, str) and "\n" not in text.strip() \
            and text.strip() not in YAML_NULLS:
        return text
    return value


set_loader(PARSER_MODE, load_value, exceptions=(yaml.YAMLError,))


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


def option_values(args: list[str], name: str) -> list[str]:
    """The values a command line gives option ``name`` (``--name VALUE`` or ``--name=VALUE``), in order."""
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == name] + [
        a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")
    ]


def recipe_beside_checkpoint(args: list[str]) -> list[str]:
    """``trunk validate | test | predict --ckpt_path CKPT`` without ``--config``: the recipe the run saved above its
    checkpoints folder (config.yaml, every option as it ran; a resumed run's newest config.resumeN.yaml), put first,
    so a checkpoint is all one needs to keep. Anything else is returned as it is."""
    if not isinstance(args, (list, tuple)) or not args or args[0] not in ("validate", "test", "predict") \
            or "-c" in args or option_values(args, "--config") \
            or any(re.match(r"--model\.tasks(\.[^.=]+)?(=|$)", a) for a in args):  # a recipe on the command line
        return args
    given = option_values(args, "--ckpt_path")
    if not given or given[-1] in ("last", "best"):
        return args  # the parser asks for a recipe
    checkpoint = Path(given[-1]).expanduser()
    if not checkpoint.exists():  # a file, or a sharded checkpoint's folder (FSDP2)
        sys.exit(f"error: --ckpt_path {given[-1]}: no such checkpoint file. Pass the path of a .ckpt a run wrote "
                 "(under <run>/lightning_logs/version_N/checkpoints/).")
    folder = checkpoint.resolve().parent.parent  # <run>/lightning_logs/version_N/checkpoints/CKPT
    resumes = sorted(folder.glob("config.resume*.yaml"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    saved = resumes[-1] if resumes else folder / "config.yaml"
    if not saved.is_file():
        sys.exit(
            f"error: trunk {args[0]} --ckpt_path {given[-1]} without --config reads the recipe its run saved, "
            f"{saved}, and there is none (a checkpoint moved out of its run's folder). Pass the recipe it was trained "
            "with: --config RECIPE.yaml."
        )
    print(f"Recipe: {saved} (the run's own, beside its checkpoints), on one device of this machine "
          "(--trainer.devices N for more)", file=sys.stderr)
    # a joint run's MT-DNN stages (finetune_each) followed its training: evaluating its checkpoint runs none; the
    # devices it trained on may not be this machine's, and one process scores every example once (DDP's sampler pads)
    machine = ["--finetune_each=0", "--trainer.accelerator=auto", "--trainer.devices=1", "--trainer.num_nodes=1",
               "--trainer.strategy=auto"]
    return [args[0], "--config", str(saved), *machine, *args[1:]]


def check_config_files(args: list[str]) -> None:
    """Fail clearly on a config file that is not YAML, names a task (or any key) twice, or drops an earlier file's
    tasks, before LightningCLI reads it: each file is read once here."""
    paths = option_values(args, "--config")
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
        commented = _value_read_as_comment(tree, Path(path).read_text()) if tree is not None else None
        if commented is not None:
            key, line, text = commented
            sys.exit(
                f"error: {path}, line {line}: {key}: {text} is a YAML comment, so {key} has no value (null). Quote "
                f"the value, {key}: \"{text}\" (a column name that starts with '#'), or write '# ' for a comment."
            )
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


def _value_read_as_comment(node: yaml.Node, text: str) -> tuple[str, int, str] | None:
    """The first ``key: #value`` of a composed YAML tree: an empty value whose line goes on with '#' and no space, which
    YAML reads as a comment (a null), where the writer meant a value such as the column name ``#1 String``.
    (key, line, the text after the colon) or None."""
    if isinstance(node, yaml.MappingNode):
        lines = text.splitlines()
        for key, value in node.value:
            if isinstance(value, yaml.ScalarNode) and value.tag.endswith(":null") and value.value == "":
                rest = lines[key.start_mark.line][key.end_mark.column:].lstrip(" :")
                if key.start_mark.line == value.start_mark.line and rest.startswith("#") and rest[1:2].strip():
                    return key.value, key.start_mark.line + 1, rest.strip()
        children = [value for _, value in node.value]
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
    return next((found for child in children if (found := _value_read_as_comment(child, text)) is not None), None)


def _mapping_keys(node: yaml.Node | None, *path: str) -> list[str] | None:
    """The keys of the mapping at ``path`` in a composed YAML tree; None where there is none."""
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        node = next((value for k, value in node.value if k.value == key), None)
    return [k.value for k, _ in node.value] if isinstance(node, yaml.MappingNode) else None
