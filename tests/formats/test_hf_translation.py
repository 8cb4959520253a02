"""Translation checkpoints into the trunk and its translation head (trunk/formats/hf.py), checked against
``transformers`` itself: Marian (opus-mt) models built here at random (no network), with two SentencePiece segmenters
trained here over one vocabulary, as ``save_pretrained`` and opus-mt ship them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

from test_hf import off_init, trunk_of  # noqa: E402

from trunk.core.contract import TaskSpec  # noqa: E402
from trunk.formats.hf import convert, map_weights  # noqa: E402
from trunk.tasks import Translation  # noqa: E402

ENGLISH = ["the cat sat on the mat .", "a dog runs in the park !", "two people are walking on the beach",
           "the children play football in the garden", "a man is reading a book on a bench"]
GERMAN = ["die katze sitzt auf der matte .", "ein hund rennt im park !", "zwei menschen gehen am strand",
          "die kinder spielen fussball im garten", "ein mann liest ein buch auf einer bank"]


def train_spm(sentences: list[str], size: int) -> bytes:
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences * 20), model_writer=model, vocab_size=size, model_type="unigram",
        hard_vocab_limit=False, character_coverage=1.0, minloglevel=2, unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    return model.getvalue()


def write_marian_tokenizer(folder: Path) -> dict[str, int]:
    """opus-mt's tokenizer files: source.spm and target.spm, and the vocab.json both number their pieces by (</s> 0,
    <unk> 1, the pieces of both segmenters, <pad> last)."""
    pieces = []
    for name, sentences in (("source.spm", ENGLISH), ("target.spm", GERMAN)):
        (folder / name).write_bytes(train_spm(sentences, 40))
        processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / name))
        pieces += [processor.id_to_piece(i) for i in range(3, processor.get_piece_size())]
    vocab = {piece: i for i, piece in enumerate(dict.fromkeys(["</s>", "<unk>", *pieces, "<pad>"]))}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    return vocab


def tiny_marian(folder: Path, eos_bias: float = 0.0, **options):
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_marian_tokenizer(folder)
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, activation_function="swish", scale_embedding=True,
        pad_token_id=vocab["<pad>"], eos_token_id=vocab["</s>"], decoder_start_token_id=vocab["<pad>"],
        forced_eos_token_id=None, **options)
    model = transformers.MarianMTModel(config).eval()
    off_init(model)
    with torch.no_grad():
        model.final_logits_bias.add_(torch.randn_like(model.final_logits_bias))
        model.final_logits_bias[0, vocab["</s>"]] += eos_bias  # hypotheses that end at different lengths
    model.save_pretrained(folder)
    return model


def translation_head(pretrained, trunk, decoder_layers: int) -> Translation:
    objective = Translation(decoder_layers=decoder_layers)
    objective.build("translation", trunk, TaskSpec(target_vocab_size=pretrained.config.vocab_size))
    objective.load_head(pretrained.heads["translation"]["state"], None, False, "test")
    objective.connect(pretrained.codec)
    return objective.eval()


def padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    length = max(map(len, rows))
    return torch.tensor([row + [pad] * (length - len(row)) for row in rows])


def test_marian_segmenters_encode_as_its_tokenizer_does(tmp_path):
    """Sources through source.spm, targets through target.spm, both numbered by vocab.json, inputs ending with </s>;
    decoding gives the text back."""
    tiny_marian(tmp_path / "hf")
    reference = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    pretrained, _ = convert(tmp_path / "hf")
    source, target = pretrained.codec.tokenizer, pretrained.codec.target("translation")
    texts = [*ENGLISH, "the dog sat in the garden .", "a cat !"]
    assert [source.encode(t).ids for t in texts] == reference(texts)["input_ids"]
    german = [*GERMAN, "die katze rennt im garten"]
    assert [target.encode(t, add_special_tokens=False).ids for t in german] == \
        [ids[:-1] for ids in reference(text_target=german)["input_ids"]]
    assert target.decode(target.encode(german[1]).ids, skip_special_tokens=True) == german[1]


@pytest.mark.parametrize("eos_bias", [0.0, 1.0], ids=["to-the-length-limit", "ending-early"])
def test_marian_teacher_forced_logits_greedy_and_beam_outputs_equal_transformers(eos_bias, tmp_path):
    """Marian: scaled embeddings, sinusoidal positions in halves, post-LN layers without an embedding norm, its output
    bias; the decoder starts from <pad>. Logits under teacher forcing within 1e-5; greedy and beam-4 outputs token for
    token as ``generate`` writes them."""
    model = tiny_marian(tmp_path / "hf", eos_bias=eos_bias)
    pretrained, notes = convert(tmp_path / "hf")
    assert any("'translation'" in note for note in notes)
    assert pretrained.config.positions == "sinusoidal_halves" and pretrained.config.scale_embedding
    trunk = trunk_of(pretrained)
    objective = translation_head(pretrained, trunk, 3)
    source, target = pretrained.codec.tokenizer, pretrained.codec.target("translation")
    special = objective.generation_ids
    assert special.bos == special.pad == model.config.pad_token_id and special.eos == model.config.eos_token_id
    ids = padded([source.encode(t).ids for t in ENGLISH[:3]], special.pad)
    mask = (ids != special.pad).long()
    targets = padded([[special.bos, *target.encode(t, add_special_tokens=False).ids] for t in GERMAN[:3]], special.pad)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=targets).logits
        ours = objective(trunk, {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": targets})
        assert (expected - ours).abs().max() < 1e-5
        # the same length limit on both sides
        steps = min(objective.generation.steps(int(mask.sum(1).max())), objective.decoder.cfg.max_len)
        for beams in (1, 4):
            generated = objective.generate(trunk, ids, mask, beam_size=beams)
            reference = model.generate(
                input_ids=ids, attention_mask=mask, num_beams=beams, do_sample=False, early_stopping=True,
                max_new_tokens=steps, min_length=0, length_penalty=1.0,
                bad_words_ids=[[t] for t in special.banned])[:, 1:]
            cut = lambda row: row[: row.index(special.eos) + 1] if special.eos in row else row  # noqa: E731
            assert [cut(row) for row in generated.tolist()] == [cut(row) for row in reference.tolist()], beams


def test_opus_mt_en_de_maps_on_the_meta_device():
    """Helsinki-NLP/opus-mt-en-de's config.json (6 + 6 layers, width 512, 58,101 tokens): every weight mapped, none
    left over, on the meta device."""
    values = {"model_type": "marian", "vocab_size": 58101, "d_model": 512, "encoder_layers": 6, "decoder_layers": 6,
              "encoder_attention_heads": 8, "decoder_attention_heads": 8, "encoder_ffn_dim": 2048,
              "decoder_ffn_dim": 2048, "activation_function": "swish", "max_position_embeddings": 512,
              "scale_embedding": True, "pad_token_id": 58100, "decoder_start_token_id": 58100, "eos_token_id": 0,
              "share_encoder_decoder_embeddings": True, "normalize_before": False}
    with torch.device("meta"):
        model = transformers.MarianMTModel(transformers.MarianConfig(**values))
    tensors = {**model.state_dict(), "final_logits_bias": model.final_logits_bias}
    mapped = map_weights(values, tensors, "opus-mt-en-de")
    assert mapped.config.n_layers == 6 and mapped.config.activation == "silu"
    state = mapped.heads["translation"]["state"]
    assert state["decoder.output_bias"].shape == (58101,) and len([k for k in state if "cross_attn.q_proj.w" in k]) == 6


@pytest.mark.parametrize("absent", ["target.spm", "vocab.json"])
def test_a_marian_folder_missing_a_segmenter_is_named(absent, tmp_path):
    tiny_marian(tmp_path / "hf")
    (tmp_path / "hf" / absent).unlink()
    with pytest.raises(FileNotFoundError, match=f"Marian model without {absent}"):
        convert(tmp_path / "hf")


LANGUAGES = {"m2m_100": ("eng_Latn", "deu_Latn", "fra_Latn"), "mbart": ("en_XX", "de_DE", "fr_XX")}


def write_multilingual_tokenizer(folder: Path, codes: tuple[str, ...]) -> dict[str, int]:
    """An NLLB or mBART-50 kind of tokenizer.json: <s> <pad> </s> <unk>, the pieces, the language codes as special
    tokens after them, and inputs framed ``code A </s>`` with the first code (the saved default source language)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.train_from_iterator(ENGLISH + GERMAN, trainers.BpeTrainer(
        vocab_size=150, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], show_progress=False))
    tokenizer.add_special_tokens(list(codes))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{codes[0]} $A </s>", pair=f"{codes[0]} $A $B </s>",
        special_tokens=[(codes[0], tokenizer.token_to_id(codes[0])), ("</s>", 2)])
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer.get_vocab()


