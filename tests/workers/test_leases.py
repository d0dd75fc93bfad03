"""GPU leases on a real Redis: whole gangs, fencing tokens, renewals, reclaim."""

import json
import time

import pytest

from makespan.errors import LeaseError, StaleFencingToken
from makespan.models import Priority, load_fleet
from makespan.producer import Producer
from makespan.workers.leases import LeaseStore


@pytest.fixture
def store(r, keys):
    return LeaseStore(r, keys)


@pytest.fixture
def prod(r, keys, settings):
    return Producer(r, keys, load_fleet("examples/render-pipeline.toml"), settings)


def test_gang_is_leased_whole_or_not_at_all(store, r, keys):
    a = store.acquire("L1", ("g0", "g1"), 5, kind="restore")
    assert a is not None
    b = store.acquire("L2", ("g1", "g2"), 5, kind="restore")  # g1 busy: nothing taken
    assert b is None
    assert r.get(keys.gpu("g2")) is None
    c = store.acquire("L3", ("g2", "g3"), 5, kind="restore")
    assert c is not None and c.token > a.token  # fencing tokens are monotonic


def test_acquire_acknowledges_the_job_atomically(store, prod, r, keys):
    h = prod.submit({"endpoint": "coder", "service_s": 5, "priority": "HIGH"})
    lease = store.acquire("L1", ("g0", "g1"), 5, job_id=h.id, queue=keys.queue(Priority.HIGH))
    assert lease is not None
    assert r.zcard(keys.queue(Priority.HIGH)) == 0
    assert r.hget(keys.job(h.id), "state") == "leased"
    # a job that is no longer queued cannot be leased again
    assert store.acquire("L2", ("g2", "g3"), 5, job_id=h.id, queue=keys.queue(Priority.HIGH)) is None


def test_renew_check_and_stale_token(store, r, keys):
    # long TTLs while the lease must be live (a loaded machine may pause seconds between two
    # calls), then a last renewal with a short one that the holder never renews again
    lease = store.acquire("L1", ("g0",), 30.0, kind="restore")
    assert store.renew(lease, 30.0)
    store.check(lease)
    assert store.renew(lease, 0.3)
    time.sleep(0.45)  # expired: the GPU key is gone
    assert not store.renew(lease, 5)
    with pytest.raises(StaleFencingToken):
        store.check(lease)
    newer = store.acquire("L2", ("g0",), 5, kind="restore")
    assert newer.token > lease.token
    # the stale holder's fenced write is a no-op
    assert store.fenced(lease, [("SET", keys.resident("g0"), "x@g0")]) is False
    assert r.get(keys.resident("g0")) is None
    assert store.fenced(newer, [("SET", keys.resident("g0"), "y@g0")]) is True


def test_reclaim_requeues_with_original_order_then_fails(store, prod, r, keys):
    first = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "LOW"})
    second = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "LOW"})
    q = keys.queue(Priority.LOW)
    for attempt in (1, 2):
        lease = store.acquire(f"L{attempt}", ("g0",), 0.05, job_id=first.id, queue=q)
        assert lease is not None
        r.hset(keys.phase(lease.lease_id), "evict:claimed", "1")  # a phase of it started: an attempt
        time.sleep(0.1)
        outcome = store.reclaim_expired(max_attempts=2)
        if attempt == 1:
            assert outcome == {"requeued": 1}
            assert r.zrange(q, 0, -1) == [first.id, second.id]  # original submission order kept
        else:
            assert outcome == {"failed": 1}
            rec = r.hgetall(keys.job(first.id))
            assert rec["state"] == "failed" and "lease expired" in rec["reason"]
            assert r.zscore(f"{keys.prefix}:finished", first.id) is not None  # retention will compact it
    assert r.zcard(keys.leases) == 0 and r.get(keys.gpu("g0")) is None


