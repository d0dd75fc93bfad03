"""Batch formation for the planner worker: which queued jobs a tick plans.

:meth:`BatchMixin.form_batch` takes up to ``batch_size`` queued jobs as
:class:`makespan.planner.model.PlanJob` (release and deadline in workload seconds), CRITICAL
first (strict priority), FIFO (``seq``) within a level. It reads each queue
(``P:queue:{level}``) in chunks of ``batch_size``, at most ``SCAN_FACTOR`` chunks per
level per tick, past steps whose dependencies are not done (their dependencies join
``awaited``: never preemption victims). When workloads are active and the queue heads
were not read with the tick's snapshot, it first runs one workload pass
(:func:`makespan.workloads.advance_workloads`). On the way it drops queue entries whose job
is no longer queued (``_DROP_STALE``) and cancels queued jobs whose dependency failed,
was cancelled or is gone, unless a failed workload step will be retried
(``_CANCEL_DEPENDANT``); both scripts are fenced by the planner token, so a deposed
planner changes nothing. It also notes each taken job's traceparent and
submission time (unix s) in ``_meta``.

Mixed into :class:`makespan.workers.planner_worker.PlannerWorker`; uses its Redis client, keys,
settings and fencing token.
"""

from __future__ import annotations

import json
import time

from makespan.awaited import DROP_LUA
from makespan.models import Priority
from makespan.planner.model import PlanJob

SCAN_FACTOR = 4  # queue entries read per level per tick: at most SCAN_FACTOR × batch_size

# Remove a stale queue entry. KEYS: queue, job, planner_fence ; ARGV: job id, planner token
_DROP_STALE = """
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
if redis.call('HGET', KEYS[2], 'state') == 'queued' then return 0 end
return redis.call('ZREM', KEYS[1], ARGV[1])
"""

# Cancel a queued job whose dependency failed (it leaves the reverse-dependency index,
# makespan.awaited). KEYS: queue, job, planner_fence, events, finished ; ARGV: job id, planner
# token, now (s), reason, event JSON, key prefix
_CANCEL_DEPENDANT = DROP_LUA + """
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
if redis.call('HGET', KEYS[2], 'state') ~= 'queued' then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
awaited_drop(ARGV[6], ARGV[1], redis.call('HGET', KEYS[2], 'deps'))
redis.call('HSET', KEYS[2], 'state', 'cancelled', 'finished_at', ARGV[3], 'reason', ARGV[4])
redis.call('ZADD', KEYS[5], tonumber(ARGV[3]), ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000000', '*', 'e', ARGV[5])
return 1
"""


class BatchMixin:
    _removed = 0  # queue entries removed (stale, cancelled) while form_batch read the current chunk

    def form_batch(self, heads: dict[Priority, list[str]] | None = None) -> list[PlanJob]:
        """Up to ``batch_size`` queued jobs, CRITICAL first (strict priority), FIFO within a
        level. ``heads``: the first ``batch_size`` ids of each queue, already read (they
        are read again here when a workload pass may have changed the queues)."""
        out: list[PlanJob] = []
        self._meta: dict[str, tuple[str, float]] = {}
        self.awaited: set[str] = set()  # deps of the unready steps read here (never victims; plus the index)
        room = self.settings.batch_size
        if heads is None and self.r.scard(self.keys.workloads_active):
            from makespan.workloads import advance_workloads  # workload steps: retries, failure, completion

            advance_workloads(self.r, self.keys)
        for lvl in Priority:
            offset = 0
            # read on past steps whose dependencies are not done, so that they never hide
            # startable jobs behind them (bounded: SCAN_FACTOR batches per level per tick);
            # what a step waits on is known at any depth from the index (makespan.awaited)
            while room > 0 and offset < SCAN_FACTOR * self.settings.batch_size:
                if offset == 0 and heads is not None:
                    ids = heads[lvl]
                else:
                    ids = self.r.zrange(self.keys.queue(lvl), offset, offset + self.settings.batch_size - 1)
                if not ids:
                    break
                self._removed = 0
                room = self._take(lvl, ids, out, room)
                offset += len(ids) - self._removed  # entries removed meanwhile: the rest moved up
        return out

    def _take(self, lvl: Priority, ids: list[str], out: list[PlanJob], room: int) -> int:
        p = self.r.pipeline(transaction=False)
        for jid in ids:
            p.hmget(self.keys.job(jid), "endpoint", "service_s", "submitted_at", "seq", "deps", "state",
                    "traceparent", "deadline_s")
        for jid, (ep, svc, sub, seq, deps, state, tp, due) in zip(ids, p.execute()):
            if ep is None or state != "queued":
                self._drop_stale(self.keys.queue(lvl), jid)  # cancelled or lost record
                continue
            dl = tuple(json.loads(deps)) if deps else ()
            if room <= 0:  # not in the batch (what it waits on is in the index)
                continue
            if dl and not self._deps_ready(jid, dl):
                self.awaited.update(dl)
                continue
            r_s = float(sub) / self.settings.time_scale  # workload clock; service and deadline are workload s
            out.append(PlanJob(jid, ep, float(lvl.weight), r_s, float(svc),
                               int(lvl), (), r_s + float(due) if due else None, int(seq)))
            self._meta[jid] = (tp or "", float(sub))
            room -= 1
        return room

    def _drop_stale(self, queue: str, jid: str) -> None:
        """Remove a queue entry whose job is no longer queued — only while this planner
        still leads and the job is still not queued (a reaper may have requeued it since)."""
        self._removed += int(self.r.eval(_DROP_STALE, 3, queue, self.keys.job(jid), self.keys.planner_fence, jid,
                                         self.token) or 0)

    def _deps_ready(self, jid: str, deps: tuple[str, ...]) -> bool:
        states = [self.r.hget(self.keys.job(d), "state") for d in deps]
        if all(s == "completed" for s in states):
            return True
        bad = [d for d, s in zip(deps, states) if s in ("failed", "cancelled") or s is None]
        if bad and "failed" in states:
            from makespan.workloads import retry_pending  # a workload step that will be retried: wait

            bad = [d for d in bad if not retry_pending(self.r, self.keys, d)]
        if bad:
            prio = self.r.hget(self.keys.job(jid), "priority") or "NORMAL"
            reason = f"dependency {bad[0]} did not complete"
            ev = json.dumps({"ts": time.time(), "kind": "cancelled", "job": jid, "priority": prio, "reason": reason})
            self._removed += int(self.r.eval(
                _CANCEL_DEPENDANT, 5, self.keys.queue(prio), self.keys.job(jid), self.keys.planner_fence,
                self.keys.events, f"{self.keys.prefix}:finished", jid, self.token, repr(time.time()), reason, ev,
                self.keys.prefix) or 0)
        return False
