"""Where a run's facts are decided, once, for every entry point.

``trunk fit`` from scratch, ``model.init_from``, ``--ckpt_path`` with every subcommand and
``trunk.tasks.load`` all go through ``resolve``:

1. read the source once: a checkpoint to continue or evaluate (``ckpt_path``), or a trunk directory or
   checkpoint to start from (``init_from``); nothing from scratch;
2. the codec (the run's tokenizers): the source's, else the data's own (loaded or trained), handed
   to the data with ``TaskSet.connect`` (litgpt's ``DataModule.connect``);
3. labels reconciled by *name*: a checkpoint being continued or evaluated keeps its trained order (the
   data encodes ids in it); a new run from ``init_from`` keeps the data's order and reorders the
   stored heads' rows (``Objective.load_head``); another label set is an error naming both, or with
   ``reinit_mismatched_heads`` a fresh classifier;
4. one length rule (``fit_lengths``);
5. ``TrunkModule`` built (it reads no file), then the ``init_from`` weights loaded. With ``ckpt_path``
   Lightning restores the weights from the contents read in 1 (``AtomicCheckpointIO`` is handed them).

What it decided is said in one short block at the start of the run (``Resolved.report``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from trunk.assembly.weights import HeadReuse, load_weights
from trunk.core.checkpoint import is_sharded_checkpoint, load_checkpoint
from trunk.core.codec import Codec
from trunk.core.contract import check_task_names
from trunk.formats.task_dir import read_trunk
from trunk.formats.trunk_dir import PretrainedTrunk, pretrained_trunk_config, select_layers, trunk_config
from trunk.models import TrunkConfig
from trunk.tasks.registry import as_objective, check_stored_tasks
from trunk.training.finetuning import FinetuneConfig
from trunk.training.module import TrunkModule


# How a trained model is run, not what it learned: with --ckpt_path these come from the config, not the
# checkpoint (else a beam size could never change).
class RunSourceError(ValueError):
    """The checkpoint or trunk directory a run starts from cannot be used (the CLI prints it without a traceback)."""


@dataclass
class Resolved:
    """A run ready to hand to the Trainer: the model, the checkpoint read for it (Lightning restores from
    these contents instead of reading the file again) and what was decided, in words."""

    model: TrunkModule
    checkpoint: dict | None = None
    checkpoint_path: Path | None = None
    report: list[str] = field(default_factory=list)
    tokenizer_source: str | None = None  # the directory or checkpoint the tokenizer came from, if any

    def say(self) -> None:
        if self.report:
            rank_zero_info("Run:\n" + "\n".join(f"  {line}" for line in self.report))


def read_run_checkpoint(path: str | Path) -> dict:
    """A checkpoint of ``trunk fit`` for ``--ckpt_path``, ``trunk serve`` or ``trunk.tasks.load``, read once and
    verified (messages name the file, not the option: the caller says which)."""
    path = Path(path)
    if not path.is_file() and not is_sharded_checkpoint(path):
        what = "is a directory but not a sharded checkpoint (no meta.pt)" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"'{path}' {what}. Give the path of a .ckpt written by `trunk fit`.")
    ckpt = load_checkpoint(path)
    if "trunk_meta" not in ckpt or "state_dict" not in ckpt:
        raise ValueError(f"'{path}' was not written by a Trunk run of this version (it has no trunk_meta): "
                         "an older checkpoint, or not Trunk's.")
    # the classes it names for its tasks, before anything is built from them
    heads = ckpt["trunk_meta"].get("heads") or {}
    check_stored_tasks(str(path), stored_options(ckpt).get("tasks") or {},
                       (ckpt.get("datamodule_hyper_parameters") or {}).get("data_tasks") or {},
                       {task: head.get("kind") for task, head in heads.items()})
    return ckpt


def stored_options(ckpt: dict) -> dict:
    """The model options a checkpoint was trained with, as ``TrunkModule`` takes them (older checkpoints
    also stored ``init_from``: where their weights came from, not needed to rebuild them)."""
    names = inspect.signature(TrunkModule.__init__).parameters
    return {
        k: v for k, v in (ckpt.get("hyper_parameters") or {}).items() if k in names and k not in ("task_info", "codec")
    }


def check_checkpoint_tasks(ckpt: dict, objectives: dict, path: str | Path) -> None:
    """The checkpoint must have been trained for these tasks (names and kinds)."""
    stored = {task: head["kind"] for task, head in ckpt["trunk_meta"]["heads"].items()}
    configured = {task: objective.kind for task, objective in objectives.items()}
    if stored != configured:
        raise RunSourceError(
            f"--ckpt_path '{path}' was trained for the tasks {stored}, but this config has {configured}. Pass the "
            "config the checkpoint was trained with; or, to start a new run from its weights (heads carry over by "
            f"task name and kind), use --model.init_from={path} instead of --ckpt_path."
        )


def checkpoint_options(ckpt: dict, configured: dict) -> dict:
    """The options to rebuild a checkpoint's model: its own, with the configured inference options."""
    options = stored_options(ckpt)
    tasks = {}
    for name, spec in options["tasks"].items():
        own = configured.get("tasks", {}).get(name)
        init_args = dict(spec.get("init_args") or {})
        if own is not None:
            own = as_objective(own)
            init_args.update({k: v for k, v in own.config.items() if k in own.inference_options})
        tasks[name] = {**spec, "init_args": init_args}
    return {**options, "tasks": tasks}


