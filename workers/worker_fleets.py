"""Which fleet file each host's live GPU worker runs: jobs are not leased where it cannot run them.

A rolling change of the fleet file (a new endpoint, an endpoint removed, another
``tensor_parallel``) restarts the planner and the GPU workers one by one, and for a while
they run different files. A GPU worker checks each lease against its own file
(:meth:`makespan.workers.phases.PhaseRunner.fleet_problem`) and fails a job its file cannot
run ("start the planner and the GPU workers with the same fleet file"): before, every job of
a new endpoint submitted between the planner's restart and the workers' failed there, and
the planner could preempt running work for it.

Each GPU worker therefore publishes, with its host's liveness mark
(:class:`makespan.workers.host_liveness.HostHeartbeat`, same PX TTL, renewed with it), the
``fleet_version`` of its file (``P:host:fleet:{host}``) and, once per version, that file's
endpoints with their tensor-parallel sizes (``P:fleet:endpoints:{version}``) and every
host's GPU UUIDs (``P:fleet:gpus:{version}``), both kept a week after the last renewal.
The planner reads the versions of its hosts once per batch scan (:func:`read_worker_fleets`:
one MGET, plus two GETs per version other than its own, cached for the process: the content
of a version never changes) and plans a job only on hosts whose live worker runs its
endpoint, its helpers and the tensor-parallel size the planner's fleet gives them, and
whose file has every GPU the planner's gives that host (a GPU swap: a worker whose file
lacks a GPU fails every job leased on it; the same GPUs in another order, or more, are
fine; :meth:`WorkerFleets.hosts_lacking`). A job no host's worker
can run waits, queued and unplanned, with reason ``host_fleet_differs`` until one restarts
with the planner's file; the critical lane skips such hosts as the tick does, and a set-point
restore or a prewarm is not leased there (:func:`makespan.workers.drain.start_restore`). A host
without a published version (its worker is down, or predates this mark) is not
constrained: the host gate (``host_down``) covers a down one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from makespan.keys import Keys
from makespan.models import FleetSpec, fleet_version

ENDPOINTS_KEPT_S = 7 * 24 * 3600  # P:fleet:endpoints:{version} outlives its last renewal by this
_ENDPOINTS_CACHE: dict[str, Any] = {}  # a version's endpoints key -> its endpoints
_GPUS_CACHE: dict[str, Any] = {}  # a version's GPUs key -> host -> its GPU UUIDs
_CACHE_MAX = 64  # versions kept in the cache (a rolling change brings one or two)


def endpoints_of(fleet: FleetSpec) -> dict[str, int]:
    """``fleet``'s endpoints -> their tensor-parallel sizes (what a lease of each must hold)."""
    return {name: spec.tensor_parallel for name, spec in fleet.endpoints.items()}


def gpus_of(fleet: FleetSpec) -> dict[str, list[str]]:
    """``fleet``'s hosts -> their GPU UUIDs, in the file's order."""
    return {host.name: [gpu.uuid for gpu in host.gpus] for host in fleet.hosts}


def queue_publish(pipe, keys: Keys, host: str, fleet: FleetSpec, ttl_s: float) -> None:
    """Queue on ``pipe`` this GPU worker's fleet marks for ``host`` (module doc): its
    version for ``ttl_s`` s (the liveness TTL, Redis server clock) and its endpoints."""
    version = fleet_version(fleet)
    pipe.set(keys.host_fleet(host), version, px=max(1, int(ttl_s * 1000)))
    pipe.set(keys.fleet_endpoints(version), json.dumps(endpoints_of(fleet), sort_keys=True), ex=ENDPOINTS_KEPT_S)
    pipe.set(keys.fleet_gpus(version), json.dumps(gpus_of(fleet), sort_keys=True), ex=ENDPOINTS_KEPT_S)


@dataclass(frozen=True)
class WorkerFleets:
    """The fleets the live GPU workers of a planner's hosts run, where they differ from the
    planner's own: host -> its worker's endpoints (name -> tensor-parallel size) and
    version. Hosts whose worker runs the planner's file, or published none, are absent.
    ``other_gpus``: those of them whose worker's file lacks a GPU the planner's gives the
    host (or lacks the host): no job is leased there."""

    differing: Mapping[str, dict[str, int]] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    other_gpus: frozenset[str] = frozenset()

    def hosts_lacking(self, fleet: FleetSpec, endpoint: str, helpers: Iterable[str] = ()) -> tuple[str, ...]:
        """The hosts (sorted) whose live GPU worker's fleet file cannot run a job of
        ``endpoint`` (with helper endpoints ``helpers``) as the planner's ``fleet`` plans it:
        one of them is missing there, or has another tensor-parallel size, or the file gives
        the host other GPUs (``other_gpus``)."""
        if not self.differing:
            return ()
        wanted = {name: fleet.endpoints[name].tensor_parallel for name in (endpoint, *helpers)
                  if name in fleet.endpoints}
        return tuple(sorted(host for host, theirs in self.differing.items()
                            if host in self.other_gpus or any(theirs.get(name) != size for name, size in wanted.items())))

    def detail(self, hosts: Iterable[str], fleet: FleetSpec | None = None, names: Iterable[str] = ()) -> str:
        """``host (fleet version V), ...`` for a wait reason's detail line (``; other GPUs``
        where the worker's file gives the host other GPUs); with the planner's ``fleet`` and
        endpoint ``names``, also what that file lacks of them (``; no 'talk'``, ``; 'talk'
        at tensor_parallel 2, not 1``)."""
        wanted = {name: fleet.endpoints[name].tensor_parallel for name in names
                  if fleet is not None and name in fleet.endpoints}
        parts = []
        for host in hosts:
            notes = [f"fleet version {self.versions.get(host, '?')}"]
            theirs = self.differing.get(host, {})
            for name, size in wanted.items():
                if name not in theirs:
                    notes.append(f"no {name!r}")
                elif theirs[name] != size:
                    notes.append(f"{name!r} at tensor_parallel {theirs[name]}, not {size}")
            if host in self.other_gpus:
                notes.append("other GPUs for it")
            parts.append(f"{host} ({'; '.join(notes)})")
        return ", ".join(parts)


