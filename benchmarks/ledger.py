"""The finished runs of a benchmark, one JSON line each in ``<root>/results.jsonl``: a benchmark stopped midway (a
long CPU run, a session's end) goes on where it stopped, and a run is redone only when its line is deleted (or, in a
versioned ledger, when what Trunk computes has changed since: ``TRUNK_VERSION``)."""

from __future__ import annotations

import json
from pathlib import Path

from trunk.core.locks import hold_output

# What Trunk computes, as a versioned ledger stamps its records: raised when a change to Trunk alters what a run
# gives, so that a benchmark does not take a record of before for a run of now (a record without it is of version 1).
# 2: the pooled heads' dropout on the classifier's input only (trunk/models/heads.py).
TRUNK_VERSION = 2


class Ledger:
    """One benchmark process writes a ledger: a second one on the same ledger would run the same runs again and mix
    their lines, so it is refused at its first ``find`` or ``add``, naming the first (``trunk/core/locks.py``); reading
    the records (a summary) is free."""

    def __init__(self, root: str | Path, versioned: bool = False) -> None:
        """``root``: a benchmark's run folder (the ledger is its results.jsonl), or a ledger file of its own (.jsonl),
        such as one kept in the repository beside runs whose folders do not outlive the machine. ``versioned``: its
        records are stamped with ``TRUNK_VERSION`` and those of another version are not read (the benchmarks whose
        comparisons go on over many sessions: a mean of seeds run by two versions would compare neither)."""
        self.path = Path(root) if Path(root).suffix == ".jsonl" else Path(root) / "results.jsonl"
        self.held = False
        self.stamp = {"trunk_version": TRUNK_VERSION} if versioned else {}

    def hold(self) -> None:
        if not self.held:
            hold_output(self.path, "the ledger")
            self.held = True  # until the process ends

    def records(self) -> list[dict]:
        lines = self.path.read_text().splitlines() if self.path.is_file() else []
        return [r for r in map(json.loads, lines) if not self.stamp or r.get("trunk_version", 1) == TRUNK_VERSION]

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
        record = {**record, **self.stamp}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return record
