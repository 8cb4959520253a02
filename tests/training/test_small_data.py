"""What small sets need: an auxiliary masked-LM loss on the task's own text (``model.aux_mlm``)."""

import csv
from pathlib import Path

import pytest
import torch

from trunk.cli import run_cli
from trunk.core.masking import mask_tokens
from trunk.tasks import load
from trunk.tasks.objectives.masked_lm import auxiliary_mlm_loss


def test_mask_tokens_masks_ordinary_tokens_only_and_labels_what_it_hid():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (64, 32), generator=generator)
    ids[:, 0], ids[:, -1], ids[:8, 20:] = 2, 3, 0  # [CLS], [SEP], padding
    masked, labels = mask_tokens(ids, torch.arange(5), mask_id=4, vocab_size=100, generator=generator)
    chosen = labels != -100
    assert not chosen[ids < 5].any() and (labels[chosen] == ids[chosen]).all()
    assert 0.1 < chosen[ids >= 5].float().mean() < 0.2  # 15% of the ordinary tokens
    assert 0.7 < (masked[chosen] == 4).float().mean() < 0.9  # 80% [MASK], the rest random or kept
    assert (masked[~chosen] == ids[~chosen]).all() and (masked[chosen] >= 4).all()  # no special token drawn at random


def test_aux_mlm_adds_a_masked_lm_loss_on_the_tasks_own_batches_and_the_model_round_trips(tiny_cli_args, tmp_path):
    fit = run_cli(
        ["fit", *tiny_cli_args, "--model.aux_mlm=0.5", "--trainer.max_epochs=3", "--trainer.log_every_n_steps=1"]
    )
    metrics = fit.trainer.callback_metrics
    with open(Path(fit.trainer.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    aux = [float(r["train/sentiment/aux_mlm_loss_epoch"]) for r in rows if r.get("train/sentiment/aux_mlm_loss_epoch")]
    assert len(aux) == 3 and aux[-1] < aux[0]  # logged every epoch, and learned
    model = fit.model
    # tied: no second vocabulary matrix
    assert (model.aux_mlm_head.decoder.weight is model.trunk.stems["text"].token.weight)
    # the step's loss is the task's loss plus the weighted masked-LM loss of the same batch
    batch = next(iter(fit.datamodule.train_dataloader()))
    model.train()
    model.log = lambda *args, **kwargs: None  # outside the Trainer's loop
    torch.manual_seed(0)
    total = model(batch, "train")
    torch.manual_seed(0)
    # first: the step draws its randomness in this order
    task = model.objective("sentiment").loss(model.trunk, batch, "train")
    assert total.item() == pytest.approx(
        (task + 0.5 * auxiliary_mlm_loss(model.aux_mlm_head, model.trunk, batch, model._special_ids)).item(), rel=1e-5
    )
    # a checkpoint rebuilds the option and the head; evaluation and inference need neither the data's masking nor the
    # head
    best = fit.trainer.checkpoint_callback.best_model_path
    tested = run_cli(["test", *tiny_cli_args, f"--ckpt_path={best}"]).trainer.callback_metrics
    assert tested["test/sentiment/acc"] == pytest.approx(float(metrics["test/sentiment/acc"]))
    assert load(best).predict(["a good film"], task="sentiment")[0]["label"] in ("negative", "positive")


def test_aux_mlm_options_that_cannot_work_are_named(tiny_cli_args):
    with pytest.raises(ValueError, match=r"model.aux_mlm=-1.0 must be a loss weight >= 0"):
        run_cli([*tiny_cli_args, "--model.aux_mlm=-1"], run=False)


def test_reinit_top_starts_the_top_blocks_afresh_and_keeps_the_rest_pretrained(tiny_cli_args, tmp_path):
    from trunk.formats.trunk_dir import export_checkpoint, load_pretrained

    fit = run_cli(["fit", *tiny_cli_args])
    trunk_dir = export_checkpoint(fit.trainer.checkpoint_callback.best_model_path, tmp_path / "trunk")
    pretrained = load_pretrained(trunk_dir).trunk_weights
    args = [a for a in tiny_cli_args if "default_root_dir" not in a] + [
        f"--trainer.default_root_dir={tmp_path / 'again'}",
        f"--model.init_from={trunk_dir}",
    ]
    model = run_cli([*args, "--model.finetune.reinit_top=1"], run=False).model
    same = {
        name: torch.equal(value, pretrained[name])
        for name, value in model.trunk.state_dict().items()
        if name in pretrained
    }
    top = f"backbone.blocks.{model.trunk_config.n_layers - 1}."
    assert not any(
        ok for name, ok in same.items() if name.startswith(top) and name.endswith("weight") and "norm" not in name
    )
    # embeddings, lower blocks, final norm: pretrained
    assert all(ok for name, ok in same.items() if not name.startswith(top))
    with pytest.raises(ValueError, match="finetune.reinit_top=3 exceeds the trunk's 2 blocks"):
        run_cli([*args, "--model.finetune.reinit_top=3"], run=False)


def test_token_dropout_zeroes_whole_token_embeddings_in_training_only():
    from trunk.models import TrunkConfig
    from trunk.models.stems import TokenStem

    stem = TokenStem(
        TrunkConfig(vocab_size=50, d_model=16, n_heads=2, max_len=64, positions="rope", dropout=0.0, token_dropout=0.25)
    )
    ids = torch.randint(0, 50, (32, 64))
    torch.manual_seed(0)
    out = stem.train()(ids)
    zeroed = (out == 0).all(-1)
    assert 0.2 < zeroed.float().mean() < 0.3  # a quarter of the tokens, each whole
    assert torch.equal(out[~zeroed], stem.token(ids)[~zeroed])  # the others untouched (no rescaling)
    assert torch.equal(stem.eval()(ids), stem.token(ids))  # evaluation sees every token
    with pytest.raises(ValueError, match=r"TrunkConfig.token_dropout must be a probability in \[0, 1\)"):
        TrunkConfig(token_dropout=1.0)


def test_ner_trains_on_a_byte_level_bpe_vocabulary(ner_files, tmp_path):
    """Byte-level pieces carry the word boundaries NER labels by (the first piece of each word is labelled)."""
    args = [
        "fit",
        "--model.tasks.ner=trunk.tasks.TokenClassification",
        "--model.trunk.d_model=32",
        "--model.trunk.n_layers=2",
        "--model.trunk.n_heads=4",
        "--model.trunk.d_ff=64",
        "--model.trunk.max_len=64",
        "--model.optimizer.lr=3e-3",
        "--data.tasks.ner=trunk.datamodules.TokenClassificationData",
        f"--data.tasks.ner.train={ner_files['train']}",
        f"--data.tasks.ner.validation={ner_files['validation']}",
        f"--data.tasks.ner.test={ner_files['test']}",
        "--data.tasks.ner.max_length=64",
        "--data.tokenizer_model=byte_bpe",
        "--data.tokenizer_vocab_size=400",
        "--trainer.max_epochs=6",
        "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--seed_everything=0",
    ]
    fit = run_cli(args)
    assert fit.datamodule.codec.tokenizer.get_vocab_size() <= 400
    assert fit.trainer.callback_metrics["test/ner/f1"] > 0.8
