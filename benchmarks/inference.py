"""Inference speed on real sentences: Trunk's ``predict`` against Hugging Face pipelines of equal size, two tasks
from one trunk pass, ONNX Runtime, what each of ``predict``'s optimisations gives, and ``trunk serve`` under
concurrent clients, three tasks' LoRA deltas on one trunk (``--only deltas``), and predict against the pipeline
with another process keeping one core busy (``--only busy``). Prints tables.

    pip install -e ".[bench,serve,onnx]"
    python benchmarks/inference.py --data ../shared/data [--model CKPT_OR_DIR] [--rounds 3]

``--model``: a model with the tasks ``sst2`` (classification) and ``conll`` (NER), as configs/joint_sst2_conll.yaml
trains. Without it, one of that recipe's shape is made by one training step (speed does not depend on the weights).

Sentences: SST-2 dev (872) and CoNLL-2003 test (3,453). Every comparison runs both sides in this process,
alternating, and reports the median of the rounds; "ratio" is the first side's sentences/s over the second's.
The Hugging Face side is ``transformers.pipeline`` ("text-classification"; "token-classification" with
aggregation "first", the label of a word's first piece as Trunk reads it) on a ``Bert*`` model of the trunk's width,
depth, heads, FFN and vocabulary, with Trunk's own tokenizer, batch size 64 on both sides. bf16 rows run only
where the CPU computes bf16 natively (elsewhere it is emulated, 50-100x slower: no fair figure).

Serving: ``trunk serve`` in its own process on 127.0.0.1; N client threads each send their share of the SST-2 dev
sentences (so every level sends the same 872, or ``--passes`` times that), in requests of each ``--per-request`` size
(1: ``{"input": ...}``), and the table gives sentences/s and the latency percentiles, the throughput as a share of
in-process ``predict``'s, and where the CPU went per sentence (the model's worker, the server's HTTP processes, the
client threads; read from /proc, so Linux only).

Busy core (``--only busy``): quiet, then with a ``while True: pass`` process beside; for 1 thread, for Trunk's choice
(the usable cores, OpenMP spinning ``trunk.training.threads.SPIN_COUNT`` turns) and for OpenMP's default spinning.
Each setting runs in a child process (OpenMP reads its environment when torch loads), both sides alternating in it.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import torch
from processes import beside_busy_core  # benchmarks/processes.py

from trunk.models.kernels import Unpadded
from trunk.tasks import load
from trunk.training.precision import cpu_bf16_is_native, cpu_info
from trunk.training.threads import fit_threads

REPO = Path(__file__).resolve().parent.parent


def sst2_sentences(data: Path) -> list[str]:
    lines = (data / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.rsplit("\t", 1)[0] for line in lines if line.strip()]


def conll_sentences(data: Path) -> list[list[str]]:
    sentences, words = [], []
    for line in (data / "conll2003" / "test.txt").read_text(encoding="utf-8").splitlines() + [""]:
        if not line.strip() or line.startswith("-DOCSTART-"):
            if words:
                sentences.append(words)
            words = []
        else:
            words.append(line.split()[0])
    return sentences


def trec_questions(data: Path) -> list[str]:
    lines = (data / "trec" / "TREC_10.label").read_text(encoding="latin-1").splitlines()
    return [line.split(" ", 1)[1] for line in lines if line.strip()]


def make_model(data: Path, directory: Path, onnx: bool = True, init_from: Path | None = None) -> Path:
    """configs/joint_sst2_conll.yaml's model after one training step (from scratch), exported with its ONNX graphs (fp32
    and int8; ``onnx=False``: without). ``init_from``: configs/minilm_joint_sst2_conll.yaml's from that pretrained
    trunk instead (its shape and tokenizer; the heads still after one step)."""
    splits = {"sst2": ("sst2/train.tsv", "sst2/dev.tsv"), "conll": ("conll2003/train.txt", "conll2003/valid.txt")}
    paths = [
        f"--data.tasks.{task}.{split}={data / path}"
        for task, files in splits.items()
        for split, path in zip(("train", "validation"), files)
    ]
    run = [
        sys.executable,
        "-m",
        "trunk.cli",
        "fit",
        "--config",
        str(REPO / ("configs/minilm_joint_sst2_conll.yaml" if init_from else "configs/joint_sst2_conll.yaml")),
        f"--model.init_from={init_from.resolve() if init_from else 'null'}",
        *paths,
        "--data.tasks.sst2.test=null",
        "--data.tasks.conll.test=null",
        "--trainer.max_steps=1",
        "--trainer.limit_val_batches=0",
        "--trainer.precision=32-true",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={directory / 'run'}",
        "--trainer.logger=false",
    ]
    subprocess.run(run, check=True, cwd=directory, stdout=subprocess.DEVNULL)
    ckpt = next((directory / "run").rglob("last.ckpt"), None) or next((directory / "run").rglob("*.ckpt"))
    subprocess.run(
        [sys.executable, "-m", "trunk.cli", "export", str(ckpt), str(directory / "model"),
         *(["--onnx", "--quantize", "int8"] if onnx else [])],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return directory / "model"


def make_task_files(data: Path, directory: Path, layers: str = "null") -> list[Path]:
    """A trunk of configs/joint_sst2_conll.yaml's shape and three LoRA task directories (sst2, conll, trec) on it (LoRA
    on the blocks ``layers``, null: all), after three training steps (from scratch): [trunk, sst2, conll, trec]."""
    directory.mkdir(parents=True, exist_ok=True)
    splits = {"sst2": ("sst2/train.tsv", "sst2/dev.tsv"), "conll": ("conll2003/train.txt", "conll2003/valid.txt")}
    paths = [
        f"--data.tasks.{task}.{split}={data / path}"
        for task, files in splits.items()
        for split, path in zip(("train", "validation"), files)
    ]
    trec = [
        "--model.tasks.trec=trunk.tasks.SequenceClassification",
        "--data.tasks.trec=trunk.datamodules.TextClassificationData",
        f"--data.tasks.trec.train={data / 'trec/train_5500.label'}",
        r"--data.tasks.trec.line_pattern=(?P<label>[A-Z]+):\S+ (?P<text>.+)",
        "--data.tasks.trec.encoding=latin-1",
        "--data.tasks.trec.max_length=64",
        "--data.weights={sst2: 1, conll: 1, trec: 1}",
    ]
    lora = f"{{method: lora, r: 8, alpha: 16, targets: [q_proj, kv_proj], layers: {layers}}}"
    run = [
        sys.executable,
        "-m",
        "trunk.cli",
        "fit",
        "--config",
        str(REPO / "configs/joint_sst2_conll.yaml"),
        "--model.init_from=null",
        *paths,
        *trec,
        "--data.tasks.sst2.test=null",
        "--data.tasks.conll.test=null",
        "--trainer.max_steps=3",
        "--trainer.limit_val_batches=0",
        "--trainer.precision=32-true",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={directory / 'run'}",
        "--trainer.logger=false",
        "--model.task_weights=null",
        f"--model.peft={{sst2: {lora}, conll: {lora}, trec: {lora}}}",
    ]
    subprocess.run(run, check=True, cwd=directory, stdout=subprocess.DEVNULL)
    ckpt = next((directory / "run").rglob("last.ckpt"), None) or next((directory / "run").rglob("*.ckpt"))
    export = [sys.executable, "-m", "trunk.cli", "export", str(ckpt)]
    subprocess.run([*export, str(directory / "trunk"), "--trunk-only"], check=True, stdout=subprocess.DEVNULL)
    for task in ("sst2", "conll", "trec"):
        subprocess.run([*export, str(directory / task), "--task", task], check=True, stdout=subprocess.DEVNULL)
    return [directory / name for name in ("trunk", "sst2", "conll", "trec")]


def peak_rss_mb(paths: list[Path], inputs: dict) -> float:
    """Peak RSS (MiB) of a process that loads a trunk with the given task directories and predicts 64 inputs per
    task."""
    tasks = [p.name for p in paths[1:]]
    code = (
        "import json, resource, sys; from trunk.tasks import load; m = load(json.loads(sys.argv[1]), "
        "precision='32-true'); inputs = json.loads(sys.argv[2]); [m.predict(inputs[t][:64], task=t) for t in "
        "m.tasks]; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            json.dumps([str(p) for p in paths]),
            json.dumps({t: inputs[t][:64] for t in tasks}),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.split()[-1])


def deltas(paths: list[Path], top: list[Path] | None, inputs: dict, rounds: int) -> None:
    """Three tasks' LoRA deltas on one trunk: memory against one task, one mixed batch against the tasks one after
    another, the same texts for every task in one forked pass (``top``: task directories with LoRA on the top blocks
    only, whose blocks below run once), and a merged LoRA against the unmerged one."""
    trunk, task_dirs = paths[0], paths[1:]
    tasks = [p.name for p in task_dirs]
    one, three = peak_rss_mb([trunk, task_dirs[0]], inputs), peak_rss_mb(paths, inputs)
    table("serving task directories from one process: peak RSS (MiB), fp32", ["tasks", "peak RSS", "ratio"],
          [[tasks[0], one, 1.0], [" + ".join(tasks), three, three / one]])
    predictor = load(paths, precision="32-true")
    encoded = {task: predictor.encode(task, inputs[task]) for task in tasks}
    rows = []
    for n in (1, 8, 64):  # inputs per task in each call: a serving batch of n requests per task
        calls = [{task: encoded[task][i:i + n] for task in tasks} for i in range(0, 192, n)]
        sent = sum(len(v) for call in calls for v in call.values())
        got = alternate(
            {
                "mixed": lambda: [predictor.predict_encoded(call, shared=False) for call in calls],
                "apart": lambda: [
                    predictor.predict_encoded({t: examples}) for call in calls for t, examples in call.items()
                ],
            },
            sent,
            rounds,
        )
        rows.append([n, got["mixed"], got["apart"], got["mixed"] / got["apart"]])
    table(
        f"{len(tasks)} tasks' LoRA deltas: one mixed batch per call against the tasks one after another (inputs/s, "
        "fp32)",
        ["inputs per task per call", "mixed batch", "one after another", "ratio"],
        rows,
    )
    texts, rows = inputs[tasks[0]][:256], []
    for name, model in (
        ("LoRA on every block", predictor),
        ("LoRA on the top half of the blocks", load(top, precision="32-true") if top else None),
    ):
        if model is not None:
            got = alternate(
                {
                    "one": lambda: model.predict(texts, task=tasks),
                    "apart": lambda: [model.predict(texts, task=t) for t in tasks],
                },
                len(texts) * len(tasks),
                rounds,
            )
            rows += [
                [f"{name}: one forked pass", got["one"], got["one"] / got["apart"]],
                [f"{name}: one task after another", got["apart"], 1.0],
            ]
    merged, unmerged = (
        load([trunk, task_dirs[0]], precision="32-true", merge=True),
        load([trunk, task_dirs[0]], precision="32-true"),
    )
    speed = alternate(
        {
            "merged": lambda: merged.predict(texts, task=tasks[0]),
            "unmerged": lambda: unmerged.predict(texts, task=tasks[0]),
        },
        len(texts),
        rounds,
    )
    table(f"the same texts for {len(tasks)} tasks, and merging (answers/s, fp32)", ["path", "answers/s", "ratio"],
          [*rows, [f"{tasks[0]}: LoRA merged into the trunk", speed["merged"], speed["merged"] / speed["unmerged"]],
           [f"{tasks[0]}: LoRA unmerged", speed["unmerged"], 1.0]])


def hf_pipelines(predictor, bf16: bool, device: str = "cpu") -> dict:
    """Each task's pipeline on an equal-size BERT with Trunk's tokenizer (random weights: speed only)."""
    from tokenizers import Tokenizer
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertForTokenClassification,
        PreTrainedTokenizerFast,
        pipeline,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    cfg, model = predictor.model.trunk.cfg, predictor.model
    tokenizer = Tokenizer.from_str(model.codec.tokenizer.to_str())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                                   unk_token="[UNK]", mask_token="[MASK]", model_max_length=cfg.max_len)
    bert = dict(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_ff,
        max_position_embeddings=cfg.max_len,
    )
    pipes = {}
    for name, objective in model.objectives.items():
        labels = {
            "id2label": dict(enumerate(objective.label_names)),
            "label2id": {n: i for i, n in enumerate(objective.label_names)},
        }
        if objective.kind == "token_classification":
            net, kind, extra = (
                BertForTokenClassification(BertConfig(**bert, **labels)),
                "token-classification",
                {"aggregation_strategy": "first"},
            )
        else:
            net, kind, extra = BertForSequenceClassification(BertConfig(**bert, **labels)), "text-classification", {}
        net = net.eval().to(device, torch.bfloat16 if bf16 else torch.float32)
        pipes[name] = pipeline(kind, model=net, tokenizer=fast, device=torch.device(device), **extra)
    return pipes


def rate(fn, n: int) -> float:
    start = time.perf_counter()
    fn()
    return n / (time.perf_counter() - start)


def alternate(sides: dict, n: int, rounds: int) -> dict[str, float]:
    """Median sentences/s of each side over ``rounds``, the sides taking turns (after one warm-up call each)."""
    for fn in sides.values():
        fn()
    rates = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            rates[name].append(rate(fn, n))
    return {name: statistics.median(values) for name, values in rates.items()}


def table(title: str, header: list[str], rows: list[list]) -> None:
    print(f"\n## {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print(
            "| "
            + " | ".join(
                f"{v:,.1f}" if isinstance(v, float) and v >= 10 else f"{v:.2f}" if isinstance(v, float) else str(v)
                for v in row
            )
            + " |"
        )


def trunk_and_pipeline(predictor, pipe, task: str, sentences: list) -> dict:
    """The two sides of a comparison with Hugging Face, each reading the sentences its own way."""
    as_text = [" ".join(s) if isinstance(s, list) else s for s in sentences]
    return {"trunk": lambda: predictor.predict(sentences, task=task, batch_size=64),
            "hf": lambda: pipe(as_text, batch_size=64)}


PIPELINE_COLUMNS = ["task", "precision", "sentences", "Trunk predict", "HF pipeline", "ratio",
                    "HF's token positions per real token"]


def versus_hugging_face(model: Path, inputs: dict, precisions: list[str], rounds: int, device: str = "cpu") -> list:
    """Trunk's predict against the pipeline on ``device``, printed as a table; its rows (``PIPELINE_COLUMNS``)."""
    rows = []
    for precision in precisions:
        predictor = load(model, map_location=device, precision="bf16-mixed" if precision == "bf16" else "32-true")
        pipes = hf_pipelines(predictor, bf16=precision == "bf16", device=device)
        for task, sentences in inputs.items():
            got = alternate(trunk_and_pipeline(predictor, pipes[task], task, sentences), len(sentences), rounds)
            rows.append([task, precision, len(sentences), got["trunk"], got["hf"], got["trunk"] / got["hf"],
                         padding_ratio(predictor, task, sentences)])
    table("predict against a Hugging Face pipeline (sentences/s)", PIPELINE_COLUMNS, rows)
    return rows


