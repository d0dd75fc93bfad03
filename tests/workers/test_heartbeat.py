"""LeaseHeartbeat (workers/heartbeat.py): renews its lease every ``interval_s`` from a thread
that this process's heartbeat starter starts when the first renewal is due, sets ``lost``
as soon as a renewal finds the lease no longer ours, and rides a Redis error out."""

from __future__ import annotations

import threading
import time

import redis

from makespan.workers.leases import LeaseStore
from makespan.workers.heartbeat import LeaseHeartbeat, _HeartbeatStarter
from tests.live import wait_for


def _lease(r, keys, lid: str, gpu: str):
    r.hset(keys.job(f"j-{lid}"), mapping={"id": f"j-{lid}", "state": "queued", "priority": "NORMAL"})
    r.zadd(keys.queue("NORMAL"), {f"j-{lid}": 1})
    lease = LeaseStore(r, keys).acquire(lid, (gpu,), 30.0, job_id=f"j-{lid}", queue=keys.queue("NORMAL"))
    assert lease is not None
    return lease


class CountingStore(LeaseStore):
    """The real store, counting renewals; the first ``fail_first`` raise a connection error."""

    def __init__(self, r, keys, fail_first: int = 0):
        super().__init__(r, keys)
        self.renewals = 0
        self.fail_first = fail_first

    def renew(self, lease, ttl_s):
        self.renewals += 1
        if self.renewals <= self.fail_first:
            raise redis.ConnectionError("injected: the connection dropped")
        return super().renew(lease, ttl_s)


def test_a_heartbeat_renews_its_lease_and_sets_lost_once_it_is_gone(r, keys):
    lease = _lease(r, keys, "HB1", "g-hb1")
    store = CountingStore(r, keys)
    expires0 = int(r.hget(keys.lease("HB1"), "expires_ms"))
    with LeaseHeartbeat(store, lease, 60.0, 0.05) as hb:
        wait_for(lambda: int(r.hget(keys.lease("HB1"), "expires_ms")) > expires0 + 20_000, 10, "a renewal", 0.01)
        assert not hb.lost.is_set()
        r.delete(keys.gpu("g-hb1"))  # reclaimed: the GPU no longer names the lease
        assert hb.lost.wait(10)
    assert hb._t is not None and not hb._t.is_alive()  # its thread ended at the renewal that found it lost


def test_a_heartbeat_that_ends_before_its_first_renewal_starts_no_thread(r, keys):
    lease = _lease(r, keys, "HB2", "g-hb2")
    store = CountingStore(r, keys)
    before = {t.name for t in threading.enumerate()}
    for _ in range(50):
        with LeaseHeartbeat(store, lease, 60.0, 30.0) as hb:
            pass
    assert hb._t is None and store.renewals == 0 and not hb.lost.is_set()
    assert not {t.name for t in threading.enumerate()} - before - {"heartbeat-starter"}


def test_a_redis_error_is_transient_and_concurrent_heartbeats_each_renew(r, keys):
    leases = [_lease(r, keys, f"HB3{i}", f"g-hb3{i}") for i in range(3)]
    stores = [CountingStore(r, keys, fail_first=2 if i == 0 else 0) for i in range(3)]
    intervals = [0.02, 0.3, 0.05]
    beats = [LeaseHeartbeat(s, lease, 60.0, iv) for s, lease, iv in zip(stores, leases, intervals)]
    for hb in beats:
        hb.__enter__()
    try:
        wait_for(lambda: all(s.renewals >= 3 for s in stores), 10, "three renewals of each lease", 0.01)
        assert not any(hb.lost.is_set() for hb in beats)  # the injected errors did not lose the first
    finally:
        for hb in beats:
            hb.__exit__(None, None, None)
    assert all(hb._t is not None and not hb._t.is_alive() for hb in beats)  # stopped and joined on exit


class _CountingCondition(threading.Condition):
    """The starter's condition, counting its notifies and saying when its thread waits."""

    def __init__(self):
        super().__init__()
        self.notifies = 0
        self.waiting = threading.Event()

    def notify(self, n=1):
        self.notifies += 1
        super().notify(n)

    def wait(self, timeout=None):
        self.waiting.set()
        return super().wait(timeout)


def test_the_starter_is_woken_only_for_a_renewal_due_before_it_wakes(r, keys):
    """A job that ends before its first renewal leaves the starter's thread asleep until
    that renewal's time; the next job's heartbeat, due later, used to wake it anyway (a
    notify and a thread switch per job); one due earlier still wakes it, and starts on time."""
    lease = _lease(r, keys, "HB4", "g-hb4")
    store = CountingStore(r, keys)
    starter = _HeartbeatStarter()
    cond = starter._cond = _CountingCondition()
    first, later, soon = (LeaseHeartbeat(store, lease, 60.0, 60.0) for _ in range(3))
    now = time.monotonic()
    starter.add(first, now + 60.0)  # starts the starter's thread
    assert cond.waiting.wait(10)
    with cond:  # its thread holds the lock until it waits: now it waits until first's renewal
        pass
    assert starter.discard(first)  # first's job ended: no thread started for it
    starter.add(later, now + 61.0)
    assert cond.notifies == 0  # the starter wakes at now + 60 by itself, before later is due
    starter.add(soon, time.monotonic() + 0.05)
    assert cond.notifies == 1
    try:
        wait_for(lambda: soon._t is not None and store.renewals >= 1, 10, "soon's first renewal", 0.01)
        assert later._t is None  # not due yet
    finally:
        starter.discard(later)
        soon._stop.set()
        if soon._t is not None:
            soon._t.join(timeout=2)
    assert not soon.lost.is_set()


