"""Bad input and files as they ship, caused for real: each gives the right result or one `error:` line that names what
is wrong and the fix, and nothing the user wrote is lost."""

import os
import shutil
import stat
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import write_rows

from trunk.cli import export_main, run_cli


def trunk(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The `trunk` command as a user runs it (its own process: exit status and stderr as the shell sees them)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    return subprocess.run(
        [sys.executable, "-m", "trunk.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    return line


# -- labels
# -------------------------------------------------------------------------------------------------------------
def test_labels_that_differ_only_by_surrounding_spaces_are_one_class(tmp_path):
    from trunk.datamodules import MultiLabelTextData, TextClassificationData

    rows = [{"text": f"text {i}", "label": label, "tags": tags} for i, (label, tags) in
            enumerate([("pos", "a, b"), ("pos ", " a"), (" neg", "b "), ("neg", "a,b")] * 4)]
    train = str(write_rows(tmp_path / "train.csv", rows))
    data = TextClassificationData(train=train)
    assert data.label_names == ["neg", "pos"]
    assert data.targets(data.raw("train"), "train")[:4] == [1, 1, 0, 0]
    assert TextClassificationData(train=train, label_names=[" pos", "neg "]).label_names == ["pos", "neg"]
    assert MultiLabelTextData(train=train, label_column="tags").label_names == ["a", "b"]


def test_labels_that_differ_only_by_case_or_spacing_are_named_in_a_warning(tmp_path):
    """'Pos', 'pos' and 'POS ' (and full-width or doubly spaced forms) stay classes of their own, as the data says,
    and a warning names them: merging is the user's call."""
    from trunk.datamodules import MultiLabelTextData, TextClassificationData

    rows = [{"text": f"text {i}", "label": label, "tags": tags} for i, (label, tags) in
            enumerate([("Pos", "sci fi"), ("pos", "sci  fi"), ("neg", "drama"), ("ＮＥＧ", "Drama")] * 4)]
    train = str(write_rows(tmp_path / "train.csv", rows))
    with pytest.warns(UserWarning, match=r"data.tasks.task.train: the labels \[\['Pos', 'pos'\], \['neg', 'ＮＥＧ'\]\] "
                                         r"print alike, so each is a class of its own: 'Pos' and 'pos' differ by "
                                         r"case: U\+0050 LATIN CAPITAL LETTER P against U\+0070 LATIN SMALL LETTER "
                                         r"P; 'neg' and 'ＮＥＧ' differ by compatibility forms"):
        assert TextClassificationData(train=train).label_names == ["Pos", "neg", "pos", "ＮＥＧ"]
    with pytest.warns(UserWarning, match=r"the labels \[\['Drama', 'drama'\], \['sci  fi', 'sci fi'\]\] print alike.* "
                                         r"'sci  fi' and 'sci fi' differ by spacing: U\+0020 SPACE in the first only"):
        assert len(MultiLabelTextData(train=train, label_column="tags").label_names) == 4
    with pytest.warns(UserWarning, match=r"label_names: the labels \[\['Pos', 'pos'\]\] print alike.*differ by case"):
        TextClassificationData(label_names=["Pos", "pos", "neg"])


def test_labels_that_print_alike_by_invisible_characters_or_unicode_forms_are_named_and_may_be_folded(tmp_path):
    """'pos' and 'pos' with a zero-width space, an accent composed and decomposed: a warning names each pair with the
    code points that differ; normalize_labels folds them into one class without rewriting the data (nfc: the
    normalisation form; nfkc: also invisible characters and compatibility forms), in the data and label_names alike."""
    from trunk.datamodules import MultiLabelTextData, TextClassificationData

    pairs = [("pos", "café"), ("pos\u200b", "cafe\u0301"), ("neg", "café"), ("ne\u2060g", "cafe\u0301")]
    rows = [{"text": f"text {i}", "label": label, "tags": tags} for i, (label, tags) in enumerate(pairs * 4)]
    train = str(write_rows(tmp_path / "train.csv", rows))
    with pytest.warns(UserWarning, match=r"the labels \[\['neg', 'ne\\u2060g'\], \['pos', 'pos\\u200b'\]\] print "
                                         r"alike, so each is a class of its own: 'neg' and 'ne\\u2060g' differ by "
                                         r"invisible characters: U\+2060 WORD JOINER in the second only; 'pos' and "
                                         r"'pos\\u200b' differ by invisible characters: U\+200B ZERO WIDTH SPACE in "
                                         r"the second only\. Set normalize_labels: nfkc"):
        assert len(TextClassificationData(train=train).label_names) == 4
    with pytest.warns(UserWarning, match=r"'caf.+' and 'caf.+' differ by the Unicode normalisation form \(composed "
                                         r"against decomposed\): U\+0065 LATIN SMALL LETTER E U\+0301 COMBINING ACUTE "
                                         r"ACCENT against U\+00E9 LATIN SMALL LETTER E WITH ACUTE"):
        assert len(MultiLabelTextData(train=train, label_column="tags").label_names) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # folded: nothing left to warn of
        data = TextClassificationData(train=train, normalize_labels="nfkc")
        assert data.label_names == ["neg", "pos"]
        assert data.targets(data.raw("train"), "train")[:4] == [1, 1, 0, 0]
        assert MultiLabelTextData(train=train, label_column="tags", normalize_labels="nfc").label_names == ["café"]
        assert TextClassificationData(label_names=["pos\u200b", "neg"], normalize_labels="nfkc").label_names == [
            "pos", "neg"]
    with pytest.raises(ValueError, match=r"normalize_labels='nfd': choose none, nfc, nfkc"):
        TextClassificationData(train=train, normalize_labels="nfd")
    # a label_names entry that looks like the data's label but is not: the difference named, and the fold offered
    with pytest.raises(ValueError, match=r"labels \['pos\\u200b'\] that are not in the configured label_names "
                                         r"\['neg', 'ne\\u2060g', 'pos'\] \(they only look listed: 'pos\\u200b' and "
                                         r"'pos' differ by invisible characters: U\+200B ZERO WIDTH SPACE in the first "
                                         r"only\).*"
                                         r"or set normalize_labels: nfkc to fold them"):
        data = TextClassificationData(train=train, label_names=["neg", "ne\u2060g", "pos"])
        data.targets(data.raw("train"), "train")


def test_entity_types_that_print_alike_are_named_and_may_be_folded(tmp_path):
    """CoNLL tags whose entity types differ by an invisible character (B-PER and B-PER with a zero-width space): named
    in a warning with the code point; normalize_labels: nfkc makes them one type."""
    from trunk.datamodules import TokenClassificationData

    path = tmp_path / "train.conll"
    path.write_text("Anna B-PER\nlives O\n\nBoris B-PER\u200b\nleft O\n\nOslo B-LOC\nis O\n\n")
    with pytest.warns(UserWarning, match=r"the labels \[\['PER', 'PER\\u200b'\]\] print alike.*U\+200B ZERO WIDTH "
                                         r"SPACE"):
        assert TokenClassificationData(train=str(path)).label_names == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER",
                                                                        "B-PER\u200b", "I-PER\u200b"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TokenClassificationData(train=str(path), normalize_labels="nfkc").label_names == [
            "O", "B-LOC", "I-LOC", "B-PER", "I-PER"]


def test_a_stored_head_or_label_map_whose_labels_only_look_like_the_data_s_names_the_difference():
    """A stored head trained on 'pos' meets data labelled 'pos' with a zero-width space: the refusal says how they
    differ; model.label_map naming a label that only looks like one does too (it would have been ignored)."""
    from trunk.core.contract import TaskSpec
    from trunk.models import TrunkConfig, build_trunk
    from trunk.tasks import SequenceClassification

    trunk = build_trunk(TrunkConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=8))

    def objective(labels):
        built = SequenceClassification()
        built.build("sentiment", trunk, TaskSpec(label_names=labels))
        return built

    state = objective(["neg", "pos"]).head_state()
    with pytest.raises(ValueError, match=r"trained on the labels \['neg', 'pos'\], but this run's data has \['neg', "
                                         r"'pos\\u200b'\] \(some only look the same: 'pos\\u200b' and 'pos' differ by "
                                         r"invisible characters: U\+200B ZERO WIDTH SPACE in the first only\)"):
        objective(["neg", "pos\u200b"]).load_head(state, ["neg", "pos"], False, "stored")
    with pytest.raises(ValueError, match=r"model.label_map's keys \['good\\u200b'\] are not among this task's labels "
                                         r"\['bad', 'good'\] \(they only look so: 'good\\u200b' and 'good' differ"):
        objective(["bad", "good"]).load_head(state, ["neg", "pos"], False, "stored",
                                             label_map={"bad": "neg", "good\u200b": "pos"})
    with pytest.raises(ValueError, match=r"model.label_map's values \['positive'\] are not among the stored head's"):
        objective(["bad", "good"]).load_head(state, ["neg", "pos"], False, "stored",
                                             label_map={"bad": "neg", "good": "positive"})
    how = objective(["bad", "good"]).load_head(state, ["neg", "pos"], False, "stored",
                                               label_map={"bad": "neg", "good": "pos"})
    assert how is None  # mapped one to one


@pytest.mark.parametrize("names, message", [
    (["negative", "negative"], r"label_names lists \['negative'\] more than once"),
    (["negative", "negative "], r"label_names lists \['negative'\] more than once"),  # one name once spaces are dropped
    (["negative", ""], r"label_names has an empty name \(position 2\)"),
])
def test_repeated_or_empty_label_names_are_refused(names, message):
    from trunk.datamodules import ImageClassificationData, MultiLabelTextData, TextClassificationData

    for data in (TextClassificationData, MultiLabelTextData, ImageClassificationData):
        with pytest.raises(ValueError, match=message):
            data(label_names=names)


def test_repeated_label_names_are_refused_from_the_config(tiny_cli_args):
    # an `error:` line from the command
    with pytest.raises(ValueError, match=r"label_names lists \['negative'\] more than once"):
        run_cli([*tiny_cli_args, "--data.tasks.sentiment.label_names=[negative,negative]"], run=False)


# -- task names and options -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["/tmp/elsewhere", "../up", "a/b", "two words", "1st", "a.b"])
def test_a_task_name_that_is_not_an_identifier_is_refused_before_anything_is_written(name, sentiment_files, tmp_path):
    import yaml

    config = {
        "model": {
            "tasks": {name: {"class_path": "trunk.tasks.SequenceClassification"}},
            "trunk": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64},
        },
        "data": {
            "tasks": {
                name: {
                    "class_path": "trunk.datamodules.TextClassificationData",
                    "init_args": {"train": str(sentiment_files["train"]), "val_fraction": 0.2},
                }
            },
            "tokenizer_vocab_size": 300,
        },
        "trainer": {"max_steps": 1, "default_root_dir": str(tmp_path / "run"), "accelerator": "cpu"},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match=rf"Task names \[{name!r}\] are not identifiers"):
        run_cli(["fit", "--config", str(tmp_path / "run.yaml")])
    assert not (tmp_path / "run").exists() and not Path("/tmp/elsewhere").exists()


@pytest.mark.parametrize(
    "option, message",
    [
        ("--model.trunk.dropout=1.5", r"TrunkConfig.dropout must be a probability in \[0, 1\), got 1.5"),
        ("--model.trunk.attn_dropout=-0.1", r"TrunkConfig.attn_dropout must be a probability in \[0, 1\), got -0.1"),
        ("--model.trunk.layer_norm_eps=0", r"TrunkConfig.layer_norm_eps must be > 0"),
        (
            "--model.tasks.sentiment.init_args.head_dropout=2",
            r"SequenceClassification: head_dropout=2.0 must be a probability in \[0, 1\)",
        ),
    ],
)
def test_options_out_of_range_are_named_where_they_are_declared(option, message, tiny_cli_args):
    with pytest.raises(ValueError, match=message):
        run_cli([*tiny_cli_args, option], run=False)


# -- files a run writes and reads --------------------------------------------------------------------------------------
def test_exported_files_get_the_users_umask_and_an_unreadable_one_is_named(tiny_cli_args, tmp_path):

    fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=2"])
    ckpt = fit.trainer.checkpoint_callback.best_model_path or fit.trainer.checkpoint_callback.last_model_path
    export_main([ckpt, str(tmp_path / "trunk")])
    mask = os.umask(0)
    os.umask(mask)
    for path in (tmp_path / "trunk").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, path.name


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file, whatever its mode")
def test_a_file_this_user_cannot_read_is_named_with_the_fix(tiny_cli_args, tmp_path):
    from trunk.cli import export_main
    from trunk.formats.trunk_dir import load_pretrained

    fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=2"])
    export_main([fit.trainer.checkpoint_callback.last_model_path, str(tmp_path / "trunk")])
    weights = tmp_path / "trunk" / "model.safetensors"
    weights.chmod(0)
    with pytest.raises(
        PermissionError, match=r"is there but this user cannot read it \(its mode is ----------\).*chmod a\+r"
    ):
        load_pretrained(tmp_path / "trunk")


# -- which weights a command evaluates
# ----------------------------------------------------------------------------------
def test_last_and_best_name_the_runs_own_checkpoints_for_every_subcommand(tiny_cli_args, tmp_path):
    fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_epochs=2"])
    [last] = (tmp_path / "run").rglob("last.ckpt")
    best = fit.trainer.checkpoint_callback.best_model_path
    assert best and Path(best) != last
    for which, path in (("last", str(last)), ("best", best)):
        named = run_cli(["validate", *tiny_cli_args, f"--ckpt_path={which}"])
        assert named.config.validate.ckpt_path == path
        explicit = run_cli(["validate", *tiny_cli_args, f"--ckpt_path={path}"]).trainer.callback_metrics
        assert named.trainer.callback_metrics["val/sentiment/acc"] == explicit["val/sentiment/acc"]
    predicted = run_cli(["predict", *tiny_cli_args, "--ckpt_path=best", f"--predictions.output={tmp_path / 'out'}"])
    assert predicted.config.predict.ckpt_path == best
    elsewhere = [a for a in tiny_cli_args if "default_root_dir" not in a] + [
        f"--trainer.default_root_dir={tmp_path / 'none'}"
    ]
    for subcommand in ("test", "predict"):
        with pytest.raises(SystemExit, match=r"--ckpt_path last: no last.ckpt under .*none'"):
            run_cli([subcommand, *elsewhere, "--ckpt_path=last"])


def test_with_weight_averaging_the_test_after_fit_scores_the_averaged_weights_the_checkpoint_holds(
    tiny_cli_args, tmp_path
):
    """Lightning's EMA callback restores a checkpoint's raw weights when it loads one; `trunk fit`'s own test must score
    what the checkpoint stands for (its state_dict: the average), as `trunk test --ckpt_path` does in a new process."""
    ema = ["--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging", "--trainer.callbacks.decay=0.9"]
    fit = run_cli(["fit", *tiny_cli_args, *ema, "--trainer.max_epochs=2"])
    best = fit.trainer.checkpoint_callback.best_model_path
    after_fit = {k: float(v) for k, v in fit.trainer.callback_metrics.items() if k.startswith("test/")}
    alone = {
        k: float(v)
        for k, v in run_cli(["test", *tiny_cli_args, f"--ckpt_path={best}"]).trainer.callback_metrics.items()
    }
    assert after_fit and all(alone[k] == pytest.approx(v, abs=1e-6) for k, v in after_fit.items())
    raw = torch.load(best, weights_only=True)
    # they differ
    assert any(not torch.equal(raw["state_dict"][k], raw["current_model_state"][k]) for k in raw["state_dict"])


def test_a_run_that_takes_no_step_tests_nothing(tiny_cli_args):
    with pytest.warns(UserWarning, match="No training step was taken, so the test splits are not evaluated"):
        fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_epochs=0"])
    assert not any(key.startswith("test/") for key in fit.trainer.callback_metrics)


# -- what a run prints
# ------------------------------------------------------------------------------------------------------
def test_one_switch_turns_off_every_progress_bar_and_no_library_notice_is_printed(tiny_cli_args, tmp_path):
    """trainer.enable_progress_bar=false silences datasets' bars (reading, tokenizing) and the tokenizer trainer's too;
    no deprecation notice of a library Trunk uses reaches the user."""
    bars = ("examples/s]", "it/s]", "━")
    quiet = trunk("fit", *tiny_cli_args, "--trainer.max_steps=2", cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    # rich's tables
    lines = [line for line in (quiet.stderr + quiet.stdout).splitlines() if not line.startswith(("┏", "┡", "└"))]
    assert not [bar for bar in bars for line in lines if bar in line], quiet.stderr[-3000:]
    assert "Deprecat" not in quiet.stderr, quiet.stderr
    shown = [a for a in tiny_cli_args if "enable_progress_bar" not in a and "default_root_dir" not in a]
    # another tokenizer, so that the text is encoded again (bars shown): smaller than the text's 296 pieces, not larger
    loud = trunk(
        "fit",
        *shown,
        "--trainer.max_steps=2",
        "--data.tokenizer_vocab_size=250",
        f"--trainer.default_root_dir={tmp_path / 'b'}",
        cwd=tmp_path,
    )
    assert loud.returncode == 0 and "examples/s]" in loud.stderr, loud.stderr[-2000:]


def test_evaluating_with_the_training_config_leaves_the_training_run_alone(tiny_cli_args, tmp_path):
    """test / validate / predict with the training config: no new training version, no checkpoint warnings; test and
    validate metrics in folders of their own, predict in none."""
    args = [
        *tiny_cli_args,
        "--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.monitor=val/score",
        "--trainer.callbacks.mode=max",
        "--trainer.callbacks.save_last=true",
    ]
    run_cli(["fit", *args])
    run = tmp_path / "run"
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for subcommand in ("test", "validate", "predict"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_cli([subcommand, *args, "--ckpt_path=best", f"--predictions.output={tmp_path / 'out'}"])
        noise = [
            str(w.message)
            for w in caught
            if "dirpath has changed" in str(w.message) or "won't be reloaded" in str(w.message)
        ]
        assert not noise, noise
    after = sorted(
        p.relative_to(run) for p in run.rglob("*") if p.relative_to(run).parts[0] not in ("test", "validate")
    )
    assert after == before  # the training run's folder as it was
    assert "test/sentiment/acc" in (run / "test" / "version_0" / "metrics.csv").read_text()
    assert "val/sentiment/acc" in (run / "validate" / "version_0" / "metrics.csv").read_text()
    assert not (run / "predict").exists()


# -- files as they ship
# -----------------------------------------------------------------------------------------------------
def test_an_unlabelled_test_file_gets_one_message_and_predicts_as_it_is(tiny_cli_args, sentiment_files, tmp_path):
    """GLUE-style test files: labels -1, or no label column at all (with an index column). Evaluating them is one
    message, the same for files and the hub; `trunk predict` takes them unchanged."""
    import csv

    with sentiment_files["test"].open() as f:
        texts = [row["text"] for row in csv.DictReader(f)]
    minus_one = write_rows(tmp_path / "minus_one.tsv", [{"text": t, "label": -1} for t in texts])
    no_column = write_rows(tmp_path / "no_column.tsv", [{"index": i, "text": t} for i, t in enumerate(texts)])
    fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=2"])
    ckpt = fit.trainer.checkpoint_callback.best_model_path
    for hidden, why in (
        (minus_one, "has no labels: every row's 'label' is -1 or empty"),
        (no_column, "has no column 'label'"),
    ):
        with pytest.raises(
            ValueError
        ) as raised:  # printed as one `error:` line by the command (test_cli: a data error is one line)
            run_cli(["test", *tiny_cli_args, f"--data.tasks.sentiment.test={hidden}", f"--ckpt_path={ckpt}"])
        assert why in str(raised.value)
        assert f"predict this one with `trunk predict --ckpt_path CKPT --data.tasks.sentiment.predict={hidden}`" in str(
            raised.value
        )
        out = tmp_path / f"{hidden.stem}.jsonl"
        run_cli(["predict", *tiny_cli_args, f"--data.tasks.sentiment.predict={hidden}", f"--ckpt_path={ckpt}",
                 f"--predictions.output={out}"])
        assert len(out.read_text().splitlines()) == len(texts)


@pytest.mark.parametrize(
    "truncation, first, second", [("longest_first", 10, 11), ("only_first", 1, 20), ("only_second", 20, 1)]
)
def test_the_side_of_a_pair_that_is_cut_is_chosen_and_reported(truncation, first, second, tmp_path):
    from trunk.datamodules import MultiTaskData, TextClassificationData

    rows = [{"premise": "a " * 20, "hypothesis": "b " * 20, "label": i % 2} for i in range(8)]
    member = TextClassificationData(train=str(write_rows(tmp_path / "pairs.csv", rows)), text_column="premise",
                                    text_pair_column="hypothesis", max_length=24, truncation=truncation)
    data = MultiTaskData({"nli": member}, tokenizer_vocab_size=300)
    with pytest.warns(
        UserWarning,
        match=rf"8 of 8 examples .* truncated \(pairs lose tokens from .*data.tasks.nli.truncation={truncation}\)",
    ):
        data.setup("fit")
    ids = member._encoded["train"]["input_ids"][0]
    a, b = member.tokenizer.token_to_id("a"), member.tokenizer.token_to_id("b")
    assert (ids.count(a), ids.count(b)) == (first, second)  # 24 = [CLS] + a's + [SEP] + b's + [SEP]


def test_a_pair_whose_kept_side_alone_is_too_long_is_named(tmp_path):
    from trunk.datamodules import MultiTaskData, TextClassificationData

    rows = [{"premise": "a " * 30, "hypothesis": "b", "label": i % 2} for i in range(8)]
    member = TextClassificationData(train=str(write_rows(tmp_path / "pairs.csv", rows)), text_column="premise",
                                    text_pair_column="hypothesis", max_length=24, truncation="only_second")
    with pytest.raises(
        ValueError, match=r"data.tasks.nli.train: with data.tasks.nli.truncation=only_second, a pair's other text alone"
    ):
        MultiTaskData({"nli": member}, tokenizer_vocab_size=300).setup("fit")


def paraphrase_recipe(tmp_path: Path, pair_column: str) -> Path:
    """A recipe for pairs laid out as the paraphrase corpus ships them: a byte-order mark, then columns whose names
    start with '#' (``Quality``, ``#1 ID``, ``#2 ID``, ``#1 String``, ``#2 String``); ``pair_column``: that option's
    YAML."""
    rows = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + [
        f"{i % 2}\t{i}\t{100 + i}\tthe cat number {i} sat on the mat .\tthe mat had a cat on it , he said"
        for i in range(16)]
    (tmp_path / "pairs.tsv").write_text("\ufeff" + "\n".join(rows) + "\n", encoding="utf-8")
    recipe = tmp_path / "pairs.yaml"
    recipe.write_text(f"""model:
  trunk: {{d_model: 32, n_layers: 1, n_heads: 4, d_ff: 64, max_len: 64}}
  tasks:
    paraphrase: trunk.tasks.SequenceClassification
data:
  tokenizer_vocab_size: 200
  tasks:
    paraphrase:
      class_path: trunk.datamodules.TextClassificationData
      init_args:
        train: {tmp_path / 'pairs.tsv'}
        text_column: "#1 String"
        text_pair_column: {pair_column}
        label_column: Quality
        max_length: 64
trainer:
  default_root_dir: {tmp_path / 'run'}
""")
    return recipe


def test_a_pair_column_whose_name_starts_with_a_hash_stays_a_pair(tmp_path):
    """jsonargparse read a ``str | None`` option's value as YAML, and YAML reads '#2 String' as a comment: the second
    column became None and the pairs trained as single sentences, silently (the paraphrase set that trailed the
    Trainer by 24 points of MCC). Quoted in the file, or given on the command line, the name now stays the name."""
    for args in ([], ["--data.tasks.paraphrase.init_args.text_pair_column=#2 String"]):
        cli = run_cli(["--config", str(paraphrase_recipe(tmp_path, '"#2 String"' if not args else "null")), *args],
                      run=False)
        member = cli.datamodule.tasks["paraphrase"]
        assert member.text_pair_column == "#2 String"
        cli.datamodule.setup("fit")
        batch = member.make_batch("train", list(range(16)), train=False)
        separators = (batch["input_ids"] == member.tokenizer.token_to_id("[SEP]")).sum(1)
        assert separators.tolist() == [2] * 16  # [CLS] first [SEP] second [SEP]: both sentences, every row
        assert batch["labels"].tolist() == [i % 2 for i in range(16)]


def test_a_value_yaml_reads_as_a_comment_is_named_with_the_fix(tmp_path):
    """Unquoted in the file, ``text_pair_column: #2 String`` is YAML for null (the text a comment): one line that says
    so and how to quote it, before anything is built."""
    result = trunk("fit", "--config", str(paraphrase_recipe(tmp_path, "#2 String")), cwd=tmp_path)
    line = one_line_error(result)
    assert "line 13: text_pair_column: #2 String is a YAML comment" in line
    assert 'text_pair_column: "#2 String"' in line


@pytest.mark.parametrize("option", ["text_column", "label_column"])
def test_a_column_option_set_to_null_is_named_not_a_traceback(option, tmp_path):
    """The parser passes a null into a task's options unchecked (``text_column: null``, or an unquoted '#' value in a
    file the recipe check does not see): the option is named before any file is read."""
    recipe = paraphrase_recipe(tmp_path, '"#2 String"')
    with pytest.raises(ValueError, match=rf"data.tasks.paraphrase.{option} is null, and it needs a value \(str"):
        run_cli(["--config", str(recipe), f"--data.tasks.paraphrase.init_args.{option}=null"], run=False)


def test_a_recipe_names_its_task_once_and_its_run_folder_follows_the_file_name(sentiment_files, tmp_path, monkeypatch):
    """No default_root_dir or logger in the recipe and the checkpoint on val/score: the run folder follows the config
    file's name, so renaming the task is the only edit."""
    import yaml

    config = {
        "model": {
            "tasks": {"reviews": {"class_path": "trunk.tasks.SequenceClassification"}},
            "trunk": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64, "max_len": 64},
        },
        "data": {
            "tasks": {
                "reviews": {
                    "class_path": "trunk.datamodules.TextClassificationData",
                    "init_args": {"train": str(sentiment_files["train"]), "val_fraction": 0.2, "max_length": 64},
                }
            },
            "tokenizer_vocab_size": 300,
        },
        "trainer": {
            "max_epochs": 2,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"monitor": "val/score", "mode": "max", "save_last": True},
                }
            ],
        },
    }
    (tmp_path / "movie_reviews.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "short.yaml").write_text(yaml.safe_dump({"trainer": {"max_epochs": 1}}))  # a preset after the recipe
    monkeypatch.chdir(tmp_path)
    fit = run_cli(["fit", "--config", "movie_reviews.yaml", "--config", "short.yaml"])
    callback = fit.trainer.checkpoint_callback
    assert Path(callback.best_model_path).resolve().is_relative_to((tmp_path / "runs" / "movie_reviews").resolve())
    assert (
        tmp_path / "runs" / "movie_reviews" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    ).is_file()


# -- resuming
# --------------------------------------------------------------------------------------------------------------
def test_a_resume_refuses_other_batches_names_unused_model_changes_and_keeps_the_first_config(tiny_cli_args, tmp_path):
    run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=3"])
    with pytest.raises(
        SystemExit,
        match=r"other batches .*data.data_tasks.sentiment.init_args.batch_size: 32 -> 16.* --model.init_from=",
    ):
        run_cli(
            ["fit", *tiny_cli_args, "--trainer.max_steps=6", "--data.tasks.sentiment.batch_size=16", "--ckpt_path=last"]
        )
    with pytest.warns(UserWarning, match=r"changes to them are not used: model.optimizer.lr: 0.0005 -> 0.01"):
        run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=5", "--model.optimizer.lr=0.01", "--ckpt_path=last"])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*changes to them are not used.*")
        # the same config: no note
        resumed = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=7", "--ckpt_path=last"])
    assert resumed.trainer.global_step == 7
    version = tmp_path / "run" / "lightning_logs" / "version_0"
    assert sorted(p.name for p in version.glob("config*.yaml")) == [
        "config.resume1.yaml",
        "config.resume2.yaml",
        "config.yaml",
    ]
    assert "max_steps: 3" in (version / "config.yaml").read_text()  # the first run's, as written
    lines = (version / "metrics.csv").read_text().splitlines()
    assert len(lines) > 2 and lines[0].startswith(("epoch", "lr-", "perf", "step", "train", "val"))  # the history, kept