def busy_core(model: Path, data: Path, rounds: int, conll: int) -> None:
    """predict against the pipeline, quiet and with another process spinning on one core, for each thread setting."""
    argv = [sys.executable, __file__, "--data", str(data), "--model", str(model), "--rounds", str(rounds),
            "--busy-child", str(conll)]
    rows = [[load_beside, setting, threads, task, got["trunk"], got["hf"], got["trunk"] / got["hf"]]
            for load_beside, setting, (threads, rates) in beside_busy_core(argv) for task, got in rates.items()]
    table(
        f"predict against a Hugging Face pipeline beside a busy core (fp32, sentences/s; SST-2 dev, {conll:,} "
        "CoNLL-2003 test sentences)",
        ["other load", "threads and waiting", "threads", "task", "Trunk predict", "HF pipeline", "ratio"],
        rows,
    )


def busy_child(model: Path, inputs: dict, rounds: int) -> None:
    fit_threads()  # what a trunk command does: the usable cores, unless OMP_NUM_THREADS says otherwise
    predictor = load(model, precision="32-true")
    pipes = hf_pipelines(predictor, bf16=False)
    rates = {task: alternate(trunk_and_pipeline(predictor, pipes[task], task, sentences), len(sentences), rounds)
             for task, sentences in inputs.items()}
    print(json.dumps([torch.get_num_threads(), rates]))


