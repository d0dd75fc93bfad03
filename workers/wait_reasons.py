"""Writing each waiting job's reason and ETA (:mod:`makespan.wait_reasons`) for the planner
worker: one fenced script per planning tick (``write_wait_reasons.lua``), only for the jobs that
tick read (its batch, the queued jobs its scan left out, the unready steps).

The :class:`WriteWaitReasons` step derives each not-started batch job's reason
from the tick's plan: ``reserved`` / ``behind_reservation`` (the tick's reservations,
:mod:`makespan.planner.reservation`), ``preempted_requeued`` (its record says it was
preempted and it has not started since; a job preempted this tick gets as its ETA its start
in the plan the scored decider left, :mod:`makespan.workers.preemption`; the rule's decider
gives none until the next tick, which forms a batch for them even with every GPU held), ``host_cordoned``
(planned on a host an operator cordoned) and ``host_down`` (planned on a host without a live GPU worker:
:mod:`makespan.workers.host_liveness`), ``waiting_for_memory`` (a group of its size is
free now but none with its memory is), else ``waiting_for_gpus`` naming the GPUs of its
planned group and what holds them (a lease's job, or the jobs planned there before it).
The ETA is the plan's start converted to the Redis server's clock
(``(start − now) × time_scale`` + the server clock the delayed-job promote measured).
The same script replaces ``P:planner:reasons`` (:attr:`makespan.keys.Keys.wait_reason_counts`)
with the count of jobs per reason it wrote, which Prometheus exports as
``makespan_queued_jobs_by_reason{reason}`` (:class:`makespan.metrics.RedisStateCollector`);
a tick that forms an empty batch clears it (once: ``CrossTickState.reason_counts_written``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from makespan.models import Priority
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.reservation import Reservation, reservation_for
from makespan.store import JobStore
from makespan.workers.tick.context import TickContext


MAX_CHAIN = 16  # unready steps followed down a depends_on chain for a dependant's ETA


class WriteWaitReasons:
    """Step: write the reason and ETA of every job the tick read and did not start
    (module doc): with a batch, from its plan; with an empty batch formed while unready
    steps or jobs left out were read, for those; with an empty batch and nothing read,
    the reason counts go to zero (once, not every idle tick)."""

    name = "wait reasons"

    def run(self, ctx: TickContext) -> None:
        # the jobs this tick leased left the queue heads it read, but the reasons written now
        # already count them: their leaving is no cause to plan again (batch.FormBatch)
        ctx.kept.heads_read = ctx.kept.heads_read - ctx.dispatched
        if ctx.batch:
            assert ctx.plan is not None, "PlanBatch runs before WriteWaitReasons"
            _write(ctx, ctx.batch, ctx.plan)
        elif ctx.batch_formed and ctx.formed.read_waiting():  # only jobs it does not plan read
            _write(ctx, [], Plan(ctx.env.settings.policy, []))
        elif ctx.batch_formed:  # nothing queued: no job waits for any reason
            _clear_reason_counts(ctx)


def _preemptible_start(ctx: TickContext, job: PlanJob, state: FleetState, plan: Plan, assignment: Assignment,
                       on_gpu: dict[str, list[int]] | None) -> float:
    """When the group of ``assignment`` could be taken by preempting the lower-level holders the
    minimum runtime protects now (their time held reaches it), or ``assignment.start_s`` when
    another holder (its budget spent, its level, a job planned there first in ``plan``) keeps it
    longer (``on_gpu``: :func:`_positions_on_gpu` of ``plan``)."""
    now, out = state.now_s, state.now_s
    for gpu in assignment.gpus:
        free = state.free_at.get(gpu, now)
        holder = ctx.lease_job.get(gpu)
        if free <= now + 1e-6:
            continue
        level = ctx.unpreemptible.get(holder, (None, ""))[0] if holder else None
        if holder in ctx.preemptible_at and level is not None and level > job.priority:
            out = max(out, ctx.preemptible_at[holder])
        else:
            return assignment.start_s
    if any(other.job_id != job.id and other.end_s <= assignment.start_s + 1e-6 and other.start_s < assignment.start_s
           for other in _sharing(plan, assignment, on_gpu)):
        return assignment.start_s  # another job is planned on the group first
    return out  # the group is taken then (the plan's start is the take; its transition follows)


def _future_reservation(ctx: TickContext, batch: list[PlanJob], state: FleetState,
                        plan: Plan) -> tuple[str, float, float] | None:
    """(job id, start, ages at) of the job that will hold the next reservation (none is held now):
    the first job by level, release, submission whose plan starts it after it reaches the aging
    bound; start: its earliest group's free time of the running work, from when it ages."""
    after_s = ctx.env.settings.reservation_after_s
    if after_s is None or ctx.reservations:
        return None
    by_job = plan.by_job()
    late = [job for job in batch if job.id not in ctx.dispatched and job.id in by_job
            and by_job[job.id].start_s > job.release_s + after_s]
    if not late:
        return None
    job = min(late, key=lambda j: (j.priority, j.release_s, j.seq))
    res = reservation_for(job, state)
    if res is None:
        return None
    ages_at = job.release_s + after_s
    # what the plan starts on that group before the job ages still runs then: the reservation
    # begins when it ends (a verifier saw the ETA early by one such job's length)
    ends_before = [other.end_s for other in plan.assignments
                   if other.job_id != job.id and other.start_s < ages_at and set(other.gpus) & set(res.gpus)]
    return job.id, max(res.start_s, ages_at, *ends_before), ages_at


