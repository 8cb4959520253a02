"""`trunk serve`: a real server on 127.0.0.1 (its own process, as a user starts it) and a real HTTP client.
Every request loop here is bounded, and every server is stopped by the test that started it."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import REPO, single_task
from kinds import KINDS
from test_matrix import TRUNK, same_records

from trunk.cli import export_main, run_cli
from trunk.tasks import load

pytest.importorskip("litserve")

SERVED = [name for name, kind in KINDS.items() if kind.inputs] + ["image_classification"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``trunk serve ...`` in a process group of its own, stopped (the group killed) on exit."""

    def __init__(self, *args: str, startup: float = 120.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (a file, not a pipe: a full pipe would stall the server)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trunk.cli", "serve", *args, f"--port={self.port}"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=os.environ.copy(),
        )
        deadline = time.monotonic() + startup
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"trunk serve exited ({self.process.returncode}):\n{self.output()[-3000:]}")
            try:
                if self.get("/health") == (200, "ok"):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise AssertionError(f"trunk serve was not healthy within {startup} s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return response.status, response.read().decode()

    def post(self, body, timeout: float = 60, content_type: str = "application/json") -> tuple[int, object]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(self.url + "/predict", data=data, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):  # whatever of its group outlived it (a failed test's leftovers)
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=20)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def png_base64(seed: int | None, side: int = 16) -> str:
    """A grey PNG of random pixels (``seed``), or blank (None: a few KB however large)."""
    from PIL import Image

    pixels = (torch.zeros(side, side) if seed is None else
              torch.rand(side, side, generator=torch.Generator().manual_seed(seed)) * 255).to(torch.uint8).numpy()
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def decoded(x, task: str):
    """What the Python API is given for a served input: the image itself for image tasks."""
    if task != "image_classification":
        return x
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(x)))


@pytest.fixture
def every_kind(request, tmp_path):
    """A model with one task of every predictable kind on one trunk (two training steps: serving must give the
    records of the Python API, whatever the weights), exported with its ONNX graphs, fp32 and int8."""
    args = []
    for name in SERVED:
        kind = KINDS[name]
        files = {
            kind_source: request.getfixturevalue(f"{kind_source}_files")
            for kind_source in ("sentiment", "ner", "reversal", "scores", "topics", "quiz", "squad")
        }
        args += single_task(
            [f"--model={kind.objective}", *kind.objective_args, f"--data={kind.data}", *kind.data_args(files)], name
        )
    args += [
        *TRUNK,
        "--data.tokenizer_vocab_size=300",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=1",
        "--trainer.precision=32-true",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
        "--seed_everything=0",
    ]
    fit = run_cli(["fit", *args])
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    export_main([ckpt, str(tmp_path / "exported"), "--onnx", "--quantize", "int8"])
    return tmp_path / "exported"


def inputs_of(name: str) -> list:
    kind = KINDS[name]
    return (
        [png_base64(0), png_base64(1)]
        if name == "image_classification"
        else [list(x) if isinstance(x, tuple) else x for x in kind.inputs]
    )


