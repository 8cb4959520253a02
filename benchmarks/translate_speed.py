"""Beam-search translation beside ``transformers``' ``generate`` on the same weights: a random model of a real
translator's shape (Marian's opus-mt-en-de by default; no network here), read into Trunk's trunk and translation head
the way ``trunk import`` reads the folder, both sides fed the same source ids, one process, the sides alternating.

    python benchmarks/translate_speed.py                      # opus-mt-en-de's shape, beam 4, fp32 and bf16
    python benchmarks/translate_speed.py --shape nllb-200-distilled-600M --sentences 64

Prints sentences per second of each side, the ratio, and how many outputs are token for token the same (fp32; in bf16
rounding may turn a close beam). With random weights a decoder seldom ends a sentence: ``--eos-bias`` raises the end
token's output bias so that outputs have lengths of the order of the sources' (reported), as a trained model's do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from trunk.models import beam_search, greedy_search

SHAPES = {  # the published configs' architecture fields
    "opus-mt-en-de": ("marian", {"vocab_size": 58101, "d_model": 512, "encoder_layers": 6, "decoder_layers": 6,
                                 "encoder_attention_heads": 8, "decoder_attention_heads": 8, "encoder_ffn_dim": 2048,
                                 "decoder_ffn_dim": 2048, "activation_function": "swish",
                                 "max_position_embeddings": 512, "scale_embedding": True, "pad_token_id": 58100,
                                 "decoder_start_token_id": 58100, "eos_token_id": 0}),
    "nllb-200-distilled-600M": ("m2m_100", {"vocab_size": 256206, "d_model": 1024, "encoder_layers": 12,
                                            "decoder_layers": 12, "encoder_attention_heads": 16,
                                            "decoder_attention_heads": 16, "encoder_ffn_dim": 4096,
                                            "decoder_ffn_dim": 4096, "activation_function": "relu",
                                            "max_position_embeddings": 1024, "scale_embedding": True,
                                            "pad_token_id": 1, "decoder_start_token_id": 2, "eos_token_id": 2}),
}


def build(shape: str, eos_bias: float, seed: int = 0):
    """The random ``transformers`` model of ``shape`` and the same weights as Trunk's trunk and translation head."""
    import transformers

    from trunk.core.contract import TaskSpec
    from trunk.formats.hf import map_weights
    from trunk.models import SpecialIds, build_trunk
    from trunk.tasks import Translation

    model_type, values = SHAPES[shape]
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(model_type, dropout=0.0, attention_dropout=0.0, **values)
    hf = transformers.AutoModelForSeq2SeqLM.from_config(config).eval()
    bias = hf.final_logits_bias if hasattr(hf, "final_logits_bias") else None
    tensors = dict(hf.state_dict())
    if bias is not None:
        with torch.no_grad():
            bias[0, values["eos_token_id"]] += eos_bias
        tensors["final_logits_bias"] = bias
    mapped = map_weights({"model_type": model_type, **values}, tensors, shape)
    trunk = build_trunk(mapped.config)
    trunk.load_state_dict(mapped.trunk)
    objective = Translation(decoder_layers=values["decoder_layers"])
    objective.build("translation", trunk, TaskSpec(target_vocab_size=values["vocab_size"]))
    state = dict(mapped.heads["translation"]["state"])
    if bias is None:  # NLLB has no output bias: the end token's raised in Trunk's zero one, and in transformers' logits
        state["decoder.output_bias"] = state["decoder.output_bias"].clone()
        state["decoder.output_bias"][values["eos_token_id"]] += eos_bias
        head = hf.lm_head
        head.bias = torch.nn.Parameter(torch.zeros(values["vocab_size"]))
        with torch.no_grad():
            head.bias[values["eos_token_id"]] = eos_bias
    objective.load_head(state, None, False, shape)
    ids = SpecialIds(bos=values["decoder_start_token_id"], eos=values["eos_token_id"], pad=values["pad_token_id"],
                     banned=(values["pad_token_id"],))
    return hf, trunk.eval(), objective.eval(), ids


