"""The ``trunk`` command. ``fit``, ``validate``, ``test`` and ``predict`` are LightningCLI's (``fit.py``, their
summaries in ``SUBCOMMANDS``); the others are plain argparse, one file each, in ``COMMANDS``. Each is imported when it
runs (and the names below when first used), so ``trunk import`` or ``trunk serve`` does not load Lightning's CLI."""

from __future__ import annotations

import importlib
import os
import sys

COMMANDS = {  # name -> "module:main(args)"
    "export": "trunk.cli.export:export_main",
    "import": "trunk.cli.import_model:import_main",
    "serve": "trunk.cli.serve:serve_main",
}
_NAMES = {  # the package's names -> their modules
    "SUBCOMMANDS": "trunk.cli.fit", "TrunkCLI": "trunk.cli.fit", "TrunkTrainer": "trunk.cli.fit",
    "run_cli": "trunk.cli.fit", "check_config_files": "trunk.cli.config_files", "export_main": "trunk.cli.export",
    "import_main": "trunk.cli.import_model", "serve_main": "trunk.cli.serve",
}


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'trunk.cli' has no attribute {name!r}")


def is_collective_failure(err: BaseException) -> bool:
    """A DDP collective that timed out or lost its peer (gloo and NCCL say so in RuntimeErrors)."""
    import torch

    text = str(err)
    return isinstance(err, torch.distributed.DistError) or (
        isinstance(err, RuntimeError)
        and any(
            marker in text
            for marker in ("gloo", "Connection closed by peer", "Timed out", "timed out", "NCCL", "ProcessGroup")
        )
    )


def main() -> None:
    try:
        run_command()
    except KeyboardInterrupt:  # outside training (during training, Ctrl+C saves: see FaultTolerance), also while the
        # libraries load, before any command runs: one line, not a traceback through torch's imports
        sys.exit("\nInterrupted.")


def run_command() -> None:
    from trunk.training.threads import shorten_openmp_spinning

    shorten_openmp_spinning()  # before torch loads OpenMP, which reads it once
    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        module, function = COMMANDS[sys.argv[1]].split(":")
        getattr(importlib.import_module(module), function)(sys.argv[2:])
        return
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from trunk.cli.fit import run_cli
    from trunk.training.fault_tolerance import TrainingDiverged

    try:
        run_cli()
    except (TrainingDiverged, ValueError, OSError, RuntimeError, ImportError, MisconfigurationException) as err:
        unexpected = type(err) is RuntimeError and not is_collective_failure(err)  # a bug: show where
        if os.environ.get("TRUNK_TRACEBACK") or unexpected:
            raise
        if is_collective_failure(err):
            err = (
                f"a collective between the processes failed or timed out ({str(err).splitlines()[0][:300]}): "
                "another process stopped responding or died. Its own output says why; a process that is only slow "
                "(a long save, a big evaluation) needs a longer --fault_tolerance.ddp_timeout_minutes."
            )
        sys.exit(f"error: {err}\n(set TRUNK_TRACEBACK=1 to see where it was raised)")


__all__ = ["COMMANDS", "main", *_NAMES]