def padding_ratio(predictor, task: str, sentences: list) -> float:
    """The token positions a pipeline computes (batches of 64 in input order, each padded to its longest) per real
    token, which Trunk's real-token path computes alone: the ratio at an equal cost per token computed (Trunk's token
    counts)."""
    lengths = [len(example["input_ids"]) for example in predictor.encode(task, sentences)]
    return sum(max(lengths[i : i + 64]) * len(lengths[i : i + 64]) for i in range(0, len(lengths), 64)) / sum(lengths)


def one_pass(model: Path, sentences: list[list[str]], rounds: int) -> None:
    predictor = load(model, precision="32-true")
    texts = [" ".join(s) for s in sentences]
    got = alternate(
        {
            "one": lambda: predictor.predict(texts, task=["sst2", "conll"]),
            "two": lambda: (predictor.predict(texts, task="sst2"), predictor.predict(texts, task="conll")),
        },
        len(texts),
        rounds,
    )
    table(
        "two tasks of one model on the same sentences (CoNLL-2003 test, fp32)",
        ["path", "sentences/s", "ratio"],
        [
            ["one trunk pass for both tasks", got["one"], got["one"] / got["two"]],
            ["one task after the other", got["two"], 1.0],
        ],
    )


def onnx_runtime(model: Path, inputs: dict, rounds: int) -> None:
    torch_side, onnx_side = load(model, precision="32-true"), load(model, runtime="onnx")
    rows = []
    for task, sentences in inputs.items():
        got = alternate(
            {
                "onnx": lambda: onnx_side.predict(sentences, task=task),
                "torch": lambda: torch_side.predict(sentences, task=task),
            },
            len(sentences),
            rounds,
        )
        rows.append([task, got["torch"], got["onnx"], got["onnx"] / got["torch"]])
    table(
        "ONNX Runtime against PyTorch, the same predict path (fp32, sentences/s)",
        ["task", "PyTorch", "ONNX Runtime", "ratio"],
        rows,
    )