def test_a_lease_that_expired_before_any_phase_started_is_not_an_attempt(store, prod, r, keys):
    """Issue 18, failure 2: leases that expire while no consumer is alive for their host
    (no phase ever claimed) requeue the job with its attempts untouched, however often."""
    job = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "LOW"})
    q = keys.queue(Priority.LOW)
    for n in range(4):  # more than max_attempts
        assert store.acquire(f"N{n}", ("g0",), 0.05, job_id=job.id, queue=q) is not None
        time.sleep(0.1)
        assert store.reclaim_expired(max_attempts=2) == {"requeued": 1}
    rec = r.hgetall(keys.job(job.id))
    assert rec["state"] == "queued" and rec["attempts"] == "0" and "not an attempt" in rec["reason"]
    assert r.zrange(q, 0, -1) == [job.id]
    reclaimed = [json.loads(f["e"]) for _i, f in r.xrange(keys.events)]
    assert [e["attempt_counted"] for e in reclaimed if e["kind"] == "reclaimed"] == [False] * 4


def test_deposed_planner_cannot_publish(store, prod, r, keys):
    r.set(keys.planner_fence, 5)
    h = prod.submit({"endpoint": "embed", "service_s": 5})
    with pytest.raises(LeaseError):
        store.acquire("L1", ("g0",), 5, job_id=h.id, queue=keys.queue(Priority.NORMAL), planner_token="4")
    assert r.get(keys.gpu("g0")) is None and r.zcard(keys.queue(Priority.NORMAL)) == 1


def test_acquire_many_is_acquire_one_by_one_in_one_round_trip(store, prod, r, keys):
    jobs = [prod.submit({"endpoint": "embed", "service_s": 5, "priority": "HIGH"}).id for _ in range(3)]
    r.set(keys.resident("g0"), "embed@g0")
    store._acquire.sha = "0" * 40  # a script Redis does not know: each call falls back and loads it
    reqs = [dict(lease_id=f"L{i}", gpus=(g,), ttl_s=5, job_id=j, queue=keys.queue(Priority.HIGH),
                 instance=f"embed@{g}") for i, (j, g) in enumerate(zip(jobs, ("g0", "g1", "g0")))]
    leases, fenced = store.acquire_many(reqs)
    assert not fenced
    assert [lease is not None for lease in leases] == [True, True, False]  # g0 taken by the first
    assert [lease.warm for lease in leases[:2]] == [True, False]
    assert r.zrange(keys.queue(Priority.HIGH), 0, -1) == [jobs[2]]
    assert leases[1].token > leases[0].token


def test_acquire_many_stops_at_the_planner_fence(store, prod, r, keys):
    jobs = [prod.submit({"endpoint": "embed", "service_s": 5, "priority": "HIGH"}).id for _ in range(2)]
    r.set(keys.planner_fence, "7")
    reqs = [dict(lease_id=f"L{i}", gpus=(f"g{i}",), ttl_s=5, job_id=j, queue=keys.queue(Priority.HIGH),
                 planner_token=tok) for i, (j, tok) in enumerate(zip(jobs, ("7", "6")))]
    leases, fenced = store.acquire_many(reqs)
    assert fenced and leases[0] is not None and leases[1] is None
    assert r.hget(keys.job(jobs[1]), "state") == "queued"


def test_acquire_many_goes_on_past_a_script_redis_refuses(store, prod, r, keys):
    jobs = [prod.submit({"endpoint": "embed", "service_s": 5, "priority": "HIGH"}).id for _ in range(3)]
    r.rpush(keys.gpu("g1"), "not a lease")  # WRONGTYPE inside the second script: Redis answers an error
    reqs = [dict(lease_id=f"L{i}", gpus=(f"g{i}",), ttl_s=5, job_id=j, queue=keys.queue(Priority.HIGH))
            for i, j in enumerate(jobs)]
    leases, fenced = store.acquire_many(reqs)
    assert not fenced
    assert [lease is not None for lease in leases] == [True, False, True]  # the leases around it stand
    assert r.zrange(keys.queue(Priority.HIGH), 0, -1) == [jobs[1]]  # the refused one stays queued
    assert r.hget(keys.job(jobs[1]), "state") == "queued"
    r.delete(keys.gpu("g1"))
