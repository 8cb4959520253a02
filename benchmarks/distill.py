"""Distillation (``model.distill``): smaller students and multi-task students of single-task teachers, beside the
models they learn from. Prints tables: each way's test score (mean ± sd over the seeds), its steps and minutes, and for
the small students their predict speed against their teacher's.

    python benchmarks/distill.py compress --task sst2 --seeds 1 2 3      # and --task conll
    python benchmarks/distill.py groups --group ner --seeds 1 2 3         # the related-task groups of transfer.py
    python benchmarks/distill.py summary --seeds 1 2 3
    python benchmarks/distill.py compress --groups my_groups.yaml --task mine   # groups of your own, GROUPS' layout
    python benchmarks/distill.py sentences --corpus ../shared/data/enwiki2018/part3.txt.gz --rows 14000 \
        --out runs/distill/wiki14k.txt                                       # then compress --unlabelled that file

Run it from the repository (the recipes read ../shared/data). The ways:
  * compress, for a task of a group's alone recipes (SST-2: the sentiment group's MiniLM recipe; CoNLL-2003: the NER
    group's):
    - ``teacher``: the recipe alone (``benchmarks/transfer.py``'s ``alone`` way, the same run);
    - ``student``: the recipe on a 3-block trunk of MiniLM's blocks 0, 2 and 4 (``--model.init_layers=every_other``);
    - ``student, kd``: the same, learning from the teacher (``--model.distill``: ``--alpha``, ``--temperature``;
      ``--layers 0:1 1:3 2:5`` adds the hidden-state and attention-relation losses on those block pairs, weighted by
      ``--hidden`` and ``--relations``; ``--unlabelled FILE`` adds inputs without labels that the student learns
      from its teacher's answers alone, ``data.tasks.<task>.unlabelled``). Settings other than the defaults name a
      way of their own ("student, kd, alpha 0.9, layers 0:1 1:3 2:5, hidden 1, relations 1", "student, kd,
      unlabelled wiki14k.txt"), so the ledger keeps each apart;
    - ``--student-trunk DIR`` adds ``own`` and ``own, kd``: the recipe from another trunk (as
      ``configs/pretrain_large.yaml`` writes); ``--starts own`` trains those alone, without the 3-block ones;
      ``--student-recipe`` trains them by that trunk's own recipe of the task rather than the teacher's.
    Predict speed: inputs/s on the task's validation inputs through ``trunk.tasks.load`` (fp32, and bf16, int8 and
    int8 + bf16 on a CPU with units for them), one thread, the students and their teacher alternating in one process,
    median of ``--rounds``.
  * groups: ``alone``, ``joint`` and ``mtdnn`` as ``benchmarks/transfer.py`` runs them, and ``joint, kd``: the
    group's joint recipe with every task learning from its ``alone`` model (MT-DNN-KD, Liu et al. 2019; one teacher
    per task here, where they averaged an ensemble).
  * sentences: unlabelled inputs for ``--unlabelled`` from a prose corpus (``enwiki2018``'s paragraph-per-line
    ``.txt.gz``, titles skipped): its first ``--rows`` sentences of 5-60 words, words and punctuation apart as
    CoNLL-2003's are, one per line.
Steps count the student's optimizer steps; ``teacher passes`` the teachers' forward passes as the run counted them
(each a third of a training step's compute, about: a forward without a backward; with ``--cache``, each training row's
answers kept after the first epoch, that epoch's only). Every finished run is a line of the ledger (``--ledger``;
default runs/distill/results.jsonl): a stopped benchmark goes on where it stopped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import yaml  # noqa: E402
from inference import alternate, table  # noqa: E402
from ledger import Ledger, add_version_option, checked_version, precision_of, way_name  # noqa: E402
from transfer import (  # noqa: E402
    GROUPS,
    alone,
    checkpoint_of,
    fit,
    folder,
    joint_and_mtdnn,
    other_precision,
    primary_scores,
    spread,
)

from trunk.cli import run_cli  # noqa: E402
from trunk.training.precision import cpu_info  # noqa: E402

KD_DEFAULTS = {"alpha": 0.5, "temperature": 2.0}


def kd_settings(args) -> dict:
    """``model.distill.<task>``'s settings beside its teachers, from the command line."""
    settings = {"alpha": args.alpha, "temperature": args.temperature, **({"cache": True} if args.cache else {})}
    if args.layers:
        settings.update(layers=args.layers, hidden=args.hidden or 1.0, relations=args.relations or 1.0)
    return settings


