"""Masked-LM pretraining: masking statistics, packing, the tied head, and the pretrain -> fine-tune handoff."""

import gzip
import json
import random
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL, single_task
from safetensors.torch import load_file

from trunk.assembly.weights import from_pretrained
from trunk.cli import export_main, run_cli
from trunk.core.codec import IGNORE_INDEX, SPECIAL_TOKENS, Codec
from trunk.datamodules import CorpusData, MultiTaskData, TokenMasker
from trunk.datamodules.builtin import sentiment_example
from trunk.datamodules.tokenizer import train_wordpiece
from trunk.formats.trunk_dir import PretrainedTrunk, load_pretrained, save_pretrained
from trunk.models import TrunkConfig, build_trunk
from trunk.tasks import MaskedLanguageModeling, ReplacedTokenDetection, SequenceClassification, TrunkModule

TINY = TrunkConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=32)


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [sentiment_example(rng)["text"] for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece(sentences(2000), vocab_size=150)  # small: many words split into ## pieces


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(sentences(600)) + "\n")
    return path


def random_batch(tokenizer, rows: int = 400, length: int = 128) -> torch.Tensor:
    """Ids of real text with [CLS] first, [SEP] between sentences and [PAD] at the end of some rows."""
    stream = [i for e in tokenizer.encode_batch(sentences(4000, seed=1), add_special_tokens=False) for i in (*e.ids, 3)]
    ids = torch.tensor(stream[: rows * (length - 1)]).view(rows, length - 1)
    ids = torch.cat([torch.full((rows, 1), 2), ids], dim=1)
    ids[::3, -20:] = 0  # padding
    return ids


def test_masking_rates_specials_and_labels(tokenizer):
    masker = TokenMasker(tokenizer, probability=0.15)
    ids = random_batch(tokenizer)
    masked, labels = masker(ids, torch.Generator().manual_seed(0))
    special = torch.isin(ids, torch.tensor([tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]))
    chosen = labels != IGNORE_INDEX
    assert not (chosen & special).any(), "special or padding tokens were masked"
    assert torch.equal(masked[special], ids[special])
    assert torch.equal(labels[chosen], ids[chosen]) and (labels[~chosen] == IGNORE_INDEX).all()
    assert torch.equal(masked[~chosen], ids[~chosen])  # nothing else changes
    rate = chosen.sum().item() / (~special).sum().item()
    assert rate == pytest.approx(0.15, abs=0.01)  # ~45k maskable tokens: std of the rate is 0.002
    n = chosen.sum().item()
    to_mask = (masked[chosen] == tokenizer.token_to_id("[MASK]")).sum().item() / n
    unchanged = (masked[chosen] == ids[chosen]).sum().item() / n
    assert to_mask == pytest.approx(0.8, abs=0.02)
    assert unchanged == pytest.approx(0.1, abs=0.02)
    assert 1 - to_mask - unchanged == pytest.approx(0.1, abs=0.02)  # random replacements
    replaced = masked[chosen][(masked[chosen] != ids[chosen]) & (masked[chosen] != 4)]
    assert not torch.isin(replaced, torch.arange(len(SPECIAL_TOKENS))).any(), "random replacements are never specials"


def test_whole_word_masking_masks_words_completely(tokenizer):
    masker = TokenMasker(tokenizer, probability=0.15, whole_word=True)
    ids = random_batch(tokenizer)
    _, labels = masker(ids, torch.Generator().manual_seed(0))
    chosen = labels != IGNORE_INDEX
    vocab = {i: t for t, i in tokenizer.get_vocab().items()}
    continuation = torch.tensor([[vocab[i].startswith("##") for i in row] for row in ids.tolist()])
    assert continuation.any(), "the test needs words split into pieces"
    # A continuation piece is chosen exactly when the piece before it is (same word).
    follows = continuation[:, 1:] & (ids[:, :-1] > 4)
    assert torch.equal(chosen[:, 1:][follows], chosen[:, :-1][follows])
    special = ids <= 4
    assert not (chosen & special).any()
    rate = chosen.sum().item() / (~special).sum().item()
    assert rate == pytest.approx(0.15, abs=0.02)