def optimisations(model: Path, inputs: dict, rounds: int) -> None:
    """Each of predict's optimisations turned off in turn, against all on."""
    import trunk.inference.predictor as api
    import trunk.models.trunk as trunk_module

    predictor = load(model, precision="32-true")
    switches = {
        "batches in input order (no length sorting)": mock.patch.object(
            api, "length_order", lambda lengths: list(range(len(lengths)))
        ),
        "rotary tables recomputed in every layer": mock.patch.object(trunk_module, "tracing", lambda: True),
        "every token computed, padding too (no real-token path)": mock.patch.object(
            Unpadded, "pays", staticmethod(lambda mask: False)
        ),
        "torch.no_grad instead of inference_mode": None,
    }
    rows = []
    for task, sentences in inputs.items():
        for what, switch in switches.items():
            def off(switch=switch, task=task, sentences=sentences):
                if switch is None:  # predict_encoded's own body, under no_grad
                    with torch.no_grad():
                        api.Predictor.predict_encoded.__wrapped__(predictor, {task: predictor.encode(task, sentences)})
                    return
                with switch:
                    predictor.predict(sentences, task=task)
            got = alternate({"on": lambda: predictor.predict(sentences, task=task), "off": off}, len(sentences), rounds)
            rows.append([task, what, got["off"], got["on"], got["on"] / got["off"]])
    table(
        "what each optimisation of predict gives (fp32, sentences/s)",
        ["task", "turned off", "without it", "with it", "gain"],
        rows,
    )


