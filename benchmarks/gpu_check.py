"""The GPU check: everything Trunk claims about CUDA GPUs, measured in one command on a machine with no network
(docs/gpu.md). Writes ``gpu_check.json`` (every figure), ``gpu_check.md`` (the tables) and ``gpu_check.log`` to
``--out``.

    make gpu-bundle                     # here, with network: .gpu/ (wheels the image lacks, data slices, bf16 MiniLM)
    make gpu-check                      # there, on the GPU (python3 benchmarks/gpu_check.py --bundle .gpu)
    make gpu-check DRY=1                # here: the same at tiny sizes on this CPU, in a fresh environment

Parts, in order, each timed, each in its own process with a time limit, each allowed to fail without stopping the rest:

1. ``install``: the bundle's wheels into a fresh folder with ``pip --no-index`` on top of the image's torch; Trunk
   runs from this working tree. Each package's requirements are checked against what is there.
2. ``tests``: tests/gpu (the ``gpu`` marker): bf16 against fp32, fused attention, every task kind, checkpoints across
   devices, DDP and FSDP2 on the one GPU with exact resume, serve, the int8 refusal, ``precision: auto``.
3. ``finetune``: the bundle's MiniLM fine-tuned by Trunk and by transformers (benchmarks/hf_finetune.py) on SST-2 and
   CoNLL-2003, bf16-mixed, the same steps: examples/s and the dev score.
4. ``pretraining``: masked-LM training steps at the pretraining recipe's width and at BERT-base's (random weights),
   Trunk and ``BertForMaskedLM`` alternating, eager and ``torch.compile``d: tokens/s, peak memory, and MFU against
   the bf16 matmul rate measured in the same process.
5. ``inference``: ``predict`` against the transformers pipeline (benchmarks/inference.py) on SST-2 dev and CoNLL-2003
   test, fp32 and bf16, sentences/s.

``--dry``: the bundle is built tiny (generated data, a tiny random BERT) for this Python, an environment holding only
the packages the GPU image holds is made from this one, and every part runs there on the CPU at tiny sizes
(tests/benchmarks/test_gpu_check.py runs it, so the check cannot rot between GPU runs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
PARTS = ("tests", "finetune", "pretraining", "inference", "cpu")
# seconds each part may take: the whole check fits in 6 minutes of an H100 with room to spare
LIMITS = {"install": 60, "tests": 120, "finetune": 90, "pretraining": 90, "inference": 60, "cpu": 90}
SIZES = {  # the real check, and the dry run's
    "gpu": {"finetune_batches": 300, "batch": 32, "max_length": 128, "mlm_batch": 64, "mlm_steps": 10,
            "shapes": {"recipe width": (256, 4, 4, 1024, 12000), "BERT-base": (768, 12, 12, 3072, 30522)},
            "peak_size": 8192, "rounds": 3, "workers": 4, "compile": (False, True), "conll_sentences": 1000,
            "cpu_sentences": 256, "cpu_rounds": 2},
    "dry": {"finetune_batches": 2, "batch": 8, "max_length": 32, "mlm_batch": 2, "mlm_steps": 1,
            "shapes": {"recipe width": (32, 2, 4, 64, 500)}, "peak_size": 256, "rounds": 1, "workers": 2,
            "compile": (False,), "conll_sentences": 32,  # compiling takes a minute on a CPU: the dry run stays eager
            "cpu_sentences": 16, "cpu_rounds": 1},
}
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
           "TOKENIZERS_PARALLELISM": "false"}


# -- the parts (each runs in its own process: ``--part NAME``) ---------------------------------------------------------

def part_tests(args, sizes: dict) -> dict:
    """tests/gpu under pytest; every test's outcome from its JUnit report."""
    import xml.etree.ElementTree as ET

    report = Path(args.work) / "tests.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           "-n", str(sizes["workers"]), "--dist", "worksteal", f"--junitxml={report}"], cwd=REPO)
    if not report.is_file():
        raise SystemExit(f"pytest wrote no report (exit {done.returncode}): see its output above")
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        found = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        outcome = "passed" if found is None else "skipped" if found.tag == "skipped" else "failed"
        said = "" if found is None else found.get("message") or ""
        message = said.splitlines()[0][:300] if said else ""
        outcomes[case.get("name")] = {"outcome": outcome, "seconds": float(case.get("time", 0)), "message": message}
    counts = {k: sum(o["outcome"] == k for o in outcomes.values()) for k in ("passed", "failed", "skipped")}
    return {**counts, "tests": outcomes}


