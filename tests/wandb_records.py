"""Read the records of an offline W&B run (its ``run-*.wandb`` file), for tests: what `wandb sync` would upload.

The file is a 7-byte header (``:W&B``, magic, version) followed by LevelDB's log format: 32 KiB
blocks of chunks, each with a 4-byte checksum, a 2-byte length and a 1-byte type (1 full,
2 first, 3 middle, 4 last); a record is one protobuf ``wandb.proto.wandb_internal_pb2.Record``.
"""

import json
import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7


def records(run_dir: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    files = list(Path(run_dir).glob("run-*.wandb"))
    if not files:  # not written yet
        return
    data = files[0].read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    position, pending = HEADER, b""
    while position + 7 <= len(data):
        room = BLOCK - position % BLOCK
        if room < 7:  # the block's tail is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            position += room
            continue
        if position + 7 + length > len(data):  # W&B's process is still writing this chunk: the rest comes later
            return
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def history(run_dir: Path) -> list[dict]:
    """Every logged step: key -> value (JSON-decoded)."""
    rows = []
    for record in records(run_dir):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def settled(read, run_dir: Path, ready, timeout: float = 60.0):
    """``read(run_dir)`` once ``ready(result)``: W&B's own process writes the file, and may still be
    writing when ``wandb.finish()`` returns."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        result = read(run_dir)
        if ready(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.5)
