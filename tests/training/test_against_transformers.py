"""Fine-tuning from an imported checkpoint computes what ``transformers`` computes on the same batch (pair
classification was seen trailing the Trainer on small sets): the batch Trunk trains on, the logits and loss of the same
weights, and every gradient of the first step, for a sentence-pair classifier and a multiple-choice model with dropout
off."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import quiz_question, single_task, write_rows  # noqa: E402
from test_hf import PAIRS, tiny  # noqa: E402

from trunk.cli import run_cli  # noqa: E402
from trunk.formats.hf import map_weights  # noqa: E402

LABELS = ["entailment", "neutral", "contradiction"]


def pair_classifier(tmp_path, head_dropout: float = 0.0, *options: str):
    """A tiny random BERT (its pooler and token types trained off their init) made a sentence-pair classifier through
    the CLI's path (the data's pair encoding, segments read off [SEP], the pretrained pooler in the head), the trunk's
    dropout off (``options``: more of the run's options): the CLI (its model, data and trainer), its first training
    batch, ``BertForSequenceClassification`` of the same weights and classifier, and the batch as transformers'
    tokenizer makes it."""
    tiny("bert", tmp_path / "bert", masked_lm=False)
    rows = ["premise\thypothesis\tlabel"] + [f"{a}\t{b}\t{LABELS[i % 3]}" for i, (a, b) in enumerate(PAIRS * 8)]
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n")
    cli = run_cli(single_task([
        "--model=trunk.tasks.SequenceClassification", f"--model.head_dropout={head_dropout}",
        f"--model.init_from={tmp_path / 'bert'}", "--model.trunk.dropout=0.0", "--model.trunk.attn_dropout=0.0",
        "--data=trunk.datamodules.TextClassificationData",
        f"--data.train={tmp_path / 'pairs.tsv'}", f"--data.validation={tmp_path / 'pairs.tsv'}",
        "--data.text_column=premise", "--data.text_pair_column=hypothesis", "--data.label_column=label",
        f"--data.label_names={LABELS}", "--data.batch_size=8", "--trainer.accelerator=cpu",
        "--trainer.precision=32-true", f"--trainer.default_root_dir={tmp_path / 'run'}", *options], "pairs"),
        run=False)
    model, data = cli.model, cli.datamodule
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))

    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "bert", num_labels=3)
    head = model.objectives["pairs"].head
    with torch.no_grad():
        theirs.classifier.weight.copy_(head.classifier.weight)
        theirs.classifier.bias.copy_(head.classifier.bias)
    return cli, batch, theirs, their_batch(tmp_path / "bert", batch)


@functools.cache
def tokenizer_of(model: Path):
    return transformers.AutoTokenizer.from_pretrained(model)


def their_batch(model: Path, batch: dict) -> dict:
    """A batch of Trunk's pairs as transformers' tokenizer encodes them."""
    return tokenizer_of(model)([a for a, _ in batch["text"]], [b for _, b in batch["text"]], padding=True,
                               return_tensors="pt")


def test_a_pair_classifiers_first_step_equals_transformers(tmp_path):
    """With dropout off, the batch is transformers' tokenizer's ids; Trunk's logits and loss on it equal
    ``BertForSequenceClassification``'s with the same classifier; every gradient, mapped to Trunk's names as the
    importer maps weights, equals transformers' within 1e-5 of the largest."""
    cli, batch, theirs, encoded = pair_classifier(tmp_path)
    model = cli.model
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


def test_in_training_the_pooler_reads_what_berts_reads_and_dropout_acts_on_the_classifiers_input(tmp_path):
    """Training with the head's dropout on (0.5): the pretrained pooler's output equals ``BertModel``'s pooler output
    on the batch (nothing dropped before it, as in ``BertForSequenceClassification``), and the classifier reads it
    with dropout: each value zeroed or scaled by 2, about half zeroed. A dropout before the pooler too (RoBERTa's head,
    Trunk's before) cost OpenBookQA 1.4 points from MiniLM."""
    cli, batch, theirs, encoded = pair_classifier(tmp_path, head_dropout=0.5)
    model = cli.model
    head = model.objectives["pairs"].head
    seen = {}
    head.dense.register_forward_hook(lambda module, inputs, output: seen.update(pooler=torch.tanh(output)))
    head.classifier.register_forward_hook(lambda module, inputs, output: seen.update(classifier=inputs[0]))
    model.train()
    theirs.train()
    model.objectives["pairs"].loss(model.trunk, batch, "train")
    expected = theirs.bert(**encoded).pooler_output  # its dropout is on the pooled output, after the pooler
    assert torch.allclose(seen["pooler"], expected, atol=1e-5)
    kept = seen["classifier"] != 0
    assert torch.allclose(seen["classifier"][kept], 2 * seen["pooler"][kept], atol=1e-5)
    assert 0.3 < 1 - kept.float().mean().item() < 0.7


def test_steps_of_trunks_own_training_loop_end_at_the_weights_of_the_trainers_loop(tmp_path):
    """The Trainer's optimisation (AdamW, weight decay, a linear decay, gradients clipped by their norm), dropout off:
    ``trunk fit``'s own loop (Lightning's, its optimiser groups and schedule) for 8 steps ends at the weights the
    Trainer's loop reaches on the same batches from the same weights. Two differences are Trunk's on purpose: position
    tables do not decay (timm's convention; the Trainer decays every weight but biases and LayerNorms), and a warmup's
    first step is at lr / warmup steps, not at 0, its length a fraction of the steps rounded down, not up (so no
    warmup here: with one, the two rates are about a step apart until it ends)."""
    from lightning.pytorch.callbacks import Callback

    # a rate and a decay at which a change to which weights decay, the schedule or the clipping moves weights by 3e-5
    # or more; a tiny model's gradients are smaller than a real one's, so its clipping norm is too (it acts on half of
    # the steps here)
    steps, lr, decay, clip = 8, 1e-3, 0.1, 0.25
    cli, _, theirs, _ = pair_classifier(
        tmp_path, 0.0, f"--trainer.max_steps={steps}", f"--trainer.gradient_clip_val={clip}", "--trainer.logger=false",
        "--trainer.enable_checkpointing=false", "--trainer.num_sanity_val_steps=0", f"--model.optimizer.lr={lr}",
        f"--model.optimizer.weight_decay={decay}", "--model.optimizer.schedule=linear", "--model.optimizer.warmup=0")
    batches = []

    class Record(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            batches.append({"text": list(batch["text"]), "labels": batch["labels"].clone()})

    cli.trainer.callbacks.append(Record())
    cli.trainer.fit(cli.model, cli.datamodule)
    assert len(batches) == steps

    no_decay = ("bias", "LayerNorm.weight", "position_embeddings.weight")  # the Trainer's, and positions
    named = list(theirs.named_parameters())
    optimizer = torch.optim.AdamW([{"params": [p for n, p in named if not n.endswith(no_decay)], "weight_decay": decay},
                                   {"params": [p for n, p in named if n.endswith(no_decay)], "weight_decay": 0.0}],
                                  lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (steps - step) / steps)  # no warmup
    theirs.train()
    clipped = []
    for batch in batches:
        loss = theirs(**their_batch(tmp_path / "bert", batch), labels=batch["labels"]).loss
        loss.backward()
        clipped.append(torch.nn.utils.clip_grad_norm_(theirs.parameters(), clip).item() > clip)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    assert any(clipped) and not all(clipped)  # the clipping acts on some steps, so it is compared too

    expected = in_trunks_names(theirs, "pairs", lambda p: p.detach())
    ours = dict(cli.model.named_parameters())
    assert set(expected) == set(ours)
    moved = max((ours[name] - theirs_value).abs().max().item() for name, theirs_value in expected.items())
    assert moved < 1e-5, moved


def in_trunks_names(theirs, task: str, value) -> dict:
    """``value(parameter)`` (its weight, its gradient) of each of transformers' model's parameters, under the name of
    the Trunk parameter it maps to (the importer's map for the encoder and pooler; the task's classifier)."""
    encoder = {name.removeprefix("bert."): value(p) for name, p in theirs.named_parameters()
               if name.startswith("bert.")}
    mapped = map_weights(theirs.config.to_dict(), encoder, "bert")
    return {**{f"trunk.{k}": v for k, v in mapped.trunk.items()},
            **{f"objectives.{task}.head.dense.{k}": v for k, v in mapped.pooler.items()},
            f"objectives.{task}.head.classifier.weight": value(theirs.classifier.weight),
            f"objectives.{task}.head.classifier.bias": value(theirs.classifier.bias)}


def assert_same_gradients(model, theirs, task: str, of_all: float | None = None) -> None:
    """Every gradient of Trunk's model equals transformers' (mapped to Trunk's names as the importer maps weights)
    within 1e-5 of its largest; ``of_all``: within that share of the largest gradient of all instead."""
    expected = in_trunks_names(theirs, task, lambda p: p.grad)
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
