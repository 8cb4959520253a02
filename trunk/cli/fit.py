"""``trunk fit | validate | test | predict``: LightningCLI with Trunk's links, callbacks and checkpoint handling."""

from __future__ import annotations

import copy
import csv
import dataclasses
import logging
import os
import re
import sys
import time
import typing
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Literal

import torch
from datasets.utils import disable_progress_bars, enable_progress_bars
from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, WeightAveraging
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.environments import (
    ClusterEnvironment,
    LSFEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from trunk.assembly.run import RunSourceError, resolve, resume_changes
from trunk.assembly.weights import HeadReuse
from trunk.cli import COMMANDS, SUBCOMMANDS
from trunk.cli.config_files import PARSER_MODE, check_config_files, recipe_beside_checkpoint
from trunk.core.checkpoint import load_checkpoint
from trunk.datamodules import MultiTaskData
from trunk.formats.artifacts import wandb_has_credentials, wandb_reachable
from trunk.inference.calibrate import choose_form
from trunk.inference.quantize import QuantizeForEvaluation
from trunk.inference.teachers import attach_teachers
from trunk.training.callbacks import LogConfigCallback, PredictionWriter, run_callbacks
from trunk.training.callbacks.run_lock import RunFolderLock
from trunk.training.fault_tolerance import AtomicCheckpointIO, FaultTolerance, last_checkpoints, slurm_job_id
from trunk.training.module import TrunkModule
from trunk.training.precision import on_cuda, resolve_precision
from trunk.training.threads import fit_threads

LIGHTNING_PRECISION = typing.get_type_hints(Trainer.__init__)["precision"]  # the values Lightning's Trainer takes


# Lightning's lines that tell a Trunk user nothing to act on: product tips, the model summary it leaves to Trunk's,
# accelerators this machine does not have, the precision and checkpoint Trunk's own lines name, how it counts steps
BOILERPLATE = re.compile(
    r"💡 Tip|Trainer already configured with model summary callbacks|(GPU|TPU|HPU) available: False"
    r"|Loading `train_dataloader` to estimate|Using (bfloat16|16-bit) Automatic Mixed Precision"
    r"|Restoring states from the checkpoint path|`Trainer\(val_check_interval=1.0\)` was configured"
)


class _DropBoilerplate(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not BOILERPLATE.match(str(record.msg))


_PACKAGE = str(Path(__file__).resolve().parent.parent)
_library_format = warnings.formatwarning


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """Trunk's own warnings as one line a person reads ("warning: ..."), not a source location and a line of code;
    the libraries' keep theirs (where they come from is part of the message)."""
    if str(filename).startswith(_PACKAGE):
        return f"warning: {message}\n"
    return _library_format(message, category, filename, lineno, line)


def quiet_third_party() -> None:
    """Keep the output to what a user can act on: no boilerplate lines (``BOILERPLATE``), no deprecation notices from
    inside libraries, no advice to add loader workers (training batches are built in the main process by design)."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropBoilerplate())
    warnings.formatwarning = _format_warning
    # a run that ends before its first validation has no monitored value (a misnamed one is refused at the start:
    # check_monitors), and Trunk says so where it matters (--ckpt_path best, the test after training)
    warnings.filterwarnings("ignore", message=r"`ModelCheckpoint\(monitor=.*\)` could not find the monitored key")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    # Trunk's training stream resumes mid-epoch by itself (MultiTaskStream skips the batches already trained on)
    warnings.filterwarnings("ignore", message=".*your dataloader is not resumable.*")
    # run_cli(args) from a script of its own options (a benchmark, a tune's trial): the args given are the ones meant
    warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended to run from within Python.*")
    # under DDP, Lightning asks for sync_dist on every epoch-level value: the metrics are torchmetrics', synced across
    # processes before they are logged (and the score is made of them); the validation and test losses are synced;
    # the training loss's epoch mean stays each process's own (syncing it would cost a collective every step)
    warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('(train|val|test)/")


class TrunkTrainer(Trainer):
    """Lightning's ``Trainer`` with one more precision, ``auto`` (the default): bf16-mixed where the device
    multiplies bf16 natively, 32-true where it does not (``trunk.training.precision``). The run says which in one
    line."""

    def __init__(self, *, precision: Literal["auto"] | LIGHTNING_PRECISION = "auto", **kwargs) -> None:
        accelerator, devices = kwargs.get("accelerator", "auto"), kwargs.get("devices", "auto")
        if not on_cuda(accelerator) and accelerator in ("cpu", "auto"):  # threads from the cores this process has
            fit_threads(devices if isinstance(devices, int) and devices > 1 else 1)
        super().__init__(precision=resolve_precision(precision, accelerator), **kwargs)


# Options a run has once, for all its tasks: where they go when a task's block was given one.
RUN_OPTIONS = {
    **dict.fromkeys(["tokenizer", "tokenizer_vocab_size", "tokenizer_min_frequency", "tokenizer_model", "lowercase",
                     "sampling", "temperature", "weights", "anneal_to"], "data"),
    **dict.fromkeys(["init_from", "init_layers", "trunk", "heads_from", "label_map", "optimizer", "finetune",
                     "distill"], "model"),
}


class TrunkArgumentParser(LightningArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{"parser_mode": PARSER_MODE, **kwargs})

    def error(self, message: str, ex: Exception | None = None) -> typing.NoReturn:
        """jsonargparse's message, and where an option a task's block does not take belongs, if it is a run's."""
        missing = re.search(r"arguments are required: (fit|validate|test|predict)\.model\.tasks", message)
        if missing:  # `trunk fit` with no recipe
            message = (f"trunk {missing.group(1)} needs a recipe that names its tasks: --config configs/RECIPE.yaml "
                       "(configs/quickstart.yaml needs no files and no network)"
                       + (", or a checkpoint's path alone: --ckpt_path CKPT (its run's recipe is read)"
                          if missing.group(1) != "fit" else "") + ".")
        found = re.search(r"Option '(\w+)' is not accepted", message)
        if found and found.group(1) in RUN_OPTIONS and re.search(r"\b(data|model)\.tasks\b", message):
            name, where = found.group(1), RUN_OPTIONS[found.group(1)]
            message += (f"\n{name} is set once per run, for all its tasks: {where}.{name}. Tasks that need another "
                        "tokenizer or pretrained model than the run's need a run of their own (models fine-tuned from "
                        "one base can then be merged: trunk export A.ckpt B.ckpt DIR --merge ties --base BASE).")
        super().error(message, ex)


# What `trunk fit --help` leads with: the options people change, before the hundreds of the Trainer and the classes
COMMON_OPTIONS = """The options people change most (every value of a recipe has one: --print_config shows them):
  --config configs/RECIPE.yaml          a recipe (several: later ones override)
  --model.init_from PATH                start from a pretrained model, a trunk directory or a checkpoint
  --data.tasks.NAME.train / .validation / .test / .predict PATH    a task's files
  --data.tasks.NAME.batch_size N, --data.tasks.NAME.max_length N
  --model.optimizer.lr LR, --trainer.max_epochs N, --trainer.max_steps N, --trainer.precision auto|32-true
  --ckpt_path last|best|PATH            resume (fit), or the weights to evaluate or predict with (a PATH alone,
                                        without --config: with the recipe its run saved beside it)
  --trainer.default_root_dir DIR        where the run writes (default runs/RECIPE)"""


def _keep_lines(self, text: str, width: int, indent: str) -> str:
    """A help description as written, line by line (argparse's own reflows it into one paragraph)."""
    return "".join(indent + line for line in text.splitlines(keepends=True))


class TrunkCLI(LightningCLI):
    """``trunk fit | validate | test | predict --config configs/<recipe>.yaml`` (and ``trunk export``, see ``main``)."""

    def __init__(self, *args, **kwargs) -> None:
        given = kwargs.get("args")
        words = sys.argv[1:] if given is None else list(given) if isinstance(given, (list, tuple)) else []
        self._named = words[0] if words and words[0] in self.subcommands() else None  # `trunk fit ...`
        super().__init__(*args, **kwargs)

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs):
        """Lightning builds every subcommand's whole parser (0.3 s each); a command line that names one needs only its
        own: the others stay bare, registered by name (a mistyped one is still refused with the four listed)."""
        if self._named not in (None, subcommand):
            return self.init_parser(**kwargs)
        return super()._prepare_subcommand_parser(klass, subcommand, **kwargs)

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        if add_subcommands:  # one whole line each in `trunk --help`, not the Trainer docstrings' first words
            for choice in self.parser._subcommands_action._choices_actions:
                choice.help = SUBCOMMANDS.get(choice.dest, choice.help)
            for name, parser in self.parser._subcommands_action._name_parser_map.items():
                parser.usage = f"trunk {name} --config RECIPE.yaml [options]"  # not ninety lines of every option
                parser.description = f"{SUBCOMMANDS.get(name, '')}\n\n{COMMON_OPTIONS}"
                parser.formatter_class = type("KeepLines", (parser.formatter_class,), {"_fill_text": _keep_lines})

    def parse_arguments(self, parser, args) -> None:
        # kept for the resume command a stopped run prints (a script calling run_cli has argv of its own)
        self.arguments = sys.argv[1:] if args is None else list(args) if isinstance(args, (list, tuple)) else None
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """Lightning would read the checkpoint here to restore the model's options; ``resolve`` reads it once."""

    def add_core_arguments_to_parser(self, parser) -> None:
        """The Trainer, the data, and the model's options: the model itself is built by ``trunk.assembly.run.resolve``
        (not by the parser), once the data and any checkpoint or trunk directory are known."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.add_class_arguments(TrunkModule, "model", fail_untyped=False, instantiate=False, sub_configs=True,
                                   skip={"task_info", "codec"})
        parser.add_argument(
            "--model.init_from",
            type=str | list[str] | None,
            default=None,
            help="A pretrained-trunk directory, a checkpoint (a new run from its weights: fresh optimizer, schedule "
            "and step count), hf://org/name or wandb-artifact://entity/project/name:alias; or a list of one of these "
            "and task directories (`trunk export CKPT DIR --task NAME`). Loads the trunk and, for each task with a "
            "stored head of the same name and kind, that head (labels matched by name).",
        )
        parser.add_argument(
            "--model.init_layers",
            type=list[int] | Literal["every_other"] | None,
            default=None,
            help="With init_from, a shallower trunk of these of its blocks, in order (every_other: 0, 2, 4, ...): a "
            "distilled student's start (model.distill).",
        )
        parser.add_argument(
            "--model.reinit_mismatched_heads",
            type=bool,
            default=False,
            help="With init_from, a stored head whose labels differ from the data's keeps its body and gets a "
            "fresh classifier (else: an error naming both label sets).",
        )
        parser.add_argument(
            "--model.heads_from",
            type=dict[str, str] | None,
            default=None,
            help="With init_from, start tasks from stored heads of other names: {new_task: stored_task} (e.g. a "
            "new review task from the sst2 head).",
        )
        parser.add_argument(
            "--model.label_map",
            type=dict[str, dict[str, str]] | None,
            default=None,
            help="With init_from, pair a task's label names with a stored head's that differ: {task: {its label: "
            "stored label}}; tags map by type ({wnut: {person: PER}} gives B-person the row of B-PER).",
        )
        parser.add_argument(
            "--model.keep_shared_labels",
            type=bool,
            default=False,
            help="With init_from, a stored head whose labels differ keeps the rows of the labels in both; new "
            "labels start fresh and labels only in the stored head are dropped (else: an error).",
        )
        parser.add_argument(
            "--quantize",
            type=Literal["int8"] | None,
            default=None,
            help="validate / test / predict only: the trunk's linear layers compute in int8 (CPU; "
            "trunk.inference.quantize). Training needs the float weights.",
        )
        parser.add_lightning_class_args(self._datamodule_class, "data")

    def instantiate_classes(self) -> None:
        """Parse -> resolve -> Trainer: the data and the objectives from the config, then the run's facts and its
        model from ``resolve`` (reading any checkpoint or trunk directory once), then the Trainer."""
        # renamed in jsonargparse 4.49
        instantiate = (getattr(self.parser, "instantiate", None) or self.parser.instantiate_classes)
        self.config_init = instantiate(self.config)
        self.datamodule = self._get(self.config_init, "data")
        config = self.config[self.subcommand] if self.subcommand else self.config
        options = dict(self._get(self.config_init, "model"))
        init_from, layers = options.pop("init_from"), options.pop("init_layers")
        reuse = HeadReuse(
            **{
                key: options.pop(key)
                for key in ("reinit_mismatched_heads", "heads_from", "label_map", "keep_shared_labels")
            }
        )
        ckpt_path = config.get("ckpt_path")  # "last" / "best" are paths by now (before_instantiate_classes)
        if config.get("quantize") and self.subcommand == "fit":
            sys.exit(f"error: --quantize {config.quantize} is for inference only: int8 weights cannot learn. Train in "
                     f"float, then evaluate or predict with `trunk test | predict --ckpt_path CKPT --quantize "
                     f"{config.quantize}` (or trunk serve --quantize {config.quantize}).")
        if self.subcommand in ("validate", "test", "predict") and not ckpt_path and init_from is None:
            sys.exit(f"error: trunk {self.subcommand} needs trained weights: pass --ckpt_path (a checkpoint, or last / "
                     "best of this run's) or --model.init_from (a trunk directory with heads). Without them it would "
                     f"{'predict with' if self.subcommand == 'predict' else 'score'} random weights.")
        try:
            self.run = resolve(
                options, self.datamodule, init_from=None if ckpt_path else init_from, ckpt_path=ckpt_path, reuse=reuse,
                layers=layers,
            )
        except RunSourceError as err:
            sys.exit(f"error: {err}")
        if self.subcommand == "fit" and self.run.checkpoint is not None:
            self._check_resume(options, ckpt_path, from_weights=init_from is not None)
        if self.subcommand == "fit" and self.run.model.distill:  # loaded and checked before any step
            self.run.report += attach_teachers(self.run.model, self.datamodule, self.run.checkpoint)
        self.run.say()
        self.model = self.run.model
        writer = self.config_init.get(self.subcommand, self.config_init).get("predictions") if self.subcommand else None
        if isinstance(writer, PredictionWriter):
            # which tasks write files decides their names, before any batch
            writer.tasks = (self.datamodule.predict_tasks)
            self.datamodule.predict_by_length = True  # the writer puts the lines back in the input's order
        self._record_resolved()
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()
        for callback in self.trainer.callbacks:
            if isinstance(callback, FaultTolerance):
                callback.command = self.arguments
        if config.get("quantize") and self.trainer.strategy.root_device.type != "cpu":
            sys.exit(f"error: --quantize {config.quantize} runs on CPUs, and this run is on "
                     f"{self.trainer.strategy.root_device.type}, where bf16 is the fast path: drop --quantize, or "
                     "run with --trainer.accelerator=cpu.")
        if isinstance(writer, PredictionWriter) and self.subcommand == "predict":  # before any work
            sources = [Path(p) for p in (ckpt_path, init_from) if isinstance(p, (str, Path))]
            sources += [f for p in sources if p.is_dir() for f in p.iterdir()]  # a trunk directory's files
            writer.check(self.trainer, sources + [f for m in self.datamodule.tasks.values() for f in m.input_files()])

    def _record_resolved(self) -> None:
        """Write what ``resolve`` decided into the run's config (saved as config.yaml and logged), so it records what
        ran rather than what was overridden: the checkpoint's model options, the trunk's architecture and
        vocabulary, the tokenizer, each task's lengths and label order."""
        model, data, sub = self.model, self.datamodule, self.subcommand
        # Lightning's own merge of a checkpoint's options, as it would have done
        if (self.run.checkpoint_path is not None):
            options = copy.deepcopy(
                {
                    k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                    for k, v in model.hparams.items()
                    if k != "task_info"
                }
            )  # the parser converts in place
            self.config = self.parser.parse_object(
                {sub: {"model": options}} if sub else {"model": options}, self.config
            )
        config = self.config[sub] if sub else self.config
        if self.run.checkpoint_path is not None:
            config.model.init_from = None  # the checkpoint holds the weights
        if config.model.trunk is None:  # no trunk options given: the defaults ran
            config.model.trunk = Namespace()
        for key, value in model.trunk_config.to_dict().items():
            config.model.trunk[key] = value
        if self.run.tokenizer_source is not None:
            config.data.tokenizer = self.run.tokenizer_source
        config.data.lowercase = data.lowercase
        for name, member in data.tasks.items():
            args = (config.data.tasks or {}).get(name, {}).get("init_args")
            if args is None:
                continue
            for key in ("max_length", "target_max_length"):
                if key in args:
                    args[key] = getattr(member, key)
            if "label_names" in args and getattr(member, "_label_names", None) is not None:
                args["label_names"] = list(member.label_order)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(PredictionWriter, "predictions")
        parser.add_lightning_class_args(FaultTolerance, "fault_tolerance")
        parser.add_argument(
            "--tasks", type=list[str] | None, default=None,
            help="Run only these of the configuration's tasks (their objectives, data and deltas): one task of a "
            "joint recipe alone, say (--tasks [wnut]). The run folder gets their names.",
        )
        parser.add_argument(
            "--finetune_each", type=int, default=0,
            help="fit only: after the tasks are trained jointly, fine-tune each alone for this many epochs from the "
            "joint run's best checkpoint (MT-DNN's second stage), in <default_root_dir>/<task>, each tested on its "
            "best checkpoint. 0: off.",
        )

    # Each step trains one task, so under DDP the other tasks' heads get no gradient that step: the
    # reducer must be told (find_unused_parameters), at the cost of one graph traversal per step.
    DDP_FIND_UNUSED = {
        name: f"{name}_find_unused_parameters_true" for name in ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")
    }

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        self._check_task_names(config)
        self._keep_tasks(config)
        self._check_finetune_each(config)
        # one switch for every bar a run draws: Lightning's, and datasets' ("Generating", "Tokenizing") and the
        # tokenizer
        # trainer's, which follow datasets' (unless HF_DATASETS_DISABLE_PROGRESS_BARS says otherwise)
        (enable_progress_bars if config.trainer.get("enable_progress_bar") is not False else disable_progress_bars)()
        self._check_wandb(config)
        strategy = config.trainer.get("strategy")
        if len(config.model.get("tasks") or {}) > 1 and isinstance(strategy, str) and strategy in self.DDP_FIND_UNUSED:
            config.trainer.strategy = self.DDP_FIND_UNUSED[strategy]
        self._defaults_from_the_config(config)
        if (
            self.subcommand == "fit"
            and config.get("ckpt_path") is None
            and int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0
            and self._last_checkpoints(config)
        ):
            print(
                f"SLURM job {slurm_job_id()} restarted (requeued {os.environ['SLURM_RESTART_COUNT']} times): resuming.",
                file=sys.stderr,
            )
            config.ckpt_path = "last"  # a requeued job runs its command again: it continues where it was stopped
        if config.get("ckpt_path") in ("last", "best"):
            config.ckpt_path = str(self._run_checkpoint(config, config.ckpt_path))
        elif str(config.get("ckpt_path") or "").startswith("~"):  # ~/runs/x.ckpt, as every other path is read
            config.ckpt_path = str(Path(config.ckpt_path).expanduser())

    @staticmethod
    def _keep_tasks(config) -> None:
        """``--tasks``: only the named tasks of the configuration (objectives, data, deltas, fixed sampling weights)."""
        keep = config.get("tasks")
        if not keep:
            return
        known = sorted(config.model.get("tasks") or {})
        unknown = [name for name in keep if name not in known]
        if unknown:
            sys.exit(f"error: --tasks names {unknown}, but this configuration's tasks are {known}.")
        for section, key in ((config.model, "tasks"), (config.data, "tasks"), (config.model, "peft"),
                             (config.data, "weights")):
            if section.get(key):
                section[key] = {name: value for name, value in section[key].items() if name in keep}

    def _check_finetune_each(self, config) -> None:
        epochs, tasks = config.get("finetune_each") or 0, config.model.get("tasks") or {}
        if not epochs:
            return
        devices = config.trainer.get("devices")
        problems = [
            (not isinstance(epochs, int) or epochs < 0, "it is not a whole number of epochs > 0"),
            (self.subcommand != "fit", f"it follows training (trunk fit), not trunk {self.subcommand}"),
            (len(tasks) < 2, f"it fine-tunes the tasks of a joint run, and this run has {len(tasks)}"),
            (len(devices) > 1 if isinstance(devices, list) else str(devices).isdigit() and int(devices) > 1,
             "its stages run in this one process; for several devices run "
             "them one by one (each task: trunk fit --config CONFIG --tasks [NAME] --model.init_from=BEST_CKPT)"),
        ]
        problem = next((text for found, text in problems if found), None)
        if problem:
            sys.exit(f"error: --finetune_each={epochs}: {problem}.")

    def finetune_each(self) -> dict[str, dict]:
        """MT-DNN's second stage (``--finetune_each N``): each task alone for N epochs from the joint run's best
        checkpoint, with the joint run's own settings (its saved config.yaml), in <default_root_dir>/<task>. Returns
        each task's stage: its test score (None without a test split), optimizer steps, minutes and best checkpoint."""
        config = self.config.fit
        callback = self.trainer.checkpoint_callback
        start = (callback.best_model_path or callback.last_model_path) if callback else ""
        if self.trainer.interrupted or not start:
            rank_zero_warn("--finetune_each: the joint run stopped without a checkpoint, so no task is fine-tuned.")
            return {}
        saved, root = Path(self.trainer.log_dir) / "config.yaml", Path(config.trainer.default_root_dir)
        stages = {}
        for task in self.model.objectives:
            began = time.perf_counter()
            # the joint checkpoint brings the tokenizer, which config.yaml recorded as data.tokenizer
            stage = run_cli(["fit", "--config", str(saved), f"--tasks=[{task}]", f"--model.init_from={start}",
                             "--data.tokenizer=null", "--finetune_each=0",
                             f"--trainer.max_epochs={config.finetune_each}", "--trainer.max_steps=-1",
                             f"--trainer.default_root_dir={root / task}"])
            score, best = stage.trainer.callback_metrics.get("test/score"), stage.trainer.checkpoint_callback
            stages[task] = {"test_score": None if score is None else float(score), "steps": stage.trainer.global_step,
                            "minutes": (time.perf_counter() - began) / 60,
                            "checkpoint": best.best_model_path or best.last_model_path if best else None}
        said = {task: "-" if stage["test_score"] is None else f"{stage['test_score']:.4f}"
                for task, stage in stages.items()}
        rank_zero_info(f"Fine-tuned each task from the joint run's best checkpoint ({start}): "
                       + ", ".join(f"{task} test/score {said[task]} ({root / task})" for task in stages))
        return stages

    @staticmethod
    def _defaults_from_the_config(config) -> None:
        """A recipe need not name its run folder: trainer.default_root_dir defaults to runs/<config file name> (the
        default logger writes under it). With ``monitor: val/score`` (the mean of the tasks' primary metrics) in its
        checkpoint callback, renaming or copying a recipe's task is the one edit of its key."""
        files = [Path(str(path)) for path in config.get("config") or []]
        # the recipe: the first file (presets come after it)
        if (config.trainer.get("default_root_dir") is None and files):
            part = "".join(f"_{task}" for task in config.get("tasks") or [])  # a joint recipe's tasks alone: their own
            config.trainer.default_root_dir = str(Path("runs") / (files[0].stem + part))
        # a logger with an empty save_dir (the W&B preset's) writes into the run folder too
        loggers = config.trainer.get("logger")
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            options = getattr(logger, "init_args", None)
            if options is not None and "save_dir" in options and options.save_dir in (None, ""):
                options.save_dir = config.trainer.get("default_root_dir") or "."

    @staticmethod
    def _last_checkpoints(config) -> list[Path]:
        """The run's last.ckpt files under trainer.default_root_dir, oldest first (its stages' left out)."""
        tasks = config.model.get("tasks") or {}
        return last_checkpoints(config.trainer.get("default_root_dir") or ".", set(tasks) if len(tasks) > 1 else set())

    def _run_checkpoint(self, config, which: str) -> Path:
        """``--ckpt_path last | best``: the run's newest last.ckpt under trainer.default_root_dir, or the best
        checkpoint it recorded. Lightning resolves these names only inside a fitting Trainer; any other
        subcommand would evaluate untrained weights, so they are resolved here for every subcommand."""
        root = Path(config.trainer.get("default_root_dir") or ".")
        found = self._last_checkpoints(config)
        if not found:
            sys.exit(
                f"error: --ckpt_path {which}: no last.ckpt under '{root}' (trainer.default_root_dir), so no run to "
                "take it from. Pass the checkpoint's path, or set trainer.default_root_dir to the training run's."
            )
        if which == "best":
            if self.subcommand == "fit":
                sys.exit(
                    "error: --ckpt_path best: a run resumes from its last checkpoint (--ckpt_path last) or from a path."
                )
            # the newest ModelCheckpoint state: in the newest whole checkpoint (a best one may hold weights only)
            best = None
            for path in sorted(found[-1].parent.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True):
                states = load_checkpoint(path).get("callbacks")
                if states:
                    best = next((s["best_model_path"] for s in states.values()
                                 if isinstance(s, dict) and s.get("best_model_path")), None)
                    break
            if best is None:
                sys.exit(
                    f"error: --ckpt_path best: the run in '{found[-1].parent}' recorded no best checkpoint: no "
                    "validation ran before it stopped (its steps ended before the first trainer.val_check_interval), "
                    "so none was picked by its monitor. Use --ckpt_path last (its final weights), or pass a "
                    "checkpoint's path."
                )
            if not Path(best).is_file():
                sys.exit(
                    f"error: --ckpt_path best: the run in '{found[-1].parent}' recorded {best} as its best checkpoint, "
                    "and it no longer exists; pass a checkpoint's path, or --ckpt_path last."
                )
            found.append(Path(best))
        print(f"{'Resuming from' if self.subcommand == 'fit' else 'Checkpoint:'} {found[-1]}", file=sys.stderr)
        return found[-1]

    def _instantiate_trainer(self, config: dict, callbacks: list):
        # Checkpoints are written atomically with a digest, and read with weights_only=True and verified.
        plugins = config.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            run = getattr(self, "run", None)
            config["plugins"] = [*plugins, AtomicCheckpointIO(run and run.checkpoint_path, run and run.checkpoint)]
        config["strategy"] = self._ddp_with_timeout(config.get("strategy"))
        check_multi_node_launch(config.get("num_nodes") or 1, plugins)
        check_strategy_fits_accelerator(config.get("strategy"), config.get("accelerator"))
        if config.get("logger") is None or config.get("logger") is True:
            # Lightning's default is TensorBoard where it is installed; Trunk's is always metrics.csv, the file its
            # docs, benchmarks/plot.py and the resume of a run's history read
            config["logger"] = [CSVLogger(config.get("default_root_dir") or ".", name="lightning_logs")]
        if self.subcommand in ("validate", "test", "predict"):
            self._evaluation_only(config)
        configured = config.get("callbacks") or []
        # the CLI's and the user's
        given = [*callbacks, *(configured if isinstance(configured, list) else [configured])]
        run = getattr(self, "run", None)
        resume = self.subcommand == "fit" and run is not None and run.checkpoint is not None
        lock = [RunFolderLock(resume)] if self.subcommand == "fit" else []  # first: before anything writes there
        quantize = (self.config[self.subcommand] if self.subcommand else self.config).get("quantize")
        accelerator = config.get("accelerator") or "auto"
        on_cpu = not on_cuda(accelerator) and accelerator in ("cpu", "auto")  # as TrunkTrainer decides its threads
        if run is not None and on_cpu and (self.subcommand == "predict" or quantize):
            # predict: the fastest form measured (int8 included); test / validate score in what they are asked
            config["precision"], quantize, said = choose_form(run.model.trunk.cfg, "cpu",
                                                              config.get("precision") or "auto", quantize)
            if said:
                rank_zero_info(f"Precision: {said}.")
        callbacks = [*lock, *callbacks, *run_callbacks(config, given),
                     *([QuantizeForEvaluation(quantize)] if quantize else [])]
        trainer = super()._instantiate_trainer(config, callbacks)
        (
            self.config[self.subcommand] if self.subcommand else self.config
        ).trainer.precision = trainer.precision  # as saved
        if resume:
            self._continue_logging(trainer, run.checkpoint_path, run.checkpoint["global_step"])
        if run is not None:
            run.checkpoint = None  # the CheckpointIO holds it until Lightning's restore
        return trainer

    def _check_resume(self, model_options: dict, ckpt_path: str, from_weights: bool) -> None:
        """A resume continues the saved run: its model, optimizer and schedule as saved, its batches in their order.
        Changed options that would misalign the batches are refused; changed model options, which the saved ones
        override, are named in a warning. Trainer options (max_epochs / max_steps to train longer, devices,
        precision, logging) and evaluation-only data options are honoured."""
        model, data = resume_changes(self.run.checkpoint, model_options, dict(self.datamodule.hparams), from_weights)
        fresh = (f"or start a new run from its weights with --model.init_from={ckpt_path} (a fresh optimizer and "
                 "schedule) instead of --ckpt_path")
        if data:
            sys.exit(
                "error: --ckpt_path resumes the saved run mid-stream, but these options would give it other batches "
                "than it was trained on (the resumed epoch would skip or repeat batches and miss validations): "
                f"{'; '.join(data)}. Resume with the saved values, {fresh}."
            )
        if model:
            rank_zero_warn(
                f"Resuming from {ckpt_path} continues the saved run's model, optimizer and schedule; this config's "
                f"changes to them are not used: {'; '.join(model)}. Resume with the saved values, {fresh}."
            )

    def _evaluation_only(self, config: dict) -> None:
        """An evaluation with a training config leaves the training run's folders alone: no checkpoint callback
        (it saves nothing outside fit, and restoring its state from another folder only warns), and the metrics
        of validate / test in a folder of their own (``<save_dir>/test/version_N``) rather than a new training
        version; predict, which logs nothing, opens no log folder at all."""
        configured = config.get("callbacks") or []
        configured = configured if isinstance(configured, list) else [configured]
        config["callbacks"] = [c for c in configured if not isinstance(c, ModelCheckpoint)]
        config["enable_checkpointing"] = False
        # Lightning's advice to give the checkpoint's callbacks back: left out on purpose, as said above
        warnings.filterwarnings("ignore", message="Be aware that when using `ckpt_path`, callbacks used to create")
        if self.subcommand == "predict":
            config["logger"] = False
            return
        loggers = config.get("logger") or []  # the default CSV logger is in place by now
        if loggers:
            loggers = loggers if isinstance(loggers, list) else [loggers]
            config["logger"] = [
                CSVLogger(logger.save_dir, name=self.subcommand) if isinstance(logger, CSVLogger) else logger
                for logger in loggers
            ]

    def _ddp_with_timeout(self, strategy):
        """``ddp*`` strategies named by string get the process-group timeout of fault_tolerance.ddp_timeout_minutes:
        a process that stops responding turns into an error on every process instead of a hang."""
        if not isinstance(strategy, str) or not strategy.startswith("ddp"):
            return strategy
        name, find_unused = (
            strategy.removesuffix("_find_unused_parameters_true"),
            strategy.endswith("_find_unused_parameters_true"),
        )
        start_method = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_notebook": "fork"}.get(name)
        if start_method is None:
            return strategy
        minutes = (self.config[self.subcommand].get("fault_tolerance") or {}).get("ddp_timeout_minutes", 30.0)
        return DDPStrategy(
            start_method=start_method, find_unused_parameters=find_unused, timeout=timedelta(minutes=minutes)
        )

    @staticmethod
    def _continue_logging(trainer, ckpt_path: Path, step: int) -> None:
        """A resumed run logs to (and checkpoints in) the directory of the run it resumes, so the
        checkpoint callback finds its best score and top-k files again, instead of a new version_N."""
        version_dir = ckpt_path.resolve().parent.parent
        if ckpt_path.resolve().parent.name != "checkpoints" or not version_dir.name.startswith("version_"):
            return  # a checkpoint kept elsewhere: the loggers pick their directories as for a new run
        # Lightning's notes that the folders "exist and are not empty" are the point of a resume here (the CSV history
        # is kept: _keep_csv_history), not a problem
        warnings.filterwarnings("ignore", message=r"(Experiment logs|Checkpoint) directory .* exists and is not empty")
        for logger in trainer.loggers:
            if hasattr(logger, "_version") and Path(logger.root_dir).resolve() == version_dir.parent:
                logger._version = int(version_dir.name.removeprefix("version_"))
                if isinstance(logger, CSVLogger):
                    _keep_csv_history(logger, step)

    @staticmethod
    def _check_wandb(config) -> None:
        """With an API key but no route to the server, log offline at once instead of blocking and failing."""
        uses_wandb = "WandbLogger" in str(config.trainer.get("logger"))
        if (
            uses_wandb
            and os.environ.get("WANDB_MODE", "online") not in ("offline", "disabled", "dryrun")
            and not wandb_reachable()
        ):
            os.environ["WANDB_MODE"] = "offline"
            print(
                "W&B server unreachable: logging offline. Upload the run later with `wandb sync <its directory>`.",
                file=sys.stderr,
            )

    @staticmethod
    def _check_task_names(config) -> None:
        model_tasks, data_tasks = config.model.get("tasks") or {}, config.data.get("tasks") or {}
        if set(model_tasks) != set(data_tasks):
            sys.exit(
                f"error: model.tasks names {sorted(model_tasks)} but data.tasks names {sorted(data_tasks)}: every task "
                "needs an objective (model.tasks.<name>) and data (data.tasks.<name>) under the same name."
            )

    def after_fit(self) -> None:
        """Say again what the last validation warned of (in the summary at the end, not only scrolled past), then
        evaluate the best checkpoint on the test splits right after training, when any is configured."""
        for warning in self.model.validation_warnings:
            if warning not in self.model.said_warnings:  # not just printed by the last validation itself
                rank_zero_warn(f"At the last validation: {warning}")
        if not self.datamodule.has_split("test") or self.trainer.interrupted:
            return
        # max_epochs / max_steps 0, or a run that stopped at once: nothing was learned
        if (self.trainer.global_step == 0):
            rank_zero_warn(
                "No training step was taken, so the test splits are not evaluated (they would score untrained "
                "weights). Evaluate a trained checkpoint with `trunk test --ckpt_path ...`."
            )
            return
        callback = self.trainer.checkpoint_callback
        best = callback.best_model_path if callback else ""
        if not best:
            why = ("fast_dev_run saves no checkpoint" if self.trainer.fast_dev_run
                   else "no validation ran, so none was picked as best" if callback and callback.last_model_path
                   else "no checkpoint was saved")
            rank_zero_warn(f"The test splits score the final weights (step {self.trainer.global_step}): {why}.")
        # A weight-averaging callback (EMA, SWA) would load the checkpoint's raw weights back for the test; the
        # checkpoint's
        # state_dict holds the averaged ones, which `trunk test --ckpt_path` and trunk.tasks.load evaluate: so does this
        # test.
        self.trainer.callbacks = [c for c in self.trainer.callbacks if not isinstance(c, WeightAveraging)]
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None, verbose=False)
        self.after_test()

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict:
        """Lightning's tables of evaluation results repeat every column per data loader: Trunk prints its own."""
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        return {**kwargs, "verbose": False} if subcommand in ("validate", "test") else kwargs

    def after_validate(self) -> None:
        print_metrics(self.trainer, "val")

    def after_test(self) -> None:
        print_metrics(self.trainer, "test")