def part_finetune(args, sizes: dict) -> dict:
    sys.path.insert(0, str(BENCHMARKS))
    import hf_finetune

    device = "cpu" if args.dry else "cuda"
    options = hf_finetune.arguments([
        "--model", str(Path(args.bundle) / "model"), "--data", str(Path(args.bundle) / "data"), "--task", "sst2",
        "--task", "conll", "--precision", "bf16-mixed", "--device", device, "--max-batches",
        str(sizes["finetune_batches"]), "--batch-size", str(sizes["batch"]), "--max-length", str(sizes["max_length"]),
        "--root", str(Path(args.work) / "finetune")])
    return {"rows": hf_finetune.compare(options), "batches": sizes["finetune_batches"], "batch_size": sizes["batch"],
            "lr": options.lr, "epochs": options.epochs}


def part_pretraining(args, sizes: dict) -> dict:
    """Masked-LM steps at each shape, every shape eager and then every shape compiled; the figures so far are kept
    after each (a part stopped at its limit keeps them), and a shape that fails (``torch.compile`` where it does not
    work) is said in ``errors`` while the others run."""
    device = "cpu" if args.dry else "cuda"
    from throughput import matmul_peak

    peak = matmul_peak("bf16", sizes["peak_size"], device=device)  # the same process's own bf16 rate
    figures = {"bf16_matmul_peak_tflops": peak / 1e12, "batch": sizes["mlm_batch"],
               "length": 128, "rows": [], "errors": [],
               "shapes": {k: dict(zip(("d_model", "layers", "heads", "d_ff", "vocab"), v))
                          for k, v in sizes["shapes"].items()}}
    for compiled in sizes["compile"]:
        for shape, dims in sizes["shapes"].items():
            try:
                figures["rows"] += mlm_rows(shape, dims, compiled, sizes, device, peak)
            except Exception as err:  # noqa: BLE001 (any failure of one shape is a finding; the others still run)
                figures["errors"].append(f"{shape}, {'compiled' if compiled else 'eager'}: {type(err).__name__}: "
                                         f"{str(err)[:400]}")
            Path(args.json).write_text(json.dumps(figures, indent=1))
    return figures


def mlm_rows(shape: str, dims: tuple, compiled: bool, sizes: dict, device: str, peak: float) -> list[dict]:
    """Masked-LM steps (forward, backward, AdamW) in bf16 autocast, Trunk and BertForMaskedLM of one size taking
    turns: a row each."""
    import torch
    from gpu_estimate import Model
    from throughput import synchronize
    from transformers import BertConfig, BertForMaskedLM

    from trunk.tasks import MaskedLanguageModeling, TrunkModule

    d, layers, heads, ff, vocab = dims
    length, batch, steps = 128, sizes["mlm_batch"], sizes["mlm_steps"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (batch, length), generator=g)
    chosen = torch.rand(batch, length, generator=g) < 0.15
    data = {"task": "mlm", "input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
            "labels": torch.where(chosen, ids, -100).to(device)}
    # one step's model FLOPs, counted as benchmarks/gpu_estimate.py and throughput.py count them
    flops = batch * length * Model(shape, d, layers, ff, vocab, length).training_flops_per_token(
        float(chosen.float().mean()))
    torch.manual_seed(0)
    trunk = TrunkModule({"mlm": MaskedLanguageModeling()}, task_info={"mlm": {}}, compile=compiled,
                        trunk={"vocab_size": vocab, "d_model": d, "n_layers": layers, "n_heads": heads,
                               "d_ff": ff, "max_len": length, "positions": "learned", "dropout": 0.1,
                               "attn_dropout": 0.1}).to(device)
    bert = BertForMaskedLM(BertConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                                      num_attention_heads=heads, intermediate_size=ff,
                                      max_position_embeddings=length)).to(device)
    if compiled:
        bert.compile()
    sides = {"trunk": (trunk, lambda b, m=trunk: m.training_step(b, 0)),
             "hf": (bert, lambda b, m=bert: m(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                             labels=b["labels"]).loss)}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
                  for name, (model, _) in sides.items()}
    seconds, memory = {name: [] for name in sides}, {}
    for round_ in range(sizes["rounds"] + 1):  # round 0 warms up (and compiles)
        for name, (model, step) in sides.items():
            model.train()
            synchronize(device)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            start = time.perf_counter()
            for _ in range(steps if round_ else 2):
                with torch.autocast(device, dtype=torch.bfloat16):
                    loss = step(data)
                loss.backward()
                optimizers[name].step()
                optimizers[name].zero_grad(set_to_none=True)
            synchronize(device)
            if round_:
                seconds[name].append((time.perf_counter() - start) / steps)
            if device == "cuda":  # this side's own: its weights and AdamW state, and what its steps add
                state = sum(t.numel() * t.element_size() for t in [*model.parameters(), *(
                    v for s in optimizers[name].state.values() for v in s.values() if torch.is_tensor(v))])
                memory[name] = (torch.cuda.max_memory_allocated() - before + state) / 2 ** 30
    return [{"shape": shape, "compiled": compiled, "side": name, "step_ms": 1000 * step_s,
             "tokens_per_s": batch * length / step_s, "mfu": flops / step_s / peak, "peak_memory_gib": memory.get(name)}
            for name, step_s in ((name, statistics.median(seconds[name])) for name in sides)]


