"""The planner worker's view of the fleet: what a tick reads and the planner's inputs.

* Fleet spec → planner model: :func:`endpoint_models`, :func:`fleet_gpus`,
  :func:`set_point_instances` (pure; also used by reports and benches).
* :func:`read_snapshot` (the :class:`ReadSnapshot` step): everything a tick reads, in one
  round trip, as a frozen :class:`makespan.workers.tick.context.Snapshot` (it also writes
  the solve times noted since the last call, :func:`queue_solve_stats`).
* :func:`read_fleet_state` (the :class:`ReadFleet` step): the
  :class:`makespan.planner.model.FleetState` (free times, each lease's planned end dated
  on the Redis server's clock, and ``now_s`` in workload seconds, residents, set point, the endpoints asleep on each GPU
  and the level each sleeps at, from the instance registry, so the planner plans the wake
  the worker will do and counts the host RAM its sleepers really hold) and the
  busy GPUs; the endpoint models' durations are the learned ones
  (:func:`learned_endpoint_models`, refreshed every LEARNED_REFRESH_S).
* :func:`note_demand` (the :class:`NoteDemand` step): the future-cost inputs (demand weight and work
  share per endpoint) from the arrivals of the last ``DEMAND_WINDOW_S`` workload seconds,
  as the simulator computes them.

What lives across ticks (the learned models and when they were read, the solve times
not yet written, the recent arrivals) is in :class:`makespan.workers.tick.context.CrossTickState`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import redis

from makespan import metrics
from makespan.errors import StoreError
from makespan.estimates import Windows, prior_s, read_transition_windows, transition_estimate, wake_kind
from makespan.models import EndpointSpec, FleetSpec, Priority
from makespan.planner.simulator import recent_demand, recent_share
from makespan.planner.replay import placeable_hosts
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.workers import host_liveness
from makespan.workers.drivers.base import Instance
from makespan.workers.drivers.registry import list_sleepers
from makespan.workers.leases import expected_end_s, planned_end_s, server_time_ms
from makespan.keys import Keys
from makespan.workers.phases import parse_instance
from makespan.workers.tick.context import CrossTickState, Snapshot, TickContext, TickEnv

STATS_KEEP = 10_000  # solve-time records kept in P:planner:solve_s
DEMAND_WINDOW_S = 1800.0  # workload seconds of arrivals that define recent demand
DEMAND_KEEP = 5_000  # most recent arrivals remembered for it
DOWN_FREE_AFTER_S = 86_400.0  # workload s: a host without a live GPU worker is planned free only this late
OVERRUN_NOTED_S = 1.0  # workload s past its planned end before a lease counts as overrunning (wait reasons)
LEARNED_REFRESH_S = 2.0  # wall seconds between reads of the learned transition durations
# what the free times read of each lease record (makespan.workers.leases.planned_end_s)
_LEASE_FIELDS = ("job", "planned_end_s", "planned_s", "granted_ms")


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
    measured window once it holds ``min_observations``, else the fleet file's figure. The
    wake of each ``sleep_options`` level is its own window's: the configured level's
    ``wake``, level 2 beside it ``wake_level2`` (:func:`makespan.estimates.wake_kind`)."""
    out = {}
    for n, e in fleet.endpoints.items():
        def est(kind: str, n: str = n, e: EndpointSpec = e) -> float:
            return transition_estimate(windows, n, None, kind, prior_s(e, kind), min_observations, q).seconds
        wake = est("wake") if e.wake_s is not None else None
        options = tuple((level, wake if i == 0 else est(wake_kind(e, level)), ram)
                        for i, (level, _wake_s, ram) in enumerate(e.sleep_options))
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


def sleep_levels_by_gpu(sleepers: list[tuple[Instance, int | None]]) -> dict[tuple[str, str], int]:
    """(GPU uuid, endpoint) -> the sleep level (1 or 2) the GPU worker put that sleeper to
    sleep at (:func:`makespan.workers.drivers.registry.list_sleepers`), the
    ``FleetState.asleep_level`` the plan reads for its wake time and the host RAM it holds;
    a sleeper with no recorded level is left out (the plan then assumes the endpoint's
    first sleep option)."""
    return {(u, inst.endpoint): level for inst, level in sleepers if level is not None for u in inst.gpus}


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


