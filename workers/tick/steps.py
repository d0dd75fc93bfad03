"""The planner tick's steps, and :data:`TICK_STEPS`: the one place that lists them in the
order the tick runs them.

Each step is an object with a ``name`` and ``run(ctx)``; it reads what the steps before
it wrote to the :class:`~makespan.workers.tick.context.TickContext` and decides itself
whether it applies (a step that needs a batch does nothing without one). The small
steps live here; the larger ones beside their helpers:

=============================  ==============================================  ====================
step                           what it does                                    module
=============================  ==============================================  ====================
``SweepRetention``             at most one bounded sweep of finished state     here
``PromoteDelayed``             due delayed jobs join their queue               here
``RehomeQueued``               jobs no planner of their pool plans: moved      ``pool_rehome``
``ReadSnapshot``               one round trip: leases, GPUs, queue heads       ``fleet_view``
``ReclaimExpired``             expired leases reclaimed; snapshot read again   here
``ReapAgenda``                 agenda entries reaped                           here
``FollowKeptPlan``             start the kept plan's next jobs, end the tick   ``follow``
``FormBatch``                  the batch, strict priority                      ``batch``
``ReadFleet``                  the planner's FleetState                        ``fleet_view``
``NoteDemand``                 future-cost inputs from recent arrivals         ``fleet_view``
``PlanBatch``                  plan, reservation, fast lane                    here
``StartPlanned``               lease and send what starts now                  ``starts``
``Preempt``                    preempt for waiting CRITICAL/HIGH jobs          ``preemption``
``PublishPlan``                the plan to ``P:plan`` for the dashboard        here
``RestorePlanned``             the plan's set-point restores that start now    ``drain``
``OfferRest``                  the jobs left queued go to the improver         here
``WriteWaitReasons``           each waiting job's reason and ETA               ``wait_reasons``
``SetPointsAndDrain``          idle: restore set points, check the drain       ``drain``
``PrewarmSleepers``            idle groups: wake sleepers ahead of demand      ``prewarm``
``KeepPlan``                   keep the plan for following ticks               ``follow``
=============================  ==============================================  ====================
"""

from __future__ import annotations

import json
import logging
from typing import Protocol

from makespan import metrics
from makespan.planner import fast_lane
from makespan.planner.api import lane_replan, plan
from makespan.planner.policies import POLICY_REGISTRY
from makespan.planner.replay import state_after
from makespan.planner.reservation import enforce
from makespan.workers.batch import FormBatch
from makespan.workers.host_liveness import mark_unconsumed
from makespan.workers.drain import RestorePlanned, SetPointsAndDrain
from makespan.workers.follow import FollowKeptPlan, KeepPlan
from makespan.workers.fleet_view import NoteDemand, ReadFleet, ReadSnapshot, read_snapshot
from makespan.workers.plan_view import publish_plan
from makespan.workers.pool_rehome import RehomeQueued
from makespan.workers.preemption import Preempt
from makespan.workers.prewarm import PrewarmSleepers
from makespan.workers.starts import StartPlanned
from makespan.workers.tick.clock import starts_now
from makespan.workers.tick.context import TickContext
from makespan.workers.wait_reasons import WriteWaitReasons

log = logging.getLogger("makespan.planner")



class Step(Protocol):
    """One part of the tick."""

    name: str

    def run(self, ctx: TickContext) -> None:
        """Do this step's part of the tick on ``ctx`` (read what earlier steps wrote).

        Raises:
            LeaseError: the planner was fenced off (the loop stands by).
            redis.RedisError, StoreError: Redis failed (the loop counts a failed tick)."""
        ...


class SweepRetention:
    """Step: bounded state, at most one retention sweep per tick (:mod:`makespan.workers.retention`)."""

    name = "sweep retention"

    def run(self, ctx: TickContext) -> None:
        ctx.env.retention.maybe_sweep()


class PromoteDelayed:
    """Step: due delayed jobs (``delay_s``, retry backoff) join their queue (fenced by the token)."""

    name = "promote delayed"

    def run(self, ctx: TickContext) -> None:
        ctx.env.delayed.promote(ctx.token)


