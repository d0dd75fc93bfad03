"""Workload execution: retries, failure, cancellation and completion of submitted workloads.

:func:`advance_workloads` is the planner's pass over ``P:workloads:active`` (retry a
failed step within the budget, fail the workload and cancel its dependants beyond it,
close a workload whose steps are all final); :func:`cancel_workload` cancels one on
request; :func:`retry_pending` tells the planner whether a failed step's dependants must
wait. The retry and the cancellation are one Lua script each (below). The workload record
they read and write is described in :mod:`makespan.workloads`.
"""

from __future__ import annotations

import json
import time
import uuid

import redis

from makespan.awaited import ADD_LUA, DROP_LUA
from makespan.errors import NotFoundError
from makespan.keys import Keys
from makespan.models import FINAL_STATES

# A failed step is retried as a new job (the failed attempt's record stays as it is,
# for its history and for retention): the workload's step map and every queued
# dependant's deps are pointed at the new id in the same script.
# KEYS: workload, new job, queue, events, seq, finished, then dependant job keys
# ARGV: step, old id, new id, fields JSON, event JSON, key prefix, then per dependant its deps JSON
# The reverse-dependency index (makespan.awaited) follows: the new job joins it for its deps, a
# queued dependant moves from the old id's set to the new id's.
_RETRY = ADD_LUA + DROP_LUA + """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
local steps = cjson.decode(redis.call('HGET', KEYS[1], 'steps'))
if steps[ARGV[1]] ~= ARGV[2] then return 0 end
steps[ARGV[1]] = ARGV[3]
local hist = cjson.decode(redis.call('HGET', KEYS[1], 'history'))
table.insert(hist[ARGV[1]], ARGV[3])
redis.call('HSET', KEYS[1], 'steps', cjson.encode(steps), 'history', cjson.encode(hist), 'job:' .. ARGV[3], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'retries:' .. ARGV[1], 1)
local seq = redis.call('INCR', KEYS[5])
local fields = cjson.decode(ARGV[4])
local f = {}
for k, v in pairs(fields) do table.insert(f, k); table.insert(f, tostring(v)) end
table.insert(f, 'seq'); table.insert(f, tostring(seq))
redis.call('HSET', KEYS[2], unpack(f))
awaited_add(ARGV[6], ARGV[3], fields['deps'])
redis.call('ZADD', KEYS[3], seq, ARGV[3])
for i = 7, #KEYS do
  if redis.call('HGET', KEYS[i], 'state') == 'queued' then
    local waiter = redis.call('HGET', KEYS[i], 'id')
    awaited_drop(ARGV[6], waiter, redis.call('HGET', KEYS[i], 'deps'))
    redis.call('HSET', KEYS[i], 'deps', ARGV[i])
    awaited_add(ARGV[6], waiter, ARGV[i])
  end
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000000', '*', 'e', ARGV[5])
return 1
"""

# KEYS: workload, active, events, queue, finished index, delayed, then job keys
# ARGV: now, reason, final state, key prefix, then job ids
# Queued steps (and delayed ones: waiting out a retry backoff) are cancelled at once;
# leased/running ones are asked to stop at their next phase boundary (the GPU worker
# then releases their lease). A cancelled step leaves the reverse-dependency index (makespan.awaited).
_CANCEL_WORKLOAD = DROP_LUA + """
local n = #KEYS - 6
local out = {0, 0}
for i = 1, n do
  local st = redis.call('HGET', KEYS[6 + i], 'state')
  if st == 'queued' or st == 'delayed' then
    redis.call('ZREM', KEYS[4], ARGV[4 + i])
    redis.call('ZREM', KEYS[6], ARGV[4 + i])
    awaited_drop(ARGV[4], ARGV[4 + i], redis.call('HGET', KEYS[6 + i], 'deps'))
    redis.call('HSET', KEYS[6 + i], 'state', 'cancelled', 'finished_at', ARGV[1], 'reason', ARGV[2])
    redis.call('ZADD', KEYS[5], ARGV[1], ARGV[4 + i])
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', '1000000', '*', 'e',
               cjson.encode({ts = tonumber(ARGV[1]), kind = 'cancelled', job = ARGV[4 + i], reason = ARGV[2]}))
    out[1] = out[1] + 1
  elseif st == 'leased' or st == 'running' then
    redis.call('HSET', KEYS[6 + i], 'cancel_requested', '1')
    out[2] = out[2] + 1
  end
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'state', ARGV[3], 'reason', ARGV[2], 'finished_at', ARGV[1])
end
return out
"""