def test_a_served_model_answers_as_predict_does_and_refuses_bad_requests_without_dying(every_kind):
    model = load(every_kind, precision="32-true")
    with Server(str(every_kind), "--precision=32-true", "--max-batch-size=16") as server:
        info = json.loads(server.get("/info")[1])
        assert set(info["model"]["tasks"]) == set(SERVED)
        assert info["model"]["tasks"]["sequence_classification"]["labels"] == ["negative", "positive"]

        # every kind: one input, a list of inputs, the same records as the Python API
        for name in SERVED:
            inputs = inputs_of(name)
            expected = model.predict([decoded(x, name) for x in inputs], task=name)
            status, records = server.post({"inputs": inputs, "task": name})
            assert status == 200, records
            assert same_records(records, expected, 1e-5), (name, records, expected)
            # alone (generation's length follows its batch)
            status, record = server.post({"input": inputs[1], "task": name})
            assert status == 200 and same_records(
                record, model.predict([decoded(inputs[1], name)], task=name)[0], 1e-5
            ), name

        # JSON sent as `curl -d` sends it (form data): read as the JSON it is
        status, record = server.post({"input": "the film was great", "task": "sequence_classification"},
                                     content_type="application/x-www-form-urlencoded")
        assert status == 200 and same_records(
            record, model.predict(["the film was great"], task="sequence_classification")[0], 1e-5
        )

        # several tasks in one request: {task: record}, as predict(task=[...]) gives
        texts = ["the film was great", "Anna Petrova left Paris on Monday ."]
        both = ["sequence_classification", "token_classification"]
        status, records = server.post({"inputs": texts, "task": both})
        assert status == 200 and same_records(records, model.predict(texts, task=both), 1e-5)

        # 200 concurrent requests: every one answered, each with its own input's record
        sentences = [f"the film was {'great' if i % 2 else 'dull'} {'and long ' * (i % 7)}" for i in range(200)]
        expected = model.predict(sentences, task="sequence_classification")
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda s: server.post({"input": s, "task": "sequence_classification"}), sentences))
        assert [status for status, _ in answers] == [200] * 200
        assert same_records([record for _, record in answers], expected, 1e-5)

        # bad requests: 422 saying what is wrong; the good requests beside them are answered
        bad = {
            b"{not json": "JSON decode error",
            json.dumps({"task": "sequence_classification"}).encode(): 'exactly one of "input"',
            json.dumps({"input": "x", "inputs": ["y"]}).encode(): 'exactly one of "input"',
            json.dumps(
                {"text": "a film", "task": "sequence_classification"}
            ).encode(): "the body has the field 'text', which /predict does not read: send {\"input\": ...}",
            json.dumps({"inputs": [], "task": "sequence_classification"}).encode(): "at least 1 item",
            json.dumps({"input": "a film", "task": "no_such_task"}).encode(): "No task named 'no_such_task'",
            json.dumps({"input": "a film"}).encode(): "name one with task=",
            json.dumps({"input": "   ", "task": "sequence_classification"}).encode(): "input: an empty text",
            json.dumps(
                {"inputs": ["fine", 7], "task": "sequence_classification"}
            ).encode(): "inputs[1]: int is not a text",
            json.dumps({"input": {"question": "who ?"}, "task": "extractive_qa"}).encode(): "KeyError: 'context'",
            json.dumps(
                {"input": {"context": "which ?", "choices": ["one"]}, "task": "multiple_choice"}
            ).encode(): "at least 2 choices",
            json.dumps(
                {"input": "bm90IGFuIGltYWdl", "task": "image_classification"}
            ).encode(): "not a base64-encoded image file",
            json.dumps(
                {"input": "/etc/passwd", "task": "image_classification"}
            ).encode(): "not a base64-encoded image file",
        }
        with ThreadPoolExecutor(16) as pool:
            good = pool.submit(
                lambda: [server.post({"input": s, "task": "sequence_classification"}) for s in sentences[:20]]
            )
            answers = dict(zip(bad, pool.map(server.post, bad)))
        for body, (status, answer) in answers.items():
            assert status == 422, (body, status, answer)
            detail = answer["detail"]  # the worker's sentence, or FastAPI's list of the fields at fault
            assert bad[body] in (detail if isinstance(detail, str) else " ".join(error["msg"] for error in detail)), (
                body,
                answer,
            )
        assert [status for status, _ in good.result()] == [200] * 20
        assert server.get("/health") == (200, "ok")

        # an input over the model's max_length: truncated, and its record says so
        status, record = server.post({"input": "great " * 500, "task": "sequence_classification"})
        assert status == 200 and record["truncated"] is True
        assert "truncated" not in server.post({"input": "great", "task": "sequence_classification"})[1]

    # what one request may hold: beyond it, 413 for the body and 422 for the rest, naming the limit; an image of
    # another size within the limit is read at the model's size, as the Python API reads it
    limits = ["--max-body-mb=0.05", "--max-inputs=4", "--max-chars=60", "--max-image-pixels=10000"]
    with Server(str(every_kind), "--precision=32-true", *limits) as server:
        task = "sequence_classification"
        status, answer = server.post({"input": "x " * 40_000, "task": task})
        assert status == 413 and "over 52428 bytes, this server's limit (trunk serve --max-body-mb)" in answer["detail"]
        refused = {
            "5 inputs, more than this server takes in one request (4, trunk serve --max-inputs)":
                {"inputs": ["a film"] * 5, "task": task},
            "61 characters of text, more than this server reads in one input (60, trunk serve --max-chars)":
                {"input": "a" * 61, "task": task},
            "80 characters of text": {"input": ["a" * 40, "b" * 40], "task": task},  # a pair counts together
            "an image of 4000x4000 pixels, more than this server decodes (10000 pixels":  # a PNG of a few KB
                {"input": png_base64(None, 4000), "task": "image_classification"},
        }
        for message, body in refused.items():
            status, answer = server.post(body)
            assert status == 422 and message in answer["detail"], (message, answer)
        status, record = server.post({"input": png_base64(3, 90), "task": "image_classification"})
        expected = model.predict([decoded(png_base64(3, 90), "image_classification")], task="image_classification")
        assert status == 200 and same_records(record, expected[0], 1e-5)
        assert server.post({"input": "a" * 60, "task": task})[0] == 200 and server.get("/health") == (200, "ok")

    # the ONNX runtime: the same records for the exported kinds
    with Server(str(every_kind), "--runtime=onnx") as server:
        for name in (
            "sequence_classification",
            "token_classification",
            "sequence_regression",
            "multi_label_classification",
        ):
            status, records = server.post({"inputs": inputs_of(name), "task": name})
            assert status == 200 and same_records(records, model.predict(inputs_of(name), task=name), 1e-4), name
        status, answer = server.post({"input": inputs_of("extractive_qa")[0], "task": "extractive_qa"})
        assert status == 422 and "['extractive_qa'] have no ONNX graph" in answer["detail"]

    # int8: the trunk quantized in the worker answers every kind as load(quantize="int8") does, and the int8 graphs
    # as load(runtime="onnx", quantize="int8")
    int8 = load(every_kind, precision="32-true", quantize="int8")
    with Server(str(every_kind), "--precision=32-true", "--quantize=int8") as server:
        assert json.loads(server.get("/info")[1])["model"]["quantize"] == "int8"
        for name in SERVED:
            expected = int8.predict([decoded(x, name) for x in inputs_of(name)], task=name)
            status, records = server.post({"inputs": inputs_of(name), "task": name})
            assert status == 200 and same_records(records, expected, 1e-5), name
    int8_graphs = load(every_kind, runtime="onnx", quantize="int8")
    with Server(str(every_kind), "--runtime=onnx", "--quantize=int8") as server:
        for name in ("sequence_classification", "token_classification"):
            expected = int8_graphs.predict(inputs_of(name), task=name)
            status, records = server.post({"inputs": inputs_of(name), "task": name})
            assert status == 200 and same_records(records, expected, 1e-5), name