class ReclaimExpired:
    """Step: reclaim the leases the snapshot found expired (requeue, delay or fail their
    jobs), then read the snapshot again (the reclaims freed GPUs and requeued jobs)."""

    name = "reclaim expired leases"

    def run(self, ctx: TickContext) -> None:
        snapshot = ctx.snapshot
        assert snapshot is not None, "ReadSnapshot runs before ReclaimExpired"
        if not snapshot.expired_leases:
            return
        env, settings = ctx.env, ctx.env.settings
        expired_hosts = _untried_lease_hosts(ctx, snapshot.expired_leases)
        reclaimed_jobs: dict[str, list[str]] = {}
        reclaimed = env.leases.reclaim_expired(settings.max_attempts, settings.retry_backoff_s,
                                               settings.retry_backoff_max_s, expired=list(snapshot.expired_leases),
                                               jobs=reclaimed_jobs)
        # a host no GPU worker ever announced whose lease expired with no phase claimed is down
        # from now on (makespan.workers.host_liveness): not leased again at each expiry
        unconsumed = mark_unconsumed(env.r, env.keys, expired_hosts, "a lease there expired")
        if unconsumed:
            log.warning("no GPU worker has consumed host(s) %s: a lease there expired unconsumed; no new lease there "
                        "until a worker starts (`makespan gpu-worker --fleet FLEET --host HOST`)", ", ".join(unconsumed))
        # live: renewed meanwhile; unreclaimable: a record its script cannot read (logged by the store)
        ended = {outcome: n for outcome, n in reclaimed.items() if outcome not in ("live", "unreclaimable")}
        ctx.reclaimed = sum(ended.values())
        if ended:
            log.warning("reclaimed expired leases: %s%s", ended, _named_jobs(reclaimed_jobs))
            for _ in range(ctx.reclaimed):
                metrics.lease_reclaimed("lease_expired")
        if reclaimed.get("requeued") and settings.retry_backoff_s > 0:  # now in P:delayed: wake up
            first_wait_s = min(settings.retry_backoff_s, settings.retry_backoff_max_s)
            env.delayed.note_due(env.delayed.server_now_s() + first_wait_s)  # when the first is due
        ctx.snapshot = read_snapshot(env, ctx.kept)


def _named_jobs(jobs: dict[str, list[str]], most: int = 8) -> str:
    """'; jobs requeued: a, b; failed: c' for a reclaim log line (``most`` ids per outcome,
    then a count), or '' when no lease held a job."""
    parts = [f"{outcome}: {', '.join(ids[:most])}" + (f" (+{len(ids) - most} more)" if len(ids) > most else "")
             for outcome, ids in sorted(jobs.items()) if outcome != "live"]
    return "; jobs " + "; ".join(parts) if parts else ""


def _untried_lease_hosts(ctx: TickContext, lease_ids: tuple[str, ...]) -> set[str]:
    """The fleet hosts of the GPUs of those of ``lease_ids`` no phase of which was claimed
    (nobody consumed their message; their lease records' ``gpus``, one round trip)."""
    pipe = ctx.env.r.pipeline(transaction=False)
    for lease_id in lease_ids:
        pipe.hget(ctx.env.keys.lease(lease_id), "gpus")
        pipe.exists(ctx.env.keys.phase(lease_id))
    replies = pipe.execute()
    host_of = {gpu.uuid: gpu.host for gpu in ctx.env.gpus}
    hosts = set()
    for raw, claimed in zip(replies[::2], replies[1::2]):
        try:
            gpus = json.loads(raw) if raw and not claimed else []
        except ValueError:
            continue
        hosts |= {host_of[gpu] for gpu in gpus if gpu in host_of}
    return hosts


class ReapAgenda:
    """Step: reap the agenda (:mod:`makespan.workers.agenda`) when the snapshot saw open entries."""

    name = "reap agenda"

    def run(self, ctx: TickContext) -> None:
        assert ctx.snapshot is not None, "ReadSnapshot runs before ReapAgenda"
        if ctx.env.agenda is not None and ctx.snapshot.agenda_entries:
            ctx.env.agenda.reap()


