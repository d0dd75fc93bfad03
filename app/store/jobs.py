"""The job lifecycle outside leases: submit, cancel, workload steps, delayed promotion,
the planner's queue upkeep, retention, the warm path's start. One Lua script each
(``makespan/store/lua``, KEYS and ARGV in each header); keys come from
:class:`makespan.keys.Keys`, per-id keys a script builds itself from
:attr:`~makespan.keys.Keys.script_prefix`.

:class:`JobStore` is the seam the live code calls. Every method raises
:class:`makespan.errors.StoreError` when Redis fails (with ``client=`` a pipeline, the
pipeline's ``execute()`` raises instead).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from makespan.errors import ValidationError
from makespan.keys import Keys
from makespan.models import Priority
from makespan.store.scripts import script, store_error
from makespan.job_states import JobState


class JobStore:
    """Job-record scripts on one Redis and key prefix.

    Args:
        r: a client with ``decode_responses=True``.
        keys: the deployment's key builder.
        events_max_len: the events stream cap (Settings.events_max_len; None: its default).
    """

    def __init__(self, r: redis.Redis, keys: Keys, events_max_len: int | None = None):
        self.r, self.keys, self.events_max_len = r, keys, events_max_len

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any], client: Any = None) -> Any:
        return script(self.r, name, self.events_max_len)(keys=list(keys), args=list(args), client=client)

    # -- producer ------------------------------------------------------------------------
    def submit(self, job_id: str, fields: dict[str, Any], event_json: str, queue_key: str,
               idempotency_key: str | None = None, delay_s: float | None = None) -> tuple[bool, str]:
        """Write a validated job (``fields`` as its record; state ``queued``, or ``delayed`` with ``delay_s``: due at the
        server clock + ``delay_s`` seconds). Returns ``(created, job id)``: for a repeated
        idempotency key ``(False, the existing job's id)``.

        Raises:
            ValidationError: ``job.depends_on``: a job the record's ``deps`` name has no
                record (checked in the same script: nothing was written).
            StoreError: Redis failed."""
        fields = {**fields, "state": JobState.QUEUED.value}  # submit.lua makes it delayed with a delay
        out = self._run("submit", *self._submit_keys_args(job_id, fields, event_json, queue_key, idempotency_key,
                                                           delay_s, touch=False))
        return _submitted(out, fields)

    def submit_replicated(self, job_id: str, fields: dict[str, Any], event_json: str, queue_key: str,
                          idempotency_key: str | None, delay_s: float | None, replicas: int,
                          timeout_ms: int) -> tuple[bool, str, int]:
        """:meth:`submit`, then Redis ``WAIT replicas timeout_ms`` on the same connection (a
        pipeline: ``WAIT`` counts the replicas that hold that connection's writes, so on
        another pooled connection it proved nothing). A repeated idempotency key is written
        again (same value) so the ``WAIT`` covers the existing job too, whose first submit
        may have returned before any replica had it. Returns ``(created, job id, replicas
        that acknowledged)``.

        Raises:
            ValidationError: as :meth:`submit` (nothing written).
            StoreError: Redis failed (an outage writes nothing: the script runs whole or not at all;
                a :class:`StoreBug` keeps what it wrote before it, docs/operations.md)."""
        fields = {**fields, "state": JobState.QUEUED.value}
        keys, args = self._submit_keys_args(job_id, fields, event_json, queue_key, idempotency_key, delay_s,
                                            touch=True)
        out, acked = self._run_replicated("submit", keys, args, replicas, timeout_ms)
        return (*_submitted(out, fields), acked)

    def _run_replicated(self, name: str, keys: Sequence[str], args: Sequence[Any], replicas: int,
                        timeout_ms: int) -> tuple[Any, int]:
        """Script ``name``, then ``WAIT replicas timeout_ms`` on the same connection (one
        pipeline: ``WAIT`` counts the replicas holding that connection's writes). Returns
        (the script's reply, replicas that acknowledged).

        Raises:
            StoreError: Redis failed (an outage writes nothing: the script runs whole or not at all;
                a :class:`StoreBug` keeps what it wrote before it, docs/operations.md)."""
        pipe = self.r.pipeline(transaction=False)
        script(self.r, name, self.events_max_len).queue_eval(pipe, list(keys), list(args))
        pipe.execute_command("WAIT", replicas, timeout_ms)
        try:
            out, acked = pipe.execute()
        except redis.RedisError as e:
            raise store_error(e, f"script {name} (waiting for replicas)") from e
        return out, int(acked)

    def _submit_keys_args(self, job_id: str, fields: dict[str, Any], event_json: str, queue_key: str,
                          idempotency_key: str | None, delay_s: float | None,
                          touch: bool) -> tuple[list[str], list[str]]:
        delay = repr(float(delay_s)) if delay_s is not None else ""
        idem = self.keys.idem(idempotency_key) if idempotency_key else self.keys.seq  # unused without a key
        critical = "1" if queue_key == self.keys.queue("CRITICAL") else "0"
        keys = [idem, self.keys.seq, self.keys.job(job_id), queue_key, self.keys.events, self.keys.planner_wake,
                self.keys.delayed, self.keys.planner_critical, self.keys.submit_counts]
        args = ["1" if idempotency_key else "0", job_id, json.dumps(fields), event_json, delay,
                self.keys.script_prefix, critical, "1" if touch else "0"]
        return keys, args

    def cancel(self, job_id: str, queue_key: str, event_json: str, now_s: float, client: Any = None) -> Any:
        """Cancel a job: ``"cancelled_now"`` (it was queued or delayed: this call ended it),
        ``"cancel_requested"`` (leased or running: its GPU worker stops it),
        ``"cancel_requested_before"`` (leased or running, and an earlier call had asked
        already), ``"missing"``, or its final state (``"cancelled"`` when something
        cancelled it before). With ``client`` a pipeline, the call is queued there and its
        answer comes from the pipeline's ``execute()``."""
        out = self._run("cancel", [self.keys.job(job_id), queue_key, self.keys.events, self.keys.delayed],
                        [job_id, event_json, repr(now_s), self.keys.script_prefix], client=client)
        return out if client is not None else str(out)

    # -- workloads -----------------------------------------------------------------------
    def submit_workload(self, workload_id: str, workload_fields: dict[str, Any], now_s: float,
                        steps: Sequence[tuple[str, dict[str, Any], str]], replicas: int = 0,
                        timeout_ms: int = 0) -> tuple[bool, int]:
        """Write a workload and its steps (``(job id, fields, submitted event JSON)`` each, in
        topological order; each step queued at its fields' ``priority`` in the queue of the
        pool its fields name, none: the implicit pool) and wake the planner of every pool a
        step is queued in, as a plain submit does; a CRITICAL step without dependencies also
        joins its pool's critical-lane arrivals (:attr:`makespan.keys.Keys.planner_critical`),
        as a CRITICAL submit does. Returns (False when a job id already exists: nothing
        written, replicas that acknowledged the write). With ``replicas`` > 0, Redis ``WAIT
        replicas timeout_ms`` on the connection that wrote it (as :meth:`submit_replicated`);
        else 0."""
        args: list[str] = []
        scopes = [self.keys.for_pool(fields.get("pool")) for _, fields, _ in steps]
        for job_id, fields, event_json in steps:
            lane = fields["priority"] == Priority.CRITICAL.name and not fields.get("deps")
            args += [job_id, json.dumps({**fields, "state": JobState.QUEUED.value}), event_json, "1" if lane else "0"]
        wakes = list(dict.fromkeys(scope.planner_wake for scope in scopes))
        keys = [self.keys.seq, self.keys.events, self.keys.workload(workload_id), self.keys.workloads,
                self.keys.workloads_active, *[self.keys.job(job_id) for job_id, _, _ in steps],
                *[scope.queue(fields["priority"]) for scope, (_, fields, _) in zip(scopes, steps)],
                *[scope.planner_critical for scope in scopes], *wakes]
        argv = [str(len(steps)), workload_id, json.dumps(workload_fields), repr(now_s), self.keys.script_prefix, *args]
        if replicas > 0:
            out, acked = self._run_replicated("submit_workload", keys, argv, replicas, timeout_ms)
            return bool(out), acked
        return bool(self._run("submit_workload", keys, argv)), 0

    def retry_step(self, workload_id: str, step: str, old_job_id: str, new_job_id: str, fields: dict[str, Any],
                   event_json: str, queue_key: str) -> bool:
        """Retry a failed step as ``new_job_id`` (queued in ``queue_key``, the queue of the
        pool its ``fields`` name, whose planner is woken); every job still waiting on
        ``old_job_id`` (queued or delayed: a later step, or a job submitted with
        ``depends_on`` it) waits on ``new_job_id`` instead. A CRITICAL retry (``fields``'
        ``priority``) also joins its pool's critical-lane arrivals, as a CRITICAL submit does
        (the lane places it once its dependencies have completed). False when the workload
        is not running or the step was already retried."""
        scope = self.keys.for_pool(fields.get("pool"))
        keys = [self.keys.workload(workload_id), self.keys.job(new_job_id), queue_key, self.keys.events,
                self.keys.seq, scope.planner_wake, scope.planner_critical]
        critical = "1" if fields.get("priority") == Priority.CRITICAL.name else "0"
        args = [step, old_job_id, new_job_id, json.dumps({**fields, "state": JobState.QUEUED.value}), event_json,
                self.keys.script_prefix, critical]
        return bool(self._run("retry_step", keys, args))

    def cancel_steps(self, workload_id: str, queue_key: str, job_ids: Sequence[str], reason: str,
                     workload_state: str, now_s: float) -> tuple[list[str], int]:
        """Cancel steps of a workload (queued and delayed ones at once, leased and running
        ones at their next phase boundary); ``workload_state`` ('' = unchanged) ends the
        workload too. Returns ``(the ids cancelled now, how many were asked to stop)``."""
        keys = [self.keys.workload(workload_id), self.keys.events, queue_key, self.keys.delayed,
                *[self.keys.job(job_id) for job_id in job_ids]]
        _, requested, *cancelled = self._run("cancel_steps", keys, [repr(now_s), reason, workload_state,
                                                                    self.keys.script_prefix, *job_ids])
        return [str(job_id) for job_id in cancelled], int(requested)

    # -- the planner's pass over active workloads (makespan.workload_execution) -------------
    def active_workloads(self) -> set[str]:
        """The ids of the workloads the planner still advances (``P:workloads:active``).

        Raises:
            StoreError: Redis failed."""
        try:
            return cast("set[str]", self.r.smembers(self.keys.workloads_active))
        except redis.RedisError as e:
            raise store_error(e, "read active workloads") from e

    def workload_fields(self, workload_id: str, fields: Sequence[str]) -> list[str | None]:
        """``fields`` of the workload's record (None for a missing field or record).

        Raises:
            StoreError: Redis failed."""
        try:
            return cast("list[str | None]", self.r.hmget(self.keys.workload(workload_id), list(fields)))
        except redis.RedisError as e:
            raise store_error(e, f"read workload {workload_id}") from e

    def workload_steps(self, workload_id: str,
                       job_ids: Sequence[str]) -> tuple[list[tuple[str | None, str | None]], dict[str, str]]:
        """Each step job's ``(state, reason)`` (as ``job_ids``) and the workload's whole
        record, read in one round trip (no transaction: the writes re-check what they need).

        Raises:
            StoreError: Redis failed."""
        try:
            pipe = self.r.pipeline(transaction=False)
            for job_id in job_ids:
                pipe.hmget(self.keys.job(job_id), "state", "reason")
            pipe.hgetall(self.keys.workload(workload_id))
            *rows, record = pipe.execute()
        except redis.RedisError as e:
            raise store_error(e, f"read the steps of workload {workload_id}") from e
        return [(state, reason) for state, reason in rows], record

    def drop_active_workload(self, workload_id: str) -> None:
        """Take a workload whose record is gone out of ``P:workloads:active``.

        Raises:
            StoreError: Redis failed."""
        try:
            self.r.srem(self.keys.workloads_active, workload_id)
        except redis.RedisError as e:
            raise store_error(e, f"drop workload {workload_id} from the active set") from e

    def fail_workload(self, workload_id: str, reason: str, failed_at_s: float, event_json: str) -> bool:
        """Fail a workload that is still running (see ``fail_workload.lua``); ``event_json``
        is its ``workload_failed`` event. False when it is no longer running (a cancel ended
        it since it was read): it is left as it is.

        Raises:
            StoreError: Redis failed."""
        return bool(self._run("fail_workload", [self.keys.workload(workload_id), self.keys.events],
                              [reason, repr(failed_at_s), event_json]))

    def finish_workload(self, workload_id: str, all_completed: bool, now_s: float) -> str:
        """Close a workload whose steps are all final (see ``finish_workload.lua``): a
        running one ends ``completed`` when ``all_completed``, else ``failed``; a failed or
        cancelled one keeps its state. It moves from the active set to the done index.

        Returns:
            Its final state, or ``""`` when its record is gone.
        Raises:
            StoreError: Redis failed."""
        return str(self._run("finish_workload", [self.keys.workload(workload_id), self.keys.workloads_active,
                                                 self.keys.workloads_done, self.keys.events],
                             [workload_id, "1" if all_completed else "0", repr(now_s)]))

    # -- planner ---------------------------------------------------------------------------
    def promote_delayed(self, event_ts_s: float, limit: int, planner_token: str = "",
                        ahead_s: float = 0.0) -> tuple[int, str, str]:
        """Queue up to ``limit`` delayed jobs due on the server clock (+ ``ahead_s``).
        Returns ``(queued count or -1 when fenced off, next due time (unix s) or '',
        server clock (unix s))``, times as text."""
        out = self._run("promote_delayed", [self.keys.delayed, self.keys.planner_fence, self.keys.events],
                        [repr(event_ts_s), limit, self.keys.script_prefix, planner_token, repr(float(ahead_s))])
        return int(out[0]), str(out[1]), str(out[2])

    def drop_stale(self, queue_key: str, job_id: str, planner_token: str) -> int:
        """Remove a queue entry whose job is no longer queued (only while the planner leads):
        1 when removed, else 0."""
        return int(self._run("drop_stale", [queue_key, self.keys.job(job_id), self.keys.planner_fence],
                             [job_id, planner_token]) or 0)

    def reroute(self, job_id: str, source_queue: str, to_pool: str | None, planner_token: str,
                event_json: str) -> int:
        """Move a queued job from ``source_queue`` to its level's queue of pool ``to_pool``
        (None: the implicit pool), naming that pool on its record and waking its planner,
        only while the planner whose fence is ``self.keys.planner_fence`` leads with
        ``planner_token`` and only while the job is still queued in ``source_queue``: 1 when
        moved, else 0 (``makespan.workers.pool_rehome``)."""
        return int(self._run("reroute", [source_queue, self.keys.job(job_id), self.keys.planner_fence,
                                         self.keys.events],
                             [job_id, planner_token, self.keys.script_prefix, to_pool or "", event_json]) or 0)

    def cancel_dependant(self, job_id: str, queue_key: str, planner_token: str, now_s: float, reason: str,
                         event_json: str) -> int:
        """Cancel a queued job the planner will never run (its dependency failed, or the
        fleet the planner runs now cannot hold it), with ``reason``, only while the planner
        leads: 1 when cancelled, else 0."""
        return int(self._run("cancel_dependant", [queue_key, self.keys.job(job_id), self.keys.planner_fence,
                                                  self.keys.events],
                             [job_id, planner_token, repr(now_s), reason, event_json, self.keys.script_prefix]) or 0)

    def inherited_levels(self, job_ids: Sequence[str], most_walked: int) -> list[int]:
        """Per job id, the highest level (0 = CRITICAL .. 3 = LOW; 4: none) of the queued or
        delayed jobs waiting on it at any depth (at most ``most_walked`` read per job)."""
        return [int(x) for x in self._run("inherited_levels", [], [self.keys.script_prefix, most_walked, *job_ids])]

    def write_wait_reasons(self, planner_token: str, rows: Sequence[str],
                           planned_levels: Mapping[str, str] | None = None) -> int:
        """Write ``rows`` (``job id, reason, detail, eta`` repeated) on the records still
        queued and replace the reason counts; ``planned_levels``: job id -> the level name it
        is planned at when higher than its own (a dependant's it inherits), written as
        ``planned_priority`` (deleted on the other rows' records). Returns how many were
        written (-1: fenced off)."""
        levels = planned_levels or {}
        argv: list[str] = []
        for i in range(0, len(rows), 4):
            argv += [*rows[i:i + 4], levels.get(rows[i], "")]
        return int(self._run("write_wait_reasons", [self.keys.planner_fence, self.keys.wait_reason_counts,
                                                    self.keys.wait_reasons_at],
                             [planner_token, self.keys.script_prefix, *argv]))

    def write_drain(self, planner_token: str, fields: dict[str, Any]) -> bool:
        """Write a drain check's ``fields`` to ``P:drain`` (and count the check) while
        ``planner_token`` leads. Returns False, nothing written, when fenced off."""
        flat = [str(part) for name, value in fields.items() for part in (name, value)]
        return int(self._run("write_drain", [self.keys.planner_fence, self.keys.drain], [planner_token, *flat])) == 1

    def queue_awaited_running(self, pipe: Any) -> None:
        """Queue on ``pipe`` (as EVAL) the read of the leased job ids that a queued or
        delayed job waits on; ``pipe.execute()`` answers a list of ids."""
        script(self.r, "awaited_running", self.events_max_len).queue_eval(pipe, [self.keys.running],
                                                                           [self.keys.script_prefix])

    # -- retention -----------------------------------------------------------------------
    def compact_finished(self, job_id: str, finished_at_s: float, ttl_s: int, summary_fields: Sequence[str],
                         client: Any = None) -> Any:
        """Compact a finished job to ``summary_fields`` with TTLs: 1, 0 (no record) or -1
        (not final yet); with ``client`` (a pipeline) queued there."""
        return self._run("compact_finished", [self.keys.job(job_id), self.keys.retained, self.keys.retention_tally],
                         [job_id, repr(finished_at_s), ttl_s, self.keys.script_prefix, *summary_fields], client)

    def expire_retained(self, job_id: str, now_s: float, client: Any = None) -> Any:
        """Delete a retained summary (-1: kept, its workload still runs); with ``client``
        queued there."""
        return self._run("expire_retained", [self.keys.job(job_id), self.keys.retained],
                         [job_id, self.keys.script_prefix, repr(now_s)], client)

    # -- GPU worker ------------------------------------------------------------------------
    def begin_warm(self, lease_id: str, token: int, gpus: Sequence[str], job_id: str, instance_value: str,
                   started_at_s: float, phase_events: Sequence[str], lease_ttl_s: float,
                   helper_workloads: Sequence[str] = ()) -> WarmStart:
        """The warm path's first step (``begin_warm.lua``), as a :class:`WarmStart`: ``ok``
        (the lease renewed to ``lease_ttl_s`` from now on the server's clock) with what the
        job's execute needs, or why not (nothing written): ``helpers`` (the job has helper
        endpoints: its record names them, or its record names none and its function is one
        of ``helper_workloads``, the names whose definitions in the caller's registry have
        helpers), ``stale``, ``cold``, ``replay``, ``cancel``.

        Raises:
            StoreError: Redis failed."""
        keys = [self.keys.phase(lease_id), self.keys.job(job_id), self.keys.events, self.keys.busy(lease_id),
                *[self.keys.gpu(g) for g in gpus], *[self.keys.resident(g) for g in gpus],
                self.keys.lease(lease_id), self.keys.leases, *[self.keys.gpu_instances(g) for g in gpus]]
        got = self._run("begin_warm", keys, [lease_id, token, len(gpus), instance_value, repr(started_at_s), job_id,
                                             *phase_events, int(lease_ttl_s * 1000), self.keys.script_prefix,
                                             *helper_workloads])
        if got[0] != "ok":
            return WarmStart(str(got[0]))
        instances = [dict(zip(h[::2], h[1::2])) for h in got[4]] if len(got) > 4 else None
        return WarmStart("ok", got[1], got[2], got[3], instances)


@dataclass(frozen=True)
class WarmStart:
    """What :meth:`JobStore.begin_warm` answered.

    Attributes:
        outcome: ``ok`` (the job runs), or why not: ``helpers``, ``stale``, ``cold``,
            ``replay``, ``cancel``; the other fields are set for ``ok`` only.
        spec: the job's spec JSON (``''`` when unset); ``attempts``, ``tries``: its record's
            counters as strings (``''`` when unset).
        instances: for a job of a workload function, the registry hash (field -> value) of
            every endpoint instance registered on any of the lease's GPUs, by id, read in
            the same step (:func:`makespan.workers.drivers.registry.decode_instances`
            decodes them); None for any other job (not read).
    """

    outcome: str
    spec: str = ""
    attempts: str = ""
    tries: str = ""
    instances: list[dict[str, str]] | None = None


def record_deps(deps_json: str | None) -> tuple[str, ...]:
    """The job ids of a job record's ``deps`` field (a JSON list of ids), as the scripts read
    it (``lib.lua`` ``deps_list``): None, '' or text that is not a JSON list count as none, and
    members that are not strings are skipped. A damaged record must not stop the planner (a
    queued job whose deps were ``[oops`` killed it at every restart: a verifier)."""
    if not deps_json:
        return ()
    try:
        deps = json.loads(deps_json)
    except ValueError:
        return ()
    return tuple(dep for dep in deps if isinstance(dep, str)) if isinstance(deps, list) else ()


def _finite(value: Any) -> float | None:
    """``value`` as a finite float, or None."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def unreadable_field(record: Mapping[str, Any]) -> str | None:
    """Why a queued job's record cannot be planned, as ``field='value'`` (a field that is
    not what the producer writes: ``service_s``, ``submitted_at`` not a finite number,
    ``seq`` not an integer, ``deadline_s`` or ``not_before`` given but not a number,
    ``helpers`` not a JSON list); None for a sound record. The planner cancels such a job
    with this as its reason rather than raising on it at every tick (a hand edit, a bug)."""
    for field, required in (("service_s", True), ("submitted_at", True), ("deadline_s", False),
                            ("not_before", False)):
        value = record.get(field)
        if (required or value not in (None, "")) and _finite(value) is None:
            return f"{field}={value!r}"
    seq = record.get("seq")
    if not isinstance(seq, (str, int)) or not str(seq).lstrip("-").isdigit():
        return f"seq={seq!r}"
    helpers = record.get("helpers")
    if helpers:
        try:
            names = json.loads(helpers)
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            return f"helpers={helpers!r}"
    return None


def _submitted(out: Sequence[Any], fields: dict[str, Any]) -> tuple[bool, str]:
    """submit.lua's reply as ``(created, job id)``.

    Raises:
        ValidationError: ``job.depends_on.{i}``: the reply names a dependency without a record."""
    if int(out[0]) == -1:
        missing = str(out[1])
        deps = json.loads(fields.get("deps") or "[]")
        where = f".{deps.index(missing)}" if missing in deps else ""
        raise ValidationError(f"job.depends_on{where}", missing, "no such job: an unknown id, or a finished job "
                                                                "whose record retention deleted (MAKESPAN_RETENTION_AGE_S)")
    return int(out[0]) == 1, str(out[1])
