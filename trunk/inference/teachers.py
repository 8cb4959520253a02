"""The teachers of a distilled task (``model.distill``; ``trunk.training.distill``): trained models of the task, each
``load()``ed as for prediction (frozen, in eval mode, in the precision it predicts fastest, int8 if asked), answering
the student's training batches.

A teacher with the student's tokenizer reads each batch as it is (the same tokens, windows and masks); one with
another tokenizer encodes the batch's raw inputs anew with its own, which the kinds whose batches carry them allow
(``Objective.raw_input_key``: texts, NER's words). Labels are matched by name: a teacher's answers are put in the
student's label order. Everything a teacher could not answer is refused when it is loaded, before any step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric.utilities import move_data_to_device
from lightning.pytorch.utilities import rank_zero_info
from safetensors.torch import load_file, save_file

from trunk.core.atomic import atomic_write
from trunk.core.codec import Codec, cache_folder, fingerprint
from trunk.inference.calibrate import choose_form
from trunk.inference.predictor import Predictor, load
from trunk.inference.quantize import quantize_trunk
from trunk.models import POSITIONS
from trunk.models.taps import Taps
from trunk.training.distill import DistillConfig
from trunk.training.module import TrunkModule


@dataclass
class Teacher:
    """One teacher of a task: where it came from, the model, its name for the task, and whether it reads the student's
    batches as they are (the same tokenizer) or encodes their raw inputs anew."""

    source: str
    predictor: Predictor
    task: str
    reads_batches: bool = True
    # images: (the student's mean, std; the teacher's mean, std, size) where they differ, to convert its pixels
    pixels: tuple | None = None


class TaskTeachers:
    """One student task's teachers, checked against it (``check``), answering its batches (``soft_targets``)."""

    def __init__(self, student: TrunkModule, task: str, config: DistillConfig,
                 teachers: list[tuple[str, Predictor]], digest: str = "", data=None) -> None:
        """``digest``: the teachers' contents (``contents_digest``), which a resumed run and the answer cache check;
        ``data``: the student's data of the task (``TaskData``: its batches' lengths, its images' normalisation)."""
        self.task, self.config, self.objective, self.data = task, config, student.objective(task), data
        self.max_length = getattr(data, "max_length", None) or student.trunk_config.max_len
        self.members = [Teacher(source, predictor, self._teacher_task(source, predictor))
                        for source, predictor in teachers]
        self.digest, self.cache, self.tapped = digest, None, {}
        self.passes = 0  # what the teachers cost the run: a forward pass per teacher per batch it answered
        self.width = self.members[0].predictor.model.trunk_config.d_model
        self.check(student)

    def keep_answers(self, key: list, rows: Callable[[], int]) -> None:
        """Keep each training row's answers (``DistillConfig.cache``): ``key``, what they depend on besides the
        teachers (the rows' encoding); ``rows``, how many an epoch reads, once the data is set up (the cache is written
        when it has them all)."""
        if not (self.objective.targets_per_row or self.config.sequence):
            raise ValueError(f"model.distill.{self.task}.cache: {self.objective.kind}'s answers are not one fixed "
                             "answer per training row (question answering's are per window, masked-LM's per masked "
                             "position, drawn anew each epoch), so they cannot be kept by row. Leave cache off.")
        config = self.config
        name = hashlib.sha256(json.dumps([self.digest, config.precision, config.quantize, config.sequence,
                                          self.objective.label_names, key]).encode()).hexdigest()[:24]
        folder = cache_folder("teachers")
        self.cache = AnswerCache(folder / f"{name}.safetensors" if folder is not None else None, rows)

    def _teacher_task(self, source: str, teacher: Predictor) -> str:
        name = self.config.task or (self.task if self.task in teacher.tasks or len(teacher.tasks) != 1
                                    else teacher.tasks[0])
        if name not in teacher.tasks:
            raise ValueError(f"model.distill.{self.task}: the teacher '{source}' has no head for the task '{name}'; "
                             f"its tasks are {teacher.tasks}. Name the teacher's task with model.distill.{self.task}."
                             "task, or give a teacher trained on this task.")
        return name

    def check(self, student: TrunkModule) -> None:
        """Refuse, naming the teacher and the fix, what would make its answers wrong for this student."""
        where, own = f"model.distill.{self.task}", self.objective
        for member in self.members:
            teacher, objective = member.predictor, member.predictor.model.objective(member.task)
            said = f"{where}: the teacher '{member.source}' (task '{member.task}')"
            if objective.kind != own.kind:
                raise ValueError(f"{said} is {objective.kind}, and this task is {own.kind}: a teacher answers the "
                                 "task's own kind. Give a teacher trained on a task of this kind.")
            if own.targets_by_label and sorted(objective.label_names) != sorted(own.label_names):
                only_teacher = [n for n in objective.label_names if n not in own.label_names]
                only_student = [n for n in own.label_names if n not in objective.label_names]
                raise ValueError(f"{said} was trained on the labels {objective.label_names}, and this task has "
                                 f"{own.label_names} (only the teacher's: {only_teacher}; only this task's: "
                                 f"{only_student}). Labels are matched by name: give the task the teacher's label "
                                 "names (data.tasks.<task>.label_names, normalize_labels), or another teacher.")
            same = same_tokens(teacher.model.codec, student.codec, member.task, self.task)
            if not same and own.raw_input_key is None:
                raise ValueError(f"{said} has another tokenizer than the student, and {own.kind} answers are read "
                                 "token by token: a teacher of this kind must share the student's tokenizer. Start the "
                                 "student from the teacher's trunk (model.init_from), or give a teacher with its "
                                 "tokenizer.")
            member.reads_batches = same
            member.pixels = self.pixels_of(member) if own.stem == "image" else None
            table = teacher.model.trunk_config
            fixed = POSITIONS[table.positions].fixes_max_len  # a learned table has no row beyond max_len
            if same and self.max_length and fixed and table.max_len < self.max_length:
                raise ValueError(f"{said} reads at most {table.max_len} tokens (its position table), and the student's "
                                 f"batches may hold {self.max_length}: lower data.tasks.{self.task}.max_length to "
                                 f"{table.max_len}.")
        self.check_layers(student)

    def pixels_of(self, member: Teacher) -> tuple | None:
        """An image teacher reads the student's pixels normalised and sized as it was trained (its ``settings``):
        what to convert, None where nothing differs."""
        if self.data is None:
            return None
        mine, theirs = self.data.preprocessor().settings, member.predictor.preprocessors[member.task].settings
        if len(mine["mean"]) != len(theirs["mean"]):
            raise ValueError(f"model.distill.{self.task}: the teacher '{member.source}' reads images of "
                             f"{len(theirs['mean'])} channels, and this task's have {len(mine['mean'])}: give a "
                             f"teacher of {len(mine['mean'])}-channel images (data.tasks.{self.task}.channels).")
        size = member.predictor.model.objective(member.task).image_size
        if (mine["mean"], mine["std"]) == (theirs["mean"], theirs["std"]) and mine["image_size"] == size:
            return None
        return mine["mean"], mine["std"], theirs["mean"], theirs["std"], size

    def check_layers(self, student: TrunkModule) -> None:
        """``layers``: one teacher reading the student's batches, blocks both have, relation heads that divide both
        widths (hidden states of other widths are projected: ``TrunkModule.attach_teachers``)."""
        config, where = self.config, f"model.distill.{self.task}"
        if not config.layers:
            return
        if len(self.members) != 1 or not self.members[0].reads_batches:
            raise ValueError(f"{where}.layers compares the blocks of the student and of one teacher that reads its "
                             "tokens: give one teacher, with the student's tokenizer (or leave layers unset).")
        mine, theirs = student.trunk_config, self.members[0].predictor.model.trunk_config
        wrong = [pair for pair in config.layers if pair[0] >= mine.n_layers or pair[1] >= theirs.n_layers]
        if wrong:
            raise ValueError(f"{where}.layers: {wrong} name blocks beyond the student's {mine.n_layers} or the "
                             f"teacher's {theirs.n_layers} (numbered from 0).")
        if mine.shared_blocks or theirs.shared_blocks:
            raise ValueError(f"{where}.layers: a trunk whose layers share blocks (shared_blocks) has no block of its "
                             "own per layer to compare. Leave layers unset.")
        heads = config.relation_heads or mine.n_heads
        if config.relations and (mine.d_model % heads or theirs.d_model % heads):
            raise ValueError(f"{where}.relation_heads={heads} must divide both widths ({mine.d_model}, "
                             f"{theirs.d_model}): set model.distill.{self.task}.relation_heads.")

    def to(self, device: torch.device) -> TaskTeachers:
        """Each teacher on ``device``, in the form it predicts fastest there (``load``'s ``precision="auto"``: on a
        CPU measured, int8 included) or the one asked for."""
        for member in self.members:
            teacher = member.predictor
            teacher.model.to(device)
            if teacher.runtime.precision:
                continue
            teacher.precision, quantize, said = choose_form(teacher.model.trunk.cfg, device, self.config.precision,
                                                            self.config.quantize)
            if quantize and torch.device(device).type == "cpu":
                quantize_trunk(teacher.model, quantize)  # nothing left to do where it loaded quantized
            if said:
                rank_zero_info(f"Teacher '{member.source}' of task '{self.task}' predicts in {said}.")
        return self

    @torch.no_grad()
    def soft_targets(self, batch: dict) -> torch.Tensor:
        """The teachers' answers to a training batch, averaged, in the student's label order, on the batch's device."""
        if self.cache is not None and "rows" in batch and (kept := self.cache.get(batch["rows"])) is not None:
            return kept.to(batch_device(batch))
        answers = [self._answer(member, batch) for member in self.members]
        self.passes += len(answers)
        targets = answers[0] if len(answers) == 1 else torch.stack(answers).mean(0)
        if self.cache is not None and "rows" in batch:
            self.cache.put(batch["rows"], targets)
        return targets

    def _answer(self, member: Teacher, batch: dict) -> torch.Tensor:
        teacher, name = member.predictor, member.task
        model, device = teacher.model, teacher.model.device
        if member.reads_batches:
            own = move_data_to_device(batch, device)
            if member.pixels is not None:
                own["pixel_values"] = converted(own["pixel_values"], *member.pixels)
        else:  # its own encoding of the batch's raw inputs
            preprocessor = teacher.preprocessors[name]
            inputs = list(batch[self.objective.raw_input_key])
            own = move_data_to_device(preprocessor.collate(preprocessor.encode(inputs)), device)
        objective = model.objective(name)
        bf16 = (torch.autocast(device.type, dtype=torch.bfloat16) if teacher.precision == "bf16-mixed"
                else contextlib.nullcontext())
        taps = Taps(model.trunk.backbone, [t for _, t in self.config.layers])  # the paired blocks' insides
        with bf16, model.route(name), taps:
            if self.config.sequence:  # its translations, as they are (not probabilities to average or reorder)
                return objective.teacher_sequences(model.trunk, own).to(batch_device(batch))
            targets = objective.soft_targets(model.trunk, own).float()
        if self.config.layers:
            self.tapped = {layer: {k: v.to(batch_device(batch)) for k, v in seen.items()}
                           for layer, seen in taps.read(own.get("attention_mask")).items()}
        if self.objective.targets_by_label and objective.label_names != self.objective.label_names:
            order = torch.tensor([objective.label_names.index(n) for n in self.objective.label_names],
                                 device=targets.device)
            targets = targets.index_select(-1, order)
        return targets.to(batch_device(batch))