def read_worker_fleets(r: redis.Redis, keys: Keys, fleet: FleetSpec, own_fleet: FleetSpec | None = None) -> WorkerFleets:
    """The :class:`WorkerFleets` of ``fleet``'s hosts now: one MGET of their versions, and a
    GET of each version other than the planner's not read before by this process.
    ``own_fleet``: the planner's whole fleet file when ``fleet`` is its pool's part (the
    workers run the whole file); ``fleet`` itself by default.

    Raises:
        redis.RedisError: Redis failed."""
    hosts = [host.name for host in fleet.hosts]
    return worker_fleets(r, keys, hosts, r.mget([keys.host_fleet(h) for h in hosts]), own_fleet or fleet)


def queue_versions(pipe, keys: Keys, hosts: list[str]) -> None:
    """Queue on ``pipe`` the MGET of ``hosts``' worker fleet versions (:func:`worker_fleets`
    reads its result)."""
    pipe.mget([keys.host_fleet(h) for h in hosts])


def worker_fleets(r: redis.Redis, keys: Keys, hosts: list[str], versions: list[str | None],
                  own_fleet: FleetSpec) -> WorkerFleets:
    """The :class:`WorkerFleets` of ``hosts`` from their published versions (``versions``,
    ``hosts`` order, as :func:`queue_versions` read them), against the planner's
    ``own_fleet`` (a GET per version not read before by this process).

    Raises:
        redis.RedisError: Redis failed."""
    own = own_version(own_fleet)
    differ = {host: version for host, version in zip(hosts, versions) if version and version != own}
    differing: dict[str, dict[str, int]] = {}
    other_gpus: set[str] = set()
    planned_gpus = {host.name: [gpu.uuid for gpu in host.gpus] for host in own_fleet.hosts} if differ else {}
    for host, version in differ.items():
        endpoints = _endpoints(r, keys, version)
        if endpoints is not None:
            differing[host] = endpoints
            theirs = _published(r, keys.fleet_gpus(version), _GPUS_CACHE, _parse_gpus)
            # a GPU the planner may lease that the worker's file lacks for the host (None: an older
            # worker's record); the same GPUs in another order, or more of them, run as planned
            if theirs is not None and not set(planned_gpus.get(host, ())) <= set(theirs.get(host) or ()):
                other_gpus.add(host)
    return WorkerFleets(differing, {host: differ[host] for host in differing}, frozenset(other_gpus))


_OWN: list[tuple[FleetSpec, str]] = []  # the last fleet whose version was asked (the planner's own)


def own_version(fleet: FleetSpec) -> str:
    """``fleet_version(fleet)``, remembered for the last fleet asked (a planner asks for its
    own at every batch scan: a hash of the whole fleet's JSON each time costs milliseconds
    at a thousand GPUs)."""
    if not _OWN or _OWN[0][0] is not fleet:
        _OWN[:] = [(fleet, fleet_version(fleet))]
    return _OWN[0][1]


def _endpoints(r: redis.Redis, keys: Keys, version: str) -> dict[str, int] | None:
    """Version ``version``'s endpoints (cached; None: not published, not cached)."""
    return _published(r, keys.fleet_endpoints(version), _ENDPOINTS_CACHE,
                      lambda raw: {str(name): int(size) for name, size in raw.items()})


def _parse_gpus(raw: Any) -> dict[str, list[str]]:
    return {str(host): [str(uuid) for uuid in uuids] for host, uuids in raw.items()}


def _published(r: redis.Redis, key: str, cache: dict[str, Any], parse: Callable[[Any], Any]) -> Any:
    """The parsed JSON at ``key`` (a version's record: cached, as it never changes; None:
    not published or not parseable, not cached)."""
    if key in cache:
        return cache[key]
    raw = r.get(key)
    try:
        parsed = parse(json.loads(raw)) if raw else None
    except (ValueError, TypeError, AttributeError):
        parsed = None
    if parsed is not None:
        if len(cache) >= _CACHE_MAX:
            cache.pop(next(iter(cache)))
        cache[key] = parsed
    return parsed
