"""Lease time on one clock, the Redis server's: a planner or GPU worker whose clock is
skewed by ±60 s neither reclaims a live lease early nor keeps an expired one. The
planner's clock is injected (a ``ManualClock`` set off the real time); the lease store's
and the GPU worker's calls run with ``time.time`` patched in the process while they act.
Also request leases (the endpoint cap) and delayed jobs' due times. Real Redis, the real
planner tick (dispatch captured)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time

import pytest

from makespan.producer import Producer
from tests.faults.test_priority_cases import ONE_GPU
from makespan.workers.delayed import DelayedJobs
from makespan.workers.leases import Lease, LeaseStore
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.requests import RequestRunner
from makespan.workers.tick.clock import ManualClock

SKEW_S = 60.0
_REAL_TIME = time.time


@contextlib.contextmanager
def clock(monkeypatch, skew_s: float):
    """This process's ``time.time`` runs ``skew_s`` seconds off while the block runs."""
    monkeypatch.setattr(time, "time", lambda: _REAL_TIME() + skew_s)
    try:
        yield
    finally:
        monkeypatch.setattr(time, "time", _REAL_TIME)


def _reclaimed(r, keys, job_id: str) -> list[dict]:
    evs = [json.loads(f["e"]) for _, f in r.xrange(keys.events)]
    return [e for e in evs if e["kind"] == "reclaimed" and e.get("job") == job_id]


# (planner clock, GPU worker clock) offsets in s: each case failed on the client-clock leases
SKEWS = [(+SKEW_S, 0.0), (-SKEW_S, 0.0), (0.0, +SKEW_S), (0.0, -SKEW_S)]


def _leased_and_renewed(r, keys, settings, monkeypatch, planner_skew_s, worker_skew_s, ttl_s):
    """The planner (its clock: ``planner_skew_s`` off, injected) leases one job; its GPU
    worker (its clock) renews the lease once with ``ttl_s``. Returns the planner, its
    clock, the job id and the captured dispatches."""
    s = dataclasses.replace(settings, lease_ttl_s=ttl_s)
    sent = []
    planner_clock = ManualClock(_REAL_TIME() + planner_skew_s)
    w = PlannerWorker(r, s, ONE_GPU, dispatch=lambda ctx, q: sent.append(ctx), clock=planner_clock)
    w.token = ""
    jid = Producer(r, keys, ONE_GPU, s).submit({"endpoint": "e", "service_s": 1}).id
    w.tick()
    assert [c.job_id for c in sent] == [jid]
    ctx = sent[0]
    with clock(monkeypatch, worker_skew_s):  # the worker's heartbeat
        assert LeaseStore(r, keys).renew(Lease(ctx.lease_id, ctx.token, tuple(ctx.gpus)), ttl_s)
    r.hset(keys.phase(ctx.lease_id), "evict:claimed", "1")  # its first phase started: an attempt
    return w, planner_clock, jid, sent


@pytest.mark.parametrize("planner_skew_s,worker_skew_s", SKEWS)
def test_a_live_lease_is_not_reclaimed_whatever_the_clocks(r, keys, settings, monkeypatch,
                                                           planner_skew_s, worker_skew_s):
    w, _clock, jid, sent = _leased_and_renewed(r, keys, settings, monkeypatch, planner_skew_s, worker_skew_s,
                                               ttl_s=5.0)
    with clock(monkeypatch, planner_skew_s):  # the planner process's lease store
        assert w.leases.expired() == []
    w.tick()
    with clock(monkeypatch, planner_skew_s):
        assert w.leases.reclaim_expired(max_attempts=3) == {}
    assert _reclaimed(r, keys, jid) == [] and len(sent) == 1
    assert r.hget(keys.job(jid), "state") == "leased" and r.hget(keys.job(jid), "attempts") == "0"
    assert r.get(keys.gpu(sent[0].gpus[0])) == f"{sent[0].lease_id}:{sent[0].token}"


@pytest.mark.parametrize("planner_skew_s,worker_skew_s", SKEWS)
def test_an_expired_lease_is_reclaimed_whatever_the_clocks(r, keys, settings, monkeypatch,
                                                           planner_skew_s, worker_skew_s):
    w, planner_clock, jid, sent = _leased_and_renewed(r, keys, settings, monkeypatch, planner_skew_s,
                                                      worker_skew_s, ttl_s=0.3)
    time.sleep(0.5)  # the worker stopped renewing: its GPU key (PX, server clock) is gone
    planner_clock.advance(0.5)
    assert r.get(keys.gpu(sent[0].gpus[0])) is None
    with clock(monkeypatch, planner_skew_s):  # the planner process's lease store
        assert w.leases.expired() == [sent[0].lease_id]
    w.tick()  # reaps, requeues and leases the job again
    assert [e["outcome"] for e in _reclaimed(r, keys, jid)] == ["requeued"]
    assert r.hget(keys.job(jid), "attempts") == "1" and [c.job_id for c in sent] == [jid, jid]


