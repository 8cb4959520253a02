"""Fine-tune the same pretrained model with Trunk and with Hugging Face transformers, side by side in one process.

    pip install -e ".[bench]"
    python benchmarks/hf_finetune.py --model ../shared/data/pretrained/all-MiniLM-L6-v2 --data ../shared/data \\
        --task sst2 --task conll --precision 32-true --precision bf16-mixed [--device cuda]
    # the Trainer's settings: --epochs 3 --lr 5e-5 --clip 1.0; every kind: --task sick_entailment, sick_relatedness,
    # rte (GLUE's, where --data holds it), trec, wnut17, goemotions, openbookqa, xquad (with --max-length 256: its
    # recipe's windows)

Both sides start from the same weights and read the same files with the same epochs, learning rate, schedule (linear,
10% warmup), weight decay (0.01, none on biases and LayerNorms), batch size, maximum length and seed. Trunk runs the
shipped recipe of the task (``TASKS``: configs/minilm_*.yaml) with those values set on its command line (``--recipe``:
also as the recipe itself says, a column more); transformers runs the plain loop of its examples
(``run_glue_no_trainer.py``, ``run_ner_no_trainer.py``, ``run_swag_no_trainer.py``, ``run_qa_no_trainer.py``): an
``AutoModelFor...`` head, batches padded to their longest sequence (``DataCollatorWithPadding`` /
``DataCollatorForTokenClassification``), AdamW, the scheduler of ``get_linear_schedule_with_warmup``, autocast for bf16.
Trunk computes on real tokens only (its default) and takes its batches in random order as the recipes do (``--bucket
on``: batches of similar lengths instead, which cost 0.3-3 points here). Printed: each side's dev metric (the recipe's
primary: accuracy; entity F1, first sub-token of each word, by Trunk's ``EntityF1``, which is conlleval's and seqeval's
measure and tested against seqeval; Pearson's r; macro-F1; SQuAD's F1) and training seconds per epoch (validation
excluded), examples/s, and the ratio of examples/s (an epoch cut short by ``--max-batches`` holds more of Trunk's
question-answering windows, its batches being of questions), a row per seed (``--seed 1 2 3``: then each side's mean ±
sd and the gap paired by seed); on CUDA each side's peak memory, and with ``--isolate`` (each side in a process of its
own) on a CPU each side's peak resident memory. ``--ledger FILE.jsonl`` keeps each side's result as it finishes: the
same command again runs only what is not recorded (runs of hours on a CPU outlive a process), and with ``--summary``
prints the tables of what it holds, running nothing (Trunk's sides are of the version of what Trunk computes,
benchmarks/ledger.py's ``TRUNK_VERSION``: ``--trunk-version N --summary`` prints an older one's). A side stopped midway
(a session's end, a kill) goes on from where it stopped when the command runs again: Trunk's from its last checkpoint,
transformers' from its state saved every 10 minutes and at each epoch's end in <root>/<task>-<precision>-seed<N>-hf,
either ending as a run never stopped would. ``--sides hf`` (or ``trunk``, ``recipe``) runs only those sides, the others
read from the ledger: a seed's sides in processes of their own, on cores of their own, each with its own ledger (their
lines put in one file for ``--summary``). Both sides train fp32 master weights (a model folder stored in bf16 is read
into fp32). The sides alternate task by task and precision by precision in the same process, so a machine that slows
down or speeds up meanwhile weighs on both. ``--device cuda``: both sides train on the GPU (the GPU check,
benchmarks/gpu_check.py)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from ledger import Ledger, add_version_option, checked_version  # benchmarks/ledger.py
from throughput import synchronize  # benchmarks/throughput.py

REPO = Path(__file__).resolve().parent.parent


def read_sst2(path: Path) -> tuple[list[str], list[int]]:
    rows = [line.rstrip("\n").split("\t") for line in path.read_text().splitlines()[1:] if line.strip()]
    return [r[0].strip() for r in rows], [int(r[1]) for r in rows]


def read_sick(path: Path, split: str, column: str) -> tuple[list[tuple[str, str]], list]:
    """SICK's sentence pairs of one split (train: TRAIN, dev: TRIAL) and their ``column``: the entailment label or
    the relatedness score."""
    with path.open(newline="", encoding="utf-8") as f:
        wanted = {"train": "TRAIN", "dev": "TRIAL"}[split]
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r["SemEval_set"] == wanted]
    return [(r["sentence_A"], r["sentence_B"]) for r in rows], [
        float(r[column]) if column == "relatedness_score" else r[column] for r in rows]


def read_glue_pairs(path: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """A GLUE pair task's rows (RTE's train.tsv / dev.tsv: index, sentence1, sentence2, label)."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [(r["sentence1"], r["sentence2"]) for r in rows], [r["label"] for r in rows]


def read_conll(path: Path) -> list[tuple[list[str], list[str]]]:
    sentences, words, tags = [], [], []
    for line in path.read_text().splitlines() + [""]:
        if not line.strip() or line.startswith("-DOCSTART-"):
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        parts = line.split()
        words.append(parts[0])
        tags.append(parts[-1])
    return sentences


def read_trec(path: Path) -> tuple[list[str], list[str]]:
    """TREC's questions and their coarse classes (``DESC:manner How did ...``; latin-1)."""
    rows = [line.split(" ", 1) for line in path.read_text(encoding="latin-1").splitlines() if line.strip()]
    return [text for _, text in rows], [label.split(":")[0] for label, _ in rows]