class PlanBatch:
    """Step: the batch's plan. A solver policy plans its greedy floor now and takes the
    background improver's better plan when it has one; the others call ``plan`` with the
    solve limit. Then the aged job's reservation (:func:`makespan.planner.reservation.enforce`,
    backfilled) and the fast lane's levels (:func:`makespan.planner.fast_lane.enforce`: no class
    worse off than strict priority). The solve time is observed and kept for the next
    snapshot. Writes ``plan`` (published for the dashboard by :class:`PublishPlan`) and
    ``reservations``; a planned batch ends the idle period (``kept.idle_checked``)."""

    name = "plan"

    def run(self, ctx: TickContext) -> None:
        if not ctx.batch:
            return
        env, kept, state, batch = ctx.env, ctx.kept, ctx.fleet_state, ctx.batch
        assert state is not None, "ReadFleet runs before PlanBatch"
        settings = env.settings
        kept.idle_checked = False
        policy = POLICY_REGISTRY.lookup(settings.policy)
        objective = policy.objective
        started_at_s = env.clock.monotonic()
        if kept.improver is not None:  # a solver policy: greedy floor now, CP-SAT off the tick
            floor = plan(batch, state, POLICY_REGISTRY.floor_of(policy) or policy)
            chosen = kept.improver.best(floor, batch, state)
        else:
            chosen = plan(batch, state, settings.policy, time_limit_s=settings.solve_time_limit_s)
        chosen, reservations = enforce(chosen, batch, state, settings.reservation_after_s, objective)
        ctx.reservations = {reservation.job_id: reservation for reservation in reservations}
        after_s = settings.reservation_after_s
        kept.next_aging_s = min((job.release_s + after_s for job in batch if after_s is not None
                                 and job.id not in ctx.reservations and job.release_s + after_s > state.now_s),
                                default=float("inf"))
        chosen, _late = fast_lane.enforce(chosen, batch, state, settings.fast_lane_levels, objective=objective,
                                          replan=lane_replan(policy), start_grace_s=settings.fast_lane_start_grace)
        solve_s = env.clock.monotonic() - started_at_s
        metrics.observe_solve(solve_s, len(batch))
        kept.starting_gpus = frozenset(gpu for assignment in chosen.assignments  # the critical lane avoids them
                                       if starts_now(assignment.start_s, state.now_s) for gpu in assignment.gpus)
        kept.solve_stats.append(f"{solve_s:.6f}:{len(batch)}")  # written with the next snapshot
        ctx.plan = chosen  # published for the dashboard by PublishPlan, once the starts are leased


class PublishPlan:
    """Step: the tick's plan to ``P:plan`` for the dashboard (:func:`makespan.workers.plan_view.publish_plan`),
    after the starts and preemptions are leased and sent: the JSON document is off the
    path from the plan to the GPUs."""

    name = "publish plan"

    def run(self, ctx: TickContext) -> None:
        if not ctx.batch or ctx.plan is None or ctx.fleet_state is None:
            return
        env = ctx.env
        publish_plan(env.r, env.keys, ctx.plan, ctx.batch, ctx.fleet_state.now_s, env.settings.time_scale)


class OfferRest:
    """Step, for a solver policy: hand the jobs this tick left queued to the background
    improver, on the fleet as the plan's starts of this tick (``started``) leave it,
    replayed (GPUs busy until their planned end, evicted endpoints asleep where they
    have a sleep mode). Jobs started by preemption keep the victims' GPUs busy as the
    state has them. Only when the plan's horizon makes a solve worth it."""

    name = "offer the rest to the improver"

    def run(self, ctx: TickContext) -> None:
        improver, state, plan_now = ctx.kept.improver, ctx.fleet_state, ctx.plan
        if improver is None or not ctx.batch:
            return
        assert state is not None and plan_now is not None, "PlanBatch runs before OfferRest"
        rest = [job for job in ctx.batch if job.id not in ctx.dispatched]
        last_end_s = max((assignment.end_s for assignment in plan_now.assignments), default=state.now_s)
        horizon_s = (last_end_s - state.now_s) * ctx.env.settings.time_scale
        if not rest or not improver.worth_solving(horizon_s):
            return
        jobs = {job.id: job for job in ctx.batch}
        improver.offer(rest, state_after(state, jobs, plan_now.assignments, ctx.started))


TICK_STEPS: tuple[Step, ...] = (
    SweepRetention(),
    PromoteDelayed(),
    RehomeQueued(),
    ReadSnapshot(),
    ReclaimExpired(),
    ReapAgenda(),
    FollowKeptPlan(),
    FormBatch(),
    ReadFleet(),
    NoteDemand(),
    PlanBatch(),
    StartPlanned(),
    Preempt(),
    PublishPlan(),
    RestorePlanned(),
    OfferRest(),
    WriteWaitReasons(),
    SetPointsAndDrain(),
    PrewarmSleepers(),
    KeepPlan(),
)
"""The tick, in order (module doc's table). :class:`makespan.workers.planner_worker.PlannerWorker`
runs them over one fresh context per tick."""
