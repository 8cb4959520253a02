"""A Hugging Face model folder of a real checkpoint's shape with random weights, for speed comparisons where the real
weights are not at hand (no network here): ``transformers`` builds the model from the shape's config and saves it,
with a tokenizer copied from another folder (its vocabulary sets the embedding table; the blocks are the shape's).

    python benchmarks/random_shapes.py deberta-v3-xsmall /tmp/deberta-v3-xsmall \\
        --tokenizer ../shared/data/pretrained/all-MiniLM-L6-v2
    python benchmarks/hf_finetune.py --model /tmp/deberta-v3-xsmall --task sst2 --max-batches 100 ...

Scores after training from random weights mean nothing; the seconds per epoch are the figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

# the published configs' architecture fields (microsoft/deberta-v3-xsmall's config.json)
SHAPES = {
    "deberta-v3-xsmall": {
        "model_type": "deberta-v2", "hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6,
        "intermediate_size": 1536, "max_position_embeddings": 512, "relative_attention": True, "position_buckets": 256,
        "norm_rel_ebd": "layer_norm", "share_att_key": True, "pos_att_type": "p2c|c2p", "layer_norm_eps": 1e-7,
        "max_relative_positions": -1, "position_biased_input": False, "type_vocab_size": 0, "hidden_act": "gelu",
    },
    "modernbert-base": {  # answerdotai/ModernBERT-base's config.json
        "model_type": "modernbert", "hidden_size": 768, "num_hidden_layers": 22, "num_attention_heads": 12,
        "intermediate_size": 1152, "max_position_embeddings": 8192, "local_attention": 128,
        "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
        "hidden_activation": "gelu", "norm_eps": 1e-5,
    },
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def write_random_model(shape: str, folder: Path, tokenizer: Path, seed: int = 0, **overrides) -> Path:
    """``folder`` holding a random ``shape`` model (fp32 safetensors; ``overrides`` on its config) and ``tokenizer``'s
    files."""
    import torch
    import transformers

    values = {**SHAPES[shape], **overrides}
    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, folder / name)
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    # the borrowed tokenizer's special ids, where the shape's config names its own vocabulary's
    ids = {f"{role}_token_id": vocab[token] for role, token in (("pad", "[PAD]"), ("cls", "[CLS]"), ("sep", "[SEP]"),
                                                                 ("bos", "[CLS]"), ("eos", "[SEP]")) if token in vocab}
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(values.pop("model_type"), vocab_size=len(vocab), **{**ids, **values})
    transformers.AutoModel.from_config(config).save_pretrained(folder)
    return folder


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=list(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True, help="a model folder whose tokenizer.json to copy")
    args = parser.parse_args(argv)
    if not (args.tokenizer / "tokenizer.json").is_file():
        sys.exit(f"error: '{args.tokenizer}' has no tokenizer.json: give a model folder that has one.")
    print(write_random_model(args.shape, args.out, args.tokenizer))


if __name__ == "__main__":
    main(sys.argv[1:])
