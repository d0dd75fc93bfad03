"""The planner worker's view of the fleet: what a tick reads and the planner's inputs.

* Fleet spec → planner model: :func:`endpoint_models`, :func:`fleet_gpus`,
  :func:`set_point_instances` (pure; also used by reports and benches).
* :meth:`FleetViewMixin.snapshot`: everything a tick reads, in one round trip (it also
  writes the solve times noted since the last call, ``_write_solve_stats``).
* :meth:`FleetViewMixin.fleet_state`: the :class:`makespan.planner.model.FleetState` (free times
  and ``now_s`` in workload seconds, residents, set point, the endpoints asleep on each GPU
  from the instance registry, so the planner plans the wake the worker will do) and the
  busy GPUs; the endpoint models' durations are the learned ones
  (:func:`learned_endpoint_models`, refreshed every LEARNED_REFRESH_S).
* :meth:`FleetViewMixin._note_demand`: the future-cost inputs (demand weight and work
  share per endpoint) from the arrivals of the last ``DEMAND_WINDOW_S`` workload seconds,
  as the simulator computes them.

Mixed into :class:`makespan.workers.planner_worker.PlannerWorker`; uses its Redis client, leases,
keys, settings, fleet, GPUs, endpoints, ``_solve_stats``, ``_recent`` and ``now_s``.
"""

from __future__ import annotations

from makespan.errors import StoreError
from makespan.estimates import Windows, prior_s, read_transition_windows, transition_estimate
from makespan.models import FleetSpec, Priority
from makespan.planner.simulator import _demand, _share
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.workers.drivers.base import Instance
from makespan.workers.drivers.registry import list_instances
from makespan.workers.phases import parse_instance

STATS_KEEP = 10_000  # solve-time records kept in P:planner:solve_s
DEMAND_WINDOW_S = 1800.0  # workload seconds of arrivals that define recent demand
DEMAND_KEEP = 5_000  # most recent arrivals remembered for it
LEARNED_REFRESH_S = 2.0  # wall seconds between reads of the learned transition durations


def endpoint_models(fleet: FleetSpec) -> dict[str, EndpointModel]:
    """The fleet file's endpoints as the planner models them (the fleet file's durations)."""
    return {n: EndpointModel(n, e.tensor_parallel, e.memory_mib_per_gpu, e.cold_start_s, e.evict_s, e.wake_s, e.slots,
                             e.asleep_gpu_mib, e.asleep_ram_mib, e.sleep_options)
            for n, e in fleet.endpoints.items()}


def learned_endpoint_models(fleet: FleetSpec, windows: Windows, min_observations: int,
                            q: float) -> dict[str, EndpointModel]:
    """:func:`endpoint_models` with learned durations (:mod:`makespan.estimates`): each
    endpoint's cold start, evict (its sleep, for an endpoint with a sleep mode: that is
    how its instances leave) and wake are the running quantile ``q`` over every host's
    measured window once it holds ``min_observations``, else the fleet file's figure."""
    out = {}
    for n, e in fleet.endpoints.items():
        def est(kind: str) -> float:
            return transition_estimate(windows, n, None, kind, prior_s(e, kind), min_observations, q).seconds
        wake = est("wake") if e.wake_s is not None else None
        options = tuple((level, wake if i == 0 else wake_s, ram) for i, (level, wake_s, ram) in enumerate(e.sleep_options))
        out[n] = EndpointModel(n, e.tensor_parallel, e.memory_mib_per_gpu, est("cold_start"),
                               est("sleep" if e.wake_s is not None else "evict"), wake, e.slots,
                               e.asleep_gpu_mib, e.asleep_ram_mib, options)
    return out


def asleep_by_gpu(instances: list[tuple[Instance, str]]) -> dict[str, frozenset[str]]:
    """GPU uuid -> endpoints with an instance ``asleep`` there (the instance registry, as
    :func:`makespan.workers.drivers.registry.list_instances` ``with_state`` lists it)."""
    out: dict[str, set[str]] = {}
    for inst, state in instances:
        if state == "asleep":
            for u in inst.gpus:
                out.setdefault(u, set()).add(inst.endpoint)
    return {u: frozenset(v) for u, v in out.items()}


def fleet_gpus(fleet: FleetSpec) -> list[Gpu]:
    return [Gpu(g.uuid, h.name, g.index, g.memory_mib) for h in fleet.hosts for g in h.gpus]


def set_point_instances(fleet: FleetSpec) -> list[tuple[str, list[str]]]:
    """(endpoint, GPU UUIDs) of every set-point instance."""
    hosts = {h.name: h for h in fleet.hosts}
    out = []
    for e in fleet.endpoints.values():
        for sp in e.set_point:
            by_index = {g.index: g.uuid for g in hosts[sp.host].gpus}
            out.append((e.name, [by_index[i] for i in sp.gpus]))
    return out


