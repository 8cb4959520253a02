"""WordPiece tokenizers: train one on the training text, or load one saved with an earlier run."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]  # PAD is id 0, UNK 1, CLS 2, SEP 3, MASK 4


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
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    for value in ckpt.values():
        if isinstance(value, dict) and key in value:
            return Tokenizer.from_str(value[key])
    raise ValueError(f"Checkpoint {path} holds no tokenizer: it was not written by a Trunk text datamodule.")


def load_tokenizer(path: str | Path, checkpoint_key: str = "tokenizer_json") -> Tokenizer:
    """Load a tokenizer from a ``tokenizer.json``, a directory holding one, or a Lightning checkpoint
    (the datamodule state's ``checkpoint_key``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"Tokenizer not found at '{path}'. Pass a tokenizer.json, a directory containing one, or a "
            ".ckpt written by Trunk; or leave data.tokenizer unset to train a new one on the training split."
        )
    if path.suffix == ".ckpt":
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
