"""The execute phase (:mod:`makespan.workers.phases`): a plain job's modelled run, a
workload function's call (:mod:`makespan.workers.functions`) with its cancel watch,
progress, request sender and retries. :class:`ExecutePhase` is a part of
:class:`makespan.workers.phases.PhaseRunner` (its attributes and commit path are the
runner's)."""

from __future__ import annotations

import json
import logging
import time

from makespan import metrics, shutdown
from makespan.errors import LeaseLostDuringPhase, PhaseCancelled, PhaseError, StaleFencingToken
from makespan.workers.drivers.base import Instance
from makespan.workers.drivers.registry import instances_on
from makespan.estimates import record_ops
from makespan.registry import REGISTRY, end_host_marks, function_placement
from makespan.results import encode_error
from makespan.workers.functions import (UNKNOWN_WORKLOAD, WorkloadContext, WorkloadFailed, celery_progress_emitter,
                                        lookup, progress_writer, run_function)
from makespan.workers.leases import delay_job_op, start_job_op
from makespan.workers.heartbeat import LeaseHeartbeat
from makespan.workers.phase_context import PhaseContext, Registered

log = logging.getLogger("makespan.phases")
DEATH_CHECK_WALL_S = 0.5  # how often a plain job's execute checks its process endpoint is alive, wall s


