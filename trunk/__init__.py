"""Trunk: one from-scratch transformer trunk, many task heads, trained with PyTorch Lightning.

The floors, bottom up (imports run downward only; docs/architecture.md): ``core`` (codec, task specs,
checkpoint reading, atomic writes), ``models`` (plain torch), ``tasks`` (task kinds) and ``datamodules``
(rows -> batches), ``formats`` (files in and out), ``training`` (the LightningModule and what drives it),
``assembly`` (a run's facts, resolved once), ``inference`` (predictor, runtimes, serving) and ``cli``.
"""

__version__ = "0.1.0"