def test_corpus_packs_full_blocks_and_holds_out_documents(tmp_path):
    docs = sentences(300)
    plain = tmp_path / "a.txt"
    plain.write_text("\n".join(docs[:200]) + "\n\n")
    packed = tmp_path / "b.txt.gz"
    with gzip.open(packed, "wt") as f:
        f.write("\n".join(docs[200:]))
    run = MultiTaskData(
        {"mlm": CorpusData(train=[str(plain), str(packed)], val_fraction=0.1, max_length=16, batch_size=8)},
        tokenizer_vocab_size=200,
    )
    run.setup("fit")
    data = run.tasks["mlm"]
    train, val = data.raw("train")["text"], data.raw("validation")["text"]
    assert len(train) + len(val) == 300 and len(val) == 30 and not set(val) & set(train)
    blocks = torch.tensor(data._encoded["train"]["input_ids"])
    assert all(len(b) == 16 and b[0] == data.tokenizer.token_to_id("[CLS]") for b in blocks)
    stream = [i for e in data.tokenizer.encode_batch(train, add_special_tokens=False) for i in (*e.ids, 3)]
    assert torch.cat([b[1:] for b in blocks]).tolist() == stream[: 15 * len(blocks)]  # nothing lost, nothing padded
    assert len(stream) - 15 * len(blocks) < 15
    batch = next(iter(run.train_dataloader()))
    assert batch["task"] == "mlm" and batch["input_ids"].shape == (8, 16) and batch["attention_mask"].all()
    masks = lambda seed: data.make_batch("train", list(range(64)), train=True,  # noqa: E731
                                         generator=torch.Generator().manual_seed(seed))["labels"]
    assert not torch.equal(masks(1), masks(2)), "training masks must be dynamic"
    assert torch.equal(masks(1), masks(1)), "a batch's masks depend only on its generator (exact resume)"
    val_batches = [next(iter(run.val_dataloader()[0]))["labels"] for _ in range(2)]
    assert torch.equal(*val_batches), "validation masks must be fixed"


def test_blank_line_documents(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("first line of doc one\nsecond line of doc one\n\n\nthe only line of doc two\n  \ndoc three\n")
    data = CorpusData(train=str(path), documents="blank_line", val_fraction=0.0)
    assert data.raw("train")["text"] == [
        "first line of doc one second line of doc one",
        "the only line of doc two",
        "doc three",
    ]
    lines = CorpusData(train=str(path), val_fraction=0.0)
    assert len(lines.raw("train")) == 4


def test_conll_column_files_give_their_sentences(tmp_path):
    from conftest import write_conll

    conll = write_conll(
        tmp_path / "ner.txt", [[("EU", "B-ORG"), ("rejects", "O")], [("Peter", "B-PER"), ("left", "O")]]
    )
    data = CorpusData(train=[str(conll), str(conll)], val_fraction=0.0)
    assert data.raw("train")["text"] == ["EU rejects", "Peter left"] * 2  # words only: no tags, no DOCSTART


def mlm_model(objective=None) -> TrunkModule:
    return TrunkModule({"mlm": objective or MaskedLanguageModeling()}, trunk=TINY, task_info={"mlm": {}})


def test_mlm_head_is_tied_and_scores_only_masked_positions():
    torch.manual_seed(0)
    model = mlm_model().eval()  # no dropout: the two losses below must agree
    mlm = model.objectives["mlm"]
    assert mlm.head.decoder.weight is model.trunk.stems["text"].token.weight
    ids = torch.randint(5, 300, (4, 32))
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, 3] = ids[:, 3]
    labels[0, 7] = ids[0, 7]
    seen = []
    mlm.head.decoder.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    loss = mlm.loss(model.trunk, batch, "train")
    assert seen == [torch.Size([5, 300])]  # 5 masked positions, never the full (4, 32, 300)
    full = mlm(model.trunk, batch)
    expected = torch.nn.functional.cross_entropy(full[labels != IGNORE_INDEX], labels[labels != IGNORE_INDEX])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert mlm.head.decoder.weight is model.trunk.stems["text"].token.weight  # still one matrix after an update
    ids_in_groups = [id(p) for g in model.param_groups() for p in g["params"]]
    assert len(ids_in_groups) == len(set(ids_in_groups))  # the tied matrix is in one optimizer group


