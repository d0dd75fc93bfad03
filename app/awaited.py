"""The reverse-dependency index: which jobs a waiting step waits on, at any queue depth.

``P:awaited:{job_id}`` (set) holds the ids of the jobs that wait on ``job_id``: every
job that names ``job_id`` in its ``deps`` and has not ended (a workload step, or a job
submitted with ``depends_on``). A leased or running one stays: a preemption, a reclaim or
a function retry puts it back in its queue, where its dependencies' records are read again,
and each run of a function reads their results (:func:`makespan.results.resolve_references`),
so retention keeps them (``awaited_live``). The planner's preemption
deciders read it for the jobs holding a lease (:func:`queue_awaited_running`, one
script on the tick's pipeline) and never cut one that a waiting step waits on, however
far back in its queue that step sits (workers/preemption.py).

Maintenance is atomic with the change of the waiting step, inside the same Lua script
(``awaited_add`` / ``awaited_drop`` of the store's ``makespan/store/lua/lib.lua``):

* added (``awaited_add``) where a step with deps is written: ``makespan.producer`` submit,
  ``makespan.workloads`` submit and ``makespan.workload_execution`` retry (a retry also moves the
  jobs waiting on the failed attempt, queued or delayed, from its id to the new one, as it
  rewrites their ``deps``);
* removed (``awaited_drop``) when it ends: ``finish_job`` of the store's library
  (completed, failed, cancelled on any path), and where a queued step is cancelled
  (``makespan.producer`` cancel, workload cancel, a dependant cancelled by the planner or
  by a workload's failure).

A member whose job has ended is a leak: :func:`leaked` counts them (the planner's drain
check, ``drain_counts``). Keys live under the key prefix;
the library builds them from the prefix passed in (:attr:`makespan.keys.Keys.script_prefix`).
"""

from __future__ import annotations

import redis

from makespan.keys import Keys
from makespan.store import JobState, JobStore

# the states of a job that has not ended: its entries in the index are live
WAITING = frozenset({JobState.QUEUED.value, JobState.DELAYED.value, JobState.LEASED.value, JobState.RUNNING.value})


def queue_awaited_running(p: redis.client.Pipeline, keys: Keys) -> None:
    """Queue on ``p`` the read of the leased job ids (``P:running``, at most one per GPU)
    that some job waits on; ``p.execute()`` answers a list of ids.
    Sent as EVAL: no SCRIPT EXISTS round trip, no NOSCRIPT after a Redis restart."""
    JobStore(p, keys).queue_awaited_running(p)


def waiters(r: redis.Redis, keys: Keys, job_id: str) -> set[str]:
    """Ids of the jobs that wait on ``job_id`` and have not ended."""
    return set(r.smembers(keys.awaited(job_id)))


def leaked(r: redis.Redis, keys: Keys) -> dict[str, list[str]]:
    """Index entries whose waiting job has ended (should be none):
    ``{awaited job id: [waiting job ids]}``. A SCAN over ``P:awaited:*``: for checks
    (drain, tests), not for a tick."""
    out: dict[str, list[str]] = {}
    for k in r.scan_iter(keys.awaited_pattern, count=1000):
        members = sorted(r.smembers(k))
        p = r.pipeline(transaction=False)
        for m in members:
            p.hget(keys.job(m), "state")
        bad = [m for m, st in zip(members, p.execute()) if st not in WAITING]
        if bad:
            out[k.rsplit(":", 1)[1]] = bad
    return out