TERMINAL = FINAL_STATES


def _job_ids(r: redis.Redis, keys: Keys, workload_id: str) -> dict[str, str]:
    raw = r.hget(keys.workload(workload_id), "steps")
    if raw is None:
        raise NotFoundError(f"no workload {workload_id!r}")
    return json.loads(raw)


def cancel_workload(r: redis.Redis, keys: Keys, workload_id: str, reason: str = "workload cancelled") -> dict[str, int]:
    """Cancel a workload: queued (and delayed) steps at once, running steps at their next phase
    boundary (their GPUs are then released). Finished steps keep their results.

    Returns ``{"cancelled": n queued steps, "cancel_requested": n running steps}``.
    Raises NotFoundError: no such workload."""
    ids = _job_ids(r, keys, workload_id)
    prio = r.hget(keys.workload(workload_id), "priority") or "NORMAL"
    if r.hget(keys.workload(workload_id), "state") in TERMINAL:
        return {"cancelled": 0, "cancel_requested": 0}
    return _cancel_steps(r, keys, workload_id, prio, list(ids.values()), reason, "cancelled")


def _cancel_steps(r, keys, wid, prio, job_ids, reason, final_state) -> dict[str, int]:
    script = r.register_script(_CANCEL_WORKLOAD)
    k = [keys.workload(wid), keys.workloads_active, keys.events, keys.queue(prio), f"{keys.prefix}:finished",
         keys.delayed, *[keys.job(j) for j in job_ids]]
    a, b = script(keys=k, args=[repr(time.time()), reason, final_state, keys.prefix, *job_ids])
    if final_state:
        from makespan import events

        events.record(r, keys.events, "workload_" + final_state, workload=wid, reason=reason)
    return {"cancelled": int(a), "cancel_requested": int(b)}


def retry_pending(r: redis.Redis, keys: Keys, job_id: str) -> bool:
    """True if ``job_id`` is a failed workload step that was or will be retried (its
    workload is running and the step's retries are within the budget), so its
    dependants must wait rather than be cancelled."""
    wid = r.hget(keys.job(job_id), "workload_id")
    if not wid:
        return False
    wstate, budget, steps, step = r.hmget(keys.workload(wid), "state", "retry_budget", "steps", f"job:{job_id}")
    if wstate != "running" or not step or not steps:
        return False
    if json.loads(steps).get(step) != job_id:
        return True  # already retried under a new job id
    return int(r.hget(keys.workload(wid), f"retries:{step}") or 0) < int(budget or 0)


def _dependants(deps: dict[str, list[str]], roots: set[str]) -> set[str]:
    out, frontier = set(), set(roots)
    while frontier:
        nxt = {s for s, ds in deps.items() if s not in out and frontier.intersection(ds)}
        out |= nxt
        frontier = nxt
    return out


