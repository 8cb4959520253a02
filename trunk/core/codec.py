"""The run's codec: the tokenizers every text task and the model share, their special ids, and how a
tokenizer is read back from a file, a trunk directory or a checkpoint. (Training one is the data's job:
``trunk.datamodules.tokenizer``.)"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from trunk.core.checkpoint import load_checkpoint

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]  # PAD is id 0, UNK 1, CLS 2, SEP 3, MASK 4
SPECIAL_IDS = {token: i for i, token in enumerate(SPECIAL_TOKENS)}  # every Trunk tokenizer has these ids
# the same roles as RoBERTa's (byte-level BPE) and many SentencePiece tokenizers spell them: an imported model's
# tokenizer keeps its own spelling, and Trunk finds each role by either (``special_id``)
OTHER_SPELLING = {PAD: "<pad>", UNK: "<unk>", CLS: "<s>", SEP: "</s>", MASK: "<mask>"}
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
    def from_state(cls, state: dict) -> Codec:
        tokenizer = Tokenizer.from_str(state["tokenizer_json"]) if "tokenizer_json" in state else None
        targets = {
            key.split("/", 1)[1]: Tokenizer.from_str(v) for key, v in state.items() if key.startswith(f"{TARGET_KEY}/")
        }
        return cls(tokenizer, targets)


TARGET_KEY = "target_tokenizer_json"


def special_id(tokenizer: Tokenizer | None, token: str) -> int | None:
    """The id of the special token of ``token``'s role (one of ``SPECIAL_TOKENS``), as BERT spells it or as RoBERTa
    does (``OTHER_SPELLING``); None if the tokenizer has neither. No tokenizer: Trunk's own tokenizers' id."""
    if tokenizer is None:
        return SPECIAL_IDS[token]
    found = tokenizer.token_to_id(token)
    return found if found is not None else tokenizer.token_to_id(OTHER_SPELLING[token])


def tokenizer_from_checkpoint(path: Path, ckpt: dict | None = None, key: str = "tokenizer_json") -> Tokenizer:
    """The tokenizer a Trunk run stored inside a Lightning checkpoint (``ckpt``: already loaded)."""
    ckpt = load_checkpoint(path) if ckpt is None else ckpt
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
    check_padding(tokenizer, str(path))
    return tokenizer


def check_padding(tokenizer: Tokenizer, source: str) -> None:
    """Every tokenizer needs a padding token; the other roles ([CLS], [SEP], [MASK], [UNK]) only the tasks that use
    them, which say so (T5's and Marian's tokenizers have no [CLS] or [MASK])."""
    if special_id(tokenizer, PAD) is None:
        raise ValueError(f"Tokenizer '{source}' has no padding token ({PAD} or {OTHER_SPELLING[PAD]}), which every "
                         "batch needs.")


def required_id(tokenizer: Tokenizer, token: str, needed_for: str) -> int:
    """``special_id``, or an error saying who needs the role (``needed_for``) and that the tokenizer lacks it."""
    found = special_id(tokenizer, token)
    if found is None:
        raise ValueError(f"{needed_for} needs a {token} token ({OTHER_SPELLING[token]} in RoBERTa's spelling), and "
                         "this tokenizer has neither.")
    return found


def fingerprint(tokenizer: Tokenizer) -> str:
    """What a tokenizer encodes to, as a digest: its vocabulary, model and pipeline, not the truncation
    and padding settings that encoding switches on and off."""
    state = json.loads(tokenizer.to_str())
    state.pop("truncation", None)
    state.pop("padding", None)
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def cache_dir() -> Path:
    """Where Trunk caches trained tokenizers: $TRUNK_CACHE, else ~/.cache/trunk."""
    return Path(
        os.environ.get("TRUNK_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trunk"
    )


def cache_folder(kind: str) -> Path | None:
    """``cache_dir() / kind``, made if need be; None, said once, where it cannot be written (a read-only disk, a
    TRUNK_CACHE that is a file): the run then caches nothing rather than failing on the cache."""
    path = cache_dir() / kind
    try:
        path.mkdir(parents=True, exist_ok=True)
        reason = None if os.access(path, os.W_OK | os.X_OK) else "this user cannot write there"
    except OSError as err:
        reason = err.strerror or str(err)
    if reason is None:
        return path
    if str(cache_dir()) not in _UNWRITABLE:
        _UNWRITABLE.add(str(cache_dir()))
        warnings.warn(f"Trunk's cache '{cache_dir()}' cannot be used ({reason}): this run caches nothing, so trained "
                      "tokenizers and encoded data are made again next time. Point TRUNK_CACHE at a folder you can "
                      "write to.", stacklevel=2)
    return None


_UNWRITABLE: set[str] = set()  # caches already said to be unusable


LANGUAGE_CODES = ("Give a language code the model's tokenizer has (NLLB's are like deu_Latn, mBART-50's like de_DE, "
                  "M2M100's like __de__).")


def like(tokenizer: Tokenizer, token: str) -> str:
    """The tokenizer's tokens closest to a misspelt ``token``, said in a few words (empty: none close)."""
    near = difflib.get_close_matches(token, list(tokenizer.get_vocab()), n=5, cutoff=0.6)
    return f" (tokens like it: {near})" if near else ""


def token_id(tokenizer: Tokenizer | None, token: str, option: str) -> int:
    """The id of ``token`` (a language code, a decoder's start), else an error naming ``option`` and the closest
    tokens."""
    found = None if tokenizer is None else tokenizer.token_to_id(token)
    if found is None:
        raise ValueError(f"{option}={token!r} is not a token of the tokenizer"
                         f"{'' if tokenizer is None else like(tokenizer, token)}. {LANGUAGE_CODES}")
    return found


def with_first_token(tokenizer: Tokenizer, token: str, option: str) -> Tokenizer:
    """A copy of ``tokenizer`` whose inputs start with ``token`` (a source language's code: NLLB's ``deu_Latn``,
    mBART-50's ``de_DE``), in place of the language code its template puts first (a special token of no role of
    ``SPECIAL_TOKENS``), or before everything where it puts none. ``option``: the setting that asked, for errors."""
    found = token_id(tokenizer, token, option)
    state = json.loads(tokenizer.to_str())
    template = state.get("post_processor") or {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A",
                                                                                                      "type_id": 0}}],
                                               "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                                        {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {}}
    if template["type"] != "TemplateProcessing":
        raise ValueError(f"{option}={token!r} puts a language code first, which Trunk does for tokenizers whose "
                         f"post-processor is a template (NLLB's, mBART-50's); this one's is {template['type']}.")
    roles = set(SPECIAL_TOKENS) | set(OTHER_SPELLING.values())
    first = {"SpecialToken": {"id": token, "type_id": 0}}
    for side in ("single", "pair"):
        pieces = template[side]
        codes = [i for i, piece in enumerate(pieces) if piece.get("SpecialToken", {}).get("id") not in (None, *roles)]
        for i in codes:
            pieces[i] = {"SpecialToken": {**pieces[i]["SpecialToken"], "id": token}}
        if not codes:
            pieces.insert(0, first)
    template["special_tokens"][token] = {"id": token, "ids": [found], "tokens": [token]}
    state["post_processor"] = template
    return Tokenizer.from_str(json.dumps(state))
