"""The model summary, with the trunk shared by every task counted once."""

from __future__ import annotations

import warnings

import lightning as L
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_summary import ModelSummary as Summary
from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count


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
    """Lightning's model summary, with tied weights counted once (the CLI uses it in place of the default), as a few
    lines: each module's parameters and the totals (no FLOPs column, which needs an example input Trunk has no use
    for, nor train / eval modes)."""

    def _summary(self, trainer: L.Trainer, pl_module: L.LightningModule):
        return _SharedOnceSummary(pl_module, max_depth=self._max_depth)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._max_depth:
            return
        with warnings.catch_warnings():  # "bf16-mixed is not supported by the model summary": its weights are fp32
            warnings.simplefilter("ignore")
            summary = self._summary(trainer, pl_module)
            columns = dict(summary._get_summary_data())
            total, trainable = summary.total_parameters, summary.trainable_parameters
        size = sum(p.numel() * p.element_size() for p in pl_module.parameters()) / 1e6  # as held, each tensor once
        frozen = f"{get_human_readable_count(trainable)} trainable" if trainable < total else "all trainable"
        width = max(map(len, columns["Name"]), default=0)
        rows = [f"  {name:<{width}}  {params:>7}  {kind}"
                for name, kind, params in zip(columns["Name"], columns["Type"], columns["Params"])]
        rank_zero_info("\n".join([f"Model: {get_human_readable_count(total)} parameters ({frozen}), {size:.1f} MB of "
                                   "weights", *rows]))
