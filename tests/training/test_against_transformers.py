"""Fine-tuning from an imported checkpoint computes what ``transformers`` computes on the same batch (pair
classification was seen trailing the Trainer on small sets): the batch Trunk trains on, the logits and loss of the same
weights, and every gradient of the first step, for a sentence-pair classifier and a multiple-choice model with dropout
off."""

from __future__ import annotations

import random

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import quiz_question, single_task, write_rows  # noqa: E402
from test_hf import PAIRS, tiny  # noqa: E402

from trunk.cli import run_cli  # noqa: E402
from trunk.formats.hf import map_weights  # noqa: E402

LABELS = ["entailment", "neutral", "contradiction"]


def test_a_pair_classifiers_first_step_equals_transformers(tmp_path):
    """A tiny random BERT (its pooler and token types trained off their init) fine-tuned on sentence pairs through the
    CLI's path (the data's pair encoding, segments read off [SEP], the pretrained pooler in the head): the batch is
    transformers' tokenizer's ids; Trunk's logits and loss on it equal ``BertForSequenceClassification``'s with the same
    classifier; every gradient, mapped to Trunk's names as the importer maps weights, equals transformers' within 1e-5
    of the largest."""
    tiny("bert", tmp_path / "bert", masked_lm=False)
    rows = ["premise\thypothesis\tlabel"] + [f"{a}\t{b}\t{LABELS[i % 3]}" for i, (a, b) in enumerate(PAIRS * 8)]
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n")
    cli = run_cli(single_task([
        "--model=trunk.tasks.SequenceClassification", "--model.head_dropout=0.0",
        f"--model.init_from={tmp_path / 'bert'}", "--model.trunk.dropout=0.0", "--model.trunk.attn_dropout=0.0",
        "--data=trunk.datamodules.TextClassificationData",
        f"--data.train={tmp_path / 'pairs.tsv'}", f"--data.validation={tmp_path / 'pairs.tsv'}",
        "--data.text_column=premise", "--data.text_pair_column=hypothesis", "--data.label_column=label",
        f"--data.label_names={LABELS}", "--data.batch_size=8", "--trainer.accelerator=cpu",
        "--trainer.precision=32-true", f"--trainer.default_root_dir={tmp_path / 'run'}"], "pairs"), run=False)
    model, data = cli.model, cli.datamodule
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))

    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "bert", num_labels=3)
    head = model.objectives["pairs"].head
    with torch.no_grad():
        theirs.classifier.weight.copy_(head.classifier.weight)
        theirs.classifier.bias.copy_(head.classifier.bias)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "bert")
    encoded = tokenizer([a for a, _ in batch["text"]], [b for _, b in batch["text"]], padding=True,
                        return_tensors="pt")
    assert torch.equal(encoded["input_ids"], batch["input_ids"])
    assert encoded["token_type_ids"].any()  # the second sentences are segment 1: their embedding row matters

    model.train()
    theirs.train()
    loss = model.objectives["pairs"].loss(model.trunk, batch, "train")
    their_loss = theirs(**encoded, labels=batch["labels"]).loss
    assert loss.item() == pytest.approx(their_loss.item(), abs=1e-6)
    loss.backward()
    their_loss.backward()

    assert_same_gradients(model, theirs, "pairs")


def assert_same_gradients(model, theirs, task: str, of_all: float | None = None) -> None:
    """Every gradient of Trunk's model equals transformers' (mapped to Trunk's names as the importer maps weights)
    within 1e-5 of its largest; ``of_all``: within that share of the largest gradient of all instead."""
    encoder_grads = {name.removeprefix("bert."): p.grad for name, p in theirs.named_parameters()
                     if name.startswith("bert.")}
    mapped = map_weights(theirs.config.to_dict(), encoder_grads, "bert")
    expected = {**{f"trunk.{k}": v for k, v in mapped.trunk.items()},
                **{f"objectives.{task}.head.dense.{k}": v for k, v in mapped.pooler.items()},
                f"objectives.{task}.head.classifier.weight": theirs.classifier.weight.grad,
                f"objectives.{task}.head.classifier.bias": theirs.classifier.bias.grad}
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert set(expected) == set(grads)
    largest = max(grad.abs().max().item() for grad in expected.values())
    for name, grad in expected.items():
        atol = of_all * largest if of_all else 1e-5 * grad.abs().max().item() + 1e-9
        assert torch.allclose(grads[name], grad, atol=atol), name


def test_a_multiple_choice_models_first_step_equals_transformers(tmp_path):
    """OpenBookQA's kind (OpenBookQA alone trailed the Trainer on one seed): questions with 4 candidates each through
    the CLI's path: each candidate is transformers' tokenizer's (question, candidate) pair, the scores and the loss
    over a row's candidates equal ``BertForMultipleChoice``'s with the same classifier, and so does every gradient."""
    tiny("bert", tmp_path / "bert", masked_lm=False)
    rng = random.Random(0)
    quiz = [q for q in (quiz_question(rng) for _ in range(64)) if len(q["choices"]) == 4]
    write_rows(tmp_path / "quiz.jsonl", quiz)
    cli = run_cli(single_task([
        "--model=trunk.tasks.MultipleChoice", "--model.head_dropout=0.0", f"--model.init_from={tmp_path / 'bert'}",
        "--model.trunk.dropout=0.0", "--model.trunk.attn_dropout=0.0", "--data=trunk.datamodules.MultipleChoiceData",
        f"--data.train={tmp_path / 'quiz.jsonl'}", f"--data.validation={tmp_path / 'quiz.jsonl'}",
        "--data.batch_size=8", "--trainer.accelerator=cpu", "--trainer.precision=32-true",
        f"--trainer.default_root_dir={tmp_path / 'run'}"], "quiz"), run=False)
    model, data = cli.model, cli.datamodule
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert batch["choice_counts"].tolist() == [4] * 8

    theirs = transformers.BertForMultipleChoice.from_pretrained(tmp_path / "bert")
    head = model.objectives["quiz"].head
    with torch.no_grad():
        theirs.classifier.weight.copy_(head.classifier.weight)
        theirs.classifier.bias.copy_(head.classifier.bias)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "bert")
    encoded = tokenizer([question for question in batch["text"] for _ in range(4)],
                        [choice for choices in batch["choices"] for choice in choices], padding=True,
                        return_tensors="pt")
    assert torch.equal(encoded["input_ids"], batch["input_ids"])
    assert encoded["token_type_ids"].any()
    encoded = {key: value.view(8, 4, -1) for key, value in encoded.items()}

    model.train()
    theirs.train()
    scores = model.objectives["quiz"](model.trunk, batch)
    out = theirs(**encoded, labels=batch["labels"])
    assert torch.allclose(scores, out.logits, atol=1e-5)
    loss = model.objectives["quiz"].loss(model.trunk, batch, "train", scores)
    assert loss.item() == pytest.approx(out.loss.item(), abs=1e-6)
    loss.backward()
    out.loss.backward()
    # at the head's small init a row's candidates score nearly alike, so each gradient is a sum of terms that nearly
    # cancel (the classifier's bias: exactly, a softmax ignores a shift): float32 leaves ~1e-8 of noise on all alike,
    # 2e-4 of the largest gradient here, where a different computation differs by the gradients' own size
    assert_same_gradients(model, theirs, "quiz", of_all=1e-3)
