"""Task kinds: an objective per kind (``objectives/``, one file each).

This face imports only the objectives. The names that checkpoints, configs and the README stored here before the
house was split by job (``trunk.tasks.load``, ``Predictor``, ``TrunkModule``, ``OptimConfig``, ``FinetuneConfig``, and
``trunk.tasks.callbacks.*``) still resolve, each imported from its floor only when asked for (PEP 562), so an
objective importing ``trunk.tasks`` does not import the training and inference floors above it.
"""

import importlib

from trunk.tasks.objectives import *  # noqa: F403 (the objectives are this face's own names)
from trunk.tasks.objectives import __all__ as _OBJECTIVES

_MOVED = {
    "load": "trunk.inference.predictor",
    "Predictor": "trunk.inference.predictor",
    "TrunkModule": "trunk.training.module",
    "OptimConfig": "trunk.training.optim",
    "FinetuneConfig": "trunk.training.finetuning",
}


def __getattr__(name: str):
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module 'trunk.tasks' has no attribute {name!r}")


__all__ = [*_OBJECTIVES, *_MOVED]