def read_goemotions(path: Path) -> tuple[list[str], list[list[int]]]:
    """GoEmotions' texts and their label ids (``text<TAB>ids,...<TAB>id``)."""
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r[0] for r in rows], [[int(i) for i in r[1].split(",")] for r in rows]


def read_openbookqa(path: Path) -> tuple[list[tuple[str, list[str]]], list[int]]:
    """OpenBookQA's questions with their packed candidates ("(A) ... (B) ...") and the answer's index."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    packed = [re.split(r"\(([A-Z])\)\s*", r["Choices"])[1:] for r in rows]  # [letter, text, letter, text, ...]
    questions = [(r["Question Stem"], [t.strip() for t in cells[1::2]]) for r, cells in zip(rows, packed)]
    return questions, [cells[0::2].index(r["Answer Key"]) for r, cells in zip(rows, packed)]


def read_xquad(path: Path, split: str) -> tuple[list[dict], None]:
    """XQuAD's questions (one row each, as Trunk reads SQuAD JSON) of the split configs/minilm_xquad.yaml holds out:
    a fifth of the articles for validation, another for test, by Trunk's own ``split_off``, so both sides train and
    score the same questions."""
    from trunk.datamodules.question_answering import squad_rows
    from trunk.datamodules.text import split_off

    rows = squad_rows(json.loads(path.read_text(encoding="utf-8"))["data"])
    parts = split_off(len(rows), {"validation": 0.2, "test": 0.2}, units=[r["title"] for r in rows])
    return [rows[i] for i in parts[{"train": "train", "dev": "validation"}[split]]], None


def qa_features(tokenizer, rows: list[dict], args, train: bool) -> tuple[list[dict], list[tuple[int, list]]]:
    """run_qa_no_trainer.py's windows: question + a window of the context (``only_second``, stride 64); for training
    the answer's first and last token in each window that holds it whole, else [CLS]; for scoring each window's
    question and its tokens' spans in the context."""
    encoded = tokenizer([r["question"] for r in rows], [r["context"] for r in rows], truncation="only_second",
                        max_length=args.max_length, stride=64, return_overflowing_tokens=True,
                        return_offsets_mapping=True)
    features, meta = [], []
    for i, example in enumerate(encoded["overflow_to_sample_mapping"]):
        in_context = [s == 1 for s in encoded.sequence_ids(i)]
        offsets = [o if c else None for o, c in zip(encoded["offset_mapping"][i], in_context)]
        feature = {k: encoded[k][i] for k in ("input_ids", "token_type_ids", "attention_mask") if k in encoded}
        if train:
            answer = rows[example]["answers"]
            start_char = answer["answer_start"][0]
            end_char = start_char + len(answer["text"][0])
            tokens = [t for t, o in enumerate(offsets) if o is not None]
            start = end = 0
            if offsets[tokens[0]][0] <= start_char and offsets[tokens[-1]][1] >= end_char:
                start = next(t for t in tokens if offsets[t][1] > start_char)
                end = next(t for t in reversed(tokens) if offsets[t][0] < end_char)
            feature.update(start_positions=start, end_positions=end)
        features.append(feature)
        meta.append((example, offsets))
    return features, meta


def qa_f1(starts: list, ends: list, rows: list[dict], meta: list, max_answer: int = 30) -> float:
    """SQuAD's F1 (Trunk's, its evaluation script's) of each question's best span over its windows: the highest start
    + end logit of a span inside the context, at most ``max_answer`` tokens long, among the top 20 of each."""
    from trunk.tasks.objectives.question_answering import best_scores

    best: dict[int, tuple[float, str]] = {}
    for start, end, (example, offsets) in zip(starts, ends, meta):
        for s in start.topk(min(20, len(start))).indices.tolist():
            for e in end.topk(min(20, len(end))).indices.tolist():
                if (s < len(offsets) and e < len(offsets) and offsets[s] is not None and offsets[e] is not None
                        and s <= e < s + max_answer):
                    score = float(start[s] + end[e])
                    if example not in best or score > best[example][0]:
                        best[example] = (score, rows[example]["context"][offsets[s][0]:offsets[e][1]])
    return sum(best_scores(best.get(i, (0, ""))[1], r["answers"]["text"])[1] for i, r in enumerate(rows)) / len(rows)


@dataclass(frozen=True)
class Task:
    """One comparison: Trunk's recipe, its task's name there and the options that point it at the files (under
    --data); the dev metric; and how the transformers side reads the files: ``read(data, "train" | "dev")`` gives
    (texts or pairs, targets), or (words, tags) sentences for ``kind="tags"``."""

    recipe: str
    name: str
    files: dict[str, str]  # Trunk's data option -> a path under --data, or a value
    metric: str
    read: Callable[[Path, str], tuple]
    kind: str = "classes"  # classes | regression | multilabel | tags | choices | qa
    threshold: float = 0.5  # multilabel: the recipe's

    @property
    def pooled(self) -> bool:
        """Whether the task reads one vector per input: transformers' model for it reads [CLS] through the pretrained
        pooler, which Trunk's side then does too, whatever the recipe's pooling and pooler (its own in the recipe
        column)."""
        return self.kind in ("classes", "regression", "multilabel", "choices")


