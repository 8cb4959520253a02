"""The README's commands run as written on a fresh clone, in the order shown: each recipe exists and parses with the
options given beside it, and each run folder a command reads (a trunk directory, a checkpoint) is written by a command
above it. (Training them is the benchmarks' work: these are minutes to hours each.)"""

import re
import shlex
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from trunk.cli import run_cli
from trunk.cli.search_space import SearchSpace

PRETRAINING = ("MaskedLanguageModeling", "ReplacedTokenDetection")  # their runs write <root>/trunk


def readme_commands() -> list[list[str]]:
    """Every `trunk` and `python benchmarks/...` command of the README's bash blocks, continuation lines joined."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.startswith(("trunk ", "python benchmarks/"))]


def option(words: list[str], name: str) -> str | None:
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(f"{name}="):
            return word.split("=", 1)[1]
    return None


def written_by_fit(words: list[str]) -> list[str]:
    """What a `trunk fit` writes in its run folder (runs/<recipe>, with --tasks' names): its logs and checkpoints, and
    its trunk directory when it pretrains."""
    config = Path(option(words, "--config"))
    root = option(words, "--trainer.default_root_dir")
    if root is None:
        tasks = option(words, "--tasks")
        root = f"runs/{config.stem}" + "".join(f"_{t}" for t in (tasks or "").strip("[]").split(",") if t)
    recipe = (REPO / config).read_text() if (REPO / config).is_file() else ""
    return [f"{root}/lightning_logs", *([f"{root}/trunk"] if any(kind in recipe for kind in PRETRAINING) else [])]


def test_the_readme_commands_run_in_the_order_shown(monkeypatch):
    monkeypatch.chdir(REPO)
    written: list[str] = []
    read_before_written = []
    commands = readme_commands()
    assert len(commands) > 30
    for words in commands:
        if words[0] == "python":
            assert (REPO / words[1]).is_file(), words
            reads = [w.split("=", 1)[-1] for w in words if "runs/" in w]
        elif words[1] in ("fit", "validate", "test", "predict"):
            config = option(words, "--config")
            assert config is not None, words
            if not Path(config).name.startswith("my_"):  # the user's own recipe, in the README as a template
                assert (REPO / config).is_file(), words
                with pytest.raises(SystemExit) as done:  # the recipe and the options beside it parse
                    run_cli([*words[1:], "--print_config"])
                assert done.value.code in (0, None), words
                recipe = yaml.safe_load((REPO / config).read_text())
                init_from = (recipe.get("model") or {}).get("init_from")
            else:
                init_from = None
            init_from = option(words, "--model.init_from") or init_from
            reads = [init_from] if isinstance(init_from, str) else []
            distill = yaml.safe_load(option(words, "--model.distill") or "{}")  # the teachers are read too
            reads += [path for task in distill.values() for path in task.get("teachers", [])]
            if words[1] != "fit" and option(words, "--ckpt_path") in ("best", "last"):
                reads.append(f"runs/{Path(config).stem}/lightning_logs")
            if words[1] == "fit" and "--print_config" not in words:
                written += written_by_fit(words)
        elif words[1] == "tune":  # its recipes and space exist and parse; it writes runs/tune/<recipe>
            from trunk.cli.tune import parse_args  # noqa: I001 (here: the command it checks)

            tune, fit_options = parse_args(words[2:])
            assert all((REPO / path).is_file() for path in [*tune.config, tune.search]), words
            SearchSpace.from_file(REPO / tune.search)
            with pytest.raises(SystemExit) as done:
                run_cli(["fit", *[part for path in tune.config for part in ("--config", path)], *fit_options,
                         "--print_config"])
            assert done.value.code in (0, None), words
            written.append(tune.dir or f"runs/tune/{Path(tune.config[0]).stem}")
            reads = []
        else:
            flags_with_values = {"--base", "--task", "--format", "--merge", "--port", "--workers", "--precision"}
            positional = [w for i, w in enumerate(words[2:], 2) if not w.startswith("-")
                          and words[i - 1] not in flags_with_values]
            if words[1] in ("export", "import"):
                reads, out = positional[:-1], positional[-1]
                written.append(out)
            else:  # serve
                reads = positional
        for path in reads:
            if path.startswith("runs/") and not any(path == w or path.startswith(f"{w}/") for w in written):
                read_before_written.append((" ".join(words), path))
    assert not read_before_written, "\n".join(f"{path} read by: {command}" for command, path in read_before_written)


def test_every_recipe_names_the_command_that_runs_it():
    recipes = sorted(REPO.glob("configs/*.yaml"))
    assert recipes
    for recipe in recipes:
        header = "".join(line for line in recipe.read_text().splitlines(keepends=True)[:12] if line.startswith("#"))
        assert f"trunk fit --config configs/{recipe.name}" in header, recipe.name
