"""The reverse-dependency index (app/awaited.py): a job that a waiting step waits on is
never a preemption victim, however deep in its queue the step sits; and the index holds
no entry once its step has started or been cancelled (real Redis, dispatch stubbed)."""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest

from makespan.awaited import leaked, waiters
from makespan.models import Priority
from makespan.run_report import drain_counts
from makespan.workloads import advance_workloads, cancel_workload, submit_workload
from tests.faults.test_preemption_cases import FLEET, _preempted, _running, _setup
from makespan.workers.batch import SCAN_FACTOR
from makespan.workers.leases import LeaseStore

GPUS = [f"GPU-host-{h}-{i}" for h in ("a", "b") for i in range(4)]


def _workload(r, keys, settings, steps, priority="LOW", retry_budget=0) -> tuple[str, dict[str, str]]:
    """Submit a workload of ``steps`` ({name: [deps]}, chat, 10 s each): (id, {step: job id})."""
    spec = {"name": "wl", "priority": priority, "retry_budget": retry_budget,
            "steps": [{"name": n, "endpoint": "chat", "service_s": 10, "depends_on": d} for n, d in steps.items()]}
    wid = submit_workload(r, keys, FLEET, spec, settings)
    return wid, json.loads(r.hget(keys.workload(wid), "steps"))


def _index_keys(r, keys) -> list[str]:
    return list(r.scan_iter(keys.awaited_pattern))


@pytest.mark.parametrize("mode", ["plan", "rule"])
def test_a_step_deeper_than_the_scan_protects_its_running_dependency(r, keys, settings, mode):
    """Every GPU runs a LOW job. The LOW queue holds 6 steps waiting on 6 of them, then
    SCAN_FACTOR × batch_size plain jobs, then workload step ``b`` waiting on running step
    ``a``: past anything ``form_batch`` reads. Two CRITICAL jobs arrive: only the one LOW
    job nothing waits on may be cut, never ``a``. (Fails before the index: ``a`` was cut.)"""
    s = dataclasses.replace(settings, preemption=mode, batch_size=2)
    w, prod, sent = _setup(r, keys, s)
    lows = [_running(r, keys, w, prod, "chat", "LOW", [g]) for g in GPUS[1:]]
    r.zrem(keys.queue(Priority.LOW), *lows)  # leased: out of the queue, as a dispatch leaves them
    free = lows[-1]
    for j in lows[:-1]:
        prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW", "depends_on": [j]})
    for _ in range(SCAN_FACTOR * s.batch_size):
        prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW"})
    _wid, ids = _workload(r, keys, s, {"a": [], "b": ["a"]})
    lease = LeaseStore(r, keys).acquire(uuid.uuid4().hex, (GPUS[0],), 60.0, job_id=ids["a"], kind="job",
                                        holder=FLEET.host_of(GPUS[0]), queue=keys.queue(Priority.LOW),
                                        info={"planned_end_s": repr(w.now_s() + 1e6), "endpoint": "chat",
                                              "priority": "LOW"})
    assert lease is not None
    assert r.zrank(keys.queue(Priority.LOW), ids["b"]) >= SCAN_FACTOR * s.batch_size
    assert waiters(r, keys, ids["a"]) == {ids["b"]}
    crit = [prod.submit({"endpoint": "chat", "service_s": 10, "priority": "CRITICAL"}).id for _ in range(2)]
    w.tick()
    cut = {e["job"] for e in _preempted(r, keys)}
    assert cut == {free}  # preemption still happens where nothing waits on the victim
    assert r.hget(keys.job(ids["a"]), "state") == "leased"
    assert r.hget(keys.job(ids["b"]), "state") == "queued"
    assert {c.job_id for c in sent} <= set(crit)


@pytest.mark.parametrize("mode", ["plan", "rule"])
def test_a_delayed_job_protects_its_running_dependency(r, keys, settings, mode):
    """Every GPU runs a LOW job; seven of them are awaited by jobs still delayed (in no
    queue at all): a CRITICAL job may cut only the other one. (The free one sits in the
    middle: before the index, the rule cut the first and the scored decision the last.)"""
    w, prod, _sent = _setup(r, keys, dataclasses.replace(settings, preemption=mode))
    lows = [_running(r, keys, w, prod, "chat", "LOW", [g]) for g in GPUS]
    r.zrem(keys.queue(Priority.LOW), *lows)
    free = lows[3]
    for j in lows:
        if j != free:
            prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW", "depends_on": [j], "delay_s": 600})
    prod.submit({"endpoint": "chat", "service_s": 10, "priority": "CRITICAL"})
    w.tick()
    assert {e["job"] for e in _preempted(r, keys)} == {free}


def test_entries_stay_while_the_step_runs_and_go_when_it_ends(r, keys, settings):
    """b waits on a and x (one entry in each set). Once both completed and the planner
    leased b, the entries stay (not a leak): a preemption, a reclaim or a retry puts b back,
    and its dependencies must still be there for it (found by a review: a dependency that
    retention deleted while b ran got b cancelled when it was preempted). They go when b
    ends."""
    from makespan.workers.leases import finish_job_op

    w, _prod, sent = _setup(r, keys, settings)
    _wid, ids = _workload(r, keys, settings, {"a": [], "x": [], "b": ["a", "x"]})
    assert waiters(r, keys, ids["a"]) == {ids["b"]} == waiters(r, keys, ids["x"])
    for d in (ids["a"], ids["x"]):
        r.zrem(keys.queue(Priority.LOW), d)
        r.hset(keys.job(d), mapping={"state": "completed", "finished_at": "1"})
    w.tick()
    (leased,) = [c for c in sent if c.kind == "job"]
    assert leased.job_id == ids["b"]
    assert waiters(r, keys, ids["a"]) == {ids["b"]} == waiters(r, keys, ids["x"]) and leaked(r, keys) == {}
    assert LeaseStore(r, keys).fenced(leased.lease, [finish_job_op(keys, ids["b"], "completed", 2.0, "")])
    assert _index_keys(r, keys) == [] and leaked(r, keys) == {}


