"""Several tasks on one trunk: joint training through the CLI, per-task metrics, heads that carry over, DDP."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, logged_metrics, write_rows

from trunk.assembly.weights import HeadReuse, from_pretrained
from trunk.cli import run_cli
from trunk.tasks import SequenceClassification, TrunkModule, load

TRUNK = ["--model.trunk.d_model=32", "--model.trunk.n_layers=2", "--model.trunk.n_heads=4", "--model.trunk.d_ff=64",
         "--model.trunk.max_len=64", "--model.optimizer.lr=3e-3"]


def task(name: str, objective: str, data: str, files: dict, batch_size: int) -> list[str]:
    """One task of a run: its objective and its data, split files from ``files``."""
    return [f"--model.tasks.{name}=trunk.tasks.{objective}", f"--data.tasks.{name}=trunk.datamodules.{data}",
            *(f"--data.tasks.{name}.{split}={files[split]}" for split in ("train", "validation", "test")),
            f"--data.tasks.{name}.predict={files['test']}", f"--data.tasks.{name}.max_length=64",
            f"--data.tasks.{name}.batch_size={batch_size}"]


def sentiment_task(files: dict, name: str = "sentiment") -> list[str]:
    return task(name, "SequenceClassification", "TextClassificationData", files, 16)


def ner_task(files: dict, name: str = "ner") -> list[str]:
    return task(name, "TokenClassification", "TokenClassificationData", files, 8)


def shapes_task(name: str = "shapes") -> list[str]:
    return [
        f"--model.tasks.{name}=trunk.tasks.ImageClassification",
        f"--model.tasks.{name}.image_size=16",
        f"--model.tasks.{name}.patch_size=4",
        f"--data.tasks.{name}=trunk.datamodules.ImageClassificationData",
        f"--data.tasks.{name}.dataset=trunk:shapes",
        f"--data.tasks.{name}.train=train",
        f"--data.tasks.{name}.validation=validation",
        f"--data.tasks.{name}.test=test",
        f"--data.tasks.{name}.batch_size=64",
    ]


def trainer(root: Path, epochs: int = 1) -> list[str]:
    return [
        "--data.tokenizer_vocab_size=300",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        f"--trainer.max_epochs={epochs}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}",
        "--seed_everything=0",
    ]


@pytest.fixture
def joint(sentiment_files, ner_files, tmp_path):
    """A fitted two-task run (sentiment classification + NER on one trunk) and its arguments."""
    args = [*TRUNK, *sentiment_task(sentiment_files), *ner_task(ner_files), *trainer(tmp_path / "joint", epochs=2)]
    return run_cli(["fit", *args]), args


def test_joint_run_logs_every_task_under_its_name_and_tests_both(joint):
    cli, _ = joint
    metrics = cli.trainer.callback_metrics
    assert {
        "test/sentiment/acc",
        "test/sentiment/f1_macro",
        "test/sentiment/mcc",
        "test/ner/f1",
        "test/ner/acc",
        "test/score",
    } <= metrics.keys()
    assert metrics["test/score"].item() == pytest.approx(
        (metrics["test/sentiment/acc"] + metrics["test/ner/f1"]).item() / 2
    )
    logged = (Path(cli.trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {
        "train/loss",
        "train/sentiment/loss_step",
        "train/ner/loss_step",
        "val/sentiment/acc",
        "val/ner/f1",
        "val/score",
    } <= set(logged)
    # 256 + 200 training rows at batches of 16 and 8: 16 + 25 steps an epoch
    assert cli.trainer.global_step == 2 * 41


def test_per_task_metrics_equal_single_task_evaluation_on_the_same_weights(joint, sentiment_files, tmp_path):
    cli, args = joint
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    joint_val = run_cli(["validate", *args, f"--ckpt_path={ckpt}"]).trainer.callback_metrics
    alone = run_cli(["validate", *TRUNK, *sentiment_task(sentiment_files), *trainer(tmp_path / "alone"),
                     f"--model.init_from={ckpt}"]).trainer.callback_metrics  # the joint run's trunk and sentiment head
    assert alone["val/sentiment/acc"].item() == pytest.approx(joint_val["val/sentiment/acc"].item(), abs=1e-6)
    assert alone["val/sentiment/loss"].item() == pytest.approx(joint_val["val/sentiment/loss"].item(), abs=1e-5)


def test_multi_head_checkpoint_and_directory_predict_identically_for_every_task(joint, tmp_path):
    from trunk.cli import export_main

    cli, args = joint
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    out = tmp_path / "predictions.jsonl"
    run_cli(["predict", *args, f"--ckpt_path={ckpt}", f"--predictions.output={out}"])
    written = {task: [json.loads(line) for line in (tmp_path / f"predictions.{task}.jsonl").read_text().splitlines()]
               for task in ("sentiment", "ner")}
    assert len(written["sentiment"]) == 64 and len(written["ner"]) == 40
    predictor = load(ckpt)
    assert predictor.tasks == ["sentiment", "ner"]
    texts = [r["text"] for r in written["sentiment"]]
    sentences = [r["words"] for r in written["ner"]]
    # the loaders' batches (eval batch size: twice the training one), so padding and float sums are the same
    assert predictor.predict(texts, task="sentiment", batch_size=32) == written["sentiment"]
    assert predictor.predict(sentences, task="ner", batch_size=16) == written["ner"]
    export_main([ckpt, str(tmp_path / "exported")])
    from_directory = load(tmp_path / "exported")
    assert from_directory.predict(texts, task="sentiment", batch_size=32) == written["sentiment"]
    assert from_directory.predict(sentences, task="ner", batch_size=16) == written["ner"]
    with pytest.raises(ValueError, match=r"No task named 'nope'; this model's tasks are \['sentiment', 'ner'\]"):
        predictor.predict(texts, task="nope")
    with pytest.raises(ValueError, match="name one with task="):
        predictor.predict(texts)
    # both tasks at once: the same records, from one trunk pass per batch (the sentences' tokens are the same for both)
    calls = []
    hook = predictor.model.trunk.register_forward_hook(lambda *_: calls.append(1))
    both = predictor.predict(texts, task=["sentiment", "ner"], batch_size=32)
    hook.remove()
    assert len(calls) == 2  # 64 texts, batches of 32
    assert [b["sentiment"] for b in both] == written["sentiment"]
    assert [b["ner"]["tags"] for b in both] == [r["tags"] for r in predictor.predict(texts, task="ner", batch_size=32)]
    only = tmp_path / "only.jsonl"
    run_cli(["predict", *args, f"--ckpt_path={ckpt}", f"--predictions.output={only}", "--data.predict_task=ner"])
    assert only.is_file() and not (tmp_path / "only.sentiment.jsonl").exists()


def test_heads_carry_over_by_label_name_in_any_order(joint, tmp_path):
    from trunk.cli import export_main

    cli, _ = joint
    export_main([cli.trainer.checkpoint_callback.best_model_path, str(tmp_path / "exported")])
    trained = load(tmp_path / "exported", precision="32-true")  # as the modules below compute (auto: bf16 where native)
    texts = ["the film was great", "the plot was not good but the acting was superb", "the ending felt dull"]
    expected = [r["probs"] for r in trained.predict(texts, task="sentiment")]
    config = trained.model.trunk_config

    def reuse(labels, **options) -> TrunkModule:
        return from_pretrained(tmp_path / "exported", {"sentiment": SequenceClassification()}, trunk=config,
                               task_info={"sentiment": {"label_names": labels}}, reuse=HeadReuse(**options))

    swapped = reuse(["positive", "negative"]).eval()  # same labels, other order: rows follow the names
    preprocessor = trained.preprocessors["sentiment"]
    batch = {"task": "sentiment", **preprocessor.collate(preprocessor.encode(texts))}
    probs = [r["probs"] for r in swapped.predict_step(batch, 0)]
    assert [list(p) for p in probs] == [["positive", "negative"]] * 3  # the new order ...
    assert all(p[k] == pytest.approx(e[k], abs=1e-6) for p, e in zip(probs, expected) for k in e)  # ... the same model
    with pytest.raises(ValueError, match=r"trained on the labels \['negative', 'positive'\], but this run's data has "
                                         r"\['bad', 'good', 'meh'\]. Set model.reinit_mismatched_heads=true"):
        reuse(["bad", "good", "meh"])
    fresh = reuse(["bad", "good", "meh"], reinit_mismatched_heads=True)
    stored = trained.model.objectives["sentiment"].head
    new = fresh.objectives["sentiment"].head
    assert torch.equal(new.dense.weight, stored.dense.weight)  # the head's body is kept
    assert new.classifier.weight.shape == (3, 32)  # only the classifier starts afresh


def test_text_and_image_tasks_train_one_backbone_through_the_cli(sentiment_files, tmp_path):
    # 3 epochs: after 2 the shapes reached 0.50-0.69 by CPU kind and thread count (an AMX Xeon, bf16, one thread:
    # 0.498), after 3 0.78-0.82 on each
    cli = run_cli(
        ["fit", *TRUNK, *sentiment_task(sentiment_files), *shapes_task(), *trainer(tmp_path / "run", epochs=3)]
    )
    assert set(cli.model.trunk.stems) == {"text", "image"}
    metrics = cli.trainer.callback_metrics
    assert metrics["test/shapes/acc"] > 0.5 and "test/sentiment/acc" in metrics  # chance: 0.2 for shapes
    state = torch.load(cli.trainer.checkpoint_callback.best_model_path, weights_only=True)["state_dict"]
    assert any(k.startswith("trunk.stems.image.") for k in state) and any(
        k.startswith("trunk.stems.text.") for k in state
    )


@pytest.fixture
def keyword_sentiment_files(tmp_path):
    """Sentiment decided by one adjective (no negation, no contrast): learned by every seed in 10 tiny epochs, so
    that joint and single-task runs compare as runs that learned the task. The word-order sentiment of
    ``sentiment_files`` sits at chance for hundreds of steps, then jumps at a step that varies with the CPU."""
    from trunk.datamodules.builtin import INTENSIFIERS, NEGATIVE, POSITIVE, SUBJECTS, VERBS

    def example(rng):
        positive = rng.random() < 0.5
        words = [
            rng.choice(SUBJECTS),
            rng.choice(VERBS),
            rng.choice(INTENSIFIERS),
            rng.choice(POSITIVE if positive else NEGATIVE),
        ]
        return {"text": " ".join(w for w in words if w), "label": "positive" if positive else "negative"}

    rng = random.Random(0)
    sizes = {"train": 256, "validation": 64, "test": 64}
    return {
        split: write_rows(tmp_path / f"kw_{split}.csv", [example(rng) for _ in range(n)]) for split, n in sizes.items()
    }


def test_a_joint_toy_reaches_each_single_task_quality(keyword_sentiment_files, ner_files, tmp_path):
    """The same steps per task, alone or sharing the trunk (alternating batches): joint is no worse."""
    def fit(*tasks, name):
        args = [
            *TRUNK,
            *(a for t in tasks for a in t),
            *trainer(tmp_path / name, epochs=10),
            "--data.tokenizer_vocab_size=1000",
        ]
        return run_cli(["fit", *args]).trainer.callback_metrics  # a vocabulary large enough for both tasks' words

    joint = fit(sentiment_task(keyword_sentiment_files), ner_task(ner_files), name="joint")
    alone_sentiment = fit(sentiment_task(keyword_sentiment_files), name="sentiment")
    alone_ner = fit(ner_task(ner_files), name="ner")
    # the comparison is between runs that learned the task
    assert alone_sentiment["test/sentiment/acc"] > 0.9 and alone_ner["test/ner/f1"] > 0.9
    assert joint["test/sentiment/acc"] >= alone_sentiment["test/sentiment/acc"] - 0.05
    assert joint["test/ner/f1"] >= alone_ner["test/ner/f1"] - 0.05


@pytest.mark.parametrize("preset", ["ddp_cpu", "fsdp2_cpu"])
def test_two_process_joint_run_uses_every_head_on_every_rank(preset, sentiment_files, ner_files, tmp_path):
    """Real gloo DDP (no find_unused_parameters) and FSDP2 (both heads in the root unit, one unused each step):
    a rank that drew another task than its peer would hang or fail. Then validation of the checkpoint on 2
    processes equals 1 process, task by task, on validation splits of odd sizes (63 and 39 rows), which a sampler that
    repeats a row to even out the ranks' shares counts twice."""
    odd = tmp_path / "odd"
    odd.mkdir()
    lines = sentiment_files["validation"].read_text().splitlines(keepends=True)  # a header, 64 rows
    sentiment_files = {**sentiment_files, "validation": odd / "validation.csv"}
    sentiment_files["validation"].write_text("".join(lines[:-1]))
    sentences = ner_files["validation"].read_text().split("\n\n")  # -DOCSTART-, 40 sentences, the end
    ner_files = {**ner_files, "validation": odd / "ner_validation.txt"}
    ner_files["validation"].write_text("\n\n".join(sentences[:-2] + sentences[-1:]))
    args = [*TRUNK, *sentiment_task(sentiment_files), *ner_task(ner_files), *trainer(tmp_path / "run")]
    # fp32, not auto's bf16 where the CPU has it: a rank's batches are padded otherwise than one process's, and bf16's
    # rounding then flips a near-tie of this barely trained model (an AMX Xeon's ner F1 moved by one entity)
    args = [a for a in args if not a.startswith("--trainer.devices")] + ["--trainer.precision=32-true"]
    ddp = ["--config", str(REPO / f"configs/trainer/{preset}.yaml")]
    result = subprocess.run([sys.executable, "-m", "trunk.cli", "fit", *args, *ddp], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600, env=os.environ.copy())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sync_dist=True" not in result.stderr  # the metrics are synced before they are logged: no advice to
    ckpt = next((tmp_path / "run").rglob("*.ckpt"))
    assert torch.load(ckpt, weights_only=True)["global_step"] == 8 + 13  # per rank: ceil(128/16) + ceil(100/8)
    one = run_cli(["validate", *args, f"--ckpt_path={ckpt}"]).trainer.callback_metrics
    two = subprocess.run(
        [sys.executable, "-m", "trunk.cli", "validate", *args, *ddp, f"--ckpt_path={ckpt}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )  # a rich table prints numbers whole
    assert two.returncode == 0, two.stderr[-3000:]
    logged = logged_metrics(tmp_path / "run" / "validate")  # the 2-process validation's, whole
    for name in ("val/sentiment/acc", "val/ner/f1", "val/ner/acc"):
        assert logged[name] == pytest.approx(one[name].item(), abs=1e-6), name


# -- bad input ---------------------------------------------------------------------------------------


def test_task_names_must_agree_and_be_unique(sentiment_files, ner_files, tmp_path):
    args = [*TRUNK, *sentiment_task(sentiment_files), *trainer(tmp_path)]
    with pytest.raises(
        SystemExit, match=r"model.tasks names \['other', 'sentiment'\] but data.tasks names \['sentiment'\]"
    ):
        run_cli([*args, "--model.tasks.other=trunk.tasks.SequenceClassification"], run=False)
    config = tmp_path / "twice.yaml"
    config.write_text("model:\n  tasks:\n    a:\n      class_path: trunk.tasks.SequenceClassification\n"
                      "    a:\n      class_path: trunk.tasks.TokenClassification\n")
    with pytest.raises(
        SystemExit, match=r"twice.yaml, line 5: the key 'a' appears twice. Task names .* must be unique"
    ):
        run_cli(["fit", "--config", str(config), *args], run=False)


def test_data_of_another_kind_than_the_objective_is_a_clear_error(ner_files, tmp_path):
    args = [*TRUNK, *ner_task(ner_files), "--model.tasks.ner=trunk.tasks.SequenceClassification", *trainer(tmp_path)]
    with pytest.raises(
        ValueError,
        match="Task 'ner': its data feeds token_classification objectives, but model.tasks.ner is "
        "SequenceClassification",
    ):
        run_cli(args, run=False)


def test_a_monitor_naming_no_task_is_a_clear_error(sentiment_files, tmp_path):
    args = [
        *TRUNK,
        *sentiment_task(sentiment_files),
        *trainer(tmp_path),
        "--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.monitor=val/sst2/acc",
    ]
    with pytest.raises(
        ValueError, match=r"monitors 'val/sst2/acc', but this run has no task 'sst2'; its tasks are \['sentiment'\]"
    ):
        run_cli(["fit", *args])
    with pytest.raises(ValueError, match="metrics are named <stage>/<task>/<metric>"):
        run_cli(["fit", *args[:-1], "--trainer.callbacks.monitor=val/acc"])


def test_a_joint_run_writes_each_tasks_validation_samples(joint):
    """NER samples mark the gold and the predicted entities in the sentence."""
    from trunk.core.tagging import Span
    from trunk.tasks.objectives.token_classification import mark_entities

    cli, _ = joint
    folder = Path(cli.trainer.log_dir) / "samples"
    ner = [json.loads(line) for line in (folder / "ner.jsonl").read_text().splitlines()]
    assert set(ner[0]) == {"epoch", "step", "id", "text", "gold", "predicted", "correct"}
    assert all("[" in r["gold"] for r in ner)  # every generated sentence has an entity
    assert (folder / "sentiment.jsonl").is_file()
    words = ["Anna", "Petrova", "visited", "New", "York", "today"]
    assert (
        mark_entities(words, [Span("PER", 0, 1), Span("LOC", 3, 4)])
        == "[PER Anna Petrova] visited [LOC New York] today"
    )
