"""A job or lease record with a damaged field (a hand edit, a bug) must not strand its job.

Redis keeps the writes a Lua script made before it raised. A state auditor (a helper) found
scripts that freed a lease's GPUs or took a job out of its queue and then raised on the job
record's missing ``seq`` or ``priority``, a non-integer counter, or ``deps`` that were not
JSON: the job was left ``queued`` in no queue, or ``running`` with no lease, for good. And one
expired lease whose record its script could not read stopped every planner tick. Each
scenario below failed that way before the fix (lib.lua ``repair_job_record``, ``deps_list``;
``LeaseStore.reclaim_expired`` going on past one unreadable lease)."""

from __future__ import annotations

import json
import logging
import time
import uuid

import pytest

from makespan.store import JobStore
from makespan.store.leases import LeaseStore, finish_job_op

LEVELS = ("critical", "high", "normal", "low")


@pytest.fixture
def stores(r, keys):
    return JobStore(r, keys), LeaseStore(r, keys)


def _submit(r, keys, jobs: JobStore, priority="NORMAL", delay_s=None, deps=None) -> str:
    job_id = uuid.uuid4().hex[:10]
    fields = {"id": job_id, "state": "queued", "endpoint": "e", "priority": priority, "service_s": "1.0",
              "submitted_at": repr(time.time()), "attempts": 0, "spec": "{}"}
    if deps:
        fields["deps"] = json.dumps(deps)
    jobs.submit(job_id, fields, json.dumps({"ts": time.time(), "kind": "submitted", "job": job_id}),
                keys.queue(priority), None, delay_s)
    return job_id


def _lease(leases: LeaseStore, keys, job_id, gpu, ttl_s=0.05, priority="NORMAL"):
    lease = leases.acquire("L" + uuid.uuid4().hex[:8], (gpu,), ttl_s, job_id=job_id, queue=keys.queue(priority),
                           holder="hostA")
    assert lease is not None
    return lease


def _queues_holding(r, keys, job_id) -> list[str]:
    return [level for level in LEVELS if r.zscore(keys.queue(level), job_id) is not None]


def _expire(r, keys, lease) -> None:
    r.zadd(keys.leases, {lease.lease_id: 1})  # expired long ago, on any clock


@pytest.mark.parametrize("damaged", ["seq", "priority"])
def test_a_reclaimed_job_missing_seq_or_priority_is_requeued_not_lost(r, keys, stores, damaged):
    jobs, leases = stores
    job_id = _submit(r, keys, jobs)
    lease = _lease(leases, keys, job_id, "g-reclaim")
    r.hdel(keys.job(job_id), damaged)
    _expire(r, keys, lease)
    assert leases.reclaim(lease.lease_id, max_attempts=3) == "requeued"
    assert r.hget(keys.job(job_id), "state") == "queued"
    assert _queues_holding(r, keys, job_id) == ["normal"]
    assert not r.exists(keys.gpu("g-reclaim")) and r.zscore(keys.leases, lease.lease_id) is None


def test_a_counted_reclaim_of_a_job_whose_attempts_is_not_an_integer_requeues_it(r, keys, stores):
    jobs, leases = stores
    job_id = _submit(r, keys, jobs)
    lease = _lease(leases, keys, job_id, "g-attempts")
    r.hset(keys.job(job_id), "attempts", "x")
    leases.claim_phase(lease, "evict")  # a phase started: the reclaim counts an attempt (HINCRBY)
    _expire(r, keys, lease)
    assert leases.reclaim(lease.lease_id, max_attempts=3) == "requeued"
    assert r.hget(keys.job(job_id), "state") == "queued" and r.hget(keys.job(job_id), "attempts") == "1"
    assert _queues_holding(r, keys, job_id) == ["normal"]


def test_a_preempted_victim_missing_its_priority_is_requeued(r, keys, stores):
    jobs, leases = stores
    victim = _submit(r, keys, jobs)
    lease = _lease(leases, keys, victim, "g-preempt", ttl_s=60)
    by = _submit(r, keys, jobs, "HIGH")
    r.hdel(keys.job(victim), "priority")
    assert leases.preempt(lease.lease_id, by) == "preempted"
    assert r.hget(keys.job(victim), "state") == "queued" and _queues_holding(r, keys, victim) == ["normal"]