def _server_time_s(ctx: TickContext, start_s: float, now_s: float) -> float:
    """A plan time (workload s) as unix s on the Redis server's clock (as the delayed-job
    promote measured it)."""
    env = ctx.env
    return env.delayed.server_now_s() + (start_s - now_s) * env.settings.time_scale


def _server_eta(ctx: TickContext, start_s: float, now_s: float) -> str:
    """:func:`_server_time_s` as the ETA field's text."""
    return f"{_server_time_s(ctx, start_s, now_s):.3f}"


def _write(ctx: TickContext, batch: list[PlanJob], plan: Plan) -> None:
    """Write the reason and ETA of every job this tick read and did not start (module doc)."""
    env, state = ctx.env, ctx.fleet_state
    assert state is not None, "ReadFleet runs before WriteWaitReasons"
    now = state.now_s
    by_job = plan.by_job()
    rows: list[str] = []
    memory_waits: dict[tuple[int, int], bool] = {}  # (tp, MiB per GPU) -> only a group without the memory is free
    on_gpu = _positions_on_gpu(plan)
    ahead = _future_reservation(ctx, batch, state, plan)  # (job id, its start once it ages) or None
    earliest_eta = float("inf")  # workload s: once it passes with that job not started, FormBatch re-plans
    planned_levels: dict[str, str] = {}  # job id -> the dependant's level it inherited (planned_priority)
    for job in batch:
        if job.id in ctx.dispatched:
            continue
        assignment = by_job.get(job.id)
        reason, detail = _batch_reason(ctx, job, state, plan, assignment, memory_waits, on_gpu)
        own = ctx.formed.own_level.get(job.id)
        if own is not None and job.priority < own:  # it inherited a dependant's level (batch.inherit)
            planned_levels[job.id] = Priority(job.priority).name
            detail += (f"; planned at {Priority(job.priority).name}, not its own {own.name}: a "
                       f"{Priority(job.priority).name} job waits on it")
        # a job planned on a host without a GPU worker, or cordoned, has no ETA (whatever its
        # code: a preempted job's too): that host's free time is a placeholder
        # (fleet_view.DOWN_FREE_AFTER_S), not a forecast
        gated = ctx.snapshot.gated_gpus if ctx.snapshot is not None else frozenset()
        start = assignment.start_s if assignment is not None else None
        # a level the fast lane covers preempts by its rule once the holders' minimum runtime ends
        # (without the lane the scored decider may not: a verifier saw the ETA 4 s early then)
        if start is not None and int(job.priority) in ctx.env.settings.fast_lane_levels:
            start = min(start, _preemptible_start(ctx, job, state, plan, assignment, on_gpu))
        if start is not None and ahead is not None and ahead[0] == job.id and ahead[1] < start:
            start = ahead[1]  # it ages before its planned start: its reservation then starts it
            detail += f"; ages past the bound at {utc_text(_server_time_s(ctx, ahead[2], now))}, then reserved"
        eta = (_server_eta(ctx, start, now)
               if start is not None and gated.isdisjoint(assignment.gpus) else "")
        if eta:
            earliest_eta = min(earliest_eta, start)  # type: ignore[type-var]
        rows += [job.id, reason, detail, eta]
    ctx.kept.next_eta_s = earliest_eta
    dependencies = _Dependencies(ctx, state, plan)
    for job_id, deps in ctx.formed.unready.items():
        ends = [dependencies.end_of(dep) for dep in deps]
        eta = (_server_eta(ctx, max(now, *ends), now)  # type: ignore[type-var]
               if ends and None not in ends else "")
        rows += [job_id, "waiting_for_dependency", dependencies.detail(deps), eta]
    for job_id in ctx.victims:  # preempted this tick, back in their queue
        start = ctx.victim_starts.get(job_id)  # the scored decider's plan after the preemptions
        rows += [job_id, "preempted_requeued", "preempted this tick; queued again, restarts from zero",
                 _server_eta(ctx, start, now) if start is not None else ""]
    down = ctx.snapshot.down_hosts if ctx.snapshot is not None else frozenset()
    for job_id, (fn, last_hosts) in ctx.formed.function_waits.items():
        if last_hosts and down.issuperset(last_hosts):  # the hosts that had it are down: that is the cause
            rows += [job_id, "host_down",
                     f"host{'s' if len(last_hosts) > 1 else ''} {', '.join(last_hosts)}, whose GPU workers registered "
                     f"its workload function {fn!r} last, ha{'ve' if len(last_hosts) > 1 else 's'} no live GPU "
                     "worker: it stays queued until one is back (with the function)", ""]
            continue
        last = f" (last registered by the GPU workers of {', '.join(last_hosts)})" if last_hosts else ""
        rows += [job_id, "waiting_for_function",
                 f"no live GPU worker registers workload function {fn!r}{last}: it stays queued until one "
                 f"does (`makespan gpu-worker --workloads MODULE` with it); `makespan cancel {job_id}` otherwise", ""]
    if ctx.formed.fleet_waits:
        from makespan.workers.worker_fleets import own_version

        mine = own_version(env.whole_fleet or env.fleet)
    for job_id, hosts in ctx.formed.fleet_waits.items():
        rows += [job_id, "host_fleet_differs",
                 f"the GPU workers of the hosts it could run on run another fleet file than the planner's (version "
                 f"{mine}), without its endpoint (or a helper, or with another tensor_parallel, or with other GPUs "
                 f"for the host): {hosts}; it stays "
                 "queued until one runs the planner's file (restart the workers with it, or the planner with theirs "
                 f"if the planner's is the older one); `makespan cancel {job_id}` otherwise", ""]
    for job_id, (level, position) in ctx.formed.left_out.items():
        rows += [job_id, "behind_batch", f"position {position + 1} in the {level.name} queue; the batch holds "
                                      f"{env.settings.batch_size} jobs", ""]
    if rows or ctx.kept.reason_counts_written:
        ctx.kept.reason_counts_written = bool(rows)
        JobStore(env.r, env.keys).write_wait_reasons(ctx.token, rows, planned_levels)


