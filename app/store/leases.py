"""GPU leases in Redis: gang acquire, heartbeat renew, fencing check, fenced writes,
reclaim and preempt, each one Lua script of ``makespan/store/lua`` (see their headers).

Per GPU, ``P:gpu:{uuid}`` holds ``{lease_id}:{token}`` with a PX expiry; the token is a
fencing token from the monotonic counter ``P:fence``. A holder acts only while every GPU
of its gang still names its lease and token. Lease expiry is on the Redis server's clock
(each script reads ``TIME``); event timestamps stay on the caller's clock.

:class:`LeaseStore` is the seam the live code calls (``makespan.workers.leases`` adds the
job span of a job a reclaim ends). Every method raises :class:`makespan.errors.StoreError`
when Redis fails.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal, cast

import redis

from makespan.errors import LeaseError, StaleFencingToken, StoreBug, utf8_text
from makespan.keys import WAKE_RELEASE, Keys
from makespan.store.scripts import script, store_error
from makespan.job_states import JobState

log = logging.getLogger("makespan.workers.leases")


def now_ms() -> int:
    """The caller's clock in unix ms: event timestamps only, never a lease expiry."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Lease:
    """A published lease. ``token`` is its fencing token."""

    lease_id: str
    token: int
    gpus: tuple[str, ...]
    warm: bool = False  # every GPU held the instance asked for (``acquire(instance=...)``) when leased
    first: bool = False  # a job lease that is its job's first (not one again after a preemption, reclaim, retry)


# -- fenced ops that change a job's state (:meth:`LeaseStore.fenced`) ------------------------
def start_job_op(keys: Keys, job_id: str, started_at_s: float) -> tuple:
    """The fenced op that sets a leased job ``running`` (its execute phase began)."""
    return ("START_JOB", keys.job(job_id), repr(started_at_s))


def delay_job_op(keys: Keys, job_id: str, due_s: float, reason: str, last_error: str) -> tuple:
    """The fenced op that makes a job ``delayed`` until ``due_s`` (unix s, server clock) on
    ``P:delayed``, with its reason and last error."""
    return ("DELAY_JOB", keys.job(job_id), job_id, repr(due_s), reason, last_error)


def finish_job_op(keys: Keys, job_id: str, state: JobState | str, finished_at_s: float, reason: str) -> tuple:
    """The fenced op that finishes a job (``lib.lua`` ``finish_job``): final ``state``,
    ``finished_at`` (unix s), ``reason``; it leaves ``P:running`` and joins ``P:finished``.

    Raises:
        ValueError: ``state`` is not a final state."""
    final = JobState(state)
    if not final.final:
        raise ValueError(f"finish_job_op: {final.value!r} is not a final state")
    return ("FINISH_JOB", keys.job(job_id), job_id, final.value, repr(finished_at_s), reason)


FN_MISSING_BACKS_MAX = 3  # function_missing hand-backs of one job before it fails (reclaim.lua ARGV[10])