# Data options that decide which batches a run trains on, in which order: a resumed run replays the saved run's stream
# and skips the batches already trained on, so with other values it would skip or repeat batches and miss validations.
STREAM_OPTIONS = (
    "train",
    "batch_size",
    "max_length",
    "val_fraction",
    "test_fraction",
    "hold_out_by",
    "select",
    "dataset",
    "dataset_config",
    "column_names",
    "file_type",
    "line_pattern",
    "encoding",
    "unlabelled",
    "documents",
    "text_column",
    "text_pair_column",
    "label_column",
    "bucket_by_length",
    "sampling",
    "temperature",
    "weights",
    "anneal_to",
    "steps_per_epoch",
    "seed",
    "tokenizer",
    "tokenizer_vocab_size",
    "tokenizer_min_frequency",
)


def _leaves(value, prefix: str = "") -> dict:
    """Nested plain options as ``{"optimizer.lr": 0.001, ...}``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if hasattr(value, "spec") and callable(value.spec):  # an objective
        value = value.spec()
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _leaves(item, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): list(value) if isinstance(value, tuple) else value}


def resume_changes(ckpt: dict, model_options: dict, data_options: dict,
                   from_weights: bool = False) -> tuple[list[str], list[str]]:
    """What a resumed run's config changes against the checkpoint it resumes: (model options, which the saved run's
    values override, and stream options, which would misalign the resumed epoch), each as ``name: saved ->
    configured``. ``from_weights``: the config starts from ``model.init_from``, whose architecture filled the trunk
    options the config leaves at their defaults, as it did the saved run's: those are no change."""

    def differ(saved: dict, configured: dict, keep) -> list[str]:
        return [f"{key}: {saved[key]!r} -> {configured[key]!r}" for key in sorted(set(saved) & set(configured))
                if keep(key) and saved[key] != configured[key]]

    stored = stored_options(ckpt)
    if from_weights and model_options.get("trunk") is not None and stored.get("trunk") is not None:
        saved_trunk = trunk_config(stored["trunk"])
        try:
            filled = pretrained_trunk_config(model_options["trunk"], saved_trunk, saved_trunk.vocab_size)
            model_options = {**model_options, "trunk": filled}
        except ValueError:  # the config's own shape does not fit the weights': every differing field is named
            pass
    saved, configured = _leaves(stored), _leaves({k: v for k, v in model_options.items() if k in stored})
    inference = {f"tasks.{name}.init_args.{option}" for name, o in (model_options.get("tasks") or {}).items()
                 for option in as_objective(o).inference_options}
    model = differ(saved, configured, lambda key: key not in inference and key != "trunk.vocab_size")
    stored_data = ckpt.get("datamodule_hyper_parameters") or {}
    data = differ(_leaves(stored_data, "data."), _leaves(data_options, "data."),
                  lambda key: key.split(".")[-1] in STREAM_OPTIONS and not key.startswith("data._"))
    return [f"model.{line}" for line in model], data


def fit_lengths(tasks: dict, max_len: int, fixed_by: str | None) -> list[str]:
    """The one length rule: no task reads or writes more tokens than the trunk's position table holds.
    Trained weights fix the table (``fixed_by`` names them): longer lengths are lowered to it, and the
    report says so. A run that chooses the table itself (from scratch) is told to raise it or lower the
    length instead."""
    notes = []
    for name, member in tasks.items():
        for key in ("max_length", "target_max_length"):
            value = getattr(member, key, None)
            if not value or value <= max_len:
                continue
            if fixed_by is None:
                raise ValueError(
                    f"data.tasks.{name}.{key}={value} is longer than the trunk's max_len={max_len}: lower "
                    f"data.tasks.{name}.{key}, or raise model.trunk.max_len (a pretrained trunk's max_len is fixed)."
                )
            setattr(member, key, max_len)
            notes.append(
                f"data.tasks.{name}.{key} {value} -> {max_len}: the position table of {fixed_by} holds {max_len}"
            )
    return notes


