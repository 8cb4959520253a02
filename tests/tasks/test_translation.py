"""Translation: the key/value cache, greedy and beam search, the data (parallel files, rows, separate
vocabularies), BLEU, a reversal task learned exactly, the CLI, and bad input."""

import itertools
import json
from pathlib import Path

import pytest
import torch
from conftest import reversal_pairs, single_task, standalone

from trunk.cli import run_cli
from trunk.datamodules import TranslationData
from trunk.datamodules.tokenizer import train_bpe
from trunk.models import Decoder, SpecialIds, TrunkConfig, beam_search, greedy_search

IDS = SpecialIds(bos=2, eos=3, pad=0, banned=(0, 2, 4))


def random_decoder(positions: str, vocab: int = 24, eos_bias: float = 0.0, seed: int = 0) -> Decoder:
    """An untrained decoder with spread-out logits; ``eos_bias`` makes hypotheses end at varied steps."""
    torch.manual_seed(seed)
    cfg = TrunkConfig(vocab_size=vocab, d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0, attn_dropout=0.0,
                      max_len=64, positions=positions, init_std=0.3)
    decoder = Decoder(cfg)  # initialises itself with init_std
    with torch.no_grad():
        decoder.output_bias[IDS.eos] = eos_bias
    return decoder.eval()


def memory(batch: int = 4, length: int = 7, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, 4:] = False  # a shorter source: its padding must not matter
    return torch.randn(batch, length, 32, generator=g), mask


# -- generation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("positions", ["rope", "learned", "sinusoidal"])
def test_cached_decoding_gives_the_same_tokens_and_logits_as_full_recomputation(positions):
    decoder = random_decoder(positions, eos_bias=2.0)
    mem, mask = memory()
    tokens = torch.randint(5, 24, (4, 9))
    full = decoder(tokens, mem, mask)
    cache, steps = decoder.new_cache(), []
    for t in range(tokens.shape[1]):
        steps.append(decoder(tokens[:, t : t + 1], mem, mask, cache))
    assert len(cache) == tokens.shape[1]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    for search in (lambda c: greedy_search(decoder, mem, mask, IDS, 20, use_cache=c),
                   lambda c: beam_search(decoder, mem, mask, IDS, 20, beam_size=3, use_cache=c)):
        assert torch.equal(search(True), search(False))


@pytest.mark.parametrize("eos_bias", [0.0, 0.5, 2.0])
def test_beam_size_one_is_greedy(eos_bias):
    decoder = random_decoder("rope", eos_bias=eos_bias)
    mem, mask = memory(batch=6)
    greedy = greedy_search(decoder, mem, mask, IDS, 15)
    assert torch.equal(beam_search(decoder, mem, mask, IDS, 15, beam_size=1, length_penalty=1.0), greedy)
    if eos_bias == 2.0:  # the outputs end at different steps (at an EOS, padded after it)
        assert (greedy == IDS.eos).any(1).all() and (greedy == IDS.pad).any()


def sequence_log_prob(decoder: Decoder, mem: torch.Tensor, mask: torch.Tensor, sequence: list[int]) -> float:
    tokens = torch.tensor([[IDS.bos, *sequence[:-1]]])
    logits = decoder(tokens, mem, mask).float()
    logits[..., list(IDS.banned)] = float("-inf")
    return logits.log_softmax(-1)[0, torch.arange(len(sequence)), torch.tensor(sequence)].sum().item()


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_a_wide_beam_finds_the_best_hypothesis_by_brute_force(length_penalty):
    """Vocabulary: 5 specials + 3 words; outputs of at most 3 tokens: a beam of 30 covers them all."""
    decoder = random_decoder("rope", vocab=8, eos_bias=1.0, seed=3)
    mem, mask = memory(batch=2)
    found = beam_search(decoder, mem, mask, IDS, max_steps=3, beam_size=30, length_penalty=length_penalty)
    for b in range(2):
        hypotheses = [[*words, IDS.eos] for n in range(3) for words in itertools.product(range(5, 8), repeat=n)]
        hypotheses += [list(words) for words in itertools.product(range(5, 8), repeat=3)]  # cut by max_steps
        best = max(
            hypotheses,
            key=lambda h: sequence_log_prob(decoder, mem[b : b + 1], mask[b : b + 1], h) / len(h) ** length_penalty,
        )
        row = found[b].tolist()
        assert row[: len(best)] == best and all(t == IDS.pad for t in row[len(best) :])


# -- data -------------------------------------------------------------------------------------------


