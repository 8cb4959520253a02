"""WordPiece tokenizers: train one on the training text, or load one saved with an earlier run."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from trunk.datamodules.atomic import atomic_write

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]  # PAD is id 0, UNK 1, CLS 2, SEP 3, MASK 4
SPECIAL_IDS = {token: i for i, token in enumerate(SPECIAL_TOKENS)}  # every Trunk tokenizer has these ids
IGNORE_INDEX = -100  # label positions that take no loss (cross_entropy's default ignore_index)


@dataclass
class Codec:
    """The run's tokenizers: one for every text input, plus a target tokenizer for each translation
    task with a vocabulary of its own. Built once by the data, handed to the model (decoding)."""

    tokenizer: Tokenizer | None = None
    targets: dict[str, Tokenizer] = field(default_factory=dict)

    def target(self, task: str) -> Tokenizer:
        tokenizer = self.targets.get(task, self.tokenizer)
        if tokenizer is None:
            raise ValueError(f"Task '{task}' has no tokenizer to decode with.")
        return tokenizer

    def state_dict(self) -> dict:
        """Plain strings, stored in every checkpoint (``tokenizer_from_checkpoint`` reads them back)."""
        state = {"tokenizer_json": self.tokenizer.to_str()} if self.tokenizer is not None else {}
        state.update({f"{TARGET_KEY}/{task}": t.to_str() for task, t in self.targets.items()})
        return state

    @classmethod
    def from_state(cls, state: dict) -> "Codec":
        tokenizer = Tokenizer.from_str(state["tokenizer_json"]) if "tokenizer_json" in state else None
        targets = {key.split("/", 1)[1]: Tokenizer.from_str(v) for key, v in state.items() if key.startswith(f"{TARGET_KEY}/")}
        return cls(tokenizer, targets)


TARGET_KEY = "target_tokenizer_json"


def _add_bert_template(tokenizer: Tokenizer) -> None:
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )


def train_wordpiece(texts: Iterable[str], vocab_size: int = 8192, lowercase: bool = True, min_frequency: int = 2) -> Tokenizer:
    """Train a BERT-style WordPiece tokenizer ([CLS] a [SEP] b [SEP]) on ``texts``."""
    tokenizer = Tokenizer(models.WordPiece(unk_token=UNK))
    steps = [normalizers.NFD(), normalizers.StripAccents()]
    if lowercase:
        steps.insert(0, normalizers.Lowercase())
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    _add_bert_template(tokenizer)
    return tokenizer


def train_bpe(texts: Iterable[str], vocab_size: int = 8192, lowercase: bool = False, min_frequency: int = 2) -> Tokenizer:
    """Train a SentencePiece-style BPE tokenizer: spaces are kept as "▁" inside the tokens, so
    ``decode`` gives the text back exactly (detokenized), which generated text needs."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), *([normalizers.Lowercase()] if lowercase else [])])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    _add_bert_template(tokenizer)
    return tokenizer


def tokenizer_from_checkpoint(path: Path, ckpt: dict | None = None, key: str = "tokenizer_json") -> Tokenizer:
    """The tokenizer a Trunk datamodule stored inside a Lightning checkpoint (``ckpt``: already loaded)."""
    if ckpt is None:
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch's own message would suggest weights_only=False, which runs code
            raise ValueError(f"'{path}' is not a readable Trunk checkpoint ({type(err).__name__}): pass a .ckpt written by "
                             "`trunk fit`, a tokenizer.json, or a trunk directory.") from None
    if not isinstance(ckpt, dict):
        raise ValueError(f"'{path}' is not a Trunk checkpoint (it holds a {type(ckpt).__name__}).")
    for value in ckpt.values():
        if isinstance(value, dict) and key in value:
            return Tokenizer.from_str(value[key])
    raise ValueError(f"Checkpoint {path} holds no tokenizer: it was not written by a Trunk text datamodule.")


def load_tokenizer(path: str | Path, checkpoint_key: str = "tokenizer_json") -> Tokenizer:
    """Load a tokenizer from a ``tokenizer.json``, a directory holding one, or a Lightning checkpoint
    (the datamodule state's ``checkpoint_key``)."""
    path = Path(path)
    if path.is_dir() and (path / "meta.pt").is_file():
        path = path / "meta.pt"  # a sharded checkpoint: the datamodule's state (its tokenizers) is in meta.pt
    elif path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"Tokenizer not found at '{path}'. Pass a tokenizer.json, a directory containing one, or a "
            ".ckpt written by Trunk; or leave data.tokenizer unset to train a new one on the training split."
        )
    if path.suffix in (".ckpt", ".pt"):
        tokenizer = tokenizer_from_checkpoint(path, key=checkpoint_key)
    else:
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # the Rust error says little about which file was bad
            raise ValueError(f"Could not read tokenizer file '{path}': {err}") from err
    missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
    if missing:
        raise ValueError(f"Tokenizer '{path}' lacks the special tokens {missing}; Trunk needs {SPECIAL_TOKENS}.")
    return tokenizer


TRAINERS = {"wordpiece": train_wordpiece, "bpe": train_bpe}


def fingerprint(tokenizer: Tokenizer) -> str:
    """What a tokenizer encodes to, as a digest: its vocabulary, model and pipeline, not the truncation
    and padding settings that encoding switches on and off."""
    state = json.loads(tokenizer.to_str())
    state.pop("truncation", None)
    state.pop("padding", None)
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def cache_dir() -> Path:
    """Where Trunk caches trained tokenizers: $TRUNK_CACHE, else ~/.cache/trunk."""
    return Path(os.environ.get("TRUNK_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trunk")


def cached_tokenizer(key: list, texts: Callable[[], Iterable[str]], model: str, vocab_size: int, lowercase: bool,
                     what: str = "the training text") -> Tokenizer:
    """Train a tokenizer once per (data, options) and cache it; ``key`` names the data.

    Tokenizer training is not deterministic across processes (hash-order tie breaks), so every DDP
    rank must read the same file rather than train its own: the launching process trains and
    caches before the other ranks start.
    """
    digest = hashlib.sha256(json.dumps([key, model, vocab_size, lowercase], default=str).encode()).hexdigest()[:20]
    path = cache_dir() / "tokenizers" / f"{digest}.json"
    if path.is_file():
        try:
            return load_tokenizer(path)
        except ValueError as err:  # a damaged cache entry is rebuilt, never a dead end
            rank_zero_warn(f"The cached tokenizer {path} is unreadable ({err}); training it again.")
    rank_zero_info(f"Training a {model} tokenizer of up to {vocab_size} tokens on {what} (once: it is cached)...")  # not a silent pause
    tokenizer = TRAINERS[model](texts(), vocab_size, lowercase)
    if tokenizer.get_vocab_size() < vocab_size:
        rank_zero_warn(f"Asked for {vocab_size} tokens, the tokenizer has {tokenizer.get_vocab_size()}: {what} has no more "
                       "pieces seen at least twice. That is fine: the vocabulary is what the data holds.")
    atomic_write(path, lambda tmp: tokenizer.save(str(tmp)))  # a concurrent reader sees no file or the whole file
    rank_zero_info(f"Trained a {model} tokenizer on {what} ({tokenizer.get_vocab_size()} tokens), cached at {path}.")
    return tokenizer
