"""Prepare, on a machine with network, what the GPU check (benchmarks/gpu_check.py, docs/gpu.md) needs on a GPU machine
that has none: one ignored folder that travels with the working tree.

    make gpu-bundle                                   # .gpu/ from ../shared/data, for the device image's Python 3.12
    python benchmarks/gpu_bundle.py --data ../shared/data --model ../shared/data/pretrained/all-MiniLM-L6-v2 --out .gpu
    python benchmarks/gpu_bundle.py --tiny --out /tmp/bundle --python-version 3.11   # the CPU dry run's bundle

What it holds:
- ``wheels/`` and ``requirements.txt``: the packages Trunk's check imports that the GPU image lacks (``datasets``,
  ``jsonargparse``, ``litserve`` and what they need beyond the image), at the versions installed here, for the target
  Python on manylinux x86-64; the image's own packages (``IMAGE``: torch, lightning, transformers, ...) are not
  carried. ``wandb`` is not needed: Trunk imports it only to log to W&B.
- ``data/``: the slices the check reads, in ``../shared/data``'s layout: SST-2 (the first ``--sst2-rows`` training
  rows, all of dev) and CoNLL-2003 (the first ``--conll-sentences`` training sentences, all of valid and test).
  CoNLL-2003 is not redistributable: the folder is ignored by git and only travels to the GPU machine.
- ``model/``: the pretrained MiniLM's folder with its weights in bf16 (45 MB instead of 90: the tree that travels is
  64 MiB in all); both sides of the fine-tuning comparison train it in fp32 master weights from there.
- ``bundle.json``: what went in, its sizes, and the Python it is for.

``--tiny`` writes generated data and a tiny random BERT instead of real ones (needs ``transformers``): the dry run's.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("datasets", "jsonargparse[signatures]", "litserve")  # what Trunk's check imports beyond the image
# The device image's Python packages (the device tool's KINDS.md, read on a machine running it on 2026-11-17): these
# are never carried. The check records the versions it finds there.
IMAGE = frozenset(canonicalize_name(n) for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())  # noqa: SIM905 (the list as KINDS.md gives it)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")
TRAVEL_LIMIT = 64 * 2 ** 20  # the device tool carries the working tree and carried paths up to this, in all


def pinned_roots() -> list[str]:
    """The roots at the versions installed here (the ones this machine's tests ran with)."""
    out = []
    for root in ROOTS:
        name = Requirement(root).name
        out.append(f"{root}=={importlib.metadata.version(name)}")
    return out


def target_flags(python_version: str) -> list[str]:
    """pip's options that resolve and download for ``python_version`` (CPython) on manylinux x86-64."""
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            *(f"--platform={p}" for p in PLATFORMS)]


def resolve(roots: list[str], python_version: str) -> dict[str, dict]:
    """pip's resolution of ``roots`` for the target (nothing installed): {canonical name: the report's item}."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--report", str(report), "--target", str(Path(tmp) / "t"), *target_flags(python_version),
                        *roots], check=True)
        items = json.loads(report.read_text())["install"]
    return {canonicalize_name(item["metadata"]["name"]): item for item in items}


def beyond_the_image(roots: list[str], resolved: dict[str, dict], python_version: str) -> list[str]:
    """The packages to carry: the roots and what they need, walked through their requirements (markers evaluated for
    the target, extras followed) and stopping at the image's packages, as name==version."""
    environment = {"python_version": python_version, "python_full_version": f"{python_version}.0",
                   "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                   "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    wanted, queue = {}, [Requirement(r) for r in roots]
    while queue:
        requirement = queue.pop()
        name = canonicalize_name(requirement.name)
        if name in IMAGE:
            continue
        item = resolved[name]
        extras = set(requirement.extras)
        if name in wanted and extras <= wanted[name][1]:
            continue
        wanted[name] = (item["metadata"]["version"], extras | (wanted[name][1] if name in wanted else set()))
        for line in item["metadata"].get("requires_dist", []):
            need = Requirement(line)
            if need.marker is None or any(need.marker.evaluate({**environment, "extra": e})
                                          for e in (wanted[name][1] or {""})):
                queue.append(need)
    return sorted(f"{name}=={version}" for name, (version, _) in wanted.items())


def download_wheels(pins: list[str], python_version: str, wheels: Path) -> None:
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *target_flags(python_version),
                    "-d", str(wheels), *pins], check=True)


# -- data and model -------------------------------------------------------------------------------------------------