def test_a_request_waiting_longer_than_the_timeout_gets_504_and_the_server_goes_on(tiny_cli_args, tmp_path):
    fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=1"])
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    with Server(ckpt, "--timeout=0.2", "--batch-timeout=0.001", "--max-batch-size=1", "--batch-size=8") as server:
        slow = {"inputs": ["a long sentence " * 20] * 1024}  # seconds of work on one worker
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(server.post, [slow] * 8))
        statuses = sorted(status for status, _ in answers)
        assert 504 in statuses and set(statuses) <= {200, 504}, statuses
        assert server.post({"input": "the film was great"})[0] == 200


def test_serve_names_a_model_that_is_not_there_or_not_a_model_before_starting(tmp_path):
    """A missing path, or a data file given as the model: one line naming it (not an option serve lacks)."""
    (tmp_path / "train.csv").write_text("text,label\nthe film was great,pos\n")
    for model, message in ((tmp_path / "nothing.ckpt", "nothing.ckpt' does not exist"),
                           (tmp_path / "train.csv", "train.csv' is not a checkpoint: it is a text file (its first "
                                                    "line: 'text,label')")):
        done = subprocess.run([sys.executable, "-m", "trunk.cli", "serve", str(model)], capture_output=True, text=True,
                              timeout=120, env=os.environ.copy())
        assert done.returncode != 0 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "--ckpt_path" not in done.stderr


@pytest.mark.parametrize("option", ["--port=80", "--workers=0", "--timeout=-1", "--host=10.1.2.3", "--timeout=nan",
                                    "--max-body-mb=inf", "--batch-timeout=-inf"])
