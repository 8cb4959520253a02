"""``trunk.tasks.callbacks.<Callback>``, as configs written before the split by job name them: the callbacks live in
``trunk.training.callbacks``, imported from there when a name is asked for."""

import importlib


def __getattr__(name: str):
    return getattr(importlib.import_module("trunk.training.callbacks"), name)