def test_a_run_folder_moved_before_its_resume_keeps_its_best_checkpoint(tiny_cli_args, tmp_path):
    # every validation scores the same on this tiny data: only a strictly better one may replace the best (step 2's)
    best = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"monitor": "val/score", "mode": "max", "save_last": True, "filename": "best-{step}"}}
    options = [option for option in tiny_cli_args if not option.startswith("--trainer.default_root_dir")]
    options += ["--trainer.val_check_interval=2", "--trainer.limit_val_batches=2", f"--trainer.callbacks+={best}"]
    run_cli(["fit", *options, "--trainer.max_steps=6", f"--trainer.default_root_dir={tmp_path / 'before'}"])
    shutil.move(tmp_path / "before", tmp_path / "after")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*dirpath has changed.*")
        resumed = run_cli(["fit", *options, "--trainer.max_steps=8", f"--trainer.default_root_dir={tmp_path / 'after'}",
                           "--ckpt_path=last"])
    checkpoints = tmp_path / "after" / "lightning_logs" / "version_0" / "checkpoints"
    callback = resumed.trainer.checkpoint_callback
    assert resumed.trainer.global_step == 8 and callback.best_model_score is not None
    assert Path(callback.best_model_path) == checkpoints / "best-step=2.ckpt"
    assert sorted(path.name for path in checkpoints.glob("best-*.ckpt")) == ["best-step=2.ckpt"]  # top-1 kept


