"""A SentencePiece model (``spiece.model``, ``sentencepiece.bpe.model``) as a ``tokenizers``
tokenizer, the form every Trunk codec takes, for model folders that ship no ``tokenizer.json`` (T5 v1.1, mT5, many
others). It follows the model file's own settings, as ``transformers``' ``SpmConverter`` does, so that it encodes
like ``SentencePieceProcessor.encode``: the normalisation (its precompiled character map, extra spaces removed, the
dummy prefix, spaces as "▁"), unigram pieces with their scores or BPE merges ranked by score, byte fallback.

Reading the file needs the ``sentencepiece`` package (``pip install "trunk[sentencepiece]"``), for its protobuf
schema; the tokenizer it makes runs without it. Hand-written because ``tokenizers`` reads no SentencePiece file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from trunk.core.codec import CLS, MASK, SEP, special_id

SPM_FILES = ("spiece.model", "sentencepiece.bpe.model", "spm.model")  # T5 / mT5 / ALBERT, XLM-R / CamemBERT, DeBERTa-v3
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # ModelProto.SentencePiece.Type
UNIGRAM, BPE = 1, 2  # TrainerSpec.ModelType


def read_model(path: Path):
    """The file's ``ModelProto``; a clear error without the package or on a file that is not one."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:
        raise ImportError(f"'{path}' is a SentencePiece model; reading it needs the sentencepiece package: "
                          'pip install "trunk[sentencepiece]" (or give a folder with a tokenizer.json).') from None
    from google.protobuf.message import DecodeError

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except DecodeError as err:
        raise ValueError(f"'{path}' is not a SentencePiece model ({err}). Download the model again.") from None
    if not proto.pieces:
        raise ValueError(f"'{path}' is not a SentencePiece model: it holds no pieces. Download the model again.")
    return proto