class LeaseStore:
    """Lease operations on one Redis and key prefix. Every method is one atomic script.

    Args:
        r: a client with ``decode_responses=True``.
        keys: the deployment's key builder.
        events_max_len: the events stream cap (Settings.events_max_len; None: its default).
    """

    def __init__(self, r: redis.Redis, keys: Keys, events_max_len: int | None = None):
        self.r, self.keys = r, keys
        self._acquire = script(r, "acquire", events_max_len)
        self._renew = script(r, "renew", events_max_len)
        self._fenced = script(r, "fenced", events_max_len)
        self._claim_phase = script(r, "claim_phase", events_max_len)
        self._reclaim = script(r, "reclaim", events_max_len)
        self._expired = script(r, "expired", events_max_len)
        self._preempt = script(r, "preempt", events_max_len)
        self._unreclaimable_logged: dict[str, float] = {}  # lease id -> monotonic s of its last log line

    def acquire(self, lease_id: str, gpus: tuple[str, ...], ttl_s: float, *, job_id: str = "", kind: str = "job",
                holder: str = "", queue: str = "", planner_token: str = "", info: dict[str, Any] | None = None,
                event: dict[str, Any] | None = None, instance: str = "") -> Lease | None:
        """Lease ``gpus`` whole or not at all. For ``kind == "job"`` the job must still be
        queued in ``queue``; it is removed from it (acknowledged) in the same step.
        ``planner_token`` (when given) must equal the planner fencing counter: a deposed
        planner cannot publish. With ``instance`` (a ``P:resident`` value) the returned
        lease's ``warm`` says whether every GPU held that instance when it was leased
        (no other holder can change that while the lease is current); its ``first`` says
        whether it is the job's first lease. Returns None when a GPU is busy, the job is
        gone, or ``holder`` names a host an operator cordoned (``makespan cordon``: checked in
        the same atomic step, so no plan read before the cordon leases there after it).

        Raises:
            LeaseError: the planner was fenced off (another planner leads now).
            StoreError: Redis failed.
        """
        keys, args = self._acquire_call(lease_id, gpus, ttl_s, job_id, kind, holder, queue, planner_token, info,
                                        event, instance)
        return self._acquired(self._acquire(keys=keys, args=args), lease_id, gpus)

    def acquire_many(self, requests: list[dict[str, Any]]) -> tuple[list[Lease | None], bool]:
        """Several :meth:`acquire` calls (each a dict of its keyword arguments, with
        ``lease_id``, ``gpus`` and ``ttl_s``) in one round trip, applied in order; each
        is its own atomic script, exactly as if called one by one. Returns the leases
        (None where a GPU was busy or the job gone, and for every call from the first
        one refused by the planner fence on) and whether the planner fence refused one
        (the caller then raises :class:`LeaseError` after handling the leases before it).

        Raises:
            StoreError: the round trip failed.
        """
        calls = [self._acquire_call(q["lease_id"], q["gpus"], q["ttl_s"], q.get("job_id", ""), q.get("kind", "job"),
                                    q.get("holder", ""), q.get("queue", ""), q.get("planner_token", ""),
                                    q.get("info"), q.get("event"), q.get("instance", "")) for q in requests]
        p = self.r.pipeline(transaction=False)
        for keys, args in calls:
            p.evalsha(self._acquire.sha, len(keys), *keys, *args)
        try:
            outs = p.execute(raise_on_error=False)
        except redis.RedisError as e:
            raise store_error(e, "acquire leases") from e
        leases: list[Lease | None] = []
        for q, (keys, args), out in zip(requests, calls, outs):
            if isinstance(out, redis.exceptions.NoScriptError):  # not loaded yet (or Redis restarted)
                out = self._acquire(keys=keys, args=args)
            elif isinstance(out, Exception):
                # Redis refused this one script (e.g. OOM: refused before it ran, so the
                # job stays queued for the next tick; an error raised inside it may have left
                # a granted lease, which expires and is reclaimed); the leases around it still count
                log.warning("lease %s for job %s not taken: %s", q["lease_id"], q.get("job_id"), out)
                leases.append(None)
                continue
            try:
                leases.append(self._acquired(out, q["lease_id"], q["gpus"]))
            except LeaseError:
                return leases + [None] * (len(requests) - len(leases)), True
        return leases, False

    def _acquire_call(self, lease_id: str, gpus: tuple[str, ...], ttl_s: float, job_id: str, kind: str, holder: str,
                      queue: str, planner_token: str, info: dict[str, Any] | None, event: dict[str, Any] | None,
                      instance: str) -> tuple[list[str], list[Any]]:
        fields = {"job": job_id, "kind": kind, "holder": holder, "gpus": json.dumps(list(gpus)),
                  **(info or {})}
        leased_event = {"ts": time.time(), "kind": "leased", "lease": lease_id, "job": job_id or None,
                        "gpus": list(gpus), **(event or {})}
        keys = [self.keys.fence, self.keys.lease(lease_id), self.keys.leases, self.keys.job(job_id or "-"),
                queue or self.keys.queue("normal"), self.keys.running, self.keys.planner_fence, self.keys.events,
                self.keys.gpu_owner, *[self.keys.gpu(g) for g in gpus],
                *([self.keys.resident(g) for g in gpus] if instance else []), self.keys.hosts_cordoned]
        return keys, [lease_id, job_id, int(ttl_s * 1000), now_ms(), holder, json.dumps(fields), planner_token,
                      json.dumps(leased_event), JobState.QUEUED.value if kind == "job" else "none", instance,
                      self.keys.script_prefix]

    @staticmethod
    def _acquired(out: list, lease_id: str, gpus: tuple[str, ...]) -> Lease | None:
        if out[0] == 1:
            return Lease(lease_id, int(out[1]), tuple(gpus), bool(out[2]), len(out) > 3 and bool(out[3]))
        if out[1] == "planner_fenced":
            raise LeaseError("planner fencing token is stale: another planner leads")
        if out[1] == "owned":  # the GPU key is gone but its lease is live: evicted or deleted by hand?
            log.warning("lease %s refused: %s has no key but lease %s still holds it (was the key evicted? "
                        "Redis maxmemory-policy must be noeviction)", lease_id, out[2], out[3])
        return None

    def renew(self, lease: Lease, ttl_s: float) -> bool:
        """Extend ``lease`` to ``ttl_s`` seconds from now on the Redis server's clock if it
        is still ours; False if stale.

        Raises:
            StoreError: Redis failed."""
        keys = [self.keys.lease(lease.lease_id), self.keys.leases, *[self.keys.gpu(g) for g in lease.gpus]]
        return bool(self._renew(keys=keys, args=[lease.lease_id, lease.token, int(ttl_s * 1000)]))

    def check(self, lease: Lease) -> None:
        """Raise :class:`StaleFencingToken` unless every GPU still names this lease.

        Raises:
            StaleFencingToken: the lease is no longer current. StoreError: Redis failed."""
        keys = [self.keys.lease(lease.lease_id), self.keys.leases, *[self.keys.gpu(g) for g in lease.gpus]]
        if not self._renew(keys=keys, args=[lease.lease_id, lease.token, 0]):
            raise StaleFencingToken(f"lease {lease.lease_id} token {lease.token} is no longer current")

    def claim_phase(self, lease: Lease, phase: str) -> Literal["claimed", "claimed_before", "stale"]:
        """Claim ``phase`` of ``lease`` for this run (``P:phase:{lease}`` field
        ``{phase}:claimed``), atomically with the fencing check: ``"claimed"``, or
        ``"claimed_before"`` (another delivery of the phase task claimed it: do not run it
        again), or ``"stale"`` (the lease was reclaimed, preempted or released: nothing
        written, so no phase hash outlives the lease).

        Raises:
            StoreError: Redis failed (an outage writes nothing: a script runs whole or not at all; a
                :class:`StoreBug` keeps what the script wrote before it, docs/operations.md)."""
        keys = [self.keys.lease(lease.lease_id), self.keys.phase(lease.lease_id),
                *[self.keys.gpu(g) for g in lease.gpus]]
        out = int(self._claim_phase(keys=keys, args=[lease.lease_id, lease.token, phase]))
        return "claimed" if out == 1 else "claimed_before" if out == 0 else "stale"

    def fenced(self, lease: Lease, ops: list[tuple]) -> bool:
        """Apply ``ops`` atomically iff the lease is still current. Each op is
        ``(cmd, key, *args)``: any Redis write command (HSET, SET, DEL, ZADD, RPUSH, ...),
        ``("XADD_E", stream_key, event_json)`` (an event), ``("DELIFEQ", key, value)``
        (delete only while the key still holds ``value``), ``("HSETX", key, field, value, ...)``
        (HSET only while the hash exists), or a job-state op built by
        :func:`start_job_op`, :func:`delay_job_op`, :func:`finish_job_op`. Returns False
        (nothing applied) if stale.

        Raises:
            StoreError: Redis failed (an outage applies nothing: a script runs whole or not at all;
                a :class:`StoreBug` keeps what the script wrote before it, docs/operations.md)."""
        keys = [self.keys.gpu(g) for g in lease.gpus]
        encoded = []
        for op in ops:
            cmd, key, *args = op
            if key not in keys:
                keys.append(key)
            encoded.append([cmd, keys.index(key) + 1, *[utf8_text(a) for a in args]])
        return bool(self._fenced(keys=keys, args=[lease.lease_id, lease.token, len(lease.gpus), json.dumps(encoded),
                                                  self.keys.script_prefix]))

    def expired(self, pipe: redis.client.Pipeline | None = None) -> list[str] | None:
        """Ids of the leases whose expiry has passed on the Redis server's clock (read
        inside one script: the caller's clock plays no part). With ``pipe`` the read is
        queued on that pipeline and None returned; its result comes from ``pipe.execute()``
        (sent as EVAL: no extra SCRIPT EXISTS round trip, no NOSCRIPT after a restart).

        Raises:
            StoreError: Redis failed (without ``pipe``)."""
        if pipe is not None:
            self._expired.queue_eval(pipe, [self.keys.leases])
            return None
        return list(self._expired(keys=[self.keys.leases]))

    def reclaim_outcome(self, lease_id: str, max_attempts: int, retry_backoff_s: float = 0.0,
                        retry_backoff_max_s: float = 300.0) -> tuple[str, str]:
        """Reclaim one expired lease (see ``reclaim.lua``): ``(outcome, job id or "")``,
        outcome in ``live``, ``released``, ``requeued``, ``completed``, ``cancelled``, ``failed``.

        Raises:
            StoreError: Redis failed."""
        out = self._reclaim(keys=[self.keys.lease(lease_id), self.keys.leases, self.keys.running, self.keys.events],
                            args=[lease_id, now_ms(), max_attempts, self.keys.script_prefix,
                                  repr(float(retry_backoff_s)), repr(float(retry_backoff_max_s))])
        return str(out[1]), str(out[2]) if len(out) > 2 and out[2] else ""

    def hand_back(self, lease: Lease, max_attempts: int, retry_backoff_s: float = 0.0,
                  retry_backoff_max_s: float = 300.0, wake_key: str = "",
                  cause: str = "worker_shutdown", error: str = "") -> tuple[str, str]:
        """Give up ``lease`` while it is still current (``cause``: ``"worker_shutdown"``, its
        GPU worker shuts down; ``"function_missing"``, its GPU worker does not register the
        job's workload function that a worker of another host does; ``"start_failed"``, the
        job's start phase failed with ``error`` (at most 2,000 characters are kept);
        ``"worker_lost"``, the prefork pool process running its phase died (``error``); the
        ``reclaimed`` event's ``cause`` and the requeued job's reason say which): free its
        GPUs, forget it, and requeue its job at once (or cancel or complete it), as
        :meth:`reclaim` does once it expired (``reclaim.lua`` with the lease's fencing
        token) but counting no attempt (a preemption counts none either: rolling restarts
        must not use up ``max_attempts``, so no retry backoff applies) — except
        ``"start_failed"`` and ``"worker_lost"``, which count one as an expiry does: the job
        waits out the retry backoff and fails after ``max_attempts`` with the last error —
        and push
        :data:`makespan.keys.WAKE_RELEASE` on ``wake_key`` (the planner wake list of its
        GPUs' pool; "" none). A job it ends goes to :meth:`job_ended`.

        Returns:
            ``(outcome, job id or "")``: outcome ``"stale"`` (the token is no longer current
            on every GPU: nothing written) or one of :meth:`reclaim_outcome`'s.
        Raises:
            StoreError: Redis failed (an outage writes nothing: a script runs whole or not at all; a
                :class:`StoreBug` keeps what the script wrote before it, docs/operations.md)."""
        keys = [self.keys.lease(lease.lease_id), self.keys.leases, self.keys.running, self.keys.events,
                *([wake_key] if wake_key else [])]
        out = self._reclaim(keys=keys, args=[lease.lease_id, now_ms(), max_attempts, self.keys.script_prefix,
                                             repr(float(retry_backoff_s)), repr(float(retry_backoff_max_s)),
                                             str(int(lease.token)), WAKE_RELEASE, cause, FN_MISSING_BACKS_MAX,
                                             " ".join(error.split())[:2000]])
        outcome, job_id = str(out[1]), str(out[2]) if len(out) > 2 and out[2] else ""
        if outcome in (s.value for s in JobState if s.final) and job_id:
            self.job_ended(job_id, outcome)
        return outcome, job_id

    def reclaim(self, lease_id: str, max_attempts: int, retry_backoff_s: float = 0.0,
                retry_backoff_max_s: float = 300.0) -> str:
        """Reclaim one expired lease: free its GPUs, requeue its job (with its original
        submission order) or fail it after ``max_attempts``. With ``retry_backoff_s`` > 0
        the job is requeued as a delayed job due in min(retry_backoff_s × 2^(attempts−1),
        retry_backoff_max_s) seconds (makespan.workers.delayed). Returns the outcome.

        Raises:
            StoreError: Redis failed."""
        return self._reclaim_one(lease_id, max_attempts, retry_backoff_s, retry_backoff_max_s)[0]

    def _reclaim_one(self, lease_id: str, max_attempts: int, retry_backoff_s: float,
                     retry_backoff_max_s: float) -> tuple[str, str]:
        """:meth:`reclaim`, returning (outcome, job id or "")."""
        outcome, job_id = self.reclaim_outcome(lease_id, max_attempts, retry_backoff_s, retry_backoff_max_s)
        if outcome in (s.value for s in JobState if s.final) and job_id:
            self.job_ended(job_id, outcome)
        return outcome, job_id or ""

    def job_ended(self, job_id: str, state: str) -> None:
        """Hook: a reclaim or a preemption ended ``job_id`` in final ``state`` (nothing
        here; the live worker's subclass counts it and ends the job's trace span)."""

    def job_preempted(self, job_id: str, priority: str) -> None:
        """Hook: a preemption requeued ``job_id`` (of ``priority``, a level name) (nothing
        here; the live worker's subclass counts it)."""

    def reclaim_expired(self, max_attempts: int, retry_backoff_s: float = 0.0, retry_backoff_max_s: float = 300.0,
                        expired: list[str] | None = None,
                        jobs: dict[str, list[str]] | None = None) -> dict[str, int]:
        """Reclaim every expired lease (``expired``: their ids, already read; each is
        checked again inside its reclaim script). Returns counts by outcome; ``jobs``, when
        given, receives outcome -> the ids of the jobs that lease held (a log line names them).
        A lease whose record its script cannot read (a Redis error reply: a record of the wrong
        type, ``gpus`` that are not JSON; a hand edit or a bug) is counted ``unreclaimable``
        and logged (ERROR, once a minute per lease) and the others are reclaimed: one such
        lease, always first among the expired, stopped every planner tick.

        Raises:
            StoreError: Redis failed (not a :class:`StoreBug` of one lease)."""
        counts: dict[str, int] = {}
        for lease_id in (self.expired() or []) if expired is None else expired:
            try:
                outcome, job_id = self._reclaim_one(lease_id, max_attempts, retry_backoff_s, retry_backoff_max_s)
            except StoreBug as e:
                self._log_unreclaimable(lease_id, e)
                outcome, job_id = "unreclaimable", ""
            counts[outcome] = counts.get(outcome, 0) + 1
            if jobs is not None and job_id:
                jobs.setdefault(outcome, []).append(job_id)
        return counts

    def _log_unreclaimable(self, lease_id: str, error: StoreBug) -> None:
        now = time.monotonic()
        if now - self._unreclaimable_logged.get(lease_id, -3600.0) < 60.0:
            return
        if len(self._unreclaimable_logged) > 1000:
            self._unreclaimable_logged.clear()
        self._unreclaimable_logged[lease_id] = now
        log.error("expired lease %s cannot be reclaimed (%s): its job and GPUs stay as they are until its record "
                  "(`redis-cli HGETALL %s`) is mended; the other leases are reclaimed", lease_id, error,
                  self.keys.lease(lease_id))

    def preempt(self, lease_id: str, by_job: str, planner_token: str = "") -> str:
        """Preempt the job holding ``lease_id`` in favour of ``by_job`` (see ``preempt.lua``).

        Returns:
            ``"preempted"`` or ``"cancelled"``; or why nothing was done: ``"gone"``,
            ``"not_a_job"``, ``"not_leased"`` (its job is in neither state a lease holds a
            job in: queued, delayed or final), ``"executed"`` (its workload already ran: it
            only has to clear), ``"preemptor_not_queued"`` (``by_job`` has a record and is no
            longer queued: leased by another path meanwhile, or cancelled). A requeued
            victim is passed to :meth:`job_preempted`, a cancelled one to :meth:`job_ended`.
        Raises:
            LeaseError: ``planner_token`` is stale (another planner leads).
            StoreError: Redis failed.
        """
        out = self._preempt(keys=[self.keys.lease(lease_id), self.keys.leases, self.keys.running, self.keys.events,
                                  self.keys.planner_fence],
                            args=[lease_id, now_ms(), self.keys.script_prefix, by_job, planner_token])
        if out[0] == 0 and out[1] == "planner_fenced":
            raise LeaseError("planner fencing token is stale: another planner leads")
        outcome = str(out[1])
        if out[0] == 1 and len(out) > 2:
            if outcome == "cancelled":
                self.job_ended(str(out[2]), outcome)
            elif outcome == "preempted":
                self.job_preempted(str(out[2]), str(out[3]))
        return outcome

    def active(self) -> list[dict[str, Any]]:
        """Every live lease record, with ``lease_id`` and ``gpus`` (a list).

        Raises:
            StoreError: Redis failed."""
        out: list[dict[str, Any]] = []
        try:
            # a decode_responses client: str replies (redis-py types them bytes | str)
            for lease_id in cast("list[str]", self.r.zrange(self.keys.leases, 0, -1)):
                stored = cast("dict[str, Any]", self.r.hgetall(self.keys.lease(lease_id)))
                if stored:
                    stored["lease_id"] = lease_id
                    stored["gpus"] = json.loads(stored.get("gpus", "[]"))
                    out.append(stored)
        except redis.RedisError as e:
            raise store_error(e, "read leases") from e
        return out

    def gpu_holders(self, gpus: list[str]) -> dict[str, str | None]:
        """``{gpu uuid: "lease_id:token" or None}``.

        Raises:
            StoreError: Redis failed."""
        try:
            holders: list[Any] = list(self.r.mget([self.keys.gpu(g) for g in gpus])) if gpus else []
        except redis.RedisError as e:
            raise store_error(e, "read GPU holders") from e
        return dict(zip(gpus, holders))