def test_resuming_a_run_from_pretrained_weights_names_no_shape_change(tiny_cli_args, tiny_trunk_dir, tmp_path):
    # the config's trunk shape (the tiny defaults here: learned positions) is not what ran: init_from's weights gave
    # theirs (rope), so on resume it is no change of the config's; a real change is still named
    pretrained = [*tiny_cli_args, f"--model.init_from={tiny_trunk_dir}", "--data.tokenizer=null"]
    run_cli(["fit", *pretrained, "--trainer.max_steps=3"])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*changes to them are not used.*")
        resumed = run_cli(["fit", *pretrained, "--trainer.max_steps=5", "--ckpt_path=last"])
    assert resumed.trainer.global_step == 5 and resumed.model.trunk_config.positions == "rope"
    with pytest.warns(UserWarning, match=r"changes to them are not used: model.optimizer.lr: 0.0005 -> 0.01\. "):
        run_cli(["fit", *pretrained, "--trainer.max_steps=6", "--model.optimizer.lr=0.01", "--ckpt_path=last"])
    # a shape of its own that cannot fit the weights' (64 heads of their width of 32) is named, not a traceback
    unset_width = [option for option in pretrained if not option.startswith("--model.trunk.d_model")]
    with pytest.warns(UserWarning, match=r"changes to them are not used: .*model.trunk.n_heads: 4 -> 64"):
        run_cli(["fit", *unset_width, "--trainer.max_steps=7", "--model.trunk.n_heads=64", "--ckpt_path=last"])


