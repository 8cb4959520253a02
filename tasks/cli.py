"""The ``trunk`` command: LightningCLI with Trunk's links, callbacks and checkpoint handling."""

from __future__ import annotations

import copy
import netrc
import os
import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from trunk.models import TrunkConfig
from trunk.tasks.callbacks import LogConfigCallback, PredictionWriter
from trunk.tasks.pretrained import ARCHITECTURE_FIELDS, export_checkpoint, read_config


def wandb_has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


class TrunkCLI(LightningCLI):
    """``trunk fit | validate | test | predict --config configs/<recipe>.yaml`` (and ``trunk export``, see ``main``)."""

    # How a trained model is run, not what it learned: with --ckpt_path, the config's values win
    # over the checkpoint's (Lightning would restore them all, so a beam size could never change).
    INFERENCE_OPTIONS = ("generation", "val_beam_size", "decoding")

    def _parse_ckpt_path(self) -> None:
        subcommand = self.config.get("subcommand")
        model_args = (self.config[subcommand].model.get("init_args") if subcommand else None) or {}
        configured = {name: copy.deepcopy(model_args[name]) for name in self.INFERENCE_OPTIONS if name in model_args}
        super()._parse_ckpt_path()
        for name, value in configured.items():
            self.config[subcommand].model.init_args[name] = value

    def add_arguments_to_parser(self, parser) -> None:
        # Data-dependent sizes flow from the datamodule into the model: users never type them.
        # A link whose target a model does not take (say label_names for MLM) is skipped.
        parser.link_arguments("data.vocab_size", "model.init_args.trunk.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.label_names", "model.init_args.label_names", apply_on="instantiate")
        parser.link_arguments("data.target_vocab_size", "model.init_args.target_vocab_size", apply_on="instantiate")
        parser.add_lightning_class_args(PredictionWriter, "predictions")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        self._use_pretrained_trunk(config)
        self._use_checkpoint(config)

    def _use_pretrained_trunk(self, config) -> None:
        """With model.init_from, take the pretrained trunk's tokenizer, and its architecture for every
        model.trunk field left at its default; fields set to other values fail in the task, naming both."""
        model_args = config.model.get("init_args") or {}
        init_from = model_args.get("init_from")
        if not init_from:
            return
        if config.get("ckpt_path"):
            model_args.init_from = None  # the checkpoint holds the fine-tuned weights and the tokenizer
            return
        try:
            pretrained, _ = read_config(init_from)
        except (FileNotFoundError, ValueError) as err:
            sys.exit(f"error: model.init_from: {err}")
        data_args = config.data.init_args
        if "tokenizer" in data_args:  # text data (image data reuses the blocks only)
            tokenizer = data_args.get("tokenizer")
            if tokenizer is not None and Path(tokenizer).resolve() not in (Path(init_from).resolve(), (Path(init_from) / "tokenizer.json").resolve()):
                sys.exit(f"error: data.tokenizer='{tokenizer}' but model.init_from='{init_from}' brings its own tokenizer, which "
                         "the pretrained weights need. Remove data.tokenizer.")
            data_args.tokenizer = init_from
        defaults, trunk_args = TrunkConfig(), model_args.trunk
        for name in ARCHITECTURE_FIELDS:
            if name != "vocab_size" and trunk_args.get(name) == getattr(defaults, name):
                trunk_args[name] = getattr(pretrained, name)
        self._cap_max_length(data_args, pretrained.max_len)

    def _use_checkpoint(self, config) -> None:
        """With --ckpt_path, reuse the checkpoint's tokenizer and label names and respect its max_len,
        so test/predict data is encoded as in training (Lightning has already restored the model's hparams)."""
        ckpt_path = config.get("ckpt_path")
        if not ckpt_path or ckpt_path in ("best", "last"):
            return
        if not Path(ckpt_path).is_file():
            sys.exit(f"error: --ckpt_path '{ckpt_path}' does not exist. Pass the path of a .ckpt file written by `trunk fit`.")
        data_args = config.data.init_args
        if "tokenizer" in data_args and data_args.get("tokenizer") is None:
            data_args.tokenizer = ckpt_path
        if data_args.get("joint_vocabulary") is False and data_args.get("target_tokenizer") is None:
            data_args.target_tokenizer = ckpt_path  # translation with separate vocabularies
        model_args = config.model.get("init_args") or {}
        if "label_names" in data_args and data_args.label_names is None and model_args.get("label_names"):
            data_args.label_names = model_args["label_names"]
        self._cap_max_length(data_args, (model_args.get("trunk") or {}).get("max_len"))

    @staticmethod
    def _cap_max_length(data_args, trunk_max_len: int | None) -> None:
        if trunk_max_len and data_args.get("max_length", 0) > trunk_max_len:
            data_args.max_length = trunk_max_len  # a trained position table sets the limit

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


def export_main(args: list[str]) -> None:
    """``trunk export CKPT DIR [--with-head]``: LightningCLI's subcommands are Trainer methods, so this one is plain argparse."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="trunk export",
        description="Write a pretrained-trunk directory (config.json, model.safetensors, tokenizer.json) from a "
                    "Lightning checkpoint written by any Trunk task; fine-tune from it with --model.init_from=DIR.",
    )
    parser.add_argument("ckpt", help="a .ckpt written by `trunk fit`")
    parser.add_argument("dir", help="the directory to write: new, empty, or (with --overwrite) an existing trunk directory")
    parser.add_argument("--with-head", action="store_true", help="also store the task head's weights")
    parser.add_argument("--overwrite", action="store_true", help="replace DIR (atomically) if it already holds a trunk")
    options = parser.parse_args(args)
    try:
        path = export_checkpoint(options.ckpt, options.dir, options.with_head, options.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        sys.exit(f"error: {err}")
    print(f"Wrote {path}; fine-tune from it with --model.init_from={path}")


def main() -> None:
    if sys.argv[1:2] == ["export"]:
        export_main(sys.argv[2:])
    else:
        run_cli()


if __name__ == "__main__":
    main()
