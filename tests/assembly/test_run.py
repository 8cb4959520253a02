"""One owner for a run's facts (trunk.assembly.run.resolve): every entry path matches labels by name, reads a
checkpoint once, and loads without the directory a model was fine-tuned from."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import single_task

from trunk.cli import run_cli
from trunk.tasks import SequenceClassification, load

SWAPPED = "--data.tasks.sentiment.label_names=[positive, negative]"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny sentiment run's best checkpoint and the arguments it was trained with (module-wide: several tests reuse
    it)."""
    import random

    from conftest import TINY_MODEL, write_rows

    from trunk.datamodules.builtin import sentiment_example

    tmp = tmp_path_factory.mktemp("trained")
    rng = random.Random(0)
    files = {split: write_rows(tmp / f"{split}.csv", [sentiment_example(rng) for _ in range(n)])
             for split, n in {"train": 1024, "validation": 64, "test": 64}.items()}
    args = single_task(
        [
            *TINY_MODEL,
            "--data=trunk.datamodules.TextClassificationData",
            f"--data.train={files['train']}",
            f"--data.validation={files['validation']}",
            f"--data.test={files['test']}",
            f"--data.predict={files['test']}",
            "--data.tokenizer_vocab_size=300",
            "--data.max_length=64",
            "--data.batch_size=32",
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
            "--trainer.max_epochs=4",
            "--trainer.precision=32-true",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={tmp / 'run'}",
            "--seed_everything=0",
        ]
    )
    cli = run_cli(["fit", *args])
    return cli.trainer.checkpoint_callback.best_model_path, args, tmp


def test_labels_given_in_another_order_give_the_same_answers_on_every_ckpt_path(trained, tmp_path):
    """The issue's silently wrong answer: test acc 0.9933 became 0.0067 with the label names swapped."""
    ckpt, args, _ = trained
    for command, stage in (("validate", "val"), ("test", "test")):
        plain = run_cli([command, *args, f"--ckpt_path={ckpt}"]).trainer.callback_metrics
        swapped = run_cli([command, *args, f"--ckpt_path={ckpt}", SWAPPED]).trainer.callback_metrics
        assert stage == "test" or abs(plain["val/sentiment/acc"] - 0.5) > 0.05  # not even: swapped ids would show
        for metric in ("acc", "loss"):
            assert swapped[f"{stage}/sentiment/{metric}"].item() == pytest.approx(
                plain[f"{stage}/sentiment/{metric}"].item()
            ), command
    outputs = []
    for extra in ([], [SWAPPED]):
        out = tmp_path / f"predictions{len(extra)}.jsonl"
        run_cli(["predict", *args, f"--ckpt_path={ckpt}", f"--predictions.output={out}", *extra])
        outputs.append([json.loads(line) for line in out.read_text().splitlines()])
    assert outputs[0] == outputs[1] and {r["label"] for r in outputs[0]} <= {"negative", "positive"}


def test_a_resumed_run_keeps_the_trained_label_order(trained, tmp_path):
    ckpt, args, _ = trained
    resumed = [
        run_cli(
            [
                "fit",
                *args,
                f"--ckpt_path={ckpt}",
                "--trainer.max_epochs=5",
                f"--trainer.default_root_dir={tmp_path / str(i)}",
                *extra,
            ]
        )
        for i, extra in enumerate(([], [SWAPPED]))
    ]
    assert resumed[1].model.objectives["sentiment"].label_names == ["negative", "positive"]
    for (name, a), b in zip(resumed[0].model.state_dict().items(), resumed[1].model.state_dict().values()):
        assert torch.equal(a, b), name  # the same batches, the same labels: the same weights


def test_another_label_set_is_a_clear_error_naming_both(trained):
    ckpt, args, _ = trained
    with pytest.raises(
        ValueError,
        match=r"was trained on the labels \['negative', 'positive'\], but data.tasks.sentiment.label_names "
        r"is \['good', 'bad'\]",
    ):
        run_cli(["test", *args, f"--ckpt_path={ckpt}", "--data.tasks.sentiment.label_names=[good, bad]"])
    # names that only print like the trained ones (a capital, a zero-width space) are named as such
    with pytest.raises(ValueError, match=r"is \['Negative', 'positive\\u200b'\] \(they only look the same: "
                                         r".*'Negative'.*U\+200B"):
        run_cli(["test", *args, f"--ckpt_path={ckpt}", "--data.tasks.sentiment.label_names=[Negative, positive\u200b]"])


def test_test_reads_its_checkpoint_once(trained, monkeypatch):
    ckpt, args, _ = trained
    reads = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: reads.append(a[0] if a else k.get("f")) or real(*a, **k))
    run_cli(["test", *args, f"--ckpt_path={ckpt}"])
    assert [str(p) for p in reads] == [ckpt]


