"""No starvation: aging, then a reservation with backfill (EASY backfilling), pure.

A batch job that has waited at least ``after_s`` (``now − release_s``; the aging bound,
``Settings.reservation_after_s``) and that the policy's plan starts later than the
earliest time one of its groups is free of the work already running (``free_at``) gets
a **reservation**: that group, from that time (the first such group in group order).
Only one job holds a reservation at a time, the first aged job by level, then release,
then submission (EASY backfilling reserves for the head of the queue only; the next
aged job gets its reservation when this one has started).

:func:`enforce` rebuilds the policy's plan around the reservation, as a list schedule in
the plan's start order on a :class:`makespan.planner.replay.Replay` of the state:

1. **backfill**: each other job in the plan's order is placed at its earliest time on
   its planned group, if that group has no GPU of the reserved group, if it ends by
   the reservation's start there, or if it is of a higher level than the reserved job
   (a reservation never makes a job wait for a lower level: a HIGH job is not deferred
   behind an aged NORMAL one, as a CRITICAL/HIGH preemption may take the group too);
   otherwise it is deferred;
2. the reserved job is placed on its group at the reservation's start (nothing placed
   in step 1 ends after it on those GPUs);
3. the deferred jobs, in the plan's order, each on the group of its endpoint where it
   ends first (ties: group order).

The result is evaluated (:func:`makespan.planner.evaluator.evaluate`): a feasible plan of
the same batch. When the plan already starts the aged job by its reservation, or no job
is aged, the plan is returned unchanged.

The bound: a job with no higher-level job taking (or preempting into) its group starts at most
``after_s`` + the remaining time of the work running on its earliest group when it aged
(the backfilled jobs end before the reservation) + its transition after it was
released. The live planner (:mod:`makespan.workers.planner_worker`) and the simulator
(:mod:`makespan.planner.simulator`) both call :func:`enforce` on every plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from makespan.planner.evaluator import TOL_S, evaluate_retimed
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.replay import Replay

Group = tuple[str, ...]
DEFAULT_RESERVATION_AFTER_S = 3600.0  # the aging bound, s (Settings.reservation_after_s; bench/RESULTS.md)


@dataclass(frozen=True)
class Reservation:
    """``job_id`` holds ``gpus`` from ``start_s`` (workload s); ``waited_s`` = now − release;
    ``deferred``: the jobs :func:`enforce` moved behind it (they would have held its GPUs
    past ``start_s``)."""

    job_id: str
    gpus: Group
    start_s: float
    waited_s: float
    deferred: tuple[str, ...] = ()


def aged_job(batch: Sequence[PlanJob], state: FleetState, after_s: float) -> PlanJob | None:
    """The first job of ``batch`` (level, release, submission order) that has waited at
    least ``after_s``, whose dependencies are all done; None when none has."""
    now = state.now_s
    ids = {j.id for j in batch}
    aged = [j for j in batch if now - j.release_s >= after_s - TOL_S
            and all(d not in ids and state.end_of.get(d, now) <= now + TOL_S for d in j.deps)]
    return min(aged, key=lambda j: (j.priority, j.release_s, j.seq)) if aged else None


def reservation_for(job: PlanJob, state: FleetState) -> Reservation | None:
    """The earliest group of ``job``'s endpoint free of the running work, and when."""
    ep = state.endpoints.get(job.endpoint)
    if ep is None:
        return None
    now = state.now_s
    best: tuple[float, Group] | None = None
    for g in state.groups(ep.tp, ep.memory_mib) if not job.narrowed else Replay(state).job_groups(job):
        t = max(now, job.release_s, *(state.free_at.get(u, now) for u in g))
        if best is None or t < best[0] - TOL_S:
            best = (t, g)
    return None if best is None else Reservation(job.id, best[1], best[0], now - job.release_s)


def enforce(p: Plan, batch: Sequence[PlanJob], state: FleetState, after_s: float | None,
            objective: str = "weighted_completion") -> tuple[Plan, list[Reservation]]:
    """``p`` with the aged job's reservation honoured (module doc), and the reservations
    (at most one; [] when ``after_s`` is None or no job has aged; with one, the plan's
    ``stats['reserved']`` is 1, which :func:`makespan.planner.fast_lane.enforce` reads). ``p`` must be a plan of
    ``batch`` on ``state`` without preemptions (a plan with preemptions is returned as is);
    a rebuilt plan has no restores (plan them after, :func:`makespan.planner.restore.with_restores`)
    and is scored with ``objective``."""
    if after_s is None or not batch or p.preemptions:
        return p, []
    job = aged_job(batch, state, after_s)
    if job is None:
        return p, []
    res = reservation_for(job, state)
    if res is None:
        return p, []
    mine = p.by_job().get(job.id)
    if mine is not None and mine.start_s <= res.start_s + TOL_S:
        p.stats["reserved"] = 1.0
        return p, [res]
    jobs = {j.id: j for j in batch}
    rep = Replay(state)
    reserved = set(res.gpus)
    out: list[Assignment] = []
    deferred: list[PlanJob] = []
    for a in sorted(p.assignments, key=lambda a: (a.start_s, a.end_s)):
        j = jobs[a.job_id]
        if j.id == job.id:
            continue
        g = tuple(a.gpus)
        if reserved.isdisjoint(g) or j.priority < job.priority:  # a higher level is never held back
            out.append(rep.place(j, g))
            continue
        trial = rep.copy().place(j, g)
        if trial.end_s <= res.start_s + TOL_S:  # backfill: ends before the reservation
            out.append(rep.place(j, g))
        else:
            deferred.append(j)
    out.append(rep.place(job, res.gpus, max(res.start_s, rep.group_free(res.gpus), rep.ready(job))))
    for j in deferred:
        ep = state.endpoints[j.endpoint]
        g = min(rep.job_groups(j), key=lambda g: max(rep.ready(j), rep.group_free(g)) + rep.transition_s(g, ep))
        out.append(rep.place(j, g))
    ev = evaluate_retimed(out, batch, state, p.policy, objective)
    if ev is None:  # no consistent timing of the rebuild (evaluate_retimed): the policy's plan stands
        p.stats["reservation_unrebuilt"] = 1.0
        p.stats["reserved"] = 1.0
        return p, [res]
    ev.stats["reservation_deferred"] = float(len(deferred))
    ev.stats["reserved"] = 1.0
    return ev, [replace(res, deferred=tuple(j.id for j in deferred))]