def test_a_promoted_delayed_job_missing_its_seq_joins_its_queue(r, keys, stores):
    jobs, _ = stores
    job_id = _submit(r, keys, jobs, delay_s=0.01)
    r.hdel(keys.job(job_id), "seq")
    time.sleep(0.05)  # its delay is on the server clock
    jobs.promote_delayed(time.time(), 10, "", 0.0)
    assert r.hget(keys.job(job_id), "state") == "queued" and _queues_holding(r, keys, job_id) == ["normal"]
    assert r.zscore(keys.delayed, job_id) is None


def test_a_rerouted_job_missing_its_seq_lands_in_the_other_pools_queue(r, keys, stores):
    jobs, _ = stores
    r.set(keys.planner_fence, "7")
    job_id = _submit(r, keys, jobs)
    r.hdel(keys.job(job_id), "seq")
    assert jobs.reroute(job_id, keys.queue("NORMAL"), "poolB", "7", "{}")
    assert r.zscore(keys.for_pool("poolB").queue("NORMAL"), job_id) is not None
    assert _queues_holding(r, keys, job_id) == []


def test_a_queued_job_whose_deps_are_not_json_can_be_cancelled(r, keys, stores):
    jobs, _ = stores
    dependency = _submit(r, keys, jobs)
    job_id = _submit(r, keys, jobs, deps=[dependency])
    r.hset(keys.job(job_id), "deps", "[oops")
    jobs.cancel(job_id, keys.queue("NORMAL"), "{}", time.time())
    assert r.hget(keys.job(job_id), "state") == "cancelled" and _queues_holding(r, keys, job_id) == []


def test_finishing_a_job_whose_deps_are_not_json_ends_it_and_its_lease(r, keys, stores):
    """Before: the release ops ran, then finish_job raised on the deps: the job stayed
    ``running`` with no lease, which no reclaim would ever see."""
    jobs, leases = stores
    dependency = _submit(r, keys, jobs)
    r.hset(keys.job(dependency), "state", "completed")
    job_id = _submit(r, keys, jobs, deps=[dependency])
    lease = _lease(leases, keys, job_id, "g-finish", ttl_s=60)
    r.hset(keys.job(job_id), "deps", "[oops")
    ops = [("DEL", keys.gpu("g-finish")), ("DEL", keys.lease(lease.lease_id)), ("ZREM", keys.leases, lease.lease_id),
           finish_job_op(keys, job_id, "completed", time.time(), "done")]
    assert leases.fenced(lease, ops)
    assert r.hget(keys.job(job_id), "state") == "completed" and r.zscore(keys.running, job_id) is None


def test_one_unreadable_expired_lease_does_not_stop_the_others_reclaim(r, keys, stores, caplog):
    jobs, leases = stores
    good_job = _submit(r, keys, jobs)
    good = _lease(leases, keys, good_job, "g-good")
    r.hset(keys.lease("Lbad"), mapping={"gpus": '["g9"', "kind": "job", "job": "nobody", "token": "1"})
    r.zadd(keys.leases, {"Lbad": 0})  # the earliest expiry: first in the loop
    _expire(r, keys, good)
    with caplog.at_level(logging.ERROR, logger="makespan.workers.leases"):
        counts = leases.reclaim_expired(max_attempts=3)
        again = leases.reclaim_expired(max_attempts=3)
    assert counts == {"unreclaimable": 1, "requeued": 1} and again == {"unreclaimable": 1}
    assert r.hget(keys.job(good_job), "state") == "queued"
    said = [rec.getMessage() for rec in caplog.records if "Lbad" in rec.getMessage()]
    assert len(said) == 1 and "cannot be reclaimed" in said[0], said  # once a minute per lease, not per tick


