"""The benchmark scripts' own logic: the FLOP count the MFU column rests on, and the figure script."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO

BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


def test_the_flop_count_counts_real_tokens_only():
    import throughput

    ids = torch.ones(2, 10, dtype=torch.long)
    full = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    half = {"input_ids": ids, "attention_mask": torch.cat([torch.ones(2, 5), torch.zeros(2, 5)], 1).long()}
    short = {"input_ids": ids[:, :5], "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    assert throughput.model_flops(half, train=True) == throughput.model_flops(short, train=True)  # padding is not work
    assert throughput.model_flops(half, train=True) < throughput.model_flops(full, train=True)
    assert throughput.model_flops(full, train=True) == 3 * throughput.model_flops(full, train=False)
    W, D, F = throughput.WIDTH, throughput.DEPTH, throughput.FFN
    assert throughput.model_flops(short, train=False) == 10 * 2 * D * (4 * W * W + 2 * W * F) + 2 * 25 * D * 4 * W


def test_the_figure_script_draws_the_throughput_table(tmp_path):
    pytest.importorskip("matplotlib")
    table = tmp_path / "throughput.md"
    table.write_text(
        "machine: test\n| row | mode | precision | Trunk (ms) | HF model | HF (ms) | ratio HF / Trunk | Trunk "
        "throughput | Trunk MFU |\n|---|---|---|---|---|---|---|---|---|\n| roofline: torch.mm 2048^3 | | fp32 | | | "
        "| | 177 GFLOP/s | |\n| masked-LM | training | fp32 | 700 | BertForMaskedLM | 1400 | 2.00 | 5,000 tokens/s | "
        "60% |\n| masked-LM | training | bf16 | 400 | BertForMaskedLM, decoder at masked positions only | 500 | 1.25 "
        "| 9,000 tokens/s | 50% |\n"
    )
    out = tmp_path / "figure.png"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "plot.py"), "throughput", str(table), str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size < 200_000
    (tmp_path / "empty.md").write_text("no table here\n")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "plot.py"), "throughput", str(tmp_path / "empty.md"), str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "holds no markdown table" in done.stderr


def test_the_gpu_estimate_counts_flops_as_the_measured_benchmark_does():
    import gpu_estimate
    import throughput

    ids = torch.ones(2, 20, dtype=torch.long)
    labels = torch.full((2, 20), -100)
    labels[:, :3] = 1  # 15% of the tokens masked, the estimate's rate
    batch = {"task": "mlm", "input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    model = gpu_estimate.Model("test", throughput.WIDTH, throughput.DEPTH, throughput.FFN, throughput.VOCAB, length=20)
    assert 40 * model.training_flops_per_token() == pytest.approx(throughput.model_flops(batch, train=True))
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_estimate.py")], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.count("\n| ") == 4, done.stderr  # header + 3 models


def test_the_figure_script_draws_learning_curves_from_csv_logs(tmp_path):
    pytest.importorskip("matplotlib")
    import csv

    logs = []
    for name, slope in (("a", 1.0), ("b", 0.5)):
        path = tmp_path / name / "metrics.csv"
        path.parent.mkdir()
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, ["epoch", "step", "train/loss", "val/t/acc"])
            writer.writeheader()
            for step in range(1, 21):  # the CSV logger's layout: each row holds some of the columns
                writer.writerow({"epoch": step // 10, "step": step, "train/loss": 2 - slope * step / 20})
                if step % 10 == 0:
                    writer.writerow({"epoch": step // 10, "step": step, "val/t/acc": slope * step / 20})
        logs.append(f"{name}={path}")
    out = tmp_path / "curves.png"
    run = [
        sys.executable,
        str(BENCHMARKS / "plot.py"),
        "curves",
        str(out),
        "--run",
        logs[0],
        "--run",
        logs[1],
        "--metric",
        "train/loss",
    ]
    done = subprocess.run([*run, "val/t/acc"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size < 200_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = subprocess.run([*run, "val/other/f1"], capture_output=True, text=True)
    assert missing.returncode != 0 and "no run logged 'val/other/f1'" in missing.stderr


def test_the_baselines_script_scores_every_kind_it_knows_from_a_recipe(
    sentiment_files, scores_files, topics_files, quiz_files, squad_files, ner_files, tmp_path
):
    import yaml

    def task(data_class: str, files: dict, **options) -> dict:
        return {
            "class_path": f"trunk.datamodules.{data_class}",
            "init_args": {"train": str(files["train"]), "test": str(files["test"]), **options},
        }

    recipe = {
        "model": {
            "tasks": {"topics": {"class_path": "trunk.tasks.MultiLabelClassification", "init_args": {"threshold": 0.4}}}
        },
        "data": {
            "tasks": {
                "sentiment": task("TextClassificationData", sentiment_files),
                "sim": task("TextRegressionData", scores_files, text_pair_column="pair", label_column="score"),
                "topics": task("MultiLabelTextData", topics_files),
                "quiz": task("MultipleChoiceData", quiz_files),
                "qa": task("QuestionAnsweringData", squad_files),
                "ner": task("TokenClassificationData", ner_files),
            }
        },
    }
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(recipe))
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "baselines.py"), "--config", str(config)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = {
        line.split(" | ")[0].lstrip("| "): line
        for line in out.splitlines()
        if line.startswith("| ") and "---" not in line
    }
    accuracy = {name: float(rows[name].split(" | ")[1]) for name in ("TF-IDF + logistic regression", "majority class")}
    assert accuracy["TF-IDF + logistic regression"] > accuracy["majority class"] + 0.05
    assert "TF-IDF + logistic regression per label (threshold 0.4)" in rows and "TF-IDF cosine of the two texts" in rows
    assert any(name.startswith("most common answer position") for name in rows)
    # templated contexts: each fact is its own sentence, so the closest sentence less the question's words is often the
    # answer
    # generated names and places from short lists: both taggers find them (entity F1, not word accuracy)
    ner = {
        name: float(rows[name].split(" | ")[1])
        for name in ("logistic regression on word features", "each word's most common training tag")
    }
    assert min(ner.values()) > 0.8
    qa = {name: float(rows[name].split(" | ")[2].rstrip(" |")) for name in rows if "closest to the question" in name}
    assert qa["the sentence, less the question's words, closest to the question (TF-IDF cosine)"] > qa[
        "the sentence closest to the question (TF-IDF cosine)"] > 0


def review_files(directory, sizes: dict[str, int]) -> dict:
    """Generated reviews (csv: text, label) whose label one word gives away, one file per split."""
    import random

    from conftest import write_rows

    rng = random.Random(0)
    words = {"positive": ["good", "great", "fine", "superb"], "negative": ["bad", "awful", "dull", "poor"]}

    def rows(n: int) -> list[dict]:
        return [{"text": f"the {rng.choice(['film', 'play', 'book'])} was {rng.choice(words[label])}", "label": label}
                for label in rng.choices(list(words), k=n)]

    return {split: write_rows(directory / f"{split}.csv", rows(n)) for split, n in sizes.items()}


def test_the_small_data_benchmark_runs_variants_over_seeds_beside_the_baseline(tmp_path):
    import yaml

    files = review_files(tmp_path, {"train": 200, "test": 60})

    recipe = {
        "model": {
            "tasks": {
                "reviews": {"class_path": "trunk.tasks.SequenceClassification", "init_args": {"pooling": "mean"}}
            },
            "trunk": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64, "max_len": 64},
            "optimizer": {"lr": 3e-3},
        },
        "data": {
            "tasks": {
                "reviews": {
                    "class_path": "trunk.datamodules.TextClassificationData",
                    "init_args": {
                        "train": str(files["train"]),
                        "test": str(files["test"]),
                        "val_fraction": 0.2,
                        "max_length": 64,
                        "batch_size": 16,
                    },
                }
            },
            "tokenizer_vocab_size": 300,
        },
        "trainer": {
            "max_epochs": 8,
            "accelerator": "cpu",
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"monitor": "val/score", "mode": "max"},
                }
            ],
        },
    }
    config = tmp_path / "reviews.yaml"
    config.write_text(yaml.safe_dump(recipe))
    command = [sys.executable, str(BENCHMARKS / "small_data.py"), "--recipe", str(config), "--seeds", "0", "1",
               "--variant", "eight=", "--variant", "one=--trainer.max_epochs=1", "--root", str(tmp_path / "runs")]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line.split(" | ")[1]: line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| reviews")
    }
    assert set(rows) == {"baseline: TF-IDF + logistic regression", "eight", "one"}
    mean, spread = (float(x) for x in rows["eight"][2].split(" ± "))
    seeds = [float(x) for x in rows["eight"][3].split()]
    assert len(seeds) == 2 and abs(mean - sum(seeds) / 2) < 1e-3 and mean > 0.9  # learned, and the mean is of the seeds
    # epochs: the variant's arguments applied
    assert (rows["one"][5].strip(" |") == "1" and rows["eight"][5].strip(" |") == "8")
    assert sorted(p.name for p in (tmp_path / "runs" / "reviews" / "eight").iterdir()) == ["seed0", "seed1"]
    # run again (as after a stop): the finished runs are read from results.jsonl, none is trained again
    assert len((tmp_path / "runs" / "results.jsonl").read_text().splitlines()) == 4
    again = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [line for line in again.stdout.splitlines() if line.startswith("| reviews")] == \
        [line for line in done.stdout.splitlines() if line.startswith("| reviews")]
    assert (
        not list((tmp_path / "runs").rglob("version_1"))
        and len((tmp_path / "runs" / "results.jsonl").read_text().splitlines()) == 4
    )


def test_the_pretraining_variants_benchmark_reads_each_trunk_at_every_length_and_resumes(tmp_path):
    import random

    import yaml

    from trunk.datamodules.builtin import sentiment_example

    rng = random.Random(0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentiment_example(rng)["text"] for _ in range(600)) + "\n")
    recipe = {
        "model": {
            "tasks": {"mlm": {"class_path": "trunk.tasks.MaskedLanguageModeling"}},
            "trunk": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64, "max_len": 32},
        },
        "data": {
            "tasks": {
                "mlm": {
                    "class_path": "trunk.datamodules.CorpusData",
                    "init_args": {"train": str(corpus), "val_fraction": 0.1, "max_length": 16, "batch_size": 16},
                }
            },
            "tokenizer_vocab_size": 200,
        },
        "trainer": {"max_steps": 6, "accelerator": "cpu"},
    }
    config = tmp_path / "pretrain.yaml"
    config.write_text(yaml.safe_dump(recipe))
    command = [
        sys.executable,
        str(BENCHMARKS / "pretraining_variants.py"),
        "--recipe",
        str(config),
        "--lengths",
        "16",
        "32",
        "--variant",
        "learned=--model.trunk.positions=learned",
        "--variant",
        "alibi=--model.trunk.positions=alibi",
        "--common=--seed_everything=0",
        "--root",
        str(tmp_path / "runs"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ")
        for line in done.stdout.splitlines()
        if line.startswith("| ") and "---" not in line
    }
    assert set(rows) == {"variant", "learned", "alibi"} and rows["variant"][1:3] == ["ppl @ 16", "ppl @ 32"]
    for name in ("learned", "alibi"):
        # 6 steps, a perplexity per length
        assert (all(1 < float(rows[name][i]) < 1000 for i in (1, 2)) and rows[name][3] == "6")
    assert rows["learned"][1:3] != rows["alibi"][1:3]
    lines = (tmp_path / "runs" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 6  # 2 trainings, 4 evaluations
    again = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert again.returncode == 0 and again.stdout.splitlines()[-3:] == done.stdout.splitlines()[-3:]
    # nothing trained or evaluated again:
    assert (len((tmp_path / "runs" / "results.jsonl").read_text().splitlines()) == 6)
    assert (
        not list((tmp_path / "runs").glob("*/lightning_logs/version_1"))
        and len(list((tmp_path / "runs").rglob("validate/version_*"))) == 4
    )


def test_the_inference_benchmark_reads_the_sentences_as_the_data_ship_them(tmp_path):
    import inference

    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "dev.tsv").write_text(
        "sentence\tlabel\nit 's a charming , often affecting journey . \t1\nunflinchingly bleak\t0\n"
    )
    (tmp_path / "conll2003").mkdir()
    (tmp_path / "conll2003" / "test.txt").write_text(
        "-DOCSTART- -X- -X- O\n\nSOCCER NN B-NP O\n- : O O\nJAPAN NNP B-NP B-LOC\n\nNadim NNP B-NP B-PER\nLadki NNP "
        "I-NP I-PER\n"
    )
    assert inference.sst2_sentences(tmp_path) == [
        "it 's a charming , often affecting journey . ",
        "unflinchingly bleak",
    ]
    assert inference.conll_sentences(tmp_path) == [["SOCCER", "-", "JAPAN"], ["Nadim", "Ladki"]]


def test_the_peft_benchmark_trains_each_method_from_one_trunk_and_composes_a_new_task(tmp_path):
    import yaml

    from trunk.cli import export_main, run_cli

    files = review_files(tmp_path, {"train": 120, "test": 40})
    base = run_cli(
        [
            "fit",
            "--model.tasks.base=trunk.tasks.SequenceClassification",
            "--data.tasks.base=trunk.datamodules.TextClassificationData",
            f"--data.tasks.base.train={files['train']}",
            "--data.tasks.base.max_length=32",
            "--model.trunk.d_model=32",
            "--model.trunk.n_layers=2",
            "--model.trunk.n_heads=2",
            "--model.trunk.d_ff=64",
            "--model.trunk.max_len=32",
            "--data.tokenizer_vocab_size=200",
            "--trainer.max_steps=2",
            "--trainer.accelerator=cpu",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path / 'base'}",
        ]
    )
    export_main([base.trainer.checkpoint_callback.last_model_path or base.trainer.checkpoint_callback.best_model_path,
                 str(tmp_path / "trunk"), "--trunk-only"])
    recipes = []
    for task in ("reviews", "moods"):
        recipe = {
            "model": {"tasks": {task: {"class_path": "trunk.tasks.SequenceClassification"}}},
            "data": {
                "tasks": {
                    task: {
                        "class_path": "trunk.datamodules.TextClassificationData",
                        "init_args": {
                            "train": str(files["train"]),
                            "test": str(files["test"]),
                            "val_fraction": 0.2,
                            "max_length": 32,
                            "batch_size": 16,
                        },
                    }
                }
            },
            "trainer": {
                "max_epochs": 1,
                "accelerator": "cpu",
                "callbacks": [
                    {
                        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                        "init_args": {"monitor": "val/score", "mode": "max"},
                    }
                ],
            },
        }
        recipes += ["--recipe", str(tmp_path / f"{task}.yaml")]
        (tmp_path / f"{task}.yaml").write_text(yaml.safe_dump(recipe))
    command = [
        sys.executable,
        str(BENCHMARKS / "peft.py"),
        *recipes,
        "--trunk",
        str(tmp_path / "trunk"),
        "--method",
        "lora",
        "--method",
        "full",
        "--method",
        "lora-small",
        "--compose",
        "moods=reviews",
        "--root",
        str(tmp_path / "runs"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    table = {
        tuple(cell.strip() for cell in line.split("|")[1:3]): line.split("|")
        for line in done.stdout.splitlines()
        if line.startswith("| ")
    }
    assert set(table) == {
        ("recipe", "method"),
        ("reviews", "lora"),
        ("moods", "lora"),
        ("moods", "lora composed of reviews"),
        ("reviews", "full"),
        ("moods", "full"),
        ("reviews", "lora-small"),
        ("moods", "lora-small"),
    }
    config = yaml.safe_load(next((tmp_path / "runs" / "reviews" / "lora-small").rglob("config.yaml")).read_text())
    assert config["model"]["tasks"]["reviews"]["init_args"]["pooler"] is False  # the head without its pooler
    assert config["model"]["peft"]["reviews"]["norms"] is True
    assert float(table[("reviews", "full")][3].split("(")[1].rstrip("%) ")) == 100  # every weight trains
    lora = table[("reviews", "lora")]
    assert 0 < float(lora[3].split("(")[1].rstrip("%) ")) < 100  # a share of the model trains
    # a task file, smaller than the trunk; a score
    assert (float(lora[4].split("(")[1].rstrip("%) ")) < 100 and 0 <= float(lora[7]) <= 1)
    # every run is on record: none runs
    again = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert again.returncode == 0 and " ... " not in again.stderr and again.stdout == done.stdout


def test_a_killed_transfer_run_goes_on_from_its_last_checkpoint(tiny_trunk_dir, sentiment_files, tmp_path):
    """A run killed midway (SIGKILL, as a session's end does) is resumed by the next benchmark from its last checkpoint:
    the same steps and test score as a run never stopped, and the minutes count the stopped attempt's training. A
    joint run killed in its MT-DNN stages goes on from its own last checkpoint, not a stage's."""
    import os

    import yaml

    from trunk.core.checkpoint import load_checkpoint

    (tmp_path / "killer.py").write_text(
        "import os, signal, time\nfrom pathlib import Path\nfrom lightning.pytorch.callbacks import Callback\n\n\n"
        "class KillOnce(Callback):\n"
        "    def __init__(self, at_step: int, marker: str, folder: str = '', slow_in: str = ''):\n"
        "        # folder: kill only in a run of that name; slow_in: in a run under it, a step takes 0.25 s more\n"
        "        self.at_step, self.marker, self.folder, self.slow_in = at_step, Path(marker), folder, slow_in\n\n"
        "    def on_train_start(self, trainer, *args):  # where each attempt starts\n"
        "        with (self.marker.parent / 'starts').open('a') as f:\n"
        "            f.write(f'{trainer.global_step}\\n')\n\n"
        "    def on_train_batch_end(self, trainer, *args):\n"
        "        if self.slow_in and self.slow_in in trainer.default_root_dir:\n"
        "            time.sleep(0.25)\n"
        "        if (trainer.global_step >= self.at_step and not self.marker.exists()\n"
        "                and Path(trainer.default_root_dir).name.endswith(self.folder)):\n"
        "            self.marker.touch()\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n")
    data = {"class_path": "trunk.datamodules.TextClassificationData",
            "init_args": {**{split: str(sentiment_files[split]) for split in ("train", "validation", "test")},
                          "max_length": 64, "batch_size": 8}}  # 32 steps an epoch

    def recipe(tasks: list[str], killer: dict) -> str:
        config = {"model": {"init_from": str(tiny_trunk_dir), "optimizer": {"lr": 3e-3},
                            "tasks": {task: {"class_path": "trunk.tasks.SequenceClassification"} for task in tasks}},
                  "data": {"tasks": dict.fromkeys(tasks, data)},
                  "trainer": {"max_epochs": 2, "accelerator": "cpu", "logger": False, "callbacks": [
                      {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                       "init_args": {"monitor": "val/score", "mode": "max", "save_last": True}},
                      {"class_path": "killer.KillOnce", "init_args": killer}]}}
        (path := tmp_path / f"{'_'.join(tasks)}.yaml").write_text(yaml.safe_dump(config))
        return str(path)

    # the unstopped run's training takes seconds more than its setup and test, which its minutes must not count twice
    alone = recipe(["mood"], {"at_step": 45, "marker": str(tmp_path / "killed"), "slow_in": "unstopped"})
    joint = recipe(["mood", "tone"], {"at_step": 5, "marker": str(tmp_path / "killed_in_stage"), "folder": "tone"})
    base = str(tiny_trunk_dir)
    groups = {"one": {"recipe": alone, "small": [], "base": base, "alone": {"mood": alone}},
              "two": {"recipe": joint, "small": [], "base": base, "alone": {"mood": alone, "tone": alone}}}
    (tmp_path / "groups.yaml").write_text(yaml.safe_dump(groups))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    def benchmark(root: str, group: str = "one", way: str = "alone") -> subprocess.CompletedProcess:
        command = [str(BENCHMARKS / "transfer.py"), "--groups", str(tmp_path / "groups.yaml"), "--group", group]
        command += ["--seeds", "0", "--ways", way, "--finetune-epochs", "1", "--root", str(tmp_path / root)]
        return subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=600, env=environment)

    killed = benchmark("runs")
    assert killed.returncode == -9, killed.stderr[-3000:]  # killed at step 45, in the second epoch
    assert not (tmp_path / "runs" / "results.jsonl").exists()
    last = next((tmp_path / "runs").rglob("last.ckpt"))
    saved = load_checkpoint(last)
    assert saved["global_step"] == 32  # the first epoch's end
    trained = saved["callbacks"]["Timer"]["time_elapsed"]["train"]
    began = time.monotonic()
    resumed = benchmark("runs")
    resumed_seconds = time.monotonic() - began
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resuming the stopped run in {last.parent.parent}" in resumed.stderr
    assert f"Resuming from {last}" in resumed.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "runs" / "results.jsonl").read_text().splitlines()]
    assert (tmp_path / "starts").read_text().split() == ["0", "32"]  # the second attempt trained the second epoch
    began = time.monotonic()
    whole = benchmark("unstopped")  # the marker is there: this one is never killed
    whole_seconds = time.monotonic() - began
    assert whole.returncode == 0, whole.stderr[-3000:]
    (unstopped,) = [json.loads(line) for line in (tmp_path / "unstopped" / "results.jsonl").read_text().splitlines()]
    assert record["steps"] == unstopped["steps"] == 64
    assert record["scores"]["mood"] == pytest.approx(unstopped["scores"]["mood"], abs=1e-6)
    assert record["minutes"] * 60 > trained > 0
    # no more than the time that passed: the stopped attempt's training and the resumed process; and not the best
    # checkpoint's training time again (testing it loads that checkpoint's elapsed time into the run's Timer)
    assert record["minutes"] * 60 <= trained + resumed_seconds and unstopped["minutes"] * 60 <= whole_seconds
    timed = [load_checkpoint(path)["callbacks"]["Timer"]["time_elapsed"]["train"]
             for path in (next((tmp_path / "unstopped").rglob("last.ckpt")), unstopped["checkpoint"])]
    assert timed[0] <= unstopped["minutes"] * 60 < sum(timed)  # its training and setup and test; not the best's again
    # the joint run trains, its first task's stage too; killed in the second's: the joint run is not trained again
    starts = len((tmp_path / "starts").read_text().split())
    killed = benchmark("joint", "two", "joint")
    assert killed.returncode == -9 and (tmp_path / "joint" / "two" / "joint" / "seed0" / "tone").is_dir()
    resumed = benchmark("joint", "two", "joint")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    seed = tmp_path / "joint" / "two" / "joint" / "seed0"
    assert f"Resuming the stopped run in {seed}" in resumed.stderr
    assert f"Resuming from {seed / 'checkpoints' / 'last.ckpt'}" in resumed.stderr  # the joint run's, not a stage's
    # the joint run and its 2 stages; the joint run again at its end, training nothing (Lightning starts its train
    # loop at step 128 or, where last.ckpt counts the last epoch as ended, skips it: no start), the 2 stages again
    assert (tmp_path / "starts").read_text().split()[starts:] in (["0", "0", "0", "128", "0", "0"],
                                                                  ["0", "0", "0", "0", "0"]), resumed.stderr[-3000:]
    ways = {r["way"]: r for r in map(json.loads, (tmp_path / "joint" / "results.jsonl").read_text().splitlines())}
    assert (ways["joint"]["steps"], ways["mtdnn"]["steps"]) == (128, 128 + 2 * 32)  # 2 epochs of 2 tasks; 1 each


