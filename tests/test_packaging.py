"""The built wheel holds every module of the trunk/ folder: packages are found, not listed by hand, so a new
subfolder cannot work in development and be missing from an install."""

import shutil
import subprocess
import sys
import zipfile

from conftest import REPO


def test_the_wheel_holds_every_module_of_the_package(tmp_path):
    source_tree = tmp_path / "source"  # a copy, so the build leaves nothing in the repository (and finds nothing stale)
    shutil.copytree(REPO / "trunk", source_tree / "trunk", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source_tree / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source_tree),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("trunk-*.whl")
    packed = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    source = {path.relative_to(REPO).as_posix() for path in (REPO / "trunk").rglob("*.py")}
    assert source - packed == set()
    assert {p.rpartition("/")[0] for p in source} >= {"trunk/core", "trunk/models", "trunk/tasks", "trunk/datamodules"}