def _clear_reason_counts(ctx: TickContext) -> None:
    """Nothing queued was read: the reason counts go to zero (once, not every idle tick)."""
    env = ctx.env
    if ctx.kept.reason_counts_written:
        ctx.kept.reason_counts_written = False
        JobStore(env.r, env.keys).write_wait_reasons(ctx.token, [])


class _Dependencies:
    """What the unready steps of a tick wait on: each dependency's expected end (workload s,
    or None when nothing says) and a few words on it for the detail line. A dependency in
    the plan ends at its planned end; one holding a lease at its GPUs' free time
    (:func:`_running_ends`); a completed one has ended (now); a delayed one (``delay_s``, a
    retry backoff) at its due time plus its service time (no cold start counted: an
    estimate, never a plan); an unready step (itself waiting on a dependency) when its own
    dependencies end, plus its service time, down at most :data:`MAX_CHAIN` steps. The
    records of the dependencies are read in one round trip, once per tick (their state, due
    time, service time and workload step name)."""

    def __init__(self, ctx: TickContext, state: FleetState, plan: Plan):
        self.ctx, self.now = ctx, state.now_s
        self.planned_end = {assignment.job_id: assignment.end_s for assignment in plan.assignments}
        self.running_end = _running_ends(ctx, state)
        self.unready = ctx.formed.unready
        deps = sorted({dep for deps in self.unready.values() for dep in deps})
        self.records: dict[str, list] = {}
        self.server_now_s = 0.0
        if deps:
            env = ctx.env
            pipe = env.r.pipeline(transaction=False)
            for dep in deps:
                pipe.hmget(env.keys.job(dep), "state", "not_before", "service_s", "step")
            self.records = dict(zip(deps, pipe.execute()))
            self.server_now_s = env.delayed.server_now_s()
        self.memo: dict[str, float | None] = {}

    def end_of(self, job_id: str, depth: int = 0) -> float | None:
        """When dependency ``job_id`` is expected to end (workload s), or None."""
        if job_id in self.planned_end:
            return self.planned_end[job_id]
        if job_id in self.running_end:
            return self.running_end[job_id]
        if job_id in self.memo:
            return self.memo[job_id]
        self.memo[job_id] = None  # a cycle or a chain too deep: no estimate
        job_state, not_before, service, _step = self.records.get(job_id) or (None, None, None, None)
        out: float | None = None
        if job_state == "completed":
            out = self.now
        elif job_state == "delayed" and not_before and service:
            out = self._due_s(float(not_before)) + float(service)
        elif job_state == "queued" and job_id in self.unready and service and depth < MAX_CHAIN:
            ends = [self.end_of(dep, depth + 1) for dep in self.unready[job_id]]
            if ends and None not in ends:
                out = max(self.now, *ends) + float(service)  # type: ignore[type-var]
        self.memo[job_id] = out
        return out

    def _due_s(self, not_before_unix_s: float) -> float:
        """A due time (unix s on the server's clock) on the plan's clock (workload s)."""
        return self.now + max(0.0, (not_before_unix_s - self.server_now_s) / self.ctx.env.settings.time_scale)

    def detail(self, deps: Sequence[str]) -> str:
        """``waits on ID (step NAME, running, expected to end 2026-12-06 18:36:38Z), ...``."""
        parts = []
        for dep in deps:
            job_state, not_before, _service, step = self.records.get(dep) or (None, None, None, None)
            end = self.end_of(dep)
            when = "" if end is None else utc_text(_server_time_s(self.ctx, max(self.now, end), self.now))
            if dep in self.running_end or dep in self.ctx.dispatched:
                what = f"running, expected to end {when}"
            elif dep in self.planned_end:
                what = f"planned, to end {when}"
            elif job_state == "delayed" and not_before:
                what = f"delayed until {utc_text(float(not_before))}"
            elif job_state == "queued" and dep in self.unready:
                what = "waiting on its own dependencies" + (f", expected to end {when}" if when else "")
            else:
                what = job_state or "gone"
            parts.append(f"{dep} ({'step ' + step + ', ' if step else ''}{what})")
        return "waits on " + ", ".join(parts)