def test_bpe_tokenizer_detokenizes_exactly():
    texts = ["A man, in a blue t-shirt, doesn't sit.", "Zwei Männer stehen am Herd.", 'Fünf (5) Kinder: "Hallo!"'] * 20
    tokenizer = train_bpe(texts, vocab_size=200)
    for text in texts[:3]:
        assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_parallel_files_read_both_sides_in_the_chosen_direction(reversal_files):
    forward = standalone(
        TranslationData(source_lang="src", target_lang="tgt", train=reversal_files["train"]), tokenizer_vocab_size=100
    )
    backward = standalone(
        TranslationData(source_lang="tgt", target_lang="src", train=reversal_files["train"]), tokenizer_vocab_size=100
    )
    source, target = reversal_pairs(1500, seed=0)[0]
    assert (forward.raw("train")["source"][0], forward.raw("train")["target"][0]) == (source, target)
    assert (backward.raw("train")["source"][0], backward.raw("train")["target"][0]) == (target, source)
    example = forward.encode(forward.raw("train"), "train")[0]
    assert example["decoder_input_ids"][0] == IDS.bos and example["labels"][-1] == IDS.eos
    assert example["decoder_input_ids"][1:] == example["labels"][:-1]  # shifted by one (teacher forcing)
    assert forward.target_tokenizer.decode(example["labels"][:-1]) == target


