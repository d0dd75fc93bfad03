"""Batch formation for the planner worker: which queued jobs a tick plans.

:func:`form_batch` takes up to ``batch_size`` queued jobs as
:class:`makespan.planner.model.PlanJob` (release and deadline in workload seconds), CRITICAL
first (strict priority), FIFO (``seq``) within a level. It reads each queue
(``P:queue:{level}``) in chunks of ``batch_size``, at most ``SCAN_FACTOR`` chunks per
level per tick, past steps whose dependencies are not done (their dependencies join
``awaited``: never preemption victims). When workloads are active and the queue heads
were not read with the tick's snapshot, it first runs one workload pass
(:func:`makespan.workloads.advance_workloads`). On the way it drops queue entries whose job
is no longer queued (``drop_stale.lua``) and cancels queued jobs whose dependency failed,
was cancelled or is gone, unless a failed workload step will be retried
(``cancel_dependant.lua``), and queued jobs that can never run on the fleet this planner
runs (:meth:`makespan.models.FleetSpec.placement_problem`: the fleet file changed after
their submit, and their endpoint or a helper is gone, or no aligned GPU group holds them
any more), with that reason (the same script); both scripts are fenced by the planner
token, so a deposed planner changes nothing. It also notes each taken job's traceparent and
submission time (unix s) in ``FormedBatch.meta``.

Priority through dependencies (docs/planner.md "Guarantees"): a job that a
higher-priority queued or delayed job waits on, directly or through a chain of
``depends_on`` / DAG steps, is planned at the highest level waiting on it (its
``PlanJob.weight`` and ``priority``), for as long as that dependant waits. The dependants
come from the reverse-dependency index ``P:awaited:{job}`` (:mod:`makespan.awaited`), walked
upward in one script per tick (``inherited_levels.lua``); a cancelled dependant leaves the index,
so its inheritance is gone at the next tick. A dependency of an unready step seen in the
batch's scan is pulled into the batch at the step's level even when its own queue is not
read this tick (``_BatchScan.pull_dependencies``). ``FormedBatch.own_level`` keeps each job's
submitted level: its queue, lease and metrics use that one.

The tick's step is :class:`FormBatch` (:data:`makespan.workers.tick.steps.TICK_STEPS`); the
scan itself is :func:`form_batch`, which returns a
:class:`makespan.workers.tick.context.FormedBatch` (the jobs, and what the scan learned: the
traceparents and submission times, the submitted levels, ``awaited``, the unready steps,
the jobs left out, the jobs preempted before).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence

from makespan import telemetry
from makespan.models import Priority
from makespan.planner.model import PlanJob
from makespan.registry import function_placement
from makespan.store import JobStore
from makespan.store.jobs import record_deps, unreadable_field
from makespan.workers.host_liveness import hosts_that_fit
from makespan.workers.pool_rehome import reroute_elsewhere
from makespan.workers.tick.clock import release_s
from makespan.workers.tick.context import FormedBatch, TickContext, TickEnv
from makespan.workers.worker_fleets import WorkerFleets, read_worker_fleets

log = logging.getLogger("makespan.planner")

SCAN_FACTOR = 4  # queue entries read per level per tick: at most SCAN_FACTOR × batch_size
# ... not counting jobs waiting for their function's worker, up to this × batch_size entries in all
FUNCTION_WAIT_SCAN_FACTOR = 16
MAX_DEP_DEPTH = 8  # levels of depends_on followed down from an unready step to pull its dependencies in
MAX_WAITERS_WALKED = 1000  # dependants read per job when walking P:awaited upward (bounds the script)
REASON_REFRESH_S = 1.0  # a full fleet: a batch for the wait reasons of jobs no batch read, at most this often, s

class FormBatch:
    """Step: the tick's batch. Formed when a GPU is free at the snapshot, a CRITICAL/HIGH
    job heads its queue (it may preempt), a host is down, or, with every GPU held, a job
    heads a queue that no batch has read yet (a submit, or a victim of the critical lane's
    preemption) or a job the last batch read has left the queue heads (cancelled, or leased
    by the critical lane): that batch starts nothing, but its plan gives the job its wait
    reason and ETA, moves up the ETAs of the jobs that waited behind a job gone, and
    rewrites the reason counts (cleared when nothing is queued any more); at most once per
    :data:`REASON_REFRESH_S`, so a stream of submits into a full fleet costs a plan a second,
    not one per wake-up; or the last tick's rule preemption requeued victims, whose reason
    it wrote without an ETA (``CrossTickState.victims_without_eta``: at the next tick, not
    a refresh later), or the critical lane's preemptions did since the last batch's snapshot
    (``CrossTickState.lane_victims``); or a tick since the last batch followed
    the kept plan (:mod:`makespan.workers.follow`; it wrote no reasons; at most as often); or the
    earliest ETA the last batch wrote has passed and nothing started that job (its GPUs' holder
    overran: ``CrossTickState.next_eta_s``; at most as often: an ETA shown stays at most about
    :data:`REASON_REFRESH_S` in the past). Else the batch stays empty.
    Writes ``held_gpus``, ``batch_formed`` and ``formed``."""

    name = "form batch"

    def run(self, ctx: TickContext) -> None:
        snapshot = ctx.snapshot
        assert snapshot is not None, "ReadSnapshot runs before FormBatch"
        ctx.held_gpus = snapshot.unavailable_gpus(ctx.env.gpus)  # held, or on a host without a GPU worker
        heads = snapshot.queue_heads
        may_preempt = bool(heads[Priority.CRITICAL] or heads[Priority.HIGH])
        queued = frozenset(job_id for ids in heads.values() for job_id in ids)
        kept, now = ctx.kept, ctx.env.clock.monotonic()
        # a host is down: form the batch anyway, so its jobs' wait reasons say why they wait
        # (a tick that followed the kept plan wrote no reasons: refreshed the same way)
        # victims the rule's preemption requeued last tick, or the critical lane's since the last
        # batch's snapshot, have no ETA yet: their batch is not held back by REASON_REFRESH_S
        # (it would be, with every GPU held)
        ages = ctx.env.now_s() >= kept.next_aging_s  # a job read last reaches the aging bound: its reservation
        ctx.batch_formed = (len(ctx.held_gpus) < len(ctx.env.gpus) or may_preempt or bool(snapshot.gated_gpus) or ages
                            or kept.victims_without_eta or kept.lane_victims != kept.lane_victims_planned
                            or (queued != kept.heads_read or kept.reasons_stale or kept.fleet_waiting
                                or ctx.env.now_s() >= kept.next_eta_s or self._function_back(ctx))
                            and now - kept.heads_read_at >= REASON_REFRESH_S)
        if ctx.batch_formed:
            kept.next_aging_s = float("inf")  # PlanBatch sets it again from its batch
            kept.next_eta_s = float("inf")  # WriteWaitReasons sets it again from its rows
            kept.heads_read, kept.heads_read_at, kept.reasons_stale = queued, now, False
            kept.victims_without_eta, kept.lane_victims_planned = False, ctx.lane_victims_seen
            ctx.formed = form_batch(ctx.env, ctx.token, None if snapshot.workloads_active else heads)
            kept.waiting_functions = frozenset(fn for fn, _hosts in ctx.formed.function_waits.values())
            kept.fleet_waiting = bool(ctx.formed.fleet_waits)

    @staticmethod
    def _function_back(ctx: TickContext) -> bool:
        """Whether a workload function that jobs of the last batch's scan waited for is
        registered by a live GPU worker again (:func:`makespan.registry.function_placement`:
        a round trip per such function, only while some wait and at most once per
        :data:`REASON_REFRESH_S`): with every GPU held no batch would read them again before a
        GPU frees, and they would keep saying ``waiting_for_function`` (review)."""
        kept = ctx.kept
        if not kept.waiting_functions or ctx.env.clock.monotonic() - kept.heads_read_at < REASON_REFRESH_S:
            return False
        return any(function_placement(ctx.env.r, ctx.env.keys, name)[1] for name in sorted(kept.waiting_functions))


def form_batch(env: TickEnv, token: str, heads: Mapping[Priority, Sequence[str]] | None = None) -> FormedBatch:
    """Up to ``batch_size`` queued jobs, CRITICAL first (strict priority), FIFO within a
    level (module doc). ``heads``: the first ``batch_size`` ids of each queue, already
    read (None: read here, after a workload pass when workloads are active). ``token``:
    the planner's fencing token for the fenced drop and cancel scripts.

    Raises:
        redis.RedisError: Redis failed (the planner loop treats it as a failed tick)."""
    return _BatchScan(env, token).form(heads)


def drop_stale(env: TickEnv, token: str, queue: str, job_id: str) -> int:
    """Remove the entry ``job_id`` of ``queue`` whose job is no longer queued — only while
    the planner with ``token`` still leads and the job is still not queued (a reaper may
    have requeued it since). Returns the entries removed (0 or 1)."""
    return JobStore(env.r, env.keys).drop_stale(queue, job_id, token)


class _BatchScan:
    """One :func:`form_batch` call: the scan's running state and the batch it builds."""

    def __init__(self, env: TickEnv, token: str):
        self.env, self.token = env, token
        self.r, self.keys, self.settings = env.r, env.keys, env.settings
        self.out = FormedBatch()
        self.read: set[str] = set()  # the ids this scan has read, each taken once
        self.removed = 0  # queue entries removed (stale, cancelled) while the current chunk was read
        self.problems: dict[tuple[str, str | None], str | None] = {}  # (endpoint, helpers JSON) -> why it never runs
        self._fn_hosts: dict[str, tuple[str, ...]] = {}  # workload function -> its hosts (fn_hosts), this scan
        self._fn_down: dict[str, tuple[str, ...]] = {}  # function no live worker registers -> its last hosts
        self.fleet_hosts = frozenset(host.name for host in env.fleet.hosts)
        self._worker_fleets: WorkerFleets | None = None  # read at the first job of this scan
        # (endpoint, helpers JSON) -> the hosts its jobs may run on (None: any), or a str: why none can
        self._ep_hosts: dict[tuple[str, str | None], tuple[str, ...] | None | str] = {}

    def form(self, heads: Mapping[Priority, Sequence[str]] | None) -> FormedBatch:
        jobs = self.out.jobs
        room = self.settings.batch_size
        if heads is None and self.r.scard(self.keys.workloads_active):
            from makespan.workloads import advance_workloads  # workload steps: retries, failure, completion

            advance_workloads(self.r, self.keys)
        for level in Priority:
            offset = 0
            waits_before = self.worker_waits()
            # read on past steps whose dependencies are not done, so that they never hide
            # startable jobs behind them (bounded: SCAN_FACTOR batches per level per tick);
            # what a step waits on is known at any depth from the index (makespan.awaited).
            # Jobs waiting for their function's worker, or for a worker whose fleet file can run
            # them, do not count (they may wait for days: review), up to FUNCTION_WAIT_SCAN_FACTOR
            # batches in all
            while (room > 0 and offset - (self.worker_waits() - waits_before)
                   < SCAN_FACTOR * self.settings.batch_size
                   and offset < FUNCTION_WAIT_SCAN_FACTOR * self.settings.batch_size):
                if offset == 0 and heads is not None:
                    ids = list(heads[level])
                else:
                    ids = self.r.zrange(self.keys.queue(level), offset, offset + self.settings.batch_size - 1)
                if not ids:
                    break
                self.removed = 0
                room = self.take(level, ids, jobs, room, offset)
                offset += len(ids) - self.removed  # entries removed meanwhile: the rest moved up
        self.pull_dependencies(jobs)
        self.out.jobs = self.inherit(jobs)
        return self.out

    def worker_waits(self) -> int:
        """Jobs this scan left queued for a GPU worker (their function's, or one whose fleet
        file can run them)."""
        return len(self.out.function_waits) + len(self.out.fleet_waits)

    def inherit(self, jobs: list[PlanJob]) -> list[PlanJob]:
        """``jobs`` with each job raised to the highest level waiting on it (P:awaited)."""
        if not jobs:
            return jobs
        best = JobStore(self.r, self.keys).inherited_levels([job.id for job in jobs], MAX_WAITERS_WALKED)
        raised = []
        for job, level in zip(jobs, best):
            level = int(level)
            if level < job.priority:
                job = dataclasses.replace(job, priority=level, weight=max(job.weight, float(Priority(level).weight)))
            raised.append(job)
        return raised

    def pull_dependencies(self, jobs: list[PlanJob]) -> None:
        """Append to ``jobs`` the queued, ready jobs that the unready steps read this tick wait
        on (down chains of queued dependencies, at most :data:`MAX_DEP_DEPTH` levels) and
        that are not in it yet, so a LOW job a CRITICAL step waits on is planned although the
        LOW queue is not read this tick. At most ``batch_size`` such jobs."""
        have = {job.id for job in jobs}
        frontier = [dep for dep in self.out.unready_level if dep not in have]
        seen = set(frontier)
        room = self.settings.batch_size
        for _ in range(MAX_DEP_DEPTH):
            if not frontier or room <= 0:
                return
            pipe = self.r.pipeline(transaction=False)
            for job_id in frontier:
                pipe.hmget(self.keys.job(job_id), "endpoint", "service_s", "submitted_at", "seq", "deps", "state",
                           "traceparent", "deadline_s", "priority", "helpers", "pool", "not_before", "fn")
            next_frontier = []
            for job_id, fields in zip(frontier, pipe.execute()):
                (endpoint, service, submitted, seq, deps_json, state, traceparent, due, priority_name, helpers,
                 pool, not_before, fn) = fields
                if endpoint is None or state != "queued" or priority_name not in Priority.__members__:
                    continue
                if (pool or None) != self.keys.pool:  # another pool's job: its own planner plans it (and
                    continue                          # it inherits the dependant's level there, P:awaited)
                if (not self.readable(job_id, priority_name, service, submitted, seq, due, not_before, helpers)
                        or not self.runnable(job_id, priority_name, endpoint, helpers) or self.function_waits(job_id, fn)
                        or self.fleet_waits(job_id, endpoint, helpers, fn)):
                    continue
                deps_of = record_deps(deps_json)
                if deps_of and not all(dep_state == "completed" for dep_state in self.dep_states(deps_of)):
                    self.out.awaited.update(deps_of)
                    for dep in deps_of:
                        if dep not in seen and dep not in have:
                            seen.add(dep)
                            next_frontier.append(dep)
                    continue
                if room <= 0:
                    continue
                self.out.left_out.pop(job_id, None)
                jobs.append(self.plan_job(job_id, Priority[priority_name], endpoint, service, submitted, seq,
                                          traceparent, due, helpers, not_before, fn))
                have.add(job_id)
                room -= 1
            frontier = next_frontier

    def plan_job(self, job_id: str, level: Priority, endpoint: str, service: str, submitted: str, seq: str,
                 traceparent: str | None, due: str | None, helpers: str | None = None,
                 not_before: str | None = None, fn: str | None = None) -> PlanJob:
        """The PlanJob of a queued job at its own level (its meta and level noted), from its
        record's fields (strings as Redis answers them; ``helpers``: a JSON list of the
        workload function's helper endpoints, placed with the job; ``not_before``: its due
        time when it waited as a delayed job; ``fn``: its workload function, whose hosts,
        :meth:`fn_hosts`, are the job's). Released at :func:`makespan.workers.tick.clock.release_s`."""
        submitted_s = float(submitted) / self.settings.time_scale  # workload clock; service, deadline: workload s
        release = release_s(submitted, not_before, self.settings.time_scale, self.env.now_s())
        self.out.meta[job_id] = (traceparent or "", float(submitted), max(float(submitted), float(not_before or 0.0)))
        self.out.own_level[job_id] = level
        return PlanJob(job_id, endpoint, float(level.weight), release, float(service), int(level), (),
                       submitted_s + float(due) if due else None, int(seq),
                       tuple(json.loads(helpers)) if helpers else (), self.job_hosts(endpoint, helpers, fn))

    def fn_hosts(self, fn: str) -> tuple[str, ...]:
        """The hosts workload function ``fn``'s jobs run on
        (:func:`makespan.registry.function_hosts`: those whose live GPU worker registers it,
        else those that did last), sorted; read once per scan. Empty (no host ever marked it):
        any host, as when every host of this planner's fleet has it (no constraint to plan: the
        planner's indexed placement stays on).
        """
        hit = self._fn_hosts.get(fn)
        if hit is None:
            hit, live = function_placement(self.r, self.keys, fn)
            if not live:
                self._fn_down[fn] = hit
            if set(hit) >= self.fleet_hosts:  # every host has it (the usual case): no constraint to plan
                hit = ()
            self._fn_hosts[fn] = hit
        return hit

    def function_waits(self, job_id: str, fn: str | None) -> bool:
        """Whether queued job ``job_id`` of workload function ``fn`` waits for a GPU worker
        that registers it (no live one does: :func:`makespan.registry.function_placement`);
        such a job is noted in ``FormedBatch.function_waits`` (reason ``waiting_for_function``)
        and left out of the batch: planned on the hosts that had the function, it would
        fail there (a host restarted without it) or hold a place on a down host's GPUs."""
        if not fn:
            return False
        self.fn_hosts(fn)
        if fn not in self._fn_down:
            return False
        self.out.function_waits[job_id] = (fn, self._fn_down[fn])
        return True

    def endpoint_hosts(self, endpoint: str, helpers: str | None) -> tuple[str, ...] | None | str:
        """The hosts a job of ``endpoint`` (``helpers``: its record's JSON list) may run on
        as the live GPU workers' fleet files go (:mod:`makespan.workers.worker_fleets`):
        None when every host's worker can run it (the usual case), else the hosts whose
        worker can and that hold its group (sorted), or a str naming the hosts that cannot
        when none is left. Read once per scan and shape."""
        shape = (endpoint, helpers)
        if shape not in self._ep_hosts:
            if self._worker_fleets is None:
                self._worker_fleets = read_worker_fleets(self.r, self.keys, self.env.fleet,
                                                         self.env.whole_fleet or self.env.fleet)
            try:
                names = tuple(json.loads(helpers)) if helpers else ()
            except ValueError:
                names = ()
            fleet = self.env.fleet
            lacking = self._worker_fleets.hosts_lacking(fleet, endpoint, names)
            spec = fleet.endpoints.get(endpoint)
            if not lacking or spec is None:
                self._ep_hosts[shape] = None
            else:
                fits = hosts_that_fit(fleet, set(self.fleet_hosts - set(lacking)), spec.tensor_parallel,
                                      spec.memory_mib_per_gpu)
                self._ep_hosts[shape] = tuple(sorted(fits)) or self._worker_fleets.detail(lacking, fleet,
                                                                                          (endpoint, *names))
        return self._ep_hosts[shape]

    def job_hosts(self, endpoint: str, helpers: str | None, fn: str | None) -> tuple[str, ...]:
        """``PlanJob.hosts`` of a job that does not wait (:meth:`fleet_waits`): where its
        workload function's workers run (:meth:`fn_hosts`) and its endpoint's workers can run
        it (:meth:`endpoint_hosts`); () for any host."""
        by_fn = self.fn_hosts(fn) if fn else ()
        by_endpoint = self.endpoint_hosts(endpoint, helpers)
        if not isinstance(by_endpoint, tuple):
            return by_fn
        return tuple(host for host in by_fn if host in by_endpoint) if by_fn else by_endpoint

    def fleet_waits(self, job_id: str, endpoint: str, helpers: str | None, fn: str | None) -> bool:
        """Whether queued job ``job_id`` waits for a GPU worker whose fleet file can run it
        (:meth:`endpoint_hosts`: none of the hosts that hold its group can, or none of those
        its workload function's workers run on): noted in ``FormedBatch.fleet_waits`` (reason
        ``host_fleet_differs``) and left out of the batch, rather than leased on a worker
        that fails it (or preempting work for it)."""
        allowed = self.endpoint_hosts(endpoint, helpers)
        if allowed is None:
            return False
        if isinstance(allowed, str):
            self.out.fleet_waits[job_id] = allowed
            return True
        by_fn = self.fn_hosts(fn) if fn else ()
        if by_fn and not set(by_fn) & set(allowed):
            fleets = self._worker_fleets
            assert fleets is not None, "endpoint_hosts read them"
            self.out.fleet_waits[job_id] = fleets.detail([host for host in by_fn if host in fleets.differing])
            return True
        return False

    def take(self, level: Priority, ids: list[str], jobs: list[PlanJob], room: int, offset: int = 0) -> int:
        # a job read on an earlier page of this scan: a requeue meanwhile (a hand-back, a failed
        # start, a preemption puts a job back at its submission's place) shifts the queue by one,
        # and the next page began with the last one again; the batch held it twice, and the
        # planner died on "placed twice" (a full-suite run under churn)
        ids = [job_id for job_id in ids if job_id not in self.read]
        self.read.update(ids)
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(self.keys.job(job_id), "endpoint", "service_s", "submitted_at", "seq", "deps", "state",
                       "traceparent", "deadline_s", "reason", "helpers", "not_before", "fn")
        for position, (job_id, fields) in enumerate(zip(ids, pipe.execute())):
            (endpoint, service, submitted, seq, deps_json, state, traceparent, due, reason, helpers, not_before,
             fn) = fields
            if endpoint is None or state != "queued":
                self.removed += drop_stale(self.env, self.token, self.keys.queue(level), job_id)  # cancelled or lost
                continue
            if (not self.readable(job_id, level.name, service, submitted, seq, due, not_before, helpers)
                    or not self.runnable(job_id, level.name, endpoint, helpers) or self.function_waits(job_id, fn)
                    or self.fleet_waits(job_id, endpoint, helpers, fn)):
                continue
            deps_of = record_deps(deps_json)
            if room <= 0:  # not in the batch (what it waits on is in the index)
                self.out.left_out[job_id] = (level, offset + position)
                continue
            if deps_of and not self.deps_ready(job_id, deps_of):
                self.out.awaited.update(deps_of)
                self.out.unready[job_id] = deps_of
                for dep in deps_of:
                    self.out.unready_level[dep] = min(self.out.unready_level.get(dep, 4), int(level))
                continue
            jobs.append(self.plan_job(job_id, level, endpoint, service, submitted, seq, traceparent, due, helpers,
                                      not_before, fn))
            if reason and reason.startswith("preempted by"):
                self.out.requeued.add(job_id)
            room -= 1
        return room

    def runnable(self, job_id: str, priority_name: str, endpoint: str, helpers: str | None) -> bool:
        """Whether the queued job of ``endpoint`` (``helpers``: its record's JSON list) can
        ever run on the fleet this planner runs. One that cannot (the fleet file changed
        after its submit: :meth:`makespan.models.FleetSpec.placement_problem`) is cancelled
        with the reason, as a submit of it now would be refused; the plan never sees it (it
        would fail on an endpoint it does not know, or a job no group holds)."""
        shape = (endpoint, helpers)
        try:
            names = tuple(json.loads(helpers)) if helpers else ()
        except ValueError:
            names = ()
        if shape not in self.problems:
            problem = self.env.fleet.placement_problem(endpoint, names)
            self.problems[shape] = None if problem is None else (
                f"cannot run on the fleet the planner runs now ({self.env.fleet.name!r}, changed after the job was "
                f"submitted): {problem[0]} {problem[1]!r}: {problem[2]}")[:2000]
        reason = self.problems[shape]
        if reason is None:
            return True
        if self.env.whole_fleet is not None and self.env.whole_fleet.pools:
            # a pool's planner: the fleet file may have moved the endpoint to another pool,
            # which runs it (makespan.workers.pool_rehome); cancelled only when none can
            moved = reroute_elsewhere(self.env, self.token, job_id, Priority[priority_name], endpoint, names)
            if moved is not None:
                self.removed += int(moved)
                return False
        self._cancel(job_id, priority_name, reason)
        return False

    def readable(self, job_id: str, priority_name: str, service: str | None, submitted: str | None,
                 seq: str | None, due: str | None, not_before: str | None, helpers: str | None) -> bool:
        """Whether the queued job's record can be planned (:func:`makespan.store.jobs.unreadable_field`).
        One that cannot (a hand edit, a bug) is cancelled with the field named, as one that can
        never run is: the planner raised on it at every tick and died at every restart (a verifier)."""
        problem = unreadable_field({"service_s": service, "submitted_at": submitted, "seq": seq, "deadline_s": due,
                                    "not_before": not_before, "helpers": helpers})
        if problem is None:
            return True
        self._cancel(job_id, priority_name, f"its record cannot be read ({problem}): cancelled, not planned")
        return False

    def _cancel(self, job_id: str, priority_name: str, reason: str, level: int = logging.ERROR) -> None:
        """Cancel queued job ``job_id`` (fenced by the planner's token) with ``reason``, logged at
        ``level`` (a dependency's failure: INFO, what the user's own jobs did; a job the fleet or
        its record makes unrunnable: ERROR)."""
        now = self.env.clock.now()
        event = json.dumps({"ts": now, "kind": "cancelled", "job": job_id, "priority": priority_name,
                            "reason": reason})
        removed = JobStore(self.r, self.keys).cancel_dependant(job_id, self.keys.queue(priority_name), self.token,
                                                               now, reason, event)
        if removed:
            log.log(level, "job %s (%s) cancelled: %s", job_id, priority_name, reason)
            telemetry.end_cancelled_job_spans(self.r, [(job_id, self.keys.job(job_id))])
        self.removed += removed

    def dep_states(self, deps: tuple[str, ...]) -> list[str | None]:
        """The state of each job of ``deps`` (None: no record), in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for dep in deps:
            pipe.hget(self.keys.job(dep), "state")
        return pipe.execute()

    def deps_ready(self, job_id: str, deps: tuple[str, ...]) -> bool:
        states = self.dep_states(deps)
        if all(dep_state == "completed" for dep_state in states):
            return True
        bad = [dep for dep, dep_state in zip(deps, states)
               if dep_state in ("failed", "cancelled") or dep_state is None]
        if bad and "failed" in states:
            from makespan.workloads import retry_pending  # a workload step that will be retried: wait

            bad = [dep for dep in bad if not retry_pending(self.r, self.keys, dep)]
        if bad:
            priority_name = self.r.hget(self.keys.job(job_id), "priority") or "NORMAL"
            self._cancel(job_id, priority_name, f"dependency {bad[0]} did not complete", level=logging.INFO)
        return False
