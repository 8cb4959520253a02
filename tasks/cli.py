"""The ``trunk`` command: LightningCLI with Trunk's links, callbacks and checkpoint handling."""

from __future__ import annotations

import netrc
import os
import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from tasks.callbacks import LogConfigCallback, PredictionWriter


def wandb_has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


class TrunkCLI(LightningCLI):
    """``trunk fit | validate | test | predict --config configs/<recipe>.yaml``."""

    def add_arguments_to_parser(self, parser) -> None:
        # Data-dependent sizes flow from the datamodule into the model: users never type them.
        # A link whose target a model does not take (say label_names for MLM) is skipped.
        parser.link_arguments("data.vocab_size", "model.init_args.trunk.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.label_names", "model.init_args.label_names", apply_on="instantiate")
        parser.add_lightning_class_args(PredictionWriter, "predictions")

    def before_instantiate_classes(self) -> None:
        """With --ckpt_path, reuse the checkpoint's tokenizer and label names and respect its max_len,
        so test/predict data is encoded as in training (Lightning has already restored the model's hparams)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        ckpt_path = config.get("ckpt_path")
        if not ckpt_path or ckpt_path in ("best", "last"):
            return
        if not Path(ckpt_path).is_file():
            sys.exit(f"error: --ckpt_path '{ckpt_path}' does not exist. Pass the path of a .ckpt file written by `trunk fit`.")
        data_args = config.data.init_args
        if data_args.get("tokenizer") is None:
            data_args.tokenizer = ckpt_path
        model_args = config.model.get("init_args") or {}
        if "label_names" in data_args and data_args.label_names is None and model_args.get("label_names"):
            data_args.label_names = model_args["label_names"]
        trunk_max_len = (model_args.get("trunk") or {}).get("max_len")
        if trunk_max_len and data_args.get("max_length", 0) > trunk_max_len:
            data_args.max_length = trunk_max_len  # the checkpoint's position table sets the limit

    def after_fit(self) -> None:
        """Evaluate the best checkpoint on the test split right after training, when one is configured."""
        if getattr(self.datamodule, "split_specs", {}).get("test") is None or self.trainer.interrupted:
            return
        best = self.trainer.checkpoint_callback.best_model_path if self.trainer.checkpoint_callback else ""
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None)


def run_cli(args: list[str] | None = None, run: bool = True) -> TrunkCLI:
    """Run the CLI and return it (for tests and notebooks); ``main`` is the console entry point.
    With ``run=False`` there is no subcommand: the classes are only instantiated."""
    if not wandb_has_credentials():
        os.environ.setdefault("WANDB_MODE", "offline")  # never block on a login prompt
    return TrunkCLI(
        save_config_callback=LogConfigCallback,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )


def main() -> None:
    run_cli()


if __name__ == "__main__":
    main()
