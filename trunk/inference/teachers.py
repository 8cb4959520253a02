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
from dataclasses import dataclass
from pathlib import Path

import torch

from trunk.core.codec import fingerprint
from trunk.inference.predictor import Predictor, load
from trunk.training.distill import DistillConfig
from trunk.training.module import TrunkModule
from trunk.training.precision import choose_precision


@dataclass
class Teacher:
    """One teacher of a task: where it came from, the model, its name for the task, and whether it reads the student's
    batches as they are (the same tokenizer) or encodes their raw inputs anew."""

    source: str
    predictor: Predictor
    task: str
    reads_batches: bool = True


class TaskTeachers:
    """One student task's teachers, checked against it (``check``), answering its batches (``soft_targets``)."""

    def __init__(self, student: TrunkModule, task: str, config: DistillConfig,
                 teachers: list[tuple[str, Predictor]]) -> None:
        self.task, self.config, self.objective = task, config, student.objective(task)
        self.members = [Teacher(source, predictor, self._teacher_task(source, predictor))
                        for source, predictor in teachers]
        self.check(student)

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
        student_codec = student.codec.tokenizer if student.codec is not None else None
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
            teacher_codec = teacher.model.codec.tokenizer if teacher.model.codec is not None else None
            same = teacher_codec is None or student_codec is None or fingerprint(teacher_codec) == fingerprint(
                student_codec)
            if not same and own.raw_input_key is None:
                raise ValueError(f"{said} has another tokenizer than the student, and {own.kind} answers are read "
                                 "token by token: a teacher of this kind must share the student's tokenizer. Start the "
                                 "student from the teacher's trunk (model.init_from), or give a teacher with its "
                                 "tokenizer.")
            member.reads_batches = same
            if same and teacher.model.trunk_config.max_len is not None and student.trunk_config.max_len is not None \
                    and teacher.model.trunk_config.max_len < student.trunk_config.max_len:
                raise ValueError(f"{said} reads at most {teacher.model.trunk_config.max_len} tokens, and the student's "
                                 f"batches may hold {student.trunk_config.max_len}: lower data.tasks.{self.task}."
                                 f"max_length to {teacher.model.trunk_config.max_len}.")

    def to(self, device: torch.device) -> TaskTeachers:
        for member in self.members:
            teacher = member.predictor
            teacher.model.to(device)
            auto = choose_precision(device.type)[0]  # the rule of load(precision="auto"), said once by the run
            teacher.precision = teacher.runtime.precision or (auto if self.config.precision == "auto"
                                                              else self.config.precision)
        return self

    @torch.no_grad()
    def soft_targets(self, batch: dict) -> torch.Tensor:
        """The teachers' answers to a training batch, averaged, in the student's label order, on the batch's device."""
        answers = [self._answer(member, batch) for member in self.members]
        return answers[0] if len(answers) == 1 else torch.stack(answers).mean(0)

    def _answer(self, member: Teacher, batch: dict) -> torch.Tensor:
        teacher, name = member.predictor, member.task
        model, device = teacher.model, teacher.model.device
        if member.reads_batches:
            own = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        else:  # its own encoding of the batch's raw inputs
            preprocessor = teacher.preprocessors[name]
            own = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                   for k, v in preprocessor.collate(preprocessor.encode(list(batch[self.objective.raw_input_key])))
                   .items()}
        objective = model.objective(name)
        bf16 = (torch.autocast(device.type, dtype=torch.bfloat16) if teacher.precision == "bf16-mixed"
                else contextlib.nullcontext())
        with bf16, model.route(name):
            targets = objective.soft_targets(model.trunk, own).float()
        if self.objective.targets_by_label and objective.label_names != self.objective.label_names:
            order = torch.tensor([objective.label_names.index(n) for n in self.objective.label_names],
                                 device=targets.device)
            targets = targets.index_select(-1, order)
        return targets.to(batch_device(batch))


def batch_device(batch: dict) -> torch.device:
    return next(v.device for v in batch.values() if isinstance(v, torch.Tensor))


def attach_teachers(model: TrunkModule) -> list[str]:
    """Load the teachers ``model.distill`` names and hand each task its own; returns what was loaded, in words (the
    run's report). Every teacher is checked against its student here, before any training step."""
    report = []
    loaded: dict[tuple, Predictor] = {}  # a teacher of several tasks loads once
    for task, config in model.distill.items():
        teachers = []
        for source in config.teachers:
            key = (tuple(map(str, source)) if isinstance(source, (list, tuple)) else str(source), config.quantize)
            if key not in loaded:
                try:
                    loaded[key] = load(source, precision="32-true", quantize=config.quantize)  # set by to()
                except (FileNotFoundError, ValueError) as err:
                    raise ValueError(f"model.distill.{task}.teachers: {err}") from None
            teachers.append((describe(source), loaded[key]))
        model.attach_teachers(task, TaskTeachers(model, task, config, teachers))
        report.append(f"task '{task}' learns from {len(teachers)} teacher{'s' * (len(teachers) > 1)} "
                      f"({', '.join(name for name, _ in teachers)}): alpha {config.alpha}, temperature "
                      f"{config.temperature}")
    return report


def describe(source) -> str:
    return " + ".join(map(str, source)) if isinstance(source, (list, tuple)) else str(Path(source))
