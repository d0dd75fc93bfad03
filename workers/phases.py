"""Phase logic for one leased GPU group: evict → start endpoint → execute → clear,
and evict → restore for set-point restores.

Every phase is idempotent (keyed by lease id and phase name in ``P:phase:{lease}``)
and fenced: it checks its lease's fencing token before acting and commits its
bookkeeping in one fenced script, so a stale holder's writes are no-ops. A phase
renews its lease as it starts (a message may have waited in its queue for most of the
TTL), then a heartbeat thread renews it while it runs; losing it stops the phase.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

import redis

from makespan import metrics, shutdown, telemetry
from makespan.errors import LeaseLostDuringPhase, PhaseCancelled, PhaseError, StaleFencingToken, StoreError
from makespan.redis_conn import is_store_bug
from makespan.registry import REGISTRY
from makespan.keys import WAKE_RELEASE, Keys
from makespan.models import FleetSpec, fleet_version
from makespan.settings import Settings
from makespan.workers.functions import WorkloadFailed, lookup
from makespan.workers.leases import LeaseStore, finish_job_op
from makespan.workers.heartbeat import DeferredWaits, LeaseHeartbeat, lease_clock
from makespan.workers.phase_context import PhaseContext, Registered, instance_value, parse_instance
from makespan.workers.phase_execute import ExecutePhase
from makespan.workers.phase_transitions import TransitionPhases

__all__ = ["BEFORE_EXECUTE", "JOB_PHASES", "RESTORE_BACKOFF_MAX_S", "RESTORE_BACKOFF_S", "RESTORE_PHASES", "STOPS_CHAIN",
           "DeferredWaits", "LeaseHeartbeat", "PhaseContext", "PhaseRunner", "Registered", "instance_value", "parse_instance"]

log = logging.getLogger("makespan.phases")


JOB_PHASES = ("evict", "start_endpoint", "execute", "clear")
RESTORE_PHASES = ("evict", "restore")
RESTORE_BACKOFF_S = 60.0  # wall s before a failed set-point restore of a group is tried again; doubles per failure
RESTORE_BACKOFF_MAX_S = 3600.0  # at most this long


def restore_failure(raw: str | None) -> dict:
    """``P:restore:failed:{gpu}`` (:meth:`PhaseRunner._restore_backoff_ops`) decoded:
    ``{"failures": int, "endpoint": str, "reason": str}`` (a bare count, as written before
    the reason was kept, gives empty texts; None: no failure, 0)."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        value = {}
    if isinstance(value, int):
        value = {"failures": value}
    if not isinstance(value, dict):
        value = {}
    return {"failures": int(value.get("failures") or 0), "endpoint": str(value.get("endpoint") or ""),
            "reason": str(value.get("reason") or "")}
# phase outcomes after which no later phase runs ("handed_back": the worker shuts down, the job is requeued)
STOPS_CHAIN = ("failed", "cancelled", "stale", "retried", "handed_back")
BEFORE_EXECUTE = ("evict", "start_endpoint")  # a job's phases before its workload runs