def lowercases(tokenizer) -> bool:
    """Whether a tokenizer lowercases its input (a step of its normalizer: Lowercase, or BERT's with lowercase on)."""
    normalizer = json.dumps(json.loads(tokenizer.to_str()).get("normalizer"))
    return '"Lowercase"' in normalizer or '"lowercase": true' in normalizer


def composed_deltas(peft: dict | None, pretrained: PretrainedTrunk) -> dict | None:
    """``model.peft`` with each ``compose`` list of task names replaced by those tasks' delta options, as stored with
    their heads in ``model.init_from`` (their task directories)."""
    out = dict(peft or {})
    for task, options in out.items():
        names = options.get("compose") if isinstance(options, dict) else None
        if isinstance(names, (list, tuple)):
            with_deltas = sorted(name for name, head in pretrained.heads.items() if head["meta"].get("peft"))
            missing = [name for name in names if name not in with_deltas]
            if missing:
                raise RunSourceError(
                    f"model.peft.{task}.compose names {missing}, but model.init_from brings deltas for "
                    f"{with_deltas or 'no task'}. Add their task directories to model.init_from."
                )
            out[task] = {**options, "compose": {name: pretrained.heads[name]["meta"]["peft"] for name in names}}
    return out or peft


def resolve(
    options: dict,
    data,
    *,
    init_from: str | Path | PretrainedTrunk | None = None,
    ckpt_path: str | Path | None = None,
    reuse: HeadReuse | None = None,
    checkpoint: dict | None = None,
    layers: list[int] | str | None = None,
) -> Resolved:
    """Decide a run's facts once and build its model (see the module's docstring).

    ``options``: ``TrunkModule``'s arguments (objectives or their class_path specs, trunk, optimizer, ...);
    ``data``: the run's ``TaskSet`` (its ``MultiTaskData``, or the tasks alone for inference); ``init_from``: a path, or
    a trunk already read; ``checkpoint``: ``ckpt_path``'s contents when already read; ``reuse``: how ``init_from``'s
    heads start tasks of other names or labels (``trunk.assembly.weights``); ``layers``: ``init_from``'s blocks a
    shallower trunk starts from (``select_layers``)."""
    resolved = _resolve(options, data, init_from=init_from, ckpt_path=ckpt_path, reuse=reuse, checkpoint=checkpoint,
                        layers=layers)
    for name, task in data.tasks.items():
        if task.has_split("unlabelled") and name not in resolved.model.distill:
            raise RunSourceError(f"{task.option('unlabelled')} gives inputs without labels, which train a task only "
                                 f"through its teachers' answers: name them with model.distill.{name}.teachers, or "
                                 f"remove {task.option('unlabelled')}.")
    # what each task reads, said once: a column that is not read (a pair trained as single texts) shows here
    resolved.report += [f"task '{name}' reads {columns}" for name, task in data.tasks.items()
                        if (columns := task.columns_read())]
    return resolved