def test_expires_ms_is_the_server_clock_plus_the_ttl(r, keys, monkeypatch):
    def server_ms() -> int:
        sec, usec = r.time()
        return sec * 1000 + usec // 1000

    # the server clock read before and after each call brackets the moment the script read it
    # (a fixed 1 s allowance after the call, as first written, is a bet on the machine's load)
    store = LeaseStore(r, keys)
    before_ms = server_ms()
    with clock(monkeypatch, -SKEW_S):
        lease = store.acquire("L1", ("g0",), 5.0, kind="restore")
    after_ms = server_ms()
    expires_ms = int(r.hget(keys.lease("L1"), "expires_ms"))
    assert r.zscore(keys.leases, "L1") == expires_ms
    assert before_ms + 5_000 <= expires_ms <= after_ms + 5_000
    before_ms = server_ms()
    with clock(monkeypatch, +SKEW_S):
        assert store.renew(lease, 10.0)
    after_ms = server_ms()
    assert before_ms + 10_000 <= int(r.hget(keys.lease("L1"), "expires_ms")) <= after_ms + 10_000


@pytest.mark.parametrize("holder_skew_s,contender_skew_s", [(-SKEW_S, 0.0), (0.0, +SKEW_S)])
def test_a_skewed_sender_cannot_drop_a_live_request_lease(r, keys, monkeypatch, holder_skew_s, contender_skew_s):
    """The endpoint cap (one slot here) holds across senders whose clocks disagree."""
    holder = RequestRunner(r, keys, "i1", "http://127.0.0.1:9", "m", slots=1)
    contender = RequestRunner(r, keys, "i1", "http://127.0.0.1:9", "m", slots=1)
    async def take(runner, member):
        async with runner._connected():
            return await runner._try_acquire(member)
    with clock(monkeypatch, holder_skew_s):
        assert asyncio.run(take(holder, "a")) == 1
    with clock(monkeypatch, contender_skew_s):
        assert asyncio.run(take(contender, "b")) == 0
    assert r.zrange(keys.req_leases("i1"), 0, -1) == ["a"]

def test_a_delayed_job_is_due_on_the_server_clock(r, keys, settings, monkeypatch):
    """A producer running 60 s ahead and a planner running 60 s behind (and the reverse)
    queue a delayed job when it is due: not 60 s early, not 120 s late."""
    prod = Producer(r, keys, ONE_GPU, settings)
    d = DelayedJobs(r, keys)
    with clock(monkeypatch, -SKEW_S):
        early = prod.submit({"endpoint": "e", "service_s": 1, "delay_s": 30}).id
    with clock(monkeypatch, +SKEW_S):
        assert d.promote() == 0  # due in 30 s on the server clock
        late = prod.submit({"endpoint": "e", "service_s": 1, "delay_s": 0.2}).id
        # the planner sleeps by the server clock, estimated within one round trip (the
        # offset is read after the script returns: the estimate may lag by that much)
        assert 29.0 <= d.wait_s(1e6) <= 30.0 + 0.05
    time.sleep(0.3)
    with clock(monkeypatch, -SKEW_S):
        assert d.promote() == 1
    assert r.hget(keys.job(late), "state") == "queued" and r.hget(keys.job(early), "state") == "delayed"


def test_the_planners_monotonic_clock_counts_a_suspended_machines_sleep(monkeypatch):
    """The planner kept its leader-lock deadline on time.monotonic, which stops while a Linux
    machine is suspended: a planner resumed after a VM suspend could act for up to one step
    on a lock that had run out (a fencing tester). Its clock is CLOCK_BOOTTIME, as the GPU
    worker's lease deadlines are (the Redis server's clock counts the sleep too)."""
    from makespan.workers.tick import clock

    if getattr(time, "CLOCK_BOOTTIME", None) is None:
        pytest.skip("no CLOCK_BOOTTIME on this OS: the monotonic clock is used")
    real = time.clock_gettime
    monkeypatch.setattr(time, "clock_gettime", lambda which: 1234.5 if which == time.CLOCK_BOOTTIME else real(which))
    assert clock.SystemClock().monotonic() == 1234.5
