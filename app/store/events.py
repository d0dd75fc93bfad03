"""The events stream (``P:events``): append, trimmed to the setting's cap, and read.

Each event is one stream entry with a single field ``e`` holding a JSON object (see
docs/metrics.md). Lua scripts append through ``lib.lua``'s ``append_event`` with the same
cap; Python code through :class:`EventLog` (which writes with :func:`makespan.events.append`).
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

import redis

from makespan.events import append  # re-exported: the stream's entry format has one writer
from makespan.keys import Keys
from makespan.settings import events_max_len_from_env
from makespan.store.scripts import store_error


class EventLog:
    """The events stream of one Redis and key prefix.

    Args:
        r: a client with ``decode_responses=True``.
        keys: the deployment's key builder.
        events_max_len: the cap (Settings.events_max_len; None: its default).
    """

    def __init__(self, r: redis.Redis, keys: Keys, events_max_len: int | None = None):
        self.r, self.keys = r, keys
        self.max_len = events_max_len_from_env() if events_max_len is None else events_max_len

    def record(self, kind: str, pipe: Any = None, **fields: Any) -> None:
        """Append one event ``{"ts": now (unix s), "kind": kind, **fields}`` (None fields
        left out); with ``pipe`` the XADD joins that pipeline.

        Raises:
            StoreError: Redis failed."""
        body: dict[str, Any] = {"ts": time.time(), "kind": kind}
        body.update({k: v for k, v in fields.items() if v is not None})
        append(pipe if pipe is not None else self.r, self.keys.events, body, self.max_len)

    def read(self, count: int = 10_000, after_id: str = "-") -> list[tuple[str, dict[str, Any]]]:
        """Up to ``count`` events from ``after_id`` on (inclusive; "-": the oldest), as
        ``(stream id, event)`` pairs.

        Raises:
            StoreError: Redis failed."""
        try:
            rows = cast("list[tuple[str, dict[str, str]]]", self.r.xrange(self.keys.events, min=after_id, count=count))
        except redis.RedisError as e:
            raise store_error(e, "read events") from e
        return [(str(entry_id), json.loads(fields["e"])) for entry_id, fields in rows]

    def length(self) -> int:
        """Entries in the stream.

        Raises:
            StoreError: Redis failed."""
        try:
            return int(self.r.xlen(self.keys.events))
        except redis.RedisError as e:
            raise store_error(e, "events length") from e
