"""The producer API: :func:`submit`, :func:`status`, :func:`cancel`.

A job is validated completely before anything is written; the write itself (job
record, idempotency key, queue entry, submitted event) is one Lua script, so a
rejected job is never partly enqueued and an accepted one is never half-written.
A job with ``delay_s`` is written ``delayed`` into ``P:delayed`` (score = due time,
the Redis server's clock + ``delay_s``) instead of a queue, in the same script; the
planner queues it when due (:mod:`makespan.workers.delayed`). Nothing reaches Celery before then.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

import redis

from makespan import metrics, pools, telemetry
from makespan.redis_conn import sent_without_reply
from makespan.events import add_utc_times
from makespan.errors import NotFoundError, StoreError, SubmitOutcomeUnknown, ValidationError, is_utf8
from makespan.keys import Keys
from makespan.models import FleetSpec, JobSpec, Priority, parse_job
from makespan.settings import Settings, redacted_url
from makespan.store import JobState, JobStore

_TIME_FIELDS = ("submitted_at", "leased_at", "started_at", "finished_at", "not_before", "progress_at", "wait_eta",
                "wait_at")  # unix s; status() adds each one's ISO-8601 UTC twin (makespan.events.add_utc_times)
_FLOAT_FIELDS = ("service_s", "deadline_s", "progress_done", "progress_total", *_TIME_FIELDS)
_INT_FIELDS = ("seq", "attempts", "tp", "preemptions", "token", "tries", "retries", "result_attempt")
_JSON_LIST_FIELDS = ("deps", "helpers", "gpus")  # JSON text in the record, lists in status()
_FLAG_FIELDS = ("cancel_requested", "service_estimated")  # "1" in the record, true in status()
# fields status() gives every job, with their value when the record has none yet
_STATUS_DEFAULTS: dict[str, Any] = {"tries": 0, "preemptions": 0, "cancel_requested": False, "deps": list,
                                    "helpers": list, "service_estimated": False,
                                    "reason": ""}  # its last requeue's or its end's; "" for none yet


log = logging.getLogger(__name__)

SPEC_IN_RECORD = frozenset({"endpoint", "priority", "service_s", "deadline_s", "workload_id", "depends_on", "helpers"})
"""Spec fields the job record holds as fields of its own (``deps`` for ``depends_on``):
:func:`record_spec` leaves them out of the ``spec`` JSON."""


def record_spec(spec: JobSpec) -> str:
    """The ``spec`` field of a job record: the validated spec as compact JSON, without the
    fields the record holds itself (:data:`SPEC_IN_RECORD`) and without defaults (``{}``
    for a job with neither payload, function, arguments nor idempotency key). Small enough
    that a plain job's record stays a compact listpack hash in Redis (issue 21 point 4:
    ``bench/queued_bytes.py``); readers take ``payload``, ``workload``, ``args``, ``kwargs``
    and ``idempotency_key`` from it, missing meaning the default."""
    return spec.model_dump_json(exclude_defaults=True, exclude=set(SPEC_IN_RECORD))


@dataclass(frozen=True)
class CancelOutcome:
    """What one cancel call did (:meth:`Producer.cancel_outcome`, ``makespan cancel``).

    Attributes:
        job_id: the job.
        state: what :meth:`Producer.cancel` returns: ``"cancelled"`` (queued or delayed:
            this call cancelled it, or ``already_ended``: it had been cancelled before),
            ``"cancel_requested"`` (leased or running: its GPU worker stops it at its next
            phase boundary), or the final state it had already reached (``"completed"``,
            ``"failed"``).
        already_ended: True when the job had ended (completed, failed or cancelled)
            before this call: nothing was changed.
        requested_before: True when the job is leased or running and an earlier call had
            already asked it to stop.
        finished_at: when the job ended, unix s (a job this call cancelled, or one that had
            ended); None while it runs.
    """

    job_id: str
    state: str
    already_ended: bool
    requested_before: bool
    finished_at: float | None

    @property
    def cancelled_now(self) -> bool:
        """This call cancelled the job (it was queued or delayed)."""
        return self.state == "cancelled" and not self.already_ended


@dataclass(frozen=True)
class JobHandle:
    """What :func:`submit` returns. ``created`` is False when an existing job with the
    same idempotency key was returned instead; ``ignored`` then names what this submit
    asked for differently from that job (e.g. ``("priority", "args")``): those were not
    used (the key returns the first job as it was submitted; logged as a warning on
    ``makespan.producer``, which `makespan submit` prints as its own line)."""

    id: str
    created: bool
    priority: Priority
    ignored: tuple[str, ...] = ()


def job_not_found(job_id: str, keys: Keys, settings: Settings) -> NotFoundError:
    """The :class:`NotFoundError` of a job id with no record: where it was looked for (the
    key prefix, the Redis URL with its password hidden) and what else it may be (another
    deployment's prefix or database, a finished job past its retention)."""
    return NotFoundError(f"no job {job_id!r} under key prefix {keys.prefix!r} at {redacted_url(settings.redis_url)} "
                         f"(an id of another deployment's prefix or Redis, or a finished job that retention deleted: "
                         f"it keeps a finished job MAKESPAN_RETENTION_AGE_S (default 3600 s) and at most the "
                         f"MAKESPAN_RETENTION_JOBS latest (default 10,000), whichever ends first, as set where the "
                         f"planner runs)")


#: a log record's attribute: ``makespan submit`` prints this warning itself (a line of its own)
CLI_PRINTS_IT = "makespan_cli_prints_it"


def ignored_options_text(idempotency_key: str | None, job_id: str, ignored: tuple[str, ...]) -> str:
    """What a submit whose repeated ``idempotency_key`` returned job ``job_id`` did not use
    (``ignored``, :attr:`JobHandle.ignored`), and why, in one line."""
    verb, was = ("differs", "was") if len(ignored) == 1 else ("differ", "were")
    return (f"idempotency key {idempotency_key!r} already names job {job_id}: this submit's {', '.join(ignored)} "
            f"{verb} from that job's and {was} not used (a repeated key returns the first job as it was submitted; "
            "use a new key for a different job)")


# what a repeated idempotency key compares (record field, label); ``spec`` holds payload,
# workload, args, kwargs and delay_s
_REPEAT_COMPARED = (("endpoint", "endpoint"), ("priority", "priority"), ("service_s", "service_s"),
                    ("deadline_s", "deadline_s"), ("deps", "depends_on"), ("spec", "spec"))


def _compared_spec(text: str | None) -> dict[str, Any]:
    """A record's ``spec`` JSON as a repeated key compares it: without the fields the record
    holds itself (a record written before :func:`record_spec` left them out held them all,
    defaults included) and without empty defaults (None, ``[]``, ``{}``)."""
    spec = json.loads(text or "{}")
    return {key: value for key, value in spec.items()
            if key not in SPEC_IN_RECORD and key != "tp" and value not in (None, [], {})}


def spec_digest(text: str | None) -> str:
    """What a retention summary keeps of a keyed job's ``spec`` for a repeated key to compare
    (``spec_digest``, JSON): each compared key (:func:`_compared_spec`) -> the first 16 hex
    digits of the SHA-256 of its value's canonical JSON (sorted keys, no spaces)."""
    import hashlib

    return json.dumps({key: hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode())
                       .hexdigest()[:16] for key, value in sorted(_compared_spec(text).items())},
                      separators=(",", ":"))