def part_inference(args, sizes: dict) -> dict:
    sys.path.insert(0, str(BENCHMARKS))
    import inference

    device = "cpu" if args.dry else "cuda"
    data = Path(args.bundle) / "data"
    (Path(args.work) / "inference").mkdir(parents=True, exist_ok=True)
    model = inference.make_model(data, Path(args.work) / "inference", onnx=False)
    inputs = {"sst2": inference.sst2_sentences(data),
              "conll": inference.conll_sentences(data)[: sizes["conll_sentences"]]}
    rows = inference.versus_hugging_face(model, inputs, ["fp32", "bf16"], sizes["rounds"], device=device)
    return {"columns": inference.PIPELINE_COLUMNS, "rows": rows}


def part_cpu(args, sizes: dict) -> dict:
    """The host's CPU (a GPU machine's is often a Xeon with AMX, which this project's own machines are not): predict on
    SST-2 dev in each form (fp32, bf16, int8, int8 + bf16 where it has the units) and as ``precision="auto"`` takes
    it, at one thread and at all the cores, on MiniLM's shape (the bundle's model, heads after one step; the dry run:
    the inference part's tiny model); the matmul peak per dtype."""
    sys.path.insert(0, str(BENCHMARKS))
    import inference
    import int8
    import torch

    from trunk.inference.calibrate import FORMS, candidate_forms
    from trunk.training.precision import cpu_info

    work = Path(args.work) / "cpu"
    work.mkdir(parents=True, exist_ok=True)
    os.environ["TRUNK_CACHE"] = str(work / "cache")  # measured here, not read from an earlier run's cache
    data = Path(args.bundle) / "data"
    model = (Path(args.work) / "inference" / "model" if args.dry
             else inference.make_model(data, work, onnx=False, init_from=Path(args.bundle) / "model"))
    sentences = inference.sst2_sentences(data)[: sizes["cpu_sentences"]]
    rows, chosen = [], {}
    for threads in sorted({1, torch.get_num_threads()}):
        torch.set_num_threads(threads)
        runners = {form: int8.Trunk(model, precision=FORMS[form][0], quantize=FORMS[form][1])
                   for form in candidate_forms()}
        runners["auto"] = int8.Trunk(model)
        auto = runners["auto"].predictor
        quantized = any(isinstance(m, int8.Int8Linear) for m in auto.model.modules())
        chosen[threads] = next(form for form, (precision, quantize) in FORMS.items()
                               if precision == auto.precision and bool(quantize) == quantized)
        rates = inference.alternate({name: (lambda r=r: r.sst2(sentences)) for name, r in runners.items()},
                                    len(sentences), sizes["cpu_rounds"])
        fastest = max((name for name in rates if name != "auto"), key=rates.get)
        rows += [{"threads": threads, "side": name, "sentences_per_s": rate, "of_fp32": rate / rates["fp32"],
                  "fastest": name == fastest} for name, rate in rates.items()]
    cpu = cpu_info()  # its name and best bf16 unit; int8: its int8 units ("AMX-INT8, AVX512-VNNI"), "" for none
    return {"cpu": str(cpu), "int8_units": cpu.int8, "sentences": len(sentences), "auto_chose": chosen, "rows": rows,
            "matmul_gops": int8.matmul_peaks(128 if args.dry else 1024, 3)}


