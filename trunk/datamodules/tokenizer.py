"""Tokenizers trained on the training text (WordPiece, or BPE where text is generated), cached per data
and options. Reading one back, the special ids and the ``Codec`` live in ``trunk.core.codec``."""

from __future__ import annotations

import hashlib
import json
import re
import string
import unicodedata
from collections.abc import Callable, Iterable
from itertools import islice

from datasets.utils import are_progress_bars_disabled
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tokenizers import Encoding, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from trunk.core.atomic import atomic_write
from trunk.core.codec import CLS, SEP, SPECIAL_TOKENS, UNK, cache_folder, load_tokenizer


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


def _trained(tokenizer: Tokenizer, trainer_class, texts: Iterable[str], vocab_size: int, min_frequency: int,
             first_pieces: list[str] = (), **options) -> Tokenizer:
    """Train ``tokenizer`` on ``texts`` with the special tokens first, then add BERT's [CLS] a [SEP] b [SEP] template.
    ``first_pieces`` get the ids after the special tokens, in their order; they stay ordinary vocabulary entries."""
    trainer = trainer_class(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS + list(first_pieces),
        show_progress=show_progress(),
        **options,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # the trainer took them as special tokens, which would match their literal text before splitting: undo that
    if (first_pieces):
        state = json.loads(tokenizer.to_str())
        state["added_tokens"] = [token for token in state["added_tokens"] if token["content"] in SPECIAL_TOKENS]
        tokenizer = Tokenizer.from_str(json.dumps(state))
    _add_bert_template(tokenizer)
    return tokenizer


def _inside_word(char: str) -> bool:
    """A character BERT's pre-tokenizer keeps inside a word: not whitespace and not punctuation (ASCII's or Unicode's
    P*)."""
    return not char.isspace() and char not in string.punctuation and not unicodedata.category(char).startswith("P")


def _continuing_pieces(normalize: Callable[[str], str], texts: Iterable[str]) -> list[str]:
    """Every ``##c`` piece the text holds (a character ``c`` that follows another inside a normalized word), sorted.
    The WordPiece trainer creates these in hash-map order, so their ids, and through tie breaks between equally frequent
    pairs the merges themselves, differ from one process to the next (huggingface/tokenizers#1794). Given to it first,
    in a fixed order, they make the trained vocabulary the same in every process."""
    pairs, lines = set(), iter(texts)
    while chunk := list(islice(lines, 1000)):  # one normalizer call per chunk: per line it is several times slower
        text = normalize("\n".join(chunk))
        pairs.update(zip(text, text[1:]))
    return sorted({f"##{char}" for before, char in pairs if _inside_word(before) and _inside_word(char)})


def train_wordpiece(
    texts: Iterable[str], vocab_size: int = 8192, lowercase: bool = True, min_frequency: int = 2
) -> Tokenizer:
    """Train a BERT-style WordPiece tokenizer ([CLS] a [SEP] b [SEP]) on ``texts``: the same text gives the same
    vocabulary, ids included, in every process."""
    tokenizer = _bert_words(Tokenizer(models.WordPiece(unk_token=UNK)), lowercase)
    texts = list(texts) if iter(texts) is texts else texts  # read twice: an iterator is read once
    pieces = _continuing_pieces(tokenizer.normalizer.normalize_str, texts)
    return _trained(tokenizer, trainers.WordPieceTrainer, texts, vocab_size, min_frequency, first_pieces=pieces)


def train_bpe(
    texts: Iterable[str], vocab_size: int = 8192, lowercase: bool = False, min_frequency: int = 2
) -> Tokenizer:
    """Train a SentencePiece-style BPE tokenizer: spaces are kept as "▁" inside the tokens, so
    ``decode`` gives the text back exactly (detokenized), which generated text needs."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), *([normalizers.Lowercase()] if lowercase else [])])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    return _trained(tokenizer, trainers.BpeTrainer, texts, vocab_size, min_frequency)


def train_byte_bpe(
    texts: Iterable[str], vocab_size: int = 8192, lowercase: bool = False, min_frequency: int = 2
) -> Tokenizer:
    """Train a GPT-2-style byte-level BPE tokenizer: every byte is in the vocabulary, so no text (emoji, typos,
    other scripts in noisy user text) ever becomes [UNK]; it degrades into smaller pieces instead."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), *([normalizers.Lowercase()] if lowercase else [])])
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    return _trained(
        tokenizer,
        trainers.BpeTrainer,
        texts,
        vocab_size,
        min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )


def train_word(
    texts: Iterable[str], vocab_size: int = 8192, lowercase: bool = True, min_frequency: int = 2
) -> Tokenizer:
    """A word-level vocabulary (BERT's word splitting): a word seen fewer than ``min_frequency`` times is [UNK]. On a
    few thousand examples this is what the classic models see: a rare word is one unknown slot rather than
    character pieces whose meaning the model memorises from the one question that held them."""
    tokenizer = _bert_words(Tokenizer(models.WordLevel(unk_token=UNK)), lowercase)
    return _trained(tokenizer, trainers.WordLevelTrainer, texts, vocab_size, min_frequency)


TRAINERS = {"wordpiece": train_wordpiece, "bpe": train_bpe, "byte_bpe": train_byte_bpe, "word": train_word}


LONGEST_WORD = 100  # characters: WordPiece reads a longer word as [UNK] (max_input_chars_per_word)
_LONG_WORD = re.compile(rf"\S{{{LONGEST_WORD + 1},}}")


class _Rereadable:
    """The text read afresh on every pass (WordPiece training reads it twice), never held in memory whole. Words
    longer than ``LONGEST_WORD`` characters (URLs, encoded blobs) are left out: one of a million characters would keep
    the trainer busy for minutes, and no tokenizer learns a piece from it."""

    def __init__(self, read: Callable[[], Iterable[str]]):
        self.read, self.skipped = read, 0

    def __iter__(self):
        skipped = 0
        for text in self.read():
            if len(text) > LONGEST_WORD and _LONG_WORD.search(text):
                text, n = _LONG_WORD.subn(" ", text)
                skipped += n
            yield text
        self.skipped = skipped


def cached_tokenizer(key: list, texts: Callable[[], Iterable[str]], model: str, vocab_size: int, lowercase: bool,
                     what: str = "the training text", min_frequency: int = 2) -> Tokenizer:
    """Train a tokenizer once per (data, options) and cache it; ``key`` names the data. A piece enters the
    vocabulary only if the text holds it ``min_frequency`` times: on a small text that keeps the vocabulary to
    pieces seen often enough to learn, where a large text fills ``vocab_size`` whatever the setting.

    Under DDP the launching process trains and caches before the other ranks start, and every rank reads that file.
    """
    # 2: the key as before
    options = [key, model, vocab_size, lowercase] + ([min_frequency] if min_frequency != 2 else [])
    digest = hashlib.sha256(json.dumps(options, default=str).encode()).hexdigest()[:20]
    folder = cache_folder("tokenizers")
    path = folder / f"{digest}.json" if folder is not None else None
    if path is not None and path.is_file():
        try:
            return load_tokenizer(path)
        except ValueError as err:  # a damaged cache entry is rebuilt, never a dead end
            rank_zero_warn(f"The cached tokenizer {path} is unreadable ({err}); training it again.")
    # not a silent pause
    rank_zero_info(f"Training a {model} tokenizer of up to {vocab_size} tokens on {what} (once: it is cached)...")
    text = _Rereadable(texts)
    tokenizer = TRAINERS[model](text, vocab_size, lowercase, min_frequency)
    if text.skipped:
        rank_zero_info(f"Left out of the tokenizer's training: {text.skipped} words longer than {LONGEST_WORD} "
                       "characters (URLs, encoded data), which it would read as one unknown piece anyway.")
    if tokenizer.get_vocab_size() < vocab_size:
        rank_zero_warn(
            f"Asked for {vocab_size} tokens, the tokenizer has {tokenizer.get_vocab_size()}: {what} has no more pieces "
            f"seen at least {min_frequency} times (data.tokenizer_min_frequency). That is fine: the vocabulary is what "
            "the data holds."
        )
    if path is not None:
        atomic_write(path, lambda tmp: tokenizer.save(str(tmp)))  # a concurrent reader sees no file or the whole file
    rank_zero_info(f"Trained a {model} tokenizer on {what} ({tokenizer.get_vocab_size()} tokens)"
                   + (f", cached at {path}." if path is not None else "."))
    return tokenizer


CHARS_PER_TOKEN = 32  # a generous bound: English averages 4-5 characters a WordPiece token


def cut_long_texts(tokenizer: Tokenizer, texts: list, max_length: int) -> list:
    """``texts`` (strings, or pairs of them) with each text far longer than ``max_length`` tokens can use cut before
    they are tokenized, so that they encode exactly as the whole texts do. Encoded whole, a 10 MB text is tokenized
    with every overflowing window to keep its first 128 tokens, and a pair of two 100 KB texts makes a window for
    every combination of their windows (quadratic: 10 GB). A text is cut at the start of a word (a pre-token), where
    it still has more than ``max_length`` tokens; in a pair, with the two lengths in the order of the whole texts
    (truncation gives the longer one the odd token). Each cut is checked to encode as the start of the whole text;
    a text with no such cut is encoded whole. ``tokenizer`` is left as it was given."""
    limit = CHARS_PER_TOKEN * max_length
    parts = [list(t) if isinstance(t, tuple) else [t] for t in texts]
    long = [(i, j) for i, ps in enumerate(parts) for j, p in enumerate(ps) if len(p) > limit]
    if not long:
        return texts
    setting = tokenizer.truncation
    tokenizer.no_truncation()
    try:
        heads = dict(zip(long, _encode(tokenizer, [parts[i][j][:limit] for i, j in long])))
        # A pair's short text, or both where both are long (which is longer decides the odd token), counted whole:
        # linear in their length; what costs is the overflowing windows, and they are not made here.
        counted = [(i, j) for i in {i for i, _ in long} if len(parts[i]) == 2 for j in (0, 1)
                   if (i, j) not in heads or (i, 1 - j) in heads]
        counts = dict(zip(counted, map(len, _encode(tokenizer, [parts[i][j] for i, j in counted]))))
        plans = {
            (i, j): k
            for i in {i for i, _ in long}
            for j, k in _cut_points(
                {j: _word_starts(heads[i, j]) for j in range(len(parts[i])) if (i, j) in heads},
                {j: counts[i, j] for j in range(len(parts[i])) if (i, j) in counts},
                max_length,
            ).items()
        }
        cuts = {(i, j): parts[i][j][: heads[i, j].offsets[k][0]].rstrip(" ") for (i, j), k in plans.items()}
        checked = dict(zip(cuts, _encode(tokenizer, list(cuts.values()))))
    finally:
        tokenizer.enable_truncation(**setting) if setting else tokenizer.no_truncation()
    wrong = {i for (i, j), e in checked.items() if e.ids != heads[i, j].ids[: plans[i, j]]}
    for (i, j), cut in cuts.items():
        if i not in wrong:
            parts[i][j] = cut
    return [tuple(ps) if isinstance(t, tuple) else ps[0] for t, ps in zip(texts, parts)]


def _encode(tokenizer: Tokenizer, strings: list[str]) -> list[Encoding]:
    return tokenizer.encode_batch(strings, add_special_tokens=False)


def _word_starts(encoding: Encoding) -> list[int]:
    """The token indices where a word (pre-token) begins, the first excluded, the last word's (perhaps cut) included."""
    words = encoding.word_ids
    return [k for k in range(1, len(words)) if words[k] != words[k - 1]]


def _cut_points(starts: dict[int, list[int]], counts: dict[int, int], max_length: int) -> dict[int, int]:
    """The token count to cut each long part of one text at (``starts``: the word starts of each long part's head;
    ``counts``: the whole lengths of a pair's short part, or of both parts where both are long)."""
    if len(starts) == 1:  # one long text: its last word start, beyond max_length and the other text's length
        ((j, words),) = starts.items()
        k = words[-1] if words else 0
        return {j: k} if k > max([max_length, *counts.values()]) else {}
    longer = 0 if counts[0] >= counts[1] else 1
    if counts[0] == counts[1]:  # a tie stays a tie: both cut at one count
        common = sorted(set(starts[0]) & set(starts[1]))
        k_long = k_short = common[-1] if common else 0
    else:
        k_long = starts[longer][-1] if starts[longer] else 0
        below = [k for k in starts[1 - longer] if k < k_long]
        k_short = below[-1] if below else 0
    return {longer: k_long, 1 - longer: k_short} if k_short > max_length else {}