def kd_way(way: str, settings: dict) -> str:
    """``way`` learning from teachers: "student, kd", naming the settings that are not the defaults, so that a run of
    other settings is a way of its own (never found in the ledger as another's)."""
    shown = {"T" if key == "temperature" else key:
             " ".join(f"{s}:{t}" for s, t in value) if key == "layers" else f"{value:g}"
             for key, value in settings.items() if KD_DEFAULTS.get(key) != value and key != "cache"}
    cached = ["cached"] if settings.get("cache") else []
    return ", ".join([f"{way}, kd", *(f"{key} {value}" for key, value in shown.items()), *cached])


def kd_options(task: str, teacher: str, settings: dict, unlabelled: Path | None) -> tuple[str, list[str]]:
    """A student's way suffix and options for learning from ``teacher``: the settings, and ``unlabelled`` inputs."""
    options = [distill_option({task: teacher}, settings)]
    if unlabelled is None:
        return "", options
    return f", unlabelled {unlabelled.name}", [*options, f"--data.tasks.{task}.unlabelled={unlabelled.resolve()}"]


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
WORD = re.compile(r"(?:[A-Za-z]\.){2,}|\w+(?:[-'’.&]\w+)*|[^\w\s]")  # "U.S.", "Smith's", "1996-08-22" whole


