"""Which hosts have a live GPU worker: the dead-host gate (issue 18, must-contain 8).

A GPU worker announces, from the moment it consumes until it shuts down, that its host's
queue has a consumer: :class:`HostHeartbeat` sets ``P:host:live:{host}``
(:meth:`makespan.keys.Keys.host_live`, value: the worker's consumer id) with a TTL of
``worker_liveness_ttl_s`` on the Redis server's clock (``SET … PX``), renews it every
quarter of that, and records the host in ``P:hosts:seen``. On shutdown it deletes the key
if it still holds its own id, so a stopped worker is noticed at once; a SIGKILLed one
within the TTL.

The planner reads both in its tick's snapshot (:func:`queue_reads`, :func:`down_hosts`): a
host **seen** once whose live key is absent has lost its consumer, and its GPUs are
unavailable for new leases (jobs go to other hosts, or wait with reason ``host_down``)
until a worker announces itself again. A host never seen (no GPU worker has run there yet,
or a planner driven by hand in a test) is not gated at first: its jobs are leased and wait
in its queue for a worker that starts. When such a lease expires with no phase of it
claimed and no worker having announced the host, the planner records the host seen as ``unconsumed:`` (:func:`mark_unconsumed`),
and from then on it is down like any other (reason ``host_down``, a ``host_down`` incident)
until a worker announces itself there: before, its GPUs were leased again at every
expiry, each lease publishing one more Celery message to a queue nobody read (about
10 KB/s of Redis growth for 16 GPUs, found by a new-user check) while the jobs could have
run on live hosts.

Several workers of one host share the key: the last to renew names itself; a worker that
stops while another still runs may leave the host looking down for up to a quarter TTL
(until the other's next renewal).

**Cordoned hosts.** An operator takes a host out of service with ``makespan cordon HOST``
(:func:`cordon`; ``P:hosts:cordoned``, host -> reason, since, by), as ``kubectl cordon`` or
Slurm's ``State=DRAIN`` do: from then on no new lease (job, restore,
prewarm, preemption) takes its GPUs — the planner leaves them out of its plans from its
next snapshot, and the lease script itself refuses a lease on a cordoned host (a plan
read before the cordon cannot lease there after it) — and the leases it holds run to
their end; jobs that fit only there wait with reason ``host_cordoned``. Once ``makespan
hosts`` shows it drained (no lease left), its GPU worker can be stopped without a
``host_down`` incident (the observer skips cordoned hosts without leases). ``makespan
uncordon HOST`` (:func:`uncordon`) gives it back. The same snapshot read
(:func:`queue_reads`) carries both, and :func:`availability` turns it into the hosts no new
lease may take.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import redis

from makespan.errors import ValidationError
from makespan.keys import Keys
from makespan.models import FleetSpec

log = logging.getLogger("makespan.host_liveness")

RENEW_FRACTION = 0.25  # a worker renews its key every RENEW_FRACTION × TTL


def consumer_id() -> str:
    """A fresh id naming this worker process: ``{hostname}:{pid}:{random hex}``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def announce(r: redis.Redis, keys: Keys, host: str, consumer: str, ttl_s: float,
             fleet: FleetSpec | None = None) -> None:
    """Mark ``host`` as consumed by ``consumer`` for ``ttl_s`` seconds (server clock), and
    with ``fleet`` (the worker's fleet file) the fleet it runs for as long
    (:mod:`makespan.workers.worker_fleets`).

    Raises:
        redis.RedisError: Redis did not take the write."""
    p = r.pipeline(transaction=True)
    p.set(keys.host_live(host), consumer, px=max(1, int(ttl_s * 1000)))
    p.hset(keys.hosts_seen, host, consumer)
    if fleet is not None:
        from makespan.workers.worker_fleets import queue_publish

        queue_publish(p, keys, host, fleet, ttl_s)
    p.execute()


STOPPED = "stopped:"  # P:hosts:seen value prefix: the host's last worker stopped cleanly (withdraw)
UNCONSUMED = "unconsumed:"  # P:hosts:seen value prefix: no worker ever announced it; a lease there expired


