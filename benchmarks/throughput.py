"""Trunk against the Hugging Face models people would otherwise use, at equal dimensions. Prints a table.

    pip install -e ".[bench]"                  # transformers, for this benchmark only
    python benchmarks/throughput.py [--rounds 5] [--steps 4] [--precision fp32 bf16] [--only mlm seqcls ...]

Every row builds Trunk's model and the Hugging Face model of the same size (width 256, 4 blocks,
4 heads, FFN 1024, vocabulary 8000), feeds both the same batches, and times them alternating in one
process (a warm-up step each is excluded; the median of the rounds is reported). "ratio" is HF time
over Trunk time: above 1, Trunk is faster. Training rows time forward, backward and AdamW's step;
inference rows a forward pass under ``torch.no_grad``. Both sides run the same autocast (bf16) or none.

The roofline row is the measured rate of a large ``torch.mm`` (2048^3) in each precision; "MFU" is a
Trunk row's model FLOPs per second (6 x matmul parameters x tokens, plus attention, for training;
a third of that for inference) as a share of it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trunk.models import SpecialIds, TrunkConfig, beam_search, greedy_search
from trunk.tasks import (
    ImageClassification,
    MaskedLanguageModeling,
    SequenceClassification,
    TokenClassification,
    Translation,
    TrunkModule,
)
from trunk.training.precision import cpu_info

WIDTH, DEPTH, HEADS, FFN, VOCAB = 256, 4, 4, 1024, 8000


def trunk_config(max_len: int = 128) -> TrunkConfig:
    return TrunkConfig(vocab_size=VOCAB, d_model=WIDTH, n_layers=DEPTH, n_heads=HEADS, d_ff=FFN, max_len=max_len,
                       dropout=0.1, attn_dropout=0.1, positions="learned")


def bert_config(**extra):
    from transformers import BertConfig

    return BertConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=DEPTH, num_attention_heads=HEADS,
                      intermediate_size=FFN, max_position_embeddings=128, hidden_dropout_prob=0.1,
                      attention_probs_dropout_prob=0.1, **extra)


# -- batches: the same tensors for both sides ---------------------------------------------------------------


def text_batches(n: int, batch: int, lengths: tuple[int, int], seed: int = 0) -> list[dict]:
    """Batches of random token ids, each padded to its longest row (dynamic padding), lengths drawn uniformly."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        sizes = torch.randint(lengths[0], lengths[1] + 1, (batch,), generator=g)
        mask = (torch.arange(int(sizes.max()))[None, :] < sizes[:, None]).long()
        ids = torch.randint(5, VOCAB, mask.shape, generator=g) * mask
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def with_mlm_labels(batch: dict, g: torch.Generator) -> dict:
    chosen = (torch.rand(batch["input_ids"].shape, generator=g) < 0.15) & batch["attention_mask"].bool()
    return {**batch, "task": "mlm", "labels": torch.where(chosen, batch["input_ids"], -100)}


# -- the two sides of a row -----------------------------------------------------------------------------


@dataclass
class Side:
    model: torch.nn.Module
    step: Callable[[dict], torch.Tensor | None]  # one batch -> loss (training) or None (inference)
    optimizer: torch.optim.Optimizer | None


def trunk_side(tasks: dict, info: dict, train: bool, cfg: TrunkConfig | None = None) -> Side:
    module = TrunkModule(tasks, trunk=cfg or trunk_config(), task_info=info)
    module.train(train)
    name = next(iter(tasks))
    if train:
        return Side(
            module, lambda b: module.training_step(b, 0), torch.optim.AdamW(module.param_groups(), lr=1e-4, fused=True)
        )
    return Side(module, lambda b: module.objectives[name](module.trunk, b), None)


def hf_side(model: torch.nn.Module, forward: Callable[[dict], torch.Tensor], train: bool) -> Side:
    model.train(train)
    return Side(model, forward, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True) if train else None)


def run(side: Side, batch: dict, precision: str) -> None:
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    if side.optimizer is None:
        with torch.no_grad(), autocast:
            side.step(batch)
        return
    with autocast:
        loss = side.step(batch)
    side.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    side.optimizer.step()


# -- the rows ------------------------------------------------------------------------------------------