class ReadSnapshot:
    """Step: read the tick's :class:`Snapshot` (:func:`read_snapshot`) into ``ctx.snapshot``
    (and ``ctx.lane_victims_seen``: the critical lane's victims requeued before it)."""

    name = "read snapshot"

    def run(self, ctx: TickContext) -> None:
        ctx.lane_victims_seen = ctx.kept.lane_victims  # the victims requeued before it are in the snapshot
        ctx.snapshot = read_snapshot(ctx.env, ctx.kept)
        count_idle_gpu_seconds(ctx.kept, ctx.env.clock.monotonic(), ctx.snapshot.gpu_holders)


IDLE_ACCRUAL_MAX_S = 10.0  # longest gap between two snapshots counted as idle time (a planner that stood by)


def count_idle_gpu_seconds(kept: CrossTickState, now_s: float, gpu_holders: Sequence[str | None]) -> float:
    """Add to ``makespan_gpu_seconds_total{state="idle"}`` the GPU-seconds since the last
    snapshot (``now_s``: monotonic s; at most :data:`IDLE_ACCRUAL_MAX_S`) times the GPUs
    without a lease at both snapshots (fewer of the two counts: a GPU leased by the tick
    after its snapshot, or freed just before this one, is not counted idle for the whole
    interval); note this snapshot's count. The GPU workers add busy and transition time
    (:func:`makespan.metrics.phase`), so busy ÷ all three is the fleet's utilization
    (docs/metrics.md). Returns the GPU-seconds added."""
    idle_now = sum(1 for holder in gpu_holders if not holder)
    last, kept.idle_gpus_at = kept.idle_gpus_at, (now_s, idle_now)
    if last is None:
        return 0.0
    idle_gpu_s = min(max(0.0, now_s - last[0]), IDLE_ACCRUAL_MAX_S) * min(last[1], idle_now)
    if idle_gpu_s:
        metrics.gpu_seconds("idle", idle_gpu_s)
    return idle_gpu_s


class ReadFleet:
    """Step: the planner's view of the fleet (:func:`read_fleet_state`) into
    ``ctx.fleet_state``, ``ctx.lease_job`` and ``ctx.lease_end``, when the tick plans a batch or writes the
    wait reasons of the jobs an empty batch read and did not take (:meth:`makespan.workers.tick.context.FormedBatch.read_waiting`)."""

    name = "read fleet"

    def run(self, ctx: TickContext) -> None:
        formed = ctx.formed
        if not (ctx.batch or (ctx.batch_formed and formed.read_waiting())):
            return
        snapshot = ctx.snapshot
        assert snapshot is not None, "ReadSnapshot runs before ReadFleet"
        view = read_fleet_state(ctx.env, ctx.kept, snapshot.gpu_holders, snapshot.residents, snapshot.gated_gpus)
        ctx.fleet_state, ctx.lease_job, ctx.lease_end = view.state, view.lease_job, view.lease_end
        ctx.lease_overrun = view.overrun
        ctx.formed.jobs = placeable_hosts(ctx.formed.jobs, view.state)  # hosts that hold none of a job's groups


class NoteDemand:
    """Step: the fleet state's future-cost inputs (:func:`note_demand`), when there is a batch."""

    name = "note demand"

    def run(self, ctx: TickContext) -> None:
        if ctx.batch:
            assert ctx.fleet_state is not None, "ReadFleet runs before NoteDemand"
            note_demand(ctx.kept, ctx.batch, ctx.fleet_state)


def read_snapshot(env: TickEnv, kept: CrossTickState) -> Snapshot:
    """What every tick reads, in one round trip: expired lease ids (on the Redis server's
    clock), the number of open agenda entries, GPU holders and residents (MGET, fleet
    order), whether a workload is active, and the first ``batch_size`` ids of every queue
    (CRITICAL first). The same round trip writes the solve times in ``kept``.

    Raises:
        redis.RedisError: Redis failed."""
    uuids = [gpu.uuid for gpu in env.gpus]
    pipe = env.r.pipeline(transaction=False)
    queue_solve_stats(pipe, env.keys, kept)
    env.leases.expired(pipe=pipe)  # on the Redis server's clock
    pipe.zcard(env.keys.agenda_index)
    pipe.mget([env.keys.gpu(gpu) for gpu in uuids])
    pipe.mget([env.keys.resident(gpu) for gpu in uuids])
    pipe.scard(env.keys.workloads_active)
    for queue in env.keys.queues():
        pipe.zrange(queue, 0, env.settings.batch_size - 1)
    hosts = [host.name for host in env.fleet.hosts]
    liveness_reads = host_liveness.queue_reads(pipe, env.keys, hosts)
    *rest, seen, live, cordoned = pipe.execute()[-(5 + len(Priority) + liveness_reads):]
    expired, agenda, held, residents, workloads, *heads = rest
    hosts_now = host_liveness.availability(hosts, seen, live, cordoned)
    return Snapshot(tuple(expired or ()), int(agenda), tuple(held), tuple(residents), int(workloads),
                    MappingProxyType({level: tuple(ids) for level, ids in zip(Priority, heads)}),
                    hosts_now.down, frozenset(host_liveness.gpus_of(env.fleet, set(hosts_now.unavailable))),
                    hosts_now.cordoned)


