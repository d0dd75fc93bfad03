"""Set-point restore and the drain check of the planner worker.

When nothing is queued or running, the leader restores every set-point instance that
is not resident (a restore lease and an evict → restore chain per GPU group). While jobs
are queued, it starts the restores of its plan that start now (a set-point group the
plan leaves idle, free and not at its set point: the :class:`RestorePlanned` step).
Once
the fleet is back at its set point it counts what a drained fleet must not hold:
leases, agenda entries, busy slots, and reverse-dependency index entries whose waiting
job is no longer queued or delayed (``awaited_entries``, :func:`makespan.awaited.leaked`).

The tick's steps are :class:`RestorePlanned` (while jobs are queued) and
:class:`SetPointsAndDrain` (when the tick formed no batch); whether the drain was
checked in the current idle period is ``CrossTickState.idle_checked``. A job the critical
lane leases and that completes between two ticks (:mod:`makespan.workers.critical_lane`)
is never seen running by a tick, so it also ends the idle period: the drain is checked
again once ``CrossTickState.lane_leases`` moved since the last check.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import redis

from makespan import events, telemetry
from makespan.awaited import leaked
from makespan.planner.restore import plan_restores
from makespan.store import JobStore
from makespan.workers.phases import PhaseContext, instance_value, restore_failure
from makespan.workers.starts import send
from makespan.workers.tick.clock import starts_now
from makespan.workers.tick.context import TickContext, TickEnv
from makespan.workers.worker_fleets import read_worker_fleets

log = logging.getLogger("makespan.planner")


class RestorePlanned:
    """Step: start the plan's set-point restores that start now (planner/restore.py, at
    the group's last planned job: a group the plan leaves idle, free now and not at its
    set point), while other jobs are queued. Only when the batch holds every queued job
    (fewer than ``batch_size``): a job left out of the batch might need the GPUs. For the
    same reason it does nothing after a preemption requeued victims (they are queued,
    not in the batch, and may start on those GPUs next tick). Jobs waiting on a
    dependency are not in the batch and are not considered. The restores' GPUs join
    ``taken``."""

    name = "restore planned set points"

    def run(self, ctx: TickContext) -> None:
        if not ctx.batch or ctx.requeued_now or len(ctx.batch) >= ctx.env.settings.batch_size:
            return
        state, plan = ctx.fleet_state, ctx.plan
        assert state is not None and plan is not None, "PlanBatch runs before RestorePlanned"
        # "now": an idle group's restore starts exactly at state.now_s (its GPUs free now); an
        # absolute tolerance, as a relative one (1e-6 of a unix time ≈ 1800 s) started restores
        # planned after a job still waiting for the group, delaying that job
        for assignment in plan_restores(plan.assignments, ctx.batch, state, "group"):
            if starts_now(assignment.start_s, state.now_s) and not ctx.taken.intersection(assignment.gpus):
                start_restore(ctx, state.set_point[assignment.gpus[0]], tuple(assignment.gpus), ctx.taken,
                              sleep_levels=dict(assignment.sleep_levels) or None)


class SetPointsAndDrain:
    """Step, when the tick formed no batch and a GPU is free: restore set points and
    check the drain once per idle period (module doc). A period ends when work runs or
    is queued again (or a batch is planned), so every batch gets its check; queued jobs
    that only wait for a GPU worker with their workload function (``waiting_for_function``)
    or with a fleet file that can run them (``host_fleet_differs``), all of them read by this
    tick's scan, do not end it."""

    name = "set points and drain"

    def run(self, ctx: TickContext) -> None:
        if ctx.batch or len(ctx.held_gpus) >= len(ctx.env.gpus):
            return
        env, kept = ctx.env, ctx.kept
        # a pool's planner (Keys.for_pool) judges its own pool: its GPUs and its queues
        working = bool(ctx.held_gpus) if env.keys.pool is not None else env.r.zcard(env.keys.running)
        queued = sum(env.r.zcard(queue) for queue in env.keys.queues())
        # jobs that only wait for a worker with their function (possibly for days) do not keep
        # the fleet off its set points: the tick's scan read every queued job and each waits so
        formed = ctx.formed
        only_function_waits = (ctx.batch_formed and queued == len(formed.function_waits) + len(formed.fleet_waits)
                               and not formed.unready and not formed.left_out)
        if working or (queued and not only_function_waits):
            kept.idle_checked = False
            return
        restoring = False
        busy = set(ctx.held_gpus)
        uuids = [gpu.uuid for gpu in env.gpus]
        residents = dict(zip(uuids, env.r.mget([env.keys.resident(gpu) for gpu in uuids])))
        off = [(endpoint, gpus) for endpoint, gpus in env.set_points
               if not all(residents.get(gpu) == instance_value(endpoint, gpus) for gpu in gpus)]
        reads = env.r.mget([key for _endpoint, gpus in off for key in (
            env.keys.restore_failed(gpus[0]), env.keys.restore_failures(gpus[0]))]) if off else []
        # set points not restored now, endpoint@GPUs -> why: the last restores failed (backing off), or
        # the host's live GPU worker runs a fleet file without the endpoint (a rolling change): the
        # drain check runs and reports them (it waited for them before, blind for the whole change)
        failed: dict[str, str] = {}
        fleets = read_worker_fleets(env.r, env.keys, env.fleet, env.whole_fleet or env.fleet) if off else None
        # delayed jobs due soon (a retry's backoff, a delay_s): a restore that would still run when one
        # of them falls due, on a host it could run on, is not started (a 3 s wake started in a 1 s retry
        # backoff delayed the retry: a driver author's report)
        due_soon = _delayed_due_soon(ctx) if off and env.delayed.next_due is not None else []
        for (endpoint, gpus), backoff, counted in zip(off, reads[::2], reads[1::2]):
            if backoff is not None:  # not retried before its backoff ends: the drain check reports it
                failure = restore_failure(counted or backoff)
                failed[instance_value(endpoint, gpus)] = (f"{failure['failures']} failed restore(s), last: "
                                                          f"{failure['reason'] or 'no reason kept'}")
                continue
            host = env.fleet.host_of(gpus[0])
            if fleets is not None and host in fleets.hosts_lacking(env.fleet, endpoint):
                failed[instance_value(endpoint, gpus)] = (
                    f"not restored: the GPU worker of {fleets.detail([host], env.fleet, [endpoint])} runs another "
                    "fleet file, one that cannot run it there")
                continue
            restoring = True
            if busy.intersection(gpus):
                continue
            if due_soon and _restore_delays(ctx, endpoint, tuple(gpus), due_soon):
                continue  # a delayed job falls due there before the restore would end
            start_restore(ctx, endpoint, tuple(gpus), busy, checked=True)
        if restoring or env.r.zcard(env.keys.leases):  # the drain check counts the whole fleet: all idle
            kept.idle_checked = False
            return
        lane_leases = kept.lane_leases  # read once: the lane's thread may lease meanwhile
        if not kept.idle_checked or lane_leases != kept.lane_leases_at_check:
            kept.idle_checked, kept.lane_leases_at_check = True, lane_leases
            check_drain(env, failed, ctx.token)


