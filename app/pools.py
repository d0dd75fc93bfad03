"""Pools: what a pool's planner offers, and the producer's routing of a job to a pool.

A fleet file may split its hosts into pools (``[[pools]]``, :class:`makespan.models.PoolSpec`);
each pool has its own leader-locked planner (``makespan planner --pool NAME``) with its own
queues, lock and fencing token (:meth:`makespan.keys.Keys.for_pool`), on the same Redis and
Celery. A job is routed once, when it is submitted, by its endpoint:

* served by one pool: that pool;
* served by several: the pool that can start it first, by the rule of :func:`choose_pool`,
  from each pool's offer (:class:`PoolOffer`, written by its leading planner every tick under
  ``P:pool:{name}:offer`` with a TTL of ``Settings.pool_offer_ttl_s``) and the jobs queued in
  each pool now (read at submit).

The job record keeps its pool (field ``pool``); retries, reclaims and preemptions put it back
in that pool's queue (``lib.lua`` ``requeue_job``). A queued job whose pool cannot plan it
(its planner is down, the fleet file moved its endpoint or dropped its pool) is moved later
by a leading planner (:mod:`makespan.workers.pool_rehome`). A fleet without pools has one
implicit pool and nothing here is used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import redis

from makespan.errors import StoreError
from makespan.keys import Keys
from makespan.models import FleetSpec, Priority


@dataclass(frozen=True)
class PoolOffer:
    """One pool's state as its leading planner last saw it.

    Attributes:
        pool: the pool's name.
        gpus: GPUs in the pool.
        free: host -> CUDA indices of its GPUs that no lease holds and whose host is up.
        warm: endpoint -> instances resident on GPUs no lease holds (they start a job with no
            cold start).
        at_s: when it was written, unix s (the planner's clock).
    """

    pool: str
    gpus: int
    free: dict[str, list[int]] = field(default_factory=dict)
    warm: dict[str, int] = field(default_factory=dict)
    at_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps({"pool": self.pool, "gpus": self.gpus, "free": self.free, "warm": self.warm,
                           "at_s": self.at_s}, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> PoolOffer:
        doc = json.loads(raw)
        return cls(str(doc["pool"]), int(doc["gpus"]), {str(h): [int(i) for i in v] for h, v in doc["free"].items()},
                   {str(e): int(n) for e, n in doc["warm"].items()}, float(doc.get("at_s", 0.0)))

    def free_gangs(self, fleet: FleetSpec, endpoint: str) -> int:
        """How many gangs of ``endpoint`` (``tensor_parallel`` GPUs with its memory, on one
        host) the free GPUs hold now."""
        spec = fleet.endpoints[endpoint]
        memory = {h.name: {g.index: g.memory_mib for g in h.gpus} for h in fleet.hosts}
        gangs = 0
        for host, indices in self.free.items():
            fitting = sum(1 for i in indices if memory.get(host, {}).get(i, 0) >= spec.memory_mib_per_gpu)
            gangs += fitting // spec.tensor_parallel
        return gangs


def offer_from_snapshot(pool: str, fleet: FleetSpec, holders: tuple[str | None, ...],
                        residents: tuple[str | None, ...], gated_gpus: frozenset[str], at_s: float) -> PoolOffer:
    """The offer of a pool whose planner runs ``fleet`` (the pool's own hosts), from one
    tick's snapshot: GPU holders and residents in fleet order (``P:gpu:*``, ``P:resident:*``
    values; a resident is ``endpoint@uuid,uuid``) and the GPUs of hosts that are down."""
    order = [(h.name, g.index, g.uuid) for h in fleet.hosts for g in h.gpus]
    held = {uuid for (_h, _i, uuid), holder in zip(order, holders) if holder} | set(gated_gpus)
    free: dict[str, list[int]] = {}
    for host, index, uuid in order:
        if uuid not in held:
            free.setdefault(host, []).append(index)
    warm: dict[str, int] = {}
    seen: set[str] = set()
    for resident in residents:
        if not resident or resident in seen:
            continue
        seen.add(resident)  # one instance is resident on each of its GPUs
        endpoint, _, gpus = resident.partition("@")
        if gpus and not any(gpu in held for gpu in gpus.split(",")):
            warm[endpoint] = warm.get(endpoint, 0) + 1
    return PoolOffer(pool, len(order), free, warm, at_s)


def publish_offer(r: redis.Redis, keys: Keys, offer: PoolOffer, ttl_s: float) -> None:
    """Write ``offer`` under ``keys.pool_offer`` (the pool's scoped keys) for ``ttl_s``.

    Raises:
        redis.RedisError: Redis failed."""
    r.set(keys.pool_offer, offer.to_json(), px=max(1, int(ttl_s * 1000)))


@dataclass(frozen=True)
class PoolChoice:
    """One candidate pool as the routing rule sees it.

    Attributes:
        pool: the pool's name.
        gpus: GPUs in the pool (from the fleet file).
        offer: the pool's live offer, or None (no planner leads it, or its offer expired).
        ahead: jobs queued in the pool now at the job's priority or above.
        queued: jobs queued in the pool now, every level.
    """

    pool: str
    gpus: int
    offer: PoolOffer | None
    ahead: int
    queued: int


def choose_pool(fleet: FleetSpec, endpoint: str, choices: list[PoolChoice]) -> str:
    """The pool that can start a job of ``endpoint`` first (``choices`` in file order, non-empty).

    The rule, in order:

    1. Only pools with a live offer count, unless none has one (then all do).
    2. A pool *can start it now* when the gangs of the endpoint its free GPUs hold are more
       than the jobs queued there at the job's level or above (an idle warm instance is on
       free GPUs, so it is one of those gangs). Among those: one with an idle warm instance
       first (no cold start), then the most such room left (free gangs - ahead), then file
       order.
    3. Otherwise the least loaded: (queued jobs + GPUs held) ÷ GPUs, lowest first (GPUs held
       are the pool's GPUs minus its free ones; 0 without an offer), then file order.
    """
    live = [choice for choice in choices if choice.offer is not None]
    candidates = live or choices
    now: list[tuple[int, int, int, str]] = []
    for order, choice in enumerate(candidates):
        if choice.offer is None:
            continue
        warm = choice.offer.warm.get(endpoint, 0)
        room = choice.offer.free_gangs(fleet, endpoint) - choice.ahead  # warm instances are on free GPUs: counted
        if room > 0:
            now.append((0 if warm else 1, -room, order, choice.pool))
    if now:
        return min(now)[3]

    def load(choice: PoolChoice) -> float:
        held = choice.gpus - sum(len(v) for v in choice.offer.free.values()) if choice.offer else 0
        return (choice.queued + held) / max(1, choice.gpus)

    return min(enumerate(candidates), key=lambda pair: (load(pair[1]), pair[0]))[1].pool


def published_pools(r: redis.Redis, keys: Keys) -> list[str | None]:
    """The pools of the fleet the planners published (``P:fleet``), file order; ``[None]``
    (the implicit pool) when it declares none or none is published.

    Raises:
        redis.RedisError: Redis failed."""
    raw = r.get(keys.fleet)
    try:
        names = [str(pool["name"]) for pool in json.loads(raw).get("pools", [])] if raw else []
    except (ValueError, TypeError, KeyError, AttributeError):
        names = []
    return list(names) or [None]


def route(r: redis.Redis, keys: Keys, fleet: FleetSpec, endpoint: str, priority: Priority,
          among: list[str] | None = None) -> str | None:
    """The pool a new job of ``endpoint`` at ``priority`` goes to (None: the fleet has no
    pools). One pool serves it: no Redis read. Several: one round trip (their offers and
    queue lengths) and :func:`choose_pool`. ``among``: only those of the pools serving it
    (a planner moving a job out of its own pool, :mod:`makespan.workers.pool_rehome`).

    Raises:
        StoreError: Redis failed."""
    if not fleet.pools:
        return None
    serving = [pool for pool in fleet.pools_serving(endpoint) if among is None or pool in among]
    if len(serving) == 1:
        return serving[0]
    pipe = r.pipeline(transaction=False)
    for pool in serving:
        scoped = keys.for_pool(pool)
        pipe.get(scoped.pool_offer)
        for level in Priority:
            pipe.zcard(scoped.queue(level))
    try:
        got = pipe.execute()
    except redis.RedisError as e:
        raise StoreError(f"routing a job of {endpoint!r} among pools {serving}: {e}") from e
    width = 1 + len(Priority)
    gpus = {pool.name: sum(len(h.gpus) for h in fleet.hosts if h.name in pool.hosts) for pool in fleet.pools}
    choices = []
    for index, pool in enumerate(serving):
        raw, *depths = got[index * width:(index + 1) * width]
        offer = PoolOffer.from_json(raw) if raw else None
        ahead = sum(int(n) for level, n in zip(Priority, depths) if level <= priority)
        choices.append(PoolChoice(pool, gpus[pool], offer, ahead, sum(int(n) for n in depths)))
    return choose_pool(fleet, endpoint, choices)