def slice_data(data: Path, out: Path, sst2_rows: int, conll_sentences: int) -> None:
    """SST-2 and CoNLL-2003 in ``data``'s layout: the first rows / sentences of train, dev / valid / test whole."""
    missing = [p for p in ("sst2/train.tsv", "sst2/dev.tsv", "conll2003/train.txt", "conll2003/valid.txt",
                           "conll2003/test.txt") if not (data / p).is_file()]
    if missing:
        raise SystemExit(f"error: --data {data} lacks {', '.join(missing)}: pass the folder that holds sst2/ and "
                         "conll2003/ (../shared/data on the development machines).")
    (out / "sst2").mkdir(parents=True, exist_ok=True)
    (out / "conll2003").mkdir(parents=True, exist_ok=True)
    lines = (data / "sst2/train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    (out / "sst2/train.tsv").write_text("".join(lines[: sst2_rows + 1]), encoding="utf-8")
    shutil.copyfile(data / "sst2/dev.tsv", out / "sst2/dev.tsv")
    kept, sentences = [], 0
    for line in (data / "conll2003/train.txt").read_text(encoding="utf-8").splitlines(keepends=True):
        if not line.strip():
            sentences += 1
            if sentences >= conll_sentences:
                break
        kept.append(line)
    (out / "conll2003/train.txt").write_text("".join(kept) + "\n", encoding="utf-8")
    for split in ("valid", "test"):
        shutil.copyfile(data / f"conll2003/{split}.txt", out / f"conll2003/{split}.txt")


def bf16_model(model: Path, out: Path) -> None:
    """The model folder with its floating weights stored in bf16; every other file as it is."""
    import torch
    from safetensors.torch import load_file, save_file

    if not (model / "model.safetensors").is_file() or not (model / "config.json").is_file():
        raise SystemExit(f"error: --model {model} is not a Hugging Face model folder (config.json, model.safetensors): "
                         "pass ../shared/data/pretrained/all-MiniLM-L6-v2 or another BERT-family folder.")
    out.mkdir(parents=True, exist_ok=True)
    for path in model.iterdir():
        if path.is_file() and path.name != "model.safetensors":
            shutil.copyfile(path, out / path.name)
    weights = load_file(model / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()},
              out / "model.safetensors", metadata={"format": "pt"})


def tiny_data(out: Path, seed: int = 0) -> None:
    """Generated stand-ins for the slices (the dry run's): sentiment rows and tagged sentences in the real layouts."""
    rng = random.Random(seed)
    good, bad = ["great", "superb", "moving", "fun"], ["dull", "tired", "weak", "boring"]
    (out / "sst2").mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 256), ("dev", 64)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            label = rng.randrange(2)
            rows.append(f"the film was {rng.choice(good if label else bad)} and {rng.choice(good + bad)}\t{label}")
        (out / "sst2" / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (out / "conll2003").mkdir(parents=True, exist_ok=True)
    names, places = ["Anna", "Boris", "Carla"], [["Paris"], ["Oslo"], ["New", "York"]]
    for split, n in (("train", 128), ("valid", 32), ("test", 32)):
        lines = ["-DOCSTART- -X- -X- O", ""]
        for _ in range(n):
            place = rng.choice(places)
            located = [(word, "I-LOC" if i else "B-LOC") for i, word in enumerate(place)]
            words = [(rng.choice(names), "B-PER"), ("left", "O"), *located, ("today", "O")]
            lines += [f"{w} NN O {t}" for w, t in words] + [""]
        (out / "conll2003" / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def tiny_model(data: Path, out: Path) -> None:
    """A tiny random BERT folder (config, bf16 safetensors, a WordPiece tokenizer of the tiny data's words)."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel

    words = sorted({w.lower() for path in data.rglob("*.t*") for w in path.read_text().split()})
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=128)).to(torch.bfloat16).save_pretrained(out)


# -- the bundle -----------------------------------------------------------------------------------------------------

def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build(out: Path, python_version: str, data: Path | None, model: Path | None, tiny: bool, sst2_rows: int,
          conll_sentences: int) -> dict:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    roots = pinned_roots()
    pins = beyond_the_image(roots, resolve(roots, python_version), python_version)
    download_wheels(pins, python_version, out / "wheels")
    (out / "requirements.txt").write_text("\n".join(pins) + "\n")
    if tiny:
        tiny_data(out / "data")
        tiny_model(out / "data", out / "model")
    else:
        slice_data(data, out / "data", sst2_rows, conll_sentences)
        bf16_model(model, out / "model")
    manifest = {"python_version": python_version, "built": time.strftime("%Y-%m-%d %H:%M:%S"), "tiny": tiny,
                "packages": pins, "image_packages": sorted(IMAGE), "source_data": str(data), "source_model": str(model),
                "sizes_mb": {part: round(size_of(out / part) / 2 ** 20, 1) for part in ("wheels", "data", "model")}}
    (out / "bundle.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / ".gpu"), help="the bundle's folder (replaced; default .gpu)")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"), help="the folder of sst2/, conll2003/")
    parser.add_argument("--model", help="the pretrained model folder (default: DATA/pretrained/all-MiniLM-L6-v2)")
    parser.add_argument("--python-version", default="3.12", help="the Python the wheels are for (the image's: 3.12)")
    parser.add_argument("--sst2-rows", type=int, default=10000)
    parser.add_argument("--conll-sentences", type=int, default=4000)
    parser.add_argument("--tiny", action="store_true", help="generated data and a tiny random BERT (the dry run's)")
    args = parser.parse_args(argv)
    data = Path(args.data)
    model = Path(args.model) if args.model else data / "pretrained" / "all-MiniLM-L6-v2"
    manifest = build(Path(args.out), args.python_version, None if args.tiny else data, None if args.tiny else model,
                     args.tiny, args.sst2_rows, args.conll_sentences)
    total = size_of(Path(args.out))
    print(f"bundle {args.out}: {len(manifest['packages'])} wheels for Python {args.python_version} "
          f"({', '.join(manifest['packages'])}); sizes (MB) {manifest['sizes_mb']}; {total / 2 ** 20:.1f} MB in all")
    tree = total + sum(p.stat().st_size for p in map(REPO.joinpath, tracked_files()) if p.is_file())
    if tree > TRAVEL_LIMIT:
        raise SystemExit(f"error: the working tree and the bundle make {tree / 2 ** 20:.1f} MB, over the device's "
                         f"{TRAVEL_LIMIT // 2 ** 20} MiB: lower --sst2-rows / --conll-sentences.")


def tracked_files() -> list[str]:
    done = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.splitlines() if done.returncode == 0 else []


if __name__ == "__main__":
    main()