def test_rows_with_a_translation_column_and_separate_vocabularies(tmp_path):
    rows = [{"translation": {"de": f"Ein Hund {i}.", "en": f"A dog {i}."}} for i in range(50)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = standalone(
        TranslationData(
            source_lang="de",
            target_lang="en",
            train=str(tmp_path / "train.jsonl"),
            joint_vocabulary=False,
            target_tokenizer_vocab_size=60,
        ),
        tokenizer_vocab_size=60,
    )
    assert dm.raw("train")["source"][3] == "Ein Hund 3." and dm.raw("train")["target"][3] == "A dog 3."
    assert "▁Hund" in dm.tokenizer.get_vocab() and "▁Hund" not in dm.target_tokenizer.get_vocab()
    assert "▁dog" in dm.target_tokenizer.get_vocab()
    with pytest.raises(ValueError, match=r"has the languages \['de', 'en'\], not 'fr'"):
        TranslationData(source_lang="fr", target_lang="en", train=str(tmp_path / "train.jsonl")).raw("train")


def test_bad_parallel_data_is_a_clear_error(tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n")
    (tmp_path / "a.en").write_text("one\ntwo\n")
    with pytest.raises(ValueError, match=r"differ in length: .*a.de' has 3 lines, .*a.en' has 2"):
        TranslationData(source_lang="de", target_lang="en", train=str(tmp_path / "a.{lang}")).raw("train")
    (tmp_path / "b.de").write_text("eins\n\ndrei\n")
    (tmp_path / "b.en").write_text("one\ntwo\nthree\n")
    with pytest.raises(ValueError, match=r"line 2 \(b.de / b.en\) has an empty source sentence"):
        TranslationData(source_lang="de", target_lang="en", train=str(tmp_path / "b.{lang}")).raw("train")
    with pytest.raises(
        FileNotFoundError, match=r"source file .*a.fr' \(source_lang='fr'\) does not exist.*\['a.de', 'a.en'\]"
    ):
        TranslationData(source_lang="fr", target_lang="en", train=str(tmp_path / "a.{lang}")).raw("train")
    with pytest.raises(ValueError, match="both 'de'"):
        TranslationData(source_lang="de", target_lang="de")
    with pytest.raises(ValueError, match=r"names neither parallel files nor a row file.*train.\{lang\}.gz"):
        TranslationData(source_lang="de", target_lang="en", train=str(tmp_path / "a.de")).raw("train")


# -- the task -----------------------------------------------------------------------------------------


def translation_args(files: dict[str, str], tmp_path: Path, **overrides) -> list[str]:
    options = {
        "model": "trunk.tasks.Translation",
        "model.trunk.d_model": 64,
        "model.trunk.n_layers": 2,
        "model.trunk.n_heads": 4,
        "model.trunk.d_ff": 128,
        "model.trunk.max_len": 32,
        "model.trunk.positions": "rope",
        "model.trunk.dropout": 0.0,
        "model.trunk.attn_dropout": 0.0,
        "model.label_smoothing": 0.0,
        "model.optimizer.lr": 3e-3,
        "model.generation.beam_size": 1,  # exact output: beam search is checked against brute force above
        "data": "trunk.datamodules.TranslationData",
        "data.source_lang": "src",
        "data.target_lang": "tgt",
        "data.train": files["train"],
        "data.validation": files["validation"],
        "data.test": files["test"],
        "data.tokenizer_vocab_size": 60,
        "data.max_length": 32,
        "data.batch_size": 32,
        "trainer.accelerator": "cpu",
        "trainer.devices": 1,
        "trainer.max_epochs": 6,
        "trainer.enable_progress_bar": False,
        "trainer.enable_model_summary": False,
        "trainer.default_root_dir": str(tmp_path / "run"),
        "seed_everything": 0,
    }
    options.update(overrides)
    return single_task([f"--{k}={v}" for k, v in options.items() if v is not None], "translate")


def test_learns_to_reverse_exactly_then_tests_and_predicts_through_the_cli(reversal_files, tmp_path):
    cli = run_cli(["fit", *translation_args(reversal_files, tmp_path)])
    metrics = cli.trainer.callback_metrics  # the CLI tests the best checkpoint after fit
    assert metrics["test/translate/bleu"] == pytest.approx(100.0)  # every test sentence reversed exactly
    assert metrics["test/translate/acc"] > 0.99
    logged = (Path(cli.trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"val/translate/bleu", "val/translate/loss", "val/translate/acc", "train/loss", "val/score"} <= set(logged)
    samples = [
        json.loads(line)
        for line in (Path(cli.trainer.log_dir) / "samples" / "translate.jsonl").read_text().splitlines()
    ]
    last = [r for r in samples if r["epoch"] == samples[-1]["epoch"]]
    assert set(last[0]) == {"epoch", "step", "id", "source", "reference", "hypothesis", "bleu"}
    assert all(r["bleu"] == pytest.approx(100.0) for r in last if r["hypothesis"] == r["reference"])
    assert sum(r["hypothesis"] == r["reference"] for r in last) > len(last) / 2  # mostly learnt by the last epoch
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    tested = run_cli(
        [
            "test",
            *translation_args(reversal_files, tmp_path, **{"model.generation.max_length": 2}),
            f"--ckpt_path={ckpt}",
        ]
    )
    # generation options are the config's, not the checkpoint's
    assert (tested.model.objectives["translate"].generation.max_length == 2)
    assert tested.trainer.callback_metrics["test/translate/bleu"] < 50  # two tokens cannot spell the reversed sentences
    sources = ["cat dog fish", "hat egg apple bird goat"]
    (tmp_path / "new.src").write_text("".join(s + "\n" for s in sources))
    out = tmp_path / "out.txt"
    run_cli(["predict", *translation_args(reversal_files, tmp_path, **{"data.predict": str(tmp_path / "new.src")}),
             f"--ckpt_path={ckpt}", f"--predictions.output={out}", "--predictions.field=translation"])
    assert out.read_text().splitlines() == ["Fish dog cat.", "Goat bird apple egg hat."]


def test_separate_vocabularies_travel_in_the_checkpoint(reversal_files, tmp_path):
    args = translation_args(
        reversal_files,
        tmp_path,
        **{"data.joint_vocabulary": False, "model.share_embeddings": False, "trainer.max_epochs": 1, "data.test": None},
    )
    cli = run_cli(["fit", *args])
    target_vocab_size = cli.datamodule.tasks["translate"].target_tokenizer.get_vocab_size()
    assert (
        cli.model.objectives["translate"].decoder.stem.token.num_embeddings
        == target_vocab_size
        != cli.datamodule.vocab_size
    )
    out = tmp_path / "out.jsonl"
    run_cli(["predict", *args, f"--data.tasks.translate.predict={reversal_files['test']}",
             f"--ckpt_path={cli.trainer.checkpoint_callback.best_model_path}",
             f"--predictions.output={out}"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 60 and set(records[0]) == {"source", "translation"}
    with pytest.raises(ValueError, match="share_embeddings needs one vocabulary"):
        run_cli(translation_args(reversal_files, tmp_path, **{"data.joint_vocabulary": False}), run=False)


def test_bleu_matches_sacrebleu():
    sacrebleu = pytest.importorskip("sacrebleu")
    from torchmetrics.text import SacreBLEUScore

    hypotheses = ["A man in a blue shirt is sitting.", "Two dogs run on the grass!", "The kid doesn't smile (today)."]
    references = ["A man in a blue t-shirt sits.", "Two dogs are running on grass.", "The kid doesn't smile today."]
    metric = SacreBLEUScore(tokenize="13a")
    metric.update(hypotheses, [[r] for r in references])
    assert 100 * metric.compute().item() == pytest.approx(
        sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-4
    )
