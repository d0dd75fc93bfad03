"""Regression tests for review findings: preemption never reruns an executed job,
honours cancels and fencing; batches read past blocked steps; stale-entry cleanup is fenced."""

import dataclasses

import pytest

from makespan.errors import LeaseError
from makespan.models import Priority, load_fleet
from makespan.producer import Producer
from makespan.workers.batch import drop_stale
from makespan.workers.leases import LeaseStore, preempt
from makespan.workers.planner_worker import PlannerWorker


@pytest.fixture
def fleet():
    return load_fleet("examples/render-pipeline.toml")


@pytest.fixture
def prod(r, keys, fleet, settings):
    return Producer(r, keys, fleet, settings)


def _leased(store, prod, keys, prio="LOW"):
    h = prod.submit({"endpoint": "embed", "service_s": 5, "priority": prio})
    lease = store.acquire(f"L-{h.id[:6]}", ("g0",), 30, job_id=h.id, queue=keys.queue(Priority[prio]))
    return h.id, lease


def test_preempt_refuses_a_job_whose_execute_is_done(r, keys, prod):
    store = LeaseStore(r, keys)
    jid, lease = _leased(store, prod, keys)
    r.hset(keys.phase(lease.lease_id), "execute", "done")
    assert preempt(r, keys, lease.lease_id, "crit") == "executed"
    assert r.get(keys.gpu("g0")) is not None  # still leased: it only has to clear
    assert r.hget(keys.job(jid), "state") == "leased"


def test_preempt_requeues_or_cancels(r, keys, prod):
    store = LeaseStore(r, keys)
    jid, lease = _leased(store, prod, keys)
    assert preempt(r, keys, lease.lease_id, "crit") == "preempted"
    assert r.hget(keys.job(jid), "state") == "queued" and r.zscore(keys.queue(Priority.LOW), jid) is not None
    jid2, lease2 = _leased(store, prod, keys)
    r.hset(keys.job(jid2), "cancel_requested", "1")
    assert preempt(r, keys, lease2.lease_id, "crit") == "cancelled"
    assert r.hget(keys.job(jid2), "state") == "cancelled"
    assert r.zscore(keys.queue(Priority.LOW), jid2) is None
    assert r.zscore(f"{keys.prefix}:finished", jid2) is not None  # retention will compact it


def test_deposed_planner_cannot_preempt(r, keys, prod):
    store = LeaseStore(r, keys)
    jid, lease = _leased(store, prod, keys)
    r.set(keys.planner_fence, 9)
    with pytest.raises(LeaseError):
        preempt(r, keys, lease.lease_id, "crit", planner_token="8")
    assert r.hget(keys.job(jid), "state") == "leased"


def test_batch_reads_past_steps_whose_dependencies_are_not_done(r, keys, prod, fleet, settings):
    blocker = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "HIGH"}).id
    r.zrem(keys.queue(Priority.HIGH), blocker)
    r.hset(keys.job(blocker), "state", "running")  # a dependency still running
    small = dataclasses.replace(settings, batch_size=4)
    for _ in range(10):
        prod.submit({"endpoint": "embed", "service_s": 5, "priority": "LOW", "depends_on": [blocker]})
    free = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "LOW"}).id
    w = PlannerWorker(r, small, fleet, dispatch=lambda *a: None)
    assert [j.id for j in w.form_batch()] == [free]


def test_stale_entries_at_the_head_do_not_hide_the_jobs_behind_them(r, keys, prod, fleet, settings):
    """Removing stale entries shifts the rest of the queue up: the next read must not skip
    as many live jobs (batch_size 2: two cancelled entries, then two queued jobs)."""
    small = dataclasses.replace(settings, batch_size=2)
    ids = [prod.submit({"endpoint": "embed", "service_s": 5, "priority": "LOW"}).id for _ in range(4)]
    for jid in ids[:2]:
        r.hset(keys.job(jid), "state", "cancelled")  # left in the queue: stale
    w = PlannerWorker(r, small, fleet, dispatch=lambda *a: None)
    w.token = r.incr(keys.planner_fence) and r.get(keys.planner_fence)
    assert [j.id for j in w.form_batch()] == ids[2:]
    assert r.zrange(keys.queue(Priority.LOW), 0, -1) == ids[2:]


def test_stale_entry_cleanup_keeps_a_requeued_job(r, keys, prod, fleet, settings):
    jid = prod.submit({"endpoint": "embed", "service_s": 5}).id
    w = PlannerWorker(r, settings, fleet, dispatch=lambda *a: None)
    w.token = r.incr(keys.planner_fence) and r.get(keys.planner_fence)
    drop_stale(w.env, w.token, keys.queue(Priority.NORMAL), jid)  # the job is queued: nothing removed
    assert r.zscore(keys.queue(Priority.NORMAL), jid) is not None
    r.hset(keys.job(jid), "state", "cancelled")
    drop_stale(w.env, w.token, keys.queue(Priority.NORMAL), jid)
    assert r.zscore(keys.queue(Priority.NORMAL), jid) is None


def test_a_failover_says_whom_it_takes_over_from(r, settings, caplog):
    """An SRE: a standby's takeover logged the same line as a first start."""
    import logging

    from makespan.models import load_fleet
    from makespan.workers.planner_worker import PlannerWorker
    from tests.conftest import FLEET_TOML

    first, second = (PlannerWorker(r, settings, load_fleet(FLEET_TOML)) for _ in range(2))
    try:
        with caplog.at_level(logging.INFO, logger="makespan.planner"):
            lock = first._lead()
            assert lock is not None
            first._release(lock)
            lock = second._lead()
            assert lock is not None
            second._release(lock)
        said = [rec.getMessage() for rec in caplog.records if " leads " in rec.getMessage()]
        assert len(said) == 2 and "taking over" not in said[0], said
        assert said[1].endswith(f", taking over from {first.name}"), said
    finally:
        first.close()
        second.close()
