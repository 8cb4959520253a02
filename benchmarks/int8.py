"""int8 inference on real sentences: sentences/s and the task metric of every way to run one model, side by side in
one process, the sides alternating (median of the rounds):

- Trunk's ``predict`` in fp32, in bf16 (where the CPU computes it natively), with ``quantize="int8"`` (the rest in
  fp32, and in bf16 where native), and as ``precision="auto"`` takes it (the form measured fastest on the model's shape,
  ``trunk.inference.calibrate``: how near the fastest side it comes is the check of that choice);
- ONNX Runtime on the model's graphs, fp32 and int8 (``trunk export --onnx --quantize int8``);
- Hugging Face's pipeline on the same weights (the model written by ``trunk export --format hf`` per task), fp32 and
  with PyTorch's dynamic quantization of its linear layers (``torch.ao.quantization.quantize_dynamic``, how
  transformers' docs quantize for CPUs).

Then the size of each form of the model, and the machine's matmul peak per dtype (fp32, bf16, int8).

    pip install -e ".[bench,onnx]"
    python benchmarks/int8.py --data ../shared/data --model DIR_OR_CKPT [--rounds 3] [--conll 1000]

``--model``: a model with the tasks ``sst2`` (classification, labels negative / positive) and ``conll`` (NER), as
configs/minilm_joint_sst2_conll.yaml trains; a checkpoint is exported (with its int8 graphs) to a scratch folder first.
Without it, configs/joint_sst2_conll.yaml's model after one training step (Trunk-native; speed only: its metrics are
chance), or with ``--init-from PRETRAINED`` configs/minilm_joint_sst2_conll.yaml's from that trunk after one step (its
shape and tokenizer; speed only).
Sentences: SST-2 dev (872) and the first ``--conll`` sentences of CoNLL-2003 test (all 3,453 by default);
metrics: SST-2 accuracy and CoNLL-2003 entity F1 (exact spans; Trunk decodes as the model was configured to, the
pipeline aggregates each word's first piece).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from inference import alternate, conll_sentences, make_model, sst2_sentences, table

from trunk.core.tagging import spans_from_tags
from trunk.inference.quantize import Int8Linear
from trunk.tasks import load
from trunk.training.precision import cpu_bf16_is_native, cpu_info, int8_is_native


def sst2_gold(data: Path) -> list[int]:
    lines = (data / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [int(line.rsplit("\t", 1)[1]) for line in lines if line.strip()]


def conll_gold(data: Path) -> list[set]:
    """Each test sentence's entities as (type, first word, last word)."""
    sentences, tags = [], []
    for line in (data / "conll2003" / "test.txt").read_text(encoding="utf-8").splitlines() + [""]:
        if not line.strip() or line.startswith("-DOCSTART-"):
            if tags:
                sentences.append({tuple(s) for s in spans_from_tags(tags)})
            tags = []
        else:
            tags.append(line.split()[-1])
    return sentences


def entity_f1(predicted: list[set], gold: list[set]) -> float:
    hits = sum(len(p & g) for p, g in zip(predicted, gold))
    found, true = sum(map(len, predicted)), sum(map(len, gold))
    return 2 * hits / (found + true) if found + true else 0.0


class Trunk:
    """Trunk's predict (PyTorch or ONNX Runtime): answers as labels / entity sets."""

    def __init__(self, model: Path, **options) -> None:
        self.predictor = load(model, **options)
        self.labels = self.predictor.model.objective("sst2").label_names

    def sst2(self, sentences: list[str]) -> list[int]:
        return [self.labels.index(r["label"]) for r in self.predictor.predict(sentences, task="sst2", batch_size=64)]

    def conll(self, sentences: list[list[str]]) -> list[set]:
        records = self.predictor.predict(sentences, task="conll", batch_size=64)
        return [{(e["type"], e["start"], e["end"]) for e in r["entities"]} for r in records]


