"""Recorded events: what happened, for reports, Gantt charts and invariant checks.

Each event is one entry of the Redis stream ``keys.events`` with a single field ``e``
holding a JSON object (see docs/metrics.md for the fields):
``{"ts": unix wall s, "kind": ..., "job": ..., "lease": ..., "phase": ..., "gpus": [...],
"host": ..., "endpoint": ..., "priority": ..., "planned_s": workload s, "actual_s": wall s,
"time_scale": wall s per workload s}``.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from makespan.redis_conn import store_error
from makespan.settings import EVENTS_WRITE_TRIM_FACTOR, events_max_len_from_env



UTC_SUFFIX = "_utc"
"""The suffix of a time's ISO-8601 UTC twin in status JSON: ``submitted_at`` (unix s, for
machines) beside ``submitted_at_utc`` (``"2026-12-05T23:52:03.123Z"``, for people)."""


def iso_utc(unix_s: float) -> str:
    """``unix_s`` (seconds since the epoch) as ISO-8601 UTC with milliseconds and a ``Z``
    suffix, e.g. ``"2026-12-05T23:52:03.123Z"``."""
    moment = _dt.datetime.fromtimestamp(unix_s, tz=_dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def add_utc_times(record: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """Add ``{field}_utc`` (:func:`iso_utc`, or None where the time is None) after each of
    ``fields`` that ``record`` holds; the unix-s fields stay as they are. Returns ``record``."""
    for field in fields:
        if field in record:
            value = record[field]
            record[field + UTC_SUFFIX] = None if value is None else iso_utc(float(value))
    return record


def append(target: Any, stream_key: str, body: dict[str, Any], max_len: int) -> None:
    """XADD ``body`` as compact JSON to ``stream_key`` on ``target`` (a client or a
    pipeline), trimmed only past about :data:`makespan.settings.EVENTS_WRITE_TRIM_FACTOR` ×
    ``max_len`` entries (the planner's retention sweep trims to its own cap:
    :func:`makespan.settings.events_max_len_from_env`). The one writer of the stream's entry
    format (:class:`makespan.store.EventLog` and :func:`record` call it).

    Raises:
        StoreError: Redis failed (on a client; a pipeline raises at ``execute()``)."""
    try:
        target.xadd(stream_key, {"e": json.dumps(body, separators=(",", ":"))},
                    maxlen=EVENTS_WRITE_TRIM_FACTOR * max_len, approximate=True)
    except redis.RedisError as e:
        raise store_error(e, f"append event to {stream_key}") from e


def record(r: redis.Redis, key: str, kind: str, pipe: Any = None, **fields: Any) -> None:
    """Append one event to the stream ``key`` (:func:`append`);
    with ``pipe`` the XADD joins that pipeline's transaction.

    Raises:
        StoreError: Redis failed (without ``pipe``)."""
    body = {"ts": time.time(), "kind": kind}
    body.update({k: v for k, v in fields.items() if v is not None})
    append(pipe if pipe is not None else r, key, body, events_max_len_from_env())


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