class AnswerCache:
    """Teachers' answers by training row, in memory, and in one safetensors file once every row has one (read back
    by the runs after). A row's answer is kept as its batch gave it, less trailing all-0 entries along its first
    dimension (words a batch padded: NER); ``get`` pads a batch's rows to one shape again, with 0s (no answer)."""

    def __init__(self, path: Path | None, rows: Callable[[], int]) -> None:
        self.path, self.rows, self.answers, self.saved = path, rows, {}, False
        if path is not None and path.is_file():
            self.answers, self.saved = load_file(path), True
            rank_zero_info(f"Teachers' answers to {len(self.answers)} training rows read from '{path}'.")

    def get(self, rows: list[str]) -> torch.Tensor | None:
        if not all(row in self.answers for row in rows):
            return None
        kept = [self.answers[row] for row in rows]
        shape = [max(sizes) for sizes in zip(*(a.shape for a in kept))]
        return torch.stack([F.pad(a, [p for d in reversed(range(a.ndim)) for p in (0, shape[d] - a.shape[d])])
                            for a in kept])

    def put(self, rows: list[str], targets: torch.Tensor) -> None:
        for row, answer in zip(rows, targets.detach().cpu()):
            if answer.ndim > 1:  # trailing entries with no answer (padding) dropped
                filled = (answer.flatten(1) != 0).any(-1).nonzero()
                answer = answer[: int(filled.max()) + 1 if len(filled) else 0]
            self.answers[row] = answer.contiguous()
        if not self.saved and self.path is not None and len(self.answers) >= self.rows():
            atomic_write(self.path, lambda tmp: save_file(self.answers, str(tmp)))
            self.saved = True
            rank_zero_info(f"Teachers' answers to {len(self.answers)} training rows kept in '{self.path}'.")


