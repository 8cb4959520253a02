"""``TrunkCheckpoint``: Lightning's ``ModelCheckpoint``, keeping the best checkpoints as weights only and ``last``
whole."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint


class TrunkCheckpoint(LightningModelCheckpoint):
    """``lightning.pytorch.callbacks.ModelCheckpoint`` with ``best_weights_only`` (on by default): the best (top-k)
    checkpoints hold the weights and what predicting, testing and starting a run from them need (labels, tokenizer,
    the data's statistics), without the optimizer's state, which is twice the weights under AdamW (MiniLM: 90 MB of
    weights, 273 MB a whole checkpoint); ``last.ckpt`` stays whole, to resume from. Resuming from a best checkpoint is
    then a new run from its weights (``--model.init_from``)."""

    def __init__(self, *args, best_weights_only: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.best_weights_only, self._saving_last = best_weights_only, False

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict) -> None:
        if trainer.fast_dev_run:  # Lightning's save of last.ckpt at the end of training does not skip its dry run
            return
        self._saving_last = True
        try:
            super()._save_last_checkpoint(trainer, monitor_candidates)
        finally:
            self._saving_last = False

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        whole = self.save_weights_only
        self.save_weights_only = whole or (self.best_weights_only and not self._saving_last)
        try:
            super()._save_checkpoint(trainer, filepath)
        finally:
            self.save_weights_only = whole
