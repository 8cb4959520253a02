"""``trunk serve CKPT_OR_DIR``: a trained model behind HTTP, on LitServe (``pip install 'trunk[serve]'``).

    trunk serve runs/sst2/lightning_logs/version_0/checkpoints/last.ckpt --port 8000
    curl -X POST localhost:8000/predict -d '{"input": "a gripping film"}'                    # its record
    curl -X POST localhost:8000/predict -d '{"inputs": ["a gripping film", "a dull plot"]}'  # a list of records
    curl -X POST localhost:8000/predict -d '{"input": "...", "task": ["sentiment", "ner"]}'  # {task: record}, one
    trunk pass
    curl localhost:8000/health     # 200 "ok" once every worker has loaded the model
    curl localhost:8000/info       # the tasks: kind, labels, what an input is

Records are those of ``trunk predict`` and ``trunk.tasks.load(...).predict`` (``Predictor``). Requests arriving
together are gathered into one batch (``--max-batch-size``, ``--batch-timeout``), ordered by length inside it, and
every task a request names reads one trunk pass. An input longer than the model's ``max_length`` is truncated and
its record says ``"truncated": true``. Requests for different tasks share trunk passes too. A bad request gets 422
with what is wrong (an unknown field, task or input type, an empty text, no input); one that waits longer than
``--timeout`` in the queue gets 504.
"""

import base64
import binascii
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import shlex
import signal
import sys
import time
from dataclasses import asdict, dataclass

import litserve as ls
from fastapi import HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from trunk.core.codec import cache_folder
from trunk.training.threads import threads_per_process, user_threads


@dataclass(frozen=True)
class Limits:
    """What one request may hold (``trunk serve --max-...``): a body of ``body_bytes`` (413 beyond), ``inputs``
    inputs (a bigger job is a file for ``trunk predict``), ``chars`` characters of text per input and ``pixels``
    decoded pixels per image (422 beyond, naming the limit)."""

    body_bytes: int = 8 * 2**20
    inputs: int = 1024
    chars: int = 100_000
    pixels: int = 4096 * 4096


class BodyLimit:
    """413 for a request body over ``max_bytes``, by its Content-Length before anything is read, else as it streams
    in (LitServe's ``MaxSizeMiddleware`` does the second only, and does not name the limit)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.message = f"the request body is over {max_bytes} bytes, this server's limit (trunk serve --max-body-mb)"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            drained, more = 0, True  # read and dropped (no memory kept), so the client, still sending, gets the 413
            while more and drained <= 64 * self.max_bytes:
                message = await receive()
                drained, more = drained + len(message.get("body", b"")), message.get("more_body", False)
            return await JSONResponse({"detail": self.message}, status_code=413)(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise HTTPException(413, self.message)
            return message

        await self.app(scope, counted, send)


class PredictRequest(BaseModel):
    """The body of ``POST /predict``, checked by FastAPI before it is queued (422 naming the field at fault)."""

    model_config = ConfigDict(extra="forbid")
    input: JsonValue = None
    inputs: list[JsonValue] | None = Field(default=None, min_length=1)
    task: str | list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _json_whatever_its_content_type(cls, body):
        """A body sent without ``Content-Type: application/json`` (``curl -d '{...}'`` says form data) arrives as its
        text: read it as the JSON it is."""
        if isinstance(body, (str, bytes)):
            try:
                return json.loads(body)
            except ValueError:
                raise ValueError("the body is not JSON: send {\"input\": ...} or {\"inputs\": [...]}") from None
        unknown = sorted(set(body) - set(cls.model_fields)) if isinstance(body, dict) else []
        if unknown:  # pydantic's own "Extra inputs are not permitted" does not say what to send
            raise ValueError(f"the body has the field{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}, "
                             "which /predict does not read: send {\"input\": ...} (one input) or {\"inputs\": [...]}, "
                             "with \"task\" to choose the task")
        return body

    @model_validator(mode="after")
    def _one_of_input_and_inputs(self):
        if (self.input is None) == (self.inputs is None):
            raise ValueError('send exactly one of "input" (one input) and "inputs" (a list of inputs)')
        return self


class Heartbeat:
    """When each inference worker began what it is computing (0: idle), in memory shared with the HTTP processes, so
    that ``/health`` answers 503 while a worker has been busy longer than ``stuck_after`` seconds (LitServe's says
    200 once the workers have started, whatever they do since)."""

    SLOTS = 256  # workers of a server, at most (beyond: not watched)

    def __init__(self, stuck_after: float) -> None:
        self.stuck_after = stuck_after
        spawn = multiprocessing.get_context("spawn")  # LitServe spawns its inference workers (and forks HTTP ones)
        self.started, self.claimed = spawn.Array("d", self.SLOTS, lock=False), spawn.Value("i", 0)

    def claim(self) -> int:
        """A slot of one's own, once per worker."""
        with self.claimed.get_lock():
            self.claimed.value += 1
            return self.claimed.value - 1

    @contextlib.contextmanager
    def busy(self, slot: int):
        if slot >= self.SLOTS:
            yield
            return
        self.started[slot] = time.time()
        try:
            yield
        finally:
            self.started[slot] = 0.0

    def stuck(self) -> list[tuple[int, float]]:
        """(worker, seconds busy) of each worker busy longer than ``stuck_after``."""
        now, started = time.time(), self.started[: self.claimed.value]
        return [(i, now - t) for i, t in enumerate(started) if t and now - t > self.stuck_after]


