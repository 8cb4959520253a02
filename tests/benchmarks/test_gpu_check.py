"""The GPU check (benchmarks/gpu_check.py, gpu_bundle.py; docs/gpu.md): its CPU dry run end to end, in a fresh
environment that holds only the GPU image's packages; its refusals; what the bundle carries."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO

BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


@pytest.mark.slow
def test_the_dry_run_installs_the_bundle_with_no_index_into_a_fresh_environment_and_runs_every_part(tmp_path):
    """``make gpu-check DRY=1``: a tiny bundle, the image's stand-in, every part on the CPU; the figures in the JSON and
    the tables in the Markdown."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--dry", "--out", str(tmp_path / "out"),
                           "--work", str(tmp_path / "work")], capture_output=True, text=True, timeout=1200)
    log = (tmp_path / "out" / "gpu_check.log").read_text() if (tmp_path / "out" / "gpu_check.log").is_file() else ""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + log[-5000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["dry"] and list(report["parts"]) == ["install", "tests", "finetune", "pretraining", "inference",
                                                       "cpu"]
    assert all(part["status"] == "ok" and part["seconds"] > 0 for part in report["parts"].values())
    # the install brought what the image lacks, from the bundle, into a folder of its own
    install = report["parts"]["install"]
    assert {"datasets", "jsonargparse", "litserve"} <= {p.split("==")[0] for p in install["packages"]}
    assert {"datasets", "torch", "lightning"} <= set(install["versions"])  # every requirement found, from both sides
    tests = report["parts"]["tests"]
    assert tests["passed"] >= 12 and tests["failed"] == 0
    assert all(t["outcome"] == "passed" for name, t in tests["tests"].items() if "kind" in name or "[ddp]" in name)
    assert [row["task"] for row in report["parts"]["finetune"]["rows"]] == ["sst2", "conll"]
    assert all(row["trunk_examples_per_s"] > 0 and row["hf_examples_per_s"] > 0
               for row in report["parts"]["finetune"]["rows"])
    rows = report["parts"]["pretraining"]["rows"]
    assert {row["side"] for row in rows} == {"trunk", "hf"} and all(row["mfu"] > 0 for row in rows)
    assert [row[:2] for row in report["parts"]["inference"]["rows"]] == [
        ["sst2", "fp32"], ["conll", "fp32"], ["sst2", "bf16"], ["conll", "bf16"]]
    cpu = report["parts"]["cpu"]  # the host CPU's forms, at one thread and at all (the dry run: 1 and 1)
    assert {"fp32", "auto"} <= {row["side"] for row in cpu["rows"]}
    assert all(row["sentences_per_s"] > 0 for row in cpu["rows"])
    assert set(cpu["auto_chose"].values()) <= {"fp32", "bf16", "int8", "int8 + bf16"} and "fp32" in cpu["matmul_gops"]
    assert any("precision auto within 5% of the fastest form" in t["target"] for t in report["targets"])
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    for heading in ("## Targets", "## CUDA tests", "## Fine-tuning MiniLM", "## Masked-LM", "## predict against",
                    "## The host CPU:", "## The host CPU's matmul peak"):
        assert heading in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_the_check_says_so_in_one_line_and_fails(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "no CUDA GPU here" in done.stderr
    assert "make gpu-check DRY=1" in done.stderr and not (tmp_path / "out").exists()


def test_a_python_without_torch_is_told_where_the_check_runs(tmp_path):
    """``make gpu-check`` runs python3: where that Python has no torch (this machine's base Python), one line."""
    base = getattr(sys, "_base_executable", None)
    if not base or subprocess.run([base, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("the base Python has torch")
    done = subprocess.run([base, str(BENCHMARKS / "gpu_check.py"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "has no torch" in done.stderr and "make gpu-check DRY=1" in done.stderr


def test_a_missing_wheel_is_named_with_the_command_that_adds_it(tmp_path):
    import gpu_check

    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    (bundle / "requirements.txt").write_text("dill==0.4.1\n")
    with pytest.raises(SystemExit) as stop:
        gpu_check.install(bundle, tmp_path / "site")
    said = str(stop.value).splitlines()[0]
    assert "has no wheel for dill==0.4.1" in said and "make gpu-bundle" in said and "pip download" in said


def test_a_bundle_for_another_python_is_refused_with_the_command_that_rebuilds_it(tmp_path, monkeypatch, capsys):
    import gpu_check

    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "bundle.json").write_text(json.dumps({"python_version": "2.7"}))
    code = gpu_check.main(["--dry", "--inside", "--bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "o")])
    said = capsys.readouterr().err
    assert code == 2 and "holds wheels for Python 2.7" in said and "make gpu-bundle GPU_PYTHON=" in said


def test_the_bundle_carries_what_the_image_lacks_and_stops_at_what_it_holds():
    """The walk through the resolved requirements: the roots' needs beyond the image, extras followed, markers read for
    the target Python, and nothing below a package the image holds."""
    import gpu_bundle

    def item(name, version, *requires):
        return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}

    resolved = {
        "litserve": item("litserve", "1", "fastapi>=0.1", "uvicorn[standard]"),
        "fastapi": item("fastapi", "2", "pydantic>=2", "starlette"),
        "pydantic": item("pydantic", "3", "pydantic-core==9"),
        "pydantic-core": item("pydantic-core", "9"),
        "starlette": item("starlette", "4", "anyio>=3"),
        "uvicorn": item("uvicorn", "5", "h11", "httptools; extra == 'standard'", "tomli; python_version < '3.11'"),
        "httptools": item("httptools", "6"),
        "tomli": item("tomli", "7"),
        "anyio": item("anyio", "8", "sniffio"),  # in the image: sniffio is not walked to
        "sniffio": item("sniffio", "1"),
        "h11": item("h11", "1"),
    }
    carried = gpu_bundle.beyond_the_image(["litserve==1"], resolved, "3.12")
    assert carried == ["fastapi==2", "httptools==6", "litserve==1", "pydantic-core==9", "pydantic==3", "starlette==4",
                       "uvicorn==5"]
    assert "tomli==7" in gpu_bundle.beyond_the_image(["litserve==1"], resolved, "3.10")
