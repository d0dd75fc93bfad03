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
import math
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from makespan import metrics, shutdown, telemetry
from makespan.errors import PhaseCancelled, PhaseError, StaleFencingToken, StoreError
from makespan.redis_conn import is_store_bug
from makespan.keys import WAKE_RELEASE, Keys
from makespan.models import FleetSpec, fleet_version
from makespan.settings import Settings
from makespan.driver_registry import DRIVERS, DriverCapabilities, DriverContext, no_wait
from makespan.planner.helpers import stacked_mib
from makespan.planner.sleepers import may_sleep, sleepers_kept
from makespan.workers.drivers.base import EndpointDriver, Instance
from makespan.workers.drivers.registry import (instances_on, list_sleepers, register_instance,
                                               retire_instance, set_instance_state, sleepers_on)
from makespan.estimates import (prior_s, read_transition_windows, record_ops,
                                 transition_estimate, transition_record_ops, wake_kind)
from makespan.registry import REGISTRY
from makespan.results import encode_error
from makespan.workers.functions import (WorkloadContext, WorkloadFailed, celery_progress_emitter, lookup,
                                        progress_writer, run_function)
from makespan.workers.leases import Lease, LeaseStore, delay_job_op, finish_job_op, start_job_op

log = logging.getLogger("makespan.phases")

# the registry's instances on a lease's GPUs with their states, as a caller already read them
# (the warm path's begin step: makespan.store.JobStore.begin_warm); None: read where needed
Registered = list[tuple[Instance, str]] | None

JOB_PHASES = ("evict", "start_endpoint", "execute", "clear")
RESTORE_PHASES = ("evict", "restore")
RESTORE_BACKOFF_S = 60.0  # wall s before a failed set-point restore of a group is tried again; doubles per failure
RESTORE_BACKOFF_MAX_S = 3600.0  # at most this long
# phase outcomes after which no later phase runs ("handed_back": the worker shuts down, the job is requeued)
STOPS_CHAIN = ("failed", "cancelled", "stale", "retried", "handed_back")
BEFORE_EXECUTE = ("evict", "start_endpoint")  # a job's phases before its workload runs


class DeferredWaits:
    """Notes the modelled waits of transitions that run as one (an evict of several
    instances: the planner prices it as its longest), to be spent once, as the longest."""

    def __init__(self) -> None:
        self.longest_s = 0.0

    def add(self, wall_s: float) -> None:
        """Note a modelled wait of ``wall_s`` wall seconds (the driver's ``wait``)."""
        self.longest_s = max(self.longest_s, wall_s)


class LeaseHeartbeat:
    """Renews a lease every ``interval_s`` from a daemon thread until stopped.
    ``lost`` is set as soon as a renewal finds the lease no longer ours; a Redis error is
    transient (logged; the next renewal comes ``interval_s`` later).

    The thread is started when the first renewal is due, ``interval_s`` after
    :meth:`__enter__` (by this process's :class:`_HeartbeatStarter`): most jobs end
    before that and never start one."""

    def __init__(self, store: LeaseStore, lease: Lease, ttl_s: float, interval_s: float):
        self.store, self.lease, self.ttl_s, self.interval_s = store, lease, ttl_s, interval_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._t: threading.Thread | None = None  # started by _STARTER when the first renewal is due

    def _start(self) -> None:
        self._t = threading.Thread(target=self._run, name=f"heartbeat-{self.lease.lease_id}", daemon=True)
        self._t.start()

    def _run(self) -> None:
        # started by the starter when the first renewal is due: renew at once, then every interval_s
        while True:
            try:
                if not self.store.renew(self.lease, self.ttl_s):
                    self.lost.set()
                    return
            except redis.RedisError as e:  # transient: the TTL gives us slack
                log.warning("lease %s heartbeat failed: %s", self.lease.lease_id, e)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> LeaseHeartbeat:
        _STARTER.add(self, time.monotonic() + self.interval_s)
        return self

    def __exit__(self, *exc: Any) -> None:
        if _STARTER.discard(self):
            return  # no renewal was due yet: no thread was started
        self._stop.set()
        if self._t is not None and self._t.ident is not None:
            self._t.join(timeout=2)


class _HeartbeatStarter:
    """Starts each running :class:`LeaseHeartbeat`'s thread when its first renewal is due,
    from one daemon thread per process that does no Redis I/O itself (a blocked renewal
    holds up only its own lease's thread, as before)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[LeaseHeartbeat, float] = {}  # waiting heartbeats -> first renewal due, monotonic s
        self._thread: threading.Thread | None = None
        # when the starter's thread wakes by itself (monotonic s; inf: it waits for a notify)
        self._wake_at_s = math.inf

    def add(self, hb: LeaseHeartbeat, due_s: float) -> None:
        """Start ``hb``'s thread at monotonic ``due_s`` unless :meth:`discard` comes first."""
        with self._cond:
            self._due[hb] = due_s
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="heartbeat-starter", daemon=True)
                self._thread.start()
            elif due_s < self._wake_at_s:
                # wake it only when it would sleep past this due time (not once per job: a job
                # that ended before its renewal left the thread asleep until that earlier time)
                self._cond.notify()

    def discard(self, hb: LeaseHeartbeat) -> bool:
        """Forget ``hb``; True when its thread was not started (else it runs: stop and join it)."""
        with self._cond:
            return self._due.pop(hb, None) is not None

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for hb in [hb for hb, due_s in self._due.items() if due_s <= now]:
                    del self._due[hb]
                    try:
                        hb._start()  # under the lock: discard() then knows it started
                    except RuntimeError as e:  # no thread to be had: this lease goes unrenewed
                        log.error("lease %s: heartbeat thread not started: %s", hb.lease.lease_id, e)
                earliest = min(self._due.values(), default=None)
                self._wake_at_s = math.inf if earliest is None else earliest
                self._cond.wait(None if earliest is None else max(earliest - now, 0.0))

    def reset(self) -> None:
        """A forked child's fresh state (no thread of the parent runs there)."""
        self._cond = threading.Condition()
        self._due = {}
        self._thread = None
        self._wake_at_s = math.inf


_STARTER = _HeartbeatStarter()
os.register_at_fork(after_in_child=_STARTER.reset)


@dataclass
class PhaseContext:
    """Everything a phase task needs; travels as the JSON task argument."""

    lease_id: str
    token: int
    gpus: list[str]
    host: str
    kind: str  # "job" or "restore"
    endpoint: str
    job_id: str = ""
    priority: str = ""
    service_s: float = 0.0
    payload: dict | None = None
    traceparent: str = ""
    submitted_at: float = 0.0
    # the plan's transition choice (issue 20 point 3, ``Assignment.sleep_levels``): evicted
    # endpoint -> sleep level 1 or 2, 0 = stop; an endpoint absent: the fleet file's sleep_level
    sleep_levels: dict[str, int] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PhaseContext:
        return cls(**d)

    @property
    def lease(self) -> Lease:
        return Lease(self.lease_id, int(self.token), tuple(self.gpus))