def test_serve_options_out_of_range_are_one_line(option, tmp_path):
    done = subprocess.run([sys.executable, "-m", "trunk.cli", "serve", str(tmp_path / "model.ckpt"), option],
                          capture_output=True, text=True, timeout=120, env=os.environ.copy())
    name, value = option.split("=")
    assert done.returncode == 2 and f"argument {name}: " in done.stderr and "Traceback" not in done.stderr
    assert ("1024 to 65535" if name == "--port" else "invalid choice" if name == "--host" else
            "not a finite number" if "inf" in value or "nan" in value else "out of range") in done.stderr


@pytest.mark.parametrize("after", [0.3, 1.5, 4.0])
def test_a_ctrl_c_at_any_moment_of_start_up_stops_without_a_traceback(after, tiny_cli_args):
    """Ctrl+C (SIGINT to the whole process group, as a terminal sends it) while the libraries load, while the model
    loads or as the workers start: the server and everything it started stop, one line, no traceback."""
    fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=1"])
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    process = subprocess.Popen([sys.executable, "-m", "trunk.cli", "serve", ckpt, f"--port={free_port()}"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env=os.environ.copy())
    time.sleep(after)
    os.killpg(process.pid, signal.SIGINT)
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"still running 60 s after the Ctrl+C; it printed:\n{process.communicate()[0][-3000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode != 0 and "Traceback" not in output, output[-3000:]
    deadline = time.monotonic() + 10
    while group_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_members(process.pid) == []


def test_a_ctrl_c_a_library_swallowed_while_loading_stops_the_server_before_it_starts(tiny_cli_args):
    """torch's C extension clears a KeyboardInterrupt raised as it imports numpy, and went on to serve: the Ctrl+C is
    honoured once serving's own handler is in place (exit 130, one line), before the model loads."""
    fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=1"])
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    done = subprocess.run([sys.executable, str(REPO / "tests/ctrl_c_in_torch_import.py"), "serve", ckpt,
                           f"--port={free_port()}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130 and done.stderr.strip() == "Interrupted.", done.stdout + done.stderr[-3000:]
    assert "trunk serve: http" not in done.stdout


def test_serve_refuses_more_workers_than_the_process_has_cores(tmp_path):
    """--workers beyond the cores this process may use (its affinity and quota) would never all start: refused in one
    line naming the cores, before the model is read."""
    from trunk.training.threads import usable_cores

    cores = usable_cores()[0]
    done = subprocess.run([sys.executable, "-m", "trunk.cli", "serve", str(tmp_path / "model.ckpt"),
                           f"--workers={cores + 1}"], capture_output=True, text=True, timeout=120,
                          env=os.environ.copy())
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"error: --workers={cores + 1}: this process has " in done.stderr and f"--workers {cores} or fewer" in \
        done.stderr and "model.ckpt" not in done.stderr


def ignores_sigint(pid: int) -> bool:
    """Whether a live process's SIGINT disposition is 'ignore' (read from /proc)."""
    ignored = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigIgn"))
    return bool(int(ignored.split()[1], 16) & 1 << (signal.SIGINT - 1))


def group_members(group: int) -> list[int]:
    """The live processes of a process group (read from /proc: stopped or zombie ones do not count)."""
    members = []
    for stat in os.listdir("/proc"):
        if stat.isdigit():
            try:
                fields = Path(f"/proc/{stat}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] not in "ZX":
                members.append(int(stat))
    return members


def listening_on(port: int) -> set[str]:
    """The local addresses a TCP port listens on (/proc/net/tcp, tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # LISTEN
                found.add(address)
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_listens_on_this_machine_only_and_a_signal_stops_all_its_processes(signum, tiny_cli_args):
    """By default the server binds 127.0.0.1 and says so; SIGTERM or SIGINT to the one process a user knows of (not
    its group) stops it and every worker it started within seconds, and the port is closed."""
    fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=1"])
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    from trunk.training.threads import usable_cores

    workers = min(2, usable_cores()[0])
    server = Server(ckpt, f"--workers={workers}")  # one per core
    try:
        assert f"http://127.0.0.1:{server.port}/predict (this machine only" in server.output()
        assert listening_on(server.port) == {"0100007F"}  # 127.0.0.1, no other interface
        assert len(group_members(server.process.pid)) >= 3  # the server, its HTTP and inference workers
        # a terminal's Ctrl+C reaches the group: only the server acts on it (a worker would print a traceback)
        spawned = [pid for pid in group_members(server.process.pid)
                   if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(spawned) == workers and all(ignores_sigint(pid) for pid in spawned)
        assert not ignores_sigint(server.process.pid)
        os.kill(server.process.pid, signum)
        deadline = time.monotonic() + 10
        while group_members(server.process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert group_members(server.process.pid) == [], server.output()[-2000:]
        assert server.process.wait(timeout=5) == 128 + signum and not listening_on(server.port)
    finally:
        server.stop()


def test_health_reports_a_worker_stuck_on_one_batch_and_recovers(tiny_cli_args):
    """A worker computing one batch for longer than --stuck-after: /health answers 503 meanwhile (LitServe's says
    200 once the workers started), and 200 again when it is done."""
    fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=1"])
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    with Server(ckpt, "--stuck-after=0.3", "--max-batch-size=1", "--batch-size=1") as server:
        with ThreadPoolExecutor(1) as pool:  # the most inputs a request may hold, one forward pass each: seconds
            slow = pool.submit(server.post, {"inputs": ["a long sentence " * 20] * 1024}, 600)
            deadline, seen = time.monotonic() + 600, set()
            while not slow.done() and time.monotonic() < deadline:
                try:
                    seen.add(server.get("/health")[0])
                except urllib.error.HTTPError as err:
                    seen.add(err.code)
                except OSError:  # a health check that itself timed out on a busy machine: ask again
                    pass
                time.sleep(0.1)
            assert slow.result()[0] == 200
        assert 503 in seen, seen
        assert server.get("/health") == (200, "ok") and "worker 0 has been busy on one batch for" in server.output()


def resident_mib(group: int) -> float:
    """The resident memory of a process group's live processes, in MiB."""
    total = 0
    for pid in group_members(group):
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text()
            total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return total / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_a_sustained_mix_of_good_malformed_and_oversized_requests(tiny_cli_args):
    """32 clients for 15 s, each sending good requests, malformed ones and ones over the limits: no 5xx, no process
    lost, /health still 200, and resident memory back within 10% of its level before the load."""
    import random

    fit = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=1"])
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    bodies = [
        json.dumps({"input": "the film was great"}).encode(),
        json.dumps({"inputs": [f"a {'long ' * i}plot" for i in range(16)]}).encode(),
        json.dumps({"input": "great " * 2000}).encode(),  # truncated
        b"{not json",
        json.dumps({"text": "a film"}).encode(),
        json.dumps({"inputs": []}).encode(),
        json.dumps({"inputs": ["a"] * 300}).encode(),  # over --max-inputs
        json.dumps({"input": "word " * 30_000}).encode(),  # over --max-chars
        json.dumps({"input": "x" * 600_000}).encode(),  # over --max-body-mb
        json.dumps({"input": 7}).encode(),
    ]
    with Server(ckpt, "--max-body-mb=0.5", "--max-inputs=256", "--max-chars=50000") as server:
        def load(seconds: float) -> list[int]:
            deadline = time.monotonic() + seconds

            def client(seed: int) -> list[int]:
                rng, statuses = random.Random(seed), []
                while time.monotonic() < deadline:
                    statuses.append(server.post(rng.choice(bodies))[0])
                return statuses

            with ThreadPoolExecutor(32) as pool:
                return [s for client_statuses in pool.map(client, range(32)) for s in client_statuses]

        load(10)  # warm: the allocators reach the level a loaded server keeps; the load below must add nothing to it
        time.sleep(2)
        before, processes = resident_mib(server.process.pid), len(group_members(server.process.pid))
        statuses = load(15)
        assert len(statuses) > 100 and max(statuses) < 500, sorted(set(statuses))
        assert {200, 413, 422} <= set(statuses)
        assert len(group_members(server.process.pid)) == processes and server.get("/health") == (200, "ok")
        time.sleep(2)
        after = resident_mib(server.process.pid)
        assert after <= 1.1 * before, (before, after)


def test_serve_options_are_read_per_task_and_a_malformed_one_is_named():
    from trunk.cli.serve import task_options

    assert task_options(["t.target_language=fra_Latn", "t.generation={beam_size: 1}", "u.val_beam_size=2"]) == {
        "t": {"target_language": "fra_Latn", "generation": {"beam_size": 1}}, "u": {"val_beam_size": 2}}
    for bad, why in (("target_language=fra_Latn", "write TASK.NAME=VALUE"), ("t.generation={beam", "not YAML")):
        with pytest.raises(ValueError, match=why):
            task_options([bad])