def pretrain_args(corpus: Path, root: Path, objective: str = "MaskedLanguageModeling", task: str = "mlm") -> list[str]:
    tiny = [a.replace("SequenceClassification", objective) for a in TINY_MODEL]
    return [
        "fit",
        *single_task(
            [
                *tiny,
                "--model.trunk.max_len=32",
                "--data=trunk.datamodules.CorpusData",
                f"--data.train={corpus}",
                "--data.tokenizer_vocab_size=200",
                "--data.max_length=32",
                "--data.batch_size=8",
            ],
            task,
        ),
        "--trainer.max_steps=6",
        "--trainer.val_check_interval=6",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}",
        "--seed_everything=0",
    ]


def finetune_args(trunk_dir: Path, sentiment_files: dict, root: Path, *extra: str) -> list[str]:
    return single_task(["--model=trunk.tasks.SequenceClassification", f"--model.init_from={trunk_dir}",
                        "--data=trunk.datamodules.TextClassificationData", f"--data.train={sentiment_files['train']}",
                        f"--data.validation={sentiment_files['validation']}", "--data.max_length=32", *extra,
                        "--trainer.max_steps=2", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
                        f"--trainer.default_root_dir={root}"])


@pytest.fixture
def pretrained(corpus_file, tmp_path):
    """A few steps of tiny pretraining through the CLI; returns (cli, trunk directory)."""
    cli = run_cli(pretrain_args(corpus_file, tmp_path / "pretrain"))
    return cli, tmp_path / "pretrain" / "trunk"


