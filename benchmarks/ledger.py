"""The finished runs of a benchmark, one JSON line each in ``<root>/results.jsonl``: a benchmark stopped midway (a
long CPU run, a session's end) goes on where it stopped, and a run is redone only when its line is deleted."""

from __future__ import annotations

import json
from pathlib import Path

from trunk.core.locks import hold_output


class Ledger:
    """One benchmark process writes a ledger: a second one on the same ledger would run the same runs again and mix
    their lines, so it is refused at its first ``find`` or ``add``, naming the first (``trunk/core/locks.py``); reading
    the records (a summary) is free."""

    def __init__(self, root: str | Path) -> None:
        """``root``: a benchmark's run folder (the ledger is its results.jsonl), or a ledger file of its own (.jsonl),
        such as one kept in the repository beside runs whose folders do not outlive the machine."""
        self.path = Path(root) if Path(root).suffix == ".jsonl" else Path(root) / "results.jsonl"
        self.held = False

    def hold(self) -> None:
        if not self.held:
            hold_output(self.path, "the ledger")
            self.held = True  # until the process ends

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines()] if self.path.is_file() else []

    def find(self, key: dict) -> dict | None:
        """The recorded run whose fields include ``key``'s, if any (asked to decide whether to run it: held first)."""
        self.hold()
        return self.peek(key)

    def peek(self, key: dict) -> dict | None:
        """The same, to read only (a summary while the benchmark runs): not held."""
        return next((r for r in self.records() if all(r.get(k) == v for k, v in key.items())), None)

    def add(self, record: dict) -> dict:
        self.hold()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return record