def sources(n: int, vocab: int, ids, seed: int = 1) -> list[list[int]]:
    """``n`` random source sentences of 8 to 30 tokens (Multi30k's English is 13 on average), each ending with the end
    token."""
    generator = torch.Generator().manual_seed(seed)
    specials = {ids.bos, ids.eos, ids.pad}
    out = []
    for _ in range(n):
        length = int(torch.randint(8, 31, (1,), generator=generator))
        row = [t for t in torch.randint(3, vocab, (length,), generator=generator).tolist() if t not in specials]
        out.append([*row, ids.eos])
    return out


def batches(rows: list[list[int]], size: int, pad: int):
    for start in range(0, len(rows), size):
        chunk = rows[start: start + size]
        length = max(map(len, chunk))
        ids = torch.tensor([row + [pad] * (length - len(row)) for row in chunk])
        yield ids, (ids != pad).long()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="opus-mt-en-de")
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two sides; the median is shown")
    parser.add_argument("--eos-bias", type=float, default=1.5)
    parser.add_argument("--precision", nargs="+", default=["32-true", "bf16-mixed"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    hf, trunk, objective, ids = build(args.shape, args.eos_bias)
    rows = sources(args.sentences, hf.config.vocab_size, ids)
    print(f"{args.shape}: {args.sentences} sentences, batches of {args.batch_size}, beam {args.beam_size}, one thread, "
          f"{torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}")

    def ours(ids_, mask):  # Translation.generate, with the shape's special ids (a random model has no tokenizer)
        steps = min(objective.generation.steps(int(mask.sum(1).max())), objective.decoder.cfg.max_len)
        memory = trunk(ids_, mask)
        if args.beam_size == 1:
            return greedy_search(objective.decoder, memory, mask.bool(), ids, steps).tolist()
        return beam_search(objective.decoder, memory, mask.bool(), ids, steps, args.beam_size).tolist()

    def theirs(ids_, mask):
        steps = min(objective.generation.steps(int(mask.sum(1).max())), objective.decoder.cfg.max_len)
        out = hf.generate(input_ids=ids_, attention_mask=mask, num_beams=args.beam_size, do_sample=False,
                          early_stopping=True, max_new_tokens=steps, min_length=0, length_penalty=1.0,
                          decoder_start_token_id=ids.bos, eos_token_id=ids.eos, pad_token_id=ids.pad,
                          bad_words_ids=[[t] for t in ids.banned], forced_eos_token_id=None)
        return out[:, 1:].tolist()

    def cut(row):
        return row[: row.index(ids.eos) + 1] if ids.eos in row else [t for t in row if t != ids.pad]

    print("| precision | Trunk sentences/s | transformers sentences/s | speed-up | outputs equal | mean length |")
    print("|---|---|---|---|---|---|")
    for precision in args.precision:
        dtype = torch.bfloat16 if precision == "bf16-mixed" else None
        times = {"trunk": [], "hf": []}
        outputs = {}
        for _ in range(args.repeats):
            for side, run in (("trunk", ours), ("hf", theirs)):
                start, written = time.perf_counter(), []
                with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                    for ids_, mask in batches(rows, args.batch_size, ids.pad):
                        written += [cut(row) for row in run(ids_, mask)]
                times[side].append(time.perf_counter() - start)
                outputs[side] = written
        speed = {side: args.sentences / statistics.median(t) for side, t in times.items()}
        equal = sum(a == b for a, b in zip(outputs["trunk"], outputs["hf"]))
        length = statistics.mean(len(row) for row in outputs["trunk"])
        print(f"| {precision} | {speed['trunk']:.1f} | {speed['hf']:.1f} | {speed['trunk'] / speed['hf']:.2f}x | "
              f"{equal}/{args.sentences} | {length:.1f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
