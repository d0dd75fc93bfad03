"""Lease heartbeats of the GPU worker's phases (:mod:`makespan.workers.phases`).

A phase renews its lease as it starts, then a :class:`LeaseHeartbeat` renews it every
``heartbeat_s`` while the phase runs; one shared starter thread starts a heartbeat's own
thread only when its first renewal is due (a short phase never starts one). Losing the
lease (a stale fencing token) sets the heartbeat's ``lost`` event (:class:`LeaseLost`):
the phase stops. ``lost`` also reads as set once the lease's local deadline has passed —
the last renewal that succeeded, timed on this host's clock (:func:`lease_clock`) before it was sent,
plus the TTL (never later than the lease's expiry on the Redis server's clock, which
counts from when the renewal arrived) — with no renewal answered since: a worker paused past its
TTL (SIGSTOP, a VM stall) or cut off from Redis knows its lease may be someone else's
by now without asking Redis, so a resumed function stops before its side effect
instead of racing the heartbeat's next round trip (breaker check).
:class:`DeferredWaits` gathers modelled transition waits that run as one (the longest).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from makespan.workers.leases import Lease, LeaseStore
from makespan.workers.tick.clock import lease_clock  # lease deadlines' clock (CLOCK_BOOTTIME)

log = logging.getLogger("makespan.phases")

RENEW_RETRY_S = 0.5  # a renewal that failed is tried again this soon (at most interval_s)


class DeferredWaits:
    """Notes the modelled waits of transitions that run as one (an evict of several
    instances: the planner prices it as its longest), to be spent once, as the longest."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self.longest_by_key: dict[str, float] = {}  # each key's own longest wait (:meth:`adder`)

    def add(self, wall_s: float) -> None:
        """Note a modelled wait of ``wall_s`` wall seconds (the driver's ``wait``)."""
        self.longest_s = max(self.longest_s, wall_s)

    def adder(self, key: str) -> Callable[[float], None]:
        """An :meth:`add` that also keeps ``key``'s own longest wait in ``longest_by_key``
        (an evict of several endpoints: each one's duration sample is its own wait)."""
        def add(wall_s: float) -> None:
            self.longest_by_key[key] = max(self.longest_by_key.get(key, 0.0), wall_s)
            self.add(wall_s)
        return add


class LeaseLost(threading.Event):
    """The heartbeat's ``lost``: set when a renewal found the lease gone; :meth:`is_set`
    (and so :meth:`wait`'s answer) is also true once the :func:`lease_clock` deadline given to
    :meth:`extend` has passed (module doc). ``math.inf``: no deadline."""

    def __init__(self, deadline_s: float = math.inf):
        super().__init__()
        self._deadline_s = deadline_s

    def extend(self, deadline_s: float) -> None:
        """A renewal succeeded: the lease holds locally until ``deadline_s`` (:func:`lease_clock`)."""
        self._deadline_s = max(self._deadline_s, deadline_s)

    def past_deadline(self) -> bool:
        """Whether the local deadline (:func:`lease_clock`) has passed (the lease may have expired on Redis)."""
        return lease_clock() >= self._deadline_s

    def is_set(self) -> bool:
        if super().is_set():
            return True
        if self.past_deadline():
            self.set()
            return True
        return False

    def wait(self, timeout: float | None = None) -> bool:
        """As :meth:`threading.Event.wait`, also returning when the deadline passes (early,
        answering False, when a renewal moved it meanwhile: callers wait in a loop)."""
        left = self._deadline_s - lease_clock()
        limit = left if timeout is None else min(timeout, left)
        super().wait(None if limit == math.inf else max(0.0, limit))
        return self.is_set()