SICK = {"train": "sick/SICK.txt", "validation": "sick/SICK.txt"}
TASKS = {
    "sst2": Task("configs/minilm_sst2.yaml", "sst2", {"train": "sst2/train.tsv", "validation": "sst2/dev.tsv"},
                 "dev acc", lambda data, split: read_sst2(data / "sst2" / f"{split}.tsv")),
    "conll": Task("configs/minilm_conll2003.yaml", "conll",
                  {"train": "conll2003/train.txt", "validation": "conll2003/valid.txt"}, "dev entity F1",
                  lambda data, split: read_conll(
                      data / "conll2003" / {"train": "train.txt", "dev": "valid.txt"}[split]), "tags"),
    "sick_entailment": Task("configs/minilm_sick_entailment.yaml", "entailment", SICK, "dev acc",
                            lambda data, split: read_sick(data / "sick" / "SICK.txt", split, "entailment_label")),
    "sick_relatedness": Task("configs/minilm_sick.yaml", "sick", SICK, "dev Pearson",
                             lambda data, split: read_sick(data / "sick" / "SICK.txt", split, "relatedness_score"),
                             "regression"),
    "trec": Task("configs/minilm_trec.yaml", "trec",  # no dev split: both sides score TREC_10 (the recipe's test)
                 {"train": "trec/train_5500.label", "validation": "trec/TREC_10.label", "val_fraction": "0"},
                 "TREC_10 acc", lambda data, split: read_trec(
                     data / "trec" / {"train": "train_5500.label", "dev": "TREC_10.label"}[split])),
    "wnut17": Task("configs/minilm_wnut17.yaml", "wnut",
                   {"train": "wnut17/wnut17train.conll", "validation": "wnut17/emerging.dev.conll"}, "dev entity F1",
                   lambda data, split: read_conll(
                       data / "wnut17" / {"train": "wnut17train.conll", "dev": "emerging.dev.conll"}[split]), "tags"),
    "openbookqa": Task("configs/minilm_openbookqa.yaml", "obqa",
                       {"train": "openbookqa/train.tsv", "validation": "openbookqa/dev.tsv"}, "dev acc",
                       lambda data, split: read_openbookqa(data / "openbookqa" / f"{split}.tsv"), "choices"),
    "xquad": Task("configs/minilm_xquad.yaml", "qa", {"train": "xquad_en/xquad.en.json"}, "held-out F1",
                  lambda data, split: read_xquad(data / "xquad_en" / "xquad.en.json", split), "qa"),
    # GLUE's RTE where --data has it (rte/train.tsv, rte/dev.tsv; not in the shared data): long sentence pairs, by
    # the SICK entailment recipe pointed at its columns
    "rte": Task("configs/minilm_sick_entailment.yaml", "entailment",
                {"train": "rte/train.tsv", "validation": "rte/dev.tsv", "select": "{}", "file_type": "null",
                 "text_column": "sentence1", "text_pair_column": "sentence2", "label_column": "label",
                 "label_names": "[entailment, not_entailment]"}, "dev acc",
                lambda data, split: read_glue_pairs(data / "rte" / f"{split}.tsv")),
    "goemotions": Task("configs/minilm_goemotions.yaml", "goemotions",
                       {"train": "goemotions/train.tsv", "validation": "goemotions/dev.tsv"}, "dev macro-F1",
                       lambda data, split: read_goemotions(data / "goemotions" / f"{split}.tsv"), "multilabel", 0.3),
}