@pytest.mark.parametrize("seq", ["nan", "inf", "1.5"])
def test_a_promoted_delayed_job_whose_seq_lua_reads_but_zadd_refuses_joins_its_queue(r, keys, stores, seq):
    """A verifier: ``tonumber('nan')`` passed the repair, and ZADD then refused the score after
    the job had left P:delayed: ``queued`` in no queue, for good."""
    jobs, _ = stores
    job_id = _submit(r, keys, jobs, delay_s=0.01)
    r.hset(keys.job(job_id), "seq", seq)
    time.sleep(0.05)
    jobs.promote_delayed(time.time(), 10, "", 0.0)
    assert r.hget(keys.job(job_id), "state") == "queued" and _queues_holding(r, keys, job_id) == ["normal"]
    assert int(r.hget(keys.job(job_id), "seq")) > 0


def test_a_counted_reclaim_of_attempts_written_as_a_float_requeues_the_job(r, keys, stores):
    """``attempts = '1.0'`` passed the repair's integer test, and HINCRBY refused it after the
    GPUs were freed and the lease dropped: the job was left ``leased`` with no lease (a verifier)."""
    jobs, leases = stores
    job_id = _submit(r, keys, jobs)
    lease = _lease(leases, keys, job_id, "g-float")
    r.hset(keys.job(job_id), "attempts", "1.0")
    leases.claim_phase(lease, "evict")
    _expire(r, keys, lease)
    assert leases.reclaim(lease.lease_id, max_attempts=3) == "requeued"
    assert r.hget(keys.job(job_id), "state") == "queued" and _queues_holding(r, keys, job_id) == ["normal"]


@pytest.mark.parametrize("field, value", [("deps", "[oops"), ("deps", "5"), ("deps", '{"x": 1}'),
                                          ("service_s", "abc"), ("seq", "x"), ("submitted_at", "nan")])
def test_the_planner_cancels_a_queued_job_whose_record_it_cannot_read_and_goes_on(r, settings, field, value):
    """A queued job whose ``deps`` were ``[oops`` or whose ``service_s`` was ``abc`` made the
    planner's tick raise: the planner died, and again at every restart (a verifier). The tick
    now cancels such a job (its reason names the field) and plans the others; deps that are
    not a JSON list of ids count as none, as in the scripts."""
    import dataclasses

    from makespan.models import parse_fleet
    from makespan.producer import Producer
    from makespan.workers.planner_worker import PlannerWorker

    fleet = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})
    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio")
    sent = []
    w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: sent.append(ctx))
    prod = Producer(r, w.keys, fleet, s)
    w.token = str(r.incr(w.keys.planner_fence))  # the planner's cancel is fenced: lead
    try:
        damaged = prod.submit({"endpoint": "e", "service_s": 5}).id
        sound = prod.submit({"endpoint": "e", "service_s": 5}).id
        r.hset(w.keys.job(damaged), field, value)
        w.tick()
        record = r.hgetall(w.keys.job(damaged))
        if field == "deps":  # no dependency: planned as any job
            assert [ctx.job_id for ctx in sent] == [damaged], record
        else:
            assert record["state"] == "cancelled" and f"its record cannot be read ({field}=" in record["reason"]
            assert [ctx.job_id for ctx in sent] == [sound]
    finally:
        w.close()


def test_a_queued_job_missing_its_priority_can_be_cancelled_by_id(r, settings):
    """``makespan cancel`` of a queued job whose record had lost ``priority`` said "no job"
    (the producer read the queue from that field), though the job existed (a stop-53 helper).
    It now finds the queue that holds it and cancels it."""
    import dataclasses

    from makespan.keys import Keys
    from makespan.models import parse_fleet
    from makespan.producer import Producer

    fleet = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})
    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    keys = Keys(s.key_prefix)
    prod = Producer(r, keys, fleet, s)
    job_id = prod.submit({"endpoint": "e", "service_s": 5, "priority": "HIGH"}).id
    r.hdel(keys.job(job_id), "priority")
    assert prod.cancel(job_id) == "cancelled"
    assert r.hget(keys.job(job_id), "state") == "cancelled" and _queues_holding(r, keys, job_id) == []
