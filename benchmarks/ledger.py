"""The finished runs of a benchmark, one JSON line each in ``<root>/results.jsonl``: a benchmark stopped midway (a
long CPU run, a session's end) goes on where it stopped, and a run is redone only when its line is deleted (or, in a
ledger of one Trunk version, when what Trunk computes has changed since: ``TRUNK_VERSION``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trunk.core.locks import hold_output

# What Trunk computes, as a ledger of one version stamps its records: raised when a change to Trunk alters what a run
# gives, so that a benchmark does not take a record of before for a run of now (a record without it is of version 1).
# 2: the pooled heads' dropout on the classifier's input only (trunk/models/heads.py).
TRUNK_VERSION = 2


class Ledger:
    """One benchmark process writes a ledger: a second one on the same ledger would run the same runs again and mix
    their lines, so it is refused at its first ``find`` or ``add``, naming the first (``trunk/core/locks.py``); reading
    the records (a summary) is free."""

    def __init__(self, root: str | Path, version: int | None = None) -> None:
        """``root``: a benchmark's run folder (the ledger is its results.jsonl), or a ledger file of its own (.jsonl),
        such as one kept in the repository beside runs whose folders do not outlive the machine. ``version``: the
        records are of that version of Trunk (``TRUNK_VERSION``: stamped on each record written; those of another
        version are not read, so a mean over seeds never mixes two); None: records of any version, none stamped."""
        self.path = Path(root) if Path(root).suffix == ".jsonl" else Path(root) / "results.jsonl"
        self.held = False
        self.version = version

    def hold(self) -> None:
        if not self.held:
            hold_output(self.path, "the ledger")
            self.held = True  # until the process ends

    def records(self, any_version: bool = False) -> list[dict]:
        """The records of the ledger's version (``any_version``: every record, as for a result Trunk does not
        compute: transformers' side of a comparison)."""
        lines = self.path.read_text().splitlines() if self.path.is_file() else []
        every = self.version is None or any_version
        return [r for r in map(json.loads, lines) if every or r.get("trunk_version", 1) == self.version]

    def find(self, key: dict, any_version: bool = False) -> dict | None:
        """The recorded run whose fields include ``key``'s, if any (asked to decide whether to run it: held first)."""
        self.hold()
        return self.peek(key, any_version)

    def peek(self, key: dict, any_version: bool = False) -> dict | None:
        """The same, to read only (a summary while the benchmark runs): not held."""
        return next((r for r in self.records(any_version) if all(r.get(k) == v for k, v in key.items())), None)

    def add(self, record: dict) -> dict:
        self.hold()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {**record, **({} if self.version is None else {"trunk_version": self.version})}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return record


def way_name(run: dict) -> str:
    """A record's way as tables and figures name it: with its recipe where it is not its group's (distill.py's
    students of another trunk, by that trunk's recipe) and its epochs where they are not its recipe's."""
    return (run["way"] + (f", {Path(run['recipe']).stem}" if run.get("recipe") else "")
            + (f", {run['epochs']} epoch{'s' * (run['epochs'] > 1)}" if run.get("epochs") else ""))


def precision_of(run: dict) -> str:
    """The precision a record trained in: runs are compared only with runs of their own (a CPU with bf16 units trains
    the same recipe in bf16, and the scores differ). Version-2 lines written before the field was recorded trained in
    fp32, the AVX2 machine's ``auto``."""
    return run.get("precision") or "32-true"


def add_version_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trunk-version", type=int, default=TRUNK_VERSION,
                        help=f"the version of Trunk whose records the ledger is read for (default: this one's, "
                             f"{TRUNK_VERSION}); an older one with --summary only, to print the tables it recorded")


def checked_version(parser: argparse.ArgumentParser, version: int, summary: bool) -> int:
    """``--trunk-version``, refused where it would run anything (not a ``summary``): this code computes its own."""
    if version != TRUNK_VERSION and not summary:
        parser.error(f"--trunk-version {version}: this code computes version {TRUNK_VERSION}; the records of another "
                     "are printed (--summary), not added to")
    return version