# -- the install --------------------------------------------------------------------------------------------------

def install(bundle: Path, site: Path) -> dict:
    """The bundle's wheels into ``site`` (pip --no-index, no dependencies fetched); then every requirement of what is
    there and of Trunk checked against this Python's packages. A missing wheel is named with what adds it."""
    requirements = (bundle / "requirements.txt").read_text().split()
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                           "--no-compile", "--disable-pip-version-check", "--find-links", str(bundle / "wheels"),
                           "--target", str(site), *requirements], capture_output=True, text=True)
    if done.returncode:
        missing = re.findall(r"No matching distribution found for (\S+)", done.stderr)
        raise SystemExit(
            f"error: the bundle {bundle} has no wheel for {', '.join(missing) or 'a requirement'} for this Python "
            f"({sys.version.split()[0]}): rebuild it with `make gpu-bundle` on a machine with network (or add the "
            f"wheel: python -m pip download --no-deps --only-binary=:all: --python-version "
            f"{sys.version_info[0]}.{sys.version_info[1]} --platform manylinux_2_17_x86_64 -d {bundle / 'wheels'} "
            f"{' '.join(missing) or 'NAME==VERSION'}).\n{done.stderr[-2000:]}")
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO,
                           env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"})
    if probe.returncode:
        raise SystemExit(f"error: checking the installed packages failed:\n{probe.stderr[-2000:]}")
    found = json.loads(probe.stdout)
    if found["missing"]:
        raise SystemExit("error: missing from the bundle and from this Python: " + "; ".join(
            f"{need} (needed by {by})" for need, by in found["missing"]) + ". Add them: `make gpu-bundle` resolves "
            "the packages the image lacks (benchmarks/gpu_bundle.py's IMAGE lists what it holds: take a package out "
            "of it if the image does not have it).")
    return {"packages": requirements, "conflicts": found["conflicts"], "versions": found["versions"]}


# What the install's check runs in the target Python: each installed requirement of Trunk's (W&B aside: imported only
# to log there) and of the bundle's packages, walked, is present; a version outside its range is kept as a conflict.
PROBE = r"""
import json, importlib.metadata as md, tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as cn
roots = [Requirement(r) for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]]
roots = [r for r in roots if cn(r.name) != "wandb"] + [Requirement("pytest-xdist"), Requirement("transformers")]
seen, missing, conflicts, queue = set(), [], [], [(r, "trunk", {""}) for r in roots]
while queue:
    req, by, extras = queue.pop()  # extras: those the requirer asked for, under which its markers are read
    if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        missing.append((str(req), by))
        continue
    if req.specifier and not req.specifier.contains(version, prereleases=True):
        conflicts.append(f"{req.name} {version} (wanted {req.specifier} by {by})")
    key = (cn(req.name), tuple(sorted(req.extras)))
    if key in seen:
        continue
    seen.add(key)
    queue += [(Requirement(line), req.name, {"", *req.extras}) for line in md.requires(req.name) or []]
print(json.dumps({"missing": missing, "conflicts": sorted(set(conflicts)),
                  "versions": {name: md.version(name) for name in sorted({name for name, _ in seen})}}))
"""


# -- the whole check ----------------------------------------------------------------------------------------------

def machine() -> dict:
    import platform

    import torch

    facts = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(),
             "torch": torch.__version__, "cpus": os.cpu_count(), "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name()
        facts["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2 ** 30, 1)
        smi = shutil.which("nvidia-smi")
        if smi:
            facts["driver"] = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                             capture_output=True, text=True).stdout.strip()
    return facts


