"""The warm-job fast path: a job whose endpoint instance is already resident on exactly
its leased GPUs runs evict → start_endpoint → execute → clear in two fenced Redis
scripts instead of some thirty round trips.

1. ``begin_warm.lua`` (one script) checks that the job has no helper endpoints, the
   fencing token on every GPU, that the instance is still resident on all of them, that
   no phase of this lease has been claimed yet and that no cancel was requested; then
   it marks evict and start_endpoint done (they have nothing to do), claims execute, records the phase
   events of both no-op phases and execute's ``phase_start``, sets the busy slot and
   the job's ``running`` state — the same writes the phase-by-phase path makes — and
   reads what execute needs: the job's spec, its attempt counters and, for a job of a
   workload function, the instances registered on its GPUs.
2. The workload runs under one lease heartbeat (:meth:`PhaseRunner._workload`).
3. One fenced commit records execute's ``phase_end``, the clear phase's events, and
   the release and final state of :meth:`PhaseRunner._finish`.

Whenever a check of step 1 fails for any reason but a stale token (helper endpoints, a
redelivery that finds phases claimed, a cancel, an instance that is no longer resident)
nothing has been written, and the job goes the phase-by-phase way, which handles every
such case; so does a job whose resident process endpoint's process is gone (checked before
step 1: its start phase loads the endpoint again).
"""

from __future__ import annotations

import json
import time
from typing import Any

from makespan import telemetry
from makespan.errors import PhaseCancelled, PhaseError, StaleFencingToken
from makespan.registry import REGISTRY
from makespan.store import JobStore
from makespan.workers.drivers.registry import decode_instances
from makespan.workers.functions import WorkloadFailed
from makespan.workers.heartbeat import lease_clock
from makespan.workers.phases import JOB_PHASES, STOPS_CHAIN, LeaseHeartbeat, PhaseContext, PhaseRunner, instance_value

def _phase_events(runner: PhaseRunner, ctx: PhaseContext, phases: tuple[str, ...], t0: float) -> list[str]:
    out = []
    for p in phases:
        out.append(runner._event("phase_start", ctx, phase=p))
        out.append(runner._event("phase_end", ctx, phase=p, planned_s=0.0, actual_s=round(time.time() - t0, 6)))
    return out


def run_warm(runner: PhaseRunner, ctx: PhaseContext) -> str:
    """Run every phase of a warm job (see the module doc). Returns the final outcome
    like :meth:`PhaseRunner.run` of the last phase ("completed", "failed",
    "cancelled", "stale"), or the phase-by-phase path's outcome when it falls back. An
    error nobody anticipated fails the job and releases its lease at once, as in a
    phase (:meth:`PhaseRunner.guarded`).

    Raises:
        StoreError, redis.RedisError: Redis failed (the lease expires and its reclaim
            requeues the job)."""
    return runner.guarded(ctx, "execute", lambda: _run_warm(runner, ctx))