def tiny_multilingual(model_type: str, folder: Path):
    """A random NLLB (model type m2m_100) or mBART-50 translator with its kind of tokenizer, saved."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_multilingual_tokenizer(folder, LANGUAGES[model_type])
    torch.manual_seed(0)
    shape = dict(vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                 dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True, pad_token_id=1,
                 bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
    if model_type == "m2m_100":
        model = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**shape))
    else:
        model = transformers.MBartForConditionalGeneration(transformers.MBartConfig(**shape))
        with torch.no_grad():
            model.final_logits_bias.add_(torch.randn_like(model.final_logits_bias))
    off_init(model.eval())
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("model_type", ["m2m_100", "mbart"])
def test_nllb_and_mbart_logits_and_outputs_with_the_languages_forced_equal_transformers(model_type, tmp_path):
    """NLLB (pre-LN, tensor2tensor sinusoids from position 2, scaled embeddings, no output bias) and mBART-50
    (pre-LN with embedding and final norms, learned positions, its output bias): the decoder starts from </s> as
    stored with the head, the target language's code comes first (forced when generating), the source language's
    replaces the tokenizer's default. Logits within 1e-5; greedy and beam-4 outputs as ``generate`` writes them."""
    from trunk.core.codec import with_first_token

    model = tiny_multilingual(model_type, tmp_path / "hf")
    _, german, french = LANGUAGES[model_type]
    pretrained, notes = convert(tmp_path / "hf")
    assert any("starts from '</s>'" in note for note in notes)
    stored = pretrained.heads["translation"]["meta"]["objective"]["init_args"]
    assert stored["decoder_start"] == "</s>"
    trunk = trunk_of(pretrained)
    objective = Translation(**{**stored, "target_language": german})
    objective.build("translation", trunk, TaskSpec(target_vocab_size=pretrained.config.vocab_size))
    objective.load_head(pretrained.heads["translation"]["state"], None, False, "test")
    objective.connect(pretrained.codec)
    objective.eval()
    source = with_first_token(pretrained.codec.tokenizer, french, "source_language")
    rows = [source.encode(t).ids for t in ENGLISH[:3]]
    assert all(row[0] == source.token_to_id(french) and row[-1] == 2 for row in rows)
    special = objective.generation_ids
    assert (special.bos, special.forced) == (2, (source.token_to_id(german),))
    ids = padded(rows, special.pad)
    mask = (ids != special.pad).long()
    targets = [source.encode(t, add_special_tokens=False).ids for t in GERMAN[:3]]
    data_start = 0  # what the data writes first (<s>): the objective reads its own start and the language instead
    batch = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": padded([[data_start, *t] for t in targets],
                                                                                   special.pad)}
    theirs = padded([[2, special.forced[0], *t] for t in targets], special.pad)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=theirs).logits
        real = theirs != special.pad
        assert (expected - objective(trunk, batch))[real].abs().max() < 1e-5
        steps = min(objective.generation.steps(int(mask.sum(1).max())), objective.decoder.cfg.max_len)
        for beams in (1, 4):
            generated = objective.generate(trunk, ids, mask, beam_size=beams)
            reference = model.generate(
                input_ids=ids, attention_mask=mask, num_beams=beams, do_sample=False, early_stopping=True,
                decoder_start_token_id=2, forced_bos_token_id=special.forced[0], max_new_tokens=steps, min_length=0,
                length_penalty=1.0, bad_words_ids=[[t] for t in special.banned])[:, 1:]
            cut = lambda row: row[: row.index(special.eos) + 1] if special.eos in row else row  # noqa: E731
            assert [cut(row) for row in generated.tolist()] == [cut(row) for row in reference.tolist()], beams
            assert all(row[0] == special.forced[0] for row in generated.tolist())