def _running_ends(ctx: TickContext, state: FleetState) -> dict[str, float]:
    """Job id -> when the job holding a lease is expected to end (workload s): its GPUs' free
    time, or on a down or cordoned host (whose free time is a placeholder) its lease's own
    planned end (a cordoned host's leases run to their end)."""
    now = state.now_s
    gated = ctx.snapshot.gated_gpus if ctx.snapshot is not None else frozenset()
    lease_of = ({gpu.uuid: holder.split(":")[0] for gpu, holder in zip(ctx.env.gpus, ctx.snapshot.gpu_holders)
                 if holder} if gated and ctx.snapshot is not None else {})
    out: dict[str, float] = {}
    for gpu, job_id in ctx.lease_job.items():
        if gpu in gated and gpu in lease_of:
            out[job_id] = max(now, ctx.lease_end.get(lease_of[gpu], now))
        else:
            out[job_id] = state.free_at.get(gpu, now)
    return out


def _batch_reason(ctx: TickContext, job: PlanJob, state: FleetState, plan: Plan,
                  assignment: Assignment | None, memory_waits: dict[tuple[int, int], bool] | None = None,
                  on_gpu: dict[str, list[int]] | None = None) -> tuple[str, str]:
    """(reason, detail) of batch job ``job`` that this tick did not start; ``assignment``: its
    assignment in ``plan`` (None: not placed). ``memory_waits``: the tick's answers of the
    memory check per (tensor-parallel size, MiB per GPU), filled here (one fleet scan per
    endpoint shape per tick, not per job). ``on_gpu``: GPU -> positions in ``plan.assignments``
    of the assignments on it (:func:`_positions_on_gpu`; None: scan the plan)."""
    reason, detail = _own_wait(ctx, job, state, plan, assignment, memory_waits, on_gpu)
    if job.id in ctx.formed.requeued:  # its code until it starts again; the detail says what it waits for now
        # (also once it aged past the bound: a reserved victim showed 'reserved', its preemption unsaid)
        return "preempted_requeued", f"preempted; queued again, restarts from zero; now {reason}: {detail}"
    return reason, detail


