"""Workload execution: retries, failure, cancellation and completion of submitted workloads.

:func:`advance_workloads` is the planner's pass over ``P:workloads:active`` (retry a
failed step within the budget, fail the workload and cancel its dependants beyond it,
close a workload whose steps are all final); :func:`cancel_workload` (and :func:`cancel_workload_outcome`,
which also says whether it had ended already) cancels one on request; :func:`retry_pending` tells the planner whether a failed step's dependants must
wait. The retry and the cancellation are one Lua script each (:class:`makespan.store.JobStore`). The workload record
they read and write is described in :mod:`makespan.workloads`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import redis

from makespan import telemetry
from makespan.errors import NotFoundError
from makespan.keys import Keys
from makespan.models import FINAL_STATES
from makespan.store import JobState, JobStore

TERMINAL = FINAL_STATES


def _job_ids(r: redis.Redis, keys: Keys, workload_id: str) -> dict[str, str]:
    raw = r.hget(keys.workload(workload_id), "steps")
    if raw is None:
        raise NotFoundError(f"no workload {workload_id!r}")
    return json.loads(raw)


def cancel_workload(r: redis.Redis, keys: Keys, workload_id: str, reason: str = "workload cancelled") -> dict[str, int]:
    """Cancel a workload: queued (and delayed) steps at once, running steps at their next phase
    boundary (their GPUs are then released). Finished steps keep their results.

    Returns ``{"cancelled": n queued steps, "cancel_requested": n running steps}`` (zeros
    for a workload that had already completed or been cancelled:
    :func:`cancel_workload_outcome` tells that case apart).
    Raises NotFoundError: no such workload."""
    out = cancel_workload_outcome(r, keys, workload_id, reason)
    return {"cancelled": out["cancelled"], "cancel_requested": out["cancel_requested"]}


def _ended_at(state: str | None, finished_at: str | None, failed_at: str | None) -> float | None:
    """When a workload in ``state`` ended, unix s: a failed one's ``failed_at`` (its steps that
    did not depend on the failed one may have finished later), else its ``finished_at``."""
    if state not in TERMINAL:
        return None
    when = (failed_at if state == "failed" else None) or finished_at or failed_at
    return float(when) if when else None


def cancel_workload_outcome(r: redis.Redis, keys: Keys, workload_id: str,
                            reason: str = "workload cancelled") -> dict[str, Any]:
    """Cancel a workload as :func:`cancel_workload` does, and say what the workload was:
    ``{"cancelled": int, "cancel_requested": int, "already_ended": str | None,
    "ended_at": float | None}``: ``already_ended`` is the state the workload had ended in
    before this call (``completed``, ``failed`` or ``cancelled``; None: it was running and
    this call cancelled it), ``ended_at`` when (unix s: a failed one's ``failed_at``, when
    its first step failed for good, else its ``finished_at``; None when it was running). A completed or cancelled workload is
    left as it is (zeros); a failed one's independent steps that still go on are cancelled,
    and it stays failed.

    Raises NotFoundError: no such workload."""
    ids = _job_ids(r, keys, workload_id)
    prio, state, finished_at, failed_at = r.hmget(keys.workload(workload_id), "priority", "state", "finished_at",
                                                  "failed_at")
    prio = prio or "NORMAL"
    ended = {"already_ended": state if state in TERMINAL else None,
             # a failed workload whose independent steps went on has a later finished_at: it failed at failed_at
             "ended_at": _ended_at(state, finished_at, failed_at)}
    if state in ("completed", "cancelled"):
        return {"cancelled": 0, "cancel_requested": 0, **ended}
    # a failed workload's independent steps go on (docs/workloads.md): they are cancelled, and
    # the workload stays failed
    out = _cancel_steps(r, keys, workload_id, prio, list(ids.values()), reason, "" if state in TERMINAL else "cancelled")
    # a retry the planner made between the read above and the script swapped in a new step id;
    # once the workload is no longer running no retry is made (retry_step.lua), so one more
    # read finds every such step
    fresh = [job_id for job_id in _job_ids(r, keys, workload_id).values() if job_id not in set(ids.values())]
    if fresh:
        more = _cancel_steps(r, keys, workload_id, prio, fresh, reason, "")
        out = {k: out[k] + more[k] for k in out}
    return {**out, **ended}


def _cancel_steps(r, keys, wid, prio, job_ids, reason, final_state) -> dict[str, int]:
    cancelled, requested = JobStore(r, keys).cancel_steps(wid, keys.queue(prio), job_ids, reason, final_state,
                                                          time.time())
    telemetry.end_cancelled_job_spans(r, [(job_id, keys.job(job_id)) for job_id in cancelled])
    if final_state:
        from makespan import events

        events.record(r, keys.events, "workload_" + final_state, workload=wid, reason=reason)
    return {"cancelled": len(cancelled), "cancel_requested": requested}


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

    The state is read without a lock; the writes that end a workload are store scripts
    (:meth:`JobStore.fail_workload`, :meth:`JobStore.finish_workload`) that re-read it, so
    a cancel that lands between the read and the write is not overwritten with ``failed``.

    Returns counts ``{"retried", "failed", "finished"}``.
    Raises StoreError: Redis failed."""
    store = JobStore(r, keys)
    out = {"retried": 0, "failed": 0, "finished": 0}
    for wid in store.active_workloads():
        rec = store.workload_fields(wid, ("state", "retry_budget", "steps", "deps", "priority"))
        if rec[2] is None:
            store.drop_active_workload(wid)
            continue
        wstate, budget, ids, deps, prio = rec[0], int(rec[1] or 0), json.loads(rec[2]), json.loads(rec[3]), rec[4]
        jrows, wrec = store.workload_steps(wid, list(ids.values()))
        rows = {step: [st, int(wrec.get(f"retries:{step}") or 0), reason]
                for step, (st, reason) in zip(ids, jrows)}
        dead: set[str] = set()
        for step, (st, retries, reason) in rows.items():
            if st == "failed" and wstate == "running" and retries < budget:
                new_id = _retry(r, keys, wid, wrec, step, ids, deps, prio, retries, reason)
                if new_id is not None:
                    out["retried"] += 1
                    rows[step] = ["queued", retries + 1, ""]
                    # a later retry of this pass writes its new attempt's deps and the failure's
                    # victims from ids: with this step's new attempt, not the failed one
                    ids = {**ids, step: new_id}
            elif st in ("failed", "cancelled"):
                dead.add(step)
        if dead and wstate == "running":
            victims = _dependants(deps, dead)
            first = sorted(dead)[0]
            reason = f"step {first} {rows[first][0]} after {rows[first][1]} retries: {rows[first][2]}"
            _cancel_steps(r, keys, wid, prio, [ids[s] for s in sorted(victims)], f"dependency {first} did not complete",
                          "")
            now = time.time()
            event = json.dumps({"ts": now, "kind": "workload_failed", "workload": wid, "step": first, "reason": reason},
                               separators=(",", ":"))
            # only a workload still running fails: a cancel may have ended it since the read
            out["failed"] += int(store.fail_workload(wid, reason, now, event))
            continue
        if all(row[0] in TERMINAL for row in rows.values()):
            # the state as it is then, not as read above (a cancel may have set it since)
            store.finish_workload(wid, all(row[0] == "completed" for row in rows.values()), time.time())
            out["finished"] += 1
    return out


def _retry(r, keys, wid, wrec, step, ids, deps, prio, retries, reason) -> str | None:
    """Retry the failed ``step`` as a new job; its id, or None when the script refused."""
    new_id = uuid.uuid4().hex
    now = time.time()
    fields = {**json.loads(wrec[f"tmpl:{step}"]), "id": new_id, "state": JobState.QUEUED.value, "submitted_at": repr(now),
              "retries": retries + 1}
    if fields.get("traceparent"):  # the retry's own makespan span, in the workload's trace
        fields["traceparent"] = telemetry.sibling_traceparent(fields["traceparent"])
    new_ids = {**ids, step: new_id}
    if deps.get(step):
        fields["deps"] = json.dumps([new_ids[d] for d in deps[step]])
    ev = json.dumps({"ts": now, "kind": "retried", "job": new_id, "previous": ids[step], "workload": wid,
                     "step": step, "retry": retries + 1, "reason": reason})
    # the script moves every job waiting on the failed attempt (queued or delayed) to new_id
    done = JobStore(r, keys).retry_step(wid, step, ids[step], new_id, fields, ev,
                                        keys.for_pool(fields.get("pool")).queue(prio))
    return new_id if done else None