def run_part(name: str, args, env: dict, log) -> dict:
    """One part in its own process under its time limit: its figures, its seconds, and whether it finished."""
    result = Path(args.work) / f"{name}.json"
    command = [sys.executable, __file__, "--part", name, "--json", str(result), "--bundle", str(args.bundle),
               "--work", str(args.work), *(["--dry"] if args.dry else [])]
    log.write(f"\n===== {name} =====\n")
    log.flush()
    begin, start = log.tell(), time.perf_counter()
    # a session of its own: at its limit the part goes with everything it started (pytest's workers, servers)
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = process.wait(timeout=LIMITS[name] * (4 if args.dry else 1))
        status = "ok" if code == 0 and result.is_file() else f"failed (exit {code})"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        status = f"stopped at its limit of {LIMITS[name]} s"
    seconds = time.perf_counter() - start
    figures = json.loads(result.read_text()) if result.is_file() else {}
    if name == "tests" and figures.get("failed"):
        status = f"{figures['failed']} failed"
    if status != "ok" and not figures.get("error"):  # the last line the part said: its error, mostly
        with open(log.name, errors="replace") as said:
            said.seek(begin)
            lines = [line.strip() for line in said.read().splitlines() if line.strip()]
        figures["error"] = lines[-1][:500] if lines else status
    return {"status": status, "seconds": round(seconds, 1), **figures}


def check(args) -> int:
    try:
        import torch
    except ImportError:
        print(f"error: this Python ({sys.executable}) has no torch: the GPU check runs in a Python with CUDA torch "
              "(the GPU image's python3); on this machine `make gpu-check DRY=1` runs it on the CPU at tiny sizes.",
              file=sys.stderr)
        return 2
    if not args.dry and not torch.cuda.is_available():
        print(f"error: no CUDA GPU here (torch {torch.__version__} sees none): the GPU check runs on a CUDA machine; "
              "`make gpu-check DRY=1` runs it on this CPU at tiny sizes.", file=sys.stderr)
        return 2
    bundle = Path(args.bundle)
    if not (bundle / "bundle.json").is_file():
        print(f"error: no bundle at {bundle}: build it with `make gpu-bundle` on a machine with network, and carry "
              "it with the working tree (docs/gpu.md).", file=sys.stderr)
        return 2
    manifest, here = json.loads((bundle / "bundle.json").read_text()), sys.version_info
    made_for = manifest["python_version"]
    if made_for != f"{here[0]}.{here[1]}":
        print(f"error: the bundle {bundle} holds wheels for Python {made_for}, this is Python {here[0]}.{here[1]}: "
              f"rebuild it with `make gpu-bundle GPU_PYTHON={here[0]}.{here[1]}`.", file=sys.stderr)
        return 2
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(), "dry": args.dry, "bundle": manifest, "parts": {}}
    env = {**os.environ, **OFFLINE, "PYTHONPATH": os.pathsep.join([str(work / "site"), str(REPO)]),
           "PYTHONUNBUFFERED": "1", **({"TRUNK_GPU_CHECK": "dry"} if args.dry else {})}
    with open(out / "gpu_check.log", "w") as log:
        start = time.perf_counter()
        try:
            report["parts"]["install"] = {"status": "ok", **install(bundle, work / "site")}
        except SystemExit as stop:
            report["parts"]["install"] = {"status": "failed", "error": str(stop)}
            log.write(f"{stop}\n")
        report["parts"]["install"]["seconds"] = round(time.perf_counter() - start, 1)
        for name in PARTS:
            report["parts"][name] = run_part(name, args, env, log)
            print(f"{name}: {report['parts'][name]['status']} in {report['parts'][name]['seconds']} s", flush=True)
    report["targets"] = targets(report["parts"])
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(report)
    (out / "gpu_check.md").write_text(table)
    print(table)
    return 0 if all(part["status"] == "ok" for part in report["parts"].values()) else 1


