"""Recorded events: what happened, for reports, Gantt charts and invariant checks.

Each event is one entry of the Redis stream ``keys.events`` with a single field ``e``
holding a JSON object (see docs/metrics.md for the fields):
``{"ts": unix wall s, "kind": ..., "job": ..., "lease": ..., "phase": ..., "gpus": [...],
"host": ..., "endpoint": ..., "priority": ..., "planned_s": workload s, "actual_s": wall s,
"time_scale": wall s per workload s}``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from makespan.store import events as _store_events

MAX_EVENTS = _store_events.DEFAULT_EVENTS_MAX_LEN  # approximate cap of the stream (Settings.events_max_len's default)


def record(r: redis.Redis, key: str, kind: str, pipe: Any = None, **fields: Any) -> None:
    """Append one event to the stream ``key`` (the store's :func:`makespan.store.events.append`);
    with ``pipe`` the XADD joins that pipeline's transaction.

    Raises:
        StoreError: Redis failed (without ``pipe``)."""
    body = {"ts": time.time(), "kind": kind}
    body.update({k: v for k, v in fields.items() if v is not None})
    _store_events.append(pipe if pipe is not None else r, key, body, MAX_EVENTS)


def read_all(r: redis.Redis, key: str, batch: int = 10_000) -> Iterator[dict[str, Any]]:
    """Every event of the stream, oldest first."""
    last = "-"
    while True:
        rows = r.xrange(key, min=last, count=batch)
        if last != "-" and rows and rows[0][0] == last:
            rows = rows[1:]
        if not rows:
            return
        for _id, fields in rows:
            yield json.loads(fields["e"])
        last = rows[-1][0]
        if len(rows) < batch - 1:
            return


def dump_jsonl(events: list[dict[str, Any]], path: str | Path) -> None:
    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
