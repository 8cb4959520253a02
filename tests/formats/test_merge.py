"""Merging separately fine-tuned models into one (trunk/formats/merge.py, `trunk export A B DIR --merge`): the merged
trunk is the base plus the models' combined changes, every model's head comes along and answers, models trained as
deltas combine without loss, and models that cannot be merged are refused by name."""

import random
from dataclasses import replace

import pytest
import torch
from conftest import ner_sentence, write_conll, write_rows
from test_task_files import SENTENCES, TEXTS, TINY, assert_same_records, classification, last_checkpoint, ner

from trunk.datamodules.builtin import sentiment_example
from trunk.formats.merge import merge_trunks, ties_merge


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A base trunk, and two models fine-tuned from it: classification task ``sent``, NER task ``ner``."""
    from trunk.cli import export_main, run_cli

    root = tmp_path_factory.mktemp("merge")
    rng = random.Random(0)
    sentiment = {split: write_rows(root / f"{split}.csv", [sentiment_example(rng) for _ in range(n)])
                 for split, n in (("train", 128), ("validation", 32))}
    tags = {split: write_conll(root / f"{split}.conll", [ner_sentence(rng) for _ in range(n)])
            for split, n in (("train", 128), ("validation", 32))}
    base = run_cli(["fit", *classification("base", sentiment), *TINY, "--data.tokenizer_vocab_size=300",
                    "--trainer.max_steps=4", f"--trainer.default_root_dir={root / 'base'}"])
    export_main([last_checkpoint(base), str(root / "trunk"), "--trunk-only"])
    ckpts = {}
    for task, args in (("sent", classification("sent", sentiment)), ("ner", ner("ner", tags))):
        for delta in ("", "lora"):  # fully fine-tuned, and a LoRA delta on the frozen base
            peft = [f"--model.peft={{{task}: {{method: lora, r: 4}}}}"] if delta else []
            fit = run_cli(["fit", *args, *TINY, f"--model.init_from={root / 'trunk'}", "--model.optimizer.lr=0.03",
                           *peft, "--trainer.max_steps=12", f"--trainer.default_root_dir={root / task / delta}"])
            ckpts[task + (f"_{delta}" if delta else "")] = last_checkpoint(fit)
    return {"root": root, "base": root / "trunk", **ckpts}


def test_ties_trims_elects_signs_and_averages_the_agreeing_values():
    a = torch.tensor([4.0, -1.0, 0.5, 2.0])
    b = torch.tensor([2.0, 3.0, -0.1, -6.0])
    # density 0.5 keeps each vector's 2 largest: a -> [4, 0, 0, 2], b -> [0, 3, 0, -6]; signs by sum: +, +, 0, -
    assert torch.equal(ties_merge([a, b], 0.5), torch.tensor([4.0, 3.0, 0.0, -6.0]))
    # all kept: the first entry's signs agree (mean 3); the others' signs are elected by their sum, and only the
    # value of that sign counts (3, 0.5, -6), where a plain average would give 1, 0.2 and -2
    assert torch.equal(ties_merge([a, b], 1.0), torch.tensor([3.0, 3.0, 0.5, -6.0]))


def test_merged_models_keep_every_head_on_the_base_plus_their_changes(models, tmp_path):
    from trunk.cli import export_main
    from trunk.formats.task_dir import read_trunk
    from trunk.tasks import load

    out = tmp_path / "merged"
    export_main([models["sent"], models["ner"], str(out), "--merge", "task_arithmetic", "--base", str(models["base"])])
    merged, base = read_trunk(out), read_trunk(models["base"])
    sent, tagger = read_trunk(models["sent"]), read_trunk(models["ner"])
    assert set(merged.heads) == {"sent", "ner"}
    for name, weight in merged.trunk_weights.items():  # the default scale, 1/2: the two models' average
        if weight.is_floating_point():
            expected = base.trunk_weights[name] + (sent.trunk_weights[name] - base.trunk_weights[name]
                                                   + tagger.trunk_weights[name] - base.trunk_weights[name]) / 2
            torch.testing.assert_close(weight, expected)
            assert not torch.equal(weight, sent.trunk_weights[name]) or torch.equal(sent.trunk_weights[name],
                                                                                   tagger.trunk_weights[name])
    for task, source in (("sent", sent), ("ner", tagger)):
        for key, value in source.heads[task]["state"].items():
            assert torch.equal(merged.heads[task]["state"][key], value)
    predictor = load(out, precision="32-true")
    assert {r["label"] for r in predictor.predict(TEXTS, task="sent")} <= {"negative", "positive"}
    assert all("entities" in r for r in predictor.predict(SENTENCES, task="ner"))

    export_main([models["sent"], models["ner"], str(tmp_path / "ties"), "--merge", "ties", "--base",
                 str(models["base"]), "--merge-density", "0.5"])
    ties = read_trunk(tmp_path / "ties")
    name = next(k for k, v in base.trunk_weights.items() if v.is_floating_point() and v.dim() == 2)
    changes = [m.trunk_weights[name] - base.trunk_weights[name] for m in (sent, tagger)]
    torch.testing.assert_close(ties.trunk_weights[name], base.trunk_weights[name] + ties_merge(changes, 0.5))


def test_models_trained_as_deltas_combine_and_answer_exactly_as_each_alone(models, tmp_path):
    from trunk.cli import export_main
    from trunk.formats.task_dir import read_trunk
    from trunk.tasks import load

    out = tmp_path / "deltas"
    export_main([models["sent_lora"], models["ner_lora"], str(out), "--merge", "deltas", "--base", str(models["base"])])
    combined, base = read_trunk(out), read_trunk(models["base"])
    assert set(combined.heads) == {"sent", "ner"}
    assert all(torch.equal(combined.trunk_weights[k], v) for k, v in base.trunk_weights.items())
    assert {task: head["meta"]["peft"]["method"] for task, head in combined.heads.items()} == {"sent": "lora",
                                                                                             "ner": "lora"}
    predictor = load(out, precision="32-true")
    for task, inputs in (("sent", TEXTS), ("ner", SENTENCES)):
        alone = load(models[f"{task}_lora"], precision="32-true").predict(inputs, task=task)
        assert_same_records(predictor.predict(inputs, task=task), alone)
    with pytest.raises(SystemExit, match=r"changed the trunk of the base .*: --merge deltas combines models whose"):
        export_main([models["sent"], models["ner_lora"], str(tmp_path / "a"), "--merge", "deltas", "--base",
                     str(models["base"])])
    with pytest.raises(ValueError, match="scale=0.5: --merge deltas adds nothing up"):
        merge_trunks(base, [read_trunk(models["sent_lora"]), read_trunk(models["ner_lora"])], "deltas", scale=0.5)
    assert not (tmp_path / "a").exists()


def test_models_that_cannot_be_merged_are_refused_by_name(models, tmp_path):
    from trunk.cli import export_main
    from trunk.formats.task_dir import read_trunk

    base, sent, tagger = (read_trunk(models[k]) for k in ("base", "sent", "ner"))
    with pytest.raises(SystemExit, match="export writes one model; combine several fine-tuned from one base with"):
        export_main([models["sent"], models["ner"], str(tmp_path / "a")])
    with pytest.raises(SystemExit, match="--merge writes one trunk directory from two or more models"):
        export_main([models["sent"], models["ner"], str(tmp_path / "b"), "--merge", "ties"])  # no --base
    with pytest.raises(SystemExit, match="Two models have a task named 'sent': "):
        export_main([models["sent"], models["sent"], str(tmp_path / "c"), "--merge", "ties", "--base",
                     str(models["base"])])
    assert not (tmp_path / "c").exists()
    relabelled = replace(tagger, heads={"sent": {**sent.heads["sent"], "meta": {
        **sent.heads["sent"]["meta"], "label_names": ["bad", "good"]}}})
    with pytest.raises(ValueError, match=r"task named 'sent' with other labels \(\['negative', 'positive'\] against "):
        merge_trunks(base, [sent, relabelled])
    wider = replace(base, config=replace(base.config, d_model=48))
    with pytest.raises(ValueError, match=r"has another trunk than the base .* \(d_model 32 against 48\)"):
        merge_trunks(wider, [sent, tagger])
    delta = replace(tagger, heads={"ner": {**tagger.heads["ner"], "meta": {**tagger.heads["ner"]["meta"],
                                                                          "peft": {"method": "lora"}}}})
    with pytest.raises(ValueError, match="Task 'ner' of .* was trained as a delta"):
        merge_trunks(base, [sent, delta])
    with pytest.raises(ValueError, match="density=0: the share of each task vector TIES keeps"):
        merge_trunks(base, [sent, tagger], density=0)