def test_no_renewal_answered_for_the_ttl_reads_as_lost_and_a_renewal_moves_the_deadline(r, keys):
    """Redis errors on every renewal (a worker cut off from Redis): the lease may be reclaimed
    once its TTL has passed, so ``lost`` reads as set by then, with no
    refused renewal; ``wait`` returns at that deadline. A renewal that succeeds moves it."""
    from makespan.workers.heartbeat import LeaseLost, lease_clock

    lease = _lease(r, keys, "HB5", "g-hb5")
    store = CountingStore(r, keys, fail_first=10**6)  # never answered
    ttl_s = 1.0
    started = lease_clock()
    with LeaseHeartbeat(store, lease, ttl_s, 0.1, renewed_at_s=started) as hb:
        assert not hb.lost.is_set()
        assert hb.lost.wait(5.0)  # returns at the deadline, not after the 5 s
        waited = lease_clock() - started
        assert ttl_s - 0.01 <= waited < ttl_s + 1.0, waited
        assert store.renewals >= 2
    lost = LeaseLost(lease_clock() + 0.2)
    lost.extend(lease_clock() + 60.0)  # a renewal answered
    assert not lost.wait(0.4) and not lost.is_set()
    assert LeaseLost().wait(0.01) is False  # no deadline: an Event


class BlockedOnceStore(LeaseStore):
    """The real store; its first renewal blocks ``block_s`` (a half-open connection until the
    socket timeout), then raises."""

    def __init__(self, r, keys, block_s: float):
        super().__init__(r, keys)
        self.block_s, self.renewals = block_s, 0

    def renew(self, lease, ttl_s):
        self.renewals += 1
        if self.renewals == 1:
            time.sleep(self.block_s)
            raise redis.TimeoutError("injected: the socket timed out")
        return super().renew(lease, ttl_s)


def test_one_blocked_renewal_within_the_documented_slack_does_not_lose_the_lease(r, keys):
    """lease_renewal_warning promises that one renewal blocked up to the socket timeout is
    survived while 2 × heartbeat + socket timeout ≤ TTL: the local deadline must not eat
    that slack (a margin under the TTL did, at the default 10 / 2 / 5; review)."""
    from makespan.settings import Settings, lease_renewal_warning

    ttl_s, interval_s, block_s = 5.0, 1.0, 2.5  # the defaults (10 / 2 / 5) halved: 0.5 s of slack
    assert lease_renewal_warning(Settings(lease_ttl_s=ttl_s, heartbeat_s=interval_s,
                                          redis_socket_timeout_s=block_s)) is None  # inside the documented slack
    lease = _lease(r, keys, "HB6", "g-hb6")
    store = BlockedOnceStore(r, keys, block_s)
    seen_lost = []
    with LeaseHeartbeat(store, lease, ttl_s, interval_s) as hb:
        def renewed_on() -> bool:  # asked every 10 ms, as a phase's watcher asks
            seen_lost.append(hb.lost.is_set())
            return store.renewals >= 3
        wait_for(renewed_on, 20, "renewals after the blocked one", 0.01)
        assert not any(seen_lost) and not hb.lost.is_set()


class SlowThenBlockedStore(LeaseStore):
    """The real store; its first renewal answers after ``slow_s`` (it succeeds), its second
    blocks ``block_s`` and raises: a Redis that stalls twice."""

    def __init__(self, r, keys, slow_s: float, block_s: float):
        super().__init__(r, keys)
        self.slow_s, self.block_s, self.renewals = slow_s, block_s, 0

    def renew(self, lease, ttl_s):
        self.renewals += 1
        if self.renewals == 1:
            time.sleep(self.slow_s)
        elif self.renewals == 2:
            time.sleep(self.block_s)
            raise redis.TimeoutError("injected: the socket timed out")
        return super().renew(lease, ttl_s)


def test_a_slow_renewal_does_not_push_the_next_one_past_the_deadline(r, keys):
    """The next renewal was sent interval_s after the previous one's *answer*: one slow
    answer, then a blocked renewal, left no renewal in time and a healthy lease read as
    lost, its run given up and its job run again (breaker: DEBUG SLEEP twice). Renewals are
    sent interval_s after the previous send, and a failed one is tried again soon."""
    ttl_s, interval_s = 5.0, 1.0
    lease = _lease(r, keys, "HB7", "g-hb7")
    store = SlowThenBlockedStore(r, keys, slow_s=1.5, block_s=2.5)
    seen_lost = []
    with LeaseHeartbeat(store, lease, ttl_s, interval_s) as hb:
        def renewed_on() -> bool:
            seen_lost.append(hb.lost.is_set())
            return store.renewals >= 4
        wait_for(renewed_on, 20, "renewals after the stalls", 0.01)
        assert not any(seen_lost) and not hb.lost.is_set()