def test_pretrain_export_then_finetune_loads_identical_weights_and_tokenizer(pretrained, sentiment_files, tmp_path):
    cli, trunk_dir = pretrained
    # README.md: the model card
    assert {p.name for p in trunk_dir.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json", "README.md"}
    assert {"val/mlm/ppl", "val/mlm/acc", "val/mlm/loss", "val/score"} <= cli.trainer.callback_metrics.keys()
    assert cli.trainer.callback_metrics["val/mlm/ppl"] > 1.0
    meta = json.loads((trunk_dir / "config.json").read_text())
    assert meta["format"] == "trunk" and meta["format_version"] == 2 and meta["trunk"]["d_model"] == 32
    assert meta["stems"] == {"text": {}} and meta["heads"]["mlm"]["kind"] == "masked_lm"
    pretrained_state = {k: v.clone() for k, v in cli.model.trunk.state_dict().items()}

    finetune = run_cli(
        finetune_args(trunk_dir, sentiment_files, tmp_path / "finetune", "--data.max_length=64"), run=False
    )
    model = finetune.model
    assert model.trunk_config.d_model == 32 and model.trunk_config.n_layers == 2  # architecture from the directory
    for name, tensor in model.trunk.state_dict().items():
        assert torch.equal(tensor, pretrained_state[name]), name
    assert finetune.datamodule.tokenizer.to_str() == cli.datamodule.tokenizer.to_str()
    assert finetune.datamodule.tasks["sentiment"].max_length == 32  # capped at the pretrained position table
    finetune.trainer.fit(model, datamodule=finetune.datamodule)  # trains with the fresh head


def test_a_fast_dev_run_of_pretraining_leaves_the_exported_trunk_as_it_was(pretrained, corpus_file, tmp_path):
    """Lightning's dry run (one step) smoke-tests a recipe: its one-step trunk must not replace the one exported."""
    _, trunk_dir = pretrained
    before = {p.name: p.read_bytes() for p in trunk_dir.iterdir()}
    cli = run_cli([*pretrain_args(corpus_file, tmp_path / "pretrain"), "--trainer.fast_dev_run=true"])
    assert cli.trainer.global_step == 1
    assert {p.name: p.read_bytes() for p in trunk_dir.iterdir()} == before


def test_export_command_matches_the_end_of_pretraining_export(pretrained, tmp_path, capsys):
    cli, trunk_dir = pretrained
    last = Path(cli.trainer.checkpoint_callback.last_model_path or cli.trainer.checkpoint_callback.best_model_path)
    export_main([str(last), str(tmp_path / "exported")])
    assert "--model.init_from=" in capsys.readouterr().out
    a, b = load_file(str(trunk_dir / "model.safetensors")), load_file(str(tmp_path / "exported" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert {k for k in b if k.startswith("heads.")} == {
        f"heads.mlm.head.{k}" for k in ("dense.weight", "dense.bias", "norm.weight", "norm.bias", "decoder.bias")
    }  # decoder weight is tied
    exported = load_pretrained(tmp_path / "exported")
    assert torch.equal(
        exported.heads["mlm"]["state"]["head.decoder.weight"], exported.trunk_weights["stems.text.token.weight"]
    )
    export_main([str(last), str(tmp_path / "trunk_only"), "--trunk-only"])
    assert all(k.startswith("trunk.") for k in load_file(str(tmp_path / "trunk_only" / "model.safetensors")))
    with pytest.raises(SystemExit, match="does not exist"):
        export_main([str(tmp_path / "nope.ckpt"), str(tmp_path / "x")])


def text_trunk(config: TrunkConfig, tokenizer) -> PretrainedTrunk:
    return PretrainedTrunk(Path("."), config, {"text": {}}, build_trunk(config).state_dict(), codec=Codec(tokenizer))


def test_export_replaces_a_directory_atomically(tmp_path, tokenizer):
    config = TrunkConfig(vocab_size=tokenizer.get_vocab_size(), d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16)
    save_pretrained(tmp_path / "t", text_trunk(config, tokenizer))
    second = text_trunk(config, tokenizer)
    save_pretrained(tmp_path / "t", second, overwrite=True)
    assert torch.equal(load_pretrained(tmp_path / "t").trunk_weights["stems.text.token.weight"],
                       second.trunk_weights["stems.text.token.weight"])
    assert [p.name for p in tmp_path.iterdir()] == ["t"]  # no temporary directories left behind


def test_config_from_pretrained_in_plain_python(pretrained):
    cli, trunk_dir = pretrained
    config = TrunkConfig.from_pretrained(trunk_dir, dropout=0.3)
    assert config.d_model == 32 and config.vocab_size == cli.model.trunk_config.vocab_size and config.dropout == 0.3
    checkpoint = cli.trainer.checkpoint_callback.last_model_path or cli.trainer.checkpoint_callback.best_model_path
    assert TrunkConfig.from_pretrained(checkpoint) == cli.model.trunk_config


def test_export_never_deletes_what_it_did_not_write(pretrained, tmp_path):
    cli, trunk_dir = pretrained
    last = Path(cli.trainer.checkpoint_callback.last_model_path or cli.trainer.checkpoint_callback.best_model_path)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not part of a trunk directory.*never deletes"):
        export_main([str(last), str(precious)])
    assert (precious / "notes.txt").read_text() == "mine"
    (precious / "notes.txt").unlink()
    (precious / "README.md").write_text("my project")  # a README beside no trunk is the user's, not a model card
    with pytest.raises(SystemExit, match=r"not part of a trunk directory \(\['README.md'\]\)"):
        export_main([str(last), str(precious), "--overwrite"])
    assert (precious / "README.md").read_text() == "my project"
    with pytest.raises(SystemExit, match="already holds a trunk. Pass --overwrite"):
        export_main([str(last), str(trunk_dir)])
    (trunk_dir / "model.safetensors").unlink()  # replaced when asked: the file comes back
    export_main([str(last), str(trunk_dir), "--overwrite"])
    assert load_pretrained(trunk_dir).trunk_weights.keys() == cli.model.trunk.state_dict().keys()
    # the checkpoint being exported inside the output directory
    with pytest.raises(SystemExit, match="inside the output directory"):
        export_main([str(last), str(last.parent.parent), "--overwrite"])
    assert last.is_file()
    file_target = tmp_path / "a_file"
    file_target.write_text("x")
    with pytest.raises(SystemExit, match="not a directory"):
        export_main([str(last), str(file_target)])


class _Payload:
    def __reduce__(self):
        import os

        return (os.system, (f"touch {_Payload.marker}",))


def test_export_refuses_a_checkpoint_that_would_run_code(tmp_path):
    _Payload.marker = tmp_path / "pwned"
    crafted = tmp_path / "crafted.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"trunk": _Payload()}}, crafted)
    with pytest.raises(SystemExit, match="refuses to unpickle"):
        export_main([str(crafted), str(tmp_path / "out")])
    assert not _Payload.marker.exists(), "unpickling ran the payload"
    assert not (tmp_path / "out").exists()
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(SystemExit, match=r"garbage.ckpt' is not a checkpoint: it is a text file \(its first line: "
                                         r"'not a checkpoint at all'\)"):
        export_main([str(garbage), str(tmp_path / "out")])


def test_models_built_in_python_store_plain_hyperparameters(tmp_path):
    """Checkpoints of models built in Python (not by the CLI) also load with weights_only=True."""
    model = TrunkModule(
        {"t": SequenceClassification(pooling="mean")}, trunk=TINY, task_info={"t": {"label_names": ["a", "b"]}}
    )
    checkpoint = {"hyper_parameters": dict(model.hparams)}
    model.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / "c.ckpt")
    hparams = torch.load(tmp_path / "c.ckpt", weights_only=True)["hyper_parameters"]
    assert hparams["trunk"]["d_model"] == 32
    assert hparams["tasks"]["t"] == {
        "class_path": "trunk.tasks.SequenceClassification",
        "init_args": {
            "pooling": "mean",
            "head_dropout": 0.1,
            "primary_metric": "acc",
            "positive_label": None,
            "class_weights": None,
            "label_smoothing": 0.0,
            "pooler": True,
            "pooler_norm": False,
        },
    }
    rebuilt = TrunkModule(**hparams)
    assert rebuilt.trunk_config == TINY and rebuilt.objectives["t"].pooling == "mean"


# -- bad input ---------------------------------------------------------------------------------------


@pytest.fixture
def trunk_dir(tmp_path, tokenizer) -> Path:
    config = TrunkConfig(vocab_size=tokenizer.get_vocab_size(), d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16)
    return save_pretrained(tmp_path / "trunk", text_trunk(config, tokenizer))


def test_missing_directory_or_files(trunk_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="No pretrained trunk directory"):
        load_pretrained(tmp_path / "nowhere")
    (trunk_dir / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="has a text stem but no tokenizer.json"):
        load_pretrained(trunk_dir)
    (trunk_dir / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing \['model.safetensors'\]"):
        load_pretrained(trunk_dir)
    (trunk_dir / "config.json").unlink()  # a folder of something else: what it holds, and what is taken
    (trunk_dir / "weights.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"neither a Trunk directory nor a Hugging Face model folder: it has no "
                                                r"config.json \(it holds \['weights.pt'\]\)\. model.init_from takes"):
        load_pretrained(trunk_dir)


def without_checksums(trunk_dir: Path) -> None:
    """A directory assembled by hand (or by an older Trunk): config.json lists no checksums."""
    meta = json.loads((trunk_dir / "config.json").read_text())
    meta.pop("sha256")
    (trunk_dir / "config.json").write_text(json.dumps(meta))


def test_corrupted_weights(trunk_dir):
    weights = trunk_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match="model.safetensors' does not match the checksum"):
        load_pretrained(trunk_dir)
    without_checksums(trunk_dir)
    with pytest.raises(ValueError, match="model.safetensors' is corrupted"):
        load_pretrained(trunk_dir)


def test_tokenizer_that_does_not_belong_to_the_weights(trunk_dir):
    other = train_wordpiece(sentences(500, seed=3), vocab_size=80)
    other.save(str(trunk_dir / "tokenizer.json"))
    with pytest.raises(ValueError, match="tokenizer.json' does not match the checksum"):
        load_pretrained(trunk_dir)
    without_checksums(trunk_dir)
    with pytest.raises(
        ValueError, match=r"tokenizer.json has \d+ tokens but the weights were trained with vocab_size=1\d\d"
    ):
        load_pretrained(trunk_dir)


def test_architecture_mismatch_names_both_sides(trunk_dir, tokenizer):
    config = TrunkConfig(vocab_size=tokenizer.get_vocab_size(), d_model=32, n_layers=3, n_heads=2, d_ff=32, max_len=16)
    with pytest.raises(ValueError) as err:
        from_pretrained(
            trunk_dir, {"t": SequenceClassification()}, trunk=config, task_info={"t": {"label_names": ["a", "b"]}}
        )
    message = str(err.value)
    assert "d_model: model.trunk.d_model=32 but" in message and "has 16" in message
    assert "n_layers: model.trunk.n_layers=3" in message and "has 1" in message


def test_cli_refuses_an_explicit_architecture_or_tokenizer_that_differs(trunk_dir, sentiment_files, tmp_path):
    base = single_task(["--model=trunk.tasks.SequenceClassification", f"--model.init_from={trunk_dir}",
                        "--data=trunk.datamodules.TextClassificationData", f"--data.train={sentiment_files['train']}",
                        "--data.max_length=16", f"--trainer.default_root_dir={tmp_path}"])
    with pytest.raises(ValueError, match="n_heads: model.trunk.n_heads=8 but"):
        run_cli([*base, "--model.trunk.n_heads=8"], run=False)
    with pytest.raises(SystemExit, match="brings its own tokenizer"):
        run_cli([*base, f"--data.tokenizer={tmp_path / 'other.json'}"], run=False)
    with pytest.raises(SystemExit, match="model.init_from: No pretrained trunk directory"):
        run_cli([*base[:1], f"--model.init_from={tmp_path / 'missing'}", *base[2:]], run=False)


def test_electra_replaces_only_masked_tokens_and_labels_the_replacements():

    torch.manual_seed(0)
    module = mlm_model(ReplacedTokenDetection(generator_layers=1))
    model, trunk = module.objectives["mlm"], module.trunk
    assert model.generator_head.decoder.weight is trunk.stems["text"].token.weight  # generator shares the embeddings
    assert len(model.generator.blocks) == 1 and len(trunk.backbone.blocks) == 2
    original = torch.randint(5, 300, (8, 32))
    labels = torch.full_like(original, IGNORE_INDEX)
    chosen = torch.rand(original.shape) < 0.3
    labels[chosen] = original[chosen]
    masked = torch.where(chosen, 4, original)  # [MASK]
    attention_mask = torch.ones_like(original)
    attention_mask[0, -5:] = 0
    _, nll, selected, corrupted, replaced = model.replace(trunk, masked, labels, attention_mask)
    assert torch.equal(selected, chosen) and nll.shape == (int(chosen.sum()),)
    assert torch.equal(corrupted[~chosen], original[~chosen])  # only masked positions change
    assert torch.equal(replaced, corrupted != original) and not replaced[~chosen].any()
    assert replaced[chosen].float().mean() > 0.5  # an untrained generator rarely guesses right

    loss = model.loss(trunk, {"input_ids": masked, "attention_mask": attention_mask, "labels": labels}, "train")
    loss.backward()
    assert model.generator.blocks[0].ff.fc_in.weight.grad.abs().sum() > 0  # the MLM loss trains the generator
    assert model.head.out.weight.grad.abs().sum() > 0
    ids_in_groups = [id(p) for g in module.param_groups() for p in g["params"]]
    assert len(ids_in_groups) == len(set(ids_in_groups))


def test_electra_pretraining_exports_a_trunk_that_fine_tunes(corpus_file, sentiment_files, tmp_path):
    cli = run_cli(pretrain_args(corpus_file, tmp_path / "pretrain", "ReplacedTokenDetection", "electra"))
    metrics = cli.trainer.callback_metrics.keys()
    assert {f"val/electra/{k}" for k in ("ppl", "disc_acc", "disc_f1", "gen_loss", "disc_loss")} <= metrics
    trunk_dir = tmp_path / "pretrain" / "trunk"
    assert json.loads((trunk_dir / "config.json").read_text())["heads"]["electra"]["kind"] == "replaced_token_detection"
    finetune = run_cli(finetune_args(trunk_dir, sentiment_files, tmp_path / "finetune"), run=False)
    for name, tensor in finetune.model.trunk.state_dict().items():
        assert torch.equal(tensor, cli.model.trunk.state_dict()[name]), name


def test_a_trunk_directory_whose_weights_changed_after_export_is_refused(tmp_path, tokenizer):
    """config.json records each file's sha256: a flipped bit in the tensor data (which safetensors does not check) is
    caught."""
    config = TrunkConfig(vocab_size=tokenizer.get_vocab_size(), d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16)
    trunk_dir = save_pretrained(tmp_path / "t", text_trunk(config, tokenizer))
    weights = trunk_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x01  # inside the last tensor's bytes, past the header
    weights.write_bytes(bytes(data))
    with pytest.raises(
        ValueError, match=r"model.safetensors' does not match the checksum in .*config.json: the file was corrupted"
    ):
        load_pretrained(trunk_dir)


def test_non_finite_weights_are_refused_unless_asked_for(tmp_path, tokenizer, monkeypatch):
    config = TrunkConfig(vocab_size=tokenizer.get_vocab_size(), d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16)
    broken = text_trunk(config, tokenizer)
    next(iter(broken.trunk_weights.values())).view(-1)[0] = float("nan")
    monkeypatch.setenv("TRUNK_ALLOW_NON_FINITE", "1")
    trunk_dir = save_pretrained(tmp_path / "t", broken)  # for inspection only
    assert load_pretrained(trunk_dir).trunk_weights
    monkeypatch.delenv("TRUNK_ALLOW_NON_FINITE")
    with pytest.raises(ValueError, match="has NaN or infinite values .* set TRUNK_ALLOW_NON_FINITE=1"):
        load_pretrained(trunk_dir)


def test_a_reader_never_finds_the_trunk_directory_missing_during_a_re_export(tmp_path, tokenizer):
    import threading

    config = TrunkConfig(vocab_size=tokenizer.get_vocab_size(), d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16)
    trunk_dir = save_pretrained(tmp_path / "t", text_trunk(config, tokenizer))
    gaps, done = [], threading.Event()

    def read():
        while not done.is_set():
            if not (trunk_dir / "config.json").is_file():
                gaps.append(1)

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(20):
        save_pretrained(trunk_dir, text_trunk(config, tokenizer), overwrite=True)
    done.set()
    reader.join()
    assert not gaps, f"the directory was missing {len(gaps)} times"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_the_model_summary_counts_the_tied_decoder_once():
    from trunk.training.callbacks.summary import _SharedOnceSummary

    model = TrunkModule(
        {"mlm": MaskedLanguageModeling()},
        trunk=TrunkConfig(vocab_size=500, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=16),
    )
    for depth in (1, 3):
        summary = _SharedOnceSummary(model, max_depth=depth)
        rows = dict(zip(summary.layer_names, summary.param_nums))
        assert (
            rows["trunk"] + rows["objectives"] == summary.total_parameters == sum(p.numel() for p in model.parameters())
        )


def test_a_file_inside_a_trunk_directory_is_refused_naming_the_directory(pretrained):
    _, trunk_dir = pretrained
    for name in ("model.safetensors", "config.json"):
        with pytest.raises(
            ValueError, match=f"one file of the trunk directory '{trunk_dir}': give the directory itself"
        ):
            load_pretrained(trunk_dir / name)


def wandb_offline(monkeypatch, tmp_path) -> None:
    """No account, no network: W&B writes an offline run under tmp_path."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def trunk_artifacts(run_dir: Path) -> list:
    from wandb_records import records, settled

    def read(folder):
        return [
            r.artifact
            for r in records(folder)
            if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "trunk"
        ]

    return settled(read, run_dir, bool)


def test_pretraining_logs_its_trunk_directory_as_a_wandb_artifact_and_export_can_too(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    import wandb
    from conftest import REPO

    wandb_offline(monkeypatch, tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences(300)) + "\n")
    cli = run_cli([*pretrain_args(corpus, tmp_path / "pretrain"), "--config", str(REPO / "configs/trainer/wandb.yaml")])
    wandb.finish()
    run_dir = next((tmp_path / "pretrain" / "wandb").glob("offline-run-*"))
    (artifact,) = trunk_artifacts(run_dir)
    assert artifact.name == "trunk-pretrain" and list(artifact.aliases) == ["latest"]
    assert {c.path for c in artifact.manifest.contents} == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "README.md",
    }
    # `trunk export --wandb-project`: the same, from a checkpoint, in a run of its own
    last = cli.trainer.checkpoint_callback.last_model_path or cli.trainer.checkpoint_callback.best_model_path
    (tmp_path / "wandb-dir").mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trunk.cli",
            "export",
            last,
            str(tmp_path / "exported"),
            "--wandb-project",
            "trunk-test",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "WANDB_DIR": str(tmp_path / "wandb-dir")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "W&B artifact trunk-exported:latest (offline)" in done.stdout
    export_run = next((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
    (exported,) = trunk_artifacts(export_run)
    assert exported.name == "trunk-exported" and {c.path for c in exported.manifest.contents} >= {
        "config.json",
        "model.safetensors",
    }


def test_init_from_a_wandb_artifact_offline_is_refused_with_the_way_out(tiny_cli_args, tmp_path, monkeypatch):
    wandb_offline(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(
        SystemExit, match=r"W&B artifact, but W&B is offline here.*wandb artifact get me/proj/trunk-pretrain:latest"
    ):
        run_cli([*tiny_cli_args, "--model.init_from=wandb-artifact://me/proj/trunk-pretrain:latest"], run=False)
    with pytest.raises(ValueError, match="entity>/<project>/<name>:<alias"):
        from_pretrained(
            "wandb-artifact://just-a-name",
            {"s": SequenceClassification()},
            task_info={"s": {"label_names": ["a", "b"]}},
        )
