"""The jobs running at planning time as preemption candidates see them, for the planner
worker: who holds each GPU (:func:`lease_holders`), each holder as a
:class:`makespan.planner.model.RunningJob` with whether the preemption bounds (budget,
minimum runtime) let it be cut (:func:`running_jobs`, :func:`within_bounds`). Read by the
``Preempt`` step (:mod:`makespan.workers.preemption`), the tick's own lane check before its
starts are leased (:mod:`makespan.workers.starts`) and the critical lane."""

from __future__ import annotations

import json

from makespan.awaited import queue_awaited_running
from makespan.models import Priority
from makespan.planner.model import FleetState, PlanJob, RunningJob
from makespan.planner.preemption import victim_allowed
from makespan.workers.leases import held_s, planned_end_s, server_time_ms
from makespan.workers.tick.context import TickContext
from makespan.workers.wait_reasons import utc_text


def lease_holders(ctx: TickContext) -> tuple[dict[str, str], dict[str, dict[str, str]], dict[str, bool], set[str],
                                             float]:
    """(GPU -> lease id, lease id -> lease record, lease id -> its execute phase is done,
    the jobs never to preempt: ``awaited`` of the batch plus the leased jobs that a waiting
    job waits on, from the index, the Redis server's clock as unix ms read in the same round
    trip: :func:`makespan.workers.leases.planned_end_s` dates the records with it)."""
    env = ctx.env
    holders = env.leases.gpu_holders([g.uuid for g in env.gpus])
    lease_of = {gpu: holder.split(":")[0] for gpu, holder in holders.items() if holder}
    lease_ids = sorted(set(lease_of.values()))
    pipe = env.r.pipeline(transaction=False)
    for lease_id in lease_ids:
        pipe.hgetall(env.keys.lease(lease_id))
        pipe.hget(env.keys.phase(lease_id), "execute")
    queue_awaited_running(pipe, env.keys)
    pipe.time()
    *got, awaited, server_time = pipe.execute()
    info = {lease_id: got[2 * n] for n, lease_id in enumerate(lease_ids)}
    executed = {lease_id: got[2 * n + 1] == "done" for n, lease_id in enumerate(lease_ids)}
    return lease_of, info, executed, ctx.formed.awaited | set(awaited), server_time_ms(server_time)


def running_jobs(ctx: TickContext, state: FleetState, lease_of: dict[str, str], info: dict[str, dict[str, str]],
             executed: dict[str, bool], awaited: set[str]) -> tuple[dict[str, RunningJob], dict[str, str]]:
    """``FleetState.running`` from the job leases (a lease whose workload already ran,
    a restore or a record missing a field is left out: never a victim; a job that a
    queued step waits on, ``awaited``, is not preemptable), and job id -> lease id.
    Times on the workload clock (wall s ÷ ``time_scale``)."""
    env = ctx.env
    jobs = {lease_id: rec["job"] for lease_id, rec in info.items()
            if rec.get("kind") == "job" and rec.get("job") and not executed.get(lease_id)}
    pipe = env.r.pipeline(transaction=False)
    for job_id in jobs.values():
        pipe.hmget(env.keys.job(job_id), "endpoint", "service_s", "submitted_at", "seq", "deadline_s", "leased_at",
                   "preemptions", "helpers")
    pipe.time()
    *records, server_time = pipe.execute()
    got = dict(zip(jobs, records))
    server_now_ms = server_time_ms(server_time)
    time_scale = env.settings.time_scale
    gpus_of: dict[str, list[str]] = {}
    for gpu, lease_id in lease_of.items():
        gpus_of.setdefault(lease_id, []).append(gpu)
    order = {gpu.uuid: n for n, gpu in enumerate(env.gpus)}
    out: dict[str, RunningJob] = {}
    for lease_id, job_id in jobs.items():
        endpoint, service, submitted, seq, due, leased, cuts, helpers = got[lease_id]
        prio = Priority.__members__.get(info[lease_id].get("priority", ""))
        if None in (endpoint, service, submitted, leased, prio) or endpoint not in state.endpoints:
            continue
        assert prio is not None
        release_s, leased_s = float(submitted) / time_scale, float(leased) / time_scale
        job = PlanJob(job_id, endpoint, float(prio.weight), release_s, float(service), int(prio), (),
                      release_s + float(due) if due else None, int(seq or 0),
                      tuple(json.loads(helpers)) if helpers else ())
        group = tuple(sorted(gpus_of[lease_id], key=order.__getitem__))
        # a job on a host without a live GPU worker is no victim: nothing would run its preemptor there
        on_down_host = ctx.snapshot is not None and not ctx.snapshot.gated_gpus.isdisjoint(group)
        ran_s = held_s(info[lease_id], server_now_ms, time_scale, fallback_s=state.now_s - leased_s)
        # leased_at and planned_end_s are on the clock of the planner that leased it (maybe
        # another leader): its start on this tick's clock is now less the time held; its end
        # is the one the fleet state's free times were read from (dated on the server clock,
        # makespan.workers.leases.planned_end_s: the same value, or the decider would not see
        # the victim's GPUs free at its end), else dated now the same way; a holder past its
        # planned end ends when the fleet state expects it (as long again as it has overrun,
        # makespan.workers.fleet_view): with its past end it was no victim, and a CRITICAL job
        # waited behind an overrunning LOW one until that ended on its own (new-user check)
        start_s = state.now_s - ran_s
        end = ctx.lease_end.get(lease_id)
        if end is None:
            end = planned_end_s(info[lease_id], state.now_s, server_now_ms, time_scale)
        end_s = state.now_s if end is None else end
        # its service began by its planned end less its service time (before the overrun's
        # extension: else a long overrun put it in the future, and the decider took the
        # victim for one still loading, its warm endpoint lost to the preemptor: review)
        service_start_s = max(start_s, end_s - float(service))
        if end_s <= state.now_s:  # past its planned end: the end the plan expects, as the GPUs' free times
            end_s = max(end_s, *(state.free_at.get(gpu, end_s) for gpu in group))
        bounded = _bounded(ctx, cuts, ran_s)
        preemptable = job_id not in awaited and not on_down_host and bounded
        if not bounded:  # the wait reason of a job it holds up says why it is not cut (new-user check)
            ctx.unpreemptible[job_id] = (int(prio), _unbounded_why(ctx, cuts, ran_s, server_now_ms / 1000.0))
            budget = ctx.env.settings.preemption_budget
            if not 0 <= budget <= int(cuts or 0) and job_id not in awaited and not on_down_host:
                ctx.preemptible_at[job_id] = state.now_s + max(0.0, ctx.env.settings.preemption_min_runtime_s - ran_s)
        running = RunningJob(job, group, start_s, service_start_s, end_s, preemptable)
        out.update({gpu: running for gpu in group})
    return out, {job_id: lease_id for lease_id, job_id in jobs.items()}


