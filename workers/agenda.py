"""Agenda tracker: planned transitions held under Redis locks.

An *agenda entry* records a transition that is happening on purpose (design notes,
"agenda entry"): an operation id, a mode, the endpoints and GPUs it touches, its
planned start and expected end (unix seconds on the Redis server's clock, read with
``TIME`` in the script that writes the entry, as leases are: a holder whose clock is
skewed writes the same entry as one whose clock is right). The health observer reads the agenda
to tell a planned eviction (mode ``POSITIVE``: no incident) from a failure.

Keys (see :mod:`makespan.keys`):

* ``P:agenda:{op_id}`` (hash): ``op_id, mode, endpoints (JSON list), gpus (JSON list),
  planned_start, expected_end, lock_ttl_s, holder`` (the holder's lock token).
* ``P:agenda:index`` (zset): open op ids, score = expected end (unix s).
* ``P:agenda:{op_id}:lock`` (string): a redis-py :class:`redis.lock.Lock`
  (``thread_local=False``) owned by the holder and extended by its heartbeat thread.

Ownership rules (the fencing argument): the hash stores the token of the lock that
wrote it. :meth:`AgendaTracker.complete` deletes an entry in one Lua script only if
the hash's holder is the caller *and* the lock is the caller's or has expired with
nobody taking over, so a holder that lost its lock never deletes a newer holder's
entry. :meth:`AgendaTracker.reap` deletes entries whose lock is gone (dead holders).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import LockError

from makespan.errors import LeaseError, StoreError, ValidationError
from makespan.keys import Keys
from makespan.store.scripts import script

log = logging.getLogger(__name__)

MODES = ("POSITIVE", "FAILURE", "RESTART_RECOVERY")

def server_now_s(r: redis.Redis) -> float:
    """The Redis server's clock in unix seconds (one ``TIME``).

    Raises:
        StoreError: Redis failed."""
    try:
        sec, usec = r.time()
    except redis.RedisError as e:
        raise StoreError(f"Redis TIME: {e}") from e
    return int(sec) + int(usec) / 1_000_000


@dataclass
class AgendaEntry:
    """One open agenda entry held by this process; a context manager whose exit
    calls :meth:`AgendaTracker.complete`.

    Attributes:
        op_id, mode, endpoints, gpus: as registered.
        planned_start / expected_end: unix seconds on the Redis server's clock.
        lost: set (from the heartbeat thread) once this holder no longer owns the lock.
        completed: True once :meth:`AgendaTracker.complete` removed the entry.
    """

    op_id: str
    mode: str
    endpoints: list[str]
    gpus: list[str]
    planned_start: float
    expected_end: float
    lock_ttl_s: float
    lock: Any
    tracker: AgendaTracker
    lost: bool = False
    completed: bool = False
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def token(self) -> str:
        tok = self.lock.local.token
        return tok.decode() if isinstance(tok, bytes) else str(tok)

    def check(self) -> None:
        """Raise :class:`LeaseError` if this holder lost its lock (stop acting)."""
        if self.lost or not self.tracker.owns(self):
            self.lost = True
            raise LeaseError(f"agenda entry {self.op_id!r}: lock lost; this holder must stop acting")

    def extend(self) -> bool:
        """Extend the lock to a full TTL from now; False (and ``lost``) if not owned."""
        try:
            self.lock.extend(self.lock_ttl_s, replace_ttl=True)
            return True
        except LockError:
            self.lost = True
            return False
        except redis.RedisError as e:  # transient: keep trying until the TTL runs out
            log.warning("agenda %s: heartbeat failed: %s", self.op_id, e)
            return True

    def __enter__(self) -> AgendaEntry:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.tracker.complete(self)


class AgendaTracker:
    """Register, complete and query agenda entries in Redis.

    Args:
        r: a client with ``decode_responses=True``.
        keys: the deployment's key builder.
    """

    def __init__(self, r: redis.Redis, keys: Keys):
        self.r = r
        self.keys = keys
        self._publish = script(r, "agenda_publish")
        self._complete = script(r, "agenda_complete")
        self._reap = script(r, "agenda_reap")

    def lock_key(self, op_id: str) -> str:
        return self.keys.agenda_lock(op_id)

    # -- holder side -------------------------------------------------------------
    def register(self, op_id: str, mode: str, endpoints: list[str], gpus: list[str],
                 expected_duration_s: float, lock_ttl_s: float = 10.0,
                 heartbeat: bool = True) -> AgendaEntry:
        """Open an entry and take its lock.

        Args:
            expected_duration_s: planned length; ``planned_start`` is the Redis server's
                clock when the entry is written and ``expected_end = planned_start +
                expected_duration_s`` (this process's clock is not used: skew between
                hosts changes nothing).
            lock_ttl_s: lock expiry; the heartbeat extends it every ``lock_ttl_s / 3`` s.
            heartbeat: start the heartbeat thread (False: the caller extends, or not).

        Raises:
            ValidationError: unknown mode, empty op id, non-positive durations.
            LeaseError: another live holder owns ``op_id``'s lock.
            StoreError: Redis failed.
        """
        if mode not in MODES:
            raise ValidationError("agenda.mode", mode, f"must be one of {', '.join(MODES)}")
        if not op_id:
            raise ValidationError("agenda.op_id", op_id, "must be non-empty")
        if not expected_duration_s >= 0:
            raise ValidationError("agenda.expected_duration_s", expected_duration_s, "must be >= 0")
        if not lock_ttl_s > 0:
            raise ValidationError("agenda.lock_ttl_s", lock_ttl_s, "must be > 0")
        lock = self.r.lock(self.lock_key(op_id), timeout=lock_ttl_s, thread_local=False)
        try:
            if not lock.acquire(blocking=False):
                raise LeaseError(f"agenda entry {op_id!r} is held by another live holder")
            entry = AgendaEntry(op_id, mode, list(endpoints), list(gpus), 0.0, 0.0, lock_ttl_s, lock, self)
            fields = {"op_id": op_id, "mode": mode, "endpoints": json.dumps(entry.endpoints),
                      "gpus": json.dumps(entry.gpus), "lock_ttl_s": repr(lock_ttl_s), "holder": entry.token}
            out = self._publish(keys=[self.keys.agenda(op_id), self.keys.agenda_index, self.lock_key(op_id)],
                                args=[op_id, entry.token, json.dumps(fields), repr(float(expected_duration_s))])
        except redis.RedisError as e:
            raise StoreError(f"agenda register {op_id!r}: {e}") from e
        if not out:
            raise LeaseError(f"agenda entry {op_id!r}: lock expired before the entry was written")
        entry.planned_start = float(out[1])
        entry.expected_end = entry.planned_start + expected_duration_s
        if heartbeat:
            entry._thread = threading.Thread(target=self._beat, args=(entry,), daemon=True,
                                             name=f"agenda-heartbeat-{op_id}")
            entry._thread.start()
        return entry

    def _beat(self, entry: AgendaEntry) -> None:
        interval_s = max(entry.lock_ttl_s / 3.0, 0.01)
        while not entry._stop.wait(interval_s):
            if not entry.extend():
                log.warning("agenda %s: lock lost; holder stops acting", entry.op_id)
                return

    def server_now_s(self) -> float:
        """The Redis server's clock (``TIME``), unix seconds: the clock agenda entries
        are written and compared on.

        Raises:
            StoreError: Redis failed."""
        return server_now_s(self.r)

    def owns(self, entry: AgendaEntry) -> bool:
        """True if ``entry``'s holder still owns its lock (one GET)."""
        try:
            return self.r.get(self.lock_key(entry.op_id)) == entry.token
        except redis.RedisError as e:
            raise StoreError(f"agenda owns {entry.op_id!r}: {e}") from e

    def complete(self, entry: AgendaEntry) -> bool:
        """Close ``entry``: stop its heartbeat and delete it atomically, only if this holder
        still owns it (see module doc). Returns True if deleted; False (and sets
        ``entry.lost``) if a newer holder owns it, whose entry is left untouched.
        Idempotent."""
        entry._stop.set()
        if entry._thread is not None and entry._thread is not threading.current_thread():
            entry._thread.join(timeout=5)
        if entry.completed:
            return True
        try:
            done = self._complete(keys=[self.keys.agenda(entry.op_id), self.keys.agenda_index,
                                        self.lock_key(entry.op_id)], args=[entry.op_id, entry.token])
        except redis.RedisError as e:
            raise StoreError(f"agenda complete {entry.op_id!r}: {e}") from e
        if done:
            entry.completed = True
            return True
        entry.lost = True
        log.warning("agenda %s: not deleted; another holder owns it", entry.op_id)
        return False

    # -- readers -------------------------------------------------------------------
    def open_entries(self) -> list[dict]:
        """Every open entry as a dict (``endpoints``/``gpus`` lists, times as floats,
        ``lock_alive`` bool), ordered by expected end."""
        try:
            ids = self.r.zrange(self.keys.agenda_index, 0, -1)
            if not ids:
                return []
            pipe = self.r.pipeline(transaction=False)
            for op in ids:
                pipe.hgetall(self.keys.agenda(op))
                pipe.exists(self.lock_key(op))
            res = pipe.execute()
        except redis.RedisError as e:
            raise StoreError(f"agenda read: {e}") from e
        out = []
        for i in range(0, len(res), 2):
            h, alive = res[i], res[i + 1]
            if not h:
                continue
            out.append({**h, "endpoints": json.loads(h.get("endpoints", "[]")),
                        "gpus": json.loads(h.get("gpus", "[]")),
                        "planned_start": float(h.get("planned_start", 0)),
                        "expected_end": float(h.get("expected_end", 0)),
                        "lock_ttl_s": float(h.get("lock_ttl_s", 0)), "lock_alive": bool(alive)})
        return out

    def covering(self, endpoint: str, gpus: list[str] | None = None,
                 modes: tuple[str, ...] = MODES) -> list[dict]:
        """Open entries of ``modes`` that name ``endpoint`` (and, if ``gpus`` is given,
        share at least one GPU with it, or name no GPUs)."""
        out = []
        for e in self.open_entries():
            if e["mode"] not in modes or endpoint not in e["endpoints"]:
                continue
            if gpus and e["gpus"] and not set(gpus) & set(e["gpus"]):
                continue
            out.append(e)
        return out

    def is_endpoint_in_scheduled_transition(self, endpoint: str, gpus: list[str] | None = None) -> bool:
        """True if an open ``POSITIVE`` entry covers ``endpoint`` (on ``gpus`` if given)."""
        return bool(self.covering(endpoint, gpus, ("POSITIVE",)))

    def count(self) -> int:
        """Open entries (the drain check's ``agenda_entries``)."""
        try:
            return int(self.r.zcard(self.keys.agenda_index))
        except redis.RedisError as e:
            raise StoreError(f"agenda count: {e}") from e

    def reap(self) -> int:
        """Delete entries whose lock expired (dead holders); returns how many. An overrun
        incident raised for one is marked reaped (the observer closes it as such)."""
        n = 0
        try:
            for op in self.r.zrange(self.keys.agenda_index, 0, -1):
                n += int(self._reap(keys=[self.keys.agenda(op), self.keys.agenda_index, self.lock_key(op),
                                          self.keys.incidents_overruns], args=[op]))
        except redis.RedisError as e:
            raise StoreError(f"agenda reap: {e}") from e
        return n