def mark_unconsumed(r: redis.Redis, keys: Keys, hosts: Iterable[str], why: str) -> list[str]:
    """Record each of ``hosts`` that no GPU worker ever announced (absent from
    ``P:hosts:seen``) as seen, ``unconsumed:{why}``: a lease on it expired with nobody
    consuming its queue, so the gate treats it as down from now on (module doc). A host
    already seen is left as it is (``HSETNX``). Returns the hosts newly recorded, sorted.

    Raises:
        redis.RedisError: Redis did not answer."""
    asked = sorted(set(hosts))
    if not asked:
        return []
    pipe = r.pipeline(transaction=False)
    for host in asked:
        pipe.hsetnx(keys.hosts_seen, host, UNCONSUMED + why)
    return [host for host, added in zip(asked, pipe.execute()) if added]


def withdraw(r: redis.Redis, keys: Keys, host: str, consumer: str) -> bool:
    """Delete ``host``'s live key if ``consumer`` still holds it (WATCH/MULTI, no script),
    and mark the host in ``P:hosts:seen`` as stopped on purpose (``stopped:{consumer}``: a
    crash leaves the consumer id; the observer tells the two apart for a cordoned host).
    Returns True if it was deleted.

    Raises:
        redis.RedisError: Redis did not answer."""
    key = keys.host_live(host)
    deleted = False

    def _cad(pipe) -> None:
        nonlocal deleted
        holder = pipe.get(key)
        pipe.multi()
        if holder == consumer:
            pipe.delete(key)
            pipe.hset(keys.hosts_seen, host, STOPPED + consumer)
            deleted = True

    r.transaction(_cad, key)
    return deleted


def queue_reads(pipe, keys: Keys, hosts: Iterable[str]) -> int:
    """Queue on ``pipe`` the reads :func:`down_hosts` and :func:`availability` need
    (``P:hosts:seen``, the live key of each host in ``hosts`` order, ``P:hosts:cordoned``);
    returns how many results they add (3)."""
    pipe.hgetall(keys.hosts_seen)
    pipe.mget([keys.host_live(h) for h in hosts])
    pipe.hgetall(keys.hosts_cordoned)
    return 3


@dataclass(frozen=True)
class Cordon:
    """One host's cordon (``P:hosts:cordoned``): why, since when (unix s, the Redis server's
    clock) and who (``user@machine`` of the ``makespan cordon`` call)."""

    reason: str
    since_s: float
    by: str = ""

    @classmethod
    def parse(cls, raw: str) -> Cordon:
        """From its stored JSON (a value that does not parse: a cordon with that text as reason)."""
        try:
            value = json.loads(raw)
            return cls(str(value.get("reason") or ""), float(value.get("since") or 0.0), str(value.get("by") or ""))
        except (ValueError, TypeError, AttributeError):
            return cls(str(raw), 0.0)


@dataclass(frozen=True)
class Availability:
    """Which hosts no new lease may take (:func:`availability`)."""

    down: frozenset[str] = frozenset()  # seen once, no live GPU worker now
    cordoned: Mapping[str, Cordon] = field(default_factory=lambda: MappingProxyType({}))  # host -> its cordon

    @property
    def unavailable(self) -> frozenset[str]:
        """Down or cordoned."""
        return self.down | frozenset(self.cordoned)


def availability(hosts: list[str], seen: dict[str, str], live: list[str | None],
                 cordoned: dict[str, str]) -> Availability:
    """The down and the cordoned hosts of ``hosts``, from the three results of
    :func:`queue_reads` (``cordoned``: the raw hash; hosts outside ``hosts`` are left out)."""
    asked = set(hosts)
    return Availability(frozenset(down_hosts(hosts, seen, live)),
                        MappingProxyType({host: Cordon.parse(raw) for host, raw in cordoned.items() if host in asked}))


def down_hosts(hosts: list[str], seen: dict[str, str], live: list[str | None]) -> set[str]:
    """The hosts of ``hosts`` seen once (``seen``: ``P:hosts:seen``) whose live key is
    absent now (``live``: the MGET of :func:`queue_reads`, ``hosts`` order)."""
    return {h for h, v in zip(hosts, live) if v is None and h in seen}


def read_availability(r: redis.Redis, keys: Keys, hosts: list[str]) -> Availability:
    """:func:`availability` read now (one round trip).

    Raises:
        redis.RedisError: Redis did not answer."""
    p = r.pipeline(transaction=False)
    queue_reads(p, keys, hosts)
    seen, live, cordoned = p.execute()
    return availability(hosts, seen, live, cordoned)


CORDON_REASON_MAX_CHARS = 500  # a cordon's reason, shown by `makespan hosts` and in waiting jobs' `why`


