"""Knowledge distillation: a task of the run (the student) learns from the answers of trained models of that task (its
teachers), as well as from its labels.

``model.distill.<task>`` names the teachers and how much they count (``DistillConfig``). The teachers themselves are
loaded above this floor (``trunk.inference.teachers``: each a ``load()``ed model, in the precision it predicts
fastest) and handed to ``TrunkModule.attach_teachers``; the module scores each training batch of the task against
their averaged ``Objective.soft_targets`` with the kind's ``Objective.distill_loss``:

    loss = (1 - alpha) * the task's own loss + alpha * the distillation loss
           + hidden * the hidden states' squared error + relations * the self-attention relations' KL

The last two (``layers``: pairs of a student block and a teacher block) read both models' insides (``Taps``): TinyBERT's
hidden states (Jiao et al. 2020; a student narrower than its teacher reads them through a learned projection to the
teacher's width, its W_h, trained with the student and kept out of what it exports) and MiniLM's self-attention
relations (Wang et al. 2021,
MiniLMv2: the queries', keys' and values' scaled dot products with themselves, per relation head, compared as
distributions; any widths that ``relation_heads`` divides).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class DistillConfig:
    """How one task learns from its teachers.

    Args:
        teachers: the trained models of this task, each a checkpoint of ``trunk fit``, a trunk directory with the
            task's head, or a list of a trunk and task directories; several: an ensemble, their answers averaged (in
            probability space).
        alpha: the share of the distillation loss in the task's loss (1: the teachers alone; 0: the labels alone).
        temperature: softens both sides' distributions (Hinton et al.; 1-4 is usual): a higher one passes on more of
            what the teacher thinks of the wrong answers. The loss is scaled by its square, so its pull keeps its size.
        task: the task's name in the teachers, where it differs from the student's (default: the student's name, or
            the teacher's one task).
        precision: the teachers' precision (``auto``: bf16 where the device computes it natively).
        quantize: ``int8``: the teachers' linear layers compute in int8 (fast on CPUs with VNNI or AMX).
        cache: keep the teachers' answer to each training row once computed (the first epoch's passes), in memory
            and, once every row has one, on disk under ``$TRUNK_CACHE/teachers/`` for the runs after (other seeds,
            other students of the same teachers and data): a teacher's pass is then paid once, not every epoch. The
            answers are keyed by the teachers' contents, the training rows' encoding and the teachers' precision.
        layers: pairs ``[student block, teacher block]`` (from 0) whose insides the next two compare; for a teacher
            with the student's tokenizer, one teacher.
        hidden: the weight of the squared error between the paired blocks' outputs (0: off; where the widths differ,
            the student's outputs are projected to the teacher's width by a learned linear map, one per task).
        relations: the weight of the KL between the paired blocks' self-attention relations (0: off).
        relation_heads: the heads the relations are computed over (None: the student's heads); it must divide both
            widths.
        sequence: translation: learn from the teacher's translations of the training sources (its beam search) as
            targets, in place of its word-level distributions (sequence-level distillation, Kim & Rush 2016); one
            teacher. With ``cache``, each source is translated once.
    """

    teachers: list = field(default_factory=list)
    alpha: float = 0.5
    temperature: float = 2.0
    task: str | None = None
    precision: Literal["auto", "32-true", "bf16-mixed"] = "auto"
    quantize: Literal["int8"] | None = None
    cache: bool = False
    layers: list = field(default_factory=list)
    hidden: float = 0.0
    relations: float = 0.0
    relation_heads: int | None = None
    sequence: bool = False

    def check(self, where: str) -> None:
        problems = [
            "teachers is empty (name at least one trained model of the task)" if not self.teachers else "",
            f"alpha={self.alpha} (must be in [0, 1])" if not 0 <= self.alpha <= 1 else "",
            f"temperature={self.temperature} (must be > 0; 1-4 is usual)" if not self.temperature > 0 else "",
            f"hidden={self.hidden} and relations={self.relations} (weights: >= 0)"
            if not (self.hidden >= 0 and self.relations >= 0) else "",
            "hidden or relations without layers (name [student block, teacher block] pairs)"
            if (self.hidden or self.relations) and not self.layers else "",
            f"layers={self.layers} (pairs [student block, teacher block])" if not all(
                isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(i, int) and i >= 0 for i in pair)
                for pair in self.layers) else "",
            "layers without a weight (set hidden or relations)" if self.layers and not (self.hidden or self.relations)
            else "",
            "cache with layers (the blocks' insides are read anew each step)" if self.cache and self.layers else "",
            "sequence with layers (the teacher's translations come from beam search, not a pass over the student's "
            "batch)" if self.sequence and self.layers else "",
            "sequence with several teachers (translations cannot be averaged: give one)"
            if self.sequence and len(self.teachers) > 1 else "",
        ]
        problems = [p for p in problems if p]
        if problems:
            raise ValueError(f"{where}: " + "; ".join(problems) + ".")


class Teachers(Protocol):
    """One task's teachers, as the module uses them (``trunk.inference.teachers.TaskTeachers``)."""

    digest: str  # their contents, stored in checkpoints: a resumed run must learn from the same teachers
    tapped: dict  # with ``layers``: the teacher's insides of the latest batch (``Taps.read``)
    width: int  # the (first) teacher's trunk width: its hidden states' size
    passes: int  # the teachers' forward passes so far (a batch each teacher answered; kept answers not counted)

    def soft_targets(self, batch: dict) -> torch.Tensor:
        """The teachers' answers to a training batch of the student, averaged, in the student's label order."""

    def to(self, device: torch.device) -> Teachers: ...


def distill_configs(distill: dict | None, objectives: dict) -> dict[str, DistillConfig]:
    """``model.distill`` as checked configs: each names a task of the run whose kind learns from teachers."""
    configs = {}
    for task, options in (distill or {}).items():
        where = f"model.distill.{task}"
        if task not in objectives:
            raise ValueError(f"{where}: there is no task '{task}' in this run; its tasks are {sorted(objectives)}.")
        if not objectives[task].distills:
            kinds = ("classification, multi-label, regression, NER, question answering, multiple choice, masked-LM and "
                     "translation")
            raise ValueError(f"{where}: task '{task}' is {objectives[task].kind}, which has no distillation loss yet "
                             f"({kinds} have one). Remove it from model.distill.")
        if isinstance(options, DistillConfig):
            config = options
        else:
            unknown = sorted(set(options) - set(DistillConfig.__dataclass_fields__))
            if unknown:
                raise ValueError(f"{where}: unknown options {unknown}; the options are "
                                 f"{list(DistillConfig.__dataclass_fields__)}.")
            config = DistillConfig(**options)
        if isinstance(config.teachers, str):
            config = dataclasses.replace(config, teachers=[config.teachers])
        config.check(where)
        if config.sequence and not hasattr(objectives[task], "teacher_sequences"):
            raise ValueError(f"{where}.sequence: learning from the teachers' outputs as targets is for translation; "
                             f"task '{task}' is {objectives[task].kind}. Remove sequence.")
        configs[task] = config
    return configs


def mixed(task_loss: torch.Tensor | None, distill_loss: torch.Tensor, alpha: float) -> torch.Tensor:
    """The task's loss of a distilled batch; a batch without labels (unlabelled inputs) learns from its teachers
    alone."""
    if task_loss is None:
        return distill_loss
    return (1 - alpha) * task_loss + alpha * distill_loss


def intermediate_loss(config: DistillConfig, student: dict, teacher: dict, mask: torch.Tensor, heads: int,
                      projection: torch.nn.Module | None = None) -> torch.Tensor:
    """``hidden`` x the paired blocks' outputs' squared error + ``relations`` x their self-attention relations' KL,
    summed over ``config.layers`` (``student``, ``teacher``: ``Taps.read``'s). ``mask``: (B, T), True at real
    tokens. ``projection``: the student's outputs to the teacher's width, where they differ."""
    mask = mask.bool()
    total = torch.zeros((), device=mask.device)
    for s, t in config.layers:
        if config.hidden:
            mine = student[s]["hidden"][mask]
            mine = projection(mine) if projection is not None else mine
            total = total + config.hidden * F.mse_loss(mine.float(), teacher[t]["hidden"][mask].float())
        if config.relations:
            total = total + config.relations * sum(
                relation_kl(student[s][key], teacher[t][key], mask, heads) for key in ("q", "k", "v")) / 3
    return total


def relation_kl(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, heads: int) -> torch.Tensor:
    """MiniLMv2's relation loss of one of queries, keys or values: each side's (B, T, C) split into ``heads``,
    softmax(x x^T / sqrt(d)) over the real tokens, KL(teacher || student) per real query, averaged."""
    def log_relations(x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        x = x.view(b, n, heads, c // heads).transpose(1, 2)  # (B, h, T, d)
        scores = x @ x.transpose(-1, -2) / (c // heads) ** 0.5
        return scores.masked_fill(~mask[:, None, None, :], float("-inf")).log_softmax(-1)

    s, t = log_relations(student.float()), log_relations(teacher.float())
    kl = torch.where(t > float("-inf"), t.exp() * (t - s), 0.0).sum(-1)  # (B, h, T)
    rows = mask[:, None, :].expand_as(kl)
    return kl[rows].mean()