def sentences(corpus: Path, rows: int, out: Path) -> None:
    """The first ``rows`` sentences of 5-60 words of a paragraph-per-line corpus, tokenized, into ``out``."""
    kept = []
    with (gzip.open if corpus.suffix == ".gz" else open)(corpus, "rt", encoding="utf-8") as lines:
        for line in lines:
            if line.startswith("=") or not line.strip():  # an article's title, the blank line between articles
                continue
            for sentence in SENTENCE_END.split(line.strip()):
                words = WORD.findall(sentence)
                if 5 <= len(words) <= 60:
                    kept.append(" ".join(words))
            if len(kept) >= rows:
                break
    if len(kept) < rows:
        sys.exit(f"error: {corpus} holds {len(kept)} sentences of 5-60 words, fewer than --rows {rows}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(kept[:rows]) + "\n", encoding="utf-8")
    print(f"{rows} sentences of {corpus} in {out}")


def distill_option(teachers: dict[str, str], settings: dict) -> str:
    return "--model.distill=" + json.dumps({task: {"teachers": [path], **settings} for task, path in teachers.items()})


def teacher_passes(cli) -> int:
    """The teachers' forward passes of a finished run, as its module counted them (answers kept with ``--cache``
    not counted; a resumed run's counted on from its checkpoint)."""
    return sum(teachers.passes for teachers in cli.model.teachers.values())


def group_of(task: str) -> str:
    """The group whose alone recipes train ``task`` (its teacher's recipe)."""
    found = [group for group, spec in GROUPS.items() if task in spec["alone"]]
    if not found:
        known = sorted(t for spec in GROUPS.values() for t in spec["alone"])
        sys.exit(f"error: --task {task}: no group trains it alone; the tasks are {known}")
    return found[0]


def student(task: str, seed: int, way: str, options: list[str], root: Path, ledger: Ledger,
            epochs: int | None = None, precision: str | None = None, recipe: str | None = None) -> dict:
    """One student run of ``task``'s alone recipe with ``options``; ``epochs``: other than the recipe's (a shorter
    comparison, recorded as such: ``epochs`` in its ledger line); ``precision``: other than the recipe's; ``recipe``:
    another recipe of the task (the student trunk's own; recorded, and part of the run's key)."""
    group, (precision_field, precision_options, suffix) = group_of(task), other_precision(precision)
    key = {"group": group, "way": way, "task": task, "seed": seed, **({"epochs": epochs} if epochs else {}),
           **precision_field, "recipe": recipe}  # None: the teacher's (a key without it would find another's)
    if found := ledger.find(key):
        return found
    run_folder = folder(way_name({"way": way, "recipe": recipe}))  # the epochs name the seed's folder below
    cli, minutes = fit(["--config", recipe or GROUPS[group]["alone"][task], f"--seed_everything={seed}", *options,
                        *([f"--trainer.max_epochs={epochs}"] if epochs else []), *precision_options],
                       root / group / run_folder / task / f"seed{seed}{f'_{epochs}epochs' if epochs else ''}{suffix}")
    steps = cli.trainer.global_step
    return ledger.add({**key, "scores": primary_scores(cli), "steps": steps, "teacher_passes": teacher_passes(cli),
                       "minutes": minutes, "precision": cli.trainer.precision,
                       "checkpoint": cli.trainer.checkpoint_callback.best_model_path})


def compress(task: str, seeds: list[int], root: Path, ledger: Ledger, args) -> None:
    group, settings = group_of(task), kd_settings(args)
    teachers = {}  # by seed: the alone runs the students learn from and are timed against
    for seed in seeds:
        teachers[seed] = alone(group, task, seed, root, ledger, precision=args.precision)
        suffix, kd = kd_options(task, checkpoint_of(teachers[seed]), settings, args.unlabelled)
        starts = [(way, start) for way, start in [("student", ["--model.init_layers=every_other"]),
                                                  ("own", [f"--model.init_from={args.student_trunk}"])]
                  if way in args.starts]
        for way, start in starts:
            recipe = args.student_recipe if way == "own" else None
            if "alone" in args.students:
                student(task, seed, way, start, root, ledger, args.student_epochs, args.precision, recipe)
            if "kd" in args.students:
                student(task, seed, kd_way(way, settings) + suffix, [*start, *kd], root, ledger, args.student_epochs,
                        args.precision, recipe)
    speed(task, seeds[0], precision_of(teachers[seeds[0]]), ledger, args.rounds)


def validation_inputs(task: str) -> list:
    """The raw inputs of ``task``'s validation split (texts, pairs, NER's words), as its alone recipe reads them."""
    cli = run_cli(["--config", GROUPS[group_of(task)]["alone"][task], "--trainer.logger=false"], run=False)
    key = cli.model.objective(task).raw_input_key
    if key is None:
        return []
    cli.datamodule.setup("validate")
    member = cli.datamodule.tasks[task]
    return [x for loader in member.loaders("validation") for batch in loader for x in batch[key]]


def speed(task: str, seed: int, precision: str, ledger: Ledger, rounds: int) -> None:
    """inputs/s of each model of ``task`` (seed ``seed``, trained in ``precision``: its teacher's) in each form this
    CPU has units for (fp32; bf16, int8 and both where native), each against the teacher's in the same form."""
    from trunk.inference.calibrate import FORMS, candidate_forms
    from trunk.tasks import load
    from trunk.training.threads import fit_threads

    runs = {way_name(r): r for r in ledger.records() if r.get("task") == task and r["seed"] == seed
            and precision_of(r) == precision and "checkpoint" in r
            and r["way"].split(",")[0] in ("alone", "student", "own") and Path(r["checkpoint"]).is_file()}
    inputs = validation_inputs(task) if "alone" in runs and len(runs) > 1 else []
    if not inputs:
        return
    fit_threads(1)
    # only the forms this CPU computes natively: bf16 or int8 without their units runs tens of times slower than
    # fp32, which would take hours here and say nothing of the students
    forms = candidate_forms()
    if forms == ["fp32"]:
        print(f"predict speed: fp32 only, this CPU ({cpu_info()}) has no bf16 or int8 units")
    rows = []
    for form in forms:
        precision, quantize = FORMS[form]
        models = {way: load(run["checkpoint"], precision=precision, quantize=quantize) for way, run in runs.items()}
        rates = alternate({way: (lambda m=m: m.predict(inputs, task=task)) for way, m in models.items()}, len(inputs),
                          rounds)
        rows += [[way, form, rate, rate / rates["alone"]] for way, rate in rates.items()]
    table(f"{task}: predict speed, {len(inputs)} validation inputs, 1 thread ({cpu_info()}, torch "
          f"{torch.__version__})",
          ["model", "weights", "inputs/s", "against the teacher's"], rows)


def groups(group: str, seeds: list[int], root: Path, ledger: Ledger, args) -> None:
    settings, (precision_field, precision_options, suffix) = kd_settings(args), other_precision(args.precision)
    for seed in seeds:
        teachers = {task: checkpoint_of(alone(group, task, seed, root, ledger, precision=args.precision))
                    for task in GROUPS[group]["alone"]}
        joint_and_mtdnn(group, seed, GROUPS[group].get("finetune_epochs", 2), root, ledger, [],
                        precision=args.precision)
        key = {"group": group, "way": kd_way("joint", settings), "seed": seed, **precision_field}
        if ledger.find(key):
            continue
        cli, minutes = fit(["--config", GROUPS[group]["recipe"], f"--seed_everything={seed}",
                            distill_option(teachers, settings), *precision_options],
                           root / group / folder(key["way"]) / f"seed{seed}{suffix}")
        steps = cli.trainer.global_step
        ledger.add({**key, "scores": primary_scores(cli), "steps": steps, "teacher_passes": teacher_passes(cli),
                    "minutes": minutes, "precision": cli.trainer.precision,
                    "checkpoint": cli.trainer.checkpoint_callback.best_model_path})


def block_pair(text: str) -> list[int]:
    """``--layers``' "S:T": the student's block S compared with the teacher's block T."""
    try:
        student_block, teacher_block = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a student and a teacher block as S:T, e.g. 2:5") from None
    return [student_block, teacher_block]


def summary(seeds: list[int], ledger: Ledger) -> None:
    """Per group and task: each way's test score (mean ± sd over the seeds found) and its gain over ``alone`` of the
    same precision, both in points (x 100); where a task has runs in more than one precision, each way is shown per
    precision."""
    records = [r for r in ledger.records() if r["seed"] in seeds]
    for group in sorted({r["group"] for r in records}):
        rows = []
        tasks = sorted({task for r in records if r["group"] == group for task in r["scores"]})
        for task in tasks:
            mine = [r for r in records if r["group"] == group and task in r["scores"]]
            by_way: dict[tuple[str, str], list[dict]] = {}
            for r in mine:
                by_way.setdefault((way_name(r), precision_of(r)), []).append(r)
            mixed = len({precision for _, precision in by_way}) > 1
            for (way, precision), runs in sorted(by_way.items()):
                values = [r["scores"][task] for r in runs]
                base = by_way.get(("alone", precision))
                gain = (f"{100 * (statistics.mean(values) - statistics.mean(r['scores'][task] for r in base)):+.2f}"
                        if base and way != "alone" else "")
                rows.append([task, f"{way} ({precision})" if mixed else way, spread(values, len(seeds)), gain,
                             int(statistics.mean(r["steps"] for r in runs))])
        table(f"{group}: test score by way (mean ± sd over seeds {seeds})", ["task", "way", "score", "vs alone",
                                                                           "steps"], rows)
    multi_task_targets(records)


def multi_task_targets(records: list[dict]) -> None:
    """Per group and multi-task way, what the targets read: its worst task against that task alone, its small tasks'
    mean gain (paired by seed, points), and its compute against training the tasks one by one: its steps with each
    teacher pass a third of a step (a forward without a backward), then with the teachers' own training added."""
    rows = []
    for group in sorted({r["group"] for r in records if "task" not in r}):
        tasks, small = list(GROUPS[group]["alone"]), GROUPS[group]["small"]
        alone = {(r["task"], r["seed"], precision_of(r)): r for r in records
                 if r["group"] == group and r["way"] == "alone"}

        def alone_of(task: str, run: dict) -> dict | None:  # that task alone, of the run's seed and precision
            return alone.get((task, run["seed"], precision_of(run)))

        for way in sorted({r["way"] for r in records if r["group"] == group and "task" not in r}):
            runs = [r for r in records if r["group"] == group and r["way"] == way
                    and all(alone_of(task, r) for task in tasks)]
            if not runs:
                continue
            gains = {task: statistics.mean(100 * (r["scores"][task] - alone_of(task, r)["scores"][task]) for r in runs)
                     for task in tasks}
            worst = min(gains, key=gains.get)
            one_by_one = statistics.mean(sum(alone_of(task, r)["steps"] for task in tasks) for r in runs)
            cost = statistics.mean(r["steps"] + r.get("teacher_passes", 0) / 3 for r in runs) / one_by_one
            taught = any(r.get("teacher_passes") for r in runs)
            rows.append([group, way, f"{gains[worst]:+.2f} ({worst})",
                         f"{statistics.mean(gains[task] for task in small):+.2f}" if small else "–",
                         f"{cost:.2f}x", f"{cost + 1:.2f}x" if taught else "", len(runs)])
    if rows:
        table("multi-task ways against each task alone (points, paired by seed; compute in steps of the tasks one by "
              "one)", ["group", "way", "worst task", "small tasks, mean", "compute", "with the teachers' training",
                       "seeds"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["compress", "groups", "summary", "sentences"])
    parser.add_argument("--task", default="sst2", help="compress: a task of a group's alone recipes")
    parser.add_argument("--group", default="ner")
    parser.add_argument("--groups", type=Path, help="a YAML file of groups of your own, laid out as transfer.py's")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--layers", type=block_pair, nargs="+", metavar="S:T",
                        help="student:teacher block pairs whose insides are compared too (model.distill's layers)")
    parser.add_argument("--hidden", type=float, help="with --layers: the hidden states' loss weight (1)")
    parser.add_argument("--relations", type=float, help="with --layers: the attention relations' loss weight (1)")
    parser.add_argument("--unlabelled", type=Path, help="compress: a .txt of inputs without labels, one per line, "
                        "that the students with a teacher learn from too")
    parser.add_argument("--corpus", type=Path, help="sentences: a paragraph-per-line text (.txt or .txt.gz)")
    parser.add_argument("--rows", type=int, default=14000, help="sentences: how many")
    parser.add_argument("--out", type=Path, help="sentences: the .txt to write")
    parser.add_argument("--student-trunk", help="a trunk directory to start the 'own' students from")
    parser.add_argument("--student-recipe", help="the recipe the 'own' students train by, with and without the "
                        "teacher (their trunk's own, e.g. configs/trec_finetune.yaml; init_from set to "
                        "--student-trunk); default the teacher's recipe")
    parser.add_argument("--starts", nargs="+", choices=["student", "own"],
                        help="compress: which students: MiniLM's 3-block copy ('student') and/or --student-trunk's "
                        "('own'); default both where --student-trunk is given, else the 3-block one")
    parser.add_argument("--cache", action="store_true", help="the teachers' answers kept per training row after "
                        "their first epoch (model.distill.<task>.cache): a way of its own, 'kd, cached'")
    parser.add_argument("--precision", choices=["32-true", "bf16-mixed"], help="every run's precision, "
                        "and a ledger line's only if it has this one (default: the recipes' auto, which picks "
                        "bf16-mixed on a CPU with bf16 units); every line records the one it trained in")
    parser.add_argument("--students", nargs="+", choices=["alone", "kd"], default=["alone", "kd"],
                        help="compress: which students to train (after the teacher): without and with it; one each in "
                        "two processes, each with a ledger of its own, trains them on two cores at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--student-epochs", type=int, help="the students' epochs, where not the recipe's (recorded)")
    parser.add_argument("--root", type=Path, default=Path("runs/distill"))
    parser.add_argument("--ledger", type=Path, help="the ledger file (default: <root>/results.jsonl)")
    add_version_option(parser)
    args = parser.parse_args()
    if args.groups:
        GROUPS.update(yaml.safe_load(args.groups.read_text()))
    if (args.hidden is not None or args.relations is not None) and not args.layers:  # else ignored silently
        parser.error("--hidden and --relations weigh the losses of --layers' block pairs: add --layers S:T ...")
    if args.part == "sentences":
        if not (args.corpus and args.out):
            parser.error("sentences: give --corpus (a paragraph-per-line text) and --out (the .txt to write)")
        return sentences(args.corpus, args.rows, args.out)
    if args.unlabelled and args.part != "compress":
        parser.error("--unlabelled is compress's: a group's students learn from their teachers on its tasks' data")
    if args.unlabelled and not args.unlabelled.is_file():
        parser.error(f"--unlabelled {args.unlabelled}: no such file (make one with the sentences part)")
    if args.part == "groups" and args.group not in GROUPS:
        parser.error(f"--group {args.group}: the groups are {', '.join(sorted(GROUPS))}")
    if args.starts is None:
        args.starts = ["student", "own"] if args.student_trunk else ["student"]
    if args.student_recipe and not Path(args.student_recipe).is_file():
        parser.error(f"--student-recipe {args.student_recipe}: no such file")
    if "own" in args.starts and not args.student_trunk:
        parser.error("--starts own: the 'own' students start from --student-trunk DIR (as configs/pretrain_large.yaml "
                     "writes it, runs/pretrain_large/trunk)")
    ledger = Ledger(args.ledger or args.root, checked_version(parser, args.trunk_version, args.part == "summary"))
    if args.part == "compress":
        compress(args.task, args.seeds, args.root, ledger, args)
    elif args.part == "groups":
        groups(args.group, args.seeds, args.root, ledger, args)
    summary(args.seeds, ledger)


if __name__ == "__main__":
    main()