def advance_workloads(r: redis.Redis, keys: Keys) -> dict[str, int]:
    """One planner pass over the active workloads (called from ``form_batch``):

    * a failed step with retries left (``retries < retry_budget``) is queued again;
    * a step failed beyond the budget (or cancelled) fails the workload and cancels
      every step that depends on it, transitively; independent steps go on;
    * a workload whose steps are all final is closed: ``completed`` when all completed.

    The state is read without a lock; the writes that end a workload are transactions
    (WATCH on its record) that re-read it, so a cancel that lands between the read and
    the write is not overwritten with ``failed``.

    Returns counts ``{"retried", "failed", "finished"}``."""
    from makespan import events

    out = {"retried": 0, "failed": 0, "finished": 0}
    for wid in r.smembers(keys.workloads_active):
        rec = r.hmget(keys.workload(wid), "state", "retry_budget", "steps", "deps", "priority")
        if rec[2] is None:
            r.srem(keys.workloads_active, wid)
            continue
        wstate, budget, ids, deps, prio = rec[0], int(rec[1] or 0), json.loads(rec[2]), json.loads(rec[3]), rec[4]
        p = r.pipeline(transaction=False)
        for jid in ids.values():
            p.hmget(keys.job(jid), "state", "reason")
        p.hgetall(keys.workload(wid))
        *jrows, wrec = p.execute()
        rows = {step: [st, int(wrec.get(f"retries:{step}") or 0), reason]
                for step, (st, reason) in zip(ids, jrows)}
        dead: set[str] = set()
        for step, (st, retries, reason) in rows.items():
            if st == "failed" and wstate == "running" and retries < budget:
                if _retry(r, keys, wid, wrec, step, ids, deps, prio, retries, reason):
                    out["retried"] += 1
                    rows[step] = ["queued", retries + 1, ""]
            elif st in ("failed", "cancelled"):
                dead.add(step)
        if dead and wstate == "running":
            victims = _dependants(deps, dead)
            first = sorted(dead)[0]
            reason = f"step {first} {rows[first][0]} after {rows[first][1]} retries: {rows[first][2]}"
            _cancel_steps(r, keys, wid, prio, [ids[s] for s in sorted(victims)], f"dependency {first} did not complete",
                          "")

            def fail(pp) -> bool:  # only a workload still running fails: a cancel may have ended it since the read
                if pp.hget(keys.workload(wid), "state") != "running":
                    return False
                pp.multi()
                pp.hset(keys.workload(wid), mapping={"state": "failed", "reason": reason,
                                                     "failed_at": repr(time.time())})
                events.record(r, keys.events, "workload_failed", pipe=pp, workload=wid, step=first, reason=reason)
                return True

            out["failed"] += int(r.transaction(fail, keys.workload(wid), value_from_callable=True))
            continue
        if all(row[0] in TERMINAL for row in rows.values()):
            ok = all(row[0] == "completed" for row in rows.values())

            def finish(pp) -> None:  # the state as it is now, not as read above (a cancel may have set it since)
                cur = pp.hget(keys.workload(wid), "state")
                final = cur if cur in ("failed", "cancelled") else ("completed" if ok else "failed")
                now = time.time()
                pp.multi()
                pp.hset(keys.workload(wid), mapping={"state": final, "finished_at": repr(now)})
                pp.srem(keys.workloads_active, wid)
                pp.zadd(keys.workloads_done, {wid: now})  # retention deletes it after retention_age_s
                if cur == "running":
                    events.record(r, keys.events, "workload_" + final, pipe=pp, workload=wid)

            r.transaction(finish, keys.workload(wid))
            out["finished"] += 1
    return out


def _retry(r, keys, wid, wrec, step, ids, deps, prio, retries, reason) -> bool:
    new_id = uuid.uuid4().hex
    now = time.time()
    fields = {**json.loads(wrec[f"tmpl:{step}"]), "id": new_id, "state": "queued", "submitted_at": repr(now),
              "retries": retries + 1}
    new_ids = {**ids, step: new_id}
    if deps.get(step):
        fields["deps"] = json.dumps([new_ids[d] for d in deps[step]])
    dependants = [s for s, ds in deps.items() if step in ds]
    ev = json.dumps({"ts": now, "kind": "retried", "job": new_id, "previous": ids[step], "workload": wid,
                     "step": step, "retry": retries + 1, "reason": reason})
    k = [keys.workload(wid), keys.job(new_id), keys.queue(prio), keys.events, keys.seq, f"{keys.prefix}:finished",
         *[keys.job(ids[d]) for d in dependants]]
    a = [step, ids[step], new_id, json.dumps(fields), ev, keys.prefix,
         *[json.dumps([new_ids[x] for x in deps[d]]) for d in dependants]]
    return bool(r.register_script(_RETRY)(keys=k, args=a))