DUE_SOON_READ = 64  # delayed jobs read per idle tick to judge the restores (the earliest due first)


def _delayed_due_soon(ctx: TickContext) -> list[tuple[float, str]]:
    """(wall s until due, endpoint) of the delayed jobs that fall due within the longest
    restore the fleet could start (its set points' cold starts), the earliest
    :data:`DUE_SOON_READ`; [] when Redis fails (restores go on as before)."""
    env = ctx.env
    longest_s = max((env.fleet.endpoints[endpoint].cold_start_s for endpoint, _gpus in env.set_points), default=0.0)
    now_s = env.delayed.server_now_s()
    try:
        due = env.r.zrangebyscore(env.keys.delayed, "-inf", now_s + longest_s * env.settings.time_scale,
                                  start=0, num=DUE_SOON_READ, withscores=True)
        if not due:
            return []
        pipe = env.r.pipeline(transaction=False)
        for job_id, _score in due:
            pipe.hget(env.keys.job(job_id), "endpoint")
        endpoints = pipe.execute()
    except redis.RedisError:
        return []
    return [(score - now_s, endpoint) for (_job, score), endpoint in zip(due, endpoints) if endpoint]


def _restore_delays(ctx: TickContext, endpoint: str, gpus: tuple[str, ...], due_soon: list[tuple[float, str]]) -> bool:
    """Whether restoring ``endpoint`` on ``gpus`` now could delay one of ``due_soon``: a job of
    another endpoint that fits the host of ``gpus`` and falls due before the restore would
    end. A job of ``endpoint`` itself is helped by the restore; one that cannot run on that
    host is not delayed by it."""
    env = ctx.env
    load_wall_s = _restore_load_s(ctx, endpoint, gpus, False) * env.settings.time_scale
    host = next((h for h in env.fleet.hosts if gpus[0] in {gpu.uuid for gpu in h.gpus}), None)
    for due_in_s, other in due_soon:
        spec = env.fleet.endpoints.get(other)
        if other == endpoint or spec is None or due_in_s >= load_wall_s:
            continue
        if host is None or (spec.tensor_parallel <= len(host.gpus)
                            and spec.memory_mib_per_gpu <= max(gpu.memory_mib for gpu in host.gpus)):
            return True
    return False