def test_the_resolved_config_records_what_ran(trained, tmp_path):
    ckpt, args, _ = trained
    cli = run_cli(
        [
            "fit",
            *args,
            f"--ckpt_path={ckpt}",
            "--trainer.max_epochs=5",
            f"--trainer.default_root_dir={tmp_path}",
            "--model.trunk.max_len=512",
            SWAPPED,
        ]
    )
    saved = next(tmp_path.rglob("config.yaml")).read_text()
    import yaml

    config = yaml.safe_load(saved)
    assert (
        config["model"]["trunk"]["max_len"] == 64
        and config["model"]["trunk"]["vocab_size"] == cli.model.trunk_config.vocab_size
    )
    assert config["data"]["tasks"]["sentiment"]["init_args"]["label_names"] == ["negative", "positive"]


def test_a_fine_tuned_checkpoint_loads_after_its_trunk_directory_is_gone(trained, tmp_path):
    from trunk.cli import export_main

    ckpt, args, _ = trained
    export_main([ckpt, str(tmp_path / "trunk")])
    tuned = run_cli(
        [
            "fit",
            *[a for a in args if not a.startswith(("--model.trunk.", "--trainer.default_root_dir"))],
            f"--model.init_from={tmp_path / 'trunk'}",
            "--trainer.max_epochs=1",
            f"--trainer.default_root_dir={tmp_path / 'tuned'}",
        ]
    )
    best = tuned.trainer.checkpoint_callback.best_model_path
    texts = ["the film was great", "the plot was not good"]
    before = load(best).predict(texts)
    shutil.rmtree(tmp_path / "trunk")
    assert load(best).predict(texts) == before


def test_longer_lengths_are_lowered_to_trained_weights_and_refused_from_scratch(trained, tmp_path):
    """The one length rule (trunk.assembly.run.fit_lengths): trained weights fix the position table."""
    ckpt, args, _ = trained
    cli = run_cli(["validate", *args, f"--ckpt_path={ckpt}", "--data.tasks.sentiment.max_length=100"])
    assert cli.datamodule.tasks["sentiment"].max_length == 64
    with pytest.raises(ValueError, match="max_length=100 is longer than the trunk's max_len=64"):
        run_cli(["fit", *args, "--data.tasks.sentiment.max_length=100"])  # (validate needs weights: refused first)
    assert Path(ckpt).is_file()


def test_a_trunk_without_a_position_table_takes_longer_inputs_and_one_with_a_table_refuses(trained, tmp_path):
    """max_len sizes a learned position table only: from a rotary trunk a run may raise it (and read longer inputs, as
    local attention wants); from a learned one it is refused, naming both values."""
    ckpt, args, _ = trained
    longer = ["--model.trunk.max_len=128", "--data.tasks.sentiment.max_length=100", "--trainer.max_steps=1",
              "--trainer.limit_val_batches=1", f"--trainer.default_root_dir={tmp_path / 'longer'}"]
    with pytest.raises(ValueError, match="max_len: model.trunk.max_len=128 but .* has 64"):
        run_cli(["fit", *args, f"--model.init_from={ckpt}", *longer])
    rope = run_cli(
        [
            "fit",
            *args,
            "--model.trunk.positions=rope",
            "--trainer.max_steps=2",
            "--trainer.limit_val_batches=1",
            f"--trainer.default_root_dir={tmp_path / 'rope'}",
        ]
    )
    rope_ckpt = rope.trainer.checkpoint_callback.last_model_path or rope.trainer.checkpoint_callback.best_model_path
    cli = run_cli(["fit", *args, f"--model.init_from={rope_ckpt}", *longer, "--model.trunk.local_window=16"])
    assert cli.model.trunk.cfg.max_len == 128 and cli.model.trunk.cfg.positions == "rope"
    assert cli.datamodule.tasks["sentiment"].max_length == 100  # not lowered to the pretrained 64
    # max_len at its default (512, as when a user sets it to 512) is not replaced by the trained 64 either
    default = run_cli(
        [
            "fit",
            *args,
            f"--model.init_from={rope_ckpt}",
            *[a for a in longer if not a.startswith("--model.trunk.max_len")],
            "--model.trunk.max_len=512",
        ]
    )
    assert default.model.trunk.cfg.max_len == 512 and default.datamodule.tasks["sentiment"].max_length == 100


def test_objectives_stored_under_an_earlier_layouts_module_paths_still_load():
    """Checkpoints and trunk directories of earlier versions name objectives by the files they lived in."""
    from trunk.tasks.registry import as_objective

    objective = as_objective(
        {"class_path": "trunk.tasks.sequence_classification.SequenceClassification", "init_args": {"pooling": "mean"}}
    )
    assert type(objective).__name__ == "SequenceClassification" and objective.pooling == "mean"
    assert objective.spec()["class_path"] == "trunk.tasks.SequenceClassification"


