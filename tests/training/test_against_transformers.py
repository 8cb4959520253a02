"""Fine-tuning from an imported checkpoint computes what ``transformers`` computes on the same batch (pair
classification was seen trailing the Trainer on small sets): the batch Trunk trains on, the logits and loss of the same
weights, and every gradient of the first step, for a sentence-pair classifier with dropout off."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import single_task  # noqa: E402
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

    encoder_grads = {name.removeprefix("bert."): p.grad for name, p in theirs.named_parameters()
                     if name.startswith("bert.")}
    mapped = map_weights(theirs.config.to_dict(), encoder_grads, "bert")
    expected = {**{f"trunk.{k}": v for k, v in mapped.trunk.items()},
                **{f"objectives.pairs.head.dense.{k}": v for k, v in mapped.pooler.items()},
                "objectives.pairs.head.classifier.weight": theirs.classifier.weight.grad,
                "objectives.pairs.head.classifier.bias": theirs.classifier.bias.grad}
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert set(expected) == set(grads)
    for name, grad in expected.items():
        assert torch.allclose(grads[name], grad, atol=1e-5 * grad.abs().max().item() + 1e-9), name
