"""A Ctrl+C that came before a command's own handler took over (training's, serving's).

Python turns SIGINT into a KeyboardInterrupt, which a library may swallow: torch's C extension imports numpy and
clears any error it raised, so a Ctrl+C while torch loads left `trunk serve` serving. The handler below also keeps a
flag, and each hand-over stops on it: a plain command once its module has loaded (``trunk.cli.run_command``),
serving's signal handler, training's ``FaultTolerance.setup``. Where Python cannot raise it (a callback run inside an
import, a finalizer), it would print it as an "Exception ignored" traceback: that one is dropped, the flag has it."""

from __future__ import annotations

import signal
import sys

EXIT_CODE = 128 + signal.SIGINT  # 130, as a shell reports a Ctrl+C

_received = False


def _on_interrupt(signum, frame) -> None:
    global _received
    _received = True
    raise KeyboardInterrupt


def _unraisable(hook):
    def drop_interrupts(unraisable) -> None:
        if not (_received and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            hook(unraisable)

    return drop_interrupts


def catch_interrupts() -> None:
    """From here on a Ctrl+C raises KeyboardInterrupt, as Python's own handler does, and is remembered."""
    signal.signal(signal.SIGINT, _on_interrupt)
    if sys.unraisablehook.__name__ != "drop_interrupts":
        sys.unraisablehook = _unraisable(sys.unraisablehook)


def interrupted() -> bool:
    """Whether a Ctrl+C reached this process through ``catch_interrupts``'s handler, caught or not."""
    return _received


def raise_if_interrupted() -> None:
    """At a hand-over: a Ctrl+C that came before, caught or swallowed, stops here (as KeyboardInterrupt)."""
    if _received:
        raise KeyboardInterrupt