def print_metrics(trainer: Trainer, stage: str) -> None:
    """An evaluation's metrics, one line per task (and per file, with metrics_per_file), then the run's score."""
    metrics = {key: float(value) for key, value in trainer.callback_metrics.items() if key.startswith(f"{stage}/")}
    if not metrics or not trainer.is_global_zero:
        return
    lines: dict[str, list[str]] = {}
    for key, value in sorted(metrics.items(), key=lambda item: (item[0].count("/") == 1, item[0])):  # tasks, score
        *where, metric = key.split("/")[1:]
        lines.setdefault("/".join(where) or metric, []).append(f"{metric} {value:.4f}" if where else f"{value:.4f}")
    width = max(map(len, lines))
    title = {"val": "Validation", "test": "Test"}[stage]
    rows = [f"  {name:<{width}}  {'  '.join(values)}" for name, values in lines.items()]
    print("\n".join([f"{title} metrics:", *rows]))


def check_strategy_fits_accelerator(strategy, accelerator) -> None:
    """Lightning's FSDP and DeepSpeed strategies run on GPUs only: say so, with what runs on a CPU."""
    name = strategy if isinstance(strategy, str) else ""
    on_cpu = accelerator == "cpu" or (accelerator in (None, "auto") and not torch.cuda.is_available())
    if on_cpu and name.startswith(("fsdp", "deepspeed")):
        raise ValueError(f"trainer.strategy={name} runs on GPUs only, and this run is on CPU. On CPU use DDP: "
                         "--config configs/trainer/ddp_cpu.yaml (or --trainer.strategy=ddp --trainer.devices=2).")