class Pipelines:
    """transformers' pipelines on the model exported per task by ``trunk export --format hf``."""

    def __init__(self, folders: dict[str, Path], int8: bool) -> None:
        from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, pipeline
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        nets = {"sst2": AutoModelForSequenceClassification.from_pretrained(folders["sst2"]).eval(),
                "conll": AutoModelForTokenClassification.from_pretrained(folders["conll"]).eval()}
        if int8:
            with warnings.catch_warnings():  # torch.ao's deprecation notice: it is still what the docs show
                warnings.simplefilter("ignore")
                nets = {task: torch.ao.quantization.quantize_dynamic(net, {torch.nn.Linear}, dtype=torch.qint8)
                        for task, net in nets.items()}
        self.sst2_pipe = pipeline("text-classification", model=nets["sst2"], tokenizer=str(folders["sst2"]), device=-1)
        self.conll_pipe = pipeline("token-classification", model=nets["conll"], tokenizer=str(folders["conll"]),
                                   device=-1, aggregation_strategy="first")
        self.labels = [nets["sst2"].config.id2label[i] for i in range(nets["sst2"].config.num_labels)]

    def sst2(self, sentences: list[str]) -> list[int]:
        return [self.labels.index(r["label"]) for r in self.sst2_pipe(sentences, batch_size=64)]

    def conll(self, sentences: list[list[str]]) -> list[set]:
        texts = [" ".join(words) for words in sentences]
        answers = self.conll_pipe(texts, batch_size=64)
        out = []
        for words, text, entities in zip(sentences, texts, answers):
            word_at = [i for i, w in enumerate(words) for _ in range(len(w) + 1)]  # character -> word
            out.append({(e["entity_group"], word_at[e["start"]], word_at[max(e["start"], e["end"] - 1)])
                        for e in entities if e["start"] < len(text)})
        return out


def size_mb(path: Path) -> float:
    return path.stat().st_size / 2**20


