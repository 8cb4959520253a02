"""SentencePiece model files as Trunk tokenizers (trunk/formats/spm.py): tiny models trained here with the
``sentencepiece`` package encode and decode as ``SentencePieceProcessor`` does, and a T5 folder that ships only its
``spiece.model`` imports with the ids ``transformers`` gives it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

spm = pytest.importorskip("sentencepiece")

from test_hf import SENTENCES, WORDS, trunk_of  # noqa: E402

from trunk.formats.hf import convert  # noqa: E402
from trunk.formats.spm import spm_folder_tokenizer, spm_tokenizer  # noqa: E402

TEXTS = [*SENTENCES, "  leading,  doubled   and trailing spaces ", "Ünïcödé ｆｕｌｌｗｉｄｔｈ café",
         "unseen zebra quartz", "▁already escaped", "tab\tand\nnewline", "", "x<sep>y", "the film</s> was"]


def train_spm(prefix: Path, model_type: str = "unigram", **options) -> Path:
    """A tiny SentencePiece model of ``model_type`` on sentences of the test words (T5's ids unless ``options`` say
    otherwise: <pad> 0, </s> 1, <unk> 2, no <s>)."""
    import random

    rng = random.Random(0)
    corpus = prefix.parent / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice([*WORDS, "Café", "naïve", "1999"]) for _ in range(8))
                                for _ in range(2000)))
    size = 330 if options.get("byte_fallback") else 60
    ids = {"pad_id": 0, "eos_id": 1, "unk_id": 2, "bos_id": -1, **options}
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(prefix), vocab_size=size,
                                   hard_vocab_limit=False, model_type=model_type, minloglevel=2, **ids)
    return prefix.with_suffix(".model")


@pytest.mark.parametrize("options", [{}, {"byte_fallback": True}, {"user_defined_symbols": ["<sep>"]}],
                         ids=["plain", "byte-fallback", "user-defined"])
@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_a_sentencepiece_file_encodes_and_decodes_as_sentencepiece_does(model_type, options, tmp_path):
    path = train_spm(tmp_path / "m", model_type, **options)
    reference, ours = spm.SentencePieceProcessor(model_file=str(path)), spm_tokenizer(path)
    assert ours.get_vocab_size() == reference.get_piece_size()
    plain = [t for t in TEXTS if "</s>" not in t]  # a control token in the text: SentencePiece splits it, we keep it
    assert [ours.encode(t, add_special_tokens=False).ids for t in plain] == [reference.encode(t) for t in plain]
    known = [ids for ids in map(reference.encode, plain) if reference.unk_id() not in ids]  # <unk> is skipped here
    assert len(known) > 5 and [ours.decode(ids) for ids in known] == [reference.decode(ids) for ids in known]


def assert_encodes_as(model, tokenizer, pretrained) -> None:
    """The imported trunk's hidden states on the test sentences, encoded by transformers' tokenizer, within 1e-5 of
    ``model``'s at every real position."""
    encoded = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model.eval()(**encoded).last_hidden_state
        got = trunk_of(pretrained)(encoded.input_ids, encoded.attention_mask)
    assert (expected - got)[encoded.attention_mask.bool()].abs().max() < 1e-5