class Served:
    """``trunk serve`` in a process group of its own."""

    def __init__(self, model: Path, *options: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log, self.local = tempfile.TemporaryFile(), threading.local()  # noqa: SIM115 (open for the server's life)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trunk.cli", "serve", str(model), f"--port={self.port}", *options],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for _ in range(240):
            health = f"http://127.0.0.1:{self.port}/health"
            with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=5) as r:
                    if r.status == 200:
                        return
            if self.process.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        self.log.seek(0)
        raise RuntimeError(f"trunk serve did not start:\n{self.log.read().decode()[-2000:]}")

    def ask(self, body: dict) -> float:
        """One request on this thread's kept-alive connection (as an HTTP client library keeps one); its latency in
        seconds."""
        if not hasattr(self.local, "connection"):
            self.local.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        start = time.perf_counter()
        self.local.connection.request("POST", "/predict", json.dumps(body), {"Content-Type": "application/json"})
        response = self.local.connection.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"trunk serve answered {response.status}")
        return time.perf_counter() - start

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by the model's worker processes and by the rest of the server (HTTP), from /proc."""
        used = {"worker": 0.0, "http": 0.0}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.process.pid:  # the process group (session) of the server
                    spawned = b"multiprocessing.spawn" in Path(f"/proc/{pid}/cmdline").read_bytes()
                    used["worker" if spawned else "http"] += (int(fields[11]) + int(fields[12])) / os.sysconf(
                        "SC_CLK_TCK"
                    )
        return used

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