class ExecutePhase:
    """The execute phase: the workload part of :class:`makespan.workers.phases.PhaseRunner`."""

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
            try:
                self._run_function(ctx, hb, extra, spec, attempt, registered)
            except WorkloadFailed as e:  # its requests failed because the endpoint died under it: say so
                if needs_process and inst is not None and not self._known_alive(inst):
                    raise WorkloadFailed(e.error_type, f"{e.message} (endpoint {ctx.endpoint!r}'s process, pid "
                                                       f"{inst.pid}, died during the run)", e.traceback_text,
                                         e.retryable) from e
                raise
            return
        if inst is not None and payload.get("requests"):  # request-level execution against the real endpoint
            from makespan.workers.requests import RequestRunner

            stopper = self._stopper(ctx, hb)  # a cancel, a lost lease or the worker's shutdown stops the sending
            res = RequestRunner(self.r, self.keys, inst.id, inst.url, self.fleet.endpoints[ctx.endpoint].model,
                                self.fleet.endpoints[ctx.endpoint].slots,
                                lambda: shutdown.SHUTTING_DOWN.is_set() or stopper()).run(
                ctx.job_id, payload, commit=lambda ops: self.leases.fenced(ctx.lease, ops))
            if hb.lost.is_set():
                raise LeaseLostDuringPhase(f"lease {ctx.lease_id} lost during phase")
            if res.sent < int(payload["requests"]):  # stopped early (every request sent has ended)
                self._given_up_at_shutdown(ctx, f"its execute stopped after {res.sent} of {payload['requests']} "
                                                "requests")
                raise PhaseCancelled(f"cancelled while running ({res.sent} of {payload['requests']} requests sent)")
            extra.update(res.summary(), instance=inst.id)
        else:
            self._sleep_beside(inst, ctx, hb)
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
                                          shutting_down=shutdown.SHUTTING_DOWN, lease_id=ctx.lease_id)
        except PhaseCancelled:
            metrics.workload_run(name, "cancelled")
            raise
        except StaleFencingToken:  # preempted, its lease lost, or the worker shuts down
            metrics.workload_run(name, "interrupted")
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

    def _workload_failed(self, ctx: PhaseContext, failure: WorkloadFailed, phase: str = "execute") -> str:
        """A workload function's run failed: retry it (a delayed job, backoff on the Redis
        server's clock) while its retries last and the failure is retryable, else fail
        the job and store the error as its result (:mod:`makespan.results`). A function
        this worker does not register while a worker of another host does: the lease is
        handed back instead (:meth:`_registered_elsewhere`)."""
        spec = self._spec(ctx)
        name = spec.get("workload", "")
        definition = REGISTRY.get(name)
        attempts, tries, cancel_requested = self.r.hmget(self.keys.job(ctx.job_id), "attempts", "tries",
                                                         "cancel_requested")
        tries_done = int(tries or 0)
        attempt = 1 + int(attempts or 0) + tries_done
        reason = f"{phase}: {failure}"[:2000]  # the phase it failed in; "(no message)" for a bare MemoryError()
        if cancel_requested == "1":  # cancelled before the watcher saw it: a cancel, not a retry or a failure
            metrics.workload_run(name or "unknown", "cancelled")
            return self._finish(ctx, "cancelled", f"execute: cancelled while running (workload raised "
                                                  f"{failure.error_type})")
        if failure.error_type == UNKNOWN_WORKLOAD and definition is None and self._registered_elsewhere(ctx, name):
            self._stop_helpers(ctx)
            return self._give_back(ctx, "function_missing", f"workload {name!r} is not registered on this GPU "
                                                            f"worker of host {ctx.host!r}; another host's is, or the job "
                                                            f"waits for a worker that registers it")
        if definition is not None and failure.retryable and tries_done < definition.retries:
            metrics.workload_run(name, "retried")
            wait_s = definition.retry_backoff_s * 2 ** tries_done
            # a retry left no line in any log (an SRE): the error is the operator's first clue
            log.warning("job %s (workload %s, %s): attempt %d raised: %s; retry %d of %d in %g s", ctx.job_id, name,
                        ctx.priority, attempt, reason, tries_done + 1, definition.retries, wait_s)
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

    def _registered_elsewhere(self, ctx: PhaseContext, name: str) -> bool:
        """Whether workload ``name``, which this worker does not register, has other hosts
        to run on, or to wait for: this host's mark of it is dropped
        (:func:`makespan.registry.end_host_marks`; it outlived a restart without the
        function, or ends now when it is the last one) and then the hosts the planner places
        it on (:func:`function_placement`) are read: live ones, of which one other than this
        host could run the job (:meth:`_could_hold`), or none live (the planner keeps the job
        queued, ``waiting_for_function``, until a worker registers the function) while one of
        the hosts that had it last could. The job is handed back, no attempt counted; False
        (the job fails, as before) when no such host has or had it. A backstop in the
        hand-back's script fails a job handed back
        :data:`makespan.store.leases.FN_MISSING_BACKS_MAX` times."""
        if not name or not ctx.host:
            return False
        end_host_marks(self.r, self.keys, ctx.host, [name])
        hosts, live = function_placement(self.r, self.keys, name)
        return any(self._could_hold(host, ctx) for host in hosts if host != ctx.host or not live)

    def _could_hold(self, host: str, ctx: PhaseContext) -> bool:
        """Whether fleet ``host`` could ever run ``ctx``'s job: in the same pool as the
        lease's host, with ``tensor_parallel`` GPUs of the memory its endpoint needs (else the
        planner places the job anywhere again, ``makespan.planner.replay.placeable_hosts``,
        and a hand-back would repeat for ever: a reliability review saw 2,568 in 25 s)."""
        spec = next((h for h in self.fleet.hosts if h.name == host), None)
        endpoint = self.fleet.endpoints.get(ctx.endpoint)
        if spec is None or endpoint is None or self.fleet.pool_of_host(host) != self.fleet.pool_of_host(ctx.host):
            return False
        fitting = [gpu for gpu in spec.gpus if gpu.memory_mib >= endpoint.memory_mib_per_gpu]
        return len(fitting) >= endpoint.tensor_parallel

    def _sleep_beside(self, inst: Instance | None, ctx: PhaseContext, hb: LeaseHeartbeat) -> None:
        """Execute's wait of ``service_s`` (:meth:`_sleep`); beside a process endpoint
        ``inst``, its process is checked every :data:`DEATH_CHECK_WALL_S` wall seconds, and
        one that ended fails the phase then (it failed only once the whole wait was over).

        Raises:
            PhaseError: the endpoint's process ended; else as :meth:`_sleep`."""
        if inst is None:
            self._sleep(ctx.service_s, hb, ctx)
            return
        step_s = DEATH_CHECK_WALL_S / max(self.settings.time_scale, 1e-9)  # workload s per check
        left_s = ctx.service_s
        while left_s > 0:
            self._sleep(min(left_s, step_s), hb, ctx)
            left_s -= step_s
            if not self._known_alive(inst):
                raise PhaseError(f"endpoint {ctx.endpoint!r} on GPUs {', '.join(ctx.gpus)} stopped or died during "
                                 f"execute (its process, pid {inst.pid}, is gone): the job did not run to its end "
                                 "with it")

    def _known_alive(self, inst: Instance) -> bool:
        """Whether ``inst``'s driver says its process runs (True when the driver cannot tell)."""
        try:
            return bool(self._driver(inst.driver).is_alive(inst))
        except Exception:  # noqa: BLE001 - a driver's own error: not known dead
            return True

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
        every caller has just read ``cancel_requested`` itself, as the phase began). The
        same read gives the lease the job's record names: another one, or none (preempted or
        reclaimed meanwhile), sets ``hb.lost`` at once rather than at the heartbeat's next
        renewal (a preemptor's transitions wait for this phase to end)."""
        seen = {"t": time.monotonic(), "stop": False}

        def stop() -> bool:
            if hb.lost.is_set() or seen["stop"]:
                return True
            now = time.monotonic()
            if now - seen["t"] > 0.05:
                seen["t"] = now
                cancel, holder = self.r.hmget(self.keys.job(ctx.job_id), "cancel_requested", "lease")
                if ctx.kind == "job" and holder != ctx.lease_id:
                    hb.lost.set()
                    return True
                seen["stop"] = cancel == "1"
            return seen["stop"]
        return stop
