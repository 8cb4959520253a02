"""Paper estimates for GPUs this project could not measure on: masked-LM pretraining throughput on one
H100 and on 8, and the memory each GPU holds under DDP and FSDP. Prints a table; no GPU needed.

    python benchmarks/gpu_estimate.py [--mfu 0.4] [--scaling 0.9]

Throughput = peak x MFU / training FLOPs per token, with the FLOP count of benchmarks/throughput.py
(2 per multiply-add of every matmul; attention's two products; the MLM decoder at the 15% masked
positions; x3 for forward + backward). The peak is NVIDIA's dense bf16 figure for the H100 SXM
(989 TFLOP/s). MFU and the 8-GPU scaling efficiency are assumptions, stated in the table; the
recipe's own small model (width 256) gets a lower MFU because its matmuls are too small to fill
an H100. Memory per GPU counts bf16-mixed AdamW training: fp32 weights, fp32 gradients and two
fp32 AdamW moments, 16 bytes per parameter, all on every GPU under DDP and split N ways under FSDP
(plus one gathered block at a time in bf16); activations come on top and depend on the batch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

H100_BF16 = 989e12  # FLOP/s, dense, SXM
GIB = 2**30


@dataclass
class Model:
    name: str
    width: int
    depth: int
    ffn: int
    vocab: int
    length: int
    mfu: float | None = None  # None: the command line's

    @property
    def parameters(self) -> int:
        block = 4 * self.width * self.width + 2 * self.width * self.ffn + 4 * self.width + self.ffn + 4 * self.width
        return self.depth * block + self.vocab * self.width + self.length * self.width + self.width * self.width

    def block_parameters(self) -> int:
        return 4 * self.width * self.width + 2 * self.width * self.ffn

    def training_flops_per_token(self, mask_rate: float = 0.15) -> float:
        matmuls = 2 * self.depth * (4 * self.width * self.width + 2 * self.width * self.ffn)
        attention = self.depth * 4 * self.length * self.width
        head = mask_rate * 2 * (self.width * self.width + self.width * self.vocab)
        return 3 * (matmuls + attention + head)


MODELS = [
    Model("configs/pretrain.yaml (width 256, 4 blocks, 128 tokens)", 256, 4, 1024, 12000, 128, mfu=0.10),
    Model("BERT-base size (width 768, 12 blocks, 512 tokens)", 768, 12, 3072, 30522, 512),
    Model("1.3B (width 2048, 24 blocks, 2048 tokens)", 2048, 24, 8192, 50304, 2048),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mfu", type=float, default=0.4, help="assumed model FLOPs utilisation of the larger models")
    parser.add_argument("--scaling", type=float, default=0.9, help="assumed efficiency of 8 GPUs against 8 x one")
    args = parser.parse_args()
    print(f"H100 SXM bf16 dense peak {H100_BF16 / 1e12:.0f} TFLOP/s; 8 GPUs at {args.scaling:.0%} scaling efficiency; "
          "memory: 16 bytes per parameter (bf16-mixed AdamW), activations not included")
    print("| model | parameters | training GFLOP per token | assumed MFU | 1 x H100 tokens/s | 8 x H100 tokens/s "
          "| per GPU, DDP | per GPU, FSDP over 8 |")
    print("|---|---|---|---|---|---|---|---|")
    for m in MODELS:
        mfu = m.mfu if m.mfu is not None else args.mfu
        flops = m.training_flops_per_token()
        one = H100_BF16 * mfu / flops
        ddp = 16 * m.parameters / GIB
        fsdp = 16 * m.parameters / 8 / GIB + 2 * m.block_parameters() / GIB
        print(
            f"| {m.name} | {m.parameters / 1e6:,.0f}M | {flops / 1e9:.3f} | {mfu:.0%} | {one:,.0f} | "
            f"{8 * args.scaling * one:,.0f} | {ddp:,.2f} GiB | {fsdp:,.2f} GiB |"
        )


if __name__ == "__main__":
    main()