def test_an_m2m100_folder_without_a_tokenizer_json_encodes_as_transformers(tmp_path):
    """M2M100 (facebook/m2m100_418M) ships its SentencePiece BPE file and fairseq's vocab.json, no tokenizer.json: the
    pieces are numbered by vocab.json (here in another order than the file's), the 100 language codes after them,
    each input framed as __en__ ... </s> (another source language through source_language's code), as
    ``M2M100Tokenizer`` does; fairseq's 8 made-up words fill the table's last rows."""
    spm = pytest.importorskip("sentencepiece")
    from test_spm import train_spm

    from trunk.core.codec import with_first_token

    folder = tmp_path / "m2m100"
    folder.mkdir()
    train_spm(folder / "sentencepiece.bpe", "bpe", unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    processor = spm.SentencePieceProcessor(model_file=str(folder / "sentencepiece.bpe.model"))
    pieces = [processor.id_to_piece(i) for i in range(3, processor.get_piece_size())]
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{p: 4 + i for i, p in enumerate(reversed(pieces))}}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "M2M100Tokenizer", "src_lang": "en",
                                                              "language_codes": "m2m100"}))
    config = transformers.M2M100Config(vocab_size=len(vocab) + 100 + 8, d_model=32, encoder_layers=1, decoder_layers=1,
                                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                       decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=1,
                                       decoder_start_token_id=2)
    transformers.M2M100ForConditionalGeneration(config).save_pretrained(folder)
    pretrained, notes = convert(folder)
    theirs, ours = transformers.AutoTokenizer.from_pretrained(folder), pretrained.codec.tokenizer
    texts = [*ENGLISH, "Unseen ZEBRA, quartz!"]
    assert [ours.encode(t).ids for t in texts] == [theirs(t).input_ids for t in texts]
    theirs.src_lang = "fr"
    french = with_first_token(ours, "__fr__", "source_language")
    assert [french.encode(t).ids for t in texts] == [theirs(t).input_ids for t in texts]
    assert ours.token_to_id("__de__") == theirs.get_lang_id("de") == len(vocab) + 16
    assert ours.get_vocab_size() == config.vocab_size and not any("padded" in note for note in notes)


