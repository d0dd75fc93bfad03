"""The critical lane: a CRITICAL job placed the moment it is submitted, without waiting
for the tick's plan (issue 21 point 2).

A tick on a large fleet plans for seconds (the portfolio on 256 jobs and 512 GPUs); a
CRITICAL job submitted meanwhile would wait for that plan and the next one. The leading
planner therefore runs :class:`CriticalLane`, one thread beside its tick loop:

1. it blocks on ``P:planner:critical`` (:attr:`makespan.keys.Keys.planner_critical`; the
   submit script pushes every CRITICAL job queued at once, ``submit.lua``; the workload
   submit script every CRITICAL step without dependencies, ``submit_workload.lua``; the
   step retry script every CRITICAL retry, ``retry_step.lua``; and a job completing every
   queued CRITICAL job its completion leaves with all dependencies completed, ``lib.lua``'s
   ``finish_job``: a released workload step or ``depends_on`` job);
2. for each id it reads, in one round trip, the job record, the GPU leases and residents
   and the hosts' liveness, and asks :func:`makespan.planner.critical_placement.place_critical`
   for a warm idle instance of its endpoint, else a free group (avoiding the GPUs the tick's
   plan starts on now), else, reading the lease holders, a preemption of strictly
   lower-priority work (:func:`makespan.planner.preemption.choose_preemption`'s rule, with
   the preemption bounds of :mod:`makespan.workers.preemption`);
3. it preempts the victims (``preempt.lua``) and leases the group
   (:func:`makespan.workers.starts.start_job`: ``acquire.lua`` under the leader's fencing
   token, the job acknowledged in the same step) and sends the phase chain, exactly as a
   tick's start;
4. it records a ``critical_lane`` event (job, outcome, GPUs, ``during_tick``, and the
   milliseconds from the pop to the state read, ``read_ms``, to the placement chosen,
   ``chosen_ms``, and to the phase chain sent, ``took_ms``).

Safety: leases need no coordination with the tick (the acquire script refuses a job that
is no longer queued and a GPU a lease holds: the loser of a race leases nothing). A
preemption does: the lane holds the job in :class:`makespan.workers.tick.claims.JobClaims`
while it decides, and the tick's ``Preempt`` step leaves such jobs to it (and the lane
waits while that step holds one). Nothing is lost when the lane fails: a job it does not
lease stays queued, and the next tick plans it. The next tick reconciles: its snapshot
reads the lease (the GPUs are held, the job is gone from the queue), and any plan of the
tick in progress that counted on those GPUs fails its lease there and waits a tick.

Latency: the tick is CPU-bound Python in the same process, and each of the lane's Redis
round trips gives the GIL up; with CPython's default 5 ms switch interval each one could
wait up to 5 ms to get it back. While a lane runs, the process's switch interval is
:data:`SWITCH_INTERVAL_S` (restored when it stops); only a thread that waits for the GIL
makes the tick yield, so the tick pays nothing while the lane waits on Redis. Measured
under a load of 25 on this 2-core machine, a CPU-bound thread beside it: the lane's
placement p50/p95 23/234 ms at 5 ms, 9/28 ms at 0.5 ms.

A job with dependencies takes the lane only once every one of them has completed (the
lane reads their states; outcome ``deps`` otherwise: its release pushes it again).
A job with ``helpers`` (started on its GPUs after its main endpoint) takes only a group
where they fit beside it (:func:`makespan.planner.helpers.fitting_groups`, the tick's rule;
``no_group`` when none), and its planned end counts their start.
A victim the lane requeues has no ETA yet: :attr:`CrossTickState.lane_victims` makes the
next tick form a batch for it even with every GPU held (:class:`makespan.workers.batch.FormBatch`).
Out of the lane (left to the tick): delayed jobs, jobs requeued by a reclaim, and jobs
below CRITICAL that only inherit the level from a CRITICAL dependant.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import redis

from makespan import events
from makespan.errors import LeaseError, StoreError
from makespan.models import Priority
from makespan.planner.critical_placement import CriticalPlacement, place_critical
from makespan.planner.helpers import fitting_groups, held_s
from makespan.registry import function_placement
from makespan.planner.model import FleetState, PlanJob
from makespan.planner.preemption import Holder
from makespan.redis_conn import OutageLog, credentials_refused, is_store_bug
from makespan.store.jobs import record_deps, unreadable_field
from makespan.workers import host_liveness, worker_fleets
from makespan.workers.fleet_view import DOWN_FREE_AFTER_S
from makespan.workers.leases import expected_end_s, planned_end_s, preempt
from makespan.workers.phases import instance_value
from makespan.workers.running import lease_holders, within_bounds
from makespan.workers.starts import note_preemption, start_job
from makespan.workers.tick.clock import release_s
from makespan.workers.tick.context import CrossTickState, TickContext, TickEnv

log = logging.getLogger("makespan.planner")

__all__ = ["CriticalLane", "LaneOutcome"]

SWITCH_INTERVAL_S = 0.0005  # the process's GIL switch interval while a lane runs (module doc), s
CLAIM_WAIT_S = 5.0  # longest the lane waits for the tick's Preempt step to give a job back, s
_JOB_FIELDS = ("state", "endpoint", "priority", "service_s", "submitted_at", "seq", "deps", "traceparent",
               "deadline_s", "not_before", "helpers", "fn")


@dataclass(frozen=True)
class LaneOutcome:
    """What the lane did with one job id.

    Attributes:
        outcome: ``warm``, ``cold_start`` or ``preempted`` (leased and sent); or why not:
            ``not_queued`` (gone, leased or not CRITICAL), ``deps`` (a dependency has not
            completed), ``no_group`` (no group for it and its helpers now), ``no_function``
            (no live GPU worker registers its workload function: it waits, left to the tick),
            ``no_worker_fleet`` (no live GPU worker whose fleet file can run it: left to the tick), ``claimed``
            (the tick's Preempt step held it past :data:`CLAIM_WAIT_S`), ``lost_race`` (a GPU
            or the job was leased meanwhile). (The thread's event says ``error`` when placing
            raised; the job then stays queued for the tick.)
        gpus: the group leased (empty when none).
        victims: lease ids preempted for it.
        victim_jobs: the ids of the jobs those leases held (the ``preempted`` events' ``job``).
        read_ms, chosen_ms: milliseconds from the start of :meth:`CriticalLane.place` to the
            state read and to the placement chosen (0: not reached).
    """

    outcome: str
    gpus: tuple[str, ...] = ()
    victims: tuple[str, ...] = ()
    victim_jobs: tuple[str, ...] = ()
    read_ms: float = 0.0
    chosen_ms: float = 0.0

    @property
    def leased(self) -> bool:
        return self.outcome in ("warm", "cold_start", "preempted")


class CriticalLane:
    """The leader's critical-lane thread (module doc).

    Args:
        env: the planner worker's fixed parts.
        kept: its cross-tick state (learned endpoint models, claims, the plan's starting GPUs).
        token: the leader's fencing token.
        tick_running: whether a tick is in progress now (recorded in the event).
    """

    def __init__(self, env: TickEnv, kept: CrossTickState, token: str, tick_running: Callable[[], bool]):
        self.env, self.kept, self.token = env, kept, token
        self._tick_running = tick_running
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="makespan-critical-lane", daemon=True)
        self._fleet = FleetState(0.0, list(env.gpus), {})  # the aligned groups, cached per (tp, memory)
        self._memory_mib = {gpu.uuid: gpu.memory_mib for gpu in env.gpus}  # GPU uuid -> memory, MiB
        self._host_of = {gpu.uuid: gpu.host for gpu in env.gpus}  # GPU uuid -> its host
        self.placed = 0  # jobs leased by the lane (tests, benches)
        self._interval_before: float | None = None  # the switch interval before start()

    def start(self) -> None:
        """Start the thread; the process's GIL switch interval becomes at most :data:`SWITCH_INTERVAL_S`."""
        self._interval_before = sys.getswitchinterval()
        sys.setswitchinterval(min(self._interval_before, SWITCH_INTERVAL_S))
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the thread to end and wait for it (its blocking read ends within half the
        socket timeout); the switch interval is restored."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        if self._interval_before is not None:
            sys.setswitchinterval(self._interval_before)
            self._interval_before = None

    def _run(self) -> None:
        env = self.env
        wait_s = max(0.05, min(1.0, env.settings.redis_socket_timeout_s / 2))
        outage = OutageLog(log, "critical lane")
        while not self._stop.is_set():
            try:
                got = env.r.blpop([env.keys.planner_critical], timeout=wait_s)
                outage.ok()
            except redis.RedisError as e:
                outage.failed(credentials_refused(env.settings.redis_url, e) or e)
                self._stop.wait(0.5)
                continue
            if not got:
                continue
            try:
                self.place(got[1])
            except LeaseError as e:  # deposed: the tick loop finds out on its own
                log.error("critical lane stops: %s", e)
                return
            except (redis.RedisError, StoreError) as e:  # the job stays queued: the tick plans it
                if is_store_bug(e):  # a script error, WRONGTYPE, wrong arguments: logged as a bug, traceback
                    outage.bug(e)
                else:
                    log.warning("critical lane: placing %s failed (Redis): %s", got[1], e)
                self._record_failure(got[1], e)
            except Exception as e:  # noqa: BLE001 - any other failure leaves the job queued for the tick; the lane goes on
                log.exception("critical lane: placing %s failed; the tick will plan it", got[1])
                self._record_failure(got[1], e)

    def _record_failure(self, job_id: str, error: BaseException) -> None:
        """A ``critical_lane`` event with outcome ``error`` (best effort: Redis may be what failed)."""
        try:
            events.record(self.env.r, self.env.keys.events, "critical_lane", job=job_id, outcome="error",
                          error=f"{type(error).__name__}: {error}"[:300], during_tick=self._tick_running())
        except (redis.RedisError, StoreError):
            pass

    def place(self, job_id: str) -> LaneOutcome:
        """Place ``job_id`` now if it is a queued CRITICAL job (module doc) and record the
        ``critical_lane`` event.

        Raises:
            LeaseError: the planner was fenced off.
            redis.RedisError, StoreError: Redis failed (the job stays queued)."""
        started = time.monotonic()
        during_tick = self._tick_running()
        if not self.kept.claims.take(job_id, CLAIM_WAIT_S):
            out = LaneOutcome("claimed")
        else:
            out = LaneOutcome("not_queued")
            try:
                out = self._place(job_id, started)
            finally:
                self.kept.claims.release((job_id,), settled=out.leased)
        took_ms = (time.monotonic() - started) * 1000.0
        self.placed += out.leased
        if out.leased:  # work ran outside the tick: the drain is checked again (workers/drain.py)
            self.kept.lane_leases += 1
        events.record(self.env.r, self.env.keys.events, "critical_lane", job=job_id, outcome=out.outcome,
                      gpus=list(out.gpus) or None, victims=list(out.victims) or None,
                      victim_jobs=list(out.victim_jobs) or None, took_ms=round(took_ms, 3),
                      read_ms=round(out.read_ms, 3), chosen_ms=round(out.chosen_ms, 3), during_tick=during_tick)
        if out.leased:
            log.info("critical lane: job %s %s on %s in %.1f ms%s", job_id, out.outcome, ",".join(out.gpus), took_ms,
                     " (a tick was running)" if during_tick else "")
        return out

    def _place(self, job_id: str, started: float) -> LaneOutcome:
        env, uuids = self.env, [gpu.uuid for gpu in self.env.gpus]
        hosts = [host.name for host in env.fleet.hosts]
        pipe = env.r.pipeline(transaction=False)
        pipe.hmget(env.keys.job(job_id), *_JOB_FIELDS)
        pipe.mget([env.keys.gpu(gpu) for gpu in uuids])
        pipe.mget([env.keys.resident(gpu) for gpu in uuids])
        host_liveness.queue_reads(pipe, env.keys, hosts)
        worker_fleets.queue_versions(pipe, env.keys, hosts)
        record, holders, resident_values, seen, live, cordoned, versions = pipe.execute()
        read_ms = (time.monotonic() - started) * 1000.0
        job = _plan_job(job_id, dict(zip(_JOB_FIELDS, record)), self._deps_completed, env.settings.time_scale,
                        env.now_s())
        if isinstance(job, str):
            return LaneOutcome(job)
        endpoints = self.kept.endpoints
        model = endpoints.get(job.endpoint)
        if model is None or any(name not in endpoints for name in job.helpers):
            return LaneOutcome("no_group")  # the tick's batch cancels a job the fleet cannot run
        gated = host_liveness.availability(hosts, seen, live, cordoned).unavailable
        down = host_liveness.gpus_of(env.fleet, set(gated))  # no lease on a down or cordoned host
        unavailable = {gpu for gpu, holder in zip(uuids, holders) if holder} | down
        residents = dict(zip(uuids, resident_values))
        groups = self._fleet.groups(model.tp, model.memory_mib)
        if job.helpers:  # only groups where its helpers fit beside it, as the tick's plan places them
            groups = fitting_groups(groups, model, job.helpers, endpoints, self._memory_mib)
        fn = record[_JOB_FIELDS.index("fn")]
        if fn:  # only where a live GPU worker registers its function, as the tick's plan places it
            fn_hosts, live = function_placement(env.r, env.keys, fn)
            if not live:  # none does: the tick keeps it queued (waiting_for_function)
                return LaneOutcome("no_function")
            on_hosts = [group for group in groups if self._host_of[group[0]] in fn_hosts]
            groups = on_hosts or groups  # none there: as the tick (planner.replay.placeable_hosts)
        lacking = worker_fleets.worker_fleets(env.r, env.keys, hosts, versions, env.whole_fleet or env.fleet
                                              ).hosts_lacking(env.fleet, job.endpoint, job.helpers)
        if lacking:  # not where the live worker's fleet file cannot run it, as the tick's batch leaves it
            groups = [group for group in groups if self._host_of[group[0]] not in lacking]
            if not groups:  # the tick keeps it queued (host_fleet_differs)
                return LaneOutcome("no_worker_fleet")

        def is_warm(group: tuple[str, ...]) -> bool:
            want = instance_value(job.endpoint, group)
            return all(residents.get(gpu) == want for gpu in group)

        now_s = env.now_s()
        args = (groups, unavailable, is_warm, residents, self.kept.starting_gpus)
        placement = place_critical(*args, {}, now_s, model.cold_start_s, None)
        ctx = TickContext(env, self.kept, self.token)
        submitted = float(record[_JOB_FIELDS.index("submitted_at")])
        ctx.formed.meta[job.id] = (record[_JOB_FIELDS.index("traceparent")] or "", submitted,
                                   max(submitted, float(record[_JOB_FIELDS.index("not_before")] or 0.0)))
        ctx.formed.own_level[job.id] = Priority.CRITICAL
        victim_jobs: dict[str, str] = {}
        if placement is None:
            placement, victim_jobs = self._preemption(ctx, args, now_s, model.cold_start_s, down)
            if placement is None:
                return LaneOutcome("no_group")
        chosen_ms = (time.monotonic() - started) * 1000.0
        out = self._lease(ctx, job, placement, now_s, model.cold_start_s, victim_jobs)
        return replace(out, read_ms=read_ms, chosen_ms=chosen_ms)

    def _deps_completed(self, deps: list[str]) -> bool:
        """Whether every job of ``deps`` has completed (one round trip)."""
        pipe = self.env.r.pipeline(transaction=False)
        for dep in deps:
            pipe.hget(self.env.keys.job(dep), "state")
        return all(state == "completed" for state in pipe.execute())

    def _preemption(self, ctx: TickContext, args: tuple, now_s: float, cold_start_s: float,
                    down: set[str]) -> tuple[CriticalPlacement | None, dict[str, str]]:
        """The placement with a preemption (the holders read now, the tick's bounds), or None;
        and lease id -> job id of the leases read (to name a victim's job in the log)."""
        lease_of, info, executed, awaited, server_now_ms = lease_holders(ctx)
        bounded = within_bounds(ctx, info)
        holders: dict[str, Holder | None] = {}
        free_at: dict[str, float] = {gpu: now_s + DOWN_FREE_AFTER_S for gpu in down}
        for gpu, lease_id in lease_of.items():
            if gpu in down:  # no GPU worker to run a preemptor there: not a victim, and not free before the down time
                holders[gpu] = None
                continue
            rec = info.get(lease_id) or {}
            prio = Priority.__members__.get(rec.get("priority", "LOW"), Priority.LOW)
            holders[gpu] = Holder(lease_id, int(prio), rec.get("kind") == "job" and not executed.get(lease_id)
                                  and rec.get("job") not in awaited and bounded.get(lease_id, False))
            # the lease's planned end dated on the server clock, so on this planner's clock
            # whichever leader leased it (makespan.workers.leases.planned_end_s)
            planned_end = planned_end_s(rec, now_s, server_now_ms, ctx.env.settings.time_scale)
            # (a holder past it: as long again as it has overrun, as the tick's fleet state)
            free_at[gpu] = expected_end_s(planned_end, now_s) if planned_end is not None else now_s + DOWN_FREE_AFTER_S
        victim_jobs = {lease_id: rec.get("job", "") for lease_id, rec in info.items()}
        return place_critical(*args, free_at, now_s, cold_start_s, holders), victim_jobs

    def _lease(self, ctx: TickContext, job: PlanJob, placement: CriticalPlacement, now_s: float,
               cold_start_s: float, victim_jobs: dict[str, str] | None = None) -> LaneOutcome:
        """Preempt the placement's victims (``victim_jobs``: lease id -> job id, for the log),
        then lease its group and send the phase chain."""
        env = ctx.env
        for victim in placement.victims:
            outcome = preempt(env.r, env.keys, victim, job.id, planner_token=self.token)
            if outcome == "preemptor_not_queued":  # leased by the tick meanwhile, or cancelled
                return LaneOutcome("lost_race", (), placement.victims)
            if outcome == "preempted":  # requeued with no ETA: the next tick plans it (CrossTickState)
                self.kept.lane_victims += 1
            if outcome in ("preempted", "cancelled"):
                note_preemption(ctx, placement.gpus)
                log.info("critical lane: preempted job %s (lease %s) for CRITICAL job %s: %s",
                         (victim_jobs or {}).get(victim) or "?", victim, job.id, outcome)
            # else it finished executing meanwhile (the lease below is refused while it clears) or its
            # lease ended (its GPUs may be free: the lease below takes them)
        # its helpers start after the main endpoint, in every placement (planner/helpers.py)
        end_s = now_s + (0.0 if placement.load == "warm" else cold_start_s) + held_s(job, self.kept.endpoints)
        if not start_job(ctx, job, placement.gpus, end_s, placement.load):
            return LaneOutcome("lost_race", (), placement.victims)
        outcome = "preempted" if placement.victims else placement.load
        held = tuple((victim_jobs or {}).get(victim) or "" for victim in placement.victims)
        return LaneOutcome(outcome, placement.gpus, placement.victims, tuple(job for job in held if job))


def _plan_job(job_id: str, rec: dict[str, str | None], deps_completed: Callable[[list[str]], bool],
              time_scale: float, now_s: float) -> PlanJob | str:
    """The planner's view of a queued CRITICAL job's record (released as
    :func:`makespan.workers.tick.clock.release_s` says), or why the lane leaves it
    (``deps``: ``deps_completed`` says a job of its record's ``deps`` has not completed)."""
    if rec.get("state") != "queued" or rec.get("priority") != Priority.CRITICAL.name:
        return "not_queued"
    if unreadable_field(rec) is not None:  # a damaged record: the tick cancels it, naming the field
        return "not_queued"
    deps = list(record_deps(rec.get("deps")))
    if deps and not deps_completed(deps):
        return "deps"
    endpoint, service_s, submitted_at = rec.get("endpoint"), rec.get("service_s"), rec.get("submitted_at")
    if not endpoint or service_s is None or submitted_at is None:
        return "not_queued"
    submitted_s = float(submitted_at) / time_scale
    release = release_s(submitted_at, rec.get("not_before"), time_scale, now_s)
    due = rec.get("deadline_s")
    helpers = rec.get("helpers")
    return PlanJob(job_id, endpoint, float(Priority.CRITICAL.weight), release, float(service_s),
                   int(Priority.CRITICAL), (), submitted_s + float(due) if due else None, int(rec.get("seq") or 0),
                   tuple(json.loads(helpers)) if helpers else ())