class LeaseHeartbeat:
    """Renews a lease every ``interval_s`` from a daemon thread until stopped: each renewal
    is sent ``interval_s`` after the previous one was *sent* (a slow answer does not push
    the next one later). ``lost`` is set as soon as a renewal finds the lease no longer
    ours; a Redis error is transient (logged once per run of failures; tried again after
    :data:`RENEW_RETRY_S`), but no renewal answered for the TTL since the last answered one
    was sent makes ``lost`` read as set, and the heartbeat stops (the slack
    :func:`makespan.settings.lease_renewal_warning` sizes is kept: one blocked renewal, then
    the next, still land before it, however slow the one before them was).
    ``renewed_at_s``: when the caller's own renewal (as the phase started) was sent, on
    :func:`lease_clock` (None: now).

    The thread is started when the first renewal is due, ``interval_s`` after
    :meth:`__enter__` (by this process's :class:`_HeartbeatStarter`): most jobs end
    before that and never start one."""

    def __init__(self, store: LeaseStore, lease: Lease, ttl_s: float, interval_s: float,
                 renewed_at_s: float | None = None):
        self.store, self.lease, self.ttl_s, self.interval_s = store, lease, ttl_s, interval_s
        renewed = lease_clock() if renewed_at_s is None else renewed_at_s
        self.lost = LeaseLost(renewed + ttl_s)
        self._stop = threading.Event()
        self._t: threading.Thread | None = None  # started by _STARTER when the first renewal is due

    def _start(self) -> None:
        self._t = threading.Thread(target=self._run, name=f"heartbeat-{self.lease.lease_id}", daemon=True)
        self._t.start()

    def _run(self) -> None:
        # started by the starter when the first renewal is due: renew at once, then every interval_s
        failing = False
        while True:
            sent = lease_clock()
            try:
                if not self.store.renew(self.lease, self.ttl_s):
                    self.lost.set()
                    return
                self.lost.extend(sent + self.ttl_s)
                failing = False
                wait_s = self.interval_s - (lease_clock() - sent)  # interval_s after this send, not its answer
            except redis.RedisError as e:  # transient: the TTL gives us slack (then lost's deadline passes)
                if not failing:
                    log.warning("lease %s heartbeat failed: %s; trying again every %.1f s", self.lease.lease_id, e,
                                min(self.interval_s, RENEW_RETRY_S))
                failing = True
                wait_s = min(self.interval_s, RENEW_RETRY_S)
            if self.lost.is_set():  # past the local deadline: the lease may be another's by now; the phase stops
                return
            if self._stop.wait(max(0.0, wait_s)):
                return

    def __enter__(self) -> LeaseHeartbeat:
        _STARTER.add(self, time.monotonic() + self.interval_s)
        return self

    def __exit__(self, *exc: Any) -> None:
        if _STARTER.discard(self):
            return  # no renewal was due yet: no thread was started
        self._stop.set()
        if self._t is not None and self._t.ident is not None:
            self._t.join(timeout=2)


class _HeartbeatStarter:
    """Starts each running :class:`LeaseHeartbeat`'s thread when its first renewal is due,
    from one daemon thread per process that does no Redis I/O itself (a blocked renewal
    holds up only its own lease's thread, as before)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[LeaseHeartbeat, float] = {}  # waiting heartbeats -> first renewal due, monotonic s
        self._thread: threading.Thread | None = None
        # when the starter's thread wakes by itself (monotonic s; inf: it waits for a notify)
        self._wake_at_s = math.inf

    def add(self, hb: LeaseHeartbeat, due_s: float) -> None:
        """Start ``hb``'s thread at monotonic ``due_s`` unless :meth:`discard` comes first."""
        with self._cond:
            self._due[hb] = due_s
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="heartbeat-starter", daemon=True)
                self._thread.start()
            elif due_s < self._wake_at_s:
                # wake it only when it would sleep past this due time (not once per job: a job
                # that ended before its renewal left the thread asleep until that earlier time)
                self._cond.notify()

    def discard(self, hb: LeaseHeartbeat) -> bool:
        """Forget ``hb``; True when its thread was not started (else it runs: stop and join it)."""
        with self._cond:
            return self._due.pop(hb, None) is not None

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for hb in [hb for hb, due_s in self._due.items() if due_s <= now]:
                    del self._due[hb]
                    try:
                        hb._start()  # under the lock: discard() then knows it started
                    except RuntimeError as e:  # no thread to be had: this lease goes unrenewed
                        log.error("lease %s: heartbeat thread not started: %s", hb.lease.lease_id, e)
                earliest = min(self._due.values(), default=None)
                self._wake_at_s = math.inf if earliest is None else earliest
                self._cond.wait(None if earliest is None else max(earliest - now, 0.0))

    def reset(self) -> None:
        """A forked child's fresh state (no thread of the parent runs there)."""
        self._cond = threading.Condition()
        self._due = {}
        self._thread = None
        self._wake_at_s = math.inf


_STARTER = _HeartbeatStarter()
os.register_at_fork(after_in_child=_STARTER.reset)
