"""The ``trunk`` command. ``fit``, ``validate``, ``test`` and ``predict`` are LightningCLI's (``fit.py``); the others
are plain argparse, one file each, in ``COMMANDS``; every command's summary is in ``SUBCOMMANDS``. Each is imported
when it runs (and the names below when first used), so ``trunk import`` or ``trunk serve`` does not load Lightning's
CLI."""

from __future__ import annotations

import importlib
import os
import sys

from trunk.core.interrupts import EXIT_CODE as INTERRUPTED_EXIT_CODE
from trunk.core.interrupts import catch_interrupts, interrupted, raise_if_interrupted

COMMANDS = {  # name -> "module:main(args)"
    "export": "trunk.cli.export:export_main",
    "import": "trunk.cli.import_model:import_main",
    "serve": "trunk.cli.serve:serve_main",
    "tune": "trunk.cli.tune:tune_main",
}
# One line each, for `trunk --help` and LightningCLI's subcommand list
SUBCOMMANDS = {
    "fit": "Train on every task's data (validating as configured; a test split is evaluated at the end).",
    "validate": "Evaluate a checkpoint (--ckpt_path) or a fresh model on the validation splits.",
    "test": "Evaluate a checkpoint (--ckpt_path) on the test splits.",
    "predict": "Write each predict split's predictions as JSON lines (predictions.output).",
    "export": "Write a trunk or task directory, a transformers folder or ONNX from a checkpoint; merge models.",
    "import": "Read a Hugging Face model folder (or hf://ORG/NAME) into a trunk directory, without transformers.",
    "serve": "Serve trained models over HTTP: POST /predict, GET /health, GET /info (LitServe).",
    "tune": "Search a recipe's settings (Optuna): trials pruned on their validations, the best written as a recipe.",
}
HELP = """usage: trunk COMMAND [options]      (trunk COMMAND --help: its options)

Trunk: transformer tasks on one shared trunk (pretraining, classification, regression, NER, QA, multiple choice,
translation, images), trained alone or jointly, from scratch or from a pretrained model.

commands:
{commands}

Start with `trunk fit --config configs/quickstart.yaml` (no files, no network); README.md and docs/usage.md go on.
"""
_NAMES = {  # the package's names -> their modules
    "TrunkCLI": "trunk.cli.fit", "TrunkTrainer": "trunk.cli.fit",
    "run_cli": "trunk.cli.fit", "check_config_files": "trunk.cli.config_files", "export_main": "trunk.cli.export",
    "import_main": "trunk.cli.import_model", "serve_main": "trunk.cli.serve", "tune_main": "trunk.cli.tune",
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
    catch_interrupts()
    try:
        run_command()
    except KeyboardInterrupt:  # outside training (during training, Ctrl+C saves: see FaultTolerance), also while the
        # libraries load, before any command runs: one line, not a traceback through torch's imports
        stop_interrupted()
    except Exception:
        if interrupted():  # a Ctrl+C inside a library's import can surface as another error (numpy: AttributeError)
            stop_interrupted()
        raise


def stop_interrupted() -> None:
    print("\nInterrupted.", file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED_EXIT_CODE)


def run_command() -> None:
    from trunk.training.threads import shorten_openmp_spinning

    shorten_openmp_spinning()  # before torch loads OpenMP, which reads it once
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):  # every command, at once, without loading Lightning
        print(HELP.format(commands="\n".join(f"  {name:<9} {line}" for name, line in SUBCOMMANDS.items())))
        return
    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        module, function = COMMANDS[sys.argv[1]].split(":")
        command = getattr(importlib.import_module(module), function)
        raise_if_interrupted()  # a Ctrl+C while its module loaded, which a library swallowed
        command(sys.argv[2:])
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


__all__ = ["COMMANDS", "HELP", "SUBCOMMANDS", "main", *_NAMES]