def _digest_differences(existing: dict[str, Any], fields: dict[str, Any]) -> list[str]:
    """The ``spec`` keys (args, kwargs, workload, payload ...) in which a compacted job (its
    summary's ``spec_digest``, or ``fn`` alone for a summary written before digests were
    kept) differs from this submit's ``fields``."""
    try:
        new = json.loads(spec_digest(fields.get("spec")))
        if "spec_digest" in existing:
            old = json.loads(existing["spec_digest"] or "{}")
            return sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key))
        if existing.get("fn") and _compared_spec(fields.get("spec")).get("workload") != existing["fn"]:
            return ["workload"]
    except (ValueError, AttributeError, TypeError):
        pass
    return []


def ignored_on_repeat(existing: dict[str, Any], fields: dict[str, Any]) -> tuple[str, ...]:
    """What a submit (its record ``fields``) asks for differently from the job its repeated
    idempotency key names (``existing``: that job's record): labels, in a fixed order, with
    the ``spec`` JSON split into its own keys (``payload``, ``args``, ...). A service time
    estimated by either submit is not compared; a retention summary (a compacted job) compares
    what it kept, its ``spec`` through the digest of each key (:func:`spec_digest`)."""
    out: list[str] = []
    estimated = "service_estimated" in existing or "service_estimated" in fields
    compacted = "spec" not in existing  # a retention summary: only the fields it kept compare
    for name, label in _REPEAT_COMPARED:
        if compacted and name == "spec":
            out += _digest_differences(existing, fields)
            continue
        if compacted and name not in existing:
            continue
        if name == "service_s" and estimated:
            continue
        old, new = existing.get(name), fields.get(name)
        if name == "spec":
            try:
                old_spec, new_spec = _compared_spec(old), _compared_spec(new)
            except (ValueError, AttributeError):
                continue
            out += sorted(key for key in set(old_spec) | set(new_spec) if old_spec.get(key) != new_spec.get(key))
        elif name == "service_s" or name == "deadline_s":
            if (None if old is None else float(old)) != (None if new is None else float(new)):
                out.append(label)
        elif name == "deps":
            if set(json.loads(old or "[]")) != set(json.loads(new or "[]")):
                out.append(label)
        elif str(old) != str(new):
            out.append(label)
    return tuple(out)


# the reason of a leased job cancelled by the reclaim of its lease (reclaim.lua): its attempt
# is in ``attempts`` already when a phase had started
_CANCELLED_BY_RECLAIM = "cancelled; lease reclaimed"