def test_the_transfer_summary_of_a_group_without_small_tasks_has_its_large_tasks_change(tmp_path):
    """A group whose tasks are all large (sentiment's SST-2 and GoEmotions) picks no best way for small tasks; its row
    has the large tasks' worst change by sharing a trunk, and its table each way's compute. A run recorded by an older
    version of Trunk (no ``trunk_version``: 1) is not read."""
    import yaml
    from ledger import TRUNK_VERSION

    groups = {"pair": {"recipe": "pair.yaml", "small": [], "base": "base", "alone": {"a": "a.yaml", "b": "b.yaml"}}}
    (tmp_path / "groups.yaml").write_text(yaml.safe_dump(groups))
    older = [{"group": "pair", "way": "joint", "seed": 1, "scores": {"a": 0.10, "b": 0.52}, "steps": 220, "minutes": 2}]
    records = [{"group": "pair", "way": "alone", "task": task, "seed": seed, "scores": {task: score},
                "steps": 100, "minutes": 1.0} for seed in (1, 2) for task, score in (("a", 0.80), ("b", 0.50))]
    records += [{"group": "pair", "way": way, "seed": seed, "scores": {"a": 0.79 + extra, "b": 0.52}, "steps": steps,
                 "minutes": steps / 100} for seed in (1, 2) for way, steps, extra in (("joint", 220, 0),
                                                                                     ("mtdnn", 320, 0.02))]
    records = older + [{**r, "trunk_version": TRUNK_VERSION} for r in records]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run([sys.executable, str(BENCHMARKS / "transfer.py"), "--groups", str(tmp_path / "groups.yaml"),
                           "--summary", "--seeds", "1", "2", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| pair |")).split(" | ")
    assert row[1:4] == ["–", "–", "–"]  # no small task: no best way, nor its gain
    assert row[4] == "-1.00 (a, joint)"  # a lost a point jointly; mtdnn gained, b gained in both
    assert "Average gain of the small tasks" not in done.stdout
    compute = {line.split(" | ")[0].strip("| "): line.split(" | ")[1] for line in done.stdout.splitlines()
               if line.startswith(("| alone |", "| joint |", "| mtdnn |"))}
    assert compute == {"alone": "200", "joint": "220", "mtdnn": "320"}  # alone: both tasks' runs of a seed
    refused = subprocess.run([sys.executable, str(BENCHMARKS / "transfer.py"), "--groups",
                              str(tmp_path / "groups.yaml"), "--group", "pair", "--trunk-version", "1", "--root",
                              str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and f"this code computes version {TRUNK_VERSION}" in refused.stderr


def test_a_ledger_of_one_trunk_version_reads_and_stamps_that_version_alone(tmp_path):
    """A record written before versions is of version 1; a ledger of version 2 neither finds nor lists it (unless asked
    for any version: a result Trunk does not compute), and stamps what it adds."""
    from ledger import Ledger

    path = tmp_path / "ledger.jsonl"
    path.write_text(json.dumps({"seed": 1, "score": 0.1}) + "\n")
    now = Ledger(path, 2)
    assert now.find({"seed": 1}) is None and now.find({"seed": 1}, any_version=True)["score"] == 0.1
    now.add({"seed": 1, "score": 0.2})
    assert json.loads(path.read_text().splitlines()[1]) == {"seed": 1, "score": 0.2, "trunk_version": 2}
    assert [r["score"] for r in Ledger(path, 1).records()] == [0.1]
    assert [r["score"] for r in Ledger(path, 2).records()] == [0.2]
    assert [r["score"] for r in Ledger(path).records()] == [0.1, 0.2]  # no version: every record


def test_a_transfer_ledger_kept_apart_from_its_runs_says_which_checkpoint_is_missing(tmp_path):
    """--ledger: the results of runs whose folders are gone (another machine) still make the tables; a way that starts
    from a recorded run's checkpoint (merged, sequential) says which one is missing and how to train it again."""
    import yaml
    from ledger import TRUNK_VERSION

    groups = {"pair": {"recipe": "pair.yaml", "small": ["b"], "base": "base", "alone": {"a": "a.yaml", "b": "b.yaml"}}}
    (tmp_path / "groups.yaml").write_text(yaml.safe_dump(groups))
    gone = tmp_path / "gone"
    records = [{"group": "pair", "way": "alone", "task": task, "seed": 1, "scores": {task: 0.5}, "steps": 10,
                "minutes": 1.0, "checkpoint": str(gone / f"{task}.ckpt")} for task in ("a", "b")]
    records.append({"group": "pair", "way": "joint", "seed": 1, "scores": {"a": 0.5, "b": 0.53}, "steps": 20,
                    "minutes": 1.0, "checkpoint": str(gone / "joint.ckpt")})
    records = [{**r, "trunk_version": TRUNK_VERSION} for r in records]
    (kept := tmp_path / "kept.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    def benchmark(*args: str) -> subprocess.CompletedProcess:
        command = [str(BENCHMARKS / "transfer.py"), "--groups", str(tmp_path / "groups.yaml"), "--seeds", "1"]
        return subprocess.run([sys.executable, *command, "--ledger", str(kept), "--root", str(tmp_path / "runs"),
                               *args], capture_output=True, text=True, timeout=120)

    summary = benchmark("--summary")
    assert summary.returncode == 0, summary.stderr[-3000:]
    assert "| b (small) | 50.00 | 53.00 | +3.00 |" in summary.stdout
    for way, run in (("merged", "alone run of a"), ("sequential", "alone run of a")):
        refused = benchmark("--group", "pair", "--ways", way)
        assert refused.returncode == 1 and not (tmp_path / "runs").exists()
        assert (f"error: the ledger's {run} (group pair, seed 1) saved its model to {gone / 'a.ckpt'}, which is not "
                "on this machine. Delete that line of the ledger") in refused.stderr
    assert kept.read_text().count("\n") == 3  # nothing recorded


def tiny_group(trunk_dir: Path, sentiment_files: dict, ner_files: dict, folder: Path) -> Path:
    """A groups file of one group, "tiny" (as transfer.py's GROUPS): a classification task and a small NER task from
    ``trunk_dir``, each alone and jointly, one epoch each."""
    import yaml

    def task(kind: str, files: dict) -> tuple[dict, dict]:
        objective = {"class_path": f"trunk.tasks.{kind}"}
        data = {"class_path": "trunk.datamodules." + ("TextClassificationData" if kind == "SequenceClassification"
                                                      else "TokenClassificationData"),
                "init_args": {**{split: str(files[split]) for split in ("train", "validation", "test")},
                              "max_length": 64, "batch_size": 32}}
        return objective, data

    def recipe(tasks: dict, name: str) -> str:
        config = {"model": {"init_from": str(trunk_dir), "tasks": {t: o for t, (o, _) in tasks.items()},
                            "optimizer": {"lr": 3e-3}},
                  "data": {"tasks": {t: d for t, (_, d) in tasks.items()}},
                  "trainer": {"max_epochs": 1, "accelerator": "cpu", "logger": False, "callbacks": [
                      {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                       "init_args": {"monitor": "val/score", "mode": "max"}}]}}
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        return str(path)

    tasks = {"mood": task("SequenceClassification", sentiment_files), "names": task("TokenClassification", ner_files)}
    groups = {"tiny": {"recipe": recipe(tasks, "group"), "small": ["names"], "base": str(trunk_dir),
                       "alone": {name: recipe({name: spec}, name) for name, spec in tasks.items()}}}
    (folder / "groups.yaml").write_text(yaml.safe_dump(groups))
    return folder / "groups.yaml"


def test_the_transfer_benchmark_runs_every_way_over_seeds_and_resumes(tiny_trunk_dir, sentiment_files, ner_files,
                                                                       tmp_path):
    """A group of your own (--groups): each task alone, jointly then each fine-tuned (one command), the alone models
    merged; the table has every task and way, and a second run trains nothing."""
    import yaml

    groups = yaml.safe_load(tiny_group(tiny_trunk_dir, sentiment_files, ner_files, tmp_path).read_text())
    command = [sys.executable, str(BENCHMARKS / "transfer.py"), "--groups", str(tmp_path / "groups.yaml"), "--group",
               "tiny", "--seeds", "0", "1", "--finetune-epochs", "1", "--root", str(tmp_path / "runs")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in done.stdout.splitlines()
            if line.startswith("| ")}
    assert {"mood", "names (small)", "alone", "joint", "mtdnn", "merged"} <= set(rows)
    for cell in rows["names (small)"][1:4]:  # alone, joint, mtdnn: a mean and a spread over the two seeds
        mean, sd = (float(x) for x in cell.strip(" |").split(" ± "))
        assert 0 <= mean <= 100 and sd >= 0
    assert float(rows["mtdnn"][1].replace(",", "")) > float(rows["joint"][1].replace(",", ""))  # its stages' steps too
    ledger = (tmp_path / "runs" / "results.jsonl").read_text().splitlines()
    assert len(ledger) == 2 * (2 + 3)  # per seed: two alone runs, joint, mtdnn, merged
    again = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [line for line in again.stdout.splitlines() if line.startswith("| ")] == \
        [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert (tmp_path / "runs" / "results.jsonl").read_text().splitlines() == ledger
    # another sampler for the joint run and another merge: their ways beside the recipe's, nothing redone
    uniform = subprocess.run([*command, "--ways", "joint", "merged", "--sampling", "uniform", "--merge",
                              "task_arithmetic", "--merge-scale", "0.5", "--seeds", "0"],
                             capture_output=True, text=True, timeout=900)
    assert uniform.returncode == 0, uniform.stderr[-3000:]
    header = next(line for line in uniform.stdout.splitlines() if line.startswith("| task"))
    assert {"joint", "mtdnn", "merged", "joint, uniform", "mtdnn, uniform", "merged, task_arithmetic, scale 0.5"} <= \
        {c.strip() for c in header.split("|")}
    added = (tmp_path / "runs" / "results.jsonl").read_text().splitlines()
    assert added[:len(ledger)] == ledger and len(added) == len(ledger) + 3
    targets = subprocess.run([*command, "--summary"], capture_output=True, text=True, timeout=300)  # trains nothing
    assert targets.returncode == 0, targets.stderr[-3000:]
    row = next(line for line in targets.stdout.splitlines() if line.startswith("| tiny |")).split(" | ")
    assert row[1] in {"joint", "mtdnn", "merged", "joint, uniform", "mtdnn, uniform"} and row[3].startswith("names ")
    assert "Average gain of the small tasks" in targets.stdout
    assert (tmp_path / "runs" / "results.jsonl").read_text().splitlines() == added
    figure = subprocess.run([sys.executable, str(BENCHMARKS / "plot.py"), "transfer", str(tmp_path / "runs" /
                             "results.jsonl"), str(tmp_path / "transfer.png")], capture_output=True, text=True)
    assert figure.returncode == 0, figure.stderr[-2000:]
    assert (tmp_path / "transfer.png").read_bytes()[:4] == b"\x89PNG"
    # each task alone as a LoRA delta, the deltas combined: the combined model scores as the separate ones did
    deltas = subprocess.run([*command, "--ways", "merged", "--merge", "deltas", "--seeds", "0"], capture_output=True,
                            text=True, timeout=900)
    assert deltas.returncode == 0, deltas.stderr[-3000:]
    lines = [line.split(" | ") for line in deltas.stdout.splitlines() if line.startswith("| ")]
    header = [c.strip("| ") for c in lines[0]]
    for row in (r for r in lines if r[0].strip("| ") in {"mood", "names (small)"}):
        assert row[header.index("merged, deltas")] == row[header.index("alone, lora")]
    assert len((tmp_path / "runs" / "results.jsonl").read_text().splitlines()) == len(added) + 3
    targets = subprocess.run([*command, "--summary"], capture_output=True, text=True, timeout=300)
    row = next(line for line in targets.stdout.splitlines() if line.startswith("| tiny |")).split(" | ")
    assert targets.returncode == 0 and row[1] != "alone, lora"  # separate runs are no multi-task way
    # each small task fine-tuned from the large task's alone model, which is the way's model of the large task too
    chained = subprocess.run([*command, "--ways", "sequential", "--seeds", "0"], capture_output=True, text=True,
                             timeout=900)
    assert chained.returncode == 0, chained.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "runs" / "results.jsonl").read_text().splitlines()]
    start = next(r for r in records if (r["way"], r.get("task"), r["seed"]) == ("alone", "mood", 0))
    assert f"model.init_from '{start['checkpoint']}'" in chained.stdout + chained.stderr  # names started from it
    mine = [r for r in records if r["way"] == "sequential"]
    assert sorted(r["task"] for r in mine) == ["mood", "names"] and len(records) == len(added) + 3 + 2
    lines = [line.split(" | ") for line in chained.stdout.splitlines() if line.startswith("| ")]
    header = [c.strip("| ") for c in lines[0]]
    mood = next(r for r in lines if r[0].strip("| ") == "mood")
    names = next(r for r in lines if r[0].strip("| ") == "names (small)")
    assert mood[header.index("sequential - alone")].strip(" |") == "+0.00"  # the same model
    assert 0 <= float(names[header.index("sequential")].split()[0]) <= 100
    # a way still under way (the large task's line on record, the small task's run not yet): the summary says so
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "results.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in records if (r["way"], r.get("task")) != ("sequential", "names")))
    partial = subprocess.run([*command, "--summary", "--root", str(tmp_path / "partial")], capture_output=True,
                             text=True, timeout=300)
    assert partial.returncode == 0, partial.stderr[-3000:]
    assert not any(line.startswith("| sequential |") for line in partial.stdout.splitlines())  # no compute yet
    # a group without one large task to start from: refused before anything trains
    (tmp_path / "smalls.yaml").write_text(yaml.safe_dump({"tiny": {**groups["tiny"], "small": ["mood", "names"]}}))
    refused = subprocess.run([*command, "--groups", str(tmp_path / "smalls.yaml"), "--ways", "sequential"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--ways sequential starts a group's small tasks from its one large task" in \
        refused.stderr


def test_the_distill_benchmark_trains_a_teacher_and_its_students_and_times_them(tiny_trunk_dir, sentiment_files,
                                                                              tmp_path):
    """compress, on a group of your own: the task alone (the teacher), a student of every other block of the trunk with
    and without its teacher, their test scores and their predict speed beside the teacher's; run again, nothing."""
    import yaml

    recipe = {"model": {"init_from": str(tiny_trunk_dir), "optimizer": {"lr": 3e-3},
                        "tasks": {"mood": {"class_path": "trunk.tasks.SequenceClassification"}}},
              "data": {"tasks": {"mood": {"class_path": "trunk.datamodules.TextClassificationData", "init_args": {
                  **{split: str(sentiment_files[split]) for split in ("train", "validation", "test")},
                  "max_length": 64, "batch_size": 32}}}},
              "trainer": {"max_epochs": 1, "accelerator": "cpu", "logger": False, "callbacks": [
                  {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                   "init_args": {"monitor": "val/score", "mode": "max"}}]}}
    (tmp_path / "mood.yaml").write_text(yaml.safe_dump(recipe))
    groups = {"tiny": {"recipe": str(tmp_path / "mood.yaml"), "small": [], "base": str(tiny_trunk_dir),
                       "alone": {"mood": str(tmp_path / "mood.yaml")}}}
    (tmp_path / "groups.yaml").write_text(yaml.safe_dump(groups))
    command = [sys.executable, str(BENCHMARKS / "distill.py"), "compress", "--groups", str(tmp_path / "groups.yaml"),
               "--task", "mood", "--seeds", "0", "--rounds", "1", "--root", str(tmp_path / "runs")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = [json.loads(line) for line in (tmp_path / "runs" / "results.jsonl").read_text().splitlines()]
    assert [r["way"] for r in ledger] == ["alone", "student", "student, kd"]
    assert ledger[2]["teacher_passes"] == ledger[2]["steps"] > 0 and ledger[1]["teacher_passes"] == 0
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| mood |")]
    assert {row[1] for row in rows} == {"alone", "student", "student, kd"}
    speed = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith(("| alone |", "| student"))]
    # bf16 and int8 are timed only where the CPU has units for them (elsewhere tens of times slower than fp32)
    from trunk.training.precision import cpu_bf16_is_native, int8_is_native

    timed = {"fp32", *(["bf16"] if cpu_bf16_is_native()[0] else []), *(["int8"] if int8_is_native()[0] else []),
             *(["int8 + bf16"] if cpu_bf16_is_native()[0] and int8_is_native()[0] else [])}
    assert {(row[0].strip("| "), row[1]) for row in speed} == {(way, weights) for way in ("alone", "student",
                                                                "student, kd") for weights in timed}
    assert timed != {"fp32"} or "predict speed: fp32 only, this CPU" in done.stdout
    assert all(float(row[2].replace(",", "")) > 0 for row in speed)
    again = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "Resuming" not in again.stderr
    assert (tmp_path / "runs" / "results.jsonl").read_text().count("\n") == 3
    # other teachers' settings are a way of their own: run, not found in the ledger as the first student's
    other = subprocess.run([*command, "--alpha", "0.9", "--layers", "0:1"], capture_output=True, text=True, timeout=900)
    assert other.returncode == 0, other.stderr[-3000:]
    ledger = [json.loads(line) for line in (tmp_path / "runs" / "results.jsonl").read_text().splitlines()]
    assert [r["way"] for r in ledger][3:] == ["student, kd, alpha 0.9, layers 0:1, hidden 1, relations 1"]
    assert ledger[3]["teacher_passes"] == ledger[3]["steps"] > 0
    # inputs without labels: a way of its own, whose student takes their batches beside the labelled ones
    texts = [line.split("\t")[0] for line in sentiment_files["train"].read_text().splitlines()[1:]]
    (tmp_path / "more.txt").write_text("\n".join(texts) + "\n")
    more = subprocess.run([*command, "--unlabelled", str(tmp_path / "more.txt")], capture_output=True, text=True,
                          timeout=900)
    assert more.returncode == 0, more.stderr[-3000:]
    ledger = [json.loads(line) for line in (tmp_path / "runs" / "results.jsonl").read_text().splitlines()]
    assert [r["way"] for r in ledger][4:] == ["student, kd, unlabelled more.txt"]
    assert ledger[4]["steps"] > ledger[2]["steps"]
    # the teacher's answers kept after the first epoch: a way of its own, whose teacher passes are that epoch's only
    # (in fp32 whatever the CPU: --precision, which each line records, as the recipe's auto did for the runs above;
    # the student with its teacher alone: --students)
    cached = subprocess.run([*command, "--cache", "--student-epochs", "2", "--precision", "32-true", "--students",
                             "kd"], capture_output=True, text=True, timeout=900,
                            env={**os.environ, "TRUNK_CACHE": str(tmp_path / "cache")})
    assert cached.returncode == 0, cached.stderr[-3000:]
    from trunk.training.precision import choose_precision

    auto = choose_precision("cpu")[0]
    ledger = [json.loads(line) for line in (tmp_path / "runs" / "results.jsonl").read_text().splitlines()]
    assert {r["precision"] for r in ledger[:5]} == {auto}
    # a teacher of another precision is another run (on a CPU with bf16 units, auto's is bf16-mixed)
    taught = ledger[5:] if auto == "32-true" else ledger[6:]
    assert auto == "32-true" or (ledger[5]["way"], ledger[5]["precision"]) == ("alone", "32-true")
    assert [(r["way"], r["epochs"], r["precision"]) for r in taught] == [("student, kd, cached", 2, "32-true")]
    assert taught[0]["steps"] == 2 * ledger[2]["steps"] and taught[0]["teacher_passes"] == ledger[2]["steps"]
    # students of another trunk ("own"), alone: by that trunk's own recipe, then by the teacher's, each a way apart
    (tmp_path / "mood_own.yaml").write_text(yaml.safe_dump({**recipe, "model": {**recipe["model"],
                                                                                "optimizer": {"lr": 1e-3}}}))
    own = [*command, "--student-trunk", str(tiny_trunk_dir), "--starts", "own"]
    for extra in (["--student-recipe", str(tmp_path / "mood_own.yaml")], []):
        done = subprocess.run([*own, *extra], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    ledger = [json.loads(line) for line in (tmp_path / "runs" / "results.jsonl").read_text().splitlines()]
    assert [(r["way"], r["recipe"]) for r in ledger[-4:]] == [
        ("own", str(tmp_path / "mood_own.yaml")), ("own, kd", str(tmp_path / "mood_own.yaml")), ("own", None),
        ("own, kd", None)]
    assert ledger[-3]["teacher_passes"] == ledger[-3]["steps"] > 0 and ledger[-4]["teacher_passes"] == 0
    speed = {line.split(" | ")[0].strip("| ") for line in done.stdout.splitlines() if line.startswith("| own")}
    assert speed == {"own, mood_own", "own, kd, mood_own", "own", "own, kd"}
    refused = subprocess.run([*command, "--starts", "own"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--starts own: the 'own' students start from --student-trunk DIR" in \
        refused.stderr
    # the figure of each student against its teacher, from the same ledger as transfer.py's; a group it lacks named
    plot = [sys.executable, str(BENCHMARKS / "plot.py"), "transfer", str(tmp_path / "runs" / "results.jsonl"),
            str(tmp_path / "distill.png"), "--title", "students"]
    figure = subprocess.run([*plot, "--groups", "tiny"], capture_output=True, text=True)
    assert figure.returncode == 0 and (tmp_path / "distill.png").read_bytes()[:4] == b"\x89PNG", figure.stderr
    figure = subprocess.run([*plot, "--groups", "tiny", "ner"], capture_output=True, text=True)
    assert figure.returncode == 1 and "of the groups ['ner']: its groups of that version are ['tiny']" in figure.stderr


def test_the_distill_benchmark_teaches_a_groups_joint_model_with_its_tasks_alone_models(tiny_trunk_dir,
                                                                                         sentiment_files, ner_files,
                                                                                         tmp_path):
    """groups (MT-DNN-KD), on a group of your own, in one precision whatever the CPU: each task alone (the teachers),
    joint and MT-DNN, and joint with every task learning from its alone model; the targets table; run again, nothing."""
    groups = tiny_group(tiny_trunk_dir, sentiment_files, ner_files, tmp_path)
    command = [sys.executable, str(BENCHMARKS / "distill.py"), "groups", "--groups", str(groups), "--group", "tiny",
               "--seeds", "0", "--precision", "32-true", "--root", str(tmp_path / "runs")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = [json.loads(line) for line in (tmp_path / "runs" / "results.jsonl").read_text().splitlines()]
    assert [(r["way"], r.get("task"), r["precision"]) for r in ledger] == [
        ("alone", "mood", "32-true"), ("alone", "names", "32-true"), ("joint", None, "32-true"),
        ("mtdnn", None, "32-true"), ("joint, kd", None, "32-true")]
    taught = ledger[-1]
    # one task's batch a step, each through that task's teacher; the joint run's steps, the teachers' passes counted
    assert taught["steps"] == ledger[2]["steps"] == taught["teacher_passes"] > 0
    assert set(taught["scores"]) == {"mood", "names"}
    row = next(line for line in done.stdout.splitlines() if line.startswith("| tiny | joint, kd |")).split(" | ")
    assert row[2].endswith(("(mood)", "(names)")) and row[4:6] == ["1.33x", "2.33x"] and row[6].strip(" |") == "1"
    again = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "Resuming" not in again.stderr, again.stderr[-3000:]
    assert len((tmp_path / "runs" / "results.jsonl").read_text().splitlines()) == len(ledger)


def test_the_ledger_figure_draws_one_trunk_version_the_current_by_default(tmp_path):
    """A ledger keeps every version's runs; a figure pairs runs of one (a panel mixing two would compare runs of
    different code): another version's group is not there by default, and is with --trunk-version."""
    from ledger import TRUNK_VERSION

    def run(group: str, way: str, seed: int, score: float, version: int) -> str:
        return json.dumps({"group": group, "way": way, "task": "mood", "seed": seed, "scores": {"mood": score},
                           "steps": 10, "trunk_version": version})

    lines = [run("old", "alone", 1, 0.8, 1), run("old", "joint", 1, 0.9, 1),
             run("new", "alone", 1, 0.8, TRUNK_VERSION), run("new", "joint", 1, 0.7, TRUNK_VERSION)]
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n")
    plot = [sys.executable, str(BENCHMARKS / "plot.py"), "transfer", str(tmp_path / "results.jsonl"),
            str(tmp_path / "figure.png")]
    old = subprocess.run([*plot, "--groups", "old"], capture_output=True, text=True)
    assert old.returncode == 1 and f"no run of Trunk version {TRUNK_VERSION} of the groups ['old']: its groups of " \
        "that version are ['new'] (--trunk-version N draws another's)" in old.stderr, old.stderr
    for args in (["--groups", "new"], ["--groups", "old", "--trunk-version", "1"]):
        drawn = subprocess.run([*plot, *args], capture_output=True, text=True)
        assert drawn.returncode == 0, drawn.stderr
        assert (tmp_path / "figure.png").read_bytes()[:4] == b"\x89PNG"
        (tmp_path / "figure.png").unlink()


def test_the_distill_summary_reads_the_multi_task_targets_paired_by_seed(capsys):
    """Each multi-task way against each task alone of the same seed and precision: its worst task, its small tasks'
    mean gain, its compute in steps of the tasks one by one (a teacher pass a third of a step; then with the
    teachers' training)."""
    from distill import multi_task_targets

    def run(way, seed, sick, entailment, steps, **more):
        return {"group": "sick", "way": way, "seed": seed, "scores": {"sick": sick, "entailment": entailment},
                "steps": steps, **more}

    alone = [{"group": "sick", "way": "alone", "task": task, "seed": seed, "scores": {task: score}, "steps": 800}
             for seed, scores in ((1, {"sick": 0.88, "entailment": 0.86}), (2, {"sick": 0.90, "entailment": 0.84}))
             for task, score in scores.items()]
    # seed 1's tasks alone again in bf16, after the fp32 ones: the fp32 multi-task runs are not read against them
    alone += [{**r, "scores": {r["task"]: 0.5}, "precision": "bf16-mixed"} for r in alone if r["seed"] == 1]
    multi_task_targets([*alone, run("joint, kd", 1, 0.879, 0.87, 1600, teacher_passes=1600),
                        run("joint, kd", 2, 0.899, 0.86, 1600, teacher_passes=1600),
                        run("joint", 1, 0.87, 0.86, 1600), run("joint", 3, 0.99, 0.99, 1600)])  # seed 3: no alone
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| sick")]
    assert rows == ["| sick | joint | -1.00 (sick) | +0.00 | 1.00x |  | 1 |",
                    "| sick | joint, kd | -0.10 (sick) | +1.50 | 1.33x | 2.33x | 2 |"]


def test_the_distill_summary_compares_each_way_with_its_teacher_of_the_same_precision(tmp_path, capsys):
    """A task trained in two precisions (the recipes' ``auto`` differs by CPU): each way shown per precision and read
    against the teacher of its own; a line without the field is fp32 (written before it was recorded)."""
    from distill import summary
    from ledger import TRUNK_VERSION, Ledger

    def run(way, seed, score, precision=None):
        return {"group": "sentiment", "way": way, "task": "sst2", "seed": seed, "scores": {"sst2": score},
                "steps": 10, **({"precision": precision} if precision else {}), "trunk_version": TRUNK_VERSION}

    ledger = tmp_path / "distill.jsonl"
    ledger.write_text("".join(json.dumps(r) + "\n" for r in [
        run("alone", 1, 0.90), run("alone", 2, 0.92, "32-true"), run("student", 1, 0.89), run("student", 2, 0.89),
        run("alone", 1, 0.80, "bf16-mixed"), run("own", 1, 0.75, "bf16-mixed")]))
    summary([1, 2], Ledger(ledger, TRUNK_VERSION))
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| sst2")]
    assert rows == ["| sst2 | alone (32-true) | 91.00 ± 1.41 |  | 10 |",
                    "| sst2 | alone (bf16-mixed) | 80.00 (n=1) |  | 10 |",
                    "| sst2 | own (bf16-mixed) | 75.00 (n=1) | -5.00 | 10 |",
                    "| sst2 | student (32-true) | 89.00 ± 0.00 | -2.00 | 10 |"]


def test_the_distill_benchmark_makes_unlabelled_sentences_from_a_prose_corpus(tmp_path):
    """sentences: a paragraph-per-line corpus (gzipped, titles, blank lines) into sentences of 5-60 words, tokenized
    as CoNLL-2003 is; asked for more than it holds, it says so."""
    import gzip

    corpus = tmp_path / "wiki.txt.gz"
    with gzip.open(corpus, "wt") as out:
        out.write("= Paris =\nParis is the capital of France, on the Seine. Too short here.\n\n"
                  "= Smith =\nJohn Smith's U.S. trip began on 1996-08-22 in New York. He stayed (briefly) in Boston!\n")
    from distill import sentences

    sentences(corpus, 3, tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_text().splitlines() == [
        "Paris is the capital of France , on the Seine .", "John Smith's U.S. trip began on 1996-08-22 in New York .",
        "He stayed ( briefly ) in Boston !"]
    with pytest.raises(SystemExit, match="holds 3 sentences of 5-60 words, fewer than --rows 4"):
        sentences(corpus, 4, tmp_path / "more.txt")


def test_the_tune_benchmark_searches_then_reruns_both_recipes_over_seeds_and_resumes(sentiment_files, tmp_path):
    """A task of your own: a 2-trial search with pruning and one without, the best recipes of both and the shipped one
    trained again with another seed, the summary rows; run again, nothing runs."""
    import yaml

    recipe = {"seed_everything": 0,
              "model": {"tasks": {"mood": {"class_path": "trunk.tasks.SequenceClassification"}},
                        "trunk": {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "max_len": 64}},
              "data": {"tasks": {"mood": {"class_path": "trunk.datamodules.TextClassificationData", "init_args": {
                  **{split: str(sentiment_files[split]) for split in ("train", "validation", "test")},
                  "max_length": 64, "batch_size": 32}}}, "tokenizer_vocab_size": 300},
              "trainer": {"max_epochs": 1, "accelerator": "cpu", "callbacks": [
                  {"class_path": "trunk.training.callbacks.TrunkCheckpoint",
                   "init_args": {"monitor": "val/score", "mode": "max", "save_last": True}}]}}
    (tmp_path / "mood.yaml").write_text(yaml.safe_dump(recipe))
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({"model.optimizer.lr": {"log_uniform": [1e-4, 1e-2]}}))
    command = [sys.executable, str(BENCHMARKS / "tune.py"), "--task", "mood", "--recipe", str(tmp_path / "mood.yaml"),
               "--space", str(tmp_path / "space.yaml"), "--trials", "2", "--seeds", "1", "--unpruned",
               "--root", str(tmp_path / "runs")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = [json.loads(line) for line in (tmp_path / "runs" / "results.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("pruner") or r["recipe"]) for r in ledger] == [
        ("search", "median"), ("rerun", "tuned"), ("rerun", "shipped"), ("search", "none"), ("rerun", "tuned unpruned"),
        ("replay", "median")]
    assert ledger[0]["steps"] > 0 and 0 <= ledger[1]["test"] <= 1 and 0 <= ledger[4]["test"] <= 1
    # two trials are fewer than the median pruner's first 4, which it never stops: the replay saves nothing
    assert ledger[5]["steps"] == ledger[5]["unpruned_steps"] == ledger[3]["steps"] and ledger[5]["stopped"] == []
    row = next(line for line in done.stdout.splitlines() if line.startswith("| mood |"))
    assert " of 2, " in row and "saved)" in row
    assert "mood: the unpruned search's best recipe, test: " in done.stdout
    assert "mood: median pruning replayed over the unpruned search's 2 trials: " in done.stdout
    again = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert again.returncode == 0 and (tmp_path / "runs" / "results.jsonl").read_text().count("\n") == 6
    # a search of its own scoring each trial by 2 seeds' mean: its best recipe rerun; the shipped one's rerun is kept
    from tune import study_in

    seeded = subprocess.run([*command[:-3], "--trial-seeds", "2", *command[-2:]], capture_output=True, text=True,
                            timeout=900, cwd=tmp_path)
    assert seeded.returncode == 0, seeded.stderr[-3000:]
    ledger = [json.loads(line) for line in (tmp_path / "runs" / "results.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("trial_seeds") or r["recipe"]) for r in ledger[6:]] == [("search", 2),
                                                                                      ("rerun", "tuned_seeds2")]
    trials = [t for t in study_in(tmp_path / "runs" / "mood" / "median_seeds2").trials if t.state.name == "COMPLETE"]
    assert trials and all(len(t.user_attrs["scores"]) == 2 for t in trials), [t.user_attrs for t in trials]
    assert "mood: the median search scoring each trial by 2 seeds' mean (best dev " in seeded.stdout
    assert next(line for line in seeded.stdout.splitlines() if line.startswith("| mood |")) == row  # the main row


def test_the_tune_summary_pairs_the_reruns_by_seed_whatever_order_they_ran_in(tmp_path, capsys):
    """Reruns shared between processes land in any order (tuned seed 3 before seed 2): the gain is still tuned minus
    shipped of the same seed, and none is shown while a seed has only one side."""
    from ledger import Ledger
    from tune import summary

    ledger = tmp_path / "tune.jsonl"
    runs = [("shipped", 1, 0.90), ("shipped", 2, 0.80), ("tuned", 1, 0.91), ("tuned", 3, 0.95), ("tuned", 2, 0.83),
            ("shipped", 3, 0.90)]
    lines = [{"task": "sst2", "step": "rerun", "recipe": recipe, "seed": seed, "test": test, "cpu": "cpu"}
             for recipe, seed, test in runs]
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines[:-1]))
    summary(Ledger(ledger), [1, 2, 3])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| sst2 |"))
    assert row.split("|")[4].strip() == "–"  # seed 3's shipped run still to come
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary(Ledger(ledger), [1, 2, 3])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| sst2 |"))
    assert row.split("|")[4].strip() == "+3.00 ± 2.00"  # +1, +3, +5 by seed


def test_the_pruner_replayed_over_unpruned_trials_counts_the_steps_it_saves():
    """``benchmarks/tune.py``'s replay: the tune's median pruner over recorded trials, in their order; a trial far
    behind the first four at its first validation is stopped there, its later steps saved, and where it is the one
    that would have ended best, the replay says that pruning lost it."""
    import optuna
    from tune import replay

    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.NopPruner())
    curves = [[0.5, 0.6, 0.7], [0.55, 0.65, 0.8], [0.5, 0.7, 0.75], [0.6, 0.62, 0.7], [0.1, 0.2, 0.9],
              [0.58, 0.7, 0.85]]
    for curve in curves:  # three validations each, 300 steps in all
        trial = study.ask()
        for point, value in zip((100, 200, 300), curve):
            trial.report(value, point)
        trial.set_user_attr("steps", 300)
        study.tell(trial, max(curve))
    result = replay(study, "median")
    assert result["stopped"] == [4] and result["steps"] == 5 * 300 + 100 and result["unpruned_steps"] == 6 * 300
    assert result["best_dev"] == 0.85 and result["unpruned_best_dev"] == 0.9 and result["best_trial_stopped"]


def test_the_int8_kernel_benchmark_times_layers_that_compute_what_trunks_int8_layer_does():
    """The packed oneDNN layer it times is Trunk's int8 scheme on another product (the same outputs within a rounding
    step) where oneDNN's product is exact; where it is not (a CPU without VNNI or AMX), the script says so. It prints
    the per-layer and per-block tables."""
    from int8_kernels import PackedInt8Linear, packed_product_error

    from trunk.inference.quantize import Int8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96)
    x = torch.randn(2, 10, 64) * torch.rand(2, 10, 1) * 4
    with torch.inference_mode():
        reference, trunks = linear(x), Int8Linear.from_float(linear)(x)
        packed = PackedInt8Linear(linear)(x)
    assert packed.shape == reference.shape
    exact = packed_product_error() == 0
    if exact:
        assert torch.allclose(packed, trunks, atol=1e-4)
        assert (packed - reference).abs().max() < 0.02 * reference.abs().max()
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "int8_kernels.py"), "--d-model", "32", "--d-ff", "64", "--heads", "4",
         "--tokens", "16", "--rounds", "2"], capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| 32 -> 64 |" in done.stdout and "| oneDNN packed int8 + bf16 |" in done.stdout
    assert ("packed int8 product is not exact on this CPU" in done.stdout) != exact, done.stdout[:2000]
