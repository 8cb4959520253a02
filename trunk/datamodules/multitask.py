"""The run's datamodule: one or more named tasks' data, one tokenizer, and which task trains next.

A single-task run is the one-entry case. Training batches come from a stream that draws the task
of each step by a sampling rule (``TaskSampler``); under DDP every process draws the same task
sequence (same seed) and a different shard of that task's rows, so every head is used on every
process at every step. Validation and test run every task that has the split, every time.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, IterableDataset

from trunk.core.atomic import atomic_write
from trunk.core.codec import Codec, load_tokenizer
from trunk.datamodules.text import STAGE_ROLES, TaskData, TextDataModule
from trunk.datamodules.tokenizer import TRAINERS, cached_tokenizer

# The training stream builds batches in the main process (never in workers), so its length is exact.
warnings.filterwarnings("ignore", message=".*Your `IterableDataset` has `__len__` defined.*")

Sampling = Literal["proportional", "temperature", "uniform", "fixed", "annealed"]
SAMPLING_MODES = ("proportional", "temperature", "uniform", "fixed", "annealed")


class TaskSampler:
    """Probabilities of drawing each task for the next training batch (jiant / MT-DNN's rules).

    With n_i training rows per task:
      * ``proportional``: p_i ∝ n_i (every row seen about once per epoch);
      * ``temperature``: p_i ∝ n_i^(1/T) (T=1: proportional; large T: towards uniform);
      * ``uniform``: p_i = 1 / number of tasks;
      * ``fixed``: p_i ∝ the given weights;
      * ``annealed``: p_i ∝ n_i^α with α going linearly from 1 (proportional) at the start to
        ``anneal_to`` at the end of training (0: uniform), as in Stickland & Murray (2019).
    """

    def __init__(self, sizes: dict[str, int], mode: Sampling = "proportional", temperature: float = 2.0,
                 weights: dict[str, float] | None = None, anneal_to: float = 0.0) -> None:
        if mode not in SAMPLING_MODES:
            raise ValueError(f"data.sampling={mode!r} is not one of {SAMPLING_MODES}.")
        if temperature <= 0:
            raise ValueError(f"data.temperature must be > 0, got {temperature}: p ∝ n^(1/T), so 1 is proportional and "
                             "larger values move towards uniform (2 is common).")
        if not 0.0 <= anneal_to <= 1.0:
            raise ValueError(
                f"data.anneal_to must be in [0, 1] (0: uniform at the end, 1: proportional), got {anneal_to}."
            )
        empty = [name for name, n in sizes.items() if n < 1]
        if empty:
            raise ValueError(f"Tasks {empty} have no training rows.")
        self.sizes, self.mode, self.temperature, self.anneal_to = sizes, mode, temperature, anneal_to
        self.weights = self._check_weights(weights) if mode == "fixed" else None
        if weights and mode != "fixed":
            raise ValueError(
                f"data.weights are used only with data.sampling=fixed, not {mode!r}: remove them or set sampling: "
                "fixed."
            )

    def _check_weights(self, weights: dict[str, float] | None) -> dict[str, float]:
        weights = dict(weights or {})
        if set(weights) != set(self.sizes):
            raise ValueError(f"data.sampling=fixed needs one weight per task: the tasks are {sorted(self.sizes)}, "
                             f"data.weights names {sorted(weights)}.")
        bad = {
            name: w for name, w in weights.items() if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0)
        }
        if bad:
            raise ValueError(f"data.weights must be finite and >= 0; got {bad}.")
        if sum(weights.values()) <= 0:
            raise ValueError(f"data.weights sum to zero ({weights}): give at least one task a positive weight.")
        return weights

    def probabilities(self, progress: float = 0.0) -> dict[str, float]:
        """Each task's probability; ``progress`` in [0, 1] is how far training is (for ``annealed``)."""
        if self.mode == "fixed":
            raw = self.weights
        elif self.mode == "uniform":
            raw = {name: 1.0 for name in self.sizes}
        else:
            exponent = {"proportional": 1.0, "temperature": 1.0 / self.temperature,
                        "annealed": 1.0 - (1.0 - self.anneal_to) * min(max(progress, 0.0), 1.0)}[self.mode]
            raw = {name: n ** exponent for name, n in self.sizes.items()}
        total = sum(raw.values())
        return {name: w / total for name, w in raw.items()}

    def draw(self, steps: int, generator: torch.Generator, progress: float = 0.0) -> list[str]:
        names, probs = zip(*self.probabilities(progress).items())
        picks = torch.multinomial(
            torch.tensor(probs, dtype=torch.float64), steps, replacement=True, generator=generator
        )
        return [names[i] for i in picks.tolist()]


class MultiTaskStream(IterableDataset):
    """One epoch of training batches: the task sequence of the epoch (the same on every process), and
    for each step the next batch of that task from this process's shard of its rows."""

    def __init__(self, data: MultiTaskData) -> None:
        self.data = data

    def __len__(self) -> int:
        return self.data.steps_per_epoch()

    def __iter__(self):
        data = self.data
        epoch, rank, world = data.position()
        schedule = self.schedule(epoch)
        streams = {}
        for task_index, (name, member) in enumerate(data.tasks.items()):
            # A streamed task continues where the earlier epochs left it; a task of rows starts a pass per epoch.
            before = sum(self.schedule(e).count(name) for e in range(epoch)) if member.streaming else 0
            streams[name] = member.train_items(f"{data.run_seed()}/{task_index}", epoch, rank, world, before)
        done = data.batches_done(epoch)  # a resumed run: the batches of this epoch trained before the checkpoint
        seed = data.run_seed() * 1_000_003 + epoch
        for step, name in enumerate(schedule):
            item = next(streams[name])
            if step < done:
                continue
            # The batch's own randomness (masks, augmentation) depends only on where it is in the run,
            # not on what ran before it: a resumed run builds the same batches.
            generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
            yield {"task": name, **data.tasks[name].train_batch(item, generator)}

    def schedule(self, epoch: int) -> list[str]:
        """The task of each training step of ``epoch`` (the same on every process)."""
        data = self.data
        seed = data.run_seed() * 1_000_003 + epoch
        return data.sampler().draw(len(self), torch.Generator().manual_seed(seed), data.progress(epoch))


class TaskSet:
    """Named tasks' data and the run's codec: what a run's facts are decided on (``trunk.assembly.run.resolve``) and
    what inference keeps of a run's data. ``MultiTaskData`` is a task set that is also Lightning's datamodule (splits,
    batches, task sampling). Args: see ``MultiTaskData``."""

    def __init__(self, tasks: dict[str, TaskData], tokenizer: str | None = None, tokenizer_vocab_size: int = 8192,
                 tokenizer_min_frequency: int = 2, tokenizer_model: str = "auto", lowercase: bool = False) -> None:
        super().__init__()  # Lightning's datamodule, in a MultiTaskData
        if not tasks:
            raise ValueError("data.tasks is empty: name at least one task and its data.")
        wrong = {name: type(member).__name__ for name, member in tasks.items() if not isinstance(member, TaskData)}
        if wrong:
            raise TypeError(f"data.tasks entries must be TaskData classes (TextClassificationData, ...); got {wrong}.")
        if tokenizer_model != "auto" and tokenizer_model not in TRAINERS:
            *others, last = TRAINERS
            raise ValueError(f"data.tokenizer_model={tokenizer_model!r}: choose auto, {', '.join(others)} or {last}.")
        if tokenizer_min_frequency < 1:
            raise ValueError(f"data.tokenizer_min_frequency must be >= 1, got {tokenizer_min_frequency}.")
        for name, member in tasks.items():
            member.name = name
            member.check_no_null_options()
        self.tasks = dict(tasks)
        self.tokenizer_path, self.tokenizer_vocab_size, self.lowercase = tokenizer, tokenizer_vocab_size, lowercase
        self.tokenizer_min_frequency, self.tokenizer_model = tokenizer_min_frequency, tokenizer_model
        self._codec: Codec | None = None

    # -- the codec: one per run ------------------------------------------------------------------
    @property
    def text_tasks(self) -> dict[str, TextDataModule]:
        return {name: m for name, m in self.tasks.items() if isinstance(m, TextDataModule)}

    def build_codec(self) -> Codec:
        """The run's tokenizers when nothing trained brings them (``trunk.assembly.run`` decides): ``tokenizer``
        loaded, else trained once on every text task's training text (cached, keyed by all of it); a
        translation task with a vocabulary of its own adds its target tokenizer."""
        tokenizer = None
        if self.text_tasks and self.tokenizer_path:
            tokenizer = load_tokenizer(self.tokenizer_path)
        elif self.text_tasks:
            members = self.text_tasks.values()
            streamed = [m.name for m in members if m.streaming]
            if streamed:
                raise ValueError(
                    f"Tasks {streamed} stream their training text, so there is no pass over it to train a tokenizer "
                    "on: set data.tokenizer (a tokenizer.json, a trunk directory or a checkpoint), or model.init_from."
                )
            if any(m.split_specs["train"] is None for m in members):
                raise ValueError(
                    "No tokenizer to use: set data.tokenizer (a tokenizer.json, a trunk directory or a checkpoint), "
                    "or model.init_from, or give every text task a train split to train one on."
                )
            generates = any(m.tokenizer_model == "bpe" for m in members)  # exact detokenization needed
            model = self.tokenizer_model if self.tokenizer_model != "auto" else "bpe" if generates else "wordpiece"
            if model in ("wordpiece", "word") and generates:
                raise ValueError(
                    f"data.tokenizer_model={model} cannot detokenize generated text exactly; a task here generates "
                    "text (translation): use bpe, byte_bpe or auto."
                )
            key = [m.tokenizer_key() for m in members]
            texts = lambda: (t for m in members for t in m.texts_for_tokenizer())  # noqa: E731
            tokenizer = cached_tokenizer(
                key,
                texts,
                model,
                self.tokenizer_vocab_size,
                self.lowercase,
                f"the training text of {sorted(self.text_tasks)}",
                self.tokenizer_min_frequency,
            )
        for member in self.text_tasks.values():
            member.connect(tokenizer, self.lowercase)
        targets = {name: m.own_target_tokenizer() for name, m in self.text_tasks.items()}
        return Codec(tokenizer, {name: target for name, target in targets.items() if target is not None})

    def connect(self, codec: Codec) -> None:
        """Hand every task the run's tokenizers (a translation task with its own vocabulary takes its target
        tokenizer from ``codec.targets`` when it is there)."""
        self._codec = codec
        for name, member in self.text_tasks.items():
            member.connect(codec.tokenizer, self.lowercase, codec.targets.get(name))

    @property
    def codec(self) -> Codec:
        """The run's tokenizers: as connected, or built now (data used without ``trunk.assembly.run``)."""
        if self._codec is None:
            self.connect(self.build_codec())
        return self._codec

    @property
    def tokenizer(self):
        """The tokenizer of every text task; None when no task reads text."""
        return self.codec.tokenizer

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary. Image-only runs build no text stem, so the value is then the config's
        default and unused."""
        tokenizer = self.tokenizer
        return tokenizer.get_vocab_size() if tokenizer is not None else 8192

    @property
    def task_info(self) -> dict[str, dict]:
        """What the model must know of each task's data: the objective kinds it feeds, its stem, label
        names, lengths, a translation task's target vocabulary."""
        self.codec  # noqa: B018 (text tasks need it to report target vocabularies)
        return {name: member.info() for name, member in self.tasks.items()}


class MultiTaskData(TaskSet, L.LightningDataModule):
    """The datamodule of every run: a ``TaskSet`` (named tasks' data, the run's tokenizer) with task sampling.

    Args:
        tasks: task name -> its data (a ``TaskData`` subclass: ``TextClassificationData``,
            ``TokenClassificationData``, ``CorpusData``, ``TranslationData``, ``ImageClassificationData``).
            The names must be those of ``model.tasks``.
        sampling: how the next training batch's task is drawn: ``proportional`` (to the tasks'
            training rows), ``temperature``, ``uniform``, ``fixed`` (``weights``) or ``annealed``
            (see ``TaskSampler``).
        temperature: T of temperature sampling (p ∝ n^(1/T)).
        weights: task -> weight, for ``fixed`` sampling.
        anneal_to: the exponent ``annealed`` sampling ends at (0: uniform, 1: proportional).
        steps_per_epoch: training batches per epoch; unset: the batches of one pass over every task
            (per process).
        seed: the sampling seed; unset: the run's ``seed_everything`` (else 0).
        predict_task: with ``trunk predict``, predict only this task; unset: every task whose predict split is set.
        tokenizer: the run's tokenizer (a tokenizer.json, a directory holding one, or a Trunk .ckpt);
            unset: trained on the training text of all text tasks (cached). ``model.init_from`` sets it.
        tokenizer_vocab_size: the vocabulary size when training it (at most: see tokenizer_min_frequency).
        tokenizer_min_frequency: when training it, the times a piece must occur in the training text to be a token.
        tokenizer_model: when training it: ``wordpiece`` (BERT's), ``bpe`` (SentencePiece-style, exact
            detokenization: what translation needs), ``byte_bpe`` (GPT-2's byte level: no text is ever [UNK], for
            noisy user text), ``word`` (whole words; a word seen fewer than tokenizer_min_frequency times is [UNK]: for
            classifying a few thousand short texts, see docs/results.md); ``auto``: ``bpe`` when a task generates text,
            else ``wordpiece``.
        lowercase: lowercase text when training it.
    """

    def __init__(
        self,
        tasks: dict[str, TaskData],
        sampling: Sampling = "proportional",
        temperature: float = 2.0,
        weights: dict[str, float] | None = None,
        anneal_to: float = 0.0,
        steps_per_epoch: int | None = None,
        seed: int | None = None,
        predict_task: str | None = None,
        tokenizer: str | None = None,
        tokenizer_vocab_size: int = 8192,
        tokenizer_min_frequency: int = 2,
        tokenizer_model: Literal["auto", "wordpiece", "bpe", "byte_bpe", "word"] = "auto",
        lowercase: bool = False,
    ) -> None:
        # (zero-argument super: Lightning's save_hyperparameters finds this __init__'s arguments through it)
        super().__init__(tasks, tokenizer, tokenizer_vocab_size, tokenizer_min_frequency, tokenizer_model, lowercase)
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ValueError(f"data.steps_per_epoch must be >= 1, got {steps_per_epoch}.")
        if predict_task is not None and predict_task not in tasks:
            raise ValueError(
                f"data.predict_task={predict_task!r} is not a task of this run; the tasks are {sorted(tasks)}."
            )
        # Under the CLI the hyperparameters are the config (plain values), which lets trunk.tasks.load rebuild
        # each task's data; data objects built in Python are not stored (checkpoints hold plain values only).
        # ("data_tasks": Lightning merges these with the model's hyperparameters, which have their own "tasks".)
        self.save_hyperparameters()
        specs = self.hparams["tasks"]
        self.save_hyperparameters(ignore=["tasks"])
        self.hparams["data_tasks"] = {name: spec if isinstance(spec, dict) else None for name, spec in specs.items()}
        self.sampling, self.temperature, self.weights, self.anneal_to = sampling, temperature, weights, anneal_to
        # the sampling options checked now, not after encoding
        TaskSampler({name: 1 for name in tasks}, sampling, temperature, weights, anneal_to)
        self._steps_per_epoch, self.seed, self.predict_task = steps_per_epoch, seed, predict_task
        # Predict batches in order of length (less padding): set by a consumer that restores the rows' order from the
        # batches' "index" (the CLI, for its PredictionWriter); trainer.predict's own list stays in row order otherwise.
        self.predict_by_length = False

    # -- Lightning hooks ---------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Lightning calls this on one process per node while the others wait at a barrier: the splits of
        this stage are encoded into the on-disk cache there, and the other processes map the cache in
        ``setup`` instead of encoding too."""
        stage = getattr(getattr(self.trainer, "state", None), "fn", None)
        if stage is not None and stage.value in STAGE_ROLES:
            self._prepare_splits(stage.value)

    def _prepare_splits(self, stage: str) -> None:
        self.codec  # noqa: B018 (connects every text task)
        for role in STAGE_ROLES[stage]:
            for member in self.tasks.values():
                if member.has_split(role) and (role != "predict" or member.name in self.predict_tasks):
                    member.prepare(role)

    def setup(self, stage: str) -> None:
        self._prepare_splits(stage)
        if stage == "predict" and not self.predict_tasks:
            raise ValueError("No task has a predict split: set data.tasks.<name>.predict.")
        if stage == "fit" and self.trainer is not None:
            # Keep the tokenizer beside the run's logs, so the run can be reused without its checkpoint.
            log_dir = self.trainer.log_dir  # a collective under DDP: every rank must ask
            if log_dir and self.trainer.is_global_zero and self.tokenizer is not None:
                atomic_write(Path(log_dir) / "tokenizer.json", lambda tmp: self.tokenizer.save(str(tmp)))

    @property
    def predict_tasks(self) -> list[str]:
        """The tasks ``trunk predict`` predicts: those with a predict split (only ``predict_task``, when set)."""
        return [name for name, m in self.tasks.items() if m.has_split("predict") and self.predict_task in (None, name)]

    def train_dataloader(self) -> DataLoader:
        for member in self.tasks.values():
            member.prepare("train")
        rank_zero_info(f"Tasks {sorted(self.tasks)}: {self.steps_per_epoch()} training batches an epoch, drawn "
                       + ", ".join(f"{name} {p:.1%}" for name, p in self.sampler().probabilities(0.0).items()))
        # Batches come ready-made. A loader's own generator: by default each new iterator draws a seed from
        # the global RNG, which would shift the dropout masks of a resumed run against the uninterrupted one.
        return DataLoader(MultiTaskStream(self), batch_size=None, generator=torch.Generator())

    def _loaders(self, role: str, by_length: bool = False) -> list[DataLoader]:
        # evaluation splits are dealt to the data-parallel replicas here, not by Lightning's sampler, whose repeated
        # rows would count twice in the metrics (EvalShard); prediction's own sampler repeats none
        _, rank, replicas = self.position()
        shard = (rank, replicas) if replicas > 1 and role in ("validation", "test") else None
        return [
            loader
            for name, m in self.tasks.items()
            if m.has_split(role) and (role != "predict" or name in self.predict_tasks)
            for loader in m.loaders(role, by_length, shard)
        ]

    def val_dataloader(self) -> list[DataLoader]:
        return self._loaders("validation")

    def test_dataloader(self) -> list[DataLoader]:
        loaders = self._loaders("test")
        if not loaders:
            raise ValueError("No task has a test split: set data.tasks.<name>.test.")
        return loaders

    def predict_dataloader(self) -> list[DataLoader]:
        return self._loaders("predict", by_length=self.predict_by_length)

    def has_split(self, role: str) -> bool:
        return any(member.has_split(role) for member in self.tasks.values())

    # -- sampling ----------------------------------------------------------------------------------
    @property
    def streamed_tasks(self) -> list[str]:
        """Tasks whose training data is streamed: no known size."""
        return [name for name, member in self.tasks.items() if member.streaming]

    def sampler(self) -> TaskSampler:
        streamed = self.streamed_tasks
        if streamed and len(self.tasks) > 1 and self.sampling not in ("uniform", "fixed"):
            raise ValueError(
                f"data.sampling={self.sampling!r} draws tasks by their number of training rows, but {streamed} stream "
                "theirs (their size is unknown). Set data.sampling to 'fixed' (with data.weights) or 'uniform'."
            )
        sizes = {name: 1 if member.streaming else member.train_rows() for name, member in self.tasks.items()}
        return TaskSampler(sizes, self.sampling, self.temperature, self.weights, self.anneal_to)

    def steps_per_epoch(self) -> int:
        if self._steps_per_epoch:
            return self._steps_per_epoch
        if self.streamed_tasks:
            raise ValueError(
                f"Tasks {self.streamed_tasks} stream their training data, whose length is unknown: set "
                "data.steps_per_epoch (training batches per epoch; validation and checkpoints follow it)."
            )
        _, _, world = self.position()
        return sum(math.ceil(math.ceil(m.train_rows() / world) / m.batch_size) for m in self.tasks.values())

    def run_seed(self) -> int:
        if self.seed is not None:
            return self.seed
        return int(os.environ.get("PL_GLOBAL_SEED", 0))  # set by seed_everything

    def position(self) -> tuple[int, int, int]:
        """(epoch, data-parallel rank, number of data-parallel replicas) of the attached trainer; (0, 0, 1) without
        one."""
        trainer = self.trainer
        if trainer is None:
            return 0, 0, 1
        return (trainer.current_epoch, *data_parallel_replica(trainer))

    def batches_done(self, epoch: int) -> int:
        """How many of ``epoch``'s batches were trained on before the checkpoint this run resumed from
        (0 for a run that starts, or an epoch that starts, fresh): the optimizer steps taken, less
        those of earlier epochs."""
        trainer = self.trainer
        if trainer is None:
            return 0
        per_epoch = trainer.num_training_batches
        per_epoch = self.steps_per_epoch() if not isinstance(per_epoch, int) or per_epoch <= 0 else per_epoch
        done = trainer.global_step * trainer.accumulate_grad_batches - epoch * per_epoch
        return min(max(done, 0), per_epoch)

    def progress(self, epoch: int) -> float:
        """How far training is at the start of ``epoch``, in [0, 1] (for annealed sampling)."""
        trainer = self.trainer
        if trainer is None:
            return 0.0
        epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else None
        if trainer.max_steps not in (None, -1):
            by_steps = math.ceil(trainer.max_steps / self.steps_per_epoch())
            epochs = min(epochs, by_steps) if epochs else by_steps
        return epoch / max(1, (epochs or 1) - 1)

    # -- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {name: member.state_dict() for name, member in self.tasks.items()}

    def load_state_dict(self, state: dict) -> None:
        for name, member_state in state.items():
            if name in self.tasks:
                self.tasks[name].load_state_dict(member_state)


def data_parallel_replica(trainer) -> tuple[int, int]:
    """(rank, number) of the trainer's data-parallel replicas: the processes of one tensor-parallel group read the same
    batches, so the strategy's data-parallel rank and size, not the process's own (they differ under
    ``ModelParallelStrategy`` with ``tensor_parallel_size`` > 1)."""
    try:
        replicas = trainer.strategy.distributed_sampler_kwargs or {}
    except (AttributeError, AssertionError):  # one device; a strategy not set up yet
        replicas = {}
    return replicas.get("rank", trainer.global_rank), replicas.get("num_replicas", trainer.world_size)