def test_entries_go_when_a_step_or_a_delayed_job_is_cancelled(r, keys, settings):
    w, prod, _sent = _setup(r, keys, settings)
    dep = _running(r, keys, w, prod, "chat", "LOW", [GPUS[0]])
    queued = prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW", "depends_on": [dep]}).id
    delayed = prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW", "depends_on": [dep],
                           "delay_s": 600}).id
    assert waiters(r, keys, dep) == {queued, delayed}
    assert prod.cancel(queued) == "cancelled"
    assert waiters(r, keys, dep) == {delayed}
    assert prod.cancel(delayed) == "cancelled"
    assert _index_keys(r, keys) == []


def test_entries_go_when_the_workload_is_cancelled(r, keys, settings):
    _wid, ids = _workload(r, keys, settings, {"a": [], "b": ["a"], "c": ["b"]})
    assert waiters(r, keys, ids["a"]) == {ids["b"]} and waiters(r, keys, ids["b"]) == {ids["c"]}
    assert cancel_workload(r, keys, _wid)["cancelled"] == 3
    assert _index_keys(r, keys) == []


def test_a_retry_moves_the_entries_and_a_failed_workload_leaves_none(r, keys, settings):
    """a fails with one retry left: b now waits on the retry's id (and no longer on the
    failed attempt's); the retry fails too: the workload fails, b is cancelled, no entry
    is left."""
    wid, ids = _workload(r, keys, settings, {"a": [], "b": ["a"]}, retry_budget=1)
    r.zrem(keys.queue(Priority.LOW), ids["a"])
    r.hset(keys.job(ids["a"]), "state", "failed")
    assert advance_workloads(r, keys)["retried"] == 1
    retry = json.loads(r.hget(keys.workload(wid), "steps"))["a"]
    assert retry != ids["a"] and waiters(r, keys, retry) == {ids["b"]} and waiters(r, keys, ids["a"]) == set()
    r.zrem(keys.queue(Priority.LOW), retry)
    r.hset(keys.job(retry), "state", "failed")
    assert advance_workloads(r, keys)["failed"] == 1
    assert r.hget(keys.job(ids["b"]), "state") == "cancelled"
    assert _index_keys(r, keys) == []


def test_a_dependant_the_planner_cancels_leaves_no_entry_and_a_leak_is_counted(r, keys, settings):
    """A plain job whose dependency failed is cancelled by the planner (its entry goes);
    an entry planted for a job that no longer waits is counted by both drain checks."""
    w, prod, _sent = _setup(r, keys, settings)
    w.token = str(r.incr(keys.planner_fence))  # the planner's cancel is fenced: lead
    dep = prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW"}).id
    r.zrem(keys.queue(Priority.LOW), dep)
    r.hset(keys.job(dep), "state", "failed")
    child = prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW", "depends_on": [dep]}).id
    assert waiters(r, keys, dep) == {child}
    w.tick()
    assert r.hget(keys.job(child), "state") == "cancelled"
    assert _index_keys(r, keys) == []
    r.sadd(keys.awaited(dep), child)  # a leak: child is cancelled, not waiting
    assert leaked(r, keys) == {dep: [child]}
    assert w.check_drain()["awaited_entries"] == 1
    assert drain_counts(r, keys, FLEET)["awaited_entries"] == 1


def test_a_retry_moves_a_delayed_dependant_and_it_runs_after_the_retried_step(r, keys, settings):
    """Step a of a workload fails with a retry left while two jobs submitted with
    ``depends_on`` a wait on it: one queued, one delayed (``delay_s``). The retry moves
    both (their deps and their index entries) to the retried attempt's id, and once that
    attempt completed the delayed one runs when due. (Found by a review: only queued
    dependants followed; the delayed one kept waiting on the failed attempt, and the
    planner never started it.)"""
    from makespan.workers.delayed import DelayedJobs

    w, prod, sent = _setup(r, keys, settings)
    wid, ids = _workload(r, keys, settings, {"a": [], "b": ["a"]}, retry_budget=1)
    queued = prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW", "depends_on": [ids["a"]]}).id
    delayed = prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW", "depends_on": [ids["a"]],
                           "delay_s": 600}).id
    assert r.hget(keys.job(delayed), "state") == "delayed"
    assert waiters(r, keys, ids["a"]) == {ids["b"], queued, delayed}
    r.zrem(keys.queue(Priority.LOW), ids["a"])
    r.hset(keys.job(ids["a"]), "state", "failed")
    assert advance_workloads(r, keys)["retried"] == 1
    retry = json.loads(r.hget(keys.workload(wid), "steps"))["a"]
    assert retry != ids["a"]
    for job_id in (ids["b"], queued, delayed):
        assert json.loads(r.hget(keys.job(job_id), "deps")) == [retry], job_id
    assert waiters(r, keys, retry) == {ids["b"], queued, delayed} and waiters(r, keys, ids["a"]) == set()
    # the retried attempt completes; the delayed dependant comes due and runs after it
    r.zrem(keys.queue(Priority.LOW), retry)
    r.hset(keys.job(retry), mapping={"state": "completed", "finished_at": "1"})
    assert DelayedJobs(r, keys).promote(ahead_s=700.0) == 1
    w.tick()
    assert {c.job_id for c in sent if c.kind == "job"} == {ids["b"], queued, delayed}
    assert r.hget(keys.job(delayed), "state") == "leased"
    assert leaked(r, keys) == {}
