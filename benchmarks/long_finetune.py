"""A fine-tuning step on long inputs, Trunk beside ``transformers`` on the same weights: a sequence classifier of a
model folder's shape (ModernBERT-base's, whose local and global blocks are made for long inputs), a batch of
``--batch`` inputs of which the first is ``--length`` tokens and each next one ``--ragged`` shorter (padding that
``transformers``' ModernBERT computes on a CPU, where it has no flash attention to unpad with, and Trunk skips), one
forward + backward + AdamW step. Both sides in this process, alternating, the median of ``--rounds``. Prints a table.

    python benchmarks/random_shapes.py modernbert-base /tmp/modernbert-base \\
        --tokenizer ../shared/data/pretrained/all-MiniLM-L6-v2
    python benchmarks/long_finetune.py --model /tmp/modernbert-base --length 2048 --batch 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F


def inputs(length: int, batch: int, ragged: int, vocab: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (B, length), row i real for ``length - i * ragged`` tokens, padding after."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab, (batch, length), generator=generator)
    lengths = torch.tensor([length - i * ragged for i in range(batch)])
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    return ids.masked_fill(mask == 0, pad), mask


def training_step(model: torch.nn.Module, logits):
    """One forward (``logits(ids, mask)``) + backward + AdamW step of ``model``: the same for both sides."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step(ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype | None) -> None:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(logits(ids, mask).float(), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def trunk_side(folder: str):
    """Trunk's import of the folder with a pooled classification head: a step function."""
    from trunk.core.codec import PAD, special_id
    from trunk.formats.hf import convert
    from trunk.models import SequenceClassificationHead, build_trunk

    pretrained, _ = convert(folder)
    trunk = build_trunk(pretrained.config, pretrained.stems)
    trunk.load_state_dict(pretrained.trunk_weights)
    head = SequenceClassificationHead.for_trunk(pretrained.config, 2, "cls", 0.0, True)
    model = torch.nn.ModuleDict({"trunk": trunk, "head": head}).train()
    step = training_step(model, lambda ids, mask: head(trunk(ids, mask), mask))
    return step, special_id(pretrained.codec.tokenizer, PAD), pretrained.config.vocab_size


def transformers_side(folder: str):
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).train()
    return training_step(model, lambda ids, mask: model(input_ids=ids, attention_mask=mask).logits)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder (benchmarks/random_shapes.py)")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--ragged", type=int, default=512, help="each next input this many tokens shorter")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", choices=["32-true", "bf16-mixed"], default="32-true")
    args = parser.parse_args(argv)
    from trunk.training.precision import cpu_info

    torch.manual_seed(0)
    ours, pad, vocab = trunk_side(args.model)
    theirs = transformers_side(args.model)
    ids, mask = inputs(args.length, args.batch, args.ragged, vocab, pad)
    labels = torch.zeros(args.batch, dtype=torch.long)
    dtype = torch.bfloat16 if args.precision == "bf16-mixed" else None
    times = {"Trunk": [], "transformers": []}
    for step in (ours, theirs):  # warm-up: first-call allocations and kernels
        step(ids, mask, labels, dtype)
    for _ in range(args.rounds):
        for side, step in (("Trunk", ours), ("transformers", theirs)):
            start = time.perf_counter()
            step(ids, mask, labels, dtype)
            times[side].append(time.perf_counter() - start)
    trunk_s, hf_s = (statistics.median(times[side]) for side in ("Trunk", "transformers"))
    print(f"machine: {os.cpu_count()} x {cpu_info()}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    lengths = mask.sum(1).tolist()
    print(f"{args.model}: batch of {args.batch} ({lengths} real tokens, padded to {args.length}), {args.precision}, "
          f"forward + backward + AdamW, median of {args.rounds}")
    print("| side | s / step | real tokens / s |\n|---|---|---|")
    for side, seconds in (("Trunk", trunk_s), ("transformers", hf_s)):
        print(f"| {side} | {seconds:.2f} | {sum(lengths) / seconds:.0f} |")
    print(f"Trunk / transformers: {hf_s / trunk_s:.2f}x")


if __name__ == "__main__":
    main()
