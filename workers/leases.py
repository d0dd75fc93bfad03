"""GPU leases: gang acquire, heartbeat renew, fencing check, release and reclaim.

Each operation is one Lua script, so a gang is leased whole or not at all and a job
is acknowledged (removed from its queue) in the same step that publishes its lease.

Per GPU, ``P:gpu:{uuid}`` holds ``{lease_id}:{token}`` with a PX expiry; the token is
a fencing token from the monotonic counter ``P:fence`` (Kleppmann, "How to do
distributed locking", 2016). A holder acts only while every GPU of its gang still
names its lease and token; a reclaimed or expired lease makes its later writes no-ops.

One clock decides lease time: the Redis server's. Each script reads ``TIME`` itself
(:data:`makespan.workers.lease_scripts.SERVER_NOW_MS`; allowed in Redis >= 5 scripts, which
replicate effects) to compute ``expires_ms`` (unix ms, the score in ``P:leases``) on
acquire and renew and to compare it on :meth:`LeaseStore.expired` and reclaim, exactly as the GPU keys' PX
expiry runs on that clock. Planner and GPU workers on hosts whose clocks disagree then
agree on when a lease expires: a planner whose clock runs ahead does not reclaim a live
lease (the job would run twice), one that runs behind does not leak GPUs for the skew.
Event timestamps (``ts``, ``leased_at``, ``finished_at``) stay on the caller's clock,
like every other event; they feed reports, not expiry decisions.

This module holds the Python side (:class:`Lease`, :class:`LeaseStore`, :func:`preempt`);
the scripts' text, with their KEYS and ARGV, is in :mod:`makespan.workers.lease_scripts`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis

from makespan.errors import LeaseError, StaleFencingToken
from makespan.keys import Keys
from makespan.models import FINAL_STATES
from makespan.workers.lease_scripts import _ACQUIRE, _EXPIRED, _FENCED, _PREEMPT, _RECLAIM, _RENEW

log = logging.getLogger(__name__)


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


class LeaseStore:
    """Lease operations on one Redis and key prefix. Every method is one atomic script."""

    def __init__(self, r: redis.Redis, keys: Keys):
        self.r, self.keys = r, keys
        self._acquire = r.register_script(_ACQUIRE)
        self._renew = r.register_script(_RENEW)
        self._fenced = r.register_script(_FENCED)
        self._reclaim = r.register_script(_RECLAIM)
        self._expired = r.register_script(_EXPIRED)

    def acquire(self, lease_id: str, gpus: tuple[str, ...], ttl_s: float, *, job_id: str = "", kind: str = "job",
                holder: str = "", queue: str = "", planner_token: str = "", info: dict[str, Any] | None = None,
                event: dict[str, Any] | None = None, instance: str = "") -> Lease | None:
        """Lease ``gpus`` whole or not at all. For ``kind == "job"`` the job must still be
        queued in ``queue``; it is removed from it (acknowledged) in the same step.
        ``planner_token`` (when given) must equal the planner fencing counter: a deposed
        planner cannot publish. With ``instance`` (a ``P:resident`` value) the returned
        lease's ``warm`` says whether every GPU held that instance when it was leased
        (no other holder can change that while the lease is current). Returns None when
        a GPU is busy or the job is gone.

        Raises:
            LeaseError: the planner was fenced off (another planner leads now).
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
        """
        calls = [self._acquire_call(q["lease_id"], q["gpus"], q["ttl_s"], q.get("job_id", ""), q.get("kind", "job"),
                                    q.get("holder", ""), q.get("queue", ""), q.get("planner_token", ""),
                                    q.get("info"), q.get("event"), q.get("instance", "")) for q in requests]
        p = self.r.pipeline(transaction=False)
        for keys, args in calls:
            p.evalsha(self._acquire.sha, len(keys), *keys, *args)
        outs = p.execute(raise_on_error=False)
        leases: list[Lease | None] = []
        for q, (keys, args), out in zip(requests, calls, outs):
            if isinstance(out, redis.exceptions.NoScriptError):  # not loaded yet (or Redis restarted)
                out = self._acquire(keys=keys, args=args)
            elif isinstance(out, Exception):
                # Redis refused this one script (e.g. OOM: refused before it ran, so the
                # job stays queued for the next tick); the leases around it still count
                log.warning("lease %s for job %s not taken: %s", q["lease_id"], q.get("job_id"), out)
                leases.append(None)
                continue
            try:
                leases.append(self._acquired(out, q["lease_id"], q["gpus"]))
            except LeaseError:
                return leases + [None] * (len(requests) - len(leases)), True
        return leases, False

    def _acquire_call(self, lease_id, gpus, ttl_s, job_id, kind, holder, queue, planner_token, info, event,
                      instance) -> tuple[list[str], list[Any]]:
        fields = {"job": job_id, "kind": kind, "holder": holder, "gpus": json.dumps(list(gpus)),
                  **(info or {})}
        ev = {"ts": time.time(), "kind": "leased", "lease": lease_id, "job": job_id or None, "gpus": list(gpus),
              **(event or {})}
        keys = [self.keys.fence, self.keys.lease(lease_id), self.keys.leases, self.keys.job(job_id or "-"),
                queue or self.keys.queue("normal"), self.keys.running, self.keys.planner_fence, self.keys.events,
                self.keys.gpu_owner, *[self.keys.gpu(g) for g in gpus], *([self.keys.resident(g) for g in gpus] if instance else [])]
        return keys, [lease_id, job_id, int(ttl_s * 1000), now_ms(), holder, json.dumps(fields), planner_token,
                      json.dumps(ev), "queued" if kind == "job" else "none", instance, self.keys.prefix]

    @staticmethod
    def _acquired(out: list, lease_id: str, gpus: tuple[str, ...]) -> Lease | None:
        if out[0] == 1:
            return Lease(lease_id, int(out[1]), tuple(gpus), bool(out[2]))
        if out[1] == "planner_fenced":
            raise LeaseError("planner fencing token is stale: another planner leads")
        if out[1] == "owned":  # the GPU key is gone but its lease is live: evicted or deleted by hand?
            log.warning("lease %s refused: %s has no key but lease %s still holds it (was the key evicted? "
                        "Redis maxmemory-policy must be noeviction)", lease_id, out[2], out[3])
        return None

    def renew(self, lease: Lease, ttl_s: float) -> bool:
        """Extend ``lease`` to ``ttl_s`` seconds from now on the Redis server's clock if it
        is still ours; False if stale."""
        keys = [self.keys.lease(lease.lease_id), self.keys.leases, *[self.keys.gpu(g) for g in lease.gpus]]
        return bool(self._renew(keys=keys, args=[lease.lease_id, lease.token, int(ttl_s * 1000)]))

    def check(self, lease: Lease) -> None:
        """Raise :class:`StaleFencingToken` unless every GPU still names this lease."""
        keys = [self.keys.lease(lease.lease_id), self.keys.leases, *[self.keys.gpu(g) for g in lease.gpus]]
        if not self._renew(keys=keys, args=[lease.lease_id, lease.token, 0]):
            raise StaleFencingToken(f"lease {lease.lease_id} token {lease.token} is no longer current")

    def fenced(self, lease: Lease, ops: list[tuple]) -> bool:
        """Apply ``ops`` atomically iff the lease is still current. Each op is
        ``(cmd, key, *args)``: any Redis write command (HSET, SET, DEL, ZADD, RPUSH, ...),
        ``("XADD_E", stream_key, event_json)`` (an event), or ``("DELIFEQ", key, value)``
        (delete only while the key still holds ``value``). Returns False (nothing
        applied) if stale."""
        keys = [self.keys.gpu(g) for g in lease.gpus]
        enc = []
        for op in ops:
            cmd, key, *args = op
            if key not in keys:
                keys.append(key)
            enc.append([cmd, keys.index(key) + 1, *[str(a) for a in args]])
        return bool(self._fenced(keys=keys, args=[lease.lease_id, lease.token, len(lease.gpus), json.dumps(enc)]))

    def expired(self, pipe: redis.client.Pipeline | None = None) -> list[str] | None:
        """Ids of the leases whose expiry has passed on the Redis server's clock (read
        inside one script: the caller's clock plays no part). With ``pipe`` the read is
        queued on that pipeline and None returned; its result comes from ``pipe.execute()``
        (sent as EVAL: no extra SCRIPT EXISTS round trip, no NOSCRIPT after a restart)."""
        if pipe is not None:
            pipe.eval(_EXPIRED, 1, self.keys.leases)
            return None
        return list(self._expired(keys=[self.keys.leases]))

    def reclaim(self, lease_id: str, max_attempts: int, retry_backoff_s: float = 0.0,
                retry_backoff_max_s: float = 300.0) -> str:
        """Reclaim one expired lease: free its GPUs, requeue its job (with its original
        submission order) or fail it after ``max_attempts``. With ``retry_backoff_s`` > 0
        the job is requeued as a delayed job due in min(retry_backoff_s × 2^(attempts−1),
        retry_backoff_max_s) seconds (makespan.workers.delayed). Returns the outcome."""
        out = self._reclaim(keys=[self.keys.lease(lease_id), self.keys.leases, self.keys.running, self.keys.events],
                            args=[lease_id, now_ms(), max_attempts, self.keys.prefix, repr(float(retry_backoff_s)),
                                  repr(float(retry_backoff_max_s))])
        if out[1] in FINAL_STATES and len(out) > 2 and out[2]:
            self._end_job_span(out[2], out[1])
        return out[1]

    def _end_job_span(self, job_id: str, state: str) -> None:
        """The job's ``makespan`` root span, for a job the reclaim ended (its GPU worker,
        which normally ends it, died): one trace per job, whoever finishes it."""
        from makespan import telemetry

        if not telemetry.tracing_enabled():
            return
        tp, submitted, prio, endpoint, reason = self.r.hmget(self.keys.job(job_id), "traceparent", "submitted_at",
                                                              "priority", "endpoint", "reason")
        if tp:
            telemetry.end_job_span(tp, float(submitted or time.time()),
                                   {"job_id": job_id, "priority": prio, "endpoint": endpoint, "state": state},
                                   error=None if state == "completed" else (reason or state))

    def reclaim_expired(self, max_attempts: int, retry_backoff_s: float = 0.0, retry_backoff_max_s: float = 300.0,
                        expired: list[str] | None = None) -> dict[str, int]:
        """Reclaim every expired lease (``expired``: their ids, already read; each is
        checked again inside its reclaim script). Returns counts by outcome."""
        counts: dict[str, int] = {}
        for lid in self.expired() if expired is None else expired:
            o = self.reclaim(lid, max_attempts, retry_backoff_s, retry_backoff_max_s)
            counts[o] = counts.get(o, 0) + 1
        return counts

    def active(self) -> list[dict[str, Any]]:
        out = []
        for lid in self.r.zrange(self.keys.leases, 0, -1):
            rec = self.r.hgetall(self.keys.lease(lid))
            if rec:
                rec["lease_id"] = lid
                rec["gpus"] = json.loads(rec.get("gpus", "[]"))
                out.append(rec)
        return out

    def gpu_holders(self, gpus: list[str]) -> dict[str, str | None]:
        vals = self.r.mget([self.keys.gpu(g) for g in gpus]) if gpus else []
        return dict(zip(gpus, vals))


def preempt(r: redis.Redis, keys: Keys, lease_id: str, by_job: str, planner_token: str = "") -> str:
    """Preempt the job holding ``lease_id`` in favour of ``by_job``: its GPUs are freed
    at once (its holder's later writes fail the fencing check) and it is requeued with
    its original submission order (or cancelled, if a cancel was requested).

    Returns:
        ``"preempted"`` or ``"cancelled"``; or why nothing was done: ``"gone"``,
        ``"not_a_job"``, ``"executed"`` (its workload already ran: it only has to clear).
    Raises:
        LeaseError: ``planner_token`` is stale (another planner leads).
    """
    script = r.register_script(_PREEMPT)
    out = script(keys=[keys.lease(lease_id), keys.leases, keys.running, keys.events, keys.planner_fence,
                       f"{keys.prefix}:finished"],
                 args=[lease_id, now_ms(), keys.prefix, by_job, planner_token])
    if out[0] == 0 and out[1] == "planner_fenced":
        raise LeaseError("planner fencing token is stale: another planner leads")
    return out[1]
