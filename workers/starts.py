"""Starting planned jobs for the planner worker: lease, then send the phase chain.

The tick's step is :class:`StartPlanned`: every assignment of the plan that starts now
on GPUs not yet taken, leased in priority order (a CRITICAL job's lease is never issued
after a LOW job's of the same tick), then submission order.

:func:`start_many` leases every (job, GPUs, planned end in workload s, load) in order:
one :meth:`makespan.workers.leases.LeaseStore.acquire_many` round trip (each lease its
own atomic script, the job acknowledged in the same step) and one write of their phase
chains, however few they are, or one ``allocate_gpus`` span per lease when tracing is on
(:func:`start_job`, also the preemption path's way to start one job). For every lease
published, ``_after_lease`` records the wait metric (a job's first lease) and sends
the job's phase chain to its host's queue (:func:`send`: the injected ``dispatch`` or
:func:`makespan.workers.publish.dispatch` through the Celery app of the planner's own
settings, ``TickEnv.celery``). A send that fails is logged, not raised: the
lease is never renewed, so it expires and the reaper requeues the job.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from makespan import metrics, telemetry
from makespan.errors import LeaseError
from makespan.models import Priority
from makespan.planner.model import PlanJob
from makespan.workers.leases import Lease
from makespan.workers.phases import PhaseContext, instance_value
from makespan.workers.tick.clock import starts_now
from makespan.workers.tick.context import TickContext, TickEnv

log = logging.getLogger("makespan.planner")

Start = tuple[PlanJob, tuple[str, ...], float, str]  # (job, GPU UUIDs, planned end in workload s, load)


class StartPlanned:
    """Step: lease and send the plan's assignments that start now (module doc). Extends
    ``taken`` with their GPUs and writes ``started`` and ``dispatched``.

    Raises:
        LeaseError: the planner was fenced off (after sending what it leased before)."""

    name = "start"

    def run(self, ctx: TickContext) -> None:
        if not ctx.batch:
            return
        assert ctx.plan is not None and ctx.fleet_state is not None, "PlanBatch runs before StartPlanned"
        now_s = ctx.fleet_state.now_s
        jobs = {job.id: job for job in ctx.batch}
        ctx.taken = set(ctx.held_gpus)
        starts: list[Start] = []
        for assignment in sorted(ctx.plan.assignments, key=lambda planned: (planned.start_s, planned.end_s)):
            if not starts_now(assignment.start_s, now_s) or ctx.taken.intersection(assignment.gpus):
                continue
            ctx.taken.update(assignment.gpus)
            starts.append((jobs[assignment.job_id], assignment.gpus, assignment.end_s, assignment.load))
        starts = _lane_swaps(ctx, starts, now_s)
        # everything here starts now: lease in priority order, then submission order
        starts.sort(key=lambda start: (start[0].priority, start[0].seq))
        ctx.started = start_many(ctx, starts)
        ctx.dispatched |= ctx.started


def _lane_swaps(ctx: TickContext, starts: list[Start], now_s: float) -> list[Start]:
    """``starts`` with each start the fast lane's rule would preempt at once given to the lane
    job it would preempt it for (the rule's group, planned end and load), the lower-level job
    left queued (not leased). The rule (:func:`makespan.planner.fast_lane.rule_preemptions`)
    runs after the tick's starts at the next tick's ``Preempt`` step, where a job this tick
    leased is a victim like any other: a tick leased NORMAL jobs and the next one preempted
    them for a waiting HIGH job 10–40 ms later, a run thrown away and a preemption of the
    victim's budget spent each time (a pools operator). Here, before any lease, only this
    tick's lower-level starts are swapped: nothing that runs is cut here. When the rule's victims
    are such a start and jobs already running (a gang's group), the start is left queued and
    the ``Preempt`` step of the same tick takes the running ones for the lane job."""
    settings = ctx.env.settings
    state, plan = ctx.fleet_state, ctx.plan
    if not starts or state is None or plan is None:
        return starts
    starting = {start[0].id for start in starts}
    waiting = [job for job in ctx.batch if job.id not in starting and job.id not in ctx.dispatched]
    if not any(job.priority <= Priority.HIGH for job in waiting):  # the common tick: read no setting
        return starts
    grace = settings.fast_lane_start_grace
    lane_levels = [job.priority for job in waiting if job.priority in grace and job.priority <= Priority.HIGH]
    if not lane_levels:
        return starts
    top = min(lane_levels)
    candidates = {start[0].id: start for start in starts if start[0].priority > top}
    if not candidates:
        return starts
    from makespan.planner import fast_lane, preemption_plan
    from makespan.planner.model import RunningJob
    from makespan.planner.policies import POLICY_REGISTRY
    from makespan.planner.replay import state_after
    from makespan.workers.running import lease_holders, running_jobs

    scored = settings.preemption == "plan" and POLICY_REGISTRY.lookup(settings.policy).floor is not None

    jobs = {job.id: job for job in ctx.batch}
    # the jobs already running (from earlier ticks) are victims as the Preempt step sees them
    lease_of, info, executed, awaited, _server_now_ms = lease_holders(ctx)
    running = dict(running_jobs(ctx, state, lease_of, info, executed, awaited)[0])
    for job, gpus, end_s, _load in candidates.values():
        held = RunningJob(job, tuple(gpus), now_s, now_s, end_s, preemptable=True)
        running.update({gpu: held for gpu in gpus})
    after = state_after(state, jobs, plan.assignments, starting, running=running)
    forced = fast_lane.rule_preemptions(preemption_plan.Branch(after, waiting, None, [], [], []),
                                        settings.fast_lane_levels, grace)
    if not forced.taken:
        return starts
    dropped: set[str] = set()
    added: list[Start] = []
    for decision, assignment in zip(forced.taken, forced.starts):
        ours = set(decision.victims) & (set(candidates) - dropped)
        if not ours:
            continue  # only running jobs: the Preempt step's rule takes them, this tick
        if ours != set(decision.victims):
            # running jobs too (a gang's group part running, part starting now): the start is
            # not leased; the Preempt step preempts the running ones and starts the lane job,
            # by this same rule only when it scores preemptions (else its own rule decides)
            if not scored:
                continue
            dropped |= ours
            log.info("left %s queued: the fast lane's rule preempts for %s job %s on its GPUs",
                     ", ".join(sorted(ours)), Priority(jobs[decision.job_id].priority).name, decision.job_id)
            continue
        victim_gpus = {gpu for victim in decision.victims for gpu in candidates[victim][1]}
        # only a group its victims' starts hold, and free GPUs nothing else of this tick takes
        if (set(decision.gpus) - victim_gpus) & ctx.taken:
            continue
        dropped |= set(decision.victims)
        ctx.taken.update(decision.gpus)
        added.append((jobs[decision.job_id], tuple(decision.gpus), assignment.end_s, assignment.load))
        log.info("started %s job %s instead of %s (the fast lane's rule would preempt %s at once)",
                 Priority(jobs[decision.job_id].priority).name, decision.job_id, ", ".join(decision.victims),
                 "it" if len(decision.victims) == 1 else "them")
    if not dropped:
        return starts
    kept = [start for start in starts if start[0].id not in dropped]
    now_taken = {gpu for start in added for gpu in start[1]}
    for start in starts:  # a dropped start's GPUs that no lane job took are free again
        if start[0].id in dropped:
            ctx.taken.difference_update(set(start[1]) - now_taken)
    return kept + added


def start_many(ctx: TickContext, starts: list[Start]) -> set[str]:
    """Lease and send every (job, gpus, planned end, load) of ``starts``, in order;
    the leases in one round trip (each its own atomic script) and their phase chains in
    one write (:func:`publishing`), also for a single start (a followed tick often starts
    one job), unless tracing is on (then one ``allocate_gpus`` span per lease,
    :func:`start_job`). Returns the ids of the jobs started.

    Raises:
        LeaseError: the planner was fenced off (after sending what it leased before).
    """
    if not starts:
        return set()
    if telemetry.tracing_enabled():
        return {start[0].id for start in starts if start_job(ctx, *start)}
    requests = [_lease_request(ctx, *start) for start in starts]
    leases, fenced = ctx.env.leases.acquire_many(requests)
    with publishing(ctx.env) as producer:  # every phase chain of this round in one write
        started = {start[0].id for start, request, lease in zip(starts, requests, leases)
                   if lease is not None and _after_lease(ctx, start[0], start[1], request["holder"], lease, producer)}
    if fenced:
        raise LeaseError("planner fencing token is stale: another planner leads")
    return started


def own_priority(ctx: TickContext, job: PlanJob) -> Priority:
    """The level ``job`` was submitted at (its queue and record), which may be below the
    level it is planned at (priority through dependencies, :mod:`makespan.workers.batch`)."""
    own = ctx.formed.own_level.get(job.id)
    return own if own is not None else Priority(job.priority)


def note_preemption(ctx: TickContext, gpus: tuple[str, ...] | list[str]) -> None:
    """A job on ``gpus`` was just preempted: for ``Settings.cancel_grace_s`` its phase task
    may hold a slot of that host's GPU worker while it winds down (:func:`_lease_request`)."""
    if gpus:
        ctx.kept.preempted_at[ctx.env.fleet.host_of(gpus[0])] = time.monotonic()


def _lease_request(ctx: TickContext, job: PlanJob, gpus: tuple[str, ...], end_s: float, load: str) -> dict[str, Any]:
    """The :meth:`LeaseStore.acquire` arguments of a job lease. On a host with a preemption
    in the last ``Settings.cancel_grace_s`` (:func:`note_preemption`) the victims' phase
    tasks may hold its GPU worker's slots while they wind down (a function that ignores
    ``ctx.cancelled`` runs that much longer): the lease's first TTL is that much longer too,
    so it is not reclaimed (an attempt counted) while its first phase waits for a slot."""
    env = ctx.env
    host = env.fleet.host_of(gpus[0])
    winding_down = time.monotonic() - ctx.kept.preempted_at.get(host, float("-inf")) < env.settings.cancel_grace_s
    ttl_s = env.settings.lease_ttl_s + (env.settings.cancel_grace_s if winding_down else 0.0)
    priority = own_priority(ctx, job)
    # planned_s: the planned duration from the grant (workload s); a reader dates it from the
    # lease's granted_ms on the server clock (makespan.workers.leases.planned_end_s), not from
    # planned_end_s, which is on this planner's clock
    planned_s = end_s - env.now_s()
    return dict(lease_id=uuid.uuid4().hex, gpus=gpus, ttl_s=ttl_s, job_id=job.id, kind="job",
                holder=host, queue=env.keys.queue(priority), planner_token=ctx.token,
                info={"planned_end_s": repr(end_s), "planned_s": repr(planned_s), "endpoint": job.endpoint,
                      "priority": priority.name},
                event={"endpoint": job.endpoint, "priority": priority.name, "host": host, "load": load,
                       "planned_s": planned_s}, instance=instance_value(job.endpoint, gpus))


def start_job(ctx: TickContext, job: PlanJob, gpus: tuple[str, ...], end_s: float, load: str) -> bool:
    """Lease ``gpus`` for ``job`` (planned to end at ``end_s``, workload s) and send its
    phase chain. False if the lease failed (a GPU taken meanwhile, the job gone)."""
    request = _lease_request(ctx, job, gpus, end_s, load)
    traceparent = ctx.formed.meta.get(job.id, ("", 0.0, 0.0))[0]
    attrs = {"job_id": job.id, "priority": own_priority(ctx, job).name, "endpoint": job.endpoint,
             "gpus": list(gpus), "host": request["holder"], "lease_id": request["lease_id"],
             "planned_s": end_s - ctx.env.now_s()}
    with telemetry.phase_span("allocate_gpus", traceparent, attrs):
        lease = ctx.env.leases.acquire(**request)
    return lease is not None and _after_lease(ctx, job, gpus, request["holder"], lease)


def _after_lease(ctx: TickContext, job: PlanJob, gpus: tuple[str, ...], host: str, lease: Lease,
                 producer: Any = None) -> bool:
    """After ``lease`` was published for ``job``: metrics, and send its phase chain
    (``producer``: :func:`publishing`'s, or None)."""
    priority = own_priority(ctx, job)
    traceparent, submitted, waiting_since = ctx.formed.meta.get(job.id, ("", 0.0, 0.0))
    if submitted and lease.first:  # one wait per job: to its first start, not again after a preemption or retry;
        # from its due time when it was delayed (a delay the producer asked for is no wait)
        metrics.observe_wait(priority, max(0.0, ctx.env.clock.now() - waiting_since))
    phase_ctx = PhaseContext(lease.lease_id, lease.token, list(gpus), host, "job", job.endpoint, job.id, priority.name,
                             job.service_s, traceparent=traceparent, submitted_at=submitted,
                             sleep_levels=planned_sleep_levels(ctx, job.id))
    for gpu in gpus:
        ctx.kept.last_traceparent[gpu] = traceparent
    with telemetry.use_traceparent(traceparent):
        send(ctx.env, phase_ctx, host, lease.warm, producer)
    return True


def planned_sleep_levels(ctx: TickContext, job_id: str) -> dict[str, int] | None:
    """The tick plan's transition choice for ``job_id``'s evicts (``Assignment.sleep_levels``,
    issue 20 point 3): endpoint -> sleep level, 0 = stop; None when the plan did not choose."""
    if ctx.plan is None:
        return None
    for assignment in ctx.plan.assignments:
        if assignment.job_id == job_id:
            return dict(assignment.sleep_levels) if assignment.sleep_levels else None
    return None


@contextmanager
def publishing(env: TickEnv) -> Iterator[Any]:
    """A producer for :func:`send` whose messages reach the broker in one write when the
    block ends (:func:`makespan.workers.publish.publish_batch` of ``env.celery``): a tick's
    phase chains cost one round trip, not one per message. None with an injected ``dispatch`` (tests). A
    write that fails is logged, not raised: as with :func:`send`, those leases are never
    renewed, so they expire and the reaper requeues their jobs."""
    if env.dispatch is not None:
        yield None
        return
    from makespan.workers.publish import publish_batch

    batch = publish_batch(env.celery)
    try:
        producer = batch.__enter__()
    except Exception as e:  # noqa: BLE001 - no producer: each send takes one from the pool
        log.warning("no batched publish this round (%r): sending one by one", e)
        yield None
        return
    try:
        yield producer
    except BaseException:
        batch.__exit__(*sys.exc_info())  # discards what was not written; the error goes on
        raise
    try:
        batch.__exit__(None, None, None)  # the one write
    except Exception as e:  # noqa: BLE001 - recovered through lease expiry, see above
        log.error("sending this round's phase chains failed: %r; their leases will expire and be reclaimed", e)


def send(env: TickEnv, phase_ctx: PhaseContext, host: str, warm: bool = False, producer: Any = None) -> None:
    """Send the phase chain ``phase_ctx`` to ``host``'s queue (``producer``: a batch's from
    :func:`publishing`, or None), through ``env.celery`` (the planner's own Redis and key
    prefix) unless a ``dispatch`` is injected. A publish that fails (broker connection lost mid-send;
    kombu may raise more than redis errors then) must not kill the planner: the lease is
    never renewed, so it expires and the reaper requeues the job."""
    try:
        if env.dispatch is not None:
            env.dispatch(phase_ctx, env.keys.host_queue(host))
        else:
            from makespan.workers.publish import dispatch

            dispatch(env.celery, phase_ctx, env.keys.host_queue(host), warm, producer)
    except Exception as e:  # noqa: BLE001 - recovered through lease expiry, see above
        log.error("dispatch of lease %s (job %s) failed: %r; it will expire and be reclaimed",
                  phase_ctx.lease_id, phase_ctx.job_id or phase_ctx.kind, e)
