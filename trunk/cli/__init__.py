"""The ``trunk`` command. ``fit``, ``validate``, ``test`` and ``predict`` are LightningCLI's (``fit.py``, their
summaries in ``SUBCOMMANDS``); the others are plain argparse, one file each, in ``COMMANDS``."""

from __future__ import annotations

import os
import sys

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException

from trunk.cli.config_files import check_config_files
from trunk.cli.export import export_main
from trunk.cli.fit import SUBCOMMANDS, TrunkCLI, TrunkTrainer, run_cli
from trunk.cli.import_model import import_main
from trunk.cli.serve import serve_main
from trunk.training.fault_tolerance import TrainingDiverged

COMMANDS = {"export": export_main, "import": import_main, "serve": serve_main}  # name -> main(args)


def is_collective_failure(err: BaseException) -> bool:
    """A DDP collective that timed out or lost its peer (gloo and NCCL say so in RuntimeErrors)."""
    text = str(err)
    return isinstance(err, torch.distributed.DistError) or (
        isinstance(err, RuntimeError)
        and any(
            marker in text
            for marker in ("gloo", "Connection closed by peer", "Timed out", "timed out", "NCCL", "ProcessGroup")
        )
    )


def main() -> None:
    command = COMMANDS.get(sys.argv[1]) if len(sys.argv) > 1 else None
    if command is not None:
        command(sys.argv[2:])
    else:
        try:
            run_cli()
        except KeyboardInterrupt:  # outside training (during training, Ctrl+C saves: see FaultTolerance)
            sys.exit("\nInterrupted.")
        except (TrainingDiverged, ValueError, OSError, RuntimeError, MisconfigurationException) as err:
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



__all__ = [
    "COMMANDS",
    "SUBCOMMANDS",
    "TrunkCLI",
    "TrunkTrainer",
    "check_config_files",
    "export_main",
    "import_main",
    "main",
    "run_cli",
    "serve_main",
]