def hf_optimizer(model, lr: float, steps: int):
    """The Trainer's AdamW and linear schedule, written out (importing its scheduler from transformers imports ``peft``,
    which this folder's peft.py shadows): weight decay 0.01 on every weight but biases and LayerNorms, 10% warmup
    rounded up as ``TrainingArguments.get_warmup_steps`` rounds it (tests/benchmarks/test_hf_finetune.py holds both
    equal to the installed Trainer's)."""
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
    groups = [
        {"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    optimizer, warmup = torch.optim.AdamW(groups, lr=lr), math.ceil(0.1 * steps)
    factor = lambda step: step / max(1, warmup) if step < warmup else max(0.0, (steps - step) / max(1, steps - warmup))  # noqa: E731
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def reset_peak_memory(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_memory(device: str) -> float | None:
    """The GPU memory a side held at most since ``reset_peak_memory``, in GiB; None on a CPU, where the two sides
    share one process's high-water mark."""
    return torch.cuda.max_memory_allocated() / 2 ** 30 if device == "cuda" else None


def choices_collate(tokenizer):
    """Batches of questions, each with its candidates: every candidate padded to the batch's longest, (B, C, T)."""
    def collate(features: list[dict]) -> dict:
        n = len(features[0]["input_ids"])
        flat = [{k: v[i] for k, v in f.items() if k != "labels"} for f in features for i in range(n)]
        batch = {k: v.view(len(features), n, -1) for k, v in tokenizer.pad(flat, return_tensors="pt").items()}
        return {**batch, "labels": torch.tensor([f["labels"] for f in features])}

    return collate


def hf_run(task: str, args, precision: str, root: Path | None = None, since: float = math.inf
           ) -> tuple[float, list[float], int, float | None]:
    """The transformers side: (dev metric, training seconds of each epoch, training examples of an epoch, peak GPU
    memory in GiB: None on a CPU). With ``root``, its state is saved there every ``HF_SAVE_SECONDS`` and at each
    epoch's end, and a state saved since ``since`` (this side's own stopped run) is gone on from exactly: the same
    batches in the same order and the same dropout as a run never stopped, the epoch's seconds counted once."""
    import transformers
    from transformers import AutoTokenizer, DataCollatorForTokenClassification, DataCollatorWithPadding

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    data, spec = Path(args.data), TASKS[task]
    names = None
    if spec.kind == "qa":  # run with --max-length 256, the recipe's (its stride of 64 needs over 128)
        rows, dev_rows = (spec.read(data, split)[0] for split in ("train", "dev"))
        train, _ = qa_features(tokenizer, rows, args, train=True)
        dev, meta = qa_features(tokenizer, dev_rows, args, train=False)
        names = (dev_rows, meta)
        model = transformers.AutoModelForQuestionAnswering.from_pretrained(args.model).float()
        collate = DataCollatorWithPadding(tokenizer)
    elif spec.kind == "choices":  # each question with each candidate, as run_swag_no_trainer.py pairs them
        def encode(questions, answers):
            # BertForMultipleChoice reads a fixed number of candidates (Trunk any): a question with another number
            # (OpenBookQA's training set has one of 5, its "(D)" given twice) is left out of this side
            count = statistics.mode(len(choices) for _, choices in questions)
            kept = [(q, a) for q, a in zip(questions, answers) if len(q[1]) == count]
            if len(kept) < len(questions):
                print(f"transformers' side: {len(questions) - len(kept)} of {len(questions)} questions left out, "
                      f"having other than {count} candidates")
            out = []
            for (question, choices), answer in kept:
                enc = tokenizer([question] * len(choices), choices, truncation=True, max_length=args.max_length)
                out.append({**enc, "labels": answer})
            return out

        train, dev = (encode(*spec.read(data, split)) for split in ("train", "dev"))
        model = transformers.AutoModelForMultipleChoice.from_pretrained(args.model).float()
        collate = choices_collate(tokenizer)
    elif spec.kind != "tags":  # one target per text or pair
        (texts, targets), (dev_texts, dev_targets) = (spec.read(data, split) for split in ("train", "dev"))
        if spec.kind == "classes":
            names = sorted(set(targets))
            targets, dev_targets = ([names.index(y) for y in ys] for ys in (targets, dev_targets))
        elif spec.kind == "multilabel":
            n = 1 + max(i for ys in targets + dev_targets for i in ys)
            targets, dev_targets = ([[float(i in y) for i in range(n)] for y in ys] for ys in (targets, dev_targets))

        def encode(inputs, ys):
            return [{**tokenizer(*(x if isinstance(x, tuple) else (x,)), truncation=True, max_length=args.max_length),
                     "labels": y} for x, y in zip(inputs, ys)]

        train, dev = encode(texts, targets), encode(dev_texts, dev_targets)
        outputs = {"classes": len(names or []), "regression": 1}.get(spec.kind) or len(train[0]["labels"])
        problem = {"regression": "regression", "multilabel": "multi_label_classification"}.get(
            spec.kind, "single_label_classification")
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            args.model, num_labels=outputs, problem_type=problem).float()
        collate = DataCollatorWithPadding(tokenizer)
    else:
        train_rows, dev_rows = (spec.read(data, split) for split in ("train", "dev"))
        names = sorted({t for _, tags in train_rows + dev_rows for t in tags})
        index = {name: i for i, name in enumerate(names)}

        def encode(rows):
            out = []
            for words, tags in rows:
                enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=args.max_length)
                previous, labels = None, []
                for word in enc.word_ids():  # the first sub-token of each word carries its tag
                    labels.append(-100 if word is None or word == previous else index[tags[word]])
                    previous = word
                out.append({**enc, "labels": labels})
            return out

        train, dev = encode(train_rows), encode(dev_rows)
        model = transformers.AutoModelForTokenClassification.from_pretrained(args.model, num_labels=len(names)).float()
        collate = DataCollatorForTokenClassification(tokenizer)
    generator = torch.Generator().manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(train, batch_size=args.batch_size, shuffle=True, collate_fn=collate,
                                         generator=generator)
    batches = min(len(loader), args.max_batches or len(loader))
    optimizer, schedule = hf_optimizer(model, args.lr, batches * args.epochs)
    bf16 = precision == "bf16-mixed"
    reset_peak_memory(args.device)
    model.to(args.device)
    saved = root / "hf_state.pt" if root is not None else None
    state = (torch.load(saved, map_location=args.device) if saved is not None and saved.is_file()
             and saved.stat().st_mtime >= since else None)
    if state is not None:
        print(f"Resuming the stopped transformers side in {root} (epoch {state['epoch'] + 1}, batch {state['batch']})",
              file=sys.stderr, flush=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        generator.set_state(state["generator"])  # as the stopped epoch began: it draws the same order
    seconds, scores, examples = (state["seconds"], state["scores"], state["examples"]) if state else ([], [], 0)
    for epoch in range(state["epoch"] if state else 0, args.epochs):
        model.train()
        order = generator.get_state()  # before the epoch's order is drawn from it
        skip, carried, examples = (state["batch"], state["elapsed"], state["examples"]) if state else (0, 0.0, 0)
        synchronize(args.device)
        start, paused, last_save = time.perf_counter() - carried, 0.0, time.perf_counter()
        for i, batch in enumerate(loader):
            if i == batches:
                break
            if i < skip:  # done before the stop
                continue
            if state is not None:  # the first batch after a resume: dropout draws on as it would have
                torch.set_rng_state(state["rng"])
                state = None
            examples += len(batch["input_ids"])
            with torch.autocast(args.device, dtype=torch.bfloat16, enabled=bf16):
                loss = model(**{k: v.to(args.device) for k, v in batch.items()}).loss
            loss.backward()
            if args.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            if saved is not None and time.perf_counter() - last_save > HF_SAVE_SECONDS:
                began = time.perf_counter()
                save_hf_state(saved, model, optimizer, schedule, epoch=epoch, batch=i + 1, generator=order,
                              elapsed=began - start - paused, examples=examples, seconds=seconds, scores=scores)
                last_save = time.perf_counter()
                paused += last_save - began
        if state is not None:  # resumed after the epoch's last batch (stopped in its evaluation): the next epoch
            torch.set_rng_state(state["rng"])  # trains from its first batch, drawing on from where the stop was
            state = None
        synchronize(args.device)
        seconds.append(time.perf_counter() - start - paused)
        scores.append(hf_evaluate(model, dev, collate, bf16, spec, names, args.device))
        if saved is not None and epoch + 1 < args.epochs:  # after the last, the state is not needed
            save_hf_state(saved, model, optimizer, schedule, epoch=epoch + 1, batch=0, generator=generator.get_state(),
                          elapsed=0.0, examples=0, seconds=seconds, scores=scores)  # the next epoch's, so far
    if saved is not None:
        saved.unlink(missing_ok=True)  # done: it was kept to go on from a stop (MiniLM's is 270 MB)
    return max(scores), seconds, examples, peak_memory(args.device)  # the best epoch, as Trunk's checkpoint keeps


HF_SAVE_SECONDS = 600  # a stopped transformers side loses at most this much of its training


def save_hf_state(path: Path, model, optimizer, schedule, **progress) -> None:
    """The transformers side's whole state, written whole or not at all (a stop during the write keeps the last)."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
             "rng": torch.get_rng_state(), **progress}
    torch.save(state, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)


def hf_evaluate(model, dev: list[dict], collate, bf16: bool, spec: Task, names: list[str] | None,
                device: str = "cpu") -> float:
    """The dev metric Trunk's recipe scores by: accuracy, Pearson's r, macro-F1 at the recipe's threshold, or (tags)
    entity F1 over each word's first sub-token."""
    import torchmetrics

    from trunk.core.tagging import split_tag
    from trunk.tasks.objectives.token_classification import EntityF1

    model.eval()
    logits, gold = [], []
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        for batch in torch.utils.data.DataLoader(dev, batch_size=64, collate_fn=collate):
            out = model(**{k: v.to(device) for k, v in batch.items() if k != "labels"})
            if spec.kind == "qa":  # each window's start and end logits: (2, T)
                logits += list(torch.stack([out.start_logits, out.end_logits], 1).float().cpu())
                continue
            logits += list(out.logits.float().cpu())
            gold += list(batch["labels"])
    if spec.kind == "qa":
        return qa_f1([x[0] for x in logits], [x[1] for x in logits], *names)
    if spec.kind == "regression":
        return float(torchmetrics.functional.pearson_corrcoef(torch.stack(logits)[:, 0], torch.stack(gold).float()))
    if spec.kind == "multilabel":
        scores, targets = torch.stack(logits).sigmoid(), torch.stack(gold).long()
        return float(torchmetrics.functional.classification.multilabel_f1_score(
            scores, targets, num_labels=targets.shape[1], threshold=spec.threshold, average="macro"))
    if spec.kind in ("classes", "choices"):
        return float((torch.stack(logits).argmax(-1) == torch.stack(gold)).float().mean())
    kept = [[(names[p], names[g]) for p, g in zip(row.argmax(-1).tolist(), gs.tolist()) if g != -100]
            for row, gs in zip(logits, gold)]
    metric = EntityF1(sorted({split_tag(t)[1] for t in names} - {""}))
    metric.update([[p for p, _ in row] for row in kept], [[g for _, g in row] for row in kept])
    return float(metric.compute()["f1"])


def examples_in(batch: dict) -> int:
    """A Trunk batch's training examples: a multiple-choice batch holds each question's candidates as rows of their
    own (``choice_counts``), a question counted once, as transformers' (questions, candidates, tokens) batch is."""
    return len(batch["choice_counts"]) if "choice_counts" in batch else len(batch["input_ids"])


class EpochTimer(L.Callback):
    """Training seconds of each epoch, validation excluded, and the training examples of the last epoch. Its figures
    go into each checkpoint, so a run resumed from one (Lightning calls no ``on_train_epoch_start`` for an epoch it
    resumes into) counts the epoch's seconds and examples from before the stop and after it, once each."""

    def __init__(self, device: str = "cpu") -> None:
        self.device, self.seconds, self.examples = device, [], 0
        self.paused, self.start, self.validating = 0.0, 0.0, 0.0
        self.carried: float | None = None  # a resumed epoch's seconds before the stop, until its next batch starts
        self.unknown = False  # resumed from a checkpoint without the timer's figures: the epoch's seconds are not known

    def state_dict(self) -> dict:
        elapsed = time.perf_counter() - self.start - self.paused if self.start else 0.0
        return {"seconds": list(self.seconds), "elapsed": elapsed, "examples": self.examples}

    def load_state_dict(self, state: dict) -> None:
        self.seconds, self.carried, self.examples = list(state["seconds"]), state["elapsed"], state["examples"]

    def on_train_epoch_start(self, trainer, module) -> None:
        synchronize(self.device)
        self.start, self.paused, self.examples, self.carried = time.perf_counter(), 0.0, 0, None
        self.unknown = False

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if self.carried is not None:  # the first batch after a resume: the epoch goes on from its seconds so far
            self.start, self.paused, self.carried = time.perf_counter() - self.carried, 0.0, None
        elif not self.start:
            self.start, self.unknown = time.perf_counter(), True
        self.examples += examples_in(batch)

    def on_validation_start(self, trainer, module) -> None:
        synchronize(self.device)
        self.validating = time.perf_counter()

    def on_validation_end(self, trainer, module) -> None:
        if not trainer.sanity_checking:
            self.paused += time.perf_counter() - self.validating

    def on_train_epoch_end(self, trainer, module) -> None:
        synchronize(self.device)
        self.seconds.append(math.nan if self.unknown else time.perf_counter() - self.start - self.paused)


def trunk_run(task: str, args, precision: str, root: Path, since: float = math.inf, own: bool = False
              ) -> tuple[float, list[float], int, float | None]:
    """The Trunk side: the recipe with the shared settings (``own``: with its own learning rate, epochs, batch size
    and length); (best dev metric, training seconds of each epoch, training examples of an epoch, peak GPU memory).
    A checkpoint saved in ``root`` since ``since`` (this side's own stopped run) is gone on from (Trunk's exact
    resume)."""
    from trunk.cli import run_cli
    from trunk.training.fault_tolerance import last_checkpoints

    data, spec = Path(args.data), TASKS[task]
    name = spec.name
    files = {key: data / value if "/" in value else value for key, value in spec.files.items()}
    timer = EpochTimer(args.device)
    cli = run_cli([
        "--config", str(REPO / spec.recipe), f"--model.init_from={args.model}",
        *(f"--data.tasks.{name}.init_args.{split}={path}" for split, path in files.items()),
        f"--data.tasks.{name}.init_args.test=null", f"--trainer.precision={precision}",
        f"--seed_everything={args.seed}",
        *([] if own else [f"--data.tasks.{name}.init_args.batch_size={args.batch_size}",
                          f"--data.tasks.{name}.init_args.max_length={args.max_length}",
                          f"--model.optimizer.lr={args.lr}", f"--trainer.max_epochs={args.epochs}",
                          *([f"--model.tasks.{name}.init_args.{key}" for key in ("pooling=cls", "pooler=true")]
                            if spec.pooled else [])]),
        "--trainer.val_check_interval=1.0", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", f"--trainer.default_root_dir={root}",
        f"--trainer.accelerator={'gpu' if args.device == 'cuda' else 'cpu'}", "--trainer.devices=1",
        *([f"--trainer.limit_train_batches={args.max_batches}"] if args.max_batches else []),
        *([f"--trainer.gradient_clip_val={args.clip}"] if args.clip and not own else []),
        *([f"--data.tasks.{name}.init_args.bucket_by_length={args.bucket == 'on'}"] if args.bucket else []),
    ], run=False)
    cli.trainer.callbacks.append(timer)
    reset_peak_memory(args.device)
    stopped = [path for path in last_checkpoints(root) if path.stat().st_mtime >= since]
    if stopped:
        print(f"Resuming the stopped Trunk side in {root} from {stopped[-1]}", file=sys.stderr, flush=True)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=stopped[-1] if stopped else None)
    metric = cli.trainer.checkpoint_callback.best_model_score
    return float(metric), timer.seconds, timer.examples, peak_memory(args.device)


def recipe_run(task: str, args, precision: str, root: Path, since: float = math.inf) -> tuple:
    """Trunk's recipe as it stands: its own learning rate, epochs, batch size and length (``trunk_run``'s ``own``)."""
    return trunk_run(task, args, precision, root, since, True)


def isolated(side: Callable, *args) -> tuple:
    """``side(*args)`` in a process of its own (spawned: it inherits no memory), so its peak memory is its own: on a
    CPU that process's peak resident set in GiB takes the result's last field (a GPU's is the allocator's already).
    The process ends with its side, whether this one still waits for it or not: a pool's worker outlived a benchmark
    stopped by a signal, idle and holding its memory."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=side_process, args=(send, side, *args))
    process.start()
    send.close()  # the child's end only: a child that dies unheard is then an EOFError here, not a wait forever
    try:
        ok, result = receive.recv()
    except EOFError:
        process.join()
        raise RuntimeError(f"the side's process ended (exit code {process.exitcode}) before it sent its result; its "
                           "output above says why") from None
    process.join()
    if not ok:
        raise result
    return result


def side_process(send, side: Callable, *args) -> None:
    """A side's whole process: its result (with its peak memory) or its error, sent back to the benchmark."""
    import resource
    import traceback

    try:
        *result, gpu_memory = side(*args)
        peak = gpu_memory if gpu_memory is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        send.send((True, (*result, peak)))  # ru_maxrss is in KiB
    except BaseException as err:  # noqa: BLE001 - every error goes back to the benchmark, with where it was raised
        err.add_note(traceback.format_exc())
        try:
            send.send((False, err))
        except Exception:  # noqa: BLE001 - an error that does not pickle goes back as its text
            send.send((False, RuntimeError(traceback.format_exc())))


def claim(folder: Path, key: dict) -> float:
    """When this side's run in ``folder`` began: the time ``folder/side.json`` was written if it names this side (its
    ledger key and Trunk's version: a run of it was stopped there), else now, the folder marked as this side's. A
    checkpoint older than that is another run's (other settings, or a version of Trunk before), never gone on from."""
    marker, mine = folder / "side.json", json.dumps(key, sort_keys=True)
    if not (marker.is_file() and marker.read_text() == mine):
        folder.mkdir(parents=True, exist_ok=True)
        marker.write_text(mine)
    return marker.stat().st_mtime


class NotRecorded(Exception):
    """A side ``--summary`` finds no result of in the ledger."""


def compare(args) -> list[dict]:
    """Each task, precision and seed, Trunk then transformers (then Trunk's own recipe, with ``--recipe``): their dev
    metrics, seconds per epoch, examples/s and peak GPU memory. With ``--ledger``, each side's result is kept as it
    finishes and a rerun of the same command takes it from there: a run of hours survives its process."""
    ledger = Ledger(args.ledger, args.trunk_version) if args.ledger else None
    shared = {k: getattr(args, k) for k in ("epochs", "lr", "batch_size", "max_length", "clip")}
    setting = {"model": str(Path(args.model).resolve()), "device": args.device, "max_batches": args.max_batches,
               "bucket": args.bucket, "isolate": args.isolate}
    rows = []
    for task in args.task or ["sst2", "conll"]:
        for precision in args.precision or ["32-true"]:
            for seed in args.seed:
                run = argparse.Namespace(**{**vars(args), "seed": seed})
                root = Path(args.root) / f"{task}-{precision}-seed{seed}"

                def side(name: str, run_side: Callable, folder: Path) -> tuple:
                    """One side's result: from the ledger where it is recorded, else run in ``folder`` (and
                    recorded), going on from where a stopped run of this side left it; with ``--summary``, never
                    run."""
                    key = {"task": task, "precision": precision, "seed": seed, "side": name, **setting,
                           **({} if name == "recipe" else shared)}  # the recipe side keeps its own settings
                    # transformers' result is the same whatever Trunk's version
                    found = (ledger.peek if args.summary else ledger.find)(key, name == "hf") if ledger else None
                    if found:
                        print(f"  {task} {precision} seed {seed} {name}: from {ledger.path}", flush=True)
                        return tuple(found["result"])
                    if args.summary or name not in args.sides:
                        raise NotRecorded(name)
                    since = claim(folder, {**key, **({} if name == "hf" else {"trunk_version": args.trunk_version})})
                    result = (isolated if args.isolate else lambda f, *a: f(*a))(run_side, task, run, precision,
                                                                                  folder, since)
                    if ledger:
                        ledger.add({**key, "result": list(result)})
                    return result

                results = {}
                for name, run_side, suffix in (("trunk", trunk_run, ""), ("hf", hf_run, "-hf"),
                                               *([("recipe", recipe_run, "-recipe")] if args.recipe else [])):
                    with contextlib.suppress(NotRecorded):  # a side not run here: its row waits for it
                        results[name] = side(name, run_side, root.with_name(root.name + suffix))
                missing = [name for name in ("trunk", "hf") if name not in results]
                if missing:
                    print(f"  {task} {precision} seed {seed}: the {missing[0]} side is not recorded yet", flush=True)
                    continue
                trunk_metric, trunk_seconds, trunk_examples, trunk_memory = results["trunk"]
                hf_metric, hf_seconds, hf_examples, hf_memory = results["hf"]
                t, h = (statistics.fmean(known) if (known := [x for x in s if not math.isnan(x)]) else math.nan
                        for s in (trunk_seconds, hf_seconds))  # a resumed epoch's seconds may be unknown
                rows.append({"task": task, "precision": precision, "seed": seed, "trunk": trunk_metric,
                             "hf": hf_metric, "trunk_s_per_epoch": t, "hf_s_per_epoch": h,
                             "trunk_examples_per_s": trunk_examples / t, "hf_examples_per_s": hf_examples / h,
                             "speedup": h / t * trunk_examples / hf_examples, "trunk_peak_gib": trunk_memory,
                             "hf_peak_gib": hf_memory})
                if args.recipe:
                    rows[-1]["trunk_recipe"] = results["recipe"][0] if "recipe" in results else math.nan
                print(f"  {task} {precision} seed {seed}: Trunk {trunk_metric:.4f} in {t:.1f} s/epoch, transformers "
                      f"{hf_metric:.4f} in {h:.1f} s/epoch", flush=True)
    return rows


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face BERT-family model folder (config.json, ...)")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"), help="the folder of sst2/, conll2003/")
    parser.add_argument("--task", action="append", choices=list(TASKS),
                        help=f"{', '.join(TASKS)} (default: sst2 and conll)")
    parser.add_argument("--precision", action="append", help="32-true, bf16-mixed (default: 32-true)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--seed", type=int, nargs="+", default=[42], help="one run of each side per seed")
    parser.add_argument("--recipe", action="store_true",
                        help="also Trunk's recipe with its own learning rate, epochs, batch size and length (a column)")
    parser.add_argument("--max-batches", type=int, default=0, help="train on this many batches an epoch (0: all)")
    parser.add_argument("--root", default="runs/hf_finetune", help="where Trunk's runs write")
    parser.add_argument("--bucket", choices=["on", "off"],
                        help="Trunk's batches of similar lengths (default: as the recipe says, off)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both sides train")
    parser.add_argument("--isolate", action="store_true",
                        help="run each side in a process of its own and report its peak memory (on a CPU, the "
                             "process's peak resident set: libraries included)")
    parser.add_argument("--clip", type=float, default=0.0,
                        help="clip the gradients' norm at this on both sides (the Trainer's default: 1.0; 0: off)")
    parser.add_argument("--ledger", help="a .jsonl file keeping each side's result as it finishes: the same command "
                                         "again goes on from there (one process a ledger)")
    parser.add_argument("--summary", action="store_true",
                        help="print the tables of what the ledger holds for this command, running nothing (also while "
                             "the benchmark runs)")
    parser.add_argument("--sides", nargs="+", choices=["trunk", "hf", "recipe"],
                        help="run only these sides (the others are taken from the ledger where recorded): one "
                             "process a side, each with a ledger of its own, spreads a seed's sides over the cores")
    add_version_option(parser)
    args = parser.parse_args(argv)
    if args.summary and not args.ledger:
        parser.error("--summary reads a ledger: give --ledger FILE.jsonl")
    if args.sides and "recipe" in args.sides and not args.recipe:  # named but not run: refused, not skipped silently
        parser.error("--sides recipe runs Trunk's recipe: add --recipe")
    args.sides = args.sides or ["trunk", "hf", "recipe"]  # none named: every side
    checked_version(parser, args.trunk_version, args.summary)
    return args


def mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{values[0]:.4f}"


def main(argv: list[str]) -> None:
    args = arguments(argv)
    from trunk.training.precision import cpu_info

    print(f"machine: {os.cpu_count()} x {cpu_info()}, torch {torch.__version__}, threads {torch.get_num_threads()}"
          + (f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""))
    rows = compare(args)
    metric = {key: task.metric for key, task in TASKS.items()}
    print(f"\nsame weights ({args.model}), {args.epochs} epoch(s), lr {args.lr}, batch {args.batch_size}, "
          f"max length {args.max_length}, seed {args.seed}" + (f", {args.max_batches} batches an epoch"
                                                               if args.max_batches else "")
          + (f", Trunk's length buckets {args.bucket}" if args.bucket else "")
          + (f", gradients clipped at {args.clip}" if args.clip else ""))
    memory = args.device == "cuda" or args.isolate  # each side's own peak: the GPU allocator's, or a process's RSS
    extra = (["Trunk's recipe"] if args.recipe else []) + (["Trunk peak GiB", "transformers peak GiB"]
                                                           if memory else [])
    header = ["task", "precision", "Trunk", "transformers", "Trunk s/epoch", "transformers s/epoch", "speed-up", "seed",
              *extra]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        t, h = row["trunk_s_per_epoch"], row["hf_s_per_epoch"]
        cells = ([f"{row['trunk_recipe']:.4f}"] if args.recipe else []) + (
            [f"{row['trunk_peak_gib']:.2f}", f"{row['hf_peak_gib']:.2f}"] if memory else [])
        print(f"| {row['task']} ({metric[row['task']]}) | {row['precision']} | {row['trunk']:.4f} | {row['hf']:.4f} | "
              f"{t:.0f} | {h:.0f} | {row['speedup']:.2f}x | {row['seed']} | "
              + "".join(f"{c} | " for c in cells))
    if len(args.seed) > 1:  # mean ± sd over the seeds, the gap paired by seed, the speed and memory's range
        header = ["task", "precision", "seeds", "Trunk", "transformers", "Trunk - transformers", "speed-up",
                  *(["Trunk's recipe"] if args.recipe else []),
                  *(["peak GiB, Trunk / transformers"] if memory else [])]
        print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for key in dict.fromkeys((row["task"], row["precision"]) for row in rows):
            group = [row for row in rows if (row["task"], row["precision"]) == key]
            trunk, hf = [r["trunk"] for r in group], [r["hf"] for r in group]
            gaps = [a - b for a, b in zip(trunk, hf)]
            recipe = [r["trunk_recipe"] for r in group if not math.isnan(r.get("trunk_recipe", math.nan))]
            cells = ([mean_sd(recipe) if recipe else "–"] if args.recipe else []) + (
                [f"{max(r['trunk_peak_gib'] for r in group):.2f} / {max(r['hf_peak_gib'] for r in group):.2f}"]
                if memory else [])
            print(f"| {key[0]} ({metric[key[0]]}) | {key[1]} | {len(group)} | {mean_sd(trunk)} | {mean_sd(hf)} | "
                  f"{mean_sd(gaps)} | {statistics.mean(r['speedup'] for r in group):.2f}x | "
                  + "".join(f"{c} | " for c in cells))


if __name__ == "__main__":
    main(sys.argv[1:])
