"""The model summary, with the trunk shared by every task counted once."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities.model_summary import ModelSummary as Summary


class _SharedOnceSummary(Summary):
    """A summary whose rows count a shared parameter once, in the first row (per nesting depth) that holds
    it: the MLM decoder is the token embedding, so the rows add up to the total."""

    @property
    def param_nums(self) -> list[int]:
        seen: dict[int, set[int]] = {}
        nums = []
        for name, layer in self._layer_summary.items():
            at_depth = seen.setdefault(name.count("."), set())
            params = [p for p in layer._module.parameters() if id(p) not in at_depth]
            at_depth.update(id(p) for p in params)
            nums.append(sum(p.numel() for p in params))
        return nums


class TrunkModelSummary(ModelSummary):
    """Lightning's model summary, with tied weights counted once (the CLI uses it in place of the default)."""

    def _summary(self, trainer: L.Trainer, pl_module: L.LightningModule):
        return _SharedOnceSummary(pl_module, max_depth=self._max_depth)