def typed_record(rec: dict[str, str]) -> dict[str, Any]:
    """A job record's hash as :meth:`Producer.status` gives it: one JSON type per kind of
    value (times and durations floats, counts ints, ``deps``/``helpers`` lists, flags
    bools, each time with its ISO-8601 UTC twin), every documented field present, the
    planner's wait reason only on a queued job, ``attempts`` the attempts made and
    ``reclaimed_attempts`` the record's own count. ``rec`` is changed in place (and
    returned); a ``spec`` field is left as it is."""
    for k in _FLOAT_FIELDS:
        if k in rec:  # an empty field is a value not known (a queued job's wait_eta the plan did not give)
            rec[k] = float(rec[k]) if rec[k] != "" else None  # type: ignore[assignment]
    for k in _INT_FIELDS:
        if k in rec:
            rec[k] = int(rec[k]) if rec[k] != "" else None  # type: ignore[assignment]
    for k in _JSON_LIST_FIELDS:
        if k in rec:
            rec[k] = json.loads(rec[k]) if rec[k] else []
    for k in _FLAG_FIELDS:
        if k in rec:
            rec[k] = rec[k] not in ("", "0")  # type: ignore[assignment]
    rec.pop("leased_before", None)  # the store's first-lease bookkeeping (lib.lua forget_lease), not the user's
    if rec.get("host") == "":  # a lease taken with no holder named (as the lease's own view says it)
        rec["host"] = None
    if rec.get("state") == "queued":  # the level it is planned at: a dependant's it inherits, else its own
        from makespan.wait_reasons import planned_priority

        rec["planned_priority"] = planned_priority(rec) or rec.get("priority", "")
    if rec.get("state") != "queued":  # the planner's last wait reason, from when it waited: not now
        for field in ("wait_reason", "wait_detail", "wait_eta", "wait_at", "planned_priority"):
            rec.pop(field, None)
    out: dict[str, Any] = rec
    for k, default in _STATUS_DEFAULTS.items():  # every documented field present (a new user's KeyError on tries)
        out.setdefault(k, default() if callable(default) else default)
    if "lease" in out:
        out.setdefault("token", None)  # the fencing token of a lease its release cleared
    add_utc_times(out, _TIME_FIELDS)
    out["reclaimed_attempts"] = out.get("attempts", 0)
    out["attempts"] = attempts_made(out)
    return out


# reasons of a job failed by reclaim.lua, whose last attempt is among the reclaimed ones: a lost
# holder's, a failed start's, a lost pool process's (a verifier: the last two showed one too many)
_FAILED_BY_RECLAIM = ("lease expired", "its endpoint failed to start (", "the GPU worker process running it died (")


def attempts_made(rec: dict[str, Any]) -> int:
    """Attempts a job made so far, from its record (ints already parsed): the stored
    result's attempt when there is one; else the reclaimed and retried attempts, plus the
    one in progress (leased, running) or that ended it (completed; failed, unless the
    reclaim or hand-back of its last lease failed it: a lost holder, a start that failed, a
    pool process that died; that attempt is among the reclaimed ones;
    cancelled while it held a lease, unless a reclaim of that lease cancelled it, as for
    failed: the record still names the lease, which every way back to a queue deletes).
    So a leased or running job that is cancelled keeps the attempt it showed."""
    if rec.get("result_attempt"):
        return int(rec["result_attempt"])
    done = int(rec.get("attempts") or 0) + int(rec.get("tries") or 0)
    state = rec.get("state")
    reason = str(rec.get("reason") or "")
    if state in ("leased", "running", "completed"):
        return done + 1
    if state == "failed" and not any(marker in reason for marker in _FAILED_BY_RECLAIM):
        return done + 1
    if state == "cancelled" and rec.get("lease") and reason != _CANCELLED_BY_RECLAIM:
        return done + 1
    return done


def waiting_record(r: redis.Redis, keys: Keys, job_id: str, rec: dict[str, str],
                   stale_after_s: float) -> dict[str, str]:
    """A queued or delayed job's record read again, in one MULTI with its planner's state
    (leader lock, last reason write, the Redis server's clock, its queue position), with its
    ``wait_reason``, ``wait_detail`` and ``wait_eta`` as :func:`makespan.wait_reasons.reason_of`
    answers them (what ``makespan why`` shows; ``makespan status`` and the dashboard's job
    page use it): an entry the planner's last write did not renew (the job was not read by
    that tick, or was queued again since) is ``behind_batch``, one left while no planner
    leads is ``no_planner``, not the reason and ETA of the tick that last read the job; a
    delayed job's is read from its record. ``rec``: the record as first read (its pool and
    priority name the keys). The record as it is now otherwise; empty when it is gone.

    Raises:
        redis.RedisError: Redis failed."""
    from makespan.wait_reasons import reason_of

    scoped = keys.for_pool(rec.get("pool") or None)
    p = r.pipeline(transaction=True)
    p.time()
    p.exists(scoped.planner_leader)
    p.get(scoped.wait_reasons_at)
    p.hgetall(keys.job(job_id))
    p.zrank(scoped.queue(rec.get("priority") or "NORMAL"), job_id)
    (sec, usec), leads, written, now, position = p.execute()
    if now.get("state") not in ("queued", "delayed"):
        return now
    reason, detail, eta = reason_of(now, planner_leads=bool(leads), server_now_s=sec + usec / 1e6,
                                    queue_position=position, stale_after_s=stale_after_s,
                                    written_at_s=float(written) if written else None)
    if reason == "behind_batch" and detail.startswith("position "):
        detail += higher_levels_ahead(r, scoped, now.get("priority") or "NORMAL")
    return {**now, "wait_reason": reason, "wait_detail": detail, "wait_eta": "" if eta is None else repr(eta)}