def _unbounded_why(ctx: TickContext, cuts: str | None, ran_s: float, server_now_s: float) -> str:
    """Why a running job that :func:`_bounded` refuses may not be preempted, for a wait
    reason; under the minimum runtime, also from when it may be (UTC, on the Redis server's
    clock): the plan's ETA does not count a preemption then (a gang's user saw the ETA 40 s
    later than the preemption that came when the minimum runtime ended)."""
    settings = ctx.env.settings
    cuts_n = int(cuts or 0)
    if 0 <= settings.preemption_budget <= cuts_n:
        return (f"preempted {cuts_n} time{'s' if cuts_n != 1 else ''} already, its budget "
                f"(MAKESPAN_PREEMPTION_BUDGET={settings.preemption_budget})")
    left_wall_s = max(0.0, settings.preemption_min_runtime_s - ran_s) * settings.time_scale
    from_utc = utc_text(server_now_s + left_wall_s)
    return (f"held its GPUs {ran_s:.0f} workload s, under the minimum runtime "
            f"(MAKESPAN_PREEMPTION_MIN_RUNTIME_S={settings.preemption_min_runtime_s:g}); preemptible from "
            f"{from_utc}, when a preemption may start this job before the ETA")


def _bounded(ctx: TickContext, cuts: str | None, ran_s: float) -> bool:
    """Whether a job preempted ``cuts`` times (its record's count) that has held its
    GPUs ``ran_s`` workload s is within the preemption bounds (module doc)."""
    settings = ctx.env.settings
    return victim_allowed(int(cuts or 0), ran_s, settings.preemption_budget, settings.preemption_min_runtime_s)


def within_bounds(ctx: TickContext, info: dict[str, dict[str, str]]) -> dict[str, bool]:
    """Lease id -> whether its job is within the preemption bounds (one round trip; the time
    held on the server clock: :func:`makespan.workers.leases.held_s`)."""
    env = ctx.env
    lease_ids = [lease_id for lease_id, rec in info.items() if rec.get("kind") == "job" and rec.get("job")]
    if not lease_ids:
        return {}
    pipe = env.r.pipeline(transaction=False)
    for lease_id in lease_ids:
        pipe.hmget(env.keys.job(info[lease_id]["job"]), "preemptions", "leased_at")
    pipe.time()
    *records, server_time = pipe.execute()
    server_now_ms, now_s, time_scale = server_time_ms(server_time), env.now_s(), env.settings.time_scale
    out: dict[str, bool] = {}
    for lease_id, (cuts, leased) in zip(lease_ids, records):
        if leased is None:
            out[lease_id] = False
            continue
        ran_s = held_s(info[lease_id], server_now_ms, time_scale, fallback_s=now_s - float(leased) / time_scale)
        out[lease_id] = _bounded(ctx, cuts, ran_s)
    return out


__all__ = ["lease_holders", "running_jobs", "within_bounds"]