# -- faults
# -------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs: a real disk that fills up (needs the right to mount, as root in a container)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_checkpoint(tiny_cli_args, small_disk, tmp_path):
    from trunk.core.checkpoint import load_checkpoint

    args = [a for a in tiny_cli_args if "default_root_dir" not in a] + [
        f"--trainer.default_root_dir={small_disk / 'run'}",
        "--fault_tolerance.save_every_steps=2",
    ]
    assert trunk("fit", *args, "--trainer.max_steps=2", cwd=tmp_path).returncode == 0
    [last] = (small_disk / "run").rglob("last.ckpt")
    before = last.read_bytes()
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - 64 * 1024))  # the disk as good as full
    result = trunk("fit", *args, "--trainer.max_steps=6", "--ckpt_path=last", cwd=tmp_path)
    line = one_line_error(result)
    assert (
        f"The disk holding '{last.parent}' is full" in line
        and "the previous 'last.ckpt' there is kept as it was" in line
    ), line
    assert last.read_bytes() == before and load_checkpoint(last)["global_step"] == 2
    assert not [p for p in last.parent.iterdir() if ".tmp" in p.name]  # no partial file left taking the space


def test_a_split_shipped_as_several_files_is_read_as_one_from_a_list_or_a_pattern(tmp_path):
    """A dev set shipped as in-domain + out-of-domain files: a list of paths or a glob, the same for every kind of
    text data; files with other columns are named."""
    import random

    from conftest import ner_sentence, write_conll

    from trunk.datamodules import MultiTaskData, TextClassificationData, TokenClassificationData

    rows = [{"text": f"text {i}", "label": ["a", "b"][i % 2]} for i in range(30)]
    files = [write_rows(tmp_path / f"dev_{part}.csv", rows[i::3]) for i, part in enumerate(("in", "out", "more"))]
    listed = TextClassificationData(train=[str(f) for f in files])
    pattern = TextClassificationData(train=str(tmp_path / "dev_*.csv"))
    assert len(listed.raw("train")) == len(pattern.raw("train")) == 30
    assert listed.raw("train")["text"][:10] == [r["text"] for r in rows[0::3]]  # the list's order
    # the pattern's matches sorted: in, more, out
    assert pattern.raw("train")["text"][10:20] == [r["text"] for r in rows[2::3]]
    rng = random.Random(0)
    conll = [str(write_conll(tmp_path / f"ner_{i}.txt", [ner_sentence(rng) for _ in range(5)])) for i in range(2)]
    tagged = TokenClassificationData(train=conll, validation=str(tmp_path / "ner_*.txt"))
    MultiTaskData({"ner": tagged}, tokenizer_vocab_size=200).setup("fit")
    assert tagged.size("train") == tagged.size("validation") == 10
    write_rows(tmp_path / "dev_odd.csv", [{"sentence": "x", "label": "a"}])
    with pytest.raises(
        ValueError, match=r"'.*dev_odd.csv' has the columns \['sentence', 'label'\], but .* the files of one split"
    ):
        TextClassificationData(train=str(tmp_path / "dev_*.csv")).raw("train")
    with pytest.raises(FileNotFoundError, match=r"no file matches the pattern '.*nothing_\*.csv'"):
        TextClassificationData(train=str(tmp_path / "nothing_*.csv")).raw("train")