def check_multi_node_launch(num_nodes: int, plugins: list) -> None:
    """``trainer.num_nodes > 1`` needs something that starts the processes on every machine; without it
    the first machine would wait for the others until the process-group timeout."""
    if num_nodes <= 1 or any(isinstance(p, ClusterEnvironment) for p in plugins):
        return
    if any(env.detect() for env in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment)):
        return
    if all(os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK")):
        return  # Lightning's own launcher, started by hand on every machine
    raise ValueError(
        f"trainer.num_nodes={num_nodes} but no multi-machine launcher started this process. On every machine run "
        f"`torchrun --nnodes={num_nodes} --node-rank=<0..{num_nodes - 1}> --nproc-per-node=<devices> "
        "--master-addr=<first machine> --master-port=29500 -m trunk.cli fit ...`, or launch with SLURM (`srun trunk "
        "fit ...`; docs/scaling.md), or set MASTER_ADDR, MASTER_PORT and NODE_RANK on each machine. On one machine, "
        "leave num_nodes at 1."
    )


def _keep_csv_history(logger: CSVLogger, step: int) -> None:
    """Lightning's CSV writer deletes an existing metrics.csv; a resumed run keeps the rows its checkpoint's
    state had logged (later ones are logged again) and appends to them. A row of step s is logged by the batch
    that brings global_step to s + 1, after that batch's checkpoints: a checkpoint of global_step g holds the rows
    of steps below g."""
    path = Path(logger.log_dir) / "metrics.csv"
    if not path.is_file():
        return
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header, rows = list(reader.fieldnames or []), [r for r in reader if int(r.get("step") or 0) < step]
    writer = logger.experiment  # created now: it removes the file
    with path.open("w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=header)
        out.writeheader()
        out.writerows(rows)
    writer.metrics_keys = header


def run_cli(args: list[str] | None = None, run: bool = True, callbacks: list | None = None) -> TrunkCLI:
    """Run the CLI and return it (for tests, notebooks and ``trunk tune``); ``main`` is the console entry point.
    With ``run=False`` there is no subcommand: the classes are only instantiated. ``callbacks``: objects the Trainer
    gets beside the config's (a tune's reporter, which holds its trial)."""
    args = recipe_beside_checkpoint(sys.argv[1:] if args is None else args)
    check_config_files(args)
    quiet_third_party()
    if not wandb_has_credentials():
        os.environ.setdefault("WANDB_MODE", "offline")  # never block on a login prompt
    cli = TrunkCLI(
        TrunkModule,
        MultiTaskData,
        trainer_class=TrunkTrainer,
        parser_class=TrunkArgumentParser,
        save_config_callback=LogConfigCallback,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
        trainer_defaults={"callbacks": callbacks} if callbacks else None,
        parser_kwargs={
            "prog": "trunk",
            "description": "Trunk: transformer tasks on one shared trunk (masked-LM / ELECTRA pretraining, "
                           "classification, NER, translation, ViT), trained alone or jointly.",
            "epilog": "Also: " + "; ".join(f"{name}: {SUBCOMMANDS[name]}" for name in COMMANDS)
                      + " (trunk NAME --help)",
        },
    )
    if run and cli.subcommand == "fit" and cli.config.fit.get("finetune_each"):
        cli.finetune_stages = cli.finetune_each()
    return cli