def targets(parts: dict) -> list[dict]:
    """Issue 67's targets, each read from the parts' figures: [{target, measured, met}]."""
    out = []
    tests = parts.get("tests", {})
    out.append({"target": "every CUDA test passes", "measured": f"{tests.get('passed', 0)} passed, "
                f"{tests.get('failed', 0)} failed, {tests.get('skipped', 0)} skipped",
                "met": bool(tests.get("passed")) and not tests.get("failed") and not tests.get("skipped")})
    for row in parts.get("finetune", {}).get("rows", []):
        out.append({"target": f"fine-tuning {row['task']}: Trunk's examples/s >= 1.5x transformers'",
                    "measured": f"{row['speedup']:.2f}x", "met": row["speedup"] >= 1.5})
        out.append({"target": f"fine-tuning {row['task']}: dev scores within 0.5 point",
                    "measured": f"{100 * row['trunk']:.2f} vs {100 * row['hf']:.2f}",
                    "met": row["trunk"] >= row["hf"] - 0.005})
    base = [r for r in parts.get("pretraining", {}).get("rows", [])
            if r["shape"] == "BERT-base" and r["side"] == "trunk"]
    if base:
        best = max(base, key=lambda r: r["mfu"])
        out.append({"target": "BERT-base masked-LM MFU >= 40% of the measured bf16 peak",
                    "measured": f"{best['mfu']:.1%} ({'compiled' if best['compiled'] else 'eager'})",
                    "met": best["mfu"] >= 0.40})
    for row in parts.get("inference", {}).get("rows", []):
        if row[0] == "sst2":
            out.append({"target": f"predict on SST-2 dev ({row[1]}) >= 2x the pipeline", "measured": f"{row[5]:.2f}x",
                        "met": row[5] >= 2})
    cpu = parts.get("cpu", {})
    for threads in sorted({row["threads"] for row in cpu.get("rows", [])}):
        rates = {row["side"]: row["sentences_per_s"] for row in cpu["rows"] if row["threads"] == threads}
        fastest = next(row["side"] for row in cpu["rows"] if row["threads"] == threads and row["fastest"])
        out.append({"target": f"host CPU, {threads} thread{'s' * (threads > 1)}: precision auto within 5% of the "
                              "fastest form", "measured": f"{rates['auto'] / rates[fastest]:.2f}x of {fastest}",
                    "met": rates["auto"] >= 0.95 * rates[fastest]})
        if "AMX" in cpu.get("int8_units", "") and "int8" in rates and "bf16" in rates:
            int8 = max(rates["int8"], rates.get("int8 + bf16", 0)) / rates["bf16"]
            out.append({"target": f"host CPU with AMX, {threads} thread{'s' * (threads > 1)}: int8 >= 1.3x bf16",
                        "measured": f"{int8:.2f}x", "met": int8 >= 1.3})
    return out


def section(title: str, header: list[str], rows: list[list]) -> list[str]:
    """A Markdown table under its heading, as lines."""
    return ["", f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(cell).replace("|", "/") for cell in row) + " |" for row in rows)]