def queue_solve_stats(pipe: redis.client.Pipeline, keys: Keys, kept: CrossTickState) -> None:
    """Queue the solve times noted since the last call on pipeline ``p`` (the list
    ``P:planner:solve_s``, ``seconds:batch size``, capped at STATS_KEEP) and forget them."""
    if kept.solve_stats:
        pipe.rpush(keys.planner_solve_times, *kept.solve_stats)
        pipe.ltrim(keys.planner_solve_times, -STATS_KEEP, -1)
        kept.solve_stats = []


@dataclass(frozen=True)
class FleetView:
    """:func:`read_fleet_state`'s answer."""

    state: FleetState
    busy: set[str]  # UUIDs of the GPUs a lease holds
    lease_job: dict[str, str]  # GPU UUID -> id of the job whose lease holds it (wait reasons)
    # lease id -> its planned end, workload s on the caller's clock (read as the free times are;
    # a lease with no planned end: now)
    lease_end: dict[str, float]
    # held GPU -> how far (workload s) its lease is past its planned end (only overrunning ones):
    # the GPU frees at a release no plan can date (wait reasons say so)
    overrun: dict[str, float] = field(default_factory=dict)


def read_fleet_gpus(env: TickEnv) -> tuple[tuple[str | None, ...], tuple[str | None, ...]]:
    """(GPU holders, residents), fleet order, read now (one round trip)."""
    uuids = [gpu.uuid for gpu in env.gpus]
    pipe = env.r.pipeline(transaction=False)
    pipe.mget([env.keys.gpu(gpu) for gpu in uuids])
    pipe.mget([env.keys.resident(gpu) for gpu in uuids])
    held, residents = pipe.execute()
    return tuple(held), tuple(residents)