def _restore_load_s(ctx: TickContext, endpoint: str, gpus: tuple[str, ...], prewarm: bool) -> float:
    """The planned length (workload s) of restoring ``endpoint`` on ``gpus``: a wake when the
    tick's fleet state has it asleep there (``wake_s``, or ``wake_level2_s`` from level 2),
    else a cold start. The lease's ``planned_s`` feeds the free times and ETAs of what waits
    for these GPUs: a restore that is a 1 s wake was planned at a 6 s cold start (a driver
    author's report; with real sizes, 5 s against 300 s)."""
    spec = ctx.env.fleet.endpoints[endpoint]
    state = ctx.fleet_state
    if spec.wake_s is None:
        return spec.cold_start_s
    level: int | None = None
    if state is not None:  # a tick that read the fleet: its sleepers
        if endpoint in state.asleep.get(gpus[0], frozenset()):
            level = state.asleep_level.get((gpus[0], endpoint), spec.sleep_level)
    else:  # an idle tick's restore (no fleet read): the sleepers on these GPUs, through the instance index
        from makespan.errors import StoreError
        from makespan.workers.drivers.registry import sleepers_on

        try:
            level = next((found or spec.sleep_level for inst, found in sleepers_on(ctx.env.r, ctx.env.keys, gpus)
                          if inst.endpoint == endpoint and sorted(inst.gpus) == sorted(gpus)), None)
        except StoreError:
            level = None  # planned as a cold start: the longer estimate
    if level is not None:
        return spec.wake_level2_s if level == 2 and spec.wake_level2_s is not None else spec.wake_s
    return spec.wake_s if prewarm else spec.cold_start_s