def mlm_rows(train: bool):
    from transformers import BertForMaskedLM

    g = torch.Generator().manual_seed(1)
    batches = [with_mlm_labels(b, g) for b in text_batches(4, 32, (128, 128))]
    trunk = trunk_side({"mlm": MaskedLanguageModeling()}, {"mlm": {}}, train)
    stock = BertForMaskedLM(bert_config())
    masked_only = BertForMaskedLM(bert_config())

    def stock_loss(b):
        return stock(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss

    def masked_only_loss(b):  # the decoder applied only where there is a target, as Trunk does
        hidden = masked_only.bert(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
        selected = b["labels"] != -100
        return F.cross_entropy(masked_only.cls(hidden[selected]).float(), b["labels"][selected])

    yield "masked-LM", "BertForMaskedLM", trunk, hf_side(stock, stock_loss, train), batches
    yield (
        "masked-LM",
        "BertForMaskedLM, decoder at masked positions only",
        trunk,
        hf_side(masked_only, masked_only_loss, train),
        batches,
    )


def seqcls_rows(train: bool):
    from transformers import BertForSequenceClassification

    g = torch.Generator().manual_seed(2)
    batches = [
        {**b, "task": "sst2", "labels": torch.randint(0, 2, (32,), generator=g)} for b in text_batches(8, 32, (6, 56))
    ]
    trunk = trunk_side(
        {"sst2": SequenceClassification(pooling="cls")}, {"sst2": {"label_names": ["negative", "positive"]}}, train
    )
    hf = BertForSequenceClassification(bert_config(num_labels=2))
    yield (
        "sequence classification (SST-2 lengths 6-56, dynamic padding)",
        "BertForSequenceClassification",
        trunk,
        hf_side(
            hf,
            lambda b: hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss,
            train,
        ),
        batches,
    )


def tokcls_rows(train: bool):
    from transformers import BertForTokenClassification

    names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
    g = torch.Generator().manual_seed(3)
    batches = []
    for b in text_batches(8, 32, (8, 48)):
        labels = torch.where(
            b["attention_mask"].bool(), torch.randint(0, len(names), b["input_ids"].shape, generator=g), -100
        )
        batches.append({**b, "task": "ner", "labels": labels})
    trunk = trunk_side({"ner": TokenClassification()}, {"ner": {"label_names": names}}, train)
    hf = BertForTokenClassification(bert_config(num_labels=len(names)))
    yield (
        "token classification (CoNLL lengths 8-48)",
        "BertForTokenClassification",
        trunk,
        hf_side(
            hf,
            lambda b: hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss,
            train,
        ),
        batches,
    )


def vit_rows(train: bool):
    from transformers import ViTConfig, ViTForImageClassification

    g = torch.Generator().manual_seed(4)
    batches = [{"task": "images", "pixel_values": torch.randn(64, 3, 32, 32, generator=g),
                "labels": torch.randint(0, 10, (64,), generator=g)} for _ in range(4)]
    trunk = trunk_side({"images": ImageClassification(image_size=32, patch_size=4, channels=3, pooling="cls")},
                       {"images": {"label_names": [str(i) for i in range(10)]}}, train)
    hf = ViTForImageClassification(
        ViTConfig(
            image_size=32,
            patch_size=4,
            num_channels=3,
            hidden_size=WIDTH,
            num_hidden_layers=DEPTH,
            num_attention_heads=HEADS,
            intermediate_size=FFN,
            num_labels=10,
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
        )
    )
    yield ("ViT image classification (32x32, patches of 4: 64 + [CLS])", "ViTForImageClassification", trunk,
           hf_side(hf, lambda b: hf(pixel_values=b["pixel_values"], labels=b["labels"]).loss, train), batches)


def bart(**extra):
    from transformers import BartConfig, BartForConditionalGeneration

    return BartForConditionalGeneration(
        BartConfig(
            vocab_size=VOCAB,
            d_model=WIDTH,
            encoder_layers=DEPTH,
            decoder_layers=DEPTH,
            encoder_attention_heads=HEADS,
            decoder_attention_heads=HEADS,
            encoder_ffn_dim=FFN,
            decoder_ffn_dim=FFN,
            max_position_embeddings=128,
            dropout=0.1,
            attention_dropout=0.1,
            activation_dropout=0.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            forced_bos_token_id=None,
            forced_eos_token_id=None,
            tie_word_embeddings=True,
            **extra,
        )
    )


TARGET_TOKENS = 24  # decoding: every side writes exactly this many tokens per sentence (the end token is banned)


def translation_batches(n: int, batch: int, seed: int = 5) -> list[dict]:
    """Multi30k-like pairs: sources of 8-32 tokens, targets of 8-32 (teacher forcing: inputs start with BOS = 1)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for source, target in zip(text_batches(n, batch, (8, 32), seed), text_batches(n, batch, (8, 32), seed + 1)):
        labels = torch.where(target["attention_mask"].bool(), target["input_ids"], -100)
        decoder_inputs = torch.cat([torch.ones(batch, 1, dtype=torch.long), target["input_ids"][:, :-1]], dim=1)
        out.append(
            {
                **source,
                "task": "mt",
                "decoder_input_ids": decoder_inputs,
                "labels": labels,
                "decoder_attention_mask": torch.cat(
                    [torch.ones(batch, 1, dtype=torch.long), target["attention_mask"][:, :-1]], 1
                ),
            }
        )
    del g
    return out


def translation_rows(train: bool):
    batches = translation_batches(4, 32)
    module = TrunkModule({"mt": Translation(label_smoothing=0.1)}, trunk=trunk_config(), task_info={"mt": {}})
    hf = bart()
    if train:
        def hf_loss(b):
            logits = hf(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                decoder_input_ids=b["decoder_input_ids"],
                decoder_attention_mask=b["decoder_attention_mask"],
            ).logits
            return F.cross_entropy(
                logits.flatten(0, 1).float(), b["labels"].flatten(), ignore_index=-100, label_smoothing=0.1
            )

        module.train()
        trunk = Side(
            module, lambda b: module.training_step(b, 0), torch.optim.AdamW(module.param_groups(), lr=1e-4, fused=True)
        )
        yield (
            "translation (sources and targets of 8-32 tokens)",
            "BartForConditionalGeneration",
            trunk,
            hf_side(hf, hf_loss, True),
            batches,
        )
        return
    module.eval()
    objective = module.objectives["mt"]
    # Random weights would end sentences at random steps: ban the end token so both sides write TARGET_TOKENS.
    ids = SpecialIds(bos=1, eos=2, pad=0, banned=(0, 1, 2, 4))
    for beams in (4, 1):
        def trunk_generate(b, beams=beams):
            memory = module.trunk(b["input_ids"], b["attention_mask"])
            if beams == 1:
                return greedy_search(objective.decoder, memory, b["attention_mask"].bool(), ids, TARGET_TOKENS)
            return beam_search(objective.decoder, memory, b["attention_mask"].bool(), ids, TARGET_TOKENS, beams, 1.0)

        def hf_generate(b, beams=beams):
            return hf.generate(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                num_beams=beams,
                do_sample=False,
                max_new_tokens=TARGET_TOKENS,
                min_new_tokens=TARGET_TOKENS,
                early_stopping=False,
                length_penalty=1.0,
                suppress_tokens=[0, 1, 4],
                use_cache=True,
            )

        name = "beam-4 decoding" if beams > 1 else "greedy decoding"
        yield (f"translation: {name}, {TARGET_TOKENS} tokens per sentence", "BartForConditionalGeneration.generate",
               Side(module, trunk_generate, None), hf_side(hf, hf_generate, False), batches)


ROWS = {"mlm": mlm_rows, "seqcls": seqcls_rows, "tokcls": tokcls_rows, "vit": vit_rows, "translation": translation_rows}


# -- FLOPs and the roofline ---------------------------------------------------------------------------------


def model_flops(batch: dict, train: bool) -> float:
    """Useful FLOPs of one step on ``batch``: 2 per multiply-add of every matmul at every *real* token (padding is
    not work), attention's two products within each sequence, the MLM decoder at masked positions and the
    translation decoder's output layer at every target token; x3 for training (backward is twice forward)."""
    encoder = 2 * DEPTH * (4 * WIDTH * WIDTH + 2 * WIDTH * FFN)  # per token: QKV + output projections, FFN
    if "pixel_values" in batch:
        n, t = batch["pixel_values"].shape[0], 65
        return (3 if train else 1) * (n * t * encoder + n * DEPTH * 4 * t * t * WIDTH)
    lengths = batch["attention_mask"].sum(1).double()
    total = float(lengths.sum()) * encoder + float((lengths ** 2).sum()) * DEPTH * 4 * WIDTH
    if batch.get("task") == "mlm":
        total += 2 * int((batch["labels"] != -100).sum()) * (WIDTH * WIDTH + WIDTH * VOCAB)
    if "decoder_input_ids" in batch:
        targets = batch["decoder_attention_mask"].sum(1).double()
        # self + cross q/out, FFN, output
        decoder = (2 * DEPTH * (6 * WIDTH * WIDTH + 2 * WIDTH * FFN) + 2 * WIDTH * VOCAB)
        total += float(targets.sum()) * decoder + float(lengths.sum()) * DEPTH * 4 * WIDTH * WIDTH  # cross keys/values
        total += DEPTH * (float((targets ** 2).sum()) * 2 * WIDTH + float((targets * lengths).sum()) * 4 * WIDTH)
    return (3 if train else 1) * total


def work(batch: dict, train: bool) -> tuple[float, str]:
    """What one step on ``batch`` processes, in the unit people count: real tokens, images or sentences."""
    if "pixel_values" in batch:
        return batch["pixel_values"].shape[0], "images"
    if "decoder_input_ids" in batch and not train:
        return batch["input_ids"].shape[0], "sentences"
    tokens = batch["attention_mask"].sum() + (
        batch["decoder_attention_mask"].sum() if "decoder_input_ids" in batch else 0
    )
    return float(tokens), "tokens"


def matmul_peak(precision: str, size: int = 2048, repeats: int = 10, device: str = "cpu") -> float:
    """The matmul rate (FLOP/s) of ``device`` in ``precision``: the median of ``repeats`` products of two size x size
    matrices after one warm-up (a GPU's queue drained around each)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * size ** 3 / statistics.median(times)


def synchronize(device: str) -> None:
    """Wait for the GPU's queued work, so that a clock read after it measures the work."""
    if device == "cuda":
        torch.cuda.synchronize()


def timed(side: Side, batches: list[dict], precision: str, steps: int) -> float:
    start = time.perf_counter()
    for i in range(steps):
        run(side, batches[i % len(batches)], precision)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="steps per side per round")
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--only", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--inference", action=argparse.BooleanOptionalAction, default=True, help="also time inference")
    options = parser.parse_args()
    torch.manual_seed(0)
    print(f"machine: {os.cpu_count()} x {cpu_info()}, torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"{options.rounds} rounds of {options.steps} steps per side, medians")
    peaks = {p: matmul_peak(p) for p in options.precision}
    print(
        "| row | mode | precision | Trunk (ms) | HF model | HF (ms) | ratio HF / Trunk | Trunk throughput | Trunk MFU |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for p in options.precision:
        print(f"| roofline: torch.mm 2048^3 | | {p} | | | | | {peaks[p] / 1e9:.0f} GFLOP/s | |")
    for train in ([True, False] if options.inference else [True]):
        for key in options.only:
            if key == "mlm" and not train:
                continue  # masked-LM is a training objective
            for what, hf_name, trunk, hf, batches in ROWS[key](train):
                decoding = "decoding" in what
                flops = statistics.mean(model_flops(b, train) for b in batches)
                amount, unit = statistics.mean(work(b, train)[0] for b in batches), work(batches[0], train)[1]
                for precision in options.precision:
                    run(trunk, batches[0], precision)  # warm-up
                    run(hf, batches[0], precision)
                    times = {"trunk": [], "hf": []}
                    for _ in range(options.rounds):
                        times["trunk"].append(timed(trunk, batches, precision, options.steps))
                        times["hf"].append(timed(hf, batches, precision, options.steps))
                    t, h = statistics.median(times["trunk"]), statistics.median(times["hf"])
                    mfu = "" if decoding else f"{flops / t / peaks[precision]:.1%}"
                    print(
                        f"| {what} | {'training' if train else 'inference'} | {precision} | {1000 * t:.1f} | {hf_name} "
                        f"| {1000 * h:.1f} | {h / t:.2f} | {amount / t:,.0f} {unit}/s | {mfu} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