def test_a_target_language_not_in_the_vocabulary_is_named(tmp_path):
    tiny_multilingual("m2m_100", tmp_path / "hf")
    pretrained, _ = convert(tmp_path / "hf")
    objective = Translation(decoder_layers=3, target_language="deu_Latin")
    objective.build("translation", trunk_of(pretrained), TaskSpec(target_vocab_size=pretrained.config.vocab_size))
    with pytest.raises(ValueError, match=r"target_language='deu_Latin' is not a token .* like it: \['deu_Latn',"):
        objective.connect(pretrained.codec)


@pytest.mark.parametrize("model_type,values", [
    ("m2m_100", {"vocab_size": 256206, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,  # NLLB-600M
                 "encoder_attention_heads": 16, "decoder_attention_heads": 16, "encoder_ffn_dim": 4096,
                 "decoder_ffn_dim": 4096, "activation_function": "relu", "max_position_embeddings": 1024,
                 "scale_embedding": True, "pad_token_id": 1, "decoder_start_token_id": 2}),
    ("mbart", {"vocab_size": 250054, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,  # mbart-large-50
               "encoder_attention_heads": 16, "decoder_attention_heads": 16, "encoder_ffn_dim": 4096,
               "decoder_ffn_dim": 4096, "activation_function": "gelu", "max_position_embeddings": 1024,
               "scale_embedding": True, "pad_token_id": 1, "decoder_start_token_id": 2}),
], ids=["nllb-200-distilled-600M", "mbart-large-50"])
def test_real_size_translators_map_on_the_meta_device(model_type, values):
    """facebook/nllb-200-distilled-600M's and facebook/mbart-large-50's config.json: every weight mapped, none left
    over, on the meta device."""
    config = {"m2m_100": transformers.M2M100Config, "mbart": transformers.MBartConfig}[model_type](**values)
    with torch.device("meta"):
        model = {"m2m_100": transformers.M2M100ForConditionalGeneration,
                 "mbart": transformers.MBartForConditionalGeneration}[model_type](config)
    tensors = dict(model.state_dict())
    if model_type == "mbart":
        tensors["final_logits_bias"] = model.final_logits_bias
    mapped = map_weights({"model_type": model_type, **values}, tensors, model_type)
    assert mapped.config.norm == "pre" and mapped.config.n_layers == 12
    state = mapped.heads["translation"]["state"]
    assert state["decoder.final_norm.weight"].shape == (1024,) and state["decoder.output_bias"].shape == (
        values["vocab_size"],)


def test_marian_import_then_export_gives_transformers_the_same_model(tmp_path):
    """trunk import of an opus-mt folder, then trunk export --format hf: MarianMTModel loads the folder with every
    weight equal to the original's, and the two tokenizers come along as tokenizer.json and target_tokenizer.json."""
    from tokenizers import Tokenizer

    from trunk.cli import export_main
    from trunk.cli.import_model import import_main

    model = tiny_marian(tmp_path / "hf", eos_bias=1.0)
    import_main([str(tmp_path / "hf"), str(tmp_path / "trunk")])
    export_main([str(tmp_path / "trunk"), str(tmp_path / "out"), "--format", "hf"])
    back = transformers.MarianMTModel.from_pretrained(tmp_path / "out").eval()
    original = model.state_dict()
    for name, tensor in back.state_dict().items():
        if "embed_positions" not in name:  # fixed tables, computed by each side
            assert torch.equal(tensor, original[name]), name
    assert back.config.decoder_start_token_id == model.config.decoder_start_token_id
    pretrained, _ = convert(tmp_path / "hf")
    target = Tokenizer.from_file(str(tmp_path / "out" / "target_tokenizer.json"))
    ours = pretrained.codec.target("translation")
    assert [target.encode(t).ids for t in GERMAN] == [ours.encode(t).ids for t in GERMAN]


def test_a_translator_marian_cannot_compute_is_refused_by_name(tmp_path):
    from trunk.cli import export_main
    from trunk.cli.import_model import import_main

    tiny_multilingual("m2m_100", tmp_path / "hf")
    import_main([str(tmp_path / "hf"), str(tmp_path / "trunk")])
    with pytest.raises(SystemExit, match="positions='sinusoidal_t2t' \\(Marian: 'sinusoidal_halves'\\)"):
        export_main([str(tmp_path / "trunk"), str(tmp_path / "out"), "--format", "hf"])
    assert not (tmp_path / "out").exists()
