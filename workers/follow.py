"""Following the last plan: a tick that starts the plan's next jobs without re-planning.

A full tick reads up to ``batch_size`` queued jobs, plans all of them and starts the few
whose GPUs are free now; the rest of that plan says which job goes next on each GPU. When
the next tick is woken by nothing but lease releases (the common case of a deep queue of
short jobs: each release frees a GPU or two), re-planning the whole batch to start those
few again costs the planner the batch's read, plan, wait reasons and plan document at
every release (bench/RESULTS.md, "Following the last plan").

:class:`KeepPlan` (the last step of a full tick) keeps the tick's plan when following it is
safe: no preemption, dependency or active workload in it, no CRITICAL or HIGH
job in its batch (their guarantees are the full tick's: fast lane, preemption).
:class:`FollowKeptPlan` (right after the snapshot, the reclaim and the agenda) then starts,
on the GPUs free at the snapshot, each kept assignment that is the next unstarted one on
every GPU of its group — the plan's own order on each GPU, shifted earlier, so no job of
the plan starts later than planned (an aged job's reservation holds: the jobs before it
on its group were placed to end before it, and end earlier still), and, on a free warm
instance the plan has nothing more for, the earliest-planned job of that endpoint and size
(:func:`next_starts`) — and the tick ends there (the steps marked ``when_followed`` still
run). It follows only while all of this holds, else the full tick runs and keeps a fresh
plan:

* the kept plan is at most ``Settings.plan_follow_s`` old (wall s; 0 turns following off),
  so the improver's better plans, set-point restores and the queue's other jobs wait at
  most that long for a full tick;
* no expired lease was reclaimed this tick, no workload is active, and the hosts that take
  no new lease (down, or cordoned: :mod:`makespan.workers.host_liveness`) are the ones of
  the plan's snapshot (their GPUs are neither free nor started on while it is followed; a
  host that goes down or comes back, or a cordon that changes, makes the next tick plan);
* no kept job that had not aged when the plan was made has reached the aging bound
  (``Settings.reservation_after_s``) since: it may need a reservation, which only a full
  tick gives; and the tick after the one that starts the job holding the plan's
  reservation is a full one (the next aged job gets its reservation there);
* no queued job should go before the kept ones in a fresh plan: no CRITICAL or HIGH job
  heads its queue; each queued job the plan did not read (or read and started, and that is
  queued again: a preemption's victim) comes after every kept job of its level, at a level
  no kept job is less urgent than (a new NORMAL job is planned at once when the plan still
  holds LOW jobs), has no deadline, dependencies or helper endpoints, and, when there is
  any such job, every job the tick starts is of the one class (endpoint, service time,
  level) all of them are of — a fresh plan could not tell them apart, and the kept ones
  were queued first (a shorter job, one with a deadline, or longer kept jobs about to
  start ahead of a queued short one: the full tick plans). So a deep queue of like jobs
  is followed as it slides into the batch; a mixed one is followed only while the whole
  queue is in the plan;
* every GPU free at the snapshot gets a job (a free GPU the plan leaves idle, or one whose
  next job waits for a GPU still held, is the full tick's to decide).

A kept job whose lease fails because it is gone (cancelled) is passed over; one whose GPU
was taken meanwhile (the critical lane) stays next there. A tick that starts nothing falls
through to the full tick. A followed tick writes no wait reasons: the first tick at least
:data:`makespan.workers.batch.REASON_REFRESH_S` after the last formed batch forms one again
(also with every GPU held), so queued jobs' reasons and ETAs are about a second old at most.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from makespan.models import Priority
from makespan.planner.model import Assignment, PlanJob
from makespan.workers.phases import parse_instance
from makespan.workers.starts import Start, start_many
from makespan.workers.tick.context import FormedBatch, KeptPlan, TickContext, TickEnv

FOLLOW_LEVELS = frozenset({Priority.NORMAL, Priority.LOW})  # levels a followed plan may hold
JobClass = tuple[str, float, Priority]  # what a fresh plan tells plain jobs apart by: endpoint, service s, level


def next_starts(kept_plan: KeptPlan, unavailable: set[str], residents: dict[str, str | None]) -> list[Assignment]:
    """What to start now, from ``kept_plan``, on the GPUs outside ``unavailable`` (``residents``: GPU ->
    its resident instance value), in the plan's start order:

    1. each unstarted assignment that is the next one on every GPU of its group, its
       GPUs all available (the plan's order on each GPU, shifted earlier);
    2. then, on an available instance whose GPUs the plan has nothing more for, the
       earliest-planned unstarted job of that instance's endpoint and size without
       helper endpoints, moved there warm (a free warm group the plan, which counted a
       held GPU busy for a tick, did not use: that job and those behind it on its
       planned group start earlier, none later)."""
    order = sorted((a for a in kept_plan.plan.assignments if a.job_id not in kept_plan.done),
                   key=lambda planned: (planned.start_s, planned.end_s))
    next_on: dict[str, Assignment] = {}
    for assignment in order:
        for gpu in assignment.gpus:
            next_on.setdefault(gpu, assignment)
    starts: list[Assignment] = []
    taken = set(unavailable)
    for assignment in order:
        if all(next_on.get(gpu) is assignment for gpu in assignment.gpus) and not taken.intersection(assignment.gpus):
            starts.append(assignment)
            taken.update(assignment.gpus)
    chosen = {a.job_id for a in starts}
    for gpu, value in residents.items():
        instance = parse_instance(value)
        if gpu in taken or gpu in next_on or instance is None:
            continue
        endpoint, group = instance[0], tuple(instance[1])
        if gpu not in group or taken.intersection(group) or any(member in next_on for member in group):
            continue
        for assignment in order:
            job = kept_plan.jobs[assignment.job_id]
            # not a job with helpers (they may not fit there) or hosts (another host may lack its function)
            if (assignment.job_id not in chosen and job.endpoint == endpoint and not job.narrowed
                    and len(assignment.gpus) == len(group)):
                moved = Assignment(job.id, group, assignment.start_s, assignment.start_s,
                                   assignment.start_s + job.service_s, load="warm")
                starts.append(moved)
                chosen.add(job.id)
                taken.update(group)
                break
    return starts


class FollowKeptPlan:
    """Step: start the kept plan's next jobs on the free GPUs and end the tick (module doc);
    drops the kept plan when following it is no longer safe. Writes ``followed``,
    ``held_gpus``, ``taken``, ``started`` and ``dispatched`` when it follows."""

    name = "follow the kept plan"

    def run(self, ctx: TickContext) -> None:
        kept_plan, env = ctx.kept.followed, ctx.env
        if kept_plan is None:
            return
        snapshot = ctx.snapshot
        assert snapshot is not None, "ReadSnapshot runs before FollowKeptPlan"
        age_s = env.clock.monotonic() - kept_plan.planned_at
        if (age_s > env.settings.plan_follow_s or ctx.reclaimed or snapshot.gated_gpus != kept_plan.gated
                or snapshot.workloads_active or env.now_s() >= kept_plan.ages_at_s):
            ctx.kept.followed = None
            return
        held = snapshot.unavailable_gpus(env.gpus)
        free = {gpu.uuid for gpu in env.gpus} - held
        if not free:  # nothing to start: the full tick forms no batch either, and the plan stands
            return
        unread = _unread_heads(kept_plan, snapshot.queue_heads)
        unread_classes = _unread_classes(env, kept_plan, unread) if unread is not None else None
        if unread_classes is None:
            ctx.kept.followed = None
            return
        residents = {gpu.uuid: value for gpu, value in zip(env.gpus, snapshot.residents)}
        assignments = next_starts(kept_plan, held, residents)
        if (not assignments or free - {gpu for assignment in assignments for gpu in assignment.gpus}
                or not _alike_starts(kept_plan, assignments, unread_classes)):
            ctx.kept.followed = None
            return
        now_s = env.now_s()
        ctx.formed = FormedBatch(meta=kept_plan.formed.meta, own_level=kept_plan.formed.own_level)
        ctx.plan = kept_plan.plan  # the evicts' sleep levels it chose (starts.planned_sleep_levels)
        starts: list[Start] = [(kept_plan.jobs[a.job_id], a.gpus, now_s + (a.end_s - a.start_s), a.load)
                               for a in assignments]
        starts.sort(key=lambda start: (start[0].priority, start[0].seq))
        # the critical lane avoids these GPUs from now on, as it avoids a planned tick's starts
        ctx.kept.starting_gpus = frozenset(gpu for a in assignments for gpu in a.gpus)
        started = start_many(ctx, starts)
        kept_plan.done.update(started)
        failed = [a.job_id for a in assignments if a.job_id not in started]
        if failed:  # passed over only when the job is gone (cancelled); a GPU taken meanwhile: it stays next
            pipe = env.r.pipeline(transaction=False)
            for job_id in failed:
                pipe.hget(env.keys.job(job_id), "state")
            kept_plan.done.update(job_id for job_id, state in zip(failed, pipe.execute()) if state != "queued")
        if not started:
            ctx.formed, ctx.plan = FormedBatch(), None
            return
        if kept_plan.reserved & started:  # the next aged job gets its reservation from a full tick
            ctx.kept.followed = None
            # ... at once, with every GPU held too: the jobs deferred behind the reservation say
            # behind_reservation until a batch rewrites them (batch.FormBatch's REASON_REFRESH_S)
            ctx.kept.heads_read_at = float("-inf")
        ctx.followed = True
        ctx.kept.reasons_stale = True  # the queued jobs' reasons are the kept plan's (batch.FormBatch refreshes them)
        ctx.held_gpus = held
        ctx.started = started
        ctx.dispatched |= started
        ctx.taken = set(held) | {gpu for a in assignments if a.job_id in started for gpu in a.gpus}


def _unread_heads(kept_plan: KeptPlan, heads: Mapping[Priority, Sequence[str]]) -> list[str] | None:
    """The queue heads the kept plan did not read (or read and then started: a job requeued
    since, e.g. a preemption's victim), or None when a head means a full tick must plan
    (module doc): a CRITICAL/HIGH head, an unread head before a kept job of its level, or an
    unread head more urgent than a kept job."""
    jobs, done = kept_plan.jobs, kept_plan.done
    least_urgent = max((kept_plan.formed.own_level.get(job_id, Priority.NORMAL) for job_id in jobs
                        if job_id not in done), default=Priority.CRITICAL)
    unread: list[str] = []
    for level, ids in heads.items():
        if not ids:
            continue
        if level not in FOLLOW_LEVELS:
            return None
        unread_seen = False
        for job_id in ids:
            if job_id in jobs and job_id not in done:
                if unread_seen:
                    return None
            else:
                if level < least_urgent:
                    return None
                unread_seen = True
                unread.append(job_id)
    return unread


def _unread_classes(env: TickEnv, kept_plan: KeptPlan, unread: list[str]) -> set[JobClass] | None:
    """The classes (endpoint, service time, level) of the queued jobs of ``unread``, or None
    when one of them has a deadline, dependencies or helper endpoints (a fresh plan places
    such a job by more than its class). Each record is read once per kept plan (its class
    is kept in ``alike``); an entry whose job is no longer queued is skipped (the full tick
    drops it)."""
    out = {kept_plan.alike[job_id] for job_id in unread if job_id in kept_plan.alike}
    todo = [job_id for job_id in unread if job_id not in kept_plan.alike]
    if not todo:
        return out
    pipe = env.r.pipeline(transaction=False)
    for job_id in todo:
        pipe.hmget(env.keys.job(job_id), "endpoint", "service_s", "priority", "deadline_s", "deps", "helpers", "state")
    for job_id, (endpoint, service, priority, due, deps, helpers, state) in zip(todo, pipe.execute()):
        if state != "queued":
            continue
        try:
            key = (endpoint, float(service), Priority[priority])
        except (KeyError, TypeError, ValueError):
            return None
        if due or (deps and deps != "[]") or (helpers and helpers != "[]"):
            return None
        kept_plan.alike[job_id] = key
        out.add(key)
    return out


def _alike_starts(kept_plan: KeptPlan, assignments: list[Assignment], unread: set[JobClass]) -> bool:
    """Whether starting ``assignments`` now is what a fresh plan could do although ``unread``
    jobs are queued: with none, yes; else every job started is of the one class all the
    unread jobs are of (the same endpoint, service time and level, no deadline or helper
    endpoints), so a fresh plan could not tell them apart, and the kept ones were queued
    first. A shorter job, one with a deadline, or an unread job of another class than what
    would start may go first in a fresh plan: the full tick plans."""
    if not unread:
        return True
    starting = set()
    for assignment in assignments:
        job = kept_plan.jobs[assignment.job_id]
        if job.deadline_s is not None or job.helpers:
            return False
        starting.add((job.endpoint, job.service_s, kept_plan.formed.own_level.get(job.id)))
    return len(starting) == 1 and unread <= starting


class KeepPlan:
    """Step, last of a full tick: keep the tick's plan for :class:`FollowKeptPlan` when
    following it is safe (module doc), else drop any kept plan."""

    name = "keep the plan"

    def run(self, ctx: TickContext) -> None:
        kept, env, snapshot, plan = ctx.kept, ctx.env, ctx.snapshot, ctx.plan
        if not ctx.batch or plan is None:
            if ctx.batch_formed:
                kept.followed = None
            return
        safe = (env.settings.plan_follow_s > 0 and snapshot is not None and not snapshot.workloads_active
                and not plan.preemptions and not ctx.victims
                and not ctx.formed.unready and not ctx.formed.awaited and not ctx.requeued_now
                and all(job.priority in FOLLOW_LEVELS for job in ctx.batch))
        if not safe or ctx.fleet_state is None:
            kept.followed = None
            return
        assert snapshot is not None
        kept.followed = KeptPlan(plan, {job.id: job for job in ctx.batch}, ctx.formed, env.clock.monotonic(),
                                 set(ctx.dispatched), reserved=frozenset(ctx.reservations), gated=snapshot.gated_gpus,
                                 ages_at_s=_ages_at(ctx.batch, ctx.dispatched, ctx.fleet_state.now_s,
                                                    env.settings.reservation_after_s))


def _ages_at(batch: Sequence[PlanJob], started: set[str], now_s: float, after_s: float | None) -> float:
    """Workload s: the earliest time a job of ``batch`` not in ``started`` that has not aged
    by ``now_s`` reaches the aging bound ``after_s`` (inf: none, or aging off). Jobs aged
    already were seen by the full tick's reservation (one holds it; the next gets it from
    the full tick after that one starts: ``KeptPlan.reserved``)."""
    if after_s is None:
        return float("inf")
    return min((job.release_s + after_s for job in batch
                if job.id not in started and job.release_s + after_s > now_s), default=float("inf"))