def _own_wait(ctx: TickContext, job: PlanJob, state: FleetState, plan: Plan, assignment: Assignment | None,
              memory_waits: dict[tuple[int, int], bool] | None,
              on_gpu: dict[str, list[int]] | None) -> tuple[str, str]:
    """(reason, detail) of batch job ``job`` but for a preemption: its own reservation, or
    :func:`_current_wait`."""
    reservations: dict[str, Reservation] = ctx.reservations
    own_reservation = reservations.get(job.id)
    if own_reservation is not None:
        # a reservation on a host that takes no lease now does not start it: the host is the reason
        gated = _gated_host(ctx, own_reservation.gpus, job)
        if gated is not None:
            return gated[0], f"{gated[1]}; its GPUs {','.join(own_reservation.gpus)} are reserved for it there"
        return "reserved", (f"GPUs {','.join(own_reservation.gpus)} reserved for it from the ETA "
                            "(waited past the aging bound)")
    # a reservation whose job this tick leased is gone: its deferred jobs now wait for that job's GPUs
    blocking = [reservation for reservation in reservations.values()
                if job.id in reservation.deferred and reservation.job_id not in ctx.dispatched]
    if not blocking and assignment is not None:
        blocking = _reserved_ahead(ctx, job, state, plan, assignment, reservations)
    return _current_wait(ctx, job, state, plan, assignment, blocking, memory_waits, on_gpu)


def _reserved_ahead(ctx: TickContext, job: PlanJob, state: FleetState, plan: Plan, assignment: Assignment,
                    reservations: dict[str, Reservation]) -> list[Reservation]:
    """The reservations (of other jobs, not leased yet) that ``job`` waits behind: one holding
    a GPU of ``assignment`` that is free now, whose job is planned to start there no later
    than ``job`` and is of ``job``'s level or a more urgent one (a reservation never holds
    back a more urgent job: :func:`makespan.planner.reservation.enforce`). A job the
    reservation deferred at its first tick is planned after the reserved job at the next
    ones, no longer 'deferred': its reason flipped to ``waiting_for_gpus`` while nothing
    changed (a wait-reason auditor)."""
    now = state.now_s
    wanted = set(assignment.gpus)
    out = []
    for reservation in reservations.values():  # at most one, usually none: the scans below are rare
        if reservation.job_id in ctx.dispatched or not any(
                gpu in wanted and gpu not in ctx.lease_job and state.free_at.get(gpu, now) <= now + 1e-6
                for gpu in reservation.gpus):
            continue
        reserved_start = next((other.start_s for other in plan.assignments if other.job_id == reservation.job_id), None)
        level = next((other.priority for other in ctx.batch if other.id == reservation.job_id), job.priority)
        if reserved_start is not None and reserved_start <= assignment.start_s + 1e-6 and level <= job.priority:
            out.append(reservation)
    return out