def _resolve(options: dict, data, *, init_from, ckpt_path, reuse, checkpoint, layers) -> Resolved:
    report: list[str] = []
    check_task_names(data.tasks)
    if ckpt_path is not None:
        if checkpoint is None:
            try:
                checkpoint = read_run_checkpoint(ckpt_path)
            except FileNotFoundError as err:
                raise RunSourceError(f"--ckpt_path {err}") from None
            except ValueError as err:
                raise RunSourceError(f"--ckpt_path: {err}") from None
        ckpt = checkpoint
        if options.get("tasks"):  # trunk.tasks.load names none: it takes the checkpoint's
            check_checkpoint_tasks(ckpt, {name: as_objective(o) for name, o in options["tasks"].items()}, ckpt_path)
        codec = Codec.from_state(ckpt.get("codec", {}))
        data.connect(codec)
        # the data's state (the training split's label counts, target statistics) from the checkpoint: evaluating or
        # predicting reads nothing of the training files
        states = next((value for key, value in ckpt.items() if key.endswith("MultiTaskData")), {})
        for name, member in data.tasks.items():
            if name in states:
                member.load_state_dict(states[name])
        options = checkpoint_options(ckpt, options)
        for name, head in ckpt["trunk_meta"]["heads"].items():
            if head.get("label_names") is not None:
                note = data.tasks[name].use_labels_of(head["label_names"], f"--ckpt_path '{ckpt_path}'")
                report += [note] if note else []
        trunk = trunk_config(options["trunk"])
        report += fit_lengths(data.tasks, trunk.max_len, f"'{ckpt_path}'")
        model = TrunkModule(**{**options, "trunk": trunk}, task_info=data.task_info, codec=codec)
        report.insert(
            0, f"weights, tokenizer and labels from --ckpt_path '{ckpt_path}' (step {ckpt.get('global_step', 0)})"
        )
        return Resolved(model, ckpt, Path(ckpt_path), report, str(ckpt_path))

    if init_from is not None:
        try:
            pretrained = init_from if isinstance(init_from, PretrainedTrunk) else read_trunk(init_from)
        except (FileNotFoundError, ValueError) as err:
            raise RunSourceError(f"model.init_from: {err}") from None
        source = pretrained.path
        report.append(f"weights from model.init_from '{source}'")
        if layers is not None:
            depth = pretrained.config.n_layers
            try:
                pretrained = select_layers(pretrained, layers)
            except ValueError as err:
                raise RunSourceError(str(err)) from None
            report.append(f"a trunk of {pretrained.config.n_layers} of its {depth} blocks (model.init_layers="
                          f"{layers})")
        if "text" in pretrained.stems:
            if data.tokenizer_path is not None and Path(data.tokenizer_path).resolve() not in (
                source.resolve(),
                (source / "tokenizer.json").resolve(),
            ):
                raise RunSourceError(
                    f"data.tokenizer='{data.tokenizer_path}' but model.init_from='{init_from}' brings its own "
                    "tokenizer, which the pretrained weights need. Remove data.tokenizer."
                )
            tokenizer = pretrained.codec.tokenizer
            report.append(f"tokenizer from '{source}' ({tokenizer.get_vocab_size()} tokens, "
                          f"{'lowercasing' if lowercases(tokenizer) else 'keeping case'})")
            # a stored head's target tokenizer goes with it, to the task of its name or the one heads_from starts
            # from it
            heads_from = (reuse.heads_from if reuse is not None else None) or {}
            brought = {task: pretrained.codec.targets[heads_from.get(task, task)] for task in data.tasks
                       if heads_from.get(task, task) in pretrained.codec.targets}
            data.connect(Codec(tokenizer, brought))
            # else the data's own
            targets = {name: member.own_target_tokenizer() for name, member in data.text_tasks.items()}
            # it would train no tokenizer here
            if data.lowercase != lowercases(tokenizer) and not any(targets.values()):
                if data.lowercase:  # asked for and not done (the default, False, was never the user's to miss)
                    report.append("data.lowercase=True is not used: the tokenizer brings its own normalisation, which "
                                  "keeps case")
                data.lowercase = lowercases(tokenizer)
            data.connect(Codec(tokenizer, {name: t for name, t in targets.items() if t is not None}))
        else:
            data.connect(data.build_codec())
        vocab_size = data.tokenizer.get_vocab_size() if data.tokenizer is not None else pretrained.config.vocab_size
        trunk = pretrained_trunk_config(options.get("trunk"), pretrained.config, vocab_size, source)
        # the pretrained max_len, or a new one without a table
        report += fit_lengths(data.tasks, trunk.max_len, f"'{source}'")
        model = TrunkModule(**{**options, "trunk": trunk, "peft": composed_deltas(options.get("peft"), pretrained)},
                            task_info=data.task_info, codec=data.codec)
        source_tokenizer = str(source) if "text" in pretrained.stems else None
        carried = load_weights(model, pretrained, reuse)
        return Resolved(model, report=report + carried, tokenizer_source=source_tokenizer)

    trunk = trunk_config(options.get("trunk") or TrunkConfig())
    report += fit_lengths(data.tasks, trunk.max_len, None)  # before the codec: a tokenizer can take minutes to train
    codec = data.build_codec()
    data.connect(codec)
    report.append("weights: fresh (from scratch)")
    if codec.tokenizer is not None:
        origin = (
            f"data.tokenizer '{data.tokenizer_path}'"
            if data.tokenizer_path
            else "trained on the training text (cached)"
        )
        report.append(f"tokenizer: {origin}, {codec.tokenizer.get_vocab_size()} tokens")
    if codec.tokenizer is not None:
        trunk = dataclasses.replace(trunk, vocab_size=codec.tokenizer.get_vocab_size())
    layer_decay = (options.get("finetune") or FinetuneConfig())
    layer_decay = layer_decay["layer_decay"] if isinstance(layer_decay, dict) else layer_decay.layer_decay
    if layer_decay < 1.0:
        rank_zero_warn(
            f"finetune.layer_decay={layer_decay} without model.init_from: the randomly initialised lower layers learn "
            "more slowly than the top. Set layer_decay to 1.0 when training from scratch."
        )
    return Resolved(TrunkModule(**{**options, "trunk": trunk}, task_info=data.task_info, codec=codec), report=report)
