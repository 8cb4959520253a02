"""How long `trunk import` takes on a BERT-base-sized checkpoint, and how much memory it needs beside the weights.

    pip install -e ".[bench]"
    python benchmarks/import_speed.py [--model-type bert|roberta|electra|distilbert] [--repeats 3]

A randomly initialised ``…ForMaskedLM`` of the model type's default (base) size is written with transformers'
``save_pretrained`` (safetensors) beside a BERT tokenizer; then ``trunk import`` runs in a fresh process, timed from
start to exit, and its peak resident memory is read from the kernel (``ru_maxrss``). The process that only imports
Trunk's modules is measured the same way, so the table separates the interpreter and its libraries from what the
import of the weights costs; the last row times the reading and mapping (``convert``) and the writing
(``save_pretrained``) inside this process, where the libraries are already loaded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def run(args: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of a fresh ``python args`` process."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args} failed: {process.stderr.read().decode()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024  # KiB on Linux


# the base size where a family's default config is another (ALBERT's is xxlarge, DeBERTa-v2's xlarge)
BASE = {
    "albert": dict(vocab_size=30000, embedding_size=128, hidden_size=768, num_attention_heads=12,  # albert-base-v2
                   intermediate_size=3072),
    "deberta-v2": dict(vocab_size=128100, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,  # v3-base
                       intermediate_size=3072, relative_attention=True, pos_att_type=["p2c", "c2p"],
                       position_buckets=256, max_relative_positions=-1, position_biased_input=False,
                       share_att_key=True, norm_rel_ebd="layer_norm", type_vocab_size=0, layer_norm_eps=1e-7),
}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-type", default="bert")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args(argv)
    import transformers

    from trunk.formats.hf import convert
    from trunk.formats.trunk_dir import save_pretrained
    from trunk.training.precision import cpu_info

    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "hf", Path(tmp) / "trunk"
        config = transformers.AutoConfig.for_model(options.model_type, **BASE.get(options.model_type, {}))
        model = transformers.AutoModelForMaskedLM.from_config(config)
        model.save_pretrained(source)
        del model
        (source / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
            f"w{i}" for i in range(config.vocab_size - 5)]) + "\n")
        weights = sum(f.stat().st_size for f in source.glob("*.safetensors")) / 2**20
        bare = [run(["-c", "import trunk.cli, trunk.formats.hf"]) for _ in range(options.repeats)]
        imports = [run(["-m", "trunk.cli", "import", str(source), str(out), "--overwrite"])
                   for _ in range(options.repeats)]
        in_process = []  # the work itself, the libraries loaded: read and map, then write the trunk directory
        for _ in range(options.repeats):
            start = time.perf_counter()
            pretrained, _ = convert(source)
            mapped = time.perf_counter()
            save_pretrained(out, pretrained, overwrite=True)
            in_process.append((mapped - start, time.perf_counter() - mapped))
            del pretrained
    print(f"machine: {os.cpu_count()} x {cpu_info()}, torch {torch.__version__}")
    print(f"{options.model_type} at its base size, weights {weights:.0f} MiB (safetensors), median of "
          f"{options.repeats}:")
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    b_time, b_rss = median([t for t, _ in bare]), median([m for _, m in bare])
    i_time, i_rss = median([t for t, _ in imports]), median([m for _, m in imports])
    print("| process | wall s | peak RSS MiB | beside the libraries, MiB | x the weights |")
    print("|---|---|---|---|---|")
    print(f"| python -c 'import trunk.cli' (the libraries) | {b_time:.1f} | {b_rss:.0f} | | |")
    print(f"| trunk import | {i_time:.1f} | {i_rss:.0f} | {i_rss - b_rss:.0f} | {(i_rss - b_rss) / weights:.2f} |")
    read, write = median([r for r, _ in in_process]), median([w for _, w in in_process])
    print(f"| in one process, libraries loaded: read + map / write the directory | {read:.1f} / {write:.1f} | | | |")


if __name__ == "__main__":
    main(sys.argv[1:])