def tensor_mb(model: torch.nn.Module) -> float:
    """The model's weights and buffers as stored (int8 layers at one byte a weight)."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20


def matmul_peaks(size: int = 1024, repeats: int = 5) -> dict[str, list[float]]:
    """GOP/s (two per multiply-add) of one size^3 product per dtype, at one thread and at all of them (printed, and
    returned: dtype -> [one thread, all])."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a8, b8 = (torch.randint(-127, 128, (size, size), dtype=torch.int8) for _ in range(2))
    kinds = {"fp32": lambda: torch.mm(a, b), "int8 (torch._int_mm)": lambda: torch._int_mm(a8, b8)}
    if cpu_bf16_is_native()[0]:
        a16, b16 = a.bfloat16(), b.bfloat16()
        kinds["bf16"] = lambda: torch.mm(a16, b16)
    threads_now, rows = torch.get_num_threads(), {name: [name] for name in kinds}
    for threads in sorted({1, threads_now}):
        torch.set_num_threads(threads)
        for name, run in kinds.items():
            for _ in range(2):
                run()
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                run()
                best = min(best, time.perf_counter() - start)
            rows[name].append(2 * size**3 / best / 1e9)
    torch.set_num_threads(threads_now)
    table(f"matmul peak, GOP/s ({size} x {size} x {size}, best of {repeats})",
          ["dtype", *[f"{t} thread{'s' * (t > 1)}" for t in sorted({1, threads_now})]], list(rows.values()))
    return {name: row[1:] for name, row in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the folder holding sst2/ and conll2003/")
    parser.add_argument("--model", type=Path, help="a trunk directory or checkpoint with the tasks sst2 and conll")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--conll", type=int, default=None, help="the first N CoNLL-2003 test sentences (default all)")
    parser.add_argument("--no-hf", action="store_true", help="leave out the Hugging Face sides")
    parser.add_argument("--init-from", type=Path, help="without --model: the joint MiniLM recipe from this pretrained "
                        "trunk (its shape and tokenizer) after one training step, for speed")
    options = parser.parse_args()
    native, why = int8_is_native()
    print(f"machine: {cpu_info()}; torch {torch.__version__}, {torch.get_num_threads()} threads; int8: {why}")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        model = options.model or make_model(options.data.resolve(), scratch, init_from=options.init_from)
        if model.is_file():  # a checkpoint: its trunk directory, with fp32 and int8 graphs
            subprocess.run([sys.executable, "-m", "trunk.cli", "export", str(model), str(scratch / "model"), "--onnx",
                            "--quantize", "int8"], check=True, stdout=subprocess.DEVNULL)
            model = scratch / "model"
        sides = {"Trunk fp32": lambda: Trunk(model, precision="32-true")}
        if cpu_bf16_is_native()[0]:
            sides["Trunk bf16"] = lambda: Trunk(model, precision="bf16-mixed")
        sides["Trunk int8"] = lambda: Trunk(model, precision="32-true", quantize="int8")
        if cpu_bf16_is_native()[0]:
            sides["Trunk int8 + bf16"] = lambda: Trunk(model, precision="bf16-mixed", quantize="int8")
        sides["Trunk auto"] = lambda: Trunk(model)  # timed: trunk.inference.calibrate
        sides["ONNX Runtime fp32"] = lambda: Trunk(model, runtime="onnx")
        sides["ONNX Runtime int8"] = lambda: Trunk(model, runtime="onnx", quantize="int8")
        if not options.no_hf:
            folders = {}
            for task in ("sst2", "conll"):
                folders[task] = scratch / f"hf_{task}"
                subprocess.run([sys.executable, "-m", "trunk.cli", "export", str(model), str(folders[task]), "--format",
                                "hf", "--task", task], check=True, stdout=subprocess.DEVNULL)
            sides["HF pipeline fp32"] = lambda: Pipelines(folders, int8=False)
            sides["HF pipeline int8 (torch dynamic)"] = lambda: Pipelines(folders, int8=True)
        runners = {name: make() for name, make in sides.items()}

        inputs = {"sst2": sst2_sentences(options.data), "conll": conll_sentences(options.data)[: options.conll]}
        gold = {"sst2": sst2_gold(options.data), "conll": conll_gold(options.data)[: options.conll]}
        rows, summary = [], []
        for task, sentences in inputs.items():
            scores = {}
            for name, runner in runners.items():
                answers = getattr(runner, task)(sentences)
                scores[name] = (sum(a == g for a, g in zip(answers, gold[task])) / len(gold[task]) if task == "sst2"
                                else entity_f1(answers, gold[task]))
            calls = {name: (lambda r=runner: getattr(r, task)(sentences)) for name, runner in runners.items()}
            rates = alternate(calls, len(sentences), options.rounds)
            for name in runners:
                rows.append([task, name, rates[name], rates[name] / rates["Trunk fp32"], f"{scores[name]:.4f}"])
            trunk_sides = [name for name in runners if name.startswith("Trunk ") and name != "Trunk auto"]
            fastest = max(trunk_sides, key=lambda name: rates[name])
            auto = runners["Trunk auto"].predictor
            int8 = any(isinstance(m, Int8Linear) for m in auto.model.modules())
            form = f"{'int8' if int8 else 'float'}, {auto.precision}"
            summary.append([task, form, fastest, rates["Trunk auto"] / rates[fastest]])
        metric = "SST-2 dev accuracy / CoNLL-2003 test entity F1"
        table(f"int8 against fp32 and bf16 (sentences/s, {options.rounds} rounds, median)",
              ["task", "side", "sentences/s", "of Trunk fp32", metric], rows)
        table("precision auto against the fastest Trunk side", ["task", "auto chose", "fastest side", "auto / fastest"],
              summary)

        trunk_fp32, trunk_int8 = runners["Trunk fp32"].predictor.model, runners["Trunk int8"].predictor.model
        onnx = model / "onnx"
        size_rows = [
            ["Trunk, PyTorch fp32 (weights in memory)", tensor_mb(trunk_fp32)],
            ["Trunk, PyTorch int8 (weights in memory)", tensor_mb(trunk_int8)],
            ["trunk directory, model.safetensors (fp32)", size_mb(model / "model.safetensors")],
            *[[f"ONNX graph {path.name}", size_mb(path)] for path in sorted(onnx.glob("*.onnx"))],
        ]
        table("model size (MiB)", ["form", "MiB"], size_rows)
        matmul_peaks()
        print(f"\nthreads {torch.get_num_threads()}, cores {os.cpu_count()}")


if __name__ == "__main__":
    main()