def converted(pixels: torch.Tensor, mean: list, std: list, their_mean: list, their_std: list, size: int
              ) -> torch.Tensor:
    """Images normalised with (mean, std) as another model reads them: normalised with its own, at its size."""
    def column(values: list) -> torch.Tensor:
        return torch.tensor(values, device=pixels.device)[None, :, None, None]

    raw = pixels * column(std) + column(mean)
    if raw.shape[-1] != size or raw.shape[-2] != size:
        raw = F.interpolate(raw, size=(size, size), mode="bilinear", antialias=True)
    return (raw - column(their_mean)) / column(their_std)


def contents_digest(source) -> str:
    """A teacher's files by their contents (a file, every file of a directory, or each of a list): a resumed run and
    the answer cache notice a teacher that changed, also one copied or moved since."""
    sources = source if isinstance(source, (list, tuple)) else [source]
    digest = hashlib.sha256()
    for path in map(Path, sources):
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
            with file.open("rb") as f:
                digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def same_tokens(teacher: Codec | None, student: Codec | None, teacher_task: str, task: str) -> bool:
    """Whether a teacher reads the student's token ids as the student does: the same tokenizer, and for a task with a
    target tokenizer of its own (translation), the same one of those too."""
    if teacher is None or student is None or teacher.tokenizer is None or student.tokenizer is None:
        return True  # images: no tokens
    pairs = [(teacher.tokenizer, student.tokenizer)]
    if teacher_task in teacher.targets or task in student.targets:
        pairs.append((teacher.target(teacher_task), student.target(task)))
    return all(fingerprint(a) == fingerprint(b) for a, b in pairs)