def spm_tokenizer(path: str | Path, vocab: dict[str, int] | None = None) -> Tokenizer:
    """The SentencePiece model at ``path`` as a ``Tokenizer`` with the same pieces, ids and segmentation (special
    tokens and the post-processor are the caller's: they belong to the model, not to the file). ``vocab``: the ids are
    this vocabulary's instead of the file's (Marian's ``vocab.json``, which a source and a target segmenter share;
    M2M100's, fairseq's numbering): its pieces the file lacks are never chosen while segmenting (the other side's), the
    file's pieces it lacks are not written."""
    path = Path(path)
    proto = read_model(path)
    spec, trainer = proto.normalizer_spec, proto.trainer_spec
    pieces = [(p.piece, p.score) for p in proto.pieces]
    user_defined = [p.piece for p in proto.pieces if p.type == USER_DEFINED]
    if vocab is not None and trainer.model_type not in (UNIGRAM, BPE):
        raise ValueError(f"'{path}' is a SentencePiece {trainer.ModelType.Name(trainer.model_type)} model; Trunk "
                         "reads a segmenter over a separate vocabulary (Marian's, M2M100's) for unigram and BPE "
                         "models only.")
    if vocab is not None and trainer.model_type == UNIGRAM:
        scores = dict(pieces)
        never = min(scores.values()) - 1e6  # far below any path of the file's own pieces
        by_id = sorted(vocab.items(), key=lambda item: item[1])
        model = models.Unigram([(piece, scores.get(piece, never)) for piece, _ in by_id], unk_id=vocab["<unk>"],
                               byte_fallback=trainer.byte_fallback)
    elif trainer.model_type == UNIGRAM:
        model = models.Unigram(pieces, unk_id=trainer.unk_id, byte_fallback=trainer.byte_fallback)
    elif trainer.model_type == BPE:  # numbered as the file does, or as ``vocab`` (which holds every piece of the file)
        vocab = vocab if vocab is not None else {piece: i for i, (piece, _) in enumerate(pieces)}
        normal = {p.piece: (p.score, i) for i, p in enumerate(proto.pieces) if p.type == NORMAL and p.piece in vocab}
        ranked = sorted((-normal[token][0], normal[token][1], token[:cut], token[cut:])
                        for token in normal for cut in range(1, len(token))
                        if token[:cut] in normal and token[cut:] in normal)  # merges ranked as the merged piece
        model = models.BPE(vocab, [(left, right) for _, _, left, right in ranked], unk_token=trainer.unk_piece,
                           fuse_unk=True, byte_fallback=trainer.byte_fallback,
                           ignore_merges=bool(user_defined))  # a user-defined piece is one pre-token, kept whole
    else:
        raise ValueError(f"'{path}' is a SentencePiece {trainer.ModelType.Name(trainer.model_type)} model; Trunk "
                         "reads unigram and BPE models (convert it to a tokenizer.json with transformers' "
                         "AutoTokenizer.from_pretrained(...).save_pretrained(DIR)).")
    tokenizer = Tokenizer(model)
    steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:  # spaces only: SentencePiece leaves other whitespace alone
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    if spec.add_dummy_prefix:  # Metaspace skips the prefix on a text that already starts with "▁"; SentencePiece not
        steps.append(normalizers.Replace(Regex(r"\A▁"), "▁▁"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    splits = [pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)] \
        if spec.add_dummy_prefix else []
    if user_defined:  # emitted whole, never merged
        pattern = "|".join(re.escape(p) for p in sorted(user_defined, key=len, reverse=True))
        splits.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
    if splits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(splits)
    steps = [decoders.Replace("▁", " ")] + ([decoders.ByteFallback()] if trainer.byte_fallback else [])
    if spec.add_dummy_prefix:
        steps += [decoders.Fuse(), decoders.Strip(content=" ", left=1)]
    elif trainer.byte_fallback:
        steps.append(decoders.Fuse())
    tokenizer.decoder = decoders.Sequence(steps)
    special = [p.piece for p in proto.pieces if p.type in (UNKNOWN, CONTROL) and (vocab is None or p.piece in vocab)]
    tokenizer.add_special_tokens(special)  # never split, skipped when decoding
    return tokenizer


def albert_normalizers(settings: dict) -> list:
    """What ALBERT's tokenizer does to a text before SentencePiece (transformers' ``AlbertConverter``): LaTeX quotes as
    ``"``, accents stripped unless ``keep_accents``, lowercased with ``do_lower_case``."""
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if not settings.get("keep_accents", False):
        steps += [normalizers.NFKD(), normalizers.StripAccents()]
    return steps + ([normalizers.Lowercase()] if settings.get("do_lower_case") else [])


def spm_folder_tokenizer(path: Path, settings: dict) -> Tokenizer:
    """A model folder's SentencePiece file with the tokens its ``tokenizer_config.json`` (``settings``) adds past the
    file's pieces (``added_tokens_decoder``, or T5's ``extra_ids`` sentinels) and the post-processor of its roles:
    ``<s> A </s>`` / ``[CLS] A [SEP]`` where the model has both, else ``A </s>`` (T5, Marian). A tokenizer whose ids
    are not the file's (fairseq's shifted layout: XLM-R, CamemBERT) is refused, never read shifted."""
    tokenizer = spm_tokenizer(path)
    if settings.get("do_lower_case") or settings.get("keep_accents") is False:  # ALBERT's text before its pieces
        tokenizer.normalizer = normalizers.Sequence([*albert_normalizers(settings), tokenizer.normalizer])
    size = tokenizer.get_vocab_size()
    added = {int(i): token["content"] for i, token in (settings.get("added_tokens_decoder") or {}).items()}
    if not added and settings.get("extra_ids"):  # T5's sentinels count down from the last id: <extra_id_0> is last
        added = {size + settings["extra_ids"] - 1 - n: f"<extra_id_{n}>" for n in range(settings["extra_ids"])}
    shifted = [f"{i} is '{token}' there but '{tokenizer.id_to_token(i)}' in the file" for i, token in
               sorted(added.items()) if i < size and tokenizer.id_to_token(i) != token]
    beyond = sorted(i for i in added if i >= size)
    if shifted or beyond != list(range(size, size + len(beyond))):
        raise ValueError(f"The tokenizer of '{path.parent}' numbers its tokens otherwise than '{path.name}' does "
                         f"({'; '.join(shifted[:3]) or f'added ids {beyond[:3]}... leave gaps after {size}'}): "
                         "Trunk reads a SentencePiece file only where its ids are the model's. Give a folder with "
                         "the model's tokenizer.json (transformers' AutoTokenizer.from_pretrained(...)"
                         ".save_pretrained(DIR) writes one).")
    tokenizer.add_special_tokens([added[i] for i in beyond])
    if tokenizer.token_to_id(CLS) is not None and tokenizer.token_to_id(MASK) is None:
        tokenizer.add_special_tokens([MASK])  # BERT's roles without a mask piece (DeBERTa-v3): the next id, as theirs
    cls, sep = special_id(tokenizer, CLS), special_id(tokenizer, SEP)
    sep_token = tokenizer.id_to_token(sep) if sep is not None else None
    if cls is not None and sep is not None:
        cls_token = tokenizer.id_to_token(cls)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls_token} $A {sep_token}", pair=f"{cls_token} $A {sep_token} $B:1 {sep_token}:1",
            special_tokens=[(cls_token, cls), (sep_token, sep)])
    elif sep is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {sep_token}", pair=f"$A {sep_token} $B:1 {sep_token}:1", special_tokens=[(sep_token, sep)])
    return tokenizer


MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")
# fairseq's language lists of M2M100 models (``tokenizer_config.json``'s ``language_codes``), space-separated: their
# codes' ids follow vocab.json's, in this order
M2M100_LANGUAGES = {
    "m2m100": "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi hr "
              "ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns oc or "
              "pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu",
    "wmt21": "en ha is ja cs ru zh de",
}


def read_vocab(path: Path, needed: tuple[str, ...]) -> dict[str, int]:
    """A ``vocab.json`` numbering pieces 0..n-1 and holding ``needed``; else an error naming the file."""
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"'{path}' is not valid JSON ({err}). Download the model again.") from None
    numbered = isinstance(vocab, dict) and sorted(vocab.values()) == list(range(len(vocab)))
    if not numbered or not set(needed) <= set(vocab):
        raise ValueError(f"'{path}' is not a vocabulary numbering its pieces 0..n-1 with {' and '.join(needed)}. "
                         "Download the model again.")
    return vocab


def m2m100_tokenizer(folder: Path, settings: dict) -> Tokenizer:
    """M2M100's tokenizer (facebook/m2m100_418M ships no ``tokenizer.json``): its SentencePiece BPE pieces numbered by
    ``vocab.json``, then its language codes (``__de__``) in fairseq's order and its 8 unused "made-up words", each
    input ``__en__ text </s>`` (the source language: ``tokenizer_config.json``'s ``src_lang``, or ``TranslationData``'s
    ``source_language``), as ``transformers``' ``M2M100Tokenizer`` numbers and frames them."""
    vocab = read_vocab(folder / "vocab.json", ("<s>", "<pad>", "</s>", "<unk>"))
    listing = settings.get("language_codes", "m2m100")
    if listing not in M2M100_LANGUAGES:
        raise ValueError(f"'{folder}' lists its languages as language_codes={listing!r}; Trunk knows "
                         f"{sorted(M2M100_LANGUAGES)}. Give the model's tokenizer.json instead.")
    tokenizer = spm_tokenizer(folder / "sentencepiece.bpe.model", vocab)
    languages = M2M100_LANGUAGES[listing].split()
    codes = [f"__{code}__" for code in languages]
    # the codes numbered after vocab.json's, then fairseq's unused rows that round the table up (num_madeup_words)
    madeup = [f"madeupword{i:04d}" for i in range(settings.get("num_madeup_words", 8))]
    tokenizer.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", *codes, *madeup])
    first = f"__{settings.get('src_lang') or 'en'}__"
    if tokenizer.token_to_id(first) is None:
        raise ValueError(f"'{folder}': src_lang={settings.get('src_lang')!r} is not one of its languages "
                         f"({', '.join(languages)}).")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{first} $A </s>", pair=f"{first} $A $B </s>",
        special_tokens=[(first, tokenizer.token_to_id(first)), ("</s>", vocab["</s>"])])
    return tokenizer


def marian_tokenizers(folder: Path) -> tuple[Tokenizer, Tokenizer]:
    """Marian's (opus-mt's) two segmenters over its one vocabulary: ``source.spm`` for the inputs and ``target.spm`` for
    the outputs, both numbering pieces as ``vocab.json`` does, each input ending with ``</s>``; its language codes
    (``>>fra<<``, leading a multilingual model's input) are whole tokens. ``transformers``' ``MarianTokenizer``
    encodes the same (without ``sacremoses``, whose punctuation normalisation it applies where installed)."""
    absent = [name for name in MARIAN_FILES if not (folder / name).is_file()]
    if absent:
        raise FileNotFoundError(f"'{folder}' is a Marian model without {' and '.join(absent)}: its tokenizer is two "
                                "SentencePiece segmenters (source.spm, target.spm) over vocab.json. Download the model "
                                "again, or give its tokenizer folder with --tokenizer DIR.")
    if (folder / "target_vocab.json").is_file():
        raise ValueError(f"'{folder}' has a target vocabulary of its own (target_vocab.json), which Trunk does not "
                         "read: it reads Marian models whose two sides share vocab.json.")
    vocab = read_vocab(folder / "vocab.json", ("<unk>", "</s>"))
    sides = []
    for name in ("source.spm", "target.spm"):
        tokenizer = spm_tokenizer(folder / name, vocab)
        codes = [piece for piece in vocab if piece.startswith(">>") and piece.endswith("<<")]
        tokenizer.add_special_tokens([t for t in ("</s>", "<pad>", "<unk>", *codes) if t in vocab])
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A $B:1 </s>:1", special_tokens=[("</s>", vocab["</s>"])])
        sides.append(tokenizer)
    return sides[0], sides[1]