def _current_wait(ctx: TickContext, job: PlanJob, state: FleetState, plan: Plan, assignment: Assignment | None,
                  blocking: list[Reservation], memory_waits: dict[tuple[int, int], bool] | None,
                  on_gpu: dict[str, list[int]] | None) -> tuple[str, str]:
    """(reason, detail) of a batch job past the reservation checks of :func:`_batch_reason`:
    ``blocking``, the reservations that defer it."""
    if blocking:
        reservation = blocking[0]
        return "behind_reservation", f"GPUs {','.join(reservation.gpus)} are reserved for job {reservation.job_id}"
    gated = _gated_host(ctx, assignment.gpus, job) if assignment is not None else None
    if gated is not None:
        return gated
    model = state.endpoints.get(job.endpoint)
    if model is not None:
        shape = (model.tp, model.memory_mib)
        if memory_waits is None or shape not in memory_waits:
            waits = _waits_for_memory(state, model.tp, model.memory_mib)
            if memory_waits is not None:
                memory_waits[shape] = waits
        else:
            waits = memory_waits[shape]
        if waits:
            where = f"; {_planned_on(ctx, job, state, plan, assignment, on_gpu)}" if assignment is not None else ""
            return "waiting_for_memory", (f"a group of {model.tp} GPU(s) is free, but none with "
                                          f"{model.memory_mib} MiB per GPU{where}")
    if assignment is None:
        return "waiting_for_gpus", "not placed by this plan"
    return "waiting_for_gpus", _planned_on(ctx, job, state, plan, assignment, on_gpu)


def _planned_on(ctx: TickContext, job: PlanJob, state: FleetState, plan: Plan, assignment: Assignment,
                on_gpu: dict[str, list[int]] | None) -> str:
    """``planned on GPUs A,B, held by job X (N s past its planned end: ...), job Y (planned)``:
    the group the plan gives ``job`` and what holds it until then."""
    now = state.now_s
    holders = []
    for gpu in assignment.gpus:
        if state.free_at.get(gpu, now) > now + 1e-6 and gpu in ctx.lease_job:
            late_s = ctx.lease_overrun.get(gpu)
            # an overrunning holder frees at a release no plan can date: the ETA is a lower bound
            late_wall_s = None if late_s is None else late_s * ctx.env.settings.time_scale
            late = ("" if late_wall_s is None else
                    f" ({late_wall_s:.{1 if late_wall_s < 10 else 0}f} s past its planned end: the ETA moves until "
                    "it ends)")
            holder = ctx.lease_job[gpu]
            # a CRITICAL or HIGH job waits behind a job the preemption bounds protect: say so
            # (new-user check: it looked like a preemption bug)
            # only a holder of a lower level than the waiting job: a holder of its level or higher is
            # no victim of it whatever its bounds, and 'preemptible from T' would promise a preemption
            level_why = ctx.unpreemptible.get(holder) if job.priority <= Priority.HIGH else None
            kept = level_why[1] if level_why is not None and level_why[0] > job.priority else None
            holders.append(f"job {holder}{late}" + (f" (not preemptible: {kept})" if kept else ""))
    before = [other for other in _sharing(plan, assignment, on_gpu) if other.job_id != job.id
              and other.end_s <= assignment.start_s + 1e-6]
    if before:
        last = max(before, key=lambda other: other.end_s).job_id
        holders.append(f"job {last} ({'leased' if last in ctx.dispatched else 'planned'})")
    held = f", held by {', '.join(dict.fromkeys(holders))}" if holders else ""
    return f"planned on GPUs {','.join(assignment.gpus)}{held}"