class Refused:
    """A request the worker refused: answered with 422 on its own, never failing the batch it came in."""

    def __init__(self, message: str) -> None:
        self.message = message


# No `from __future__ import annotations` here: LitServe hands decode_request's annotation to FastAPI as it is, and
# a string would not be resolved (the body would be read as a query parameter).
class TrunkAPI(ls.LitAPI):
    """One ``Predictor`` per worker. ``decode_request`` checks and tokenizes a request; ``predict`` answers the
    requests of a batch together, grouped by the tasks they name."""

    def __init__(
        self, paths: list[str], precision: str, runtime: str, batch_size: int, threads: int, merge: bool,
        limits: Limits = Limits(), stuck_after: float = 300.0, quantize: str | None = None,
        options: dict[str, dict] | None = None, **batching
    ) -> None:
        super().__init__(api_path="/predict", **batching)
        self.limits, self.heartbeat, self.slot = limits, Heartbeat(stuck_after), None
        self.paths, self.precision, self.runtime, self.batch_size, self.threads = (
            paths,
            precision,
            runtime,
            batch_size,
            threads,
        )
        self.merge, self.quantize, self.options = merge, quantize, options

    def setup(self, device: str) -> None:
        import torch

        from trunk.inference.predictor import load

        if device == "cpu":
            torch.set_num_threads(self.threads)  # the cores shared among the workers
        self.slot = self.heartbeat.claim()
        self.predictor = load(
            self.paths, map_location=device, precision=self.precision, runtime=self.runtime, merge=self.merge,
            quantize=self.quantize, options=self.options,
        )

    def health(self) -> bool:
        """False while a worker is stuck (busy longer than ``trunk serve --stuck-after``): ``/health`` answers 503."""
        stuck = self.heartbeat.stuck()
        for worker, seconds in stuck:
            print(f"trunk serve: worker {worker} has been busy on one batch for {seconds:.0f} s", flush=True)
        return not stuck

    def decode_request(self, request: PredictRequest):
        """The request's tasks and their encoded examples, or ``Refused`` with what is wrong."""
        with self.heartbeat.busy(self.slot):
            return self._decode(request)

    def _decode(self, request: PredictRequest):
        single = request.inputs is None
        inputs = [request.input] if single else request.inputs
        if len(inputs) > self.limits.inputs:
            return Refused(f"inputs: {len(inputs)} inputs, more than this server takes in one request "
                           f"({self.limits.inputs}, trunk serve --max-inputs); send them in several, or a file to "
                           "trunk predict")
        try:
            tasks = self.predictor.check_tasks(request.task)
        except ValueError as err:
            return Refused(str(err))
        text = any(self.predictor.preprocessors[name].stem != "image" for name in tasks)
        for i, x in enumerate(inputs):  # the JSON's shape, once for every task
            problem = _check_input(x) or (text and _too_long(x, self.limits.chars))
            if problem:
                takes = "; ".join(
                    f"task '{name}' takes {self.predictor.preprocessors[name].input_form}" for name in tasks
                )
                return Refused(f"{'input' if single else f'inputs[{i}]'}: {problem}; {takes}.")
        examples = {}
        for name in tasks:
            preprocessor = self.predictor.preprocessors[name]
            try:
                examples[name] = self.predictor.encode(
                    name, [_image(x, self.limits.pixels) for x in inputs] if preprocessor.stem == "image" else inputs
                )
            except (ValueError, TypeError, KeyError, OSError) as err:
                return Refused(
                    f"{'input' if single else 'inputs'} for task '{name}' ({preprocessor.input_form}) could not be "
                    f"read: {type(err).__name__}: {err}"
                )
        return {"tasks": tasks, "several": isinstance(request.task, list), "single": single, "examples": examples}

    def batch(self, requests: list) -> list:
        return requests

    def predict(self, requests):
        """Every request's records. The requests naming one task each are predicted together, whatever their tasks (one
        trunk pass per batch, each task's rows through its own head and delta); those naming several tasks are grouped
        by their tasks (each input read by all of them). (With ``max_batch_size=1`` LitServe passes one request, not a
        list.)"""
        if not isinstance(requests, list):
            return self.predict([requests])[0]
        with self.heartbeat.busy(self.slot):
            return self._predict(requests)

    def _predict(self, requests: list) -> list:
        answers: list = [r if isinstance(r, Refused) else None for r in requests]
        groups: dict[tuple | None, list[int]] = {}
        for i, r in enumerate(requests):
            if not isinstance(r, Refused):
                groups.setdefault(tuple(r["tasks"]) if r["several"] else None, []).append(i)
        for tasks, members in groups.items():
            names = tasks or list(dict.fromkeys(requests[i]["tasks"][0] for i in members))
            examples = {name: [e for i in members for e in requests[i]["examples"].get(name, [])] for name in names}
            records = self.predictor.predict_encoded(examples, self.batch_size, shared=tasks is not None)
            starts = dict.fromkeys(names, 0)
            for i in members:
                r = requests[i]
                n = len(next(iter(r["examples"].values())))
                own = [{name: records[name][starts[name] + k] for name in r["tasks"]} if r["several"] else
                       records[r["tasks"][0]][starts[r["tasks"][0]] + k] for k in range(n)]
                for name in r["tasks"]:
                    starts[name] += n
                answers[i] = own[0] if r["single"] else own
        return answers

    def unbatch(self, answers: list) -> list:
        return answers

    def encode_response(self, answer):
        if isinstance(answer, Refused):
            return JSONResponse({"detail": answer.message}, status_code=422)
        return answer