def markdown(report: dict) -> str:
    m, parts = report["machine"], report["parts"]
    lines = [f"# The GPU check{' (dry run, CPU, tiny sizes)' if report['dry'] else ''}", "",
             f"{m['date']}: {m.get('gpu', 'no GPU')}" + (f", driver {m['driver']}" if m.get("driver") else "")
             + f", CUDA {m['cuda']}, torch {m['torch']}, Python {m['python']}, {m['cpus']} CPUs", "",
             "| part | status | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {part['status']} | {part.get('seconds', '')} |" for name, part in parts.items()]
    lines += section("Targets", ["target", "measured", "met"],
                     [[t["target"], t["measured"], "yes" if t["met"] else "**no**"] for t in report["targets"]])
    tests = parts.get("tests", {}).get("tests", {})
    if tests:
        lines += section("CUDA tests", ["test", "outcome", "seconds", "message"],
                         [[name, t["outcome"], f"{t['seconds']:.1f}", t["message"]] for name, t in tests.items()])
    if parts.get("finetune", {}).get("rows"):
        f = parts["finetune"]
        lines += section(
            f"Fine-tuning MiniLM beside transformers ({f['batches']} steps of {f['batch_size']}, lr {f['lr']}, "
            "bf16-mixed)",
            ["task", "Trunk dev", "transformers dev", "Trunk examples/s", "transformers examples/s", "speed-up",
             "Trunk peak GiB", "transformers peak GiB"],
            [[r["task"], f"{r['trunk']:.4f}", f"{r['hf']:.4f}", f"{r['trunk_examples_per_s']:,.0f}",
              f"{r['hf_examples_per_s']:,.0f}", f"{r['speedup']:.2f}x",
              *("" if r[k] is None else f"{r[k]:.2f}" for k in ("trunk_peak_gib", "hf_peak_gib"))] for r in f["rows"]])
    if parts.get("pretraining", {}).get("rows"):
        p = parts["pretraining"]
        lines += section(
            f"Masked-LM pretraining steps (batch {p['batch']} x {p['length']} tokens, bf16 autocast; measured bf16 "
            f"matmul peak {p['bf16_matmul_peak_tflops']:.0f} TFLOP/s)",
            ["shape", "compiled", "side", "ms/step", "tokens/s", "MFU", "peak memory (GiB)"],
            [[r["shape"], "yes" if r["compiled"] else "no", "Trunk" if r["side"] == "trunk" else "BertForMaskedLM",
              f"{r['step_ms']:.1f}", f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}",
              "" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.2f}"] for r in p["rows"]])
    if parts.get("inference", {}).get("rows"):
        lines += section("predict against the transformers pipeline (sentences/s)", parts["inference"]["columns"],
                         [[f"{v:,.2f}" if isinstance(v, float) else v for v in row]
                          for row in parts["inference"]["rows"]])
    if parts.get("cpu", {}).get("rows"):
        c = parts["cpu"]
        lines += section(
            f"The host CPU: {c['cpu']} (int8 units: {c['int8_units'] or 'none'}); predict on the "
            f"first {c['sentences']} SST-2 dev sentences, MiniLM's shape; auto chose {c['auto_chose']}",
            ["threads", "side", "sentences/s", "of fp32", "fastest"],
            [[r["threads"], r["side"], f"{r['sentences_per_s']:,.1f}", f"{r['of_fp32']:.2f}x",
              "yes" if r["fastest"] else ""] for r in c["rows"]])
        lines += section("The host CPU's matmul peak (GOP/s, 1024^3)", ["dtype", "one thread", "all threads"],
                         [[name, *(f"{v:,.1f}" for v in values)] for name, values in c["matmul_gops"].items()])
    failures = [[name, part.get("error") or "; ".join(part["errors"])] for name, part in parts.items()
                if part.get("error") or part.get("errors")]
    if failures:
        lines += section("What failed", ["part", "error"], failures)
    return "\n".join(lines) + "\n"


# -- the dry run's environment -------------------------------------------------------------------------------------

def image_stand_in(path: Path) -> Path:
    """A fresh virtual environment that sees, of this one's packages, only those the GPU image holds (linked from
    here): the bundle then has to bring the rest, as it must there. Its Python."""
    import importlib.metadata

    from gpu_bundle import IMAGE
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    by_name = {canonicalize_name(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    held, queue = set(), [name for name in IMAGE if name in by_name]
    while queue:  # the image's packages and what they need here (there, the image holds that too)
        name = queue.pop()
        if name in held or name not in by_name:
            continue
        held.add(name)
        queue += [canonicalize_name(Requirement(r).name) for r in by_name[name].requires or []
                  if Requirement(r).marker is None or Requirement(r).marker.evaluate({"extra": ""})]
    venv.create(path, with_pip=True, clear=True)
    python = path / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    image = path / "image"
    image.mkdir()
    for dist in (by_name[name] for name in held):
        if not dist.files:
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files if not str(f).startswith("..")}:
            source, link = Path(dist.locate_file(top)), image / top
            if source.exists() and not link.exists() and top != "__pycache__":
                link.symlink_to(source)
    (site / "gpu_image.pth").write_text(f"{image}\n")
    return python


def dry_run(args) -> int:
    """Build a tiny bundle for this Python, make the image's stand-in, and run the check in it."""
    sys.path.insert(0, str(BENCHMARKS))
    import gpu_bundle

    out, work = Path(args.out).resolve(), Path(args.work).resolve()
    bundle = work / "bundle"
    gpu_bundle.main(["--tiny", "--out", str(bundle), "--python-version",
                     f"{sys.version_info[0]}.{sys.version_info[1]}"])
    python = image_stand_in(work / "venv")
    return subprocess.run([python, __file__, "--inside", "--dry", "--bundle", str(bundle), "--out", str(out),
                           "--work", str(work / "check")], cwd=REPO).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default=str(REPO / ".gpu"), help="the bundle (make gpu-bundle)")
    parser.add_argument("--out", default=str(REPO / "gpu-check"), help="where gpu_check.json, .md and .log go")
    parser.add_argument("--work", help="scratch space: the installed packages, runs (default: a temporary folder)")
    parser.add_argument("--dry", action="store_true", help="on this CPU at tiny sizes, in a fresh environment")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)  # the dry run's second stage
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # one part, in the check's environment
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        sys.argv = sys.argv[:1]  # the parts' LightningCLI runs read their own arguments
        figures = globals()[f"part_{args.part}"](args, SIZES["dry" if args.dry else "gpu"])
        Path(args.json).write_text(json.dumps(figures, indent=1))
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        args.work = args.work or scratch
        if args.dry and not args.inside:
            return dry_run(args)
        return check(args)


if __name__ == "__main__":
    sys.exit(main())