def instance_value(endpoint: str, gpus: list[str] | tuple[str, ...]) -> str:
    """Value of ``P:resident:{uuid}``: ``endpoint@uuid1,uuid2`` names one instance."""
    return f"{endpoint}@{','.join(gpus)}"


def parse_instance(value: str | None) -> tuple[str, list[str]] | None:
    if not value:
        return None
    ep, _, gpus = value.partition("@")
    return ep, gpus.split(",") if gpus else []


class PhaseRunner:
    """Runs phases for one GPU worker process."""

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
            log.warning("job %s: the GPU worker is shutting down: %s; its lease is handed back, which requeues the "
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
                raise StaleFencingToken(f"lease {hb.lease.lease_id} lost during phase")
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
        except StaleFencingToken:
            return self.hand_back(ctx) or "stale"
        except Exception as e:  # noqa: BLE001 - the one catch of errors no phase anticipated
            return self._crashed(ctx, phase, e)

    def hand_back(self, ctx: PhaseContext) -> str | None:
        """While the GPU worker shuts down (:data:`makespan.shutdown.SHUTTING_DOWN`), give a
        job's lease back at once instead of leaving it to expire: its GPUs are freed and
        its job requeued (or delayed, failed after ``max_attempts``, cancelled) by the
        reclaim's own script and attempt accounting, fenced by the lease's token
        (:meth:`makespan.store.LeaseStore.hand_back`), and the planner of its GPUs' pool is
        woken. Called when a job's phase ends early (its workload function was told to
        stop), a phase before execute is done, or execute would begin, during shutdown.

        Returns:
            "handed_back"; "stale" (the lease was no longer ours: nothing written); None
            when there is nothing to hand back (not shutting down, or a restore lease).
        Raises:
            StoreError: Redis failed (the lease then expires and its reclaim requeues the job)."""
        if ctx.kind != "job" or not shutdown.SHUTTING_DOWN.is_set():
            return None
        wake = self._wake_key.get(ctx.gpus[0], self.keys.planner_wake) if ctx.gpus else self.keys.planner_wake
        outcome, _job = self.leases.hand_back(ctx.lease, self.settings.max_attempts, self.settings.retry_backoff_s,
                                              self.settings.retry_backoff_max_s, wake_key=wake)
        if outcome == "stale":
            log.info("job %s: lease %s no longer ours at shutdown: nothing handed back", ctx.job_id, ctx.lease_id)
            return "stale"
        metrics.lease_reclaimed("worker_shutdown")
        log.warning("job %s: the GPU worker shuts down: lease %s handed back, job %s", ctx.job_id, ctx.lease_id,
                    outcome)
        return "handed_back"

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
        if not self.leases.renew(lease, self.settings.lease_ttl_s):
            log.info("phase %s of lease %s: stale fencing token, not acting", phase, ctx.lease_id)
            return "stale"
        if self._done(ctx, phase):
            return "skipped"
        if phase in ("start_endpoint", "execute"):  # shutting down: a start or a workload that would begin is
            handed = self.hand_back(ctx)  # handed back instead (an evict runs: a victim is not left half-stopped)
            if handed is not None:
                return handed
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
        with LeaseHeartbeat(self.leases, lease, self.settings.lease_ttl_s, self.settings.heartbeat_s) as hb:
            if ctx.kind == "job" and phase != "clear" and self.r.hget(self.keys.job(ctx.job_id), "cancel_requested") == "1":
                return self._finish(ctx, "cancelled", "cancelled while running")
            started = time.time()
            self.leases.fenced(lease, [("XADD_E", self.keys.events, self._event("phase_start", ctx, phase=phase))])
            attrs = {"job_id": ctx.job_id or None, "priority": ctx.priority or None, "endpoint": ctx.endpoint,
                     "gpus": list(ctx.gpus), "host": ctx.host, "lease_id": ctx.lease_id, "kind": ctx.kind}
            try:
                with telemetry.phase_span(phase, ctx.traceparent, attrs) as span:
                    # the endpoint, host and GPUs in every phase (no Redis read); the job's helpers,
                    # one read of its record, in the lease's first phase only (a job and a restore
                    # both start with evict): not one round trip more per phase
                    problem = self.fleet_problem(ctx, self._helpers(ctx) if phase == "evict" else ())
                    if problem is not None:  # before any change: nothing of the lease's phases is done
                        raise PhaseError(problem)
                    extra: dict[str, Any] = {}
                    planned = getattr(self, f"_phase_{phase}")(ctx, hb, extra)
                    span.set_attribute("makespan.planned_s", float(planned))
            except StaleFencingToken:
                return self.hand_back(ctx) or "stale"
            except PhaseCancelled as e:
                return self._finish(ctx, "cancelled", f"{phase}: {e}")
            except WorkloadFailed as e:
                return self._workload_failed(ctx, e)
            except PhaseError as e:
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

    # -- transitions: sleep, wake, stop, cold start (issue 20) ---------------------------
    def _sleep_capable(self, endpoint: str) -> bool:
        """The planner's rule (:mod:`makespan.planner.replay`): an endpoint with a ``wake_s``
        has a sleep mode; its evicted instances sleep and its loads there are wakes."""
        spec = self.fleet.endpoints.get(endpoint)
        return spec is not None and spec.wake_s is not None

    def _driver(self, name: str, wait: Callable[[float], None] = no_wait,
                pause: Callable[[float], None] | None = None) -> EndpointDriver:
        """Driver ``name`` for one transition, its modelled waits (a driver whose
        transitions are waits, e.g. ``simulated``: the fleet file's figure × the host's
        ``Settings.simulated_slowdown`` × the time scale) spent by ``wait``: a
        lease-aware wait (:meth:`_paced`), a :class:`DeferredWaits` ``add``, or
        :func:`no_wait` (a stop no transition is priced for: a leftover, a sleeper that
        no longer fits). A driver that does real work ignores it, and spends the sleeps
        between its polls by ``pause`` (None: :func:`time.sleep`; see
        :class:`makespan.driver_registry.DriverContext`)."""
        return DRIVERS.create(name, context=DriverContext(self.fleet.endpoints, self._slowdown, wait, pause))

    def _paced(self, hb: LeaseHeartbeat) -> Callable[[float], None]:
        """A driver's ``wait`` that stops with StaleFencingToken when the lease is lost."""
        return lambda wall_s: self._wait_wall(wall_s, hb)

    def _paced_cancellable(self, ctx: PhaseContext, hb: LeaseHeartbeat, what: str = "its start_endpoint",
                           cancellable: bool = True) -> Callable[[float], None]:
        """:meth:`_paced` for a job's lease (a driver's modelled wait or its pauses between
        polls; execute's wait of ``service_s``) that also stops, waking every 50 ms:

        * with PhaseCancelled when the job's cancel is requested (the signal execute
          watches, :meth:`_stopper`; not with ``cancellable`` False: a wake);
        * with StaleFencingToken when the GPU worker shuts down
          (:data:`makespan.shutdown.SHUTTING_DOWN`; logged as ``what`` stopped): the
          caller stops what it spawned and the phase hands the lease back
          (:meth:`guarded`, :meth:`hand_back`) well before the shutdown's watchdog.

        A restore lease has no job to cancel nor to hand back: :meth:`_paced` (its
        transition runs on at a shutdown, as before)."""
        if ctx.kind != "job":
            return self._paced(hb)
        cancelled = self._stopper(ctx, hb) if cancellable else None

        def wait(wall_s: float) -> None:
            try:
                self._wait_wall(wall_s, hb,
                                lambda: shutdown.SHUTTING_DOWN.is_set() or (cancelled is not None and cancelled()))
            except PhaseCancelled as e:
                self._given_up_at_shutdown(ctx, f"{what} stopped: {e}")
                raise
        return wait

    @staticmethod
    def _capabilities(driver: str) -> DriverCapabilities:
        return DRIVERS.capabilities(driver)

    def _planned_s(self, endpoint: str, kind: str, host: str) -> float:
        """The planned duration (workload s) of ``kind`` for ``endpoint`` on ``host``: the
        learned estimate (:func:`makespan.estimates.transition_estimate`), the fleet
        file's figure until enough were measured (or when Redis fails)."""
        spec = self.fleet.endpoints.get(endpoint)
        if spec is None:
            return 0.0
        prior = prior_s(spec, kind)
        try:
            windows = read_transition_windows(self.r, self.keys, [endpoint], [h.name for h in self.fleet.hosts])
        except StoreError as e:
            log.warning("learned durations of %s not read, planning with the fleet file's: %s", endpoint, e)
            return prior
        return transition_estimate(windows, endpoint, host, kind, prior, self.settings.transition_min_observations,
                                   self.settings.transition_quantile).seconds

    def _timed(self, ctx: PhaseContext, extra: dict, kind: str, endpoint: str, planned_s: float,
               wall_s: float) -> None:
        """Note one executed transition: its measured duration (workload s) goes into the
        phase's fenced commit (``extra["_ops"]``, learned durations) and its event
        (``extra["transitions"]``); the transition metrics are observed."""
        actual_s = wall_s / self.settings.time_scale if self.settings.time_scale > 0 else wall_s
        extra.setdefault("_ops", []).extend(transition_record_ops(self.keys, endpoint, ctx.host, kind, actual_s))
        extra.setdefault("transitions", []).append({"kind": kind, "endpoint": endpoint,
                                                    "planned_s": round(planned_s, 6), "actual_s": round(actual_s, 6)})
        metrics.transition(kind, wall_s, planned_s, actual_s)

    def _gpu_mib(self, uuid: str) -> int:
        return self._gpu_memory.get(uuid, 0)

    def _need_mib(self, ctx: PhaseContext, endpoint: str, helpers: tuple[str, ...] = ()) -> dict[str, int]:
        """MiB ``endpoint`` (with the job's ``helpers``) holds on each of the lease's GPUs
        while the job runs (:func:`makespan.planner.helpers.stacked_mib`, as the plan counts it)."""
        eps = self.fleet.endpoints
        if endpoint not in eps:
            return {}
        main = eps[endpoint]
        per_gpu = stacked_mib(main.memory_mib_per_gpu, len(ctx.gpus),
                              [(eps[h].memory_mib_per_gpu, eps[h].tensor_parallel) for h in helpers if h in eps])
        return dict(zip(ctx.gpus, per_gpu))

    def _sleeper_room(self, gpus: list[str], ctx: PhaseContext, sleepers: list[Instance]) -> dict[str, float]:
        """GPU MiB left for more sleepers on each of ``gpus`` once the lease's endpoint and
        the job's helper endpoints (on the lease's GPUs) and the ``sleepers`` kept beside
        them (:func:`sleepers_kept`) are counted."""
        eps = self.fleet.endpoints
        room = {}
        held_by_job = self._need_mib(ctx, ctx.endpoint, self._helpers(ctx))
        for u in gpus:
            need = held_by_job.get(u, 0)
            held = {i.endpoint: eps[i.endpoint].asleep_gpu_mib for i in sleepers if u in i.gpus and i.endpoint in eps}
            kept = sleepers_kept(self._gpu_mib(u) - need, held)
            room[u] = self._gpu_mib(u) - need - sum(held[e] for e in kept)
        return room

    def _planned_level(self, ctx: PhaseContext, endpoint: str) -> int:
        """The sleep level the plan chose for the evicted ``endpoint`` (0: stop it); the
        fleet file's ``sleep_level`` when the plan did not choose."""
        planned = (ctx.sleep_levels or {}).get(endpoint)
        return int(planned) if planned is not None else self.fleet.endpoints[endpoint].sleep_level

    def _may_sleep(self, inst: Instance, ctx: PhaseContext) -> str | None:
        """None if ``inst`` may sleep by the planner's rule (:mod:`makespan.planner.sleepers`):
        its host RAM fits the host's ``host_memory_mib`` beside the sleepers registered
        there and its GPU memory fits beside what loads in its place; else why not."""
        eps = self.fleet.endpoints
        spec = eps[inst.endpoint]
        # a level-2 sleeper holds no host RAM (the plan may choose level 2 for a level-1 endpoint)
        ram_mib = spec.asleep_ram_mib if self._planned_level(ctx, inst.endpoint) == spec.sleep_level else 0
        # a sleeper of the endpoint this lease loads, on its GPUs, is woken (or stopped) by the
        # load: it holds neither RAM nor GPU memory beside the evicted instance (the replay drops
        # it first too, Replay._drop_asleep)
        sleepers = [(i, level) for i, level in list_sleepers(self.r, self.keys)
                    if not (i.endpoint == ctx.endpoint and set(i.gpus) & set(ctx.gpus))]
        asleep = [i for i, _level in sleepers]
        # what each sleeper holds at the level it really sleeps at (a level-2 sleeper: no RAM)
        used = sum(eps[i.endpoint].asleep_ram_mib for i, level in sleepers
                   if i.host == ctx.host and i.endpoint in eps and level in (None, eps[i.endpoint].sleep_level))
        budget = self.fleet.host_ram_budgets().get(ctx.host)
        room = self._sleeper_room(list(inst.gpus), ctx, [i for i in asleep if set(i.gpus) & set(inst.gpus)])
        if may_sleep(used, budget, ram_mib, min(room.values(), default=0.0), spec.asleep_gpu_mib):
            return None
        if budget is not None and used + ram_mib > budget:
            return f"host RAM for sleepers: {used} + {ram_mib} MiB over {ctx.host}'s {budget} MiB"
        return f"GPU memory: {spec.asleep_gpu_mib} MiB asleep does not fit beside {ctx.endpoint}"

    def _stop_unfitting_sleepers(self, ctx: PhaseContext, endpoint: str, extra: dict,
                                 helpers: tuple[str, ...] = ()) -> None:
        """Stop the sleepers on the lease's GPUs that no longer fit beside ``endpoint`` and
        the job's ``helpers`` (the planner's rule, largest first); their names go into
        ``extra["sleepers_stopped"]``. Raises PhaseError: a stop left processes alive
        (:meth:`_clear_for_start`)."""
        sleepers = [i for i in self._sleepers_on(ctx.gpus) if i.endpoint != endpoint]
        if not sleepers:
            return
        eps, need = self.fleet.endpoints, self._need_mib(ctx, endpoint, helpers)
        gone: set[str] = set()
        for u in ctx.gpus:
            held = {i.endpoint: eps[i.endpoint].asleep_gpu_mib for i in sleepers if u in i.gpus and i.endpoint in eps}
            gone |= set(held) - sleepers_kept(self._gpu_mib(u) - need.get(u, 0), held)
        if gone:
            extra["sleepers_stopped"] = sorted(gone)
        self._clear_for_start([inst for inst in sleepers if inst.endpoint in gone], ", ".join((endpoint, *helpers)))

    def _put_to_sleep(self, inst: Instance, wait: Callable[[float], None], level: int | None = None) -> str | None:
        """Sleep ``inst`` at ``level`` (the plan's choice; None: its endpoint's
        ``sleep_level``; modelled waits spent by ``wait``) and mark it ``asleep`` in the
        registry; None, or why it could not (the caller stops it instead)."""
        level = level if level is not None else self.fleet.endpoints[inst.endpoint].sleep_level
        if level not in self._capabilities(inst.driver).sleep_levels:
            return f"driver {inst.driver!r} has no sleep level {level}"
        try:
            with telemetry.child_span("endpoint_sleep", {"endpoint": inst.endpoint, "instance": inst.id,
                                                         "level": level}):
                self._driver(inst.driver, wait).sleep(inst, level)
        except PhaseError as e:
            return str(e)
        set_instance_state(self.r, self.keys, inst.id, "asleep", sleep_level=level)
        return None

    def _wake_up(self, ctx: PhaseContext, inst: Instance, hb: LeaseHeartbeat) -> str | None:
        """Wake the sleeping ``inst`` for ``ctx``'s lease and mark it ``running``; None, or
        why it could not. Both marks are fenced by the lease: it is ``waking`` while the
        wake runs, so a start phase of a lease that took the GPUs meanwhile (a preemption)
        stops it as a leftover instead of keeping it as a sleeper, and a wake that ends
        after the lease was lost stops the instance: nothing would track it awake. The
        wake's waits (a modelled one; a real one's wait for its answer) stop when the lease
        is lost or, for a job, when the GPU worker shuts down (:meth:`_paced_cancellable`):
        the half-woken instance is stopped too.

        Raises:
            StaleFencingToken: the lease was lost before or during the wake, or the GPU
                worker shuts down during a job's wake (the caller hands the lease back)."""
        key = self.keys.instance(inst.id)
        if not self.leases.fenced(ctx.lease, [("HSETX", key, "state", "waking")]):
            raise StaleFencingToken("lease lost before the endpoint woke")
        paced = self._paced_cancellable(ctx, hb, "its wake", cancellable=False)  # a modelled wake, a real one's answer
        with telemetry.child_span("endpoint_wake", {"endpoint": inst.endpoint, "instance": inst.id}) as span:
            try:
                self._driver(inst.driver, paced, pause=paced).wake(inst)
            except PhaseError as e:
                span.set_attribute("makespan.outcome", "failed")
                return str(e)
            except StaleFencingToken:  # lost lease or shutdown mid-wake: half awake, nothing would track it
                span.set_attribute("makespan.outcome", "abandoned")
                self._stop_instance(inst)
                raise
            span.set_attribute("makespan.outcome", "woken")
        if not self.leases.fenced(ctx.lease, [("HSETX", key, "state", "running")]):
            self._stop_instance(inst)
            raise StaleFencingToken("lease lost while the endpoint woke")
        return None

    # -- phases ------------------------------------------------------------------------
    def _phase_evict(self, ctx: PhaseContext, hb: LeaseHeartbeat, extra: dict) -> float:
        """Evict every other instance resident on the lease's GPUs (whole, on every GPU of
        its group): an endpoint with a sleep mode is put to sleep (it stays registered,
        ``asleep``, and wakes cheaply later), any other is stopped; a sleep that fails
        falls back to a stop (``sleep_failed`` in the event). Event fields: ``evicted``
        (every endpoint displaced), ``slept`` (those asleep now), ``slept_levels``
        (endpoint -> the sleep level 1 or 2 it sleeps at, when any slept), ``transition``
        (``sleep`` when all slept, else ``evict``), ``transitions`` (each one's kind,
        planned and measured workload s)."""
        residents = self._residents(ctx.gpus)
        target = ctx.endpoint
        victims: dict[str, list[str]] = {}
        for v in residents.values():
            inst = parse_instance(v)
            if inst is None:
                continue
            ep, inst_gpus = inst
            if ep == target and sorted(inst_gpus) == sorted(ctx.gpus):
                continue  # the right instance is already here: nothing to evict
            victims.setdefault(v, inst_gpus)
        if not victims:
            return 0.0
        eps = sorted({parse_instance(v)[0] for v in victims})
        # the sleep-capable endpoints the plan did not choose to stop (Assignment.sleep_levels)
        sleepy = {e for e in eps if self._sleep_capable(e) and self._planned_level(ctx, e) > 0}
        extra["evicted"] = eps
        kind_of = {e: "sleep" if e in sleepy else "evict" for e in eps}
        planned = {e: self._planned_s(e, kind_of[e], ctx.host) for e in eps}
        evict_s = max(planned.values())
        victim_gpus = sorted({g for inst_gpus in victims.values() for g in inst_gpus})
        slept: set[str] = set()
        failed: list[str] = []
        with self._transition("sleep" if sleepy == set(eps) else "evict", ctx, eps, evict_s):
            running = [i for i in self._instances_on(victim_gpus) if i.endpoint in eps]
            modelled = DeferredWaits()  # the victims' modelled transitions run as one: the longest
            t0 = time.monotonic()
            took: dict[str, float] = {}
            for inst in running:
                t1 = time.monotonic()
                why = self._may_sleep(inst, ctx) if inst.endpoint in sleepy else None
                if why is not None:
                    log.info("%s on %s not put to sleep: %s", inst.endpoint, ",".join(inst.gpus), why)
                    sleepy_stopped = extra.setdefault("sleep_skipped", [])
                    sleepy_stopped.append(f"{inst.endpoint}: {why}")
                    kind_of[inst.endpoint] = "evict"
                    self._stop_instance(inst, modelled.add)
                    took[inst.endpoint] = max(took.get(inst.endpoint, 0.0), time.monotonic() - t1)
                    continue
                why = self._put_to_sleep(inst, modelled.add, self._planned_level(ctx, inst.endpoint)) \
                    if inst.endpoint in sleepy else None
                if inst.endpoint not in sleepy or why is not None:
                    if why is not None:
                        failed.append(f"{inst.endpoint}: {why}")
                        kind_of[inst.endpoint] = "evict"
                    self._stop_instance(inst, modelled.add)  # unregister first: the observer must not see a failure
                else:
                    slept.add(inst.endpoint)
                took[inst.endpoint] = max(took.get(inst.endpoint, 0.0), time.monotonic() - t1)
            if not any(self._capabilities(i.driver).spawns_process for i in running):
                # all modelled: the evict takes the longest (a real stop's own time stands otherwise)
                self._wait_wall(modelled.longest_s, hb)
                took = {e: time.monotonic() - t0 for e in eps}
        for e in eps:
            self._timed(ctx, extra, kind_of[e], e, planned[e], took.get(e, time.monotonic() - t0))
        extra["slept"] = sorted(slept)
        if slept:  # the level each sleeps at (the report counts sleeps per level)
            extra["slept_levels"] = {e: self._planned_level(ctx, e) for e in sorted(slept)}
        extra["transition"] = "sleep" if slept == set(eps) else "evict"
        if failed:
            extra["sleep_failed"] = "; ".join(failed)[:1000]
        ops: list[tuple] = []
        for v, inst_gpus in victims.items():
            for g in inst_gpus:  # an instance is evicted whole, on every GPU of its group;
                # on a GPU outside this lease only while it still names that instance
                ops.append(("DELIFEQ", self.keys.resident(g), v))
        if "sleep_skipped" in extra:
            extra["sleep_skipped"] = "; ".join(extra["sleep_skipped"])[:1000]
        if not self.leases.fenced(ctx.lease, ops):
            raise StaleFencingToken("lease lost before evict committed")
        return evict_s

    def _load(self, ctx: PhaseContext, hb: LeaseHeartbeat, endpoint: str, extra: dict | None = None) -> float:
        """Make ``endpoint`` ready on exactly the lease's GPUs: nothing when it is resident;
        a wake when an instance of it sleeps on exactly these GPUs (``transition`` =
        ``wake``; timed and learned as ``wake_level2`` from level 2 of a level-1 endpoint,
        :func:`makespan.estimates.wake_kind`); else a cold start (``cold_start``), also when the wake fails (the
        sleeper is stopped first; ``wake_failed`` in the event says why). Running
        leftovers on these GPUs are stopped, and so are sleepers of ``endpoint`` on an
        overlapping group (the planner forgets them there too); other sleepers stay. A stop
        of these that leaves a process alive fails the phase instead of starting beside it
        (:meth:`_clear_for_start`)."""
        extra = extra if extra is not None else {}
        want = instance_value(endpoint, ctx.gpus)
        residents = self._residents(ctx.gpus)
        if all(v == want for v in residents.values()):
            return 0.0
        ep = self.fleet.endpoints[endpoint]
        restore = ctx.kind == "restore"
        levels = [(i, level) for i, level in sleepers_on(self.r, self.keys, ctx.gpus) if i.endpoint == endpoint]
        sleepers = [i for i, _level in levels]
        exact, exact_level = next(((i, level) for i, level in levels if sorted(i.gpus) == sorted(ctx.gpus)),
                                  (None, None))
        inst: Instance | None = None
        if exact is not None:
            # a level-2 sleeper of a level-1 endpoint wakes at wake_level2_s: its own window
            wake = wake_kind(ep, exact_level)
            planned = self._planned_s(endpoint, wake, ctx.host)
            with self._transition("wake", ctx, [endpoint], planned):
                self._clear_for_start(self._leftovers_on(ctx.gpus), endpoint)  # leftovers of a reclaimed lease
                self._stop_unfitting_sleepers(ctx, endpoint, extra)
                t0 = time.monotonic()
                why = self._wake_up(ctx, exact, hb)
                if why is None:
                    inst = exact
                    self._timed(ctx, extra, wake, endpoint, planned, time.monotonic() - t0)
                    extra["transition"] = "wake"
                else:
                    log.warning("wake of %s on %s failed, cold start instead: %s", endpoint, ",".join(ctx.gpus), why)
                    extra["wake_failed"] = why[:1000]
                    self._stop_instance(exact)
                if hb.lost.is_set():
                    raise StaleFencingToken("lease lost while the endpoint woke")
        if inst is None:
            kind = "restore" if restore else "cold_start"
            planned = self._planned_s(endpoint, kind, ctx.host)
            with self._transition("start", ctx, [endpoint], planned):
                # leftovers of a reclaimed lease; a sleeper cut in two
                self._clear_for_start([*self._leftovers_on(ctx.gpus), *(i for i in sleepers if i is not exact)],
                                      endpoint)
                self._stop_unfitting_sleepers(ctx, endpoint, extra)
                t0 = time.monotonic()
                # a real process: spawn, then wait on its HTTP health check (child spans);
                # a modelled one: the driver's wait of its cold start, scaled
                inst = self._start_instance(ep, list(ctx.gpus), ctx, hb)
                if hb.lost.is_set():
                    self._stop_instance(inst)
                    raise StaleFencingToken("lease lost while the endpoint started")
                register_instance(self.r, self.keys, inst)
                self._timed(ctx, extra, kind, endpoint, planned, time.monotonic() - t0)
                extra["transition"] = "cold_start"
        ops = [("SET", self.keys.resident(g), want) for g in ctx.gpus]
        if not self.leases.fenced(ctx.lease, ops):
            self._stop_instance(inst)
            raise StaleFencingToken("lease lost before start committed")
        return planned

    def _start_instance(self, spec, gpus: list[str], ctx: PhaseContext, hb: LeaseHeartbeat) -> Instance:
        """Start an instance of endpoint ``spec`` with its driver (modelled waits spent
        lease-aware). A spawned process is registered as ``starting`` from the moment it
        exists (:mod:`makespan.workers.drivers.registry`): a worker killed or stopped
        during its health check leaves a tracked process, which the next worker's start
        sweep (:mod:`makespan.workers.orphans`) stops. The caller registers it ``running``.
        A modelled start (the ``simulated`` driver: a wait of the cold start, scaled) stops
        within 50 ms of a cancel of the job, as execute does, and a real one (a process
        still failing its health check) at its next probe pause: the phase ends
        ``cancelled`` and releases the lease instead of holding the GPUs to the end of the
        cold start; a spawned process is stopped first. The GPU worker's shutdown stops a
        job's start the same way (:meth:`_paced_cancellable`), with StaleFencingToken: the
        phase hands the lease back instead of holding it to the watchdog.
        Raises PhaseError (a spawned process is stopped and forgotten first),
        PhaseCancelled (the job's cancel was requested during the start) or
        StaleFencingToken (the lease was lost during the start, or the GPU worker shuts
        down during a job's; a spawned process is stopped and forgotten first)."""
        spawned: list[Instance] = []

        def track(inst: Instance) -> None:  # again for the same instance when its start moves to another port
            if all(other is not inst for other in spawned):
                spawned.append(inst)
            register_instance(self.r, self.keys, inst, state="starting")

        paced = self._paced_cancellable(ctx, hb)  # a modelled cold start's wait, a real one's probe pauses
        try:
            return self._driver(spec.launch.driver, paced, pause=paced).start(
                spec, gpus, self.settings.time_scale, ctx.host, on_spawn=track)
        except Exception:  # a driver's own error, a cancel or a lost lease: a process it spawned must not outlive the phase
            for inst in spawned:
                self._stop_instance(inst)
            raise

    def _stop_instance(self, inst: Instance, wait: Callable[[float], None] = no_wait) -> tuple[int, ...]:
        """Stop ``inst`` (its modelled waits spent by ``wait``) and forget it once nothing
        of it runs (:func:`makespan.workers.drivers.registry.retire_instance`: ``stopping``
        meanwhile, so the observer sees no failure; a stop that fails or is cut short
        leaves it recorded ``stopping`` for a later stop to finish). Returns the pids the
        stop reported alive after SIGKILL (:attr:`StopReport.left`: the record is kept
        ``stopping``); empty otherwise (a stop that raised PhaseError is logged)."""
        try:
            with telemetry.child_span("endpoint_stop", {"endpoint": inst.endpoint, "instance": inst.id}):
                report = retire_instance(self.r, self.keys, inst, self._driver(inst.driver, wait).stop)
        except PhaseError as e:  # the driver could not stop it: recorded as stopping, for a later stop
            log.warning("stopping %s (instance %s): %s; kept registered as stopping", inst.endpoint, inst.id, e)
            return ()
        return report.left if report is not None else ()

    def _clear_for_start(self, olds: list[Instance], starting: str) -> None:
        """Stop ``olds`` (leftovers, sleepers that no longer fit) before ``starting`` is
        started or woken on the lease's GPUs. A process of one that outlived SIGKILL (its
        stop's report: :meth:`_stop_instance`) still holds GPU memory: nothing is started
        beside it, the phase fails (the job then fails or is retried the normal way) and
        the old record stays ``stopping``, for the next start phase on its GPUs or the
        host's orphan sweep to stop again (as the observer's recovery does).

        Raises:
            PhaseError: a stop left processes alive (every one of ``olds`` is stopped first)."""
        left = [(inst, pids) for inst in olds if (pids := self._stop_instance(inst))]
        if left:
            what = "; ".join(f"{inst.endpoint} (instance {inst.id}): pids {', '.join(map(str, pids))}"
                             for inst, pids in left)
            raise PhaseError(f"processes of an instance stopped on these GPUs outlived SIGKILL ({what}); not "
                             f"starting {starting} beside them (kept registered 'stopping' for a later stop)")

    def _instances_on(self, gpus: list[str], registered: Registered = None) -> list[Instance]:
        """Registered instances on any of ``gpus`` that are not asleep nor being stopped
        (starting, running, waking or failed). ``registered``: the instances on ``gpus``
        with their states, as the caller read them (None: read here)."""
        pairs = registered if registered is not None else instances_on(self.r, self.keys, gpus, with_state=True)
        return [i for i, st in pairs if st not in ("asleep", "stopping")]

    def _leftovers_on(self, gpus: list[str]) -> list[Instance]:
        """Registered instances on any of ``gpus`` that are not asleep, those whose stop
        failed or was cut short (``stopping``) included: what a start phase stops."""
        return [i for i, st in instances_on(self.r, self.keys, gpus, with_state=True) if st != "asleep"]

    def _sleepers_on(self, gpus: list[str]) -> list[Instance]:
        """Registered instances asleep on any of ``gpus``."""
        return [i for i, st in instances_on(self.r, self.keys, gpus, with_state=True) if st == "asleep"]

    def _phase_start_endpoint(self, ctx: PhaseContext, hb: LeaseHeartbeat, extra: dict) -> float:
        planned = self._load(ctx, hb, ctx.endpoint, extra)
        helpers = self._helpers(ctx)
        if helpers:
            planned += self._start_helpers(ctx, hb, helpers, extra)
        return planned

    def _helpers(self, ctx: PhaseContext) -> tuple[str, ...]:
        """The helper endpoints of the job: those it was submitted (and planned) with, else
        its workload function's (:class:`makespan.registry.WorkloadDef`)."""
        if ctx.kind != "job":
            return ()
        name, planned = self.r.hmget(self.keys.job(ctx.job_id), "fn", "helpers")
        if planned:
            return tuple(json.loads(planned))
        definition = REGISTRY.get(name) if name else None
        return definition.helpers if definition is not None else ()

    def _start_helpers(self, ctx: PhaseContext, hb: LeaseHeartbeat, helpers: tuple[str, ...], extra: dict) -> float:
        """Start each helper endpoint on the first GPUs of the lease (its own tensor-parallel
        size), beside the main instance, under one POSITIVE agenda entry; the instance ids
        go into the lease's phase hash so the clear phase stops exactly these. A helper
        already running there (a replayed phase) is kept. When a helper cannot start (its
        start fails, the job's cancel cuts it short, the lease is lost), the helpers this
        call started or kept are stopped before the error goes on: the job ends without a
        clear phase, and nothing else stops a helper that no resident marker names. The GPU
        worker's shutdown cuts a helper's start short as the main instance's
        (:meth:`_start_instance`): its lease is handed back."""
        started: list[str] = []
        planned = sum(self.fleet.endpoints[h].cold_start_s for h in helpers)  # one after the other, as planned
        try:
            with self._transition("start_helpers", ctx, list(helpers), planned):
                self._stop_unfitting_sleepers(ctx, ctx.endpoint, extra, helpers)  # as the plan: beside main + helpers
                for name in helpers:
                    spec = self.fleet.endpoints[name]
                    gpus = list(ctx.gpus[:spec.tensor_parallel])
                    running = [i for i in self._instances_on(gpus)
                               if i.endpoint == name and sorted(i.gpus) == sorted(gpus)]
                    if running:
                        started.append(running[0].id)
                        continue
                    inst = self._start_instance(spec, gpus, ctx, hb)
                    register_instance(self.r, self.keys, inst)
                    started.append(inst.id)
                    if hb.lost.is_set():
                        raise StaleFencingToken("lease lost while a helper endpoint started")
            if not self.leases.fenced(ctx.lease, [("HSET", self.keys.phase(ctx.lease_id), "helpers",
                                                   json.dumps(started))]):
                raise StaleFencingToken("lease lost before the helpers were recorded")
        except Exception:  # noqa: BLE001 - stops what it started, then re-raises whatever it was
            ids = set(started)
            for inst in [i for i in self._leftovers_on(list(ctx.gpus)) if i.id in ids]:
                self._stop_instance(inst)
            raise
        extra["helpers"] = list(helpers)
        return planned

    def _phase_restore(self, ctx: PhaseContext, hb: LeaseHeartbeat, extra: dict) -> float:
        return self._load(ctx, hb, ctx.endpoint, extra)

    def _phase_execute(self, ctx: PhaseContext, hb: LeaseHeartbeat, extra: dict) -> float:
        busy = self.keys.busy(ctx.lease_id)
        if not self.leases.fenced(ctx.lease, [("SET", busy, ctx.job_id),
                                              start_job_op(self.keys, ctx.job_id, time.time())]):
            raise StaleFencingToken("lease lost before execute")
        spec = self._spec(ctx)
        self._workload(ctx, hb, extra, ctx.payload or spec.get("payload") or {}, spec)
        if hb.lost.is_set():
            raise StaleFencingToken("lease lost during execute")
        # the busy slot goes in the phase's one commit (run(), retried through a Redis blip)
        extra["_ops"] = [*extra.get("_ops", []), ("DEL", busy)]
        return ctx.service_s

    def _workload(self, ctx: PhaseContext, hb: LeaseHeartbeat, extra: dict, payload: dict,
                  spec: dict | None = None, attempt: int | None = None, registered: Registered = None) -> None:
        """The body of execute: the job's workload function (``spec["workload"]``, see
        :meth:`_run_function`), else the payload's requests against its endpoint
        instance, else a sleep of ``service_s`` (scaled). A job planned on a process
        endpoint never runs without it: when no live instance of it is on its GPUs (its
        process was stopped or died after the start phase) execute fails with that
        reason instead of "succeeding" by sleeping, and so does a sleep whose instance died under it. The GPU worker's shutdown stops each
        kind early (a function through ``ctx.cancelled``; the requests: none sent after it,
        those in flight end; the sleep) and raises StaleFencingToken: the caller hands the
        lease back (:meth:`hand_back`). Raises StaleFencingToken (lease lost, shutdown),
        PhaseCancelled, WorkloadFailed or PhaseError. ``attempt``: this run's
        attempt number when the caller read it (None: read here); ``registered``: the
        instances on the lease's GPUs with their states when the caller read them (None:
        read here)."""
        planned = self.fleet.endpoints.get(ctx.endpoint)
        needs_process = planned is not None and self._capabilities(planned.launch.driver).spawns_process
        inst = self._request_target(ctx, registered) if needs_process or payload.get("requests") else None
        if needs_process and inst is None:
            raise PhaseError(f"no live instance of endpoint {ctx.endpoint!r} on GPUs {', '.join(ctx.gpus)}, which "
                             "the job was planned on (its process was stopped or died after the start phase); "
                             "not running the job without it")
        if spec and spec.get("workload"):
            self._run_function(ctx, hb, extra, spec, attempt, registered)
            return
        if inst is not None and payload.get("requests"):  # request-level execution against the real endpoint
            from makespan.workers.requests import RequestRunner

            stopper = self._stopper(ctx, hb)  # a cancel, a lost lease or the worker's shutdown stops the sending
            res = RequestRunner(self.r, self.keys, inst.id, inst.url, self.fleet.endpoints[ctx.endpoint].model,
                                self.fleet.endpoints[ctx.endpoint].slots,
                                lambda: shutdown.SHUTTING_DOWN.is_set() or stopper()).run(
                ctx.job_id, payload, commit=lambda ops: self.leases.fenced(ctx.lease, ops))
            if hb.lost.is_set():
                raise StaleFencingToken(f"lease {ctx.lease_id} lost during phase")
            if res.sent < int(payload["requests"]):  # stopped early (every request sent has ended)
                self._given_up_at_shutdown(ctx, f"its execute stopped after {res.sent} of {payload['requests']} "
                                                "requests")
                raise PhaseCancelled(f"cancelled while running ({res.sent} of {payload['requests']} requests sent)")
            extra.update(res.summary(), instance=inst.id)
        else:
            self._sleep(ctx.service_s, hb, ctx)
            if needs_process and self._request_target(ctx) is None:  # it died while the job ran on it
                raise PhaseError(f"endpoint {ctx.endpoint!r} on GPUs {', '.join(ctx.gpus)} stopped or died during "
                                 "execute (its process is gone): the job did not run to its end with it")

    def _spec(self, ctx: PhaseContext) -> dict:
        """The job's spec (the validated submit, JSON) from its record."""
        raw = self.r.hget(self.keys.job(ctx.job_id), "spec")
        return json.loads(raw) if raw else {}

    # -- workload functions ------------------------------------------------------------
    def _run_function(self, ctx: PhaseContext, hb: LeaseHeartbeat, extra: dict, spec: dict,
                      attempt: int | None = None, registered: Registered = None) -> None:
        """Run the job's workload function (:mod:`makespan.workers.functions`). Its result,
        the measured run (:mod:`makespan.estimates`) and the run's record fields go into
        ``extra["_ops"]``: :meth:`run` commits them with the phase's ``done`` in one
        fenced script, so a result is stored once, by the attempt that holds the lease.
        ``attempt``, ``registered``: as :meth:`_workload`'s."""
        name = spec["workload"]
        definition = lookup(name, ctx.host)
        if attempt is None:
            attempts, tries = self.r.hmget(self.keys.job(ctx.job_id), "attempts", "tries")
            attempt = 1 + int(attempts or 0) + int(tries or 0)
        here = [i for i in self._instances_on(ctx.gpus, registered) if i.url and set(i.gpus) <= set(ctx.gpus)]
        urls = {i.endpoint: i.url for i in here}
        target = next((i for i in here if i.endpoint == ctx.endpoint and sorted(i.gpus) == sorted(ctx.gpus)), None)
        wctx = WorkloadContext(job_id=ctx.job_id, priority=ctx.priority, attempt=attempt, workload=name,
                               gpus=list(ctx.gpus), host=ctx.host, endpoint=ctx.endpoint,
                               endpoint_url=target.url if target else None, endpoint_urls=urls,
                               time_scale=self.settings.time_scale)
        wctx._progress = progress_writer(lambda ops: self.leases.fenced(ctx.lease, ops), self.keys, ctx.job_id, name,
                                         celery_progress_emitter())
        if urls:
            wctx._requests = self._requests_sender(ctx, hb, wctx)
            # this run's ctx.requests records replace an earlier attempt's
            self.leases.fenced(ctx.lease, [("DEL", self.keys.requests(ctx.job_id))])
        try:
            result, wall_s = run_function(definition, wctx, list(spec.get("args") or ()), dict(spec.get("kwargs") or {}),
                                          r=self.r, keys=self.keys, lease_lost=hb.lost,
                                          grace_s=self.settings.cancel_grace_s,
                                          result_max_bytes=self.settings.result_max_bytes,
                                          shutting_down=shutdown.SHUTTING_DOWN)
        except PhaseCancelled:
            metrics.workload_run(name, "cancelled")
            raise
        actual_s = wall_s / self.settings.time_scale  # workload seconds, as service_s
        metrics.workload_run(name, "ok", ctx.service_s, actual_s)
        extra.update(workload=name, attempt=attempt, execute_s=round(actual_s, 6))
        ttl_ms = int(self.settings.result_ttl_s * 1000)
        extra["_ops"] = [("SET", self.keys.result(ctx.job_id), result, "PX", ttl_ms),
                         ("HSET", self.keys.job(ctx.job_id), "result_attempt", attempt),
                         *record_ops(self.keys, name, ctx.endpoint, actual_s)]

    def _requests_sender(self, ctx: PhaseContext, hb: LeaseHeartbeat, wctx: WorkloadContext):
        """``ctx.requests`` of one run: :class:`makespan.workers.requests.RequestRunner` on
        the leased instance (or a helper's), under the endpoint's request-lease cap."""
        from makespan.workers.requests import RequestRunner

        def send(items: list, *, route: str, max_tokens: int, timeout_s: float, raw: bool, endpoint: str | None) -> list:
            name = endpoint or ctx.endpoint
            inst = next((i for i in self._instances_on(ctx.gpus) if i.endpoint == name and i.url), None)
            if inst is None:
                raise PhaseError(f"ctx.requests: no instance of {name!r} on GPUs {', '.join(ctx.gpus)}")
            spec = self.fleet.endpoints[name]
            stop = lambda: hb.lost.is_set() or wctx.cancelled.is_set()  # noqa: E731
            payload = {"items": items, "route": route, "max_tokens": max_tokens, "request_timeout_s": timeout_s,
                       "raw": raw}
            # each call appends (a function may call ctx.requests many times, or in threads): the
            # run's records were cleared once when the run started (_run_function)
            res = RequestRunner(self.r, self.keys, inst.id, inst.url, spec.model, spec.slots, stop).run(
                ctx.job_id, payload, fresh=False, commit=lambda ops: self.leases.fenced(ctx.lease, ops))
            if res.sent < len(items):
                raise PhaseCancelled(f"stopped after {res.sent} of {len(items)} requests")
            return [res.answers.get(i) for i in range(len(items))]
        return send

    def _workload_failed(self, ctx: PhaseContext, failure: WorkloadFailed) -> str:
        """A workload function's run failed: retry it (a delayed job, backoff on the Redis
        server's clock) while its retries last and the failure is retryable, else fail
        the job and store the error as its result (:mod:`makespan.results`)."""
        spec = self._spec(ctx)
        name = spec.get("workload", "")
        definition = REGISTRY.get(name)
        attempts, tries, cancel_requested = self.r.hmget(self.keys.job(ctx.job_id), "attempts", "tries",
                                                         "cancel_requested")
        tries_done = int(tries or 0)
        attempt = 1 + int(attempts or 0) + tries_done
        reason = f"execute: {failure.error_type}: {failure.message}"[:2000]
        if cancel_requested == "1":  # cancelled before the watcher saw it: a cancel, not a retry or a failure
            metrics.workload_run(name or "unknown", "cancelled")
            return self._finish(ctx, "cancelled", f"execute: cancelled while running (workload raised "
                                                  f"{failure.error_type})")
        if definition is not None and failure.retryable and tries_done < definition.retries:
            metrics.workload_run(name, "retried")
            wait_s = definition.retry_backoff_s * 2 ** tries_done
            seconds, micros = self.r.time()  # due on the Redis server's clock, as every delayed job
            due = seconds + micros / 1e6 + wait_s
            self._stop_helpers(ctx)
            ops = self._release_ops(ctx) + [
                ("ZREM", self.keys.running, ctx.job_id),
                ("HDEL", self.keys.job(ctx.job_id), "lease", "token"),
                ("HINCRBY", self.keys.job(ctx.job_id), "tries", 1),
                delay_job_op(self.keys, ctx.job_id, due,
                             f"retry {tries_done + 1} of {definition.retries} in {wait_s:g} s after {reason}", reason),
                ("XADD_E", self.keys.events, self._event("retry_scheduled", ctx, attempt=attempt, reason=reason,
                                                         not_before=due))]
            return "retried" if self.leases.fenced(ctx.lease, ops) else "stale"
        metrics.workload_run(name or "unknown", "error")
        error = encode_error(failure.error_type, failure.message, failure.traceback_text, attempt)
        ttl_ms = int(self.settings.result_ttl_s * 1000)
        return self._finish(ctx, "failed", reason, extra_ops=[("SET", self.keys.result(ctx.job_id), error, "PX", ttl_ms)])

    def _request_target(self, ctx: PhaseContext, registered: Registered = None) -> Instance | None:
        """The running instance of ``ctx.endpoint`` on exactly these GPUs that has a URL
        and whose driver does not know it dead (a process: alive; endpoints run on the
        worker's host). ``registered``: the instances on these GPUs with their states, as
        the caller read them (None: read here)."""
        pairs = registered if registered is not None else instances_on(self.r, self.keys, ctx.gpus, with_state=True)
        for i, state in pairs:
            if (state == "running" and i.endpoint == ctx.endpoint and i.url and sorted(i.gpus) == sorted(ctx.gpus)
                    and self._driver(i.driver).is_alive(i)):
                return i
        return None

    def _stopper(self, ctx: PhaseContext, hb: LeaseHeartbeat):
        """A cheap ``should_stop`` for the request runner: lease lost, or a cancel
        requested (the job record is read at most every 50 ms; first 50 ms after this call:
        every caller has just read ``cancel_requested`` itself, as the phase began)."""
        seen = {"t": time.monotonic(), "stop": False}

        def stop() -> bool:
            if hb.lost.is_set() or seen["stop"]:
                return True
            now = time.monotonic()
            if now - seen["t"] > 0.05:
                seen["t"] = now
                seen["stop"] = self.r.hget(self.keys.job(ctx.job_id), "cancel_requested") == "1"
            return seen["stop"]
        return stop

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
        wake = self._wake_key.get(ctx.gpus[0], self.keys.planner_wake) if ctx.gpus else self.keys.planner_wake
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
            ops.extend(self._restore_backoff_ops(ctx, state))
        # The fenced script checks the GPU keys before deleting them, so order is safe.
        return ops

    def _restore_backoff_ops(self, ctx: PhaseContext, state: str) -> list[tuple]:
        """The ops that record a restore's outcome for the planner's next restores of this
        set-point group (:func:`makespan.workers.drain.start_restore` skips a group while
        its key lives): a failed restore sets ``P:restore:failed:{first GPU}`` to its count
        of consecutive failures, expiring after :data:`RESTORE_BACKOFF_S` × 2^(count − 1)
        s (at most :data:`RESTORE_BACKOFF_MAX_S`), so an endpoint that cannot start (a
        missing model, a GPU it does not fit) is not retried at every idle tick, each try
        holding the GPUs for its health timeout; a completed one deletes the key (a
        cancelled one leaves it as it is)."""
        key = self.keys.restore_failed(ctx.gpus[0])
        if state != "failed":
            return [("DEL", key)] if state == "completed" else []
        try:
            failures = 1 + int(self.r.get(key) or 0)
        except (redis.RedisError, ValueError):
            failures = 1
        backoff_s = min(RESTORE_BACKOFF_S * 2 ** (failures - 1), RESTORE_BACKOFF_MAX_S)
        return [("SET", key, str(failures), "PX", str(int(backoff_s * 1000)))]

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
            log.warning("%s %s: %s", what, state, reason)
        return state