def batch_device(batch: dict) -> torch.device:
    return next(v.device for v in batch.values() if isinstance(v, torch.Tensor))


def attach_teachers(model: TrunkModule, data=None, checkpoint: dict | None = None) -> list[str]:
    """Load the teachers ``model.distill`` names and hand each task its own; returns what was loaded, in words (the
    run's report). Every teacher is checked against its student here, before any training step: with ``checkpoint``
    (a run resumed), also that the teachers are the ones the run began with. ``data``: the run's ``TaskSet``, whose
    training rows key the answers a task with ``cache`` keeps."""
    report = []
    loaded: dict[tuple, tuple[Predictor, str]] = {}  # a teacher of several tasks (in one form) loads once
    began_with = (checkpoint or {}).get("distill_teachers") or {}
    passes_before = (checkpoint or {}).get("distill_passes") or {}  # a resumed run counts on from its checkpoint
    for task, config in model.distill.items():
        teachers, digests = [], []
        for source in config.teachers:
            # its precision is set on the loaded model (to()): tasks asking another one each load their own
            key = (tuple(map(str, source)) if isinstance(source, (list, tuple)) else str(source), config.quantize,
                   config.precision)
            if key not in loaded:
                try:
                    loaded[key] = (load(source, precision="32-true", quantize=config.quantize),  # set by to()
                                   contents_digest(source))
                except (FileNotFoundError, ValueError) as err:
                    raise ValueError(f"model.distill.{task}.teachers: {err}") from None
            teachers.append((describe(source), loaded[key][0]))
            digests.append(loaded[key][1])
        digest = hashlib.sha256(json.dumps(digests).encode()).hexdigest()
        if task in began_with and began_with[task] != digest:
            raise ValueError(f"model.distill.{task}: the teachers {[name for name, _ in teachers]} are not the ones "
                             "this run began with (their files changed since its checkpoint was written): resume with "
                             "the teachers it began with, or start a new run (without --ckpt_path) with these.")
        member = data.tasks[task] if data is not None else None
        own = TaskTeachers(model, task, config, teachers, digest, member)
        own.passes = passes_before.get(task, 0)
        if config.cache:
            if member is None or not hasattr(member, "encoding_key"):
                raise ValueError(f"model.distill.{task}.cache keeps answers by the rows of a text task's encoded "
                                 "training split; this task has none. Leave cache off.")
            roles = ["train", *(["unlabelled"] if member.has_split("unlabelled") else [])]
            own.keep_answers([member.encoding_key(role) for role in roles], member.train_rows)
        model.attach_teachers(task, own)
        report.append(f"task '{task}' learns from {len(teachers)} teacher{'s' * (len(teachers) > 1)} "
                      f"({', '.join(name for name, _ in teachers)}): alpha {config.alpha}, temperature "
                      f"{config.temperature}{', answers kept per row' if config.cache else ''}")
    return report


def describe(source) -> str:
    return " + ".join(map(str, source)) if isinstance(source, (list, tuple)) else str(Path(source))