def higher_levels_ahead(r: redis.Redis, scoped: Keys, priority: str) -> str:
    """For a ``behind_batch`` job's detail: ``", behind N queued jobs of higher levels"`` (the
    queues of ``scoped``'s pool above ``priority``, read first by the planner), or "" when
    none. Its queue position alone counted only its own level: a LOW job "at position 8072"
    had 10,800 CRITICAL, HIGH and NORMAL jobs ahead too (a large-queue check).

    Raises:
        redis.RedisError: Redis failed."""
    if priority not in Priority.__members__:
        return ""
    above = [level for level in Priority if level < Priority[priority]]  # strict priority: read first
    if not above:
        return ""
    p = r.pipeline(transaction=False)
    for level in above:
        p.zcard(scoped.queue(level))
    ahead = sum(int(n) for n in p.execute())
    return f", behind {ahead:,} queued jobs of higher levels" if ahead else ""


def typed_waiting_record(rec: dict[str, Any]) -> dict[str, Any]:
    """:func:`typed_record` of a record :func:`waiting_record` answered: a delayed job keeps
    the wait fields read from its record now (``typed_record`` drops a non-queued job's,
    which are a planner's old write)."""
    delayed_why = ({field: rec.get(field) for field in ("wait_reason", "wait_detail", "wait_eta")}
                   if rec.get("state") == "delayed" and "wait_reason" in rec else None)
    out = typed_record(rec)
    if delayed_why is not None:
        eta = delayed_why["wait_eta"]
        out.update(wait_reason=delayed_why["wait_reason"], wait_detail=delayed_why["wait_detail"] or "",
                   wait_eta=float(eta) if eta else None)
        add_utc_times(out, ("wait_eta",))
    return out