def serving(
    model: Path,
    sentences: list[str],
    in_process: float,
    clients: list[int],
    per_request: int,
    options: list[str],
    passes: int = 1,
) -> None:
    """``clients`` levels of concurrent clients, each sending its share of ``sentences`` (``passes`` times over) in
    requests of ``per_request`` sentences (one: ``{"input": ...}``; more: ``{"inputs": [...]}``, the HTTP cost spread
    over them)."""
    sentences = sentences * passes  # more requests a client: the start and the last stragglers weigh less
    server = Served(model, *options)
    rows = []
    try:
        for _ in range(2):  # warm-up: the worker's first batches
            server.ask({"inputs": sentences[:64], "task": "sst2"})
        for n in clients:
            shares = [sentences[i::n] for i in range(n)]  # each client its share: every level sends the same sentences
            requests = [[{"input": s[0]} if per_request == 1 else {"inputs": s} for s in
                         (share[i:i + per_request] for i in range(0, len(share), per_request))] for share in shares]
            count = sum(map(len, requests))
            before, client_before, start = server.cpu_seconds(), time.process_time(), time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                latencies = [
                    t
                    for ts in pool.map(lambda own: [server.ask({**body, "task": "sst2"}) for body in own], requests)
                    for t in ts
                ]
            throughput = len(sentences) / (time.perf_counter() - start)
            after, client = server.cpu_seconds(), time.process_time() - client_before
            q = statistics.quantiles(latencies, n=100)
            per_sentence = [1000 * (after[k] - before[k]) / len(sentences) for k in ("worker", "http")] + [
                1000 * client / len(sentences)
            ]
            rows.append(
                [n, count, throughput, throughput / in_process, 1000 * q[49], 1000 * q[94], 1000 * q[98], *per_sentence]
            )
    finally:
        server.stop()
    table(
        f"trunk serve {' '.join(options)}: requests of {per_request} sentence(s) (SST-2 "
        f"dev{f' x {passes}' if passes > 1 else ''}, fp32)",
        [
            "clients",
            "requests",
            "sentences/s",
            "of in-process predict",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "CPU ms/sentence: model worker",
            "server's HTTP",
            "clients",
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, required=True, help="the folder holding sst2/ and conll2003/ (../shared/data)"
    )
    parser.add_argument(
        "--model",
        type=Path,
        help="a model with tasks sst2 and conll (a checkpoint, or a directory exported with --onnx)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--per-request", type=int, nargs="+", default=[1, 8], help="sentences per serve request")
    parser.add_argument(
        "--passes", type=int, default=1, help="serve: each level sends the SST-2 dev sentences this many times"
    )
    parser.add_argument(
        "--task-dirs",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="deltas: a trunk directory and LoRA task directories named sst2, conll and trec (default: made here)",
    )
    parser.add_argument("--conll", type=int, default=1000, help="busy: the first N CoNLL-2003 test sentences")
    parser.add_argument("--busy-child", type=int, help=argparse.SUPPRESS)  # one busy-core measurement (busy_core)
    parser.add_argument("--only", nargs="+", default=["hf", "one_pass", "onnx", "optimisations", "serve", "deltas"],
                        choices=["hf", "one_pass", "onnx", "optimisations", "serve", "deltas", "busy"])
    options = parser.parse_args()
    if options.busy_child:
        inputs = {"sst2": sst2_sentences(options.data), "conll": conll_sentences(options.data)[: options.busy_child]}
        return busy_child(options.model, inputs, options.rounds)

    print(f"machine: {cpu_info()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    precisions = [p for p in options.precision if p == "fp32" or cpu_bf16_is_native()[0]]
    if precisions != options.precision:
        print("bf16: not native on this CPU (emulated), so its rows are left out")
    with tempfile.TemporaryDirectory() as scratch:
        model = options.model or make_model(options.data.resolve(), Path(scratch))
        inputs = {"sst2": sst2_sentences(options.data), "conll": conll_sentences(options.data)}
        in_process = {}  # Trunk's sentences/s per (task, precision), from the comparison with Hugging Face
        if "hf" in options.only:
            in_process = {(row[0], row[1]): row[3]
                          for row in versus_hugging_face(model, inputs, precisions, options.rounds)}
        if "one_pass" in options.only:
            one_pass(model, inputs["conll"], options.rounds)
        if "onnx" in options.only:
            onnx_runtime(model, inputs, options.rounds)
        if "optimisations" in options.only:
            optimisations(model, inputs, options.rounds)
        if "serve" in options.only:
            if (
                "sst2",
                "fp32",
            ) not in in_process:  # the in-process figure serving is compared with, measured here alone
                predictor = load(model, precision="32-true")
                in_process[("sst2", "fp32")] = alternate(
                    {"trunk": lambda: predictor.predict(inputs["sst2"], task="sst2")},
                    len(inputs["sst2"]),
                    options.rounds,
                )["trunk"]
            sst2 = in_process[("sst2", "fp32")]
            print(f"\nin-process predict, SST-2 dev, fp32: {sst2:,.1f} sentences/s (what serving is compared with)")
            for per_request in options.per_request:
                serving(
                    model, inputs["sst2"], sst2, options.clients, per_request, ["--precision=32-true"], options.passes
                )
        if "busy" in options.only:
            busy_core(model, options.data, options.rounds, options.conll)
        if "deltas" in options.only:
            paths = options.task_dirs or make_task_files(options.data.resolve(), Path(scratch) / "all")
            top = (
                None if options.task_dirs else make_task_files(options.data.resolve(), Path(scratch) / "top", "[2, 3]")
            )
            deltas(
                paths,
                top,
                {"sst2": inputs["sst2"], "conll": inputs["conll"], "trec": trec_questions(options.data)},
                options.rounds,
            )


if __name__ == "__main__":
    main()
