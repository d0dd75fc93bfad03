"""Bounded state: what Redis keeps is bounded by the active jobs, not by history.

Rules (docs/scaling.md states them for operators):

1. A job that reaches a final state (completed, failed, cancelled) is put on the
   finished index ``P:finished`` (zset, score = finish time, unix s on the Redis server's
   clock, which the sweep compares it with: host clocks play no part) by whoever finishes it
   (the store's ``finish_job``, or :func:`mark_finished`).
2. :func:`sweep` — called by the leading planner once per tick, at most every
   ``Settings.retention_sweep_s`` — compacts each newly finished job's record
   ``P:job:{id}`` to a small summary (:data:`SUMMARY_FIELDS`; the spec and payload are
   dropped), moves it to ``P:retained`` (zset, score = finish time) and gives the
   record and its idempotency key ``P:idem:{key}`` a TTL of
   ``Settings.retention_age_s``.
3. Summaries beyond ``Settings.retention_jobs`` (oldest first) or older than
   ``Settings.retention_age_s`` are deleted together with their idempotency keys:
   after that, ``status`` answers NotFoundError and a resubmission with the same
   idempotency key creates a new job.
   Request records ``P:requests:{job}`` and results ``P:result:{job}`` follow their job's
   summary (a result also has its own TTL, ``Settings.result_ttl_s``). Steps of a workload
   still running keep their summary (no TTL) until the workload is done.
   Finished workloads (``P:workloads:done``, score = finish time) are deleted by the
   same age and count limits.
4. The events stream ``P:events`` is trimmed to about ``Settings.events_max_len``
   entries (XTRIM MAXLEN ~).
5. Released leases, phase markers and busy slots are deleted by the release itself
   (``_finish``, reclaim); closed agenda entries by ``AgendaTracker.complete``/``reap``;
   the planner's solve-time list is capped (``STATS_KEEP``). A sweep also deletes
   phase/busy markers whose lease no longer exists (a crash between steps).

Every step works on at most ``Settings.retention_batch`` jobs per call, so a sweep's
cost is bounded however large the backlog; the backlog drains over successive ticks.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import redis

from makespan.keys import Keys
from makespan.models import FINAL_STATES
from makespan.settings import Settings
from makespan.store import JobStore

SUMMARY_FIELDS = ("id", "state", "endpoint", "priority", "service_s", "submitted_at", "leased_at", "started_at",
                  "finished_at", "reason", "attempts", "workload_id",
                  "step",  # a workload step's name: its job page lost it after compaction (a verifier)
                  "idem", "lease", "token", "preemptions", "seq",
                  "pool",  # a pooled fleet's job: `makespan jobs --pool` lists it after compaction too
                  "deps", "helpers",  # what it waited on and ran beside: status said [] after compaction
                  "deadline_s",  # whether it met its deadline can be told after compaction (an SLA user)
                  "gpus", "host",  # where its last lease ran (a new user: status of an ended job dropped them)
                  # workload functions (makespan.registry): name, retries made, the attempt whose result
                  # is stored, planned-by-estimate flag, last progress, last retried error
                  "fn", "tries", "result_attempt", "service_estimated", "progress_done", "progress_total",
                  "progress_note", "last_error",
                  "spec_digest")  # a keyed job's spec, digested: a repeated key still says what it ignored


def finished_key(keys: Keys) -> str:
    """``P:finished``: zset of finished job ids waiting to be compacted, score = finish time (s)."""
    return keys.finished


def retained_key(keys: Keys) -> str:
    """``P:retained``: zset of compacted job summaries kept for ``status``, score = finish time (s)."""
    return keys.retained


def tally_key(keys: Keys) -> str:
    """``P:retention``: hash of finished jobs by final state (completed, failed, cancelled)
    since the prefix was created, and ``last_finished_s`` (latest finish time compacted)."""
    return keys.retention_tally


def mark_finished(r: redis.Redis | redis.client.Pipeline, keys: Keys, job_id: str, finished_at_s: float | None = None):
    """Put ``job_id`` on the finished index (for code paths that finish a job outside
    ``PhaseRunner._finish``). Works on a client or inside a pipeline."""
    return r.zadd(finished_key(keys), {job_id: finished_at_s if finished_at_s is not None else time.time()})


log = logging.getLogger(__name__)
COUNT_LIMIT_WARNING_S = 300.0  # at most one warning this often that the count limit deletes young summaries


@dataclass
class SweepResult:
    """Counts of one :func:`sweep` call."""

    compacted: int = 0
    expired: int = 0
    events_trimmed: int = 0
    orphans: int = 0
    pending: int = 0  # finished jobs still waiting for compaction after this call
    workloads_expired: int = 0
    extra: dict = field(default_factory=dict)


class Retention:
    """Retention for one Redis and key prefix; :meth:`maybe_sweep` is the planner's hook."""

    def __init__(self, r: redis.Redis, settings: Settings):
        self.r, self.settings = r, settings
        self.keys = Keys(settings.key_prefix)
        self.jobs = JobStore(r, self.keys, settings.events_max_len)
        self._last_s = 0.0
        self._scan_cursor = 0
        self._count_warned_at: float | None = None  # monotonic s of the last count-limit warning

    def maybe_sweep(self, now_s: float | None = None) -> SweepResult | None:
        """Sweep if ``retention_sweep_s`` has passed since the last sweep (monotonic clock)."""
        t = time.monotonic()
        if t - self._last_s < self.settings.retention_sweep_s:
            return None
        self._last_s = t
        return self.sweep(now_s)

    def sweep(self, now_s: float | None = None) -> SweepResult:
        """One bounded retention pass (see the module doc). ``now_s``: unix seconds on the
        clock the finished index is scored on, the Redis server's (default: its ``TIME``)."""
        s, k = self.settings, self.keys
        if now_s is None:
            seconds, micros = self.r.time()
            now = seconds + micros / 1e6
        else:
            now = now_s
        out = SweepResult()
        fin, ret = finished_key(k), retained_key(k)
        ttl = max(1, int(s.retention_age_s))
        # 1. compact newly finished jobs (oldest first, at most retention_batch); each leaves
        # the finished index in its own script, so a failed round trip loses none
        popped = self.r.zrange(fin, 0, s.retention_batch - 1, withscores=True)
        if popped:
            p = self.r.pipeline(transaction=False)
            for jid, score in popped:
                self.jobs.compact_finished(jid, score, ttl, SUMMARY_FIELDS, client=p)
            res = p.execute()
            out.compacted = sum(1 for x in res if x == 1)
            if out.compacted:
                last = max(sc for (_, sc), x in zip(popped, res) if x == 1)
                prev = float(self.r.hget(tally_key(k), "last_finished_s") or 0.0)
                if last > prev:  # only the leading planner sweeps: no race on this field
                    self.r.hset(tally_key(k), "last_finished_s", repr(last))
        # 2. expire summaries by age, then by count (oldest first), bounded per call
        victims = self.r.zrangebyscore(ret, "-inf", now - s.retention_age_s, start=0, num=s.retention_batch)
        room = s.retention_batch - len(victims)
        if room > 0:
            over = int(self.r.zcard(ret)) - len(victims) - s.retention_jobs
            if over > 0:
                by_count = self.r.zrange(ret, len(victims), len(victims) + min(over, room) - 1, withscores=True)
                victims += [jid for jid, _ in by_count]
                young = [score for _, score in by_count if now - score < s.retention_age_s]
                if young:
                    self._warn_count_limit(len(young), now - max(young))
        if victims:
            p = self.r.pipeline(transaction=False)
            for jid in victims:
                self.jobs.expire_retained(jid, now, client=p)
            gone = [jid for jid, x in zip(victims, p.execute()) if x != -1]
            if gone:
                self.r.zrem(ret, *gone)
            out.expired = len(gone)
        # 2b. finished workloads: by age, then by count, oldest first, bounded per call
        out.workloads_expired = self._expire_workloads(now)
        # 3. cap the events stream
        out.events_trimmed = int(self.r.xtrim(k.events, maxlen=s.events_max_len, approximate=True))
        # 4. orphan phase/busy markers (their lease is gone), a bounded SCAN step
        out.orphans = self._orphans()
        out.pending = int(self.r.zcard(fin))
        return out

    def _warn_count_limit(self, deleted: int, youngest_age_s: float) -> None:
        """Log (at most once per :data:`COUNT_LIMIT_WARNING_S`) that the count limit deleted
        ``deleted`` finished-job summaries before the age limit would have: their results and
        idempotency keys are gone sooner than ``MAKESPAN_RETENTION_AGE_S`` says (a backlog of
        tens of thousands of jobs reaches ``MAKESPAN_RETENTION_JOBS`` in minutes; a
        large-queue check found keys reused and their work run again)."""
        now = time.monotonic()
        if self._count_warned_at is not None and now - self._count_warned_at < COUNT_LIMIT_WARNING_S:
            return
        self._count_warned_at = now
        s = self.settings
        log.warning("retention: MAKESPAN_RETENTION_JOBS=%d deleted %d finished-job summaries younger than "
                    "MAKESPAN_RETENTION_AGE_S=%g s (the youngest %.0f s old): their results and idempotency keys are "
                    "gone (a resubmit with such a key runs the work again); raise MAKESPAN_RETENTION_JOBS to keep "
                    "them for the age (said at most every %.0f s)", s.retention_jobs, deleted, s.retention_age_s,
                    max(0.0, youngest_age_s), COUNT_LIMIT_WARNING_S)

    def _expire_workloads(self, now: float) -> int:
        s, k = self.settings, self.keys
        done = k.workloads_done
        victims = self.r.zrangebyscore(done, "-inf", now - s.retention_age_s, start=0, num=s.retention_batch)
        room = s.retention_batch - len(victims)
        over = int(self.r.zcard(done)) - len(victims) - s.retention_jobs
        if room > 0 and over > 0:
            victims += self.r.zrange(done, len(victims), len(victims) + min(over, room) - 1)
        if not victims:
            return 0
        p = self.r.pipeline(transaction=False)
        p.delete(*[k.workload(w) for w in victims])
        p.zrem(k.workloads, *victims)
        p.zrem(done, *victims)
        p.execute()
        return len(victims)

    def _orphans(self) -> int:
        k = self.keys
        cur, found = self.r.scan(self._scan_cursor, match=k.phase_pattern, count=self.settings.retention_batch)
        self._scan_cursor = int(cur)
        stale = []
        for key in found:
            lid = key.rsplit(":", 1)[1]
            if not self.r.exists(k.lease(lid)):
                stale += [key, k.busy(lid)]
        if stale:
            self.r.delete(*stale)
        return len(stale) // 2


def state_size(r: redis.Redis, keys: Keys) -> dict[str, int]:
    """Sizes of the structures retention bounds (for tests and the scale benchmark):
    finished/retained index lengths, events stream length, leases, running."""
    p = r.pipeline(transaction=False)
    p.zcard(finished_key(keys))
    p.zcard(retained_key(keys))
    p.xlen(keys.events)
    p.zcard(keys.leases)
    p.zcard(keys.running)
    p.hgetall(tally_key(keys))
    f, ret, ev, le, run, tally = p.execute()
    return {"finished": f, "retained": ret, "events": ev, "leases": le, "running": run,
            **{st: int(tally.get(st, 0)) for st in FINAL_STATES}}


def summary(r: redis.Redis, keys: Keys, job_id: str) -> dict[str, str]:
    """A retained job's summary (empty once expired)."""
    return r.hgetall(keys.job(job_id))


__all__ = ["Retention", "SweepResult", "mark_finished", "finished_key", "retained_key", "state_size", "summary", "tally_key",
           "SUMMARY_FIELDS", "FINAL_STATES"]
