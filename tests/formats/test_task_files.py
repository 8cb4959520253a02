"""Task directories (trunk/formats/task_dir.py) and mixed batches: one trunk, many tasks' deltas, each task a small
file."""

import json
import random
import shutil

import pytest
import torch
from conftest import ner_sentence, single_task, write_conll, write_rows

from trunk.datamodules.builtin import sentiment_example

TEXTS = ["the film was great", "a dull and tedious plot", "superb acting", "the plot was bad and slow", "fine"]
SENTENCES = [["Anna", "visited", "Paris"], ["Boris", "Petrova", "said", "the", "deal", "was", "good"], ["Oslo"]]
TINY = ["--model.trunk.d_model=32", "--model.trunk.n_layers=2", "--model.trunk.n_heads=4", "--model.trunk.d_ff=64",
        "--model.trunk.max_len=64", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--seed_everything=0"]


def classification(task, files):
    return single_task(
        [
            "--model=trunk.tasks.SequenceClassification",
            "--data=trunk.datamodules.TextClassificationData",
            f"--data.train={files['train']}",
            f"--data.validation={files['validation']}",
            "--data.max_length=64",
        ],
        task,
    )


def ner(task, files):
    return single_task(
        [
            "--model=trunk.tasks.TokenClassification",
            "--data=trunk.datamodules.TokenClassificationData",
            f"--data.train={files['train']}",
            f"--data.validation={files['validation']}",
            "--data.max_length=64",
        ],
        task,
    )


def assert_same_records(got, expected):
    """Records equal in everything but the last float bits of their scores."""
    def scores(value):
        return (
            pytest.approx(value, abs=1e-5)
            if isinstance(value, float)
            else {k: scores(v) for k, v in value.items()}
            if isinstance(value, dict)
            else [scores(v) for v in value]
            if isinstance(value, list)
            else value
        )
    assert got == scores(expected)


def last_checkpoint(cli) -> str:
    return cli.trainer.checkpoint_callback.last_model_path or cli.trainer.checkpoint_callback.best_model_path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A trunk (directory), and a run on it training tasks a (LoRA), b (adapter), c (a head alone) and ner (LoRA), with
    each task exported as a task directory."""
    from trunk.cli import export_main, run_cli

    root = tmp_path_factory.mktemp("task_files")
    rng = random.Random(0)
    sentiment = {split: write_rows(root / f"{split}.csv", [sentiment_example(rng) for _ in range(n)])
                 for split, n in (("train", 128), ("validation", 32))}
    tags = {
        split: write_conll(root / f"{split}.conll", [ner_sentence(rng) for _ in range(n)])
        for split, n in (("train", 128), ("validation", 32))
    }
    base = run_cli(
        [
            "fit",
            *classification("base", sentiment),
            *TINY,
            "--data.tokenizer_vocab_size=300",
            "--trainer.max_steps=4",
            f"--trainer.default_root_dir={root / 'base'}",
        ]
    )
    export_main([last_checkpoint(base), str(root / "trunk"), "--trunk-only"])
    args = [
        *classification("a", sentiment),
        *classification("b", sentiment),
        *classification("c", sentiment),
        *ner("ner", tags),
    ]
    fit = run_cli(
        [
            "fit",
            *args,
            *TINY,
            f"--model.init_from={root / 'trunk'}",
            "--model.optimizer.lr=0.03",
            "--trainer.max_steps=12",
            "--model.peft={a: {method: lora, r: 4}, b: {method: adapter, r: 8}, ner: {method: lora, r: 2, "
            "targets: [q_proj, fc_in]}}",
            f"--trainer.default_root_dir={root / 'peft'}",
        ]
    )
    ckpt = last_checkpoint(fit)
    for task in ("a", "b", "c", "ner"):
        export_main([ckpt, str(root / f"task_{task}"), "--task", task])
    export_main([ckpt, str(root / "whole")])
    return {"root": root, "trunk": root / "trunk", "ckpt": ckpt, "sentiment": sentiment, "tags": tags,
            **{task: root / f"task_{task}" for task in ("a", "b", "c", "ner")}}


def test_task_files_are_small_and_answer_as_the_run_did(runs):
    from trunk.tasks import load

    trunk_bytes = sum(f.stat().st_size for f in runs["trunk"].iterdir())
    for task in ("a", "b", "ner"):
        assert sum(f.stat().st_size for f in runs[task].iterdir()) < 0.2 * trunk_bytes  # a tiny trunk: heads weigh much
    meta = json.loads((runs["a"] / "config.json").read_text())
    assert (meta["format"], meta["task"], meta["head"]["peft"]["method"]) == ("trunk-task", "a", "lora")
    run = load(runs["ckpt"], precision="32-true")
    files = load([runs["trunk"], runs["a"], runs["b"], runs["c"], runs["ner"]], precision="32-true")
    for task in ("a", "b", "c"):
        assert files.predict(TEXTS, task=task) == run.predict(TEXTS, task=task)
    assert files.predict(SENTENCES, task="ner") == run.predict(SENTENCES, task="ner")
    assert load([runs["b"], runs["trunk"]], precision="32-true").predict(TEXTS, task="b") == run.predict(
        TEXTS, task="b"
    )  # any order
    a, b, c = (files.predict(TEXTS, task=t) for t in "abc")
    # each task's delta and head answer
    assert ([r["probs"] for r in a] != [r["probs"] for r in c] != [r["probs"] for r in b])


def test_requests_for_different_tasks_share_one_trunk_pass_and_answer_as_each_task_alone(runs):
    from trunk.tasks import load

    model = load([runs["trunk"], runs["a"], runs["b"], runs["c"], runs["ner"]], precision="32-true")
    examples = {"a": TEXTS[:2], "b": TEXTS[1:], "c": TEXTS[3:], "ner": SENTENCES}
    alone = {task: model.predict(inputs, task=task) for task, inputs in examples.items()}
    passes = []
    model.model.trunk.backbone.blocks[0].register_forward_hook(
        lambda module, inputs, output: passes.append(output.shape[0])
    )
    mixed = model.predict_encoded({task: model.encode(task, inputs) for task, inputs in examples.items()}, shared=False)
    assert_same_records(mixed, alone)  # equal up to float rounding: the rows share a batch of another shape
    assert len(passes) == 1  # one trunk pass for the four tasks' different inputs
    truth = {"b": model.predict(TEXTS[1:], task="b")}
    # one task alone: the same path
    assert (model.predict_encoded({"b": model.encode("b", TEXTS[1:])}, shared=False) == truth)


def test_a_task_file_is_refused_on_another_trunk_or_twice_or_alone(runs, tmp_path):
    from trunk.formats.trunk_dir import load_pretrained, save_pretrained
    from trunk.tasks import load

    other = load_pretrained(runs["trunk"])
    other.trunk_weights = {k: v + 1e-3 if k.endswith("q_proj.weight") else v for k, v in other.trunk_weights.items()}
    save_pretrained(tmp_path / "other", other)
    with pytest.raises(ValueError, match=r"task 'a'\) was trained on another trunk than .*other'.*fingerprint"):
        load([tmp_path / "other", runs["a"]])
    shutil.copytree(runs["a"], tmp_path / "a_again")
    with pytest.raises(ValueError, match=r"Two heads are named 'a': in .*task_a' and in .*a_again'"):
        load([runs["trunk"], runs["a"], tmp_path / "a_again"])
    with pytest.raises(ValueError, match=r"Two heads are named 'a'"):  # the run's own trunk directory has its heads
        load([runs["root"] / "whole", runs["a"]])
    with pytest.raises(ValueError, match=r"Give one trunk .* none of .* is a trunk"):
        load([runs["a"], runs["b"]])
    with pytest.raises(ValueError, match=r"is a task directory \(task 'a'\), without a trunk: give it with the trunk"):
        load(runs["a"])
    newer = tmp_path / "newer"
    shutil.copytree(runs["a"], newer)
    meta = json.loads((newer / "config.json").read_text())
    (newer / "config.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(ValueError, match=r"format version 99, newer than this Trunk reads \(1\). Upgrade Trunk"):
        load([runs["trunk"], newer])
    (newer / "config.json").write_text(json.dumps(meta))
    (newer / "model.safetensors").write_bytes(b"not weights")
    with pytest.raises(ValueError, match=r"model.safetensors' does not match the checksum"):
        load([runs["trunk"], newer])


def test_export_task_refuses_what_it_cannot_write(runs, tmp_path):
    from trunk.cli import export_main

    with pytest.raises(SystemExit, match=r"^error: .*has no task 'nosuch'; its tasks are \['a', 'b', 'c', 'ner'\]"):
        export_main([runs["ckpt"], str(tmp_path / "x"), "--task", "nosuch"])
    with pytest.raises(
        SystemExit,
        match=r"^error: --task writes a task directory without its trunk; --onnx applies to trunk directories",
    ):
        export_main([runs["ckpt"], str(tmp_path / "y"), "--task", "a", "--onnx"])
    with pytest.raises(SystemExit, match=r"^error: .*already holds a trunk. Pass --overwrite"):
        export_main([runs["ckpt"], str(runs["a"]), "--task", "a"])


def test_merged_lora_answers_as_unmerged_and_merge_needs_one_lora_task(runs):
    from trunk.tasks import load

    merged, unmerged = (load([runs["trunk"], runs["a"]], precision="32-true", merge=m) for m in (True, False))
    for x, y in zip(merged.predict(TEXTS, task="a"), unmerged.predict(TEXTS, task="a")):
        assert x["label"] == y["label"] and x["probs"] == pytest.approx(y["probs"], abs=1e-4)
    with pytest.raises(
        ValueError, match=r"merge writes one task's LoRA into the trunk.*the tasks \['a', 'c'\], with LoRA on \['a'\]"
    ):
        load([runs["trunk"], runs["a"], runs["c"]], merge=True)
    with pytest.raises(ValueError, match=r"with LoRA on none"):
        load([runs["trunk"], runs["b"]], merge=True)


def test_init_from_a_trunk_and_task_files_goes_on_with_the_stored_delta(runs, tmp_path):
    from safetensors.torch import load_file

    from trunk.cli import run_cli

    args = [
        *classification("a", runs["sentiment"]),
        *TINY,
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=1",
    ]
    cli = run_cli(
        [*args, f"--model.init_from=[{runs['trunk']},{runs['a']}]", "--model.peft={a: {method: lora, r: 4}}"], run=False
    )
    stored = load_file(str(runs["a"] / "model.safetensors"))
    state = cli.model.objectives["a"].state_dict()
    assert all(torch.equal(state[k], v) for k, v in stored.items() if k.startswith("delta."))
    with pytest.raises(
        ValueError,
        match=r"Task 'a': the head in .*task_a' was trained with a lora delta on a frozen trunk\. Give "
        r"the task that delta to go on with it: --model.peft='\{a: \{\"method\": \"lora\"",
    ):
        run_cli([*args, f"--model.init_from=[{runs['trunk']},{runs['a']}]"], run=False)
    with pytest.raises(
        ValueError, match=r"the delta in .*task_a' was trained with .*'r': 4.*but model.peft.a is .*'r': 8"
    ):
        run_cli(
            [*args, f"--model.init_from=[{runs['trunk']},{runs['a']}]", "--model.peft={a: {method: lora, r: 8}}"],
            run=False,
        )


def test_serve_answers_each_task_file_on_one_trunk(runs):
    pytest.importorskip("litserve")
    from trunk.inference.serve import PredictRequest, TrunkAPI
    from trunk.tasks import load

    threads = torch.get_num_threads()  # setup sets the process's threads: keep this test process's
    api = TrunkAPI(
        [str(runs["trunk"]), str(runs["a"]), str(runs["b"]), str(runs["ner"])], "32-true", "torch", 64, threads, False
    )
    api.setup("cpu")
    bodies = [
        {"input": TEXTS[0], "task": "a"},
        {"inputs": TEXTS[1:3], "task": "b"},
        {"inputs": SENTENCES, "task": "ner"},
        {"input": TEXTS[3], "task": ["a", "b"]},
        {"input": "", "task": "a"},
    ]
    answers = api.predict([api.decode_request(PredictRequest(**body)) for body in bodies])
    model = load([runs["trunk"], runs["a"], runs["b"], runs["ner"]], precision="32-true")
    expected = [
        model.predict(TEXTS[:1], task="a")[0],
        model.predict(TEXTS[1:3], task="b"),
        model.predict(SENTENCES, task="ner"),
        model.predict(TEXTS[3:4], task=["a", "b"])[0],
    ]
    assert_same_records(answers[:4], expected)  # the first three shared one trunk pass
    assert "an empty text" in answers[4].message


def test_a_new_task_composes_stored_deltas_and_its_task_file_holds_them(runs, tmp_path):
    from trunk.cli import export_main, run_cli
    from trunk.tasks import load

    args = [
        *classification("d", runs["sentiment"]),
        *TINY,
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=3",
        f"--model.init_from=[{runs['trunk']},{runs['a']},{runs['b']}]",
    ]
    fit = run_cli(["fit", *args, "--model.peft={d: {method: lora, r: 2, compose: [a, b]}}"])
    delta = fit.model.objectives["d"].delta
    a = load([runs["trunk"], runs["a"]]).model.objectives["a"].delta
    # frozen: as stored
    assert all(torch.equal(v, a.state_dict()[k]) for k, v in delta.sources["a"].state_dict().items())
    # the mix learned
    assert list(delta.sources) == ["a", "b"] and not torch.equal(delta.mix, torch.full_like(delta.mix, 0.5))
    export_main([last_checkpoint(fit), str(tmp_path / "task_d_only"), "--task", "d"])
    alone = load([runs["trunk"], tmp_path / "task_d_only"], precision="32-true")  # the sources travel in d's own file
    assert alone.predict(TEXTS, task="d") == load(last_checkpoint(fit), precision="32-true").predict(TEXTS)
    with pytest.raises(
        SystemExit, match=r"model.peft.d.compose names \['nosuch'\], but model.init_from brings deltas for \['a', 'b'\]"
    ):
        run_cli([*args, "--model.peft={d: {method: lora, compose: [nosuch]}}"], run=False)
