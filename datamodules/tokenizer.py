"""Tokenizers trained on the training text (WordPiece, or BPE where text is generated), cached per data
and options. Reading one back, the special ids and the ``Codec`` live in ``trunk.core.codec``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable

from datasets.utils import are_progress_bars_disabled
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from trunk.core.atomic import atomic_write
from trunk.core.codec import CLS, SEP, SPECIAL_TOKENS, UNK, cache_dir, load_tokenizer


def _add_bert_template(tokenizer: Tokenizer) -> None:
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )


def show_progress() -> bool:
    """Tokenizer training shows a bar when ``datasets`` shows its bars: one switch for every bar a run draws
    (the CLI sets it from trainer.enable_progress_bar)."""
    return not are_progress_bars_disabled()


def _bert_words(tokenizer: Tokenizer, lowercase: bool) -> Tokenizer:
    """BERT's text handling around a vocabulary model: accents stripped (and lowercased), split into words and
    punctuation, decoded with BERT's spacing."""
    steps = [normalizers.NFD(), normalizers.StripAccents()]
    if lowercase:
        steps.insert(0, normalizers.Lowercase())
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def _trained(tokenizer: Tokenizer, trainer_class, texts: Iterable[str], vocab_size: int, min_frequency: int, **options) -> Tokenizer:
    """Train ``tokenizer`` on ``texts`` with the special tokens first, then add BERT's [CLS] a [SEP] b [SEP] template."""
    trainer = trainer_class(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS,
                            show_progress=show_progress(), **options)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    _add_bert_template(tokenizer)
    return tokenizer


def train_wordpiece(texts: Iterable[str], vocab_size: int = 8192, lowercase: bool = True, min_frequency: int = 2) -> Tokenizer:
    """Train a BERT-style WordPiece tokenizer ([CLS] a [SEP] b [SEP]) on ``texts``."""
    tokenizer = _bert_words(Tokenizer(models.WordPiece(unk_token=UNK)), lowercase)
    return _trained(tokenizer, trainers.WordPieceTrainer, texts, vocab_size, min_frequency)


def train_bpe(texts: Iterable[str], vocab_size: int = 8192, lowercase: bool = False, min_frequency: int = 2) -> Tokenizer:
    """Train a SentencePiece-style BPE tokenizer: spaces are kept as "▁" inside the tokens, so
    ``decode`` gives the text back exactly (detokenized), which generated text needs."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), *([normalizers.Lowercase()] if lowercase else [])])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    return _trained(tokenizer, trainers.BpeTrainer, texts, vocab_size, min_frequency)


def train_byte_bpe(texts: Iterable[str], vocab_size: int = 8192, lowercase: bool = False, min_frequency: int = 2) -> Tokenizer:
    """Train a GPT-2-style byte-level BPE tokenizer: every byte is in the vocabulary, so no text (emoji, typos,
    other scripts in noisy user text) ever becomes [UNK]; it degrades into smaller pieces instead."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), *([normalizers.Lowercase()] if lowercase else [])])
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    return _trained(tokenizer, trainers.BpeTrainer, texts, vocab_size, min_frequency, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def train_word(texts: Iterable[str], vocab_size: int = 8192, lowercase: bool = True, min_frequency: int = 2) -> Tokenizer:
    """A word-level vocabulary (BERT's word splitting): a word seen fewer than ``min_frequency`` times is [UNK]. On a
    few thousand examples this is what the classic models see: a rare word is one unknown slot rather than
    character pieces whose meaning the model memorises from the one question that held them."""
    tokenizer = _bert_words(Tokenizer(models.WordLevel(unk_token=UNK)), lowercase)
    return _trained(tokenizer, trainers.WordLevelTrainer, texts, vocab_size, min_frequency)


TRAINERS = {"wordpiece": train_wordpiece, "bpe": train_bpe, "byte_bpe": train_byte_bpe, "word": train_word}


def cached_tokenizer(key: list, texts: Callable[[], Iterable[str]], model: str, vocab_size: int, lowercase: bool,
                     what: str = "the training text", min_frequency: int = 2) -> Tokenizer:
    """Train a tokenizer once per (data, options) and cache it; ``key`` names the data. A piece enters the
    vocabulary only if the text holds it ``min_frequency`` times: on a small text that keeps the vocabulary to
    pieces seen often enough to learn, where a large text fills ``vocab_size`` whatever the setting.

    Tokenizer training is not deterministic across processes (hash-order tie breaks), so every DDP
    rank must read the same file rather than train its own: the launching process trains and
    caches before the other ranks start.
    """
    options = [key, model, vocab_size, lowercase] + ([min_frequency] if min_frequency != 2 else [])  # 2: the key as before
    digest = hashlib.sha256(json.dumps(options, default=str).encode()).hexdigest()[:20]
    path = cache_dir() / "tokenizers" / f"{digest}.json"
    if path.is_file():
        try:
            return load_tokenizer(path)
        except ValueError as err:  # a damaged cache entry is rebuilt, never a dead end
            rank_zero_warn(f"The cached tokenizer {path} is unreadable ({err}); training it again.")
    rank_zero_info(f"Training a {model} tokenizer of up to {vocab_size} tokens on {what} (once: it is cached)...")  # not a silent pause
    tokenizer = TRAINERS[model](texts(), vocab_size, lowercase, min_frequency)
    if tokenizer.get_vocab_size() < vocab_size:
        rank_zero_warn(f"Asked for {vocab_size} tokens, the tokenizer has {tokenizer.get_vocab_size()}: {what} has no more "
                       f"pieces seen at least {min_frequency} times (data.tokenizer_min_frequency). That is fine: the vocabulary "
                       "is what the data holds.")
    atomic_write(path, lambda tmp: tokenizer.save(str(tmp)))  # a concurrent reader sees no file or the whole file
    rank_zero_info(f"Trained a {model} tokenizer on {what} ({tokenizer.get_vocab_size()} tokens), cached at {path}.")
    return tokenizer