class Producer:
    """Producer bound to one Redis, key prefix and fleet."""

    def __init__(self, r: redis.Redis, keys: Keys, fleet: FleetSpec | None, settings: Settings | None = None):
        self.r, self.keys, self.fleet = r, keys, fleet
        self.settings = settings or Settings()
        self.jobs = JobStore(r, keys, self.settings.events_max_len)
        self._pool_stores: dict[str, JobStore] = {}  # pool -> its JobStore (its queues and planner wake-up)

    def _store(self, pool: str | None) -> JobStore:
        """The JobStore whose keys are pool ``pool``'s (None: the implicit pool's)."""
        if pool is None:
            return self.jobs
        if pool not in self._pool_stores:
            self._pool_stores[pool] = JobStore(self.r, self.keys.for_pool(pool), self.settings.events_max_len)
        return self._pool_stores[pool]

    def submit(self, job: JobSpec | dict[str, Any], traceparent: str | None = None,
               extra_fields: dict[str, Any] | None = None) -> JobHandle:
        """Validate and enqueue ``job``. ``extra_fields`` are written into the job record
        with it (``service_estimated`` from :class:`makespan.client.Client`).

        Returns:
            JobHandle with the job id (the existing one for a repeated idempotency key).
        Raises:
            ValidationError: the job is invalid (nothing was written), including a
                ``depends_on`` id that names no job (checked atomically with the write).
            StoreError: Redis failed (an outage writes nothing: the script runs whole or not at
                all; a StoreBug keeps what it wrote before it, docs/operations.md).
        """
        if self.fleet is None:
            raise ValidationError("fleet", None, f"submitting needs a fleet: pass --fleet or start a planner first "
                                                 f"(none is published under key prefix {self.keys.prefix!r} at "
                                                 f"{redacted_url(self.settings.redis_url)})", show_value=False)
        spec = parse_job(job, self.fleet, self.settings.max_payload_bytes, self.settings.max_depends_on)
        if spec.deadline_s is not None and spec.deadline_s < spec.service_s:
            log.warning("job deadline_s %g is shorter than its service_s %g (workload s): it cannot be met; it is "
                        "submitted, and counted late in the report's weighted tardiness (only the tardiness "
                        "policies plan by deadlines)", spec.deadline_s, spec.service_s)
        self._check_references(spec)
        traceparent = traceparent or telemetry.job_traceparent()
        job_id = uuid.uuid4().hex
        now = time.time()
        fields = {
            "id": job_id, "state": JobState.QUEUED.value, "endpoint": spec.endpoint, "priority": spec.priority.name,
            "service_s": repr(spec.service_s), "submitted_at": repr(now), "attempts": 0,
            "spec": record_spec(spec),
        }
        if spec.idempotency_key is not None:  # kept by the retention summary: a repeat compares its spec
            fields["spec_digest"] = spec_digest(fields["spec"])
        if spec.deadline_s is not None:  # due time, workload s after submission (tardiness policies)
            fields["deadline_s"] = repr(spec.deadline_s)
        if spec.workload_id:
            fields["workload_id"] = spec.workload_id
        if spec.workload:
            fields["fn"] = spec.workload
        if spec.helpers:  # the planner reads them with the job (makespan.workers.batch)
            fields["helpers"] = json.dumps(list(spec.helpers))
        if extra_fields:
            fields.update(extra_fields)
        if spec.depends_on:
            fields["deps"] = json.dumps(list(spec.depends_on))
        if traceparent:
            fields["traceparent"] = traceparent
        pool = pools.route(self.r, self.keys, self.fleet, spec.endpoint, spec.priority)  # None: no pools
        if pool is not None:
            fields["pool"] = pool
        ev = json.dumps({"ts": now, "kind": "submitted", "job": job_id, "endpoint": spec.endpoint,
                         "priority": spec.priority.name, "planned_s": spec.service_s,
                         **({"deadline_s": spec.deadline_s} if spec.deadline_s is not None else {})})
        # a delayed job is due at the server clock + delay_s; a dependency without a record is
        # refused by the same script (ValidationError, nothing written)
        try:
            if self.settings.submit_wait_replicas > 0:
                created, jid = self._submit_replicated(job_id, fields, ev, spec, pool)
            else:
                created, jid = self._store(pool).submit(job_id, fields, ev,
                                                        self.keys.for_pool(pool).queue(spec.priority),
                                                        spec.idempotency_key, spec.delay_s)
        except StoreError as e:
            if not sent_without_reply(e):
                raise
            if spec.idempotency_key:  # the key may name a job written earlier (a retried submit): that id
                named = self._idempotency_target(spec.idempotency_key)
                if named and named != job_id:
                    raise SubmitOutcomeUnknown(named, f"submit: Redis did not answer ({e.__cause__}); idempotency "
                                                      f"key {spec.idempotency_key!r} names job {named} (`makespan "
                                                      f"status {named}`): resubmitting with the same key is safe") from e
                again = (f"resubmitting with the same idempotency_key is safe (it returns the job's id{'' if named else ' once Redis answers'})")
            else:
                again = ("submit it again only if it is not there: without an idempotency_key a second submit can "
                         "run the job twice")
            raise SubmitOutcomeUnknown(job_id, f"submit of job {job_id}: Redis did not answer ({e.__cause__}): the "
                                               f"job may or may not be written; look it up (`makespan status "
                                               f"{job_id}`) before acting; {again}") from e
        if not created:
            try:
                existing = self.r.hgetall(self.keys.job(jid))
            except redis.RedisError as e:
                raise StoreError(f"submit: reading existing job {jid}: {e}") from e
            prio = Priority[existing.get("priority") or spec.priority.name]
            ignored = ignored_on_repeat(existing, fields) if existing else ()
            if ignored:  # a warning: a re-run notebook cell with edited arguments gets the old job
                log.warning("%s", ignored_options_text(spec.idempotency_key, jid, ignored),
                            extra={CLI_PRINTS_IT: True})
            return JobHandle(jid, False, prio, ignored)
        return JobHandle(jid, True, spec.priority)

    def _check_references(self, spec: JobSpec) -> None:
        """A job passed as an argument (:data:`makespan.results.REFERENCE`) must run a
        workload function: a plain job or a workload step stores no result, and the call
        failed only when the dependant ran (after its wait), saying the result had expired.
        The reference is reserved for that: one the job does not also depend on (written by
        hand, e.g. in ``--args``, which would run before that job ends) is refused, as is one
        to a completed job whose result has expired.

        Raises:
            ValidationError: ``job.args[N]`` / ``job.kwargs.NAME`` names a job whose record
                names no function, a job this one does not depend on, or a completed job
                whose result is gone (nothing is written).
            StoreError: Redis failed."""
        from makespan.results import REFERENCE, references

        named = [(f"job.args[{index}]", ref) for index, value in enumerate(spec.args)
                 for ref in references([value])]
        named += [(f"job.kwargs.{name}", ref) for name, value in spec.kwargs.items() for ref in references([value])]
        if not named:
            return
        if spec.idempotency_key is not None:
            try:  # a repeated key returns its job, whatever this call's arguments: nothing to check
                if self.r.exists(self.keys.idem(spec.idempotency_key)):
                    return
            except redis.RedisError as e:
                raise StoreError(f"submit: reading idempotency key {spec.idempotency_key!r}: {e}") from e
        for field, ref in named:
            if not isinstance(ref, str):
                raise ValidationError(field, {REFERENCE: ref}, f"the key {REFERENCE!r} is reserved for a job passed "
                                      "as an argument (its value a job id): pass the Job handle instead")
            if ref not in spec.depends_on:
                raise ValidationError(field, {REFERENCE: ref}, f"the key {REFERENCE!r} is reserved for a job passed "
                                      "as an argument, and this job does not depend on that job: pass the Job handle "
                                      "(makespan.connect().submit(fn, job)), which adds the dependency, or add "
                                      f"{ref!r} to depends_on")
        try:
            pipe = self.r.pipeline(transaction=False)
            for _field, ref in named:
                pipe.hmget(self.keys.job(ref), ("state", "fn"))
                pipe.exists(self.keys.result(ref))
            found = pipe.execute()
        except redis.RedisError as e:
            raise StoreError(f"submit: reading the jobs its arguments name: {e}") from e
        for (field, ref), (state, fn), has_result in zip(named, found[::2], found[1::2]):
            if state and not fn:  # no record: refused as a dependency that names no job
                raise ValidationError(field, ref, f"job {ref} runs no workload function (a plain job or a workload "
                                                  "step): it stores no result to pass; wait for it with depends_on "
                                                  "instead")
            if state == "completed" and not has_result:
                raise ValidationError(field, ref, f"job {ref} completed, but its result is gone (a result is kept "
                                                  "MAKESPAN_RESULT_TTL_S after the job ends): submit that job again "
                                                  "and pass the new one")

    def _submit_replicated(self, job_id: str, fields: dict[str, Any], event_json: str,
                           spec: JobSpec, pool: str | None) -> tuple[bool, str]:
        """Submit, then Redis ``WAIT`` on the same connection until
        ``settings.submit_wait_replicas`` replicas hold the job, at most
        ``settings.submit_wait_timeout_s`` (:meth:`makespan.store.JobStore.submit_replicated`).
        A repeated idempotency key waits too: its first submit may have been written and
        not acknowledged (it raised the StoreError below), and returning the existing job
        without a wait acknowledged a job no replica had (the chaos runner's Sentinel
        failover lost 7 jobs so). Raises StoreError when fewer acknowledged: the job is on
        the primary but could be lost in a failover."""
        want = self.settings.submit_wait_replicas
        timeout_ms = max(1, int(self.settings.submit_wait_timeout_s * 1000))
        created, jid, acked = self._store(pool).submit_replicated(
            job_id, fields, event_json, self.keys.for_pool(pool).queue(spec.priority), spec.idempotency_key,
            spec.delay_s, want, timeout_ms)
        if acked < want:
            raise StoreError(f"submit of job {jid}: only {acked} of {want} replica(s) acknowledged it within "
                             f"{self.settings.submit_wait_timeout_s} s (MAKESPAN_SUBMIT_WAIT_REPLICAS); it is written "
                             "on the primary but may be lost if the primary fails now; unless lost or cancelled "
                             f"(makespan cancel {jid}) it will still run, so resubmit only with the same "
                             "idempotency_key (a new submit without one runs the job twice)")
        return created, jid

    def status(self, job_id: str) -> dict[str, Any]:
        """The job record (state, times, reason, lease, attempts, ...). ``attempts`` is the
        number of attempts made so far (0 before the first lease; the same count as
        ``result_attempt`` once a result is stored); ``reclaimed_attempts`` counts those
        whose lease was lost (its GPU worker died or stopped renewing it) and
        ``tries``, failed runs of a workload function that were retried.

        A ``leased`` or ``running`` job also has, from its lease record and its phase
        markers (read in one step with the record): ``gpus``, the UUIDs of the GPUs its
        lease holds (list of str); ``host``, the fleet host they are on; ``phase``, the phase running now (``evict``,
        ``start_endpoint``, ``execute``, ``clear``; None between two phases, while the next
        one's task waits for its GPU worker); ``phases_done``, the phases of this lease
        finished so far, in order. An ended job keeps the ``gpus`` and ``host`` of its last
        lease (where it ran); a queued or delayed one has none.

        A ``queued`` or ``delayed`` job has ``wait_reason``, ``wait_detail`` and ``wait_eta``
        (unix s on the Redis server's clock, or None) as ``makespan why`` answers them now
        (:func:`makespan.wait_reasons.reason_of`: ``behind_batch`` for an entry the planner's
        last reason write did not renew, ``no_planner`` while none leads; ``delayed_until`` or
        ``retry_backoff`` for a delayed one), and a queued one ``wait_at``, when the planner
        last wrote the job's entry.

        Every value has one JSON type: numbers are numbers (``service_s``, ``attempts``,
        ``tries``, ``retries`` ...), ``deps`` (the ids it depends on) and ``helpers`` are
        lists, ``cancel_requested`` is a bool. Times (``submitted_at``, ``leased_at``, ``started_at``, ``finished_at``,
        ``not_before``, ``progress_at``, ``wait_eta``, ``wait_at``) are unix s (float, or
        None when the record holds an empty value); each one present also has its
        ISO-8601 UTC twin, ``{field}_utc`` (``"2026-12-05T23:52:03.123Z"``, or None).

        Raises:
            NotFoundError: no such job (or it was compacted away after its retention).
            StoreError: Redis failed.
        """
        if not is_utf8(job_id):
            raise job_not_found(job_id, self.keys, self.settings)
        try:
            rec, lease = self._record_with_lease(job_id)
        except redis.RedisError as e:
            raise StoreError(f"status {job_id}: {e}") from e
        if not rec:
            raise job_not_found(job_id, self.keys, self.settings)
        if rec.get("state") in ("queued", "delayed"):  # why it waits, as `makespan why` says it
            try:
                rec = self._queued_reason(job_id, rec)
            except redis.RedisError as e:
                raise StoreError(f"status {job_id}: {e}") from e
            if not rec:
                raise job_not_found(job_id, self.keys, self.settings)
        rec.pop("spec", None)
        out = typed_waiting_record(rec)
        if lease is not None:
            out.update(lease)
        return dict(sorted(out.items()))

    def _idempotency_target(self, key: str) -> str | None:
        """The job id idempotency ``key`` names now (``P:idem:{key}``), or None (none, or
        Redis did not answer this read either)."""
        try:
            named = self.r.get(self.keys.idem(key))
        except redis.RedisError:
            return None
        return str(named) if named else None

    def _queued_reason(self, job_id: str, rec: dict[str, str]) -> dict[str, str]:
        """:func:`waiting_record` with this producer's keys and lease TTL."""
        from makespan.wait_reasons import stale_after_s

        return waiting_record(self.r, self.keys, job_id, rec, stale_after_s(self.settings.lease_ttl_s))

    def _record_with_lease(self, job_id: str) -> tuple[dict[str, str], dict[str, Any] | None]:
        """The job's record and, for a leased or running job, what its lease holds now
        (``gpus``, ``host``, ``phase``, ``phases_done``; see :meth:`status`): the record, the lease
        record and the phase markers of the lease the record names are read in one
        MULTI, so they agree; when the record names another lease by then (the job was
        reclaimed and leased again between the two reads) they are read again."""
        rec = self.r.hgetall(self.keys.job(job_id))
        for _ in range(5):
            lease_id = rec.get("lease") if rec.get("state") in ("leased", "running") else None
            if not lease_id:
                return rec, None
            p = self.r.pipeline(transaction=True)
            p.hgetall(self.keys.job(job_id))
            p.hmget(self.keys.lease(lease_id), "gpus", "holder")
            p.hgetall(self.keys.phase(lease_id))
            now, (gpus_json, host), marks = p.execute()
            if now.get("lease") == lease_id and now.get("state") in ("leased", "running"):
                return now, {"gpus": json.loads(gpus_json) if gpus_json else [], "host": host or None,
                             **phase_now(marks)}
            rec = now
        return rec, None  # re-leased on every read: the record alone

    def cancel(self, job_id: str) -> str:
        """Cancel a job. A queued or delayed job is removed from its queue (or from the
        delayed set) at once (``cancelled``).
        A leased one is marked ``cancel_requested``: a phase that has not started yet is
        skipped, the job ends ``cancelled`` and its GPUs are released; a phase already
        running finishes first (a job in its last phase completes). Returns the outcome
        or the job's final state. To tell a cancel that did something from one that found
        the job already ended (``cancelled`` both times), see :meth:`cancel_outcome`.

        Raises:
            NotFoundError: no such job.
            StoreError: Redis failed.
        """
        return self.cancel_outcome(job_id).state

    def cancel_outcome(self, job_id: str) -> CancelOutcome:
        """Cancel a job as :meth:`cancel` does, and say what this call did: a
        :class:`CancelOutcome` (``state`` is what :meth:`cancel` returns;
        ``already_ended`` tells a job that had ended before this call, ``finished_at``
        says when).

        Raises:
            NotFoundError: no such job.
            StoreError: Redis failed.
        """
        try:
            return self._cancel_job(job_id)
        except redis.RedisError as e:
            raise StoreError(f"cancel {job_id}: {e}") from e

    def cancel_outcomes(self, job_ids: Sequence[str], chunk: int = 500) -> list[CancelOutcome | None]:
        """:meth:`cancel_outcome` of each of ``job_ids``, in order (None: no such job), a
        chunk of ids per three round trips (a bulk ``makespan cancel`` of 15,034 jobs took 52 s
        at two round trips per job: a fleet-scale operator). Each job's cancel is its own
        atomic script, as one by one.

        Raises:
            StoreError: Redis failed (the chunks before were cancelled)."""
        out: list[CancelOutcome | None] = []
        try:
            for first in range(0, len(job_ids), chunk):
                out.extend(self._cancel_chunk(list(job_ids[first:first + chunk])))
        except redis.RedisError as e:
            raise StoreError(f"cancel: {e}") from e
        return out

    def _cancel_chunk(self, job_ids: list[str]) -> list[CancelOutcome | None]:
        readable = [job_id if is_utf8(job_id) else None for job_id in job_ids]
        p = self.r.pipeline(transaction=False)
        for job_id in readable:
            if job_id is not None:
                p.hmget(self.keys.job(job_id), "priority", "pool", "state")
        heads = iter(p.execute() if any(job_id is not None for job_id in readable) else [])  # "" is an id read
        targets: list[tuple[str, str, str | None] | None] = []
        for job_id in readable:
            prio, pool, state = next(heads) if job_id is not None else (None, None, None)
            if job_id is None or prio is None and state is None:
                targets.append(None)
                continue
            targets.append((job_id, prio or self._queued_level(job_id, pool), pool))
        p = self.r.pipeline(transaction=False)
        now_s = time.time()
        for target in targets:
            if target is not None:
                job_id, prio, pool = target
                ev = json.dumps({"ts": now_s, "kind": "cancelled", "job": job_id, "priority": prio})
                self.jobs.cancel(job_id, self.keys.for_pool(pool).queue(prio), ev, now_s, client=p)
        answers = iter(p.execute(raise_on_error=False) if any(targets) else [])
        said: list[str | None] = []
        for target in targets:
            answer = next(answers) if target is not None else None
            if isinstance(answer, Exception):
                raise StoreError(f"cancel {target[0] if target else ''}: {answer}") from answer
            said.append(None if answer is None or answer == "missing" else str(answer))
        ended = [target[0] for target, out in zip(targets, said) if target is not None and out is not None
                 and out not in ("cancel_requested", "cancel_requested_before")]
        p = self.r.pipeline(transaction=False)
        for job_id in ended:
            p.hget(self.keys.job(job_id), "finished_at")
        finished = dict(zip(ended, (float(raw) if raw else None for raw in (p.execute() if ended else []))))
        telemetry.end_cancelled_job_spans(self.r, [(target[0], self.keys.job(target[0]))
                                                   for target, out in zip(targets, said)
                                                   if target is not None and out == "cancelled_now"])
        outcomes: list[CancelOutcome | None] = []
        for target, out in zip(targets, said):
            if target is None or out is None:
                outcomes.append(None)
            elif out in ("cancelled_now", "cancel_requested", "cancel_requested_before"):
                outcomes.append(CancelOutcome(target[0], "cancelled" if out == "cancelled_now" else "cancel_requested",
                                              already_ended=False, requested_before=out == "cancel_requested_before",
                                              finished_at=finished.get(target[0]) if out == "cancelled_now" else None))
            else:
                outcomes.append(CancelOutcome(target[0], out, already_ended=True, requested_before=False,
                                              finished_at=finished.get(target[0])))
        return outcomes

    def _queued_level(self, job_id: str, pool: str | None) -> str:
        """The priority level whose queue (of ``pool``) holds ``job_id``, for a record without
        its ``priority`` field (damaged: the cancel said "no job" of a job that existed);
        NORMAL when no queue holds it (delayed, leased or ended: the script reads the state)."""
        scope = self.keys.for_pool(pool)
        p = self.r.pipeline(transaction=False)
        for level in Priority:
            p.zscore(scope.queue(level.name), job_id)
        for level, score in zip(Priority, p.execute()):
            if score is not None:
                return level.name
        return Priority.NORMAL.name

    def _cancel_job(self, job_id: str) -> CancelOutcome:
        (outcome,) = self._cancel_chunk([job_id])
        if outcome is None:
            raise job_not_found(job_id, self.keys, self.settings)
        return outcome

    def queue_depths(self) -> dict[str, int]:
        """Queued jobs per priority level (ZCARD of each queue; summed over the pools)."""
        p = self.r.pipeline(transaction=False)
        scopes = [self.keys.for_pool(pool) for pool in (self.fleet.pool_names() if self.fleet else [])] or [self.keys]
        for keys in scopes:
            for lvl in Priority:
                p.zcard(keys.queue(lvl))
        try:
            depths = p.execute()
            return {lvl.name: sum(depths[i::len(Priority)]) for i, lvl in enumerate(Priority)}
        except redis.RedisError as e:
            raise StoreError(f"queue depths: {e}") from e


