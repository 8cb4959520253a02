"""A new user's first hour: the commands the README leads to work on the first try, or say what to do instead."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY_MODEL, single_task

from trunk.cli import run_cli


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


LAST = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor=val/score", "--trainer.callbacks.mode=max",
        "--trainer.callbacks.save_last=true"]


@pytest.fixture
def sentence_run(sentiment_files, tmp_path):
    """A tiny run trained on files whose text column is 'sentence' (as SST-2's), its training files then moved away:
    (predict options, the run's last checkpoint)."""
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "validation"):
        with sentiment_files[split].open() as f:
            rows = [{"sentence": row["text"], "label": row["label"]} for row in csv.DictReader(f)]
        with (data / f"{split}.tsv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["sentence", "label"], delimiter="\t")
            writer.writeheader()
            writer.writerows(rows)
    options = single_task([
        *TINY_MODEL, "--data=trunk.datamodules.TextClassificationData", f"--data.train={data / 'train.tsv'}",
        f"--data.validation={data / 'validation.tsv'}", "--data.text_column=sentence",
        "--data.tokenizer_vocab_size=300",
        "--data.max_length=64", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path / 'run'}", *LAST,
    ])
    cli = run_cli(["fit", *options, "--trainer.max_steps=3"])
    shutil.rmtree(data)  # predicting reads nothing of the training split
    return options, cli.trainer.checkpoint_callback.last_model_path


def test_a_text_file_predicts_one_input_per_line_without_the_training_files(sentence_run, tmp_path):
    options, ckpt = sentence_run
    texts = tmp_path / "my_texts.txt"
    texts.write_text("a gripping, funny film\n\na dull plot\n")
    out = tmp_path / "preds.jsonl"
    run_cli(["predict", *options, *single_task([f"--data.predict={texts}"]), f"--ckpt_path={ckpt}",
             f"--predictions.output={out}"])
    assert [row["text"] for row in read_jsonl(out)] == ["a gripping, funny film", "a dull plot"]


def test_a_checkpoint_alone_predicts_with_the_recipe_its_run_saved(sentence_run, tmp_path, capsys, monkeypatch):
    """``trunk predict --ckpt_path CKPT`` with no recipe: the run's config.yaml beside its checkpoints is the recipe;
    a checkpoint moved out of its run's folder is one line that asks for --config."""
    options, ckpt = sentence_run
    texts = tmp_path / "my_texts.txt"
    texts.write_text("a gripping, funny film\na dull plot\n")
    given, alone = tmp_path / "given.jsonl", tmp_path / "alone.jsonl"
    run_cli(["predict", *options, *single_task([f"--data.predict={texts}"]), f"--ckpt_path={ckpt}",
             f"--predictions.output={given}"])
    run_cli(["predict", "--ckpt_path", ckpt, f"--data.tasks.sentiment.predict={texts}",
             f"--predictions.output={alone}"])
    assert read_jsonl(alone) == read_jsonl(given) and len(read_jsonl(alone)) == 2
    monkeypatch.setenv("HOME", str(tmp_path))  # and with ~ for the home directory, as every other path
    home = tmp_path / "home.jsonl"
    run_cli(["predict", f"--ckpt_path=~/{Path(ckpt).relative_to(tmp_path)}", f"--data.tasks.sentiment.predict={texts}",
             "--predictions.output=~/home.jsonl"])
    assert read_jsonl(home) == read_jsonl(given)
    saved = Path(ckpt).parent.parent / "config.yaml"  # a joint run that went on to its MT-DNN stages saved this
    saved.write_text(saved.read_text().replace("finetune_each: 0", "finetune_each: 2"))
    run_cli(["predict", "--ckpt_path", ckpt, f"--data.tasks.sentiment.predict={texts}", f"--predictions.output={home}",
             "--predictions.overwrite=true"])
    assert read_jsonl(home) == read_jsonl(given)
    saved = Path(ckpt).parent.parent / "config.yaml"
    assert f"Recipe: {saved}" in capsys.readouterr().err
    moved = str(shutil.copy(ckpt, tmp_path / "moved.ckpt"))
    with pytest.raises(SystemExit, match=rf"error: trunk predict --ckpt_path {re.escape(moved)} without --config reads "
                                         r"the recipe its run saved, .*config.yaml, and there is none .* Pass the "
                                         r"recipe it was trained with: --config RECIPE.yaml.$"):
        run_cli(["predict", f"--ckpt_path={moved}", f"--data.tasks.sentiment.predict={texts}"])
    with pytest.raises(SystemExit, match=r"error: --ckpt_path nothere.ckpt: no such checkpoint file"):
        run_cli(["predict", "--ckpt_path", "nothere.ckpt"])
    for command in ("fit", "predict"):  # no recipe at all: what to give, not the parser's list of missing keys
        with pytest.raises(SystemExit):
            run_cli([command])
        said = capsys.readouterr().err
        assert f"error: trunk {command} needs a recipe that names its tasks: --config configs/RECIPE.yaml" in said
        assert ("--ckpt_path CKPT" in said) == (command == "predict") and "model.tasks" not in said


def test_a_predict_file_brings_its_own_text_column_or_names_it(sentence_run, tmp_path):
    options, ckpt = sentence_run
    one = tmp_path / "reviews.jsonl"  # one text column (and a number) under another name than the training one's
    one.write_text('{"id": 1, "review": "the film was great"}\n{"id": 2, "review": "not good"}\n')
    out = tmp_path / "preds.jsonl"
    run_cli(["predict", *options, *single_task([f"--data.predict={one}"]), f"--ckpt_path={ckpt}",
             f"--predictions.output={out}"])
    assert [row["text"] for row in read_jsonl(out)] == ["the film was great", "not good"]

    two = tmp_path / "two.jsonl"  # two text columns: which one is not guessed
    two.write_text('{"title": "a film", "body": "the film was great"}\n')
    with pytest.raises(ValueError, match=r"no column 'sentence'.*\['title', 'body'\].*predict_columns "
                                         r"'\{text_column: COLUMN\}'"):
        run_cli(["predict", *options, *single_task([f"--data.predict={two}"]), f"--ckpt_path={ckpt}"])
    run_cli(["predict", *options, *single_task([f"--data.predict={two}", "--data.predict_columns={text_column: body}"]),
             f"--ckpt_path={ckpt}", f"--predictions.output={out}", "--predictions.overwrite=true"])
    assert [row["text"] for row in read_jsonl(out)] == ["the film was great"]
    with pytest.raises(ValueError, match=r"predict_columns names \['label_column'\], which this task does not read"):
        run_cli(["predict", *options, f"--ckpt_path={ckpt}",
                 *single_task([f"--data.predict={two}", "--data.predict_columns={label_column: x}"])])


def test_best_of_a_run_that_never_validated_says_to_take_last(sentiment_files, tmp_path):
    options = single_task([
        *TINY_MODEL, "--data=trunk.datamodules.TextClassificationData", f"--data.train={sentiment_files['train']}",
        f"--data.validation={sentiment_files['validation']}", f"--data.predict={sentiment_files['test']}",
        "--data.tokenizer_vocab_size=300", "--data.max_length=64", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", f"--trainer.default_root_dir={tmp_path / 'run'}", *LAST,
    ])
    run_cli(["fit", *options, "--trainer.max_steps=2"])  # stops before its first validation
    with pytest.raises(SystemExit, match="recorded no best checkpoint: no validation ran.*Use --ckpt_path last"):
        run_cli(["predict", *options, "--ckpt_path=best"])
    run_cli(["predict", *options, "--ckpt_path=last", f"--predictions.output={tmp_path / 'p.jsonl'}"])
    assert len(read_jsonl(tmp_path / "p.jsonl")) == 64


def test_a_from_scratch_shape_beside_pretrained_weights_is_refused_naming_both(sentiment_files, tmp_path):
    """A recipe's width with the weights' head count would not hold together (36 is not divisible by the weights' 8
    heads, which replace the recipe's default 4): the error names every field that differs, both values, and the fix;
    nothing is mixed."""
    from trunk.core.codec import Codec
    from trunk.datamodules.tokenizer import train_wordpiece
    from trunk.formats.trunk_dir import PretrainedTrunk, save_pretrained
    from trunk.models import TrunkConfig, build_trunk

    tokenizer = train_wordpiece(["a film", "the plot"], vocab_size=50)
    config = TrunkConfig(vocab_size=tokenizer.get_vocab_size(), d_model=32, n_layers=2, n_heads=8, d_ff=64, max_len=64)
    trunk_dir = save_pretrained(tmp_path / "trunk", PretrainedTrunk(tmp_path, config, {"text": {}},
                                                                    build_trunk(config).state_dict(),
                                                                    codec=Codec(tokenizer)))
    options = single_task([
        "--model=trunk.tasks.SequenceClassification", f"--model.init_from={trunk_dir}", "--model.trunk.d_model=36",
        "--model.trunk.n_heads=4", "--model.trunk.n_layers=3", "--data=trunk.datamodules.TextClassificationData",
        f"--data.train={sentiment_files['train']}", f"--trainer.default_root_dir={tmp_path / 'run'}",
    ])
    with pytest.raises(ValueError) as err:
        run_cli(["fit", *options, "--trainer.max_steps=1"])
    message = str(err.value)
    assert "d_model: model.trunk.d_model=36 but" in message and "has 32" in message
    assert "n_layers: model.trunk.n_layers=3" in message and "has 2" in message
    assert "--model.trunk.d_model=32 --model.trunk.n_layers=2" in message and "not divisible" not in message


def test_a_short_run_logs_its_loss_says_what_cut_it_short_and_numbers_validations_alike(tiny_cli_args, tmp_path):
    """max_steps beyond what max_epochs allows is said, not silently cut; a run shorter than log_every_n_steps logs its
    loss anyway; samples/ and metrics.csv stamp one validation with one step; the test after training says why it
    scores the final weights."""
    with pytest.warns(UserWarning) as caught:
        cli = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=20", "--trainer.val_check_interval=4", *LAST])
    said = [str(w.message) for w in caught]
    assert any("trainer.max_steps=20, but trainer.max_epochs=1 epochs of 8 steps end the run at step 8" in s
               for s in said), said
    assert cli.trainer.global_step == 8 and cli.trainer.log_every_n_steps == 1
    log_dir = Path(cli.trainer.log_dir)
    rows = list(csv.DictReader((log_dir / "metrics.csv").open()))
    assert len([r for r in rows if r.get("train/loss")]) >= 8
    val_steps = sorted({int(r["step"]) for r in rows if r.get("val/score")})
    sample_steps = sorted({row["step"] for row in read_jsonl(log_dir / "samples" / "sentiment.jsonl")})
    assert val_steps == sample_steps == [3, 7]


def test_the_test_after_a_run_without_validation_says_why_it_scores_the_final_weights(tiny_cli_args):
    with pytest.warns(UserWarning, match=r"The test splits score the final weights \(step 2\): no validation ran, so "
                                         "none was picked as best"):
        run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=2", *LAST])


def test_fast_dev_run_trains_one_step_tests_and_writes_no_run(tiny_cli_args, tmp_path, recwarn):
    """Lightning's dry run: one batch of each loop, nothing logged or saved, so no run folder to lock and no warning
    about what a one-step model predicts; the test after it says why it scores the final weights."""
    keep = ["--trainer.callbacks+=trunk.training.callbacks.TrunkCheckpoint", "--trainer.callbacks.monitor=val/score",
            "--trainer.callbacks.mode=max", "--trainer.callbacks.save_last=true"]  # the recipes' checkpoints
    cli = run_cli(["fit", *tiny_cli_args, "--trainer.fast_dev_run=true", *keep])
    said = [str(w.message) for w in recwarn]
    assert cli.trainer.global_step == 1 and "test/score" in cli.trainer.callback_metrics
    assert any("score the final weights (step 1): fast_dev_run saves no checkpoint" in s for s in said), said
    assert not any("the model predicted" in s for s in said), said
    assert not list((tmp_path / "run").rglob("*.ckpt")) and not list((tmp_path / "run").rglob("metrics.csv"))


# Trunk's own lines: its run summary and notes, its warnings, the encoding bars, its metrics tables
OWN = re.compile(r"(Run:|  |Threads:|Precision:|Tasks \[|Model:|Logging every|warning:|Encoding |Traine?d? a "
                 r"|Test metrics:|Validation metrics:|Checkpoint:|Wrote the predictions)")


@pytest.mark.parametrize("command", ["fit", "predict"])
def test_a_short_run_prints_few_lines_of_library_boilerplate(command, tiny_cli_args, tmp_path):
    """Everything a short run prints besides Trunk's own lines: at most a few library lines (Lightning's seed, its
    reason to stop, the checkpoint it loads)."""
    args = [*tiny_cli_args, "--trainer.max_steps=4", "--seed_everything=1", *LAST]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = lambda *extra: subprocess.run([sys.executable, "-m", "trunk.cli", *extra], cwd=tmp_path,  # noqa: E731
                                        capture_output=True, text=True, timeout=600, env=env)
    result = run("fit", *args)
    if command == "predict":
        result = run("predict", *args, "--ckpt_path=last", f"--predictions.output={tmp_path / 'p.jsonl'}")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    others = [line for line in lines if not OWN.match(line)]
    assert len(others) <= 3, "\n".join(others)
    assert not any("UserWarning" in line for line in lines), "\n".join(lines)


def test_the_best_checkpoint_keeps_the_weights_and_last_the_whole_state(tiny_cli_args, tmp_path):
    """trunk.training.callbacks.TrunkCheckpoint (the recipes'): best-*.ckpt without the optimizer's state (a third of
    last.ckpt's size under AdamW), which --ckpt_path best tests and predicts with and a new run starts from; last.ckpt
    whole, to resume."""
    import torch

    keep = ["--trainer.callbacks+=trunk.training.callbacks.TrunkCheckpoint", "--trainer.callbacks.monitor=val/score",
            "--trainer.callbacks.mode=max", "--trainer.callbacks.save_last=true",
            "--trainer.callbacks.filename=best-{step}"]
    cli = run_cli(["fit", *tiny_cli_args, *keep, "--trainer.val_check_interval=4"])
    callback = cli.trainer.checkpoint_callback
    best, last = Path(callback.best_model_path), Path(callback.last_model_path)
    assert best.name.startswith("best-") and last.name == "last.ckpt"
    best_state, last_state = torch.load(best, weights_only=True), torch.load(last, weights_only=True)
    assert "optimizer_states" not in best_state and "callbacks" not in best_state
    assert last_state["optimizer_states"] and last_state["callbacks"]
    assert best.stat().st_size < 0.5 * last.stat().st_size
    assert best_state["state_dict"].keys() == last_state["state_dict"].keys() and best_state["trunk_meta"]
    run_cli(["predict", *tiny_cli_args, "--ckpt_path=best", f"--predictions.output={tmp_path / 'p.jsonl'}"])
    assert len(read_jsonl(tmp_path / "p.jsonl")) == 64
    args = [a for a in tiny_cli_args if not a.startswith(("--model.trunk.", "--trainer.default_root_dir"))]
    again = run_cli(["fit", *args, f"--model.init_from={best}", "--trainer.max_steps=1",
                     f"--trainer.default_root_dir={tmp_path / 'again'}"])
    assert again.trainer.global_step == 1


def test_export_names_the_class_that_loads_the_head():
    from trunk.cli.export import auto_class

    assert auto_class("BertForSequenceClassification") == "AutoModelForSequenceClassification"
    assert auto_class("T5ForConditionalGeneration") == auto_class("MarianMTModel") == "AutoModelForSeq2SeqLM"
    assert auto_class("BertModel") == "AutoModel"