def test_a_run_told_its_lease_is_lost_stays_given_up_when_a_late_renewal_lands():
    """``ctx.cancelled`` read the passed deadline (reason lease_lost) but did not latch the
    lease's ``lost``: a renewal answered a moment later moved the deadline, the run's final
    check read the lease as fine and its result ``{"cancelled": "lease_lost"}`` was stored
    as the job's (breaker). Once a function is told, the run is given up."""
    from makespan.workers.functions import CancelEvent
    from makespan.workers.heartbeat import LeaseLost, lease_clock

    lost = LeaseLost(lease_clock() + 0.05)
    cancelled, told = CancelEvent(), []
    cancelled.watch_lease(lost, lambda: told.append("lease_lost"))
    time.sleep(0.1)
    assert bool(cancelled) and told == ["lease_lost"]
    lost.extend(lease_clock() + 60.0)  # the renewal in flight is answered
    assert lost.is_set()


def test_a_wait_whose_lease_is_lost_ends_and_says_so_at_the_workers_default_level(r, keys, settings, caplog):
    """A GPU worker paused past its lease TTL (SIGSTOP, then SIGCONT): its reclaimed job ran
    again elsewhere, exactly once, but the resumed worker said nothing about dropping its
    own run at its default level, WARNING (an SRE's report)."""
    import logging
    from types import SimpleNamespace

    import pytest

    from makespan.errors import LeaseLostDuringPhase
    from makespan.models import parse_fleet
    from makespan.workers.phases import PhaseRunner

    lease = _lease(r, keys, "HB9", "g-hb9")
    with LeaseHeartbeat(CountingStore(r, keys), lease, 60.0, 0.05) as hb:
        r.delete(keys.gpu("g-hb9"))  # reclaimed while the phase waited
        with pytest.raises(LeaseLostDuringPhase) as lost:
            PhaseRunner._wait_wall(30.0, hb)
    fleet = parse_fleet({"hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 1000}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10, "cold_start_s": 1}}})
    runner = PhaseRunner(r, settings, fleet)
    ctx = SimpleNamespace(kind="job", job_id="j-HB9", lease_id="HB9")
    with caplog.at_level(logging.WARNING, logger="makespan.phases"):
        assert runner.hand_back(ctx, lost.value) is None  # not shutting down: nothing handed back
    assert "job j-HB9: its lease HB9 was lost while its phase ran" in caplog.text
    # a preemption is routine: said at INFO, as what it is (it was the same warning: SRE's soak check)
    caplog.clear()
    r.hset(keys.job("j-HB9"), mapping={"state": "queued", "reason": "preempted by job c1 (CRITICAL)", "lease": ""})
    with caplog.at_level(logging.INFO, logger="makespan.phases"):
        assert runner.hand_back(ctx, lost.value) is None
    [record] = [rec for rec in caplog.records if "j-HB9" in rec.getMessage()]
    assert record.levelno == logging.INFO and "preempted while its phase ran" in record.getMessage()


def test_a_preempted_lease_whose_job_was_leased_again_is_said_as_a_preemption(r, keys, settings, caplog):
    """A new user's demo: the preempted job was leased again (its reason rewritten) before its
    old GPU worker learned of the loss, which then logged a warning that its lease was lost
    (paused, overloaded or cut off) instead of the routine preemption (``preempt.lua`` now
    records the lease it cut as ``preempted_lease``)."""
    import logging
    from types import SimpleNamespace

    from makespan.errors import LeaseLostDuringPhase
    from makespan.models import parse_fleet
    from makespan.workers.phases import PhaseRunner

    store = LeaseStore(r, keys)
    lease = _lease(r, keys, "PR1", "g-pr1")
    r.hset(keys.job("j-PR1"), mapping={"state": "running", "seq": 1})
    r.hset(keys.job("c-PR1"), mapping={"id": "c-PR1", "state": "queued", "priority": "CRITICAL"})
    assert store.preempt(lease.lease_id, "c-PR1") == "preempted"
    again = store.acquire("PR2", ("g-pr2",), 30.0, job_id="j-PR1", queue=keys.queue("NORMAL"))
    assert again is not None and r.hget(keys.job("j-PR1"), "lease") == "PR2"
    assert not (r.hget(keys.job("j-PR1"), "reason") or "").startswith("preempted by")
    fleet = parse_fleet({"hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 1000}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10, "cold_start_s": 1}}})
    runner = PhaseRunner(r, settings, fleet)
    ctx = SimpleNamespace(kind="job", job_id="j-PR1", lease_id="PR1")
    with caplog.at_level(logging.INFO, logger="makespan.phases"):
        assert runner.hand_back(ctx, LeaseLostDuringPhase("lost")) is None
    [record] = [rec for rec in caplog.records if "j-PR1" in rec.getMessage()]
    assert record.levelno == logging.INFO and "preempted while its phase ran" in record.getMessage()
