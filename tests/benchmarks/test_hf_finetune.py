"""benchmarks/hf_finetune.py end to end on a tiny random BERT and a few lines of each data set: both sides train from
the same folder and the table comes out."""

import json
import random
import sys
from pathlib import Path

import pytest
from conftest import REPO, ner_sentence, quiz_question, scored_pair, squad_article, write_conll

pytest.importorskip("transformers")
sys.path.insert(0, str(REPO / "benchmarks"))


def write_sst2(data) -> random.Random:
    """SST-2's layout with generated reviews; the generator, for more data after them."""
    from trunk.datamodules.builtin import sentiment_example

    rng = random.Random(0)
    (data / "sst2").mkdir(parents=True)
    for split in ("train", "dev"):
        rows = [sentiment_example(rng) for _ in range(64)]
        lines = ["sentence\tlabel", *(f"{r['text']}\t{int(r['label'] == 'positive')}" for r in rows)]
        (data / "sst2" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return rng


def test_both_sides_fine_tune_the_same_folder_and_print_the_table(tmp_path, capsys):
    import hf_finetune
    from test_hf import tiny

    tiny("bert", tmp_path / "model", masked_lm=False)
    rng = write_sst2(tmp_path / "data")
    (tmp_path / "data" / "conll2003").mkdir()
    for split in ("train", "valid"):
        write_conll(tmp_path / "data" / "conll2003" / f"{split}.txt", [ner_sentence(rng) for _ in range(64)])
    hf_finetune.main(["--model", str(tmp_path / "model"), "--data", str(tmp_path / "data"), "--max-batches", "2",
                      "--batch-size", "8", "--max-length", "32", "--root", str(tmp_path / "runs")])
    table = capsys.readouterr().out.split("| task |")[1].splitlines()
    assert [row.split(" | ")[0] for row in table[2:]] == ["| sst2 (dev acc)", "| conll (dev entity F1)"]
    for row in table[2:]:
        cells = row.strip("|").split("|")
        assert 0.0 <= float(cells[2]) <= 1.0 and 0.0 <= float(cells[3]) <= 1.0 and cells[6].strip().endswith("x")


def test_each_side_in_a_process_of_its_own_reports_its_peak_memory(tmp_path, capsys):
    """--isolate: each side runs in a spawned process, whose peak resident memory (the libraries' included: over 0.1
    GiB) is that side's column."""
    import hf_finetune
    from test_hf import tiny

    tiny("bert", tmp_path / "model", masked_lm=False)
    write_sst2(tmp_path / "data")
    hf_finetune.main(["--model", str(tmp_path / "model"), "--data", str(tmp_path / "data"), "--task", "sst2",
                      "--max-batches", "2", "--batch-size", "8", "--max-length", "32", "--isolate",
                      "--root", str(tmp_path / "runs")])
    header, _, row = capsys.readouterr().out.split("| task |")[1].splitlines()[:3]
    assert header.strip(" |").split(" | ")[-2:] == ["Trunk peak GiB", "transformers peak GiB"]
    assert all(float(cell) > 0.1 for cell in row.strip(" |").split(" | ")[-2:])


def test_a_ledger_keeps_each_sides_result_and_a_rerun_goes_on_from_it(tmp_path, capsys, monkeypatch):
    """--ledger: each side's result is kept as it finishes; the same command again runs nothing and prints the same
    table; another learning rate reruns the two sides it sets, not the recipe's (its own settings); a new version of
    what Trunk computes reruns Trunk's sides alone, and ``--trunk-version`` of before reprints the tables of before
    (and runs nothing: refused without ``--summary``)."""
    import hf_finetune
    from test_hf import tiny

    tiny("bert", tmp_path / "model", masked_lm=False)
    write_sst2(tmp_path / "data")
    command = ["--model", str(tmp_path / "model"), "--data", str(tmp_path / "data"), "--task", "sst2", "--max-batches",
               "2", "--batch-size", "8", "--max-length", "32", "--recipe", "--root", str(tmp_path / "runs"),
               "--ledger", str(tmp_path / "ledger.jsonl")]
    hf_finetune.main(command)
    first = capsys.readouterr().out.split("| task |")[1]
    assert [r["side"] for r in map(json.loads, (tmp_path / "ledger.jsonl").read_text().splitlines())] == [
        "trunk", "hf", "recipe"]
    ran = []
    monkeypatch.setattr(hf_finetune, "trunk_run", lambda *a: ran.append("trunk") or (0.5, [1.0], 8, None))
    monkeypatch.setattr(hf_finetune, "hf_run", lambda *a: ran.append("hf") or (0.5, [1.0], 8, None))
    hf_finetune.main(command)
    assert ran == [] and capsys.readouterr().out.split("| task |")[1] == first
    hf_finetune.main([*command, "--seed", "42", "7", "--summary"])  # what is recorded, running nothing
    out = capsys.readouterr().out
    assert ran == [] and "sst2 32-true seed 7: the trunk side is not recorded yet" in out
    assert [row.split(" | ")[7] for row in out.split("| task |")[1].splitlines()[2:] if row.strip()] == ["42"]
    hf_finetune.main([*command, "--lr", "3e-4"])
    assert ran == ["trunk", "hf"]
    import ledger

    version = ledger.TRUNK_VERSION
    monkeypatch.setattr(ledger, "TRUNK_VERSION", version + 1)  # Trunk computes otherwise now
    ran.clear()
    hf_finetune.main(command)
    assert ran == ["trunk", "trunk"]  # its trainer-settings and recipe sides again; transformers' is still the same
    capsys.readouterr()
    ran.clear()
    hf_finetune.main([*command, "--trunk-version", str(version), "--summary"])  # the tables of before, as they were
    assert ran == [] and capsys.readouterr().out.split("| task |")[1] == first
    with pytest.raises(SystemExit):
        hf_finetune.main([*command, "--trunk-version", str(version)])  # what this code computes is version + 1
    assert "this code computes version" in capsys.readouterr().err


def test_sides_run_in_processes_of_their_own_each_with_its_ledger_and_their_lines_make_the_row(tmp_path, capsys,
                                                                                               monkeypatch):
    """--sides: only the sides named run (the others waited for, the row printed once both trunk and hf are
    recorded); two commands with ledgers of their own split a seed's sides, and their lines in one file make the
    row, the recipe's column with it."""
    import hf_finetune

    ran = []

    def stub(name, metric):
        return lambda *a: ran.append(name) or (metric, [1.0], 8, None)

    for name, metric in (("trunk", 0.75), ("hf", 0.5), ("recipe", 0.875)):
        monkeypatch.setattr(hf_finetune, f"{name}_run", stub(name, metric))
    command = ["--model", str(tmp_path / "model"), "--task", "sst2", "--recipe", "--root", str(tmp_path / "runs")]
    hf_finetune.main([*command, "--sides", "hf", "--ledger", str(tmp_path / "hf.jsonl")])
    assert ran == ["hf"] and "sst2 32-true seed 42: the trunk side is not recorded yet" in capsys.readouterr().out
    hf_finetune.main([*command, "--sides", "trunk", "recipe", "--ledger", str(tmp_path / "trunk.jsonl")])
    assert ran == ["hf", "trunk", "recipe"] and "the hf side is not recorded yet" in capsys.readouterr().out
    both = tmp_path / "both.jsonl"
    both.write_text((tmp_path / "trunk.jsonl").read_text() + (tmp_path / "hf.jsonl").read_text())
    hf_finetune.main([*command, "--ledger", str(both), "--summary"])
    row = capsys.readouterr().out.split("| task |")[1].splitlines()[2]
    assert ran == ["hf", "trunk", "recipe"] and "0.7500" in row and "0.5000" in row and "0.8750" in row
    for sides in (["recipe"], ["trunk", "recipe"]):  # the recipe's side named without --recipe
        with pytest.raises(SystemExit):
            hf_finetune.main([*command[:-3], "--sides", *sides])
        assert "add --recipe" in capsys.readouterr().err


def test_a_side_stopped_midway_goes_on_from_where_it_stopped_and_ends_as_a_run_never_stopped(tmp_path, capsys,
                                                                                             monkeypatch):
    """A session's end stops a side of hours: the same command again goes on from the side's last checkpoint (Trunk's
    exact resume; transformers' state saved as it trains) with its epochs' seconds counted once, and ends with the
    scores of a run never stopped; a folder's checkpoint of other settings is never gone on from."""
    import hf_finetune
    from test_hf import tiny

    import trunk.cli

    tiny("bert", tmp_path / "model", masked_lm=False)
    write_sst2(tmp_path / "data")
    command = ["--model", str(tmp_path / "model"), "--data", str(tmp_path / "data"), "--task", "sst2", "--max-batches",
               "6", "--epochs", "3", "--batch-size", "8", "--max-length", "32", "--ledger"]
    hf_finetune.main([*command, str(tmp_path / "straight.jsonl"), "--root", str(tmp_path / "straight")])
    straight = [json.loads(line)["result"] for line in (tmp_path / "straight.jsonl").read_text().splitlines()]

    class Stop(Exception):
        pass

    # transformers' side: after an epoch's last batch (before its evaluation), at an epoch's end, within an epoch
    stops = {"trunk": 1, "hf": [(0, 6), (2, 0), (2, 2)]}

    class StoppingTimer(hf_finetune.EpochTimer):  # the Trunk side stopped in its second epoch, a checkpoint behind
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 9 and stops["trunk"]:
                stops["trunk"] -= 1
                raise Stop

    def saving_then_stopping(path, *args, **progress):
        saving(path, *args, **progress)
        if stops["hf"] and (progress["epoch"], progress["batch"]) == stops["hf"][0]:
            stops["hf"].pop(0)
            raise Stop

    saving, run_cli = hf_finetune.save_hf_state, trunk.cli.run_cli
    monkeypatch.setattr(hf_finetune, "EpochTimer", StoppingTimer)
    monkeypatch.setattr(hf_finetune, "save_hf_state", saving_then_stopping)
    monkeypatch.setattr(hf_finetune, "HF_SAVE_SECONDS", 0)  # after every batch
    monkeypatch.setattr(trunk.cli, "run_cli", lambda a, **k: run_cli([*a, "--fault_tolerance.save_every_steps=2"], **k))
    stopped = [*command, str(tmp_path / "stopped.jsonl"), "--root", str(tmp_path / "stopped")]
    with pytest.raises(Stop):
        hf_finetune.main(stopped)
    capsys.readouterr()
    with pytest.raises(Stop):  # Trunk's side goes on from its checkpoint at step 8; transformers' stops
        hf_finetune.main(stopped)
    assert "Resuming the stopped Trunk side" in capsys.readouterr().err
    for where in ("(epoch 1, batch 6)", "(epoch 3, batch 0)"):  # transformers' side goes on, and stops again
        with pytest.raises(Stop):
            hf_finetune.main(stopped)
        assert where in capsys.readouterr().err
    hf_finetune.main(stopped)  # transformers' side goes on from its third epoch's 2nd batch
    err = capsys.readouterr().err
    assert "Resuming the stopped transformers side" in err and "(epoch 3, batch 2)" in err
    resumed = [json.loads(line)["result"] for line in (tmp_path / "stopped.jsonl").read_text().splitlines()]
    assert [r[0] for r in resumed] == [r[0] for r in straight]  # the same dev scores, to the last digit
    assert all(len(r[1]) == 3 and all(0 < s < 600 for s in r[1]) for r in resumed)  # each epoch, counted once
    assert resumed[0][2] == straight[0][2] and resumed[1][2] == straight[1][2]  # an epoch's examples
    hf_finetune.main([*stopped[:-4], "--lr", "3e-4", *stopped[-4:]])  # other settings: the same folders, anew
    assert "Resuming" not in capsys.readouterr().err


def test_a_sides_process_ends_with_its_side_when_the_benchmark_is_gone(tmp_path):
    """--isolate: the benchmark killed while a side runs (a session's end), the side's process still ends when its side
    does, instead of waiting idle for work that never comes (a pool's worker did, holding its memory)."""
    import os
    import subprocess
    import time

    (tmp_path / "slow_side.py").write_text(
        "import os, time\n\n\ndef side(marker):\n    open(marker, 'w').write(str(os.getpid()))\n    time.sleep(3)\n"
        "    return 1.0, [1.0], 1, None\n")
    marker = tmp_path / "pid"
    benchmark = subprocess.Popen([sys.executable, "-c", (
        f"import sys; sys.path[:0] = [{str(tmp_path)!r}, {str(REPO / 'benchmarks')!r}]\n"
        f"import hf_finetune, slow_side\nhf_finetune.isolated(slow_side.side, {str(marker)!r})")])
    deadline = time.monotonic() + 300
    while not (marker.is_file() and marker.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    benchmark.kill()
    benchmark.wait(timeout=60)
    child = int(marker.read_text())

    def running() -> bool:
        try:
            return Path(f"/proc/{child}/stat").read_text().split(") ")[1][0] != "Z"  # a zombie has ended
        except (FileNotFoundError, ProcessLookupError):
            return False

    while running() and time.monotonic() < deadline:
        time.sleep(0.5)
    alive = running()
    if alive:
        os.kill(child, 9)
    assert not alive


def test_pairs_and_multiple_choice_are_compared_with_the_trainers_clipping(tmp_path, capsys):
    """SICK's entailment (pairs, 3 classes) and relatedness (pair regression) from a file of SICK's columns, and
    OpenBookQA's packed candidates, both sides clipping gradients at 1.0 as the Trainer does: a table row each, scored
    by accuracy, Pearson's r and accuracy."""
    import hf_finetune
    from test_hf import tiny

    tiny("bert", tmp_path / "model", masked_lm=False)
    rng = random.Random(0)
    lines = ["pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tSemEval_set"]
    for i in range(96):
        row = scored_pair(rng)
        label, split = ["ENTAILMENT", "NEUTRAL", "CONTRADICTION"][i % 3], "TRAIN" if i < 64 else "TRIAL"
        lines.append(f"{i}\t{row['text']}\t{row['pair']}\t{label}\t{row['score']:.2f}\t{split}")
    (tmp_path / "data" / "sick").mkdir(parents=True)
    (tmp_path / "data" / "sick" / "SICK.txt").write_text("\r\n".join(lines) + "\r\n")  # SICK's line ends
    (tmp_path / "data" / "openbookqa").mkdir()
    for split in ("train", "dev"):
        quiz = [quiz_question(rng) for _ in range(32)]
        rows = ["ID\tQuestion Stem\tChoices\tComplete Question\tAnswer Key"] + [
            f"{i}\t{q['question']}\t{' '.join(f'({letter}) {c}' for letter, c in zip('ABCD', q['choices']))}\t"
            f"{q['question']}\t{q['answer']}" for i, q in enumerate(quiz) if len(q["choices"]) == 4]
        if split == "train":  # OpenBookQA's own: one question of 5 candidates, its "(D)" given twice
            cells = rows[1].split("\t")
            rows[1] = "\t".join([*cells[:2], cells[2] + " (D) one candidate more", *cells[3:]])
            questions = len(rows) - 1
        (tmp_path / "data" / "openbookqa" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    hf_finetune.main(["--model", str(tmp_path / "model"), "--data", str(tmp_path / "data"), "--task", "sick_entailment",
                      "--task", "sick_relatedness", "--task", "openbookqa", "--max-batches", "2", "--batch-size", "8",
                      "--max-length", "32", "--clip", "1.0", "--root", str(tmp_path / "runs"),
                      "--ledger", str(tmp_path / "ledger.jsonl")])
    out = capsys.readouterr().out
    assert "gradients clipped at 1.0" in out
    # transformers' model reads a fixed number of candidates: the question of 5 is left out of its side, said
    assert f"transformers' side: 1 of {questions} questions left out, having other than 4 candidates" in out
    # both sides count the same examples an epoch (a question once, not each of its candidates): the speed-up's unit
    examples = {(r["task"], r["side"]): r["result"][2]
                for r in map(json.loads, (tmp_path / "ledger.jsonl").read_text().splitlines())}
    assert examples[("openbookqa", "trunk")] == examples[("openbookqa", "hf")] == 2 * 8
    assert examples[("sick_entailment", "trunk")] == examples[("sick_entailment", "hf")] == 2 * 8
    table = out.split("| task |")[1].splitlines()
    assert [row.split(" | ")[0] for row in table[2:]] == ["| sick_entailment (dev acc)",
                                                         "| sick_relatedness (dev Pearson)", "| openbookqa (dev acc)"]
    for row in table[2:]:
        cells = row.strip("|").split("|")
        assert -1.0 <= float(cells[2]) <= 1.0 and -1.0 <= float(cells[3]) <= 1.0


def test_extractive_qa_is_compared_on_the_questions_the_recipe_holds_out(tmp_path, capsys):
    """XQuAD's one file: both sides hold out the same fifth of the articles (Trunk's split_off), transformers' side
    in run_qa_no_trainer.py's windows, each scored by SQuAD's F1."""
    import json

    import hf_finetune
    from test_hf import tiny

    tiny("bert", tmp_path / "model", masked_lm=False, max_position_embeddings=256)
    rng = random.Random(0)
    (tmp_path / "data" / "xquad_en").mkdir(parents=True)
    (tmp_path / "data" / "xquad_en" / "xquad.en.json").write_text(
        json.dumps({"data": [squad_article(rng, n_paragraphs=2) for _ in range(10)]}))
    dev, _ = hf_finetune.read_xquad(tmp_path / "data" / "xquad_en" / "xquad.en.json", "dev")
    train, _ = hf_finetune.read_xquad(tmp_path / "data" / "xquad_en" / "xquad.en.json", "train")
    assert dev and train and not {r["title"] for r in dev} & {r["title"] for r in train}  # whole articles held out
    hf_finetune.main(["--model", str(tmp_path / "model"), "--data", str(tmp_path / "data"), "--task", "xquad",
                      "--max-batches", "2", "--batch-size", "8", "--max-length", "160", "--root", str(tmp_path / "r")])
    row = capsys.readouterr().out.split("| task |")[1].splitlines()[2]
    cells = row.strip("|").split("|")
    assert cells[0].strip() == "xquad (held-out F1)" and 0.0 <= float(cells[2]) <= 1.0 and 0.0 <= float(cells[3]) <= 1.0


def test_seeds_give_a_row_each_and_their_mean_and_spread_beside_the_recipes_own_run(tmp_path, capsys):
    import hf_finetune
    from test_hf import tiny

    tiny("bert", tmp_path / "model", masked_lm=False)
    write_sst2(tmp_path / "data")
    hf_finetune.main(["--model", str(tmp_path / "model"), "--data", str(tmp_path / "data"), "--task", "sst2",
                      "--max-batches", "2", "--batch-size", "8", "--max-length", "32", "--seed", "1", "2", "--recipe",
                      "--root", str(tmp_path / "runs")])
    runs, summary = capsys.readouterr().out.split("| task |")[1:]
    rows = [line.strip("|").split("|") for line in runs.strip().splitlines()[2:]]
    assert [int(cells[7]) for cells in rows] == [1, 2] and all(0.0 <= float(cells[8]) <= 1.0 for cells in rows)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [  # each side's own folder (transformers' state)
        "sst2-32-true-seed1", "sst2-32-true-seed1-hf", "sst2-32-true-seed1-recipe", "sst2-32-true-seed2",
        "sst2-32-true-seed2-hf", "sst2-32-true-seed2-recipe"]
    line = summary.strip().splitlines()[2].strip("|").split("|")
    assert line[0].strip() == "sst2 (dev acc)" and line[2].strip() == "2" and "±" in line[3] and "±" in line[5]
    assert "±" in line[7]  # the recipe's mean and spread too


def test_a_pooled_task_reads_cls_through_the_pooler_as_transformers_does_whatever_its_recipes_pooling(tmp_path):
    """transformers' sequence classifier reads [CLS] through the pretrained pooler; GoEmotions' recipe mean-pools
    without it. At the Trainer's settings Trunk's side is the same model (pooling cls, the pooler on); the recipe column
    keeps the recipe's own."""
    import hf_finetune
    import torch
    from test_hf import tiny

    tiny("bert", tmp_path / "model", masked_lm=False)
    rng = random.Random(0)
    (tmp_path / "data" / "goemotions").mkdir(parents=True)
    for split in ("train", "dev"):
        rows = [f"{scored_pair(rng)['text']}\t{','.join(map(str, rng.sample(range(28), rng.choice([1, 2]))))}\tid{i}"
                for i in range(24)]
        (tmp_path / "data" / "goemotions" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    hf_finetune.main(["--model", str(tmp_path / "model"), "--data", str(tmp_path / "data"), "--task", "goemotions",
                      "--max-batches", "1", "--batch-size", "8", "--max-length", "32", "--recipe",
                      "--root", str(tmp_path / "runs")])
    poolings = {}
    for side in ("goemotions-32-true-seed42", "goemotions-32-true-seed42-recipe"):
        checkpoint, = (tmp_path / "runs" / side).rglob("last.ckpt")
        tasks = torch.load(checkpoint, weights_only=False)["hyper_parameters"]["tasks"]
        chosen = tasks["goemotions"]["init_args"]
        poolings[side] = chosen["pooling"], chosen["pooler"]
    assert poolings == {"goemotions-32-true-seed42": ("cls", True), "goemotions-32-true-seed42-recipe": ("mean", False)}


TRAINER_PLAN = """
import json, sys, transformers
model = transformers.BertForSequenceClassification.from_pretrained(sys.argv[1], num_labels=2)
warmup = {"warmup_steps": 0.1} if "warmup_ratio" not in transformers.TrainingArguments.__dataclass_fields__ else {
    "warmup_ratio": 0.1}  # transformers 5 reads a warmup below 1 as a fraction of the steps
arguments = transformers.TrainingArguments(
    output_dir=sys.argv[2], learning_rate=5e-5, weight_decay=0.01, num_train_epochs=3, per_device_train_batch_size=32,
    lr_scheduler_type="linear", report_to=[], use_cpu=True, **warmup)
trainer = transformers.Trainer(model=model, args=arguments)
trainer.create_optimizer_and_scheduler(num_training_steps=345)
names = {id(p): n for n, p in model.named_parameters()}
groups = sorted([g["weight_decay"], sorted(names[id(p)] for p in g["params"])] for g in trainer.optimizer.param_groups)
lrs = []
for _ in range(345):
    lrs.append(trainer.lr_scheduler.get_last_lr()[0])
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
defaults = {k: trainer.optimizer.defaults[k] for k in ("betas", "eps", "amsgrad")}
print(json.dumps({"groups": groups, "lrs": lrs, "defaults": defaults, "max_grad_norm": arguments.max_grad_norm}))
"""


def test_the_transformers_side_optimises_as_the_installed_trainer_does(tmp_path):
    """The transformers side is the plain loop of transformers' examples; its optimiser and schedule are the installed
    Trainer's: the same weight-decay groups, AdamW settings and learning rate at every step of a 345-step run (the
    paraphrase set's 3 epochs of 32). The Trainer runs in a process of its own, where benchmarks/peft.py (the PEFT
    benchmark) cannot pass for the peft package it imports."""
    pytest.importorskip("accelerate")  # the Trainer's own dependency
    import json
    import subprocess

    import hf_finetune
    import transformers
    from test_hf import tiny

    tiny("bert", tmp_path / "model", masked_lm=False)
    (tmp_path / "plan.py").write_text(TRAINER_PLAN)
    done = subprocess.run([sys.executable, "plan.py", str(tmp_path / "model"), str(tmp_path / "trainer")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    trainer = json.loads(done.stdout.strip().splitlines()[-1])

    model = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "model", num_labels=2)
    optimizer, schedule = hf_finetune.hf_optimizer(model, 5e-5, 345)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted([g["weight_decay"], sorted(names[id(p)] for p in g["params"])]
                  for g in optimizer.param_groups) == trainer["groups"]
    assert {k: list(v) if isinstance(v, tuple) else v for k, v in optimizer.defaults.items()
            if k in trainer["defaults"]} == trainer["defaults"]
    lrs = []
    for _ in range(345):
        lrs.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    assert lrs == pytest.approx(trainer["lrs"], abs=1e-12)
    assert trainer["max_grad_norm"] == 1.0  # what --clip 1.0 gives both sides