class FleetViewMixin:
    def snapshot(self) -> dict:
        """What every tick reads, in one round trip: expired lease ids (on the Redis
        server's clock), the number of open agenda entries, GPU holders and residents
        (MGET, fleet order), whether a workload is active, and the first ``batch_size``
        ids of every queue (CRITICAL first)."""
        uuids = [g.uuid for g in self.gpus]
        p = self.r.pipeline(transaction=False)
        self._write_solve_stats(p)
        self.leases.expired(pipe=p)  # on the Redis server's clock
        p.zcard(self.keys.agenda_index)
        p.mget([self.keys.gpu(u) for u in uuids])
        p.mget([self.keys.resident(u) for u in uuids])
        p.scard(self.keys.workloads_active)
        for q in self.keys.queues():
            p.zrange(q, 0, self.settings.batch_size - 1)
        expired, agenda, held, res, workloads, *heads = p.execute()[-(5 + len(Priority)):]
        return {"expired": expired, "agenda": agenda, "held": held, "resident": res, "workloads": workloads,
                "heads": dict(zip(Priority, heads))}

    def _write_solve_stats(self, p) -> None:
        """Queue the solve times noted since the last call on pipeline ``p`` (the list
        ``P:planner:solve_s``, ``seconds:batch size``, capped at STATS_KEEP)."""
        if self._solve_stats:
            p.rpush(f"{self.keys.prefix}:planner:solve_s", *self._solve_stats)
            p.ltrim(f"{self.keys.prefix}:planner:solve_s", -STATS_KEEP, -1)
            self._solve_stats = []

    def fleet_state(self, snap: dict | None = None) -> tuple[FleetState, set[str]]:
        """The planner's view of the fleet (free times, residents, set point) and the busy
        GPUs, from ``snap`` (:meth:`snapshot`) or read now."""
        uuids = [g.uuid for g in self.gpus]
        if snap is None:
            p = self.r.pipeline(transaction=False)
            p.mget([self.keys.gpu(u) for u in uuids])
            p.mget([self.keys.resident(u) for u in uuids])
            held, res = p.execute()
        else:
            held, res = snap["held"], snap["resident"]
        now = self.now_s()
        free_at: dict[str, float] = {}
        busy: set[str] = set()
        lease_ids = sorted({v.split(":")[0] for v in held if v})
        ends: dict[str, float] = {}
        job_of: dict[str, str] = {}
        if lease_ids:
            p = self.r.pipeline(transaction=False)
            for lid in lease_ids:
                p.hmget(self.keys.lease(lid), "planned_end_s", "job")
            got = p.execute()
            ends = {lid: float(pe) if pe else now for lid, (pe, _j) in zip(lease_ids, got)}
            job_of = {lid: j for lid, (_pe, j) in zip(lease_ids, got) if j}
        self._lease_job = {u: job_of[v.split(":")[0]] for u, v in zip(uuids, held)
                           if v and v.split(":")[0] in job_of}  # GPU -> job holding it (wait reasons)
        # a held GPU whose holder overran its planned end is not free now: it frees at a
        # release the planner cannot date, so it counts as busy for at least one more tick
        # (else a plan would start a job "now" on it, the tick would skip that job, and
        # lower-priority jobs would take the GPUs that are really free)
        held_min_s = now + self.settings.planner_tick_s / self.settings.time_scale
        for u, v in zip(uuids, held):
            if v:
                busy.add(u)
                free_at[u] = max(held_min_s, ends.get(v.split(":")[0], now))
            else:
                free_at[u] = now
        resident = {}
        for u, v in zip(uuids, res):
            inst = parse_instance(v)
            resident[u] = inst[0] if inst else None
        sp = self.fleet.set_point_by_gpu()
        self._refresh_learned()
        asleep = asleep_by_gpu(list_instances(self.r, self.keys, with_state=True))
        return FleetState(now, self.gpus, self.endpoints, free_at, resident, sp, asleep=asleep,
                          set_point_weight=self.settings.set_point_weight,
                          host_ram_mib=self.fleet.host_ram_budgets()), busy

    def _refresh_learned(self) -> None:
        """Every LEARNED_REFRESH_S (wall): ``self.endpoints`` from the learned transition
        durations (:func:`learned_endpoint_models`); kept as they were when Redis fails."""
        import time

        now = time.monotonic()
        if now - getattr(self, "_learned_at", -LEARNED_REFRESH_S) < LEARNED_REFRESH_S:
            return
        self._learned_at = now
        try:
            windows = read_transition_windows(self.r, self.keys, self.fleet.endpoints, [h.name for h in self.fleet.hosts])
        except StoreError:
            return
        self.endpoints = learned_endpoint_models(self.fleet, windows, self.settings.transition_min_observations,
                                                 self.settings.transition_quantile)

    def _note_demand(self, batch: list[PlanJob], state: FleetState) -> None:
        """Fill the planner's future-cost inputs from arrivals of the last DEMAND_WINDOW_S
        workload seconds (as the simulator does): demand weight and work share per endpoint."""
        for j in batch:
            self._recent.setdefault(j.id, j)
        horizon = state.now_s - DEMAND_WINDOW_S
        if len(self._recent) > DEMAND_KEEP or any(j.release_s < horizon for j in self._recent.values()):
            keep = sorted((j for j in self._recent.values() if j.release_s >= horizon), key=lambda j: j.release_s)
            self._recent = {j.id: j for j in keep[-DEMAND_KEEP:]}
        recent = list(self._recent.values())
        state.demand = _demand(recent)
        state.demand_share = _share(recent, state)