def _run_warm(runner: PhaseRunner, ctx: PhaseContext) -> str:
    """:func:`run_warm` without its catch of unexpected errors."""
    k = runner.keys
    # shutting down: a job leased to this host meanwhile (its liveness not yet withdrawn) is
    # handed back before its function starts, as the step-by-step path does: it ran a second
    # time once (a hostile-code check), after its first run was handed back at the SIGTERM
    handed = runner.hand_back(ctx)
    if handed is not None:
        return handed
    # a lease this worker's fleet cannot run (it differs from the planner's) fails in the
    # first of its phases, saying why
    if runner.fleet_problem(ctx, ()) is not None:
        return run_phases(runner, ctx)
    # a resident process endpoint whose process is gone: the start phase loads it again
    # (PhaseRunner._load; one Redis read, process endpoints only)
    if runner._dead_resident(runner.fleet.endpoints[ctx.endpoint], list(ctx.gpus)) is not None:
        return run_phases(runner, ctx)
    # The begin script renews the lease as the job starts, as PhaseRunner.run does (the
    # message may have waited in the queue for most of the TTL); a lease no longer ours
    # writes nothing.
    t0 = time.time()
    evs = _phase_events(runner, ctx, ("evict", "start_endpoint"), t0)
    evs.append(runner._event("phase_start", ctx, phase="execute"))
    # helper endpoints start and stop in their phases: the script says 'helpers' for a job
    # with any (PhaseRunner._helpers: its record's, else its function's in this registry)
    renewed_at = lease_clock()  # the lease's local deadline counts from here (LeaseHeartbeat)
    got = JobStore(runner.r, k, runner.settings.events_max_len).begin_warm(
        ctx.lease_id, ctx.token, ctx.gpus, ctx.job_id, instance_value(ctx.endpoint, ctx.gpus), t0, evs,
        runner.settings.lease_ttl_s, [name for name, d in REGISTRY.items() if d.helpers])
    if got.outcome == "stale":
        return "stale"
    if got.outcome != "ok":
        return run_phases(runner, ctx)
    attrs = {"job_id": ctx.job_id, "priority": ctx.priority or None, "endpoint": ctx.endpoint,
             "gpus": list(ctx.gpus), "host": ctx.host, "lease_id": ctx.lease_id, "kind": ctx.kind}
    for p in ("evict", "start_endpoint"):
        _noop_phase(runner, ctx, p, attrs)
    spec = json.loads(got.spec) if got.spec else {}
    payload = ctx.payload or spec.get("payload") or {}
    extra: dict[str, Any] = {}
    started = time.time()
    with LeaseHeartbeat(runner.leases, ctx.lease, runner.settings.lease_ttl_s, runner.settings.heartbeat_s,
                        renewed_at) as hb:
        try:
            with telemetry.phase_span("execute", ctx.traceparent, attrs) as span:
                # the attempt and the instances on the GPUs as begin_warm read them (no reads of their own)
                attempt = 1 + int(got.attempts or 0) + int(got.tries or 0)
                registered = None if got.instances is None else decode_instances(got.instances, with_state=True)
                runner._workload(ctx, hb, extra, payload, spec, attempt=attempt, registered=registered)
                span.set_attribute("makespan.planned_s", float(ctx.service_s))
        except StaleFencingToken as e:  # shutting down: handed back (PhaseRunner.hand_back)
            runner._observe_cut_short(ctx, "execute", started)
            return runner.hand_back(ctx, e) or "stale"
        except PhaseCancelled as e:  # as PhaseRunner.run: a cancel is not a failure
            runner._observe_cut_short(ctx, "execute", started)
            return runner._finish(ctx, "cancelled", f"execute: {e}")
        except WorkloadFailed as e:
            runner._observe_cut_short(ctx, "execute", started)
            return runner._workload_failed(ctx, e)
        except PhaseError as e:
            runner._observe_cut_short(ctx, "execute", started)
            return runner._finish(ctx, "failed", f"execute: {e}")
        actual_s = time.time() - started
        runner._observe(ctx, "execute", ctx.service_s, actual_s)
        _noop_phase(runner, ctx, "clear", attrs)
        now = time.time()
        extra_ops = extra.pop("_ops", [])
        ops: list[tuple] = [
            *extra_ops,
            ("XADD_E", k.events, runner._event("phase_end", ctx, phase="execute", planned_s=ctx.service_s,
                                                actual_s=round(actual_s, 6), **extra)),
            ("XADD_E", k.events, runner._event("phase_start", ctx, phase="clear")),
            ("XADD_E", k.events, runner._event("phase_end", ctx, phase="clear", planned_s=0.0,
                                                actual_s=round(time.time() - now, 6))),
            *runner._finish_ops(ctx, "completed", "", now)]
        # retried through a Redis blip; applied already when the job completed (only this lease can)
        if not runner.commit(ctx, ops, applied=lambda: runner.r.hget(k.job(ctx.job_id), "state") == "completed"):
            return "stale"
    return runner._finished(ctx, "completed", "", now)


def _noop_phase(runner: PhaseRunner, ctx: PhaseContext, phase: str, attrs: dict) -> None:
    """The span (when tracing is on) and metrics of a phase with nothing to do, as the
    phase-by-phase path records them."""
    if telemetry.tracing_enabled():
        with telemetry.phase_span(phase, ctx.traceparent, attrs) as span:
            span.set_attribute("makespan.planned_s", 0.0)
    runner._observe(ctx, phase, 0.0, 0.0)


def run_phases(runner: PhaseRunner, ctx: PhaseContext) -> str:
    """Every job phase one by one (each idempotent and fenced); stops at the first
    phase that fails, is cancelled or finds its lease stale."""
    out = "done"
    for phase in JOB_PHASES:
        out = runner.run(ctx, phase)
        if out in STOPS_CHAIN:
            break
    return out