def phase_now(marks: dict[str, str]) -> dict[str, Any]:
    """``phase`` (running now: claimed, not done; None between phases) and ``phases_done``
    (in phase order) from a lease's phase markers ``P:phase:{lease}`` (``{phase}:claimed``
    = ``1`` when a phase starts, ``{phase}`` = ``done`` when it has finished)."""
    done = [p for p in metrics.PHASES if marks.get(p) == "done"]
    running = [p for p in metrics.PHASES if marks.get(f"{p}:claimed") and marks.get(p) != "done"]
    return {"phase": running[-1] if running else None, "phases_done": done}


def submit(job: JobSpec | dict[str, Any], *, fleet: FleetSpec, settings: Settings | None = None,
           r: redis.Redis | None = None) -> JobHandle:
    """Module-level convenience: ``submit({"endpoint": ..., "service_s": ...}, fleet=...)``."""
    from makespan.redis_conn import connect

    settings = settings or Settings.from_env()
    return Producer(r or connect(settings.redis_url), Keys(settings.key_prefix), fleet, settings).submit(job)


def ended_dependency_warnings(r: redis.Redis, keys: Keys, depends_on: list[str], delayed: bool = False) -> list[str]:
    """Warnings for a job just submitted with ``depends_on``: one per dependency that has
    already failed or been cancelled, so the job never runs (the planner's next tick cancels
    it, reason ``dependency ID did not complete``: docs/configuration.md; ``delayed``: it was
    submitted with a delay and is cancelled once that ends); a failed step of a workload may
    still be retried by its workload. ``makespan submit`` prints them on stderr and
    :meth:`makespan.client.Client.submit` logs them on ``makespan.client``. Best effort: a
    Redis error gives none (the job is written)."""
    # as the submit read them: stripped, each once
    depends_on = list(dict.fromkeys(dep.strip() for dep in depends_on if dep and dep.strip()))
    if not depends_on:
        return []
    when = "once its delay ends" if delayed else "at its next tick"
    try:
        pipe = r.pipeline(transaction=False)
        for dep in depends_on:
            pipe.hmget(keys.job(dep), "state", "workload_id")
        records = pipe.execute()
    except redis.RedisError:
        return []
    warnings = []
    for dep, (state, workload_id) in zip(depends_on, records):
        if state == "failed" and workload_id:  # a workload step: its workload may retry it (review)
            warnings.append(f"dependency {dep} (a step of workload {workload_id}) has failed: unless its workload "
                            "retries it, this job never runs (the planner then cancels it: dependency "
                            f"{dep} did not complete)")
        elif state in ("failed", "cancelled"):
            warnings.append(f"dependency {dep} has already {'failed' if state == 'failed' else 'been cancelled'}: "
                            f"this job will never run; the planner cancels it {when} (reason: dependency {dep} "
                            "did not complete)")
    return warnings