def test_a_split_of_several_domains_reports_each_files_metrics_and_the_whole(tiny_cli_args, tmp_path):
    """metrics_per_file: validation read from an in-domain and an out-of-domain file logs val/<task>/<file>/<metric>
    for each, computed in the same pass; the task's own metric is over both files together."""
    import random

    rng = random.Random(0)
    words = {"positive": ["good", "great", "fine", "lovely"], "negative": ["bad", "awful", "poor", "dull"]}

    def rows(n: int, flip: bool = False) -> list[dict]:
        out = []
        for _ in range(n):
            label = rng.choice(["positive", "negative"])
            said = {"positive": "negative", "negative": "positive"}[label] if flip else label
            out.append({"text": f"the film was {rng.choice(words[said])}", "label": label})
        return out

    train, dev_in, dev_out = (write_rows(tmp_path / f"{name}.csv", r) for name, r in
                              (("train", rows(256)), ("dev_in", rows(40)), ("dev_out", rows(24, flip=True))))
    args = [*tiny_cli_args, f"--data.tasks.sentiment.train={train}", f"--data.tasks.sentiment.test={dev_in}",
            f"--data.tasks.sentiment.validation=[{dev_in},{dev_out}]", "--data.tasks.sentiment.metrics_per_file=true",
            "--trainer.max_epochs=6", "--model.optimizer.lr=3e-3"]
    run_cli(["fit", *args])
    metrics = run_cli(["validate", *args, "--ckpt_path=last"]).trainer.callback_metrics
    whole, inside, outside = (metrics[f"val/sentiment/{key}acc"].item() for key in ("", "dev_in/", "dev_out/"))
    assert inside > 0.9 and outside < 0.1  # the out-of-domain file says the opposite of what it means
    assert whole == pytest.approx((40 * inside + 24 * outside) / 64, abs=1e-6)
    assert "val/sentiment/dev_out/f1_macro" in metrics and "val/sentiment/dev_in/loss" in metrics