def _check_input(x) -> str | None:
    """What is wrong with an input's JSON shape, before the task reads it: a text that is empty, or a value that is
    no text (a number, a boolean, null)."""
    if isinstance(x, str):
        return "an empty text" if not x.strip() else None
    if isinstance(x, list):
        return "an empty list" if not x else next(filter(None, map(_check_input, x)), None)
    if isinstance(x, dict):
        return next(filter(None, map(_check_input, x.values())), None)
    return f"{type(x).__name__ if x is not None else 'null'} is not a text"


def _too_long(x, chars: int) -> str | None:
    """Whether an input's texts hold more than ``chars`` characters together, in words."""
    count = _characters(x)
    return (f"{count} characters of text, more than this server reads in one input ({chars}, trunk serve "
            "--max-chars)") if count > chars else None


def _characters(x) -> int:
    if isinstance(x, str):
        return len(x)
    values = x.values() if isinstance(x, dict) else x if isinstance(x, list) else ()
    return sum(map(_characters, values))


def _image(x: str, pixels: int):
    """A base64-encoded image file (PNG, JPEG, ...) as a PIL image, refused by its header when it would decode to
    more than ``pixels`` pixels (a small PNG can hold a huge blank image). Serving never reads paths from a request."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(base64.b64decode(x, validate=True)))
        width, height = image.size
        if width * height > pixels:
            raise ValueError(f"an image of {width}x{height} pixels, more than this server decodes ({pixels} pixels, "
                             "trunk serve --max-image-pixels); send it smaller")
        image.load()
    except (binascii.Error, TypeError, UnidentifiedImageError) as err:
        raise ValueError(f"not a base64-encoded image file ({err})") from None
    return image


def build_server(
    paths: str | list[str],
    precision: str = "auto",
    runtime: str = "torch",
    batch_size: int = 64,
    max_batch_size: int = 32,
    batch_timeout: float = 0.005,
    timeout: float = 30.0,
    workers: int = 1,
    accelerator: str = "auto",
    merge: bool = False,
    limits: Limits = Limits(),
    stuck_after: float = 300.0,
    quantize: str | None = None,
    options: dict[str, dict] | None = None,
) -> tuple[ls.LitServer, str]:
    """The ``LitServer`` of ``trunk serve`` and its threads in words: a model, or a trunk and task directories (one
    trunk in memory for all their tasks). The model is loaded once here, to fail early on a bad path and to describe
    its tasks (``/info``); each worker then loads its own."""
    from trunk.inference.predictor import load

    paths = [str(p) for p in paths] if isinstance(paths, (list, tuple)) else [str(paths)]
    predictor = load(paths, precision=precision, runtime=runtime, merge=merge, quantize=quantize, options=options)
    metadata = {
        "tasks": describe(predictor),
        "precision": predictor.precision,
        "runtime": runtime,
        "quantize": quantize,
        "limits": asdict(limits),
    }
    del predictor
    threads, why = threads_per_process(workers)  # a container's quota and the affinity, not the machine's cores
    if (chosen := user_threads()) is not None:  # the user's choice wins, as in training
        threads, why = chosen, f"{why} (OMP_NUM_THREADS={chosen} per worker)"
    metadata["threads"] = f"{threads} per worker, {workers} worker{'s' * (workers > 1)} on {why}"
    api = TrunkAPI(
        paths,
        precision,
        runtime,
        batch_size,
        threads,
        merge,
        limits,
        stuck_after,
        quantize,
        options,
        max_batch_size=max_batch_size,
        batch_timeout=batch_timeout,
    )
    server = ls.LitServer(
        api, accelerator=accelerator, workers_per_device=workers, timeout=timeout, model_metadata=metadata,
        middlewares=[(BodyLimit, {"max_bytes": limits.body_bytes})],
    )
    return server, metadata["threads"]


def stop_on_signals(grace: float = 3.0) -> None:
    """SIGTERM and SIGINT stop the server and every process it started within ``grace`` seconds: LitServe's own
    shutdown can wait on busy workers, and Python's default SIGTERM ends only this process, leaving the workers
    re-parented and answering."""

    def stop(signum, frame) -> None:
        children = multiprocessing.active_children()
        for child in children:
            child.terminate()
        deadline = time.monotonic() + grace
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                child.kill()
        os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    workers_ignore_ctrl_c()


def workers_ignore_ctrl_c() -> None:
    """The workers LitServe spawns from here on start with SIGINT ignored, through a launcher script: a Ctrl+C reaches
    the whole process group, and a worker still importing torch printed a KeyboardInterrupt traceback before this
    process stopped it. An ignored signal survives exec and Python leaves it ignored; the SIGTERM ``stop`` sends does
    not. (A signal mask would not do: the spawned interpreter starts with none.)"""
    folder = cache_folder("launchers")
    if folder is None:
        return
    script = ("#!/bin/sh\n# trunk serve's workers: a Ctrl+C is for the server, which stops them\n"
              f'trap "" INT\nexec {shlex.quote(sys.executable)} "$@"\n')
    launcher = folder / f"python-ignoring-ctrl-c-{hashlib.sha256(script.encode()).hexdigest()[:12]}"
    if not launcher.exists():
        partial = launcher.with_name(f"{launcher.name}.{os.getpid()}.partial")
        try:
            partial.write_text(script)
            partial.chmod(0o755)
            os.replace(partial, launcher)  # whole or not at all, whichever server writes it first
        except OSError:  # a full disk: workers start as before
            partial.unlink(missing_ok=True)
            return
    if os.access(launcher, os.X_OK):  # not where the cache is on a noexec mount: workers start as before
        multiprocessing.set_executable(str(launcher))


def describe(predictor) -> dict:
    """Each task's kind, labels and input form."""
    return {name: {"kind": predictor.model.objective(name).kind, "labels": predictor.model.objective(name).label_names,
                   "input": predictor.preprocessors[name].input_form} for name in predictor.tasks}