def cordon(r: redis.Redis, keys: Keys, host: str, reason: str, by: str = "") -> tuple[Cordon, Cordon | None]:
    """Cordon ``host``: no new lease on its GPUs from now on (module doc).
    A host already cordoned keeps its ``since`` and gets the new reason (an empty ``reason``
    keeps the one it had, and who gave it, as ``kubectl cordon`` of a cordoned node does). Returns (the cordon
    now, the one it replaced or None). The caller checks that ``host`` is in the fleet.

    Raises:
        ValidationError: ``reason`` is longer than :data:`CORDON_REASON_MAX_CHARS` (it is shown
            in every waiting job's ``why``).
        redis.RedisError: Redis did not take the write."""
    if len(reason) > CORDON_REASON_MAX_CHARS:
        raise ValidationError("reason", f"{reason[:40]}…", f"is {len(reason)} characters: at most "
                                                          f"{CORDON_REASON_MAX_CHARS} (a ticket link, a few words)")
    key = keys.hosts_cordoned
    result: list[Cordon | None] = []

    def _write(pipe) -> None:
        raw = pipe.hget(key, host)
        seconds, micros = pipe.time()
        before = Cordon.parse(raw) if raw else None
        if before is not None and not reason:  # a repeated cordon without a reason changes nothing
            now = before
        else:
            now = Cordon(reason, before.since_s if before else seconds + micros / 1e6, by)
        pipe.multi()
        pipe.hset(key, host, json.dumps({"reason": now.reason, "since": now.since_s, "by": now.by}))
        result[:] = [now, before]

    r.transaction(_write, key)
    now, before = result
    assert now is not None
    return now, before


def uncordon(r: redis.Redis, keys: Keys, host: str) -> Cordon | None:
    """Give ``host`` back to the planner; returns the cordon removed (None: it had none).

    Raises:
        redis.RedisError: Redis did not answer."""
    p = r.pipeline(transaction=True)
    p.hget(keys.hosts_cordoned, host)
    p.hdel(keys.hosts_cordoned, host)
    raw, _ = p.execute()
    return Cordon.parse(raw) if raw else None


def gpus_of(fleet: FleetSpec, hosts: set[str]) -> set[str]:
    """GPU uuids of ``hosts``."""
    return {g.uuid for h in fleet.hosts if h.name in hosts for g in h.gpus}


def hosts_that_fit(fleet: FleetSpec, hosts: set[str], tensor_parallel: int, memory_mib: int) -> list[str]:
    """The hosts of ``hosts`` (fleet order) with at least ``tensor_parallel`` GPUs of at
    least ``memory_mib`` MiB each: where a job of that shape could run if they were up."""
    return [h.name for h in fleet.hosts if h.name in hosts
            and sum(1 for g in h.gpus if g.memory_mib >= memory_mib) >= tensor_parallel]


class HostHeartbeat:
    """A GPU worker's announcement of its host (module doc), from a daemon thread.

    ``start()`` announces at once (a Redis that does not answer is logged; the thread
    retries every renewal) and renews every ``ttl_s × RENEW_FRACTION``; ``stop()`` ends
    the thread and withdraws the key (best effort)."""

    def __init__(self, r: redis.Redis, keys: Keys, host: str, ttl_s: float, consumer: str | None = None,
                 fleet: FleetSpec | None = None) -> None:
        self.r, self.keys, self.host, self.ttl_s, self.fleet = r, keys, host, ttl_s, fleet
        self.consumer = consumer or consumer_id()
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="makespan-host-liveness", daemon=True)

    def start(self) -> None:
        self._announce()
        self._thread.start()

    def _announce(self) -> None:
        try:
            announce(self.r, self.keys, self.host, self.consumer, self.ttl_s, self.fleet)
        except redis.RedisError as e:  # the key expires: the planner stops leasing here until we are back
            if not self._failing:  # once per outage, not every renewal
                log.warning("announcing host %s as consumed failed (retrying every %.1f s): %s", self.host,
                            self.ttl_s * RENEW_FRACTION, e)
            self._failing = True
            return
        if self._failing:
            log.warning("host %s announced as consumed again", self.host)
        self._failing = False

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s * RENEW_FRACTION):
            self._announce()

    def stop(self) -> None:
        """Stop renewing and delete the key if it is still ours (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            withdraw(self.r, self.keys, self.host, self.consumer)
        except redis.RedisError as e:
            log.warning("withdrawing host %s failed (its key expires within %s s): %s", self.host, self.ttl_s, e)