def _gated_host(ctx: TickContext, gpus: Sequence[str], job: PlanJob) -> tuple[str, str] | None:
    """(``host_cordoned`` or ``host_down``, detail) when the host of ``gpus`` takes no new
    lease now (:mod:`makespan.workers.host_liveness`), else None. The detail of a job held to
    some hosts (its workload function's, ``job.hosts``) names them: why a free host is not used."""
    down_hosts = ctx.snapshot.down_hosts if ctx.snapshot is not None else frozenset()
    cordoned = ctx.snapshot.cordoned_hosts if ctx.snapshot is not None else {}
    if not gpus or not (down_hosts or cordoned):
        return None
    fleet = ctx.env.fleet
    host = fleet.host_of(gpus[0])
    # job.hosts: where its workload function is registered and whose worker's fleet file can run it
    only = (f" (only the GPU workers of {', '.join(job.hosts)} can run it now: of the hosts that register its "
            "workload function, where it has one, those whose fleet file has its endpoint and GPUs)"
            if job.hosts else "")
    if host not in cordoned and host not in down_hosts:
        return None
    # the other hosts that could run it and take nothing new either: a plan on a gated host means
    # no open host could start it sooner, and naming one host read as if only it were closed (gang user)
    tp = len(gpus)
    others = sorted(h.name for h in fleet.hosts if h.name != host and len(h.gpus) >= tp
                    and (not job.hosts or h.name in job.hosts) and (h.name in cordoned or h.name in down_hosts))
    closed = [f"{name} ({'cordoned' if name in cordoned else 'down'})" for name in others]
    also = f"; also closed: {', '.join(closed)}" if closed else ""
    if host in cordoned:
        cordon = cordoned[host]
        why = f": {cordon.reason}" if cordon.reason else ""
        return "host_cordoned", (f"planned on host {host}, cordoned since {utc_text(cordon.since_s)}{why}; nothing new "
                                 f"is leased there until `makespan uncordon {host}`{only}{also}")
    return "host_down", (f"planned on host {host}, which no GPU worker consumes now; nothing is leased "
                         f"there until one starts there{only}{also}")


def _waits_for_memory(state: FleetState, tp: int, memory_mib: int) -> bool:
    """Whether no group of ``tp`` GPUs with ``memory_mib`` MiB each is free now while a group
    of ``tp`` GPUs without that memory is."""
    now = state.now_s
    fits = state.groups(tp, memory_mib)
    free = lambda group: all(state.free_at.get(gpu, now) <= now + 1e-6 for gpu in group)  # noqa: E731
    others = [group for group in state.groups(tp, 0) if group not in fits]
    return not any(free(group) for group in fits) and any(free(group) for group in others)


def _positions_on_gpu(plan: Plan) -> dict[str, list[int]]:
    """GPU uuid -> positions in ``plan.assignments`` of the assignments that use it, ascending."""
    out: dict[str, list[int]] = {}
    for position, assignment in enumerate(plan.assignments):
        for gpu in assignment.gpus:
            out.setdefault(gpu, []).append(position)
    return out


def _sharing(plan: Plan, assignment: Assignment, on_gpu: dict[str, list[int]] | None) -> list[Assignment]:
    """The assignments of ``plan`` that share a GPU with ``assignment`` (itself included), in
    plan order (``on_gpu``: :func:`_positions_on_gpu` of ``plan``; None: a scan)."""
    if on_gpu is None:
        mine = set(assignment.gpus)
        return [other for other in plan.assignments if mine.intersection(other.gpus)]
    positions = sorted({position for gpu in assignment.gpus for position in on_gpu.get(gpu, ())})
    return [plan.assignments[position] for position in positions]


def utc_text(unix_s: float) -> str:
    """``unix_s`` as ``YYYY-MM-DD HH:MM:SSZ`` (UTC), as the CLI prints times."""
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(unix_s))