def test_a_config_file_that_would_silently_drop_the_recipes_tasks_is_refused(tiny_cli_args, tmp_path):
    """jsonargparse replaces a dict given by a later config file: a preset adding a task must not drop the recipe's."""
    import yaml

    recipe = {
        "model": {"tasks": {"reviews": {"class_path": "trunk.tasks.SequenceClassification"}}},
        "data": {
            "tasks": {
                "reviews": {"class_path": "trunk.datamodules.TextClassificationData", "init_args": {"train": "x.csv"}}
            }
        },
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (tmp_path / "aux.yaml").write_text(
        yaml.safe_dump(
            {
                "model": {"tasks": {"mlm": {"class_path": "trunk.tasks.MaskedLanguageModeling"}}},
                "data": {
                    "tasks": {"mlm": {"class_path": "trunk.datamodules.CorpusData", "init_args": {"train": "x.txt"}}}
                },
            }
        )
    )
    with pytest.raises(
        SystemExit,
        match=r"aux.yaml sets model.tasks, which replaces the model.tasks of .*recipe.yaml whole .* so "
        r"\['reviews'\] would not be trained",
    ):
        run_cli(["--config", str(tmp_path / "recipe.yaml"), "--config", str(tmp_path / "aux.yaml")], run=False)


def test_predictions_never_replace_a_file_unasked_nor_an_input_of_the_run(tiny_cli_args, sentiment_files, tmp_path):
    """An existing output file is kept unless predictions.overwrite=true; the checkpoint in use and the data files are
    never written over, even then; an output that cannot be written fails before any prediction, leaving nothing."""
    ckpt = run_cli(["fit", *tiny_cli_args]).trainer.checkpoint_callback.best_model_path
    predict = ["predict", *tiny_cli_args, f"--ckpt_path={ckpt}"]
    out = tmp_path / "mine.jsonl"
    out.write_text("my own notes\n")
    with pytest.raises(FileExistsError, match=r"predictions.output='.*mine.jsonl' exists: Trunk never replaces a file "
                                              r"without being told to.*predictions.overwrite=true"):
        run_cli([*predict, f"--predictions.output={out}"])
    assert out.read_text() == "my own notes\n"
    run_cli([*predict, f"--predictions.output={out}", "--predictions.overwrite=true"])
    assert len(out.read_text().splitlines()) == 64
    before = {path: path.read_bytes() for path in (Path(ckpt), sentiment_files["test"], sentiment_files["train"])}
    for path in before:
        with pytest.raises(ValueError, match=r"is '.*', which this run reads: writing there would lose it"):
            run_cli([*predict, f"--predictions.output={path}", "--predictions.overwrite=true"])
    assert all(path.read_bytes() == data for path, data in before.items())
    (tmp_path / "a_file").write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    for bad, message in ((tmp_path / "a_file" / "out.jsonl", "cannot create files in"),
                         (tmp_path, "is a directory: give a file path")):
        with pytest.raises((ValueError, PermissionError), match=message):
            run_cli([*predict, f"--predictions.output={bad}"])
    if os.geteuid() != 0:  # root writes anywhere
        with pytest.raises(PermissionError, match="cannot create files in"):
            run_cli([*predict, f"--predictions.output={locked / 'out.jsonl'}"])
    assert not [p for p in tmp_path.rglob(".*.tmp*")]  # no temporary file left


def test_each_output_has_one_writer_the_second_is_refused_naming_the_first(tiny_cli_args, tmp_path):
    """While another process writes an output (a prediction file, an export's or import's folder, a benchmark's
    ledger), a second writer is refused naming it, writing nothing; once that process is gone (killed here), the output
    is free at once. A prediction output naming a folder that does not exist (a trailing /) is refused."""
    from conftest import REPO

    from trunk.cli.import_model import import_main

    sys.path.insert(0, str(REPO / "benchmarks"))
    from ledger import Ledger

    ckpt = run_cli(["fit", *tiny_cli_args]).trainer.checkpoint_callback.best_model_path
    predict = ["predict", *tiny_cli_args, f"--ckpt_path={ckpt}"]
    out, folder, ledger = tmp_path / "out.jsonl", tmp_path / "exported", tmp_path / "runs" / "results.jsonl"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom trunk.core.locks import hold_output\n"
         "for path in sys.argv[1:]: hold_output(Path(path), 'x')\nprint('held', flush=True)\ntime.sleep(600)",
         str(out), str(folder), str(ledger)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        by = rf"is being written by process {holder.pid} on .* \(since .*\): two writers would leave only one's output"
        with pytest.raises(FileExistsError, match=rf"predictions.output='.*out.jsonl' {by}"):
            run_cli([*predict, f"--predictions.output={out}"])
        for write, args in ((export_main, [ckpt, str(folder)]), (import_main, [str(tmp_path / "hf"), str(folder)])):
            with pytest.raises(SystemExit, match=rf"error: DIR='.*exported' {by}"):
                write(args)
        with pytest.raises(FileExistsError, match=rf"the ledger='.*results.jsonl' {by}"):
            Ledger(ledger.parent).find({"seed": 1})
        assert Ledger(ledger.parent).records() == []  # reading is free
        assert not out.exists() and not folder.exists() and not ledger.exists()
    finally:
        holder.kill()
        holder.wait()
    run_cli([*predict, f"--predictions.output={out}"])  # a killed writer frees its output at once
    export_main([ckpt, str(folder)])
    assert len(out.read_text().splitlines()) == 64 and (folder / "config.json").is_file()
    assert not [p for p in tmp_path.glob(".*.trunk.lock")]  # each writer's lock went with it (the killed one's too)
    with pytest.raises(ValueError, match=r"predictions.output='.*new/' names a directory: give a file path "
                                         r"\(.*new/predictions.jsonl\)"):
        run_cli([*predict, f"--predictions.output={tmp_path / 'new'}/"])
    assert not (tmp_path / "new").exists()


def test_export_onto_a_link_writes_where_it_points_and_leaves_nothing_behind(tiny_cli_args, tmp_path):
    """``trunk export CKPT current`` with ``current`` a link to a trunk directory: the link stays a link, the directory
    it points to holds the new export, and no hidden file is left in either folder; a link to nothing yet is created
    where it points."""
    from trunk.formats.trunk_dir import load_pretrained

    ckpt = run_cli(["fit", *tiny_cli_args]).trainer.checkpoint_callback.best_model_path
    (tmp_path / "exports").mkdir()
    target, link = tmp_path / "exports" / "v1", tmp_path / "current"
    export_main([ckpt, str(target), "--trunk-only"])
    link.symlink_to(target)
    export_main([ckpt, str(link), "--overwrite"])  # with the heads this time
    assert link.is_symlink() and link.resolve() == target and load_pretrained(link).heads
    dangling = tmp_path / "next"
    dangling.symlink_to(tmp_path / "exports" / "v2")
    export_main([ckpt, str(dangling)])
    assert dangling.is_symlink() and load_pretrained(tmp_path / "exports" / "v2").heads
    hidden = [p.name for folder in (tmp_path, tmp_path / "exports") for p in folder.iterdir() if p.name.startswith(".")]
    assert not hidden


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_evaluating_without_trained_weights_is_refused(command, tiny_cli_args, tmp_path):
    """No --ckpt_path and no init_from: the model would be random; nothing is scored, nothing written."""
    with pytest.raises(SystemExit, match=rf"trunk {command} needs trained weights: pass --ckpt_path .* or "
                                         r"--model.init_from .* random weights"):
        run_cli([command, *tiny_cli_args, f"--predictions.output={tmp_path / 'out.jsonl'}"] if command == "predict"
                else [command, *tiny_cli_args])
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_texts_that_spell_missing_values_are_texts_and_an_empty_cell_is_named_by_row(suffix, tmp_path):
    """'NA', 'None', 'null', 'nan' are words (a film called Nan, a reply 'None'), not missing cells; a cell that is
    really empty is refused with its row."""
    from trunk.datamodules import TextClassificationData
    from trunk.datamodules.sources import load_split

    words = ["NA", "None", "null", "nan", "N/A", "NULL"]
    rows = [{"text": word, "label": "pos" if i % 2 else "neg"} for i, word in enumerate(words * 3)]
    path = write_rows(tmp_path / f"train{suffix}", rows)
    assert load_split(None, None, str(path), "data.train")["text"] == words * 3
    rows[4]["text"], rows[9]["text"] = "", ""
    path = write_rows(tmp_path / f"gaps{suffix}", rows)
    data = TextClassificationData(train=str(path))
    with pytest.raises(ValueError, match=r"column 'text' is empty in rows 5, 10 \(counting data rows from 1"):
        data.encode(data.raw("train"), "train")


def test_an_unusable_cache_a_giant_word_and_a_broken_task_directory_are_said_in_words(tiny_cli_args, tmp_path,
                                                                                      monkeypatch):
    """TRUNK_CACHE that is a file: the run goes on uncached, saying so once; a word of a million characters is left
    out of tokenizer training (which it would keep busy for minutes), saying so; a task directory whose config.json
    is broken is named as such beside its trunk, not counted as a second trunk."""
    from trunk.datamodules.tokenizer import cached_tokenizer
    from trunk.tasks import load

    (tmp_path / "cache_file").write_text("not a folder")
    monkeypatch.setenv("TRUNK_CACHE", str(tmp_path / "cache_file"))
    with pytest.warns(UserWarning, match=r"cache '.*cache_file' cannot be used \(.*\): this run caches nothing.*"
                                         r"Point TRUNK_CACHE at a folder you can write to"):
        cli = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=2"])
    assert cli.trainer.global_step == 2
    monkeypatch.setenv("TRUNK_CACHE", str(tmp_path / "cache"))
    giant = "x" * 1_000_000
    start = time.monotonic()
    tokenizer = cached_tokenizer(["giant"], lambda: [f"a small text {giant} and more", "the cat sat"] * 50, "bpe", 200,
                                 True, min_frequency=1)
    assert time.monotonic() - start < 30 and tokenizer.get_vocab_size() < 200
    ckpt = cli.trainer.checkpoint_callback.last_model_path or cli.trainer.checkpoint_callback.best_model_path
    export_main([ckpt, str(tmp_path / "trunk"), "--trunk-only"])
    export_main([ckpt, str(tmp_path / "task"), "--task", "sentiment"])
    (tmp_path / "task" / "config.json").write_text('{"format": "trunk-task", ')
    with pytest.raises(ValueError, match=r"task/config.json' is not valid JSON .* neither a trunk nor a task"):
        load([tmp_path / "trunk", tmp_path / "task"])


def test_the_last_validations_warnings_are_said_again_at_the_end_of_the_run(tiny_cli_args, monkeypatch):
    """In fit, a task's validation warning is printed once two validations in a row have it (not at every one), and
    the last validation's is said again at the end of the run; a run of one validation says it once, at its end; a
    model that predicts one class at its first validation only (as the quickstart's first epoch) is not warned of."""
    from trunk.tasks import SequenceClassification

    def run(validations: int, degenerate: Callable[[int], bool]) -> list[str]:
        seen = []

        def epoch_warnings(self, stage):
            seen.append(stage)
            return [f"Task '{self.name}': a degenerate validation"] if degenerate(len(seen)) else []

        monkeypatch.setattr(SequenceClassification, "epoch_warnings", epoch_warnings)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_cli(["fit", *tiny_cli_args, f"--trainer.val_check_interval={8 // validations}"])  # 8 batches an epoch
        assert len(seen) == validations
        return [str(w.message) for w in caught if "degenerate validation" in str(w.message)]

    always = run(4, lambda validation: True)
    assert always == ["Task 'sentiment': a degenerate validation",  # at the second validation
                      "At the last validation: Task 'sentiment': a degenerate validation"]
    assert run(1, lambda validation: True) == ["At the last validation: Task 'sentiment': a degenerate validation"]
    assert run(2, lambda validation: validation == 1) == []
    assert run(4, lambda validation: validation in (2, 3)) == ["Task 'sentiment': a degenerate validation"]
