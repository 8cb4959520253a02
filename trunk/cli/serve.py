"""``trunk serve CKPT_OR_DIR [TASK_DIR ...]``: the model behind HTTP (trunk.inference.serve, on LitServe)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

from trunk.core.interrupts import raise_if_interrupted
from trunk.inference.runtimes import RUNTIMES
from trunk.training.threads import usable_cores

HOSTS = ["127.0.0.1", "0.0.0.0", "::"]  # what LitServe binds


def serve_main(args: list[str]) -> None:
    """``trunk serve CKPT_OR_DIR``: the model behind HTTP (trunk.inference.serve, on LitServe)."""
    parser = argparse.ArgumentParser(
        prog="trunk serve",
        description="Serve a trained model over HTTP: POST /predict with "
        '{"input": ...} or {"inputs": [...]} and an optional "task" (a name or a list of names); '
        "GET /health, GET /info. Needs pip install 'trunk[serve]'.",
    )
    parser.add_argument(
        "model",
        nargs="+",
        help="a .ckpt written by `trunk fit`, a trunk directory with heads, or hf://ORG/NAME; "
        "and any task directories (`trunk export CKPT DIR --task NAME`) to serve on it",
    )
    parser.add_argument(
        "--merge", action="store_true", help="write a one-task model's LoRA into the trunk's weights (faster)"
    )
    parser.add_argument("--host", default="127.0.0.1", choices=HOSTS,
                        help="127.0.0.1: this machine only (the default); 0.0.0.0 or '::': every interface (IPv4, "
                             "IPv6), so other machines can reach it")
    parser.add_argument("--port", type=ranged(int, 1024, 65535), default=8000, help="1024 to 65535")
    parser.add_argument(
        "--workers", type=ranged(int, 1), default=1, help="model copies per device, each with its share of the CPU's "
                                                           "cores"
    )
    parser.add_argument("--accelerator", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    parser.add_argument("--precision", default="auto", choices=["auto", "32-true", "bf16-mixed"],
                        help="auto: bf16 where the device computes it natively, else fp32")
    parser.add_argument("--runtime", default="torch", choices=list(RUNTIMES),
                        help="onnx: the graphs of `trunk export CKPT DIR --onnx` in ONNX Runtime (pass DIR)")
    parser.add_argument("--quantize", choices=["int8"],
                        help="int8: the trunk's linear layers in int8 (CPU; with --runtime onnx, the int8 graphs of "
                             "`trunk export CKPT DIR --onnx --quantize int8`)")
    parser.add_argument("--option", action="append", default=[], metavar="TASK.NAME=VALUE",
                        help="an option that changes a task's predictions, not its weights (a translation's "
                             "t.target_language=fra_Latn, t.generation={beam_size: 1}); repeatable")
    parser.add_argument("--max-batch-size", type=ranged(int, 1), default=32, help="requests gathered into one batch")
    parser.add_argument("--batch-timeout", type=ranged(float, 0), default=0.005,
                        help="seconds a batch waits for more requests")
    parser.add_argument(
        "--batch-size", type=ranged(int, 1), default=64, help="inputs per forward pass (a gathered batch is cut into "
                                                               "these)"
    )
    parser.add_argument(
        "--timeout", type=ranged(float, 0.001), default=30.0,
        help="seconds a request may wait in the queue before a 504",
    )
    parser.add_argument("--stuck-after", type=ranged(float, 0.001), default=300.0,
                        help="seconds a worker may compute one batch before /health answers 503")
    limits = parser.add_argument_group("what one request may hold (beyond: 413 for the body, else 422, naming it)")
    limits.add_argument("--max-body-mb", type=ranged(float, 0.001), default=8.0, help="request body, in MiB")
    limits.add_argument("--max-inputs", type=ranged(int, 1), default=1024, help="inputs in one request")
    limits.add_argument("--max-chars", type=ranged(int, 1), default=100_000, help="characters of text in one input")
    limits.add_argument("--max-image-pixels", type=ranged(int, 1), default=4096 * 4096,
                        help="decoded pixels of one image (a small PNG can hold a huge blank image)")
    options = parser.parse_args(args)
    try:
        from trunk.inference.serve import Limits, build_server, stop_on_signals
    except ImportError as err:
        sys.exit(f"error: trunk serve needs LitServe ({err.name} is missing): pip install 'trunk[serve]'.")
    if not 0 <= options.batch_timeout < options.timeout:
        sys.exit(
            f"error: --batch-timeout={options.batch_timeout} must be at least 0 and below --timeout={options.timeout}."
        )
    cores, why = usable_cores()
    if options.workers > cores:  # each worker computes on its own core: more only queue, and start-up never ends
        sys.exit(f"error: --workers={options.workers}: this process has {why}, and each worker needs a core of its "
                 f"own. Use --workers {cores} or fewer.")
    stop_on_signals()  # from here on: a Ctrl+C or SIGTERM while the model loads stops at once, with no traceback
    raise_if_interrupted()  # one before, which a library swallowed as it loaded (main() says so in one line)
    try:
        server, threads = build_server(
            options.model,
            options.precision,
            options.runtime,
            options.batch_size,
            options.max_batch_size,
            options.batch_timeout,
            options.timeout,
            options.workers,
            options.accelerator,
            options.merge,
            Limits(int(options.max_body_mb * 2**20), options.max_inputs, options.max_chars, options.max_image_pixels),
            options.stuck_after,
            options.quantize,
            task_options(options.option),
        )
    except (FileNotFoundError, ValueError, ImportError) as err:
        sys.exit(f"error: {err}")
    reach = ("this machine only; --host 0.0.0.0 lets other machines in" if options.host == "127.0.0.1"
             else "every interface: other machines can reach it")
    print(f"trunk serve: http://{options.host}:{options.port}/predict ({reach}); threads: {threads}", flush=True)
    server.run(host=options.host, port=options.port, generate_client_file=False)


def task_options(given: list[str]) -> dict[str, dict]:
    """``--option TASK.NAME=VALUE`` (VALUE read as YAML) as {task: {name: value}}."""
    import yaml

    out: dict[str, dict] = {}
    for item in given:
        key, equals, value = item.partition("=")
        task, dot, name = key.partition(".")
        if not (equals and dot and task and name):
            raise ValueError(f"--option {item!r}: write TASK.NAME=VALUE, as t.target_language=fra_Latn.")
        try:
            out.setdefault(task, {})[name] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise ValueError(f"--option {item!r}: its value is not YAML ({str(err).splitlines()[0]}).") from None
    return out


def ranged(kind: type, low: float, high: float | None = None) -> Callable[[str], float]:
    """An argparse type: a ``kind`` from ``low`` to ``high``, else argparse's one-line usage error naming the range."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not math.isfinite(value):  # nan passes every comparison, inf every lower bound
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: {f'{low} to {high}' if high is not None else f'at least {low}'}")
        return value

    return parse