class PhaseRunner(TransitionPhases, ExecutePhase):
    """Runs phases for one GPU worker process: the phase protocol here (claim, heartbeat,
    fenced commit, hand-back, finish, clear), the transitions in
    :class:`makespan.workers.phase_transitions.TransitionPhases`, the execute phase in
    :class:`makespan.workers.phase_execute.ExecutePhase`."""

    def __init__(self, r: redis.Redis, settings: Settings, fleet: FleetSpec):
        self.r, self.settings, self.fleet = r, settings, fleet
        self.keys = Keys(settings.key_prefix)
        self.leases = LeaseStore(r, self.keys, settings.events_max_len)
        self._slowdown = settings.slowdown_by_host()  # modelled transitions' host factors
        self._gpu_memory = {g.uuid: g.memory_mib for h in fleet.hosts for g in h.gpus}
        self._fleet_version = fleet_version(fleet)
        # a release wakes the planner of the GPUs' pool (the implicit pool's without pools)
        self._wake_key = {g.uuid: self.keys.for_pool(fleet.pool_of_host(h.name)).planner_wake
                          for h in fleet.hosts for g in h.gpus}
        try:
            from makespan.workers.agenda import AgendaTracker

            self.agenda = AgendaTracker(r, self.keys)
        except ImportError:  # pragma: no cover - agenda module missing
            self.agenda = None

    # -- helpers ---------------------------------------------------------------------
    def _event(self, kind: str, ctx: PhaseContext, **extra: Any) -> str:
        body = {"ts": time.time(), "kind": kind, "job": ctx.job_id or None, "lease": ctx.lease_id, "gpus": ctx.gpus,
                "host": ctx.host, "endpoint": ctx.endpoint, "priority": ctx.priority or None,
                "time_scale": self.settings.time_scale, **extra}
        return json.dumps({k: v for k, v in body.items() if v is not None}, separators=(",", ":"))

    def _sleep(self, workload_s: float, hb: LeaseHeartbeat, ctx: PhaseContext) -> None:
        """Sleep ``workload_s`` scaled to wall time (execute of a job with no function nor
        requests), waking every 50 ms to notice a lost lease, the job's requested cancel
        (:meth:`_stopper`, as a function's run sees it) or the GPU worker's shutdown
        (:data:`makespan.shutdown.SHUTTING_DOWN`: the sleep is given up, as a function's run
        is, and the caller hands the lease back).

        Raises:
            StaleFencingToken: the lease was lost, or the worker shuts down.
            PhaseCancelled: the job's cancel was requested."""
        self._paced_cancellable(ctx, hb, "its execute (a wait of service_s)")(workload_s * self.settings.time_scale)

    @staticmethod
    def _given_up_at_shutdown(ctx: PhaseContext, what: str) -> None:
        """Raise StaleFencingToken when the GPU worker shuts down
        (:data:`makespan.shutdown.SHUTTING_DOWN`): an execute, a cold start or a wake that
        stopped early for it is given up and its lease handed back (:meth:`hand_back`; a
        cancel requested meanwhile still ends the job cancelled: the reclaim's script reads
        it). Nothing otherwise."""
        if shutdown.SHUTTING_DOWN.is_set():
            log.info("job %s: the GPU worker is shutting down: %s; its lease is handed back, which requeues the "
                        "job", ctx.job_id, what)
            raise StaleFencingToken(f"the GPU worker is shutting down: {what}")

    @staticmethod
    def _wait_wall(wall_s: float, hb: LeaseHeartbeat, cancelled: Callable[[], bool] | None = None) -> None:
        """Wait ``wall_s`` wall seconds, waking every 50 ms to notice a lost lease and,
        with ``cancelled`` (e.g. :meth:`_stopper`), a requested cancel (a Redis error
        while asking is not a cancel: the wait goes on).

        Raises:
            StaleFencingToken: the lease was lost meanwhile.
            PhaseCancelled: ``cancelled()`` said True."""
        end = time.monotonic() + wall_s
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            if hb.lost.wait(min(left, 0.05)):
                raise LeaseLostDuringPhase(f"lease {hb.lease.lease_id} lost during phase")
            try:
                stop = cancelled is not None and cancelled()
            except (StoreError, redis.RedisError) as e:
                log.warning("lease %s: cancel not checked during a wait: %s", hb.lease.lease_id, e)
                stop = False
            if stop and not hb.lost.is_set():
                raise PhaseCancelled(f"cancelled while waiting ({wall_s - max(left, 0.0):.3f} of {wall_s:.3f} wall s)")

    def _done(self, ctx: PhaseContext, phase: str) -> bool:
        return self.r.hget(self.keys.phase(ctx.lease_id), phase) == "done"

    def _residents(self, gpus: list[str]) -> dict[str, str | None]:
        vals = self.r.mget([self.keys.resident(g) for g in gpus])
        return dict(zip(gpus, vals))

    def _transition(self, op: str, ctx: PhaseContext, endpoints: list[str], expected_s: float):
        """A POSITIVE agenda entry for a planned transition expected to take ``expected_s``
        workload seconds, and at least the largest ``min_transition_wall_s`` of the
        endpoints' drivers in wall time (a real process's start-up: interpreter, imports,
        port; it does not shrink with the time scale)."""
        if self.agenda is None:
            from contextlib import nullcontext

            return nullcontext()
        floor_s = max((self._capabilities(self.fleet.endpoints[e].launch.driver).min_transition_wall_s
                       for e in endpoints if e in self.fleet.endpoints), default=0.0)
        wall_s = max(expected_s * self.settings.time_scale, floor_s)
        return self.agenda.register(f"{ctx.lease_id}:{op}", "POSITIVE", endpoints, list(ctx.gpus),
                                    expected_duration_s=max(wall_s, 0.001),
                                    lock_ttl_s=max(self.settings.lease_ttl_s, 1.0))

    # -- the phase entry point -----------------------------------------------------------
    def run(self, ctx: PhaseContext, phase: str) -> str:
        """Run one phase. Returns "done", "skipped" (already done: idempotent replay),
        "stale" (lease no longer ours: nothing done), "cancelled", "failed", "retried"
        (a workload function failed and its job waits for its next try) or "handed_back"
        (the GPU worker shuts down: :meth:`hand_back`). An error nobody anticipated fails
        the job and releases the lease (:meth:`guarded`).

        Raises:
            StoreError, redis.RedisError: Redis failed (the lease expires and its reclaim
                requeues the job)."""
        return self.guarded(ctx, phase, lambda: self._run(ctx, phase))

    def guarded(self, ctx: PhaseContext, phase: str, body: Callable[[], str]) -> str:
        """``body()`` (one phase, or the warm path's phases: :func:`makespan.workers.warm.run_warm`)
        under the one catch for an error no phase anticipated (a bug, a plug-in driver's
        ``RuntimeError``, a ``KeyError``): the job fails through the normal path
        (:meth:`_finish`, fenced: the lease and its GPUs are released at once, not held to
        the TTL, and the planner is woken), with the error's type, message and place as
        its reason and the traceback in its final event and the worker's log; a restore
        lease ends failed likewise. Returns ``body()``'s outcome, else that of the finish
        ("failed", or "stale" when the lease was no longer ours).

        A Redis error that is a bug (:func:`makespan.redis_conn.is_store_bug`: a script
        that raised, ``WRONGTYPE``, wrong arguments) is such an unanticipated error too:
        another attempt would hit it again.

        Raises:
            StoreError, redis.RedisError: from ``body()``: Redis failed, so nothing could be
                recorded; the lease expires and its reclaim requeues the job (the
                designed path of a crash or a Redis outage)."""
        try:
            return body()
        except (StoreError, redis.RedisError) as e:
            if is_store_bug(e):
                return self._crashed(ctx, phase, e)
            raise
        except StaleFencingToken as e:
            return self.hand_back(ctx, e) or "stale"
        except Exception as e:  # noqa: BLE001 - the one catch of errors no phase anticipated
            return self._crashed(ctx, phase, e)

    def _preempted(self, ctx: PhaseContext) -> bool:
        """Whether ``ctx``'s job lost its lease to a preemption: its record names that lease as
        the one its last preemption cut (``preempted_lease``, written by ``preempt.lua``;
        read also after the job was leased again and its reason rewritten: a routine
        preemption was logged as a lost lease), or names another lease, or none, with a
        reason that says ``preempted by``; False when Redis cannot say."""
        try:
            lease, reason, cut = self.r.hmget(self.keys.job(ctx.job_id), "lease", "reason", "preempted_lease")
        except redis.RedisError:
            return False
        return cut == ctx.lease_id or (lease != ctx.lease_id and (reason or "").startswith("preempted by"))

    def hand_back(self, ctx: PhaseContext, error: StaleFencingToken | None = None) -> str | None:
        """While the GPU worker shuts down (:data:`makespan.shutdown.SHUTTING_DOWN`), give a
        job's lease back at once instead of leaving it to expire: its GPUs are freed and
        its job requeued (or delayed, failed after ``max_attempts``, cancelled) by the
        reclaim's own script and attempt accounting, fenced by the lease's token
        (:meth:`makespan.store.LeaseStore.hand_back`), and the planner of its GPUs' pool is
        woken. Called when a job's phase ends early (its workload function was told to
        stop), a phase before execute is done, or execute would begin, during shutdown.

        ``error``: the StaleFencingToken that ended the phase; a lease lost mid-phase
        (:class:`makespan.errors.LeaseLostDuringPhase`) outside a shutdown is logged as a
        warning (a paused worker's resumed run said nothing at the default level).

        Returns:
            "handed_back"; "stale" (the lease was no longer ours: nothing written); None
            when there is nothing to hand back (not shutting down, or a restore lease).
        Raises:
            StoreError: Redis failed (the lease then expires and its reclaim requeues the job)."""
        if ctx.kind != "job" or not shutdown.SHUTTING_DOWN.is_set():
            if isinstance(error, LeaseLostDuringPhase):  # said at the default level: it was silent
                if self._preempted(ctx):  # routine under priorities: not a warning (SRE's soak check)
                    log.info("job %s: preempted while its phase ran (lease %s): this run is given up; the job was "
                             "requeued by the preemption", ctx.job_id, ctx.lease_id)
                elif ctx.kind != "job":  # a restore or prewarm: no job to requeue; the planner restores again
                    log.warning("%s of %s on %s: its lease %s was lost while its phase ran (not renewed within the "
                                "lease TTL: this worker was paused, overloaded or cut off from Redis): this run is "
                                "given up; the planner plans the set point again", ctx.kind, ctx.endpoint,
                                ",".join(ctx.gpus), ctx.lease_id)
                else:
                    log.warning("job %s: its lease %s was lost while its phase ran (not renewed within the lease "
                                "TTL: this worker was paused, overloaded or cut off from Redis): this run is given "
                                "up; the lease's reclaim requeues the job (fails it after max_attempts)",
                                ctx.job_id, ctx.lease_id)
            return None
        return self._give_back(ctx, "worker_shutdown", "the GPU worker shuts down")

    def _give_back(self, ctx: PhaseContext, cause: str, why: str) -> str:
        """Hand ``ctx``'s lease back now (:meth:`makespan.store.LeaseStore.hand_back` with
        ``cause``; ``why`` for the log) and wake the planner of its GPUs' pool. Returns
        "handed_back", or "stale" (the lease was no longer ours: nothing written).

        Raises:
            StoreError: Redis failed (the lease then expires and its reclaim requeues the job)."""
        wake = self._wake_of(ctx)
        outcome, _job = self.leases.hand_back(ctx.lease, self.settings.max_attempts, self.settings.retry_backoff_s,
                                              self.settings.retry_backoff_max_s, wake_key=wake, cause=cause)
        if outcome == "stale":
            log.info("job %s: lease %s no longer ours (%s): nothing handed back", ctx.job_id, ctx.lease_id, why)
            return "stale"
        metrics.lease_reclaimed(cause)
        # a shutdown's hand-back is a planned restart's (an SRE: two WARNINGs per job at every rolling restart)
        (log.info if cause == "worker_shutdown" else log.warning)("job %s: %s: lease %s handed back, job %s",
                                                                  ctx.job_id, why, ctx.lease_id, outcome)
        return "handed_back"

    def pool_process_lost(self, ctx: PhaseContext, error: str) -> str:
        """In a prefork GPU worker's main process: the pool process that ran a phase of
        ``ctx``'s job died (a workload function's segmentation fault, ``os._exit``, the OOM
        killer; Celery's ``WorkerLostError``, ``error``). The lease is given back at once,
        counting an attempt (cause ``worker_lost``; :meth:`makespan.store.LeaseStore.hand_back`):
        the job is requeued after the retry backoff, or fails after ``max_attempts`` with
        that error, instead of waiting out the lease TTL and a reason that blamed a GPU
        worker that "stopped renewing" it. Endpoints the dead process started are left to
        the next start phase on those GPUs, as after a reclaim. Returns the outcome
        (``requeued``, ``failed``, ``completed`` when its execute had ended, ...) or
        ``stale`` (the lease was no longer held: nothing written).

        Raises:
            StoreError: Redis failed (the lease then expires and its reclaim requeues the job)."""
        wake = self._wake_of(ctx)
        outcome, _job = self.leases.hand_back(ctx.lease, self.settings.max_attempts, self.settings.retry_backoff_s,
                                              self.settings.retry_backoff_max_s, wake_key=wake, cause="worker_lost",
                                              error=f"the GPU worker's pool process running it died: {error}")
        if outcome != "stale":
            metrics.lease_reclaimed("worker_lost")
        log.error("job %s: the pool process running its phase on %s (GPUs %s) died: %s; lease %s %s", ctx.job_id,
                  ctx.host, ", ".join(ctx.gpus), error, ctx.lease_id,
                  "no longer ours: nothing handed back" if outcome == "stale" else f"handed back, job {outcome}")
        return outcome

    def _wake_of(self, ctx: PhaseContext) -> str:
        """The planner wake list of the pool of ``ctx``'s GPUs (the fleet's one without pools)."""
        return self._wake_key.get(ctx.gpus[0], self.keys.planner_wake) if ctx.gpus else self.keys.planner_wake

    def _start_failed(self, ctx: PhaseContext, error: PhaseError) -> str:
        """The job's start phase failed (its endpoint's start or wake did not pass the health
        check, its process exited, a helper did not start; the driver stopped what it
        spawned): stop the helpers started for it, then give the lease back counting an
        attempt (:meth:`makespan.store.LeaseStore.hand_back`, cause ``start_failed``): the
        job is requeued, after the retry backoff (``MAKESPAN_RETRY_BACKOFF_S``), with a
        reason naming the error, and fails after ``max_attempts`` with the last start's
        error, as a job whose GPU worker died is (a start can fail for a passing reason: a
        port taken, memory another process still held). Returns "failed" when it failed,
        "retried" when it was requeued, "stale" when the lease was no longer ours.

        Raises:
            StoreError: Redis failed (the lease then expires and its reclaim requeues the job)."""
        self._stop_helpers(ctx)
        wake = self._wake_of(ctx)
        outcome, _job = self.leases.hand_back(ctx.lease, self.settings.max_attempts, self.settings.retry_backoff_s,
                                              self.settings.retry_backoff_max_s, wake_key=wake, cause="start_failed",
                                              error=f"start_endpoint: {error}")
        if outcome == "stale":
            log.info("job %s: lease %s no longer ours after its start failed: nothing handed back", ctx.job_id,
                     ctx.lease_id)
            return "stale"
        metrics.lease_reclaimed("start_failed")
        log.warning("job %s: start_endpoint failed on %s (GPUs %s): %s; lease %s handed back, job %s", ctx.job_id,
                    ctx.host, ", ".join(ctx.gpus), error, ctx.lease_id, outcome)
        return "failed" if outcome == "failed" else "retried" if outcome == "requeued" else outcome

    def _crashed(self, ctx: PhaseContext, phase: str, error: Exception) -> str:
        """Fail ``ctx``'s job (or restore) after ``error`` escaped ``phase``: see :meth:`guarded`."""
        text = "".join(traceback.format_exception(error))
        frames = traceback.extract_tb(error.__traceback__)
        where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
        final = "failed" if ctx.kind == "job" else "restore_end"
        message = " ".join(str(error).split())[:1000]  # one line, bounded: the reason is shown as one
        reason = (f"{phase}: unexpected error in the GPU worker on {ctx.host}: {type(error).__qualname__}: "
                  f"{message}{where} (traceback in the worker's log and the job's '{final}' event)")
        log.error("lease %s, phase %s: unexpected error; failing it and releasing the lease", ctx.lease_id, phase,
                  exc_info=error)
        return self._finish(ctx, "failed", reason, event_fields={"traceback": text[-16000:]})

    def fleet_problem(self, ctx: PhaseContext, helpers: tuple[str, ...]) -> str | None:
        """Why this worker's fleet cannot run ``ctx``'s lease as the planner planned it (its
        fleet file differs from the planner's): the endpoint or a helper ``helpers`` names
        is missing, the lease's host or one of its GPUs is unknown, or the endpoint's
        tensor-parallel size is not the lease's GPU count; None when it can. The message
        names this worker's fleet version and the one the planner published."""
        eps = self.fleet.endpoints
        host = next((h for h in self.fleet.hosts if h.name == ctx.host), None)
        missing = [name for name in (ctx.endpoint, *helpers) if name not in eps]
        known = set() if host is None else {g.uuid for g in host.gpus}
        unknown = [g for g in ctx.gpus if g not in known]
        if missing:
            what = f"has no endpoint {', '.join(repr(m) for m in missing)}"
        elif host is None:
            what = f"has no host {ctx.host!r}"
        elif unknown:
            what = f"has no GPU {', '.join(unknown)} on host {ctx.host!r}"
        elif eps[ctx.endpoint].tensor_parallel != len(ctx.gpus):
            what = (f"gives endpoint {ctx.endpoint!r} tensor_parallel {eps[ctx.endpoint].tensor_parallel}, but its "
                    f"lease holds {len(ctx.gpus)} GPUs")
        else:
            return None
        published = self.r.get(self.keys.fleet_version)
        theirs = f"version {published}" if published else "none published"
        return (f"this GPU worker's fleet (version {self._fleet_version}) {what}; it differs from the planner's "
                f"({theirs}): start the planner and the GPU workers with the same fleet file")

    def _run(self, ctx: PhaseContext, phase: str) -> str:
        """:meth:`run` without its catch of unexpected errors."""
        lease = ctx.lease
        # Renew as the phase starts (not one heartbeat interval in): a message that waited
        # in the queue longer than TTL minus the heartbeat interval must still find its lease.
        renewed_at = lease_clock()  # the lease's local deadline counts from here (LeaseHeartbeat)
        if not self.leases.renew(lease, self.settings.lease_ttl_s):
            log.info("phase %s of lease %s: stale fencing token, not acting", phase, ctx.lease_id)
            return "stale"
        if self._done(ctx, phase):
            return "skipped"
        if phase in ("start_endpoint", "execute"):  # shutting down: a start or a workload that would begin is
            handed = self.hand_back(ctx)  # handed back instead (an evict runs: a victim is not left half-stopped)
            if handed is not None:
                return handed
        record: tuple[str | None, str | None] | None = None  # the job's (fn, helpers), read once in its evict
        if phase == "evict" and ctx.kind == "job":
            record = self.r.hmget(self.keys.job(ctx.job_id), "fn", "helpers")
            if record[0] and record[0] not in REGISTRY:  # before any transition: no model loaded for nothing
                try:
                    lookup(record[0], ctx.host)
                except WorkloadFailed as e:  # handed back when another host has it, else failed
                    return self._workload_failed(ctx, e, "before its first phase")
        # The claim checks the lease again, in the same script: a reclaim (or preemption)
        # between the renew above and here dropped the lease and its phase hash, and a bare
        # HSETNX recreated that hash (with no TTL) and ran a phase of a lease no longer held.
        claim = self.leases.claim_phase(lease, phase)
        if claim == "stale":
            log.info("phase %s of lease %s: lease lost before the claim, not acting", phase, ctx.lease_id)
            return "stale"
        if claim == "claimed_before":
            # A second delivery of a phase already running (the broker restores unacked
            # messages when a connection drops): stop this copy and its chain.
            log.info("phase %s of lease %s: duplicate delivery, not acting", phase, ctx.lease_id)
            return "stale"
        with LeaseHeartbeat(self.leases, lease, self.settings.lease_ttl_s, self.settings.heartbeat_s,
                            renewed_at) as hb:
            if ctx.kind == "job" and phase != "clear" and self.r.hget(self.keys.job(ctx.job_id), "cancel_requested") == "1":
                return self._finish(ctx, "cancelled", "cancelled while running")
            started = time.time()
            self.leases.fenced(lease, [("XADD_E", self.keys.events, self._event("phase_start", ctx, phase=phase))])
            began = False  # the phase's own work began (not refused by the fleet check)
            attrs = {"job_id": ctx.job_id or None, "priority": ctx.priority or None, "endpoint": ctx.endpoint,
                     "gpus": list(ctx.gpus), "host": ctx.host, "lease_id": ctx.lease_id, "kind": ctx.kind}
            try:
                with telemetry.phase_span(phase, ctx.traceparent, attrs) as span:
                    # the endpoint, host and GPUs in every phase (no Redis read); the job's helpers,
                    # one read of its record, in the lease's first phase only (a job and a restore
                    # both start with evict): not one round trip more per phase
                    problem = self.fleet_problem(ctx, self._helpers(ctx, record) if phase == "evict" else ())
                    if problem is not None:  # before any change: nothing of the lease's phases is done
                        raise PhaseError(problem)
                    began = True
                    extra: dict[str, Any] = {}
                    planned = getattr(self, f"_phase_{phase}")(ctx, hb, extra)
                    span.set_attribute("makespan.planned_s", float(planned))
            except StaleFencingToken as e:
                self._observe_cut_short(ctx, phase, started)
                return self.hand_back(ctx, e) or "stale"
            except PhaseCancelled as e:
                self._observe_cut_short(ctx, phase, started)
                return self._finish(ctx, "cancelled", f"{phase}: {e}")
            except WorkloadFailed as e:
                self._observe_cut_short(ctx, phase, started)
                return self._workload_failed(ctx, e)
            except PhaseError as e:
                self._observe_cut_short(ctx, phase, started)
                if phase == "start_endpoint" and ctx.kind == "job" and began:
                    return self._start_failed(ctx, e)
                return self._finish(ctx, "failed", f"{phase}: {e}")
            self._observe(ctx, phase, planned, time.time() - started)
            extra_ops = extra.pop("_ops", [])
            ops = [*extra_ops, ("HSET", self.keys.phase(ctx.lease_id), phase, "done"),
                   ("XADD_E", self.keys.events, self._event("phase_end", ctx, phase=phase, planned_s=planned,
                                                            actual_s=round(time.time() - started, 6), **extra))]
            done = lambda: self.r.hget(self.keys.phase(ctx.lease_id), phase) == "done"  # noqa: E731
            if not self.commit(ctx, ops, applied=done):
                return "stale"
        if phase == "clear" or phase == "restore":
            return self._finish(ctx, "completed", "")
        if phase in BEFORE_EXECUTE:  # shutting down: its execute would wait for the next worker
            return self.hand_back(ctx) or "done"
        return "done"

    def commit(self, ctx: PhaseContext, ops: list[tuple], applied: Callable[[], bool]) -> bool:
        """Apply a phase's outcome ``ops``, fenced by the lease; False when the lease is gone.
        A Redis error (a restart, a failover, a dropped connection) is retried with backoff
        for up to the lease TTL, while the heartbeat keeps the lease (a run whose commit is
        lost would run again once its lease expired); before each retry ``applied()`` is
        asked whether the failed try was applied anyway (its reply lost): then it is not
        applied twice. A Redis error that is a bug (:func:`makespan.redis_conn.is_store_bug`:
        a script that raised, ``WRONGTYPE``, wrong arguments) is not retried: every try would
        fail the same way.

        Raises:
            StoreError, redis.RedisError: Redis still failed after the lease TTL (the lease
                has expired by then), or at once for a bug."""
        give_up = time.monotonic() + self.settings.lease_ttl_s
        pause_s = 0.1
        while True:
            try:
                return self.leases.fenced(ctx.lease, ops)
            except (StoreError, redis.RedisError) as e:
                if is_store_bug(e) or time.monotonic() + pause_s > give_up:
                    raise  # a bug fails the same way every try: raised at once (guarded() fails the job)
                log.warning("lease %s: commit failed (%s); retrying in %.1f s", ctx.lease_id, e, pause_s)
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 2.0)
            try:
                if applied():
                    return True
            except (StoreError, redis.RedisError):
                pass  # still down: the next try says

    def _observe(self, ctx: PhaseContext, phase: str, planned_s: float, actual_s: float) -> None:
        """Prometheus: phase duration and its GPU-seconds (busy for execute, transition
        otherwise: :func:`makespan.metrics.phase`, once), the clear transition (the others
        are observed where they ran, ``_timed``)."""
        metrics.phase(phase, actual_s, len(ctx.gpus))
        if phase == "clear" and planned_s > 0:
            metrics.transition("clear", actual_s)

    @staticmethod
    def _observe_cut_short(ctx: PhaseContext, phase: str, started: float) -> None:
        """Prometheus: the GPU-seconds of a phase that ended early, since ``started`` (unix s)
        (:func:`makespan.metrics.phase_cut_short`)."""
        metrics.phase_cut_short(phase, time.time() - started, len(ctx.gpus))

    def _phase_clear(self, ctx: PhaseContext, hb: LeaseHeartbeat, extra: dict) -> float:
        # Per-job state on the instance (request leases, caches) is dropped here; the
        # endpoint itself stays resident (warm) for the next job that needs it. Helper
        # endpoints the start phase started for this job are stopped (the design notes'
        # clear_embeddings), unregistered first so the observer sees no failure.
        self.r.delete(self.keys.busy(ctx.lease_id))
        raw = self.r.hget(self.keys.phase(ctx.lease_id), "helpers")
        ids = set(json.loads(raw)) if raw else set()
        if not ids:
            return 0.0
        helpers = [i for i in self._leftovers_on(ctx.gpus) if i.id in ids]
        evict_s = max((self.fleet.endpoints[i.endpoint].evict_s for i in helpers), default=0.0)
        with self._transition("clear", ctx, sorted({i.endpoint for i in helpers}), evict_s):
            modelled = DeferredWaits()  # the helpers' modelled stops run as one: the longest
            for inst in helpers:
                self._stop_instance(inst, modelled.add)
            if helpers and not any(self._capabilities(i.driver).spawns_process for i in helpers):
                self._wait_wall(modelled.longest_s, hb)
        extra["cleared"] = sorted({i.endpoint for i in helpers})
        return evict_s

    # -- completion --------------------------------------------------------------------
    def _finish(self, ctx: PhaseContext, state: str, reason: str, extra_ops: list[tuple] | None = None,
                event_fields: dict[str, Any] | None = None) -> str:
        """Release the lease and, for a job, record its final state — atomically, fenced
        (with ``extra_ops``, e.g. the stored error of a failed workload function, and
        ``event_fields`` added to the final event, e.g. a traceback)."""
        now = time.time()
        if ctx.kind == "job":
            self._stop_helpers(ctx)
        ops = [*(extra_ops or []), *self._finish_ops(ctx, state, reason, now, event_fields)]
        if not self.leases.fenced(ctx.lease, ops):
            return "stale"
        return self._finished(ctx, state, reason, now)

    def _stop_helpers(self, ctx: PhaseContext) -> None:
        """Stop the helper endpoints started for this lease (a job that ends before its
        clear phase: cancelled, failed, retried). Best effort: leftovers on these GPUs are
        stopped by the next start phase there anyway."""
        try:
            raw = self.r.hget(self.keys.phase(ctx.lease_id), "helpers")
            ids = set(json.loads(raw)) if raw else set()
            for inst in [i for i in self._leftovers_on(ctx.gpus) if i.id in ids]:
                self._stop_instance(inst)
        except Exception as e:  # noqa: BLE001 - best effort (a Redis error, a driver's own error): never blocks the finish
            log.warning("job %s: helper endpoints not stopped: %s: %s", ctx.job_id, type(e).__name__, e)

    def _release_ops(self, ctx: PhaseContext) -> list[tuple]:
        """Fenced ops that free the lease's GPUs and forget the lease (and wake the planner)."""
        ops: list[tuple] = [("DEL", self.keys.gpu(g)) for g in ctx.gpus]
        wake = self._wake_of(ctx)
        # at the head of the wake list, which every push trims to its first 16: a burst of
        # submits behind it never drops a release (the planner then plans at once)
        return ops + [("LPUSH", wake, WAKE_RELEASE), ("LTRIM", wake, 0, 15),
                      ("DEL", self.keys.lease(ctx.lease_id)), ("ZREM", self.keys.leases, ctx.lease_id),
                      ("DEL", self.keys.phase(ctx.lease_id)), ("DEL", self.keys.busy(ctx.lease_id))]

    def _finish_ops(self, ctx: PhaseContext, state: str, reason: str, now: float,
                    event_fields: dict[str, Any] | None = None) -> list[tuple]:
        """The fenced ops of :meth:`_finish` (release, final state, event with
        ``event_fields``), for callers that commit them together with ops of their own."""
        ops = self._release_ops(ctx)
        more = event_fields or {}
        if ctx.kind == "job":
            ops.append(finish_job_op(self.keys, ctx.job_id, state, now, reason))  # lib.lua finish_job
            ops.append(("XADD_E", self.keys.events, self._event(state, ctx, reason=reason or None, **more)))
        else:
            ops.append(("XADD_E", self.keys.events, self._event("restore_end", ctx, outcome=state, reason=reason or None,
                                                                **more)))
            ops.extend(self._restore_backoff_ops(ctx, state, reason))
        # The fenced script checks the GPU keys before deleting them, so order is safe.
        return ops

    def _restore_backoff_ops(self, ctx: PhaseContext, state: str, reason: str = "") -> list[tuple]:
        """The ops that record a restore's outcome for the planner's next restores of this
        set-point group (:func:`makespan.workers.drain.start_restore` skips a group while
        its key lives): a failed restore sets ``P:restore:failed:{first GPU}`` to its count
        of consecutive failures, expiring after :data:`RESTORE_BACKOFF_S` × 2^(count − 1) s
        (at most :data:`RESTORE_BACKOFF_MAX_S`), and ``P:restore:failures:{first GPU}`` to
        :func:`restore_failure` JSON (the count, the endpoint, the last reason), which
        outlives the backoff by :data:`RESTORE_BACKOFF_MAX_S` (the count the next failure
        doubles the backoff from), so an endpoint that cannot start (a missing model, a
        GPU it does not fit) is not retried at every idle tick, each try holding the GPUs for
        its health timeout (the planner's drain check reports such a set point:
        ``set_points_failed``); a completed one deletes both keys (a cancelled one leaves them
        as they are)."""
        key, count_key = self.keys.restore_failed(ctx.gpus[0]), self.keys.restore_failures(ctx.gpus[0])
        if state != "failed":
            return [("DEL", key), ("DEL", count_key)] if state == "completed" else []
        try:
            failures = 1 + restore_failure(self.r.get(count_key))["failures"]
        except redis.RedisError:
            failures = 1
        backoff_s = min(RESTORE_BACKOFF_S * 2 ** (failures - 1), RESTORE_BACKOFF_MAX_S)
        value = json.dumps({"failures": failures, "endpoint": ctx.endpoint, "reason": reason[:500]})
        # the count outlives the backoff, so the next failure doubles it (the count went with
        # the backoff's key before: every retry waited the first 60 s, found by a verifier)
        return [("SET", key, str(failures), "PX", str(int(backoff_s * 1000))),
                ("SET", count_key, value, "PX", str(int((backoff_s + RESTORE_BACKOFF_MAX_S) * 1000)))]

    def _workload_name(self, ctx: PhaseContext) -> str | None:
        """The workload function a job calls (its spec's ``workload``), None for a plain job or
        when its record cannot be read (only for the log line of a job that did not complete)."""
        try:
            spec = json.loads(self.r.hget(self.keys.job(ctx.job_id), "spec") or "{}")
        except (ValueError, redis.RedisError):
            return None
        return spec.get("workload") if isinstance(spec, dict) else None

    def _finished(self, ctx: PhaseContext, state: str, reason: str, now: float) -> str:
        """After the finish ops committed: metrics, the job's root span (whatever its final
        state: a cancelled job's phase spans name it too; ERROR status for a failure only),
        a warning if not completed."""
        if ctx.kind == "job" and state in ("completed", "failed"):  # a cancel is neither
            (metrics.job_completed if state == "completed" else metrics.job_failed)(ctx.priority)
        if ctx.kind == "job":
            telemetry.end_job_span(ctx.traceparent, ctx.submitted_at or now,
                                   {"job_id": ctx.job_id, "priority": ctx.priority, "endpoint": ctx.endpoint,
                                    "gpus": list(ctx.gpus), "state": state, "reason": reason or None},
                                   error=(reason or state) if state == "failed" else None)
        if state != "completed":
            what = f"job {ctx.job_id}" if ctx.kind == "job" else f"restore of {ctx.endpoint} on {','.join(ctx.gpus)}"
            workload = self._workload_name(ctx) if ctx.kind == "job" else None
            named = f" (workload {workload}, {ctx.priority})" if workload else (f" ({ctx.priority})" if ctx.priority else "")
            # a cancel is what a user asked for: no operator need act on it (an SRE: WARNING paged on cancels)
            (log.info if state == "cancelled" else log.warning)("%s%s %s: %s", what, named, state, reason)
        return state