def read_fleet_state(env: TickEnv, kept: CrossTickState, held: tuple[str | None, ...],
                     residents: tuple[str | None, ...], gated_gpus: frozenset[str] | set[str] = frozenset()) -> FleetView:
    """The planner's view of the fleet (free times and ``now_s`` in workload s, residents,
    set point, the endpoints asleep on each GPU), the busy GPUs and each held GPU's job,
    from the GPU holders ``held`` and residents ``res`` (fleet order, as the snapshot or
    :func:`read_fleet_gpus` read them). Refreshes ``kept.endpoints`` (:func:`refresh_learned`).
    A held GPU frees at its lease's planned end (one past it: as far again as it has
    overrun, at least a tick from now), dated on the Redis server's clock
    (:func:`makespan.workers.leases.planned_end_s`, with ``TIME`` read in the same round trip
    as the lease records): a leader whose clock disagrees with the one that leased it plans
    the same instant. ``gated_gpus``: the GPUs of hosts that lost their GPU worker
    or are cordoned (:mod:`makespan.workers.host_liveness`): they count as busy and free only
    DOWN_FREE_AFTER_S from now, so nothing is leased there and a plan places there only a
    job that no other host can run (it waits with reason ``host_down`` or ``host_cordoned``).

    Raises:
        redis.RedisError: Redis failed."""
    uuids = [gpu.uuid for gpu in env.gpus]
    now = env.now_s()
    free_at: dict[str, float] = {}
    busy: set[str] = set()
    lease_ids = sorted({holder.split(":")[0] for holder in held if holder})
    ends: dict[str, float] = {}
    job_of: dict[str, str] = {}
    if lease_ids:
        pipe = env.r.pipeline(transaction=False)
        for lease_id in lease_ids:
            pipe.hmget(env.keys.lease(lease_id), *_LEASE_FIELDS)
        pipe.time()  # the planned ends are dated on the server clock (another leader may have leased)
        *got, server_time = pipe.execute()
        server_now_ms = server_time_ms(server_time)
        records = {lease_id: dict(zip(_LEASE_FIELDS, values)) for lease_id, values in zip(lease_ids, got)}
        for lease_id, record in records.items():
            planned_end = planned_end_s(record, now, server_now_ms, env.settings.time_scale)
            ends[lease_id] = now if planned_end is None else planned_end
        job_of = {lease_id: record["job"] for lease_id, record in records.items() if record["job"]}
    lease_job = {gpu: job_of[holder.split(":")[0]] for gpu, holder in zip(uuids, held)
                 if holder and holder.split(":")[0] in job_of}  # GPU -> job holding it (wait reasons)
    # a held GPU whose holder overran its planned end is not free now: it frees at a
    # release the planner cannot date, so it counts as busy for at least one more tick
    # (else a plan would start a job "now" on it, the tick would skip that job, and
    # lower-priority jobs would take the GPUs that are really free), and for as long again
    # as it has overrun: a holder far past its planned end is not expected to end at the
    # next tick (else a job waits for its warm GPU for ever while a cold one sits idle)
    held_min_s = now + env.settings.planner_tick_s / env.settings.time_scale
    overrun: dict[str, float] = {}
    for gpu, holder in zip(uuids, held):
        if holder:
            busy.add(gpu)
            end = ends.get(holder.split(":")[0], now)
            free_at[gpu] = max(held_min_s, expected_end_s(end, now))
            if end < now - OVERRUN_NOTED_S:
                overrun[gpu] = now - end
        else:
            free_at[gpu] = now
    resident = {}
    for gpu, value in zip(uuids, residents):
        instance = parse_instance(value)
        # an instance of another width than its endpoint's tensor_parallel now (the fleet file
        # changed it): not warm for any job of it (the start phase stops it first); counted
        # empty, not resident (the plan said "warm" and missed an evict and a cold start)
        spec = env.fleet.endpoints.get(instance[0]) if instance else None
        stale_width = spec is not None and instance is not None and bool(instance[1]) and len(instance[1]) != spec.tensor_parallel
        resident[gpu] = instance[0] if instance and not stale_width else None
    set_point = env.fleet.set_point_by_gpu()
    refresh_learned(env, kept)
    sleepers = list_sleepers(env.r, env.keys)
    asleep = asleep_by_gpu([(inst, "asleep") for inst, _level in sleepers])
    if gated_gpus:  # the dead-host gate: busy, and free only in a day (other hosts are preferred)
        busy |= set(gated_gpus)
        for gpu in gated_gpus:
            free_at[gpu] = max(free_at[gpu], now + DOWN_FREE_AFTER_S)
    state = FleetState(now, list(env.gpus), kept.endpoints, free_at, resident, set_point, asleep=asleep,
                       set_point_weight=env.settings.set_point_weight, host_ram_mib=env.fleet.host_ram_budgets(),
                       asleep_level=sleep_levels_by_gpu(sleepers))
    return FleetView(state, busy, lease_job, ends, overrun)


def refresh_learned(env: TickEnv, kept: CrossTickState) -> None:
    """Every LEARNED_REFRESH_S (``env.clock.monotonic``): ``kept.endpoints`` from the learned
    transition durations (:func:`learned_endpoint_models`); kept as they were when Redis fails."""
    now = env.clock.monotonic()
    if now - kept.learned_at_s < LEARNED_REFRESH_S:
        return
    kept.learned_at_s = now
    try:
        windows = read_transition_windows(env.r, env.keys, env.fleet.endpoints, [h.name for h in env.fleet.hosts])
    except StoreError:
        return
    kept.endpoints = learned_endpoint_models(env.fleet, windows, env.settings.transition_min_observations,
                                             env.settings.transition_quantile)


def note_demand(kept: CrossTickState, batch: list[PlanJob], state: FleetState) -> None:
    """Fill the planner's future-cost inputs (``state.demand``, ``state.demand_share``) from
    arrivals of the last DEMAND_WINDOW_S workload seconds (as the simulator does): demand
    weight and work share per endpoint. ``kept.recent_jobs`` remembers the arrivals."""
    for job in batch:
        kept.recent_jobs.setdefault(job.id, job)
    horizon = state.now_s - DEMAND_WINDOW_S
    if len(kept.recent_jobs) > DEMAND_KEEP or any(job.release_s < horizon for job in kept.recent_jobs.values()):
        keep = sorted((job for job in kept.recent_jobs.values() if job.release_s >= horizon),
                      key=lambda job: job.release_s)
        kept.recent_jobs = {job.id: job for job in keep[-DEMAND_KEEP:]}
    recent = list(kept.recent_jobs.values())
    state.demand = recent_demand(recent)
    state.demand_share = recent_share(recent, state)