def start_restore(ctx: TickContext, endpoint: str, gpus: tuple[str, ...], busy: set[str],
                  prewarm: bool = False, sleep_levels: dict[str, int] | None = None, checked: bool = False) -> bool:
    """Lease ``gpus`` for the restore of set-point ``ep`` and send its evict → restore
    chain; the GPUs join ``busy``. False if the lease failed (GPUs taken meanwhile).
    ``prewarm``: the same chain wakes a sleeper ahead of demand
    (:mod:`makespan.workers.prewarm`): planned at its wake time, ``prewarm`` in the
    ``restore_start`` event. ``sleep_levels``: the plan's choice for the instances its evict
    displaces (``Assignment.sleep_levels`` of a planned restore: endpoint -> level, 0 = stop;
    None: each endpoint's own). False too, without a lease, while the group's last restore
    failed less than its backoff ago (``P:restore:failed:{first GPU}``, written by the
    restore phase), or while the live GPU worker of its host runs a fleet file without
    ``endpoint`` (a rolling change of the file, :mod:`makespan.workers.worker_fleets`: its
    restore would fail there); ``checked``: the caller read both just now
    (:class:`SetPointsAndDrain`), not read again."""
    env, last_tp = ctx.env, ctx.kept.last_traceparent
    host = env.fleet.host_of(gpus[0])
    if not checked:
        if env.r.exists(env.keys.restore_failed(gpus[0])):
            return False  # its last restore failed: backing off (makespan.workers.phases.RESTORE_BACKOFF_S)
        if host in read_worker_fleets(env.r, env.keys, env.fleet, env.whole_fleet or env.fleet).hosts_lacking(
                env.fleet, endpoint):
            return False
    lease_id = uuid.uuid4().hex
    load_s = _restore_load_s(ctx, endpoint, gpus, prewarm)
    event = {"kind": "restore_start", "endpoint": endpoint, "host": host, "planned_s": load_s}
    if prewarm:
        event["prewarm"] = True
    lease = env.leases.acquire(lease_id, gpus, env.settings.lease_ttl_s, job_id=f"restore:{endpoint}:{gpus[0]}",
                               kind="restore", holder=host, planner_token=ctx.token,
                               info={"planned_end_s": repr(env.now_s() + load_s), "planned_s": repr(load_s),
                                     "endpoint": endpoint},
                               event=event)
    if lease is None:
        return False
    busy.update(gpus)
    # the restore joins the trace of the last job that held these GPUs: its
    # restore_baseline span closes that job's makespan (submit -> restore)
    traceparent = next((last_tp[gpu] for gpu in gpus if last_tp.get(gpu)), "")
    with telemetry.use_traceparent(traceparent):
        send(env, PhaseContext(lease_id, lease.token, list(gpus), host, "restore", endpoint, traceparent=traceparent,
                               sleep_levels=sleep_levels), host)
    for gpu in gpus:
        last_tp.pop(gpu, None)
    return True


def check_drain(env: TickEnv, set_points_failed: dict[str, str] | None = None, planner_token: str = "") -> dict[str, Any]:
    """Count what a drained fleet must not hold: leases, agenda entries, busy slots,
    leaked reverse-dependency index entries (module doc), and the set points not in place
    because their restores fail or their host's GPU worker runs a fleet file without the
    endpoint (``set_points_failed``: endpoint@GPUs -> why, from :class:`SetPointsAndDrain`;
    nothing restores them now, so the fleet is idle otherwise);
    written to ``P:drain`` and as a ``drain`` event (with ``set_points_failed_detail``)
    while ``planner_token`` leads (a planner deposed during its check writes nothing: its
    counts are of a fleet the new leader already runs). Returns the counts by name."""
    set_points_failed = set_points_failed or {}
    gpu_keys = sum(1 for holder in env.r.mget([env.keys.gpu(gpu.uuid) for gpu in env.gpus]) if holder)
    leases = int(env.r.zcard(env.keys.leases)) + gpu_keys
    agenda = env.agenda.count() if env.agenda is not None else 0
    busy_slots = sum(1 for _ in env.r.scan_iter(env.keys.busy_pattern, count=1000))
    awaited = sum(len(entries) for entries in leaked(env.r, env.keys).values())
    counts = {"leases": leases, "agenda_entries": agenda, "busy_slots": busy_slots, "awaited_entries": awaited,
              "set_points_failed": len(set_points_failed)}
    if not JobStore(env.r, env.keys).write_drain(planner_token, {**counts, "checked_at": repr(env.clock.now())}):
        log.warning("drain check not recorded: this planner no longer leads (fenced off)")
        return counts
    detail = "; ".join(f"{where}: {why}" for where, why in sorted(set_points_failed.items()))[:2000]
    events.record(env.r, env.keys.events, "drain", **counts,
                  **({"set_points_failed_detail": detail} if detail else {}))
    if any(counts.values()):
        log.error("drain check: left behind %s (leases %s)%s", counts, env.leases.active(),
                  f"; set points not restored: {detail}" if detail else "")
    else:
        log.info("drain check: clean")
    return counts