def t5_folder(folder: Path, rows: int) -> Path:
    """A T5 model folder as older uploads ship it: spiece.model and a tokenizer_config.json with 8 sentinel tokens,
    no tokenizer.json; the embedding table padded to ``rows``."""
    transformers = pytest.importorskip("transformers")
    folder.mkdir()
    train_spm(folder / "spiece")
    settings = {"tokenizer_class": "T5Tokenizer", "extra_ids": 8, "eos_token": "</s>", "pad_token": "<pad>",
                "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=rows, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(folder)
    return folder


def test_a_t5_folder_with_only_its_sentencepiece_file_imports_with_the_ids_transformers_gives(tmp_path):
    """Pieces, sentinels (<extra_id_0> is the last) and the closing </s> numbered as transformers' T5 tokenizer
    numbers them; the table's padding rows (T5 rounds 32100 up to 32128) are filled with unused tokens; the encoder
    computes what transformers' does on those ids."""
    import transformers

    folder = t5_folder(tmp_path / "t5", rows=128)
    pretrained, notes = convert(folder)
    theirs, ours = transformers.AutoTokenizer.from_pretrained(folder), pretrained.codec.tokenizer
    texts = [*TEXTS, "the film <extra_id_0> great <extra_id_7>"]
    assert [ours.encode(t).ids for t in texts] == [theirs(t).input_ids for t in texts]
    assert ours.encode(*SENTENCES[:2]).ids == theirs(*SENTENCES[:2]).input_ids
    assert ours.get_vocab_size() == 128 and ours.token_to_id("<extra_id_0>") == theirs.convert_tokens_to_ids(
        "<extra_id_0>")
    assert any("padded to the embedding table's 128 rows" in note for note in notes)
    assert_encodes_as(transformers.T5EncoderModel.from_pretrained(folder), theirs, pretrained)


def test_sentencepiece_files_that_cannot_be_read_as_they_are_are_refused_by_name(tmp_path, monkeypatch):
    path = train_spm(tmp_path / "m")
    shifted = {"added_tokens_decoder": {"0": {"content": "<s>"}, "1": {"content": "<pad>"}}}  # fairseq's layout
    with pytest.raises(ValueError, match=r"numbers its tokens otherwise than 'm.model' does \(0 is '<s>' there but "
                                         r"'<pad>' in the file.*tokenizer\.json"):
        spm_folder_tokenizer(path, shifted)
    with pytest.raises(ValueError, match=r"leave gaps after 60"):
        spm_folder_tokenizer(path, {"added_tokens_decoder": {"70": {"content": "<extra>"}}})
    broken = tmp_path / "broken.model"
    broken.write_bytes(b"\x00\x01not a model")
    with pytest.raises(ValueError, match=r"'.*broken.model' is not a SentencePiece model"):
        spm_tokenizer(broken)
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # the package not installed
    with pytest.raises(ImportError, match=r'needs the sentencepiece package: pip install "trunk\[sentencepiece\]"'):
        spm_tokenizer(path)


def test_a_table_much_larger_than_the_tokenizer_is_still_refused(tmp_path):
    """Padding rows are filled only where the table is the tokenizer's size rounded up (< 128 rows more, a multiple of
    64); a tokenizer far smaller than the table is someone else's."""
    folder = t5_folder(tmp_path / "t5", rows=256)
    with pytest.raises(ValueError, match=r"The tokenizer has 68 tokens, but .* has 256 rows in its embedding table: "
                                         "they do not belong together"):
        convert(folder)


def test_trunk_import_without_the_package_says_how_to_install_it_and_writes_nothing(tmp_path, monkeypatch):
    from trunk.cli.import_model import import_main

    folder = t5_folder(tmp_path / "t5", rows=128)
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with pytest.raises(SystemExit, match=r'^error: .*spiece.model\' is a SentencePiece model; reading it needs the '
                                         r'sentencepiece package: pip install "trunk\[sentencepiece\]"'):
        import_main([str(folder), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_deberta_v3_folder_imports_with_its_sentencepiece_file_and_the_ids_transformers_gives(tmp_path):
    """DeBERTa-v3 ships spm.model ([PAD] [CLS] [SEP] [UNK] first) and a tokenizer_config.json naming no tokens: [MASK]
    comes after the pieces, [CLS] a [SEP] b [SEP] around pairs, as transformers' tokenizer numbers them; the embedding
    table has rows past the tokenizer (128,100 for 128,001 tokens at full size), filled with unused tokens; the
    encoder computes what transformers' does on those ids."""
    transformers = pytest.importorskip("transformers")
    from test_hf import DEBERTA_V3

    folder = tmp_path / "deberta"
    folder.mkdir()
    train_spm(folder / "spm", pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]",
              eos_piece="[SEP]", unk_piece="[UNK]")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "vocab_type": "spm"}))
    torch.manual_seed(0)
    config = transformers.DebertaV2Config(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, max_position_embeddings=64, position_buckets=8,
                                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **DEBERTA_V3)
    transformers.DebertaV2Model(config).save_pretrained(folder)
    pretrained, notes = convert(folder)
    theirs, ours = transformers.AutoTokenizer.from_pretrained(folder), pretrained.codec.tokenizer
    # transformers 5 normalises DeBERTa's text by NFC alone, where SentencePiece (which DeBERTa was trained with, and
    # transformers 4's tokenizer) applies the file's character map: a fullwidth word is [UNK] there, pieces here
    texts = [t for t in TEXTS if t and "ｆ" not in t]
    assert [ours.encode(t).ids for t in texts] == [theirs(t).input_ids for t in texts]
    assert ours.encode(*SENTENCES[:2]).ids == theirs(*SENTENCES[:2]).input_ids
    assert ours.token_to_id("[MASK]") == theirs.mask_token_id == spm.SentencePieceProcessor(
        model_file=str(folder / "spm.model")).get_piece_size()
    assert any("padded to the embedding table's 100 rows" in note for note in notes)
    assert_encodes_as(transformers.DebertaV2Model.from_pretrained(folder), theirs, pretrained)


def test_an_albert_folder_imports_with_its_sentencepiece_file_and_the_ids_transformers_gives(tmp_path):
    """ALBERT ships spiece.model (<pad> <unk> [CLS] [SEP] [MASK] first) and a tokenizer_config.json that lowercases and
    strips accents before SentencePiece: the same ids as transformers' tokenizer on mixed-case, accented text, pairs
    too; the encoder (one block shared by both layers) computes what transformers' does on them."""
    transformers = pytest.importorskip("transformers")

    folder = tmp_path / "albert"
    folder.mkdir()
    train_spm(folder / "spiece", pad_id=0, unk_id=1, bos_id=2, eos_id=3, bos_piece="[CLS]", eos_piece="[SEP]",
              control_symbols=["[MASK]"])
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "AlbertTokenizer", "do_lower_case": True, "keep_accents": False, "remove_space": True}))
    torch.manual_seed(0)
    config = transformers.AlbertConfig(vocab_size=spm.SentencePieceProcessor(model_file=str(folder / "spiece.model"))
                                       .get_piece_size(), embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    transformers.AlbertModel(config).save_pretrained(folder)
    pretrained, _ = convert(folder)
    theirs, ours = transformers.AutoTokenizer.from_pretrained(folder), pretrained.codec.tokenizer
    texts = [t for t in [*TEXTS, "THE FILM was ``great''", "Naïve CAFÉ"] if t]
    assert [ours.encode(t).ids for t in texts] == [theirs(t).input_ids for t in texts]
    assert ours.encode(*SENTENCES[:2]).ids == theirs(*SENTENCES[:2]).input_ids
    assert ours.token_to_id("[MASK]") == theirs.mask_token_id == 4
    assert_encodes_as(transformers.AlbertModel.from_pretrained(folder), theirs, pretrained)
