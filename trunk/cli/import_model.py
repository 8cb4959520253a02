"""``trunk import SRC DIR``: a model pretrained elsewhere (a Hugging Face model folder, or ``hf://ORG/NAME``) written as
a Trunk pretrained-trunk directory, which ``model.init_from``, ``heads_from``, PEFT, export, ONNX and ``trunk serve``
take as they take any trunk. (``model.init_from`` also reads such a folder directly; importing once skips the mapping
on every run.)"""

from __future__ import annotations

import sys
from pathlib import Path

from trunk.core.locks import writing_output_dir
from trunk.formats.artifacts import resolve_init_from
from trunk.formats.hf import FAMILIES, convert
from trunk.formats.hub import write_model_card
from trunk.formats.trunk_dir import save_pretrained


def import_main(args: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="trunk import",
        description="Write a pretrained-trunk directory from a Hugging Face model (config.json with model.safetensors "
                    f"or pytorch_model.bin, and its tokenizer), read without transformers. Model types: "
                    f"{', '.join(FAMILIES)}.",
    )
    parser.add_argument("src", help="a Hugging Face model folder, or hf://ORG/NAME[@REVISION]")
    parser.add_argument("dir", help="the directory to write: new, empty, or (with --overwrite) a trunk directory")
    parser.add_argument("--tokenizer", metavar="DIR", help="the folder of the model's tokenizer, where SRC has none")
    parser.add_argument("--overwrite", action="store_true", help="replace DIR (atomically) if it already holds a trunk")
    options = parser.parse_args(args)
    try:
        with writing_output_dir(Path(options.dir), "DIR"):  # one writer per output
            pretrained, notes = convert(resolve_init_from(options.src), options.tokenizer)
            path = save_pretrained(options.dir, pretrained, overwrite=options.overwrite)
            write_model_card(path, origin=options.src)
    except (PermissionError, FileNotFoundError, FileExistsError, ValueError, ImportError) as err:
        sys.exit(f"error: {err}")
    c = pretrained.config
    print(f"Wrote {path}: {c.n_layers} blocks of width {c.d_model}, {c.vocab_size} tokens"
          + (f"; {'; '.join(notes)}" if notes else "") + f". Fine-tune from it with --model.init_from={path}")