def test_a_stored_head_starts_a_task_of_another_name_with_its_labels_renamed(trained, tmp_path):
    """model.heads_from: a new review task from the 'sentiment' head; model.label_map pairs its names (bad / good) with
    the stored ones (negative / positive)."""
    import csv

    from conftest import write_rows

    from trunk.cli import export_main

    ckpt, args, tmp = trained
    export_main([ckpt, str(tmp_path / "trunk")])
    with (tmp / "train.csv").open() as f:
        rows = [
            {"review": r["text"], "verdict": {"negative": "bad", "positive": "good"}[r["label"]]}
            for r in csv.DictReader(f)
        ]
    reviews = write_rows(tmp_path / "reviews.csv", rows[:200])
    base = [a for a in args if a.startswith("--trainer.") and "default_root_dir" not in a]
    new_task = [
        "--model.tasks.reviews=trunk.tasks.SequenceClassification",
        "--data.tasks.reviews=trunk.datamodules.TextClassificationData",
        f"--data.tasks.reviews.train={reviews}",
        "--data.tasks.reviews.text_column=review",
        "--data.tasks.reviews.label_column=verdict",
        "--data.tasks.reviews.max_length=64",
        *base,
        f"--model.init_from={tmp_path / 'trunk'}",
        f"--trainer.default_root_dir={tmp_path / 'r'}",
    ]
    cli = run_cli(
        [
            *new_task,
            "--model.heads_from={reviews: sentiment}",
            "--model.label_map={reviews: {bad: negative, good: positive}}",
        ],
        run=False,
    )
    stored = torch.load(ckpt, weights_only=False)["state_dict"]
    for key, value in cli.model.objectives["reviews"].head_state().items():
        assert torch.equal(value, stored[f"objectives.sentiment.{key}"]), key
    assert any("the head 'sentiment'" in note for note in cli.run.report)
    with pytest.raises(
        ValueError, match=r"trained on the labels \['negative', 'positive'\], but this run's data has \['bad', 'good'\]"
    ):
        # other names, and no map: never silent
        run_cli([*new_task, "--model.heads_from={reviews: sentiment}"], run=False)
    with pytest.raises(ValueError, match=r"should start from the head 'sst2', but .* stores the heads \['sentiment'\]"):
        run_cli([*new_task, "--model.heads_from={reviews: sst2}"], run=False)


def test_shared_labels_keep_their_rows_new_ones_start_fresh_and_stored_only_ones_are_dropped():
    """CoNLL-style types (PER/LOC/ORG/MISC) starting a WNUT-style task (person/location/corporation): tags map by
    type."""
    from trunk.assembly.weights import HeadReuse, from_pretrained
    from trunk.core.codec import Codec
    from trunk.formats.trunk_dir import PretrainedTrunk
    from trunk.models import TrunkConfig
    from trunk.tasks import TokenClassification, TrunkModule

    tiny = TrunkConfig(vocab_size=60, d_model=32, n_layers=1, n_heads=4, d_ff=64, max_len=16)
    conll = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
    source = TrunkModule({"ner": TokenClassification()}, trunk=tiny, task_info={"ner": {"label_names": conll}})
    head = source.objectives["ner"]
    pretrained = PretrainedTrunk(Path("in-memory"), tiny, {"text": {}}, source.trunk.state_dict(),
                                 {"ner": {"meta": head.head_meta(), "state": head.head_state()}}, Codec())
    wnut = ["O", "B-corporation", "I-corporation", "B-location", "I-location", "B-person", "I-person"]
    with pytest.raises(ValueError, match="model.keep_shared_labels=true to keep the rows of the labels in both"):
        from_pretrained(
            pretrained,
            {"wnut": TokenClassification()},
            task_info={"wnut": {"label_names": wnut}},
            reuse=HeadReuse(heads_from={"wnut": "ner"}, label_map={"wnut": {"person": "PER", "location": "LOC"}}),
        )
    model = from_pretrained(pretrained, {"wnut": TokenClassification()}, task_info={"wnut": {"label_names": wnut}},
                            reuse=HeadReuse(heads_from={"wnut": "ner"}, keep_shared_labels=True,
                                            label_map={"wnut": {"person": "PER", "location": "LOC"}}))
    fresh = TrunkModule({"wnut": TokenClassification()}, trunk=tiny, task_info={"wnut": {"label_names": wnut}})
    weight, stored = model.objectives["wnut"].head.classifier.weight, head.head.classifier.weight
    for name, row in zip(wnut, weight):
        origin = {"person": "PER", "location": "LOC"}.get(name.partition("-")[2])
        if name == "O" or origin:
            assert torch.equal(row, stored[conll.index(name if name == "O" else f"{name[0]}-{origin}")]), name
        else:  # a type the stored head never had: a fresh row, as a new head would have
            assert not any(torch.equal(row, s) for s in stored), name
    assert weight.shape == fresh.objectives["wnut"].head.classifier.weight.shape
    with pytest.raises(ValueError, match="is a token_classification head; task 'wnut' is sequence_classification"):
        from_pretrained(pretrained, {"wnut": SequenceClassification()}, reuse=HeadReuse(heads_from={"wnut": "ner"}),
                        task_info={"wnut": {"label_names": ["a", "b"]}})
