"""A leading planner whose leader lock may have expired (no acquire or extend sent within
the lock's TTL succeeded: the keeper's extend blocked on a half-open connection, or failed)
starts no tick step: it steps down, gives the lock back if it is still its own, and stands
by. Before, nothing but the planner fencing token on some writes stopped it: it went on
ticking, planning and dispatching as leader while a standby could take the expired lock.

The planner's clock is a ``ManualClock`` (its monotonic time is what the lock deadline is
kept on); the lock is real, on the shared Redis under this test's prefix; the keeper thread
is not run (its extends are made by hand), so nothing here depends on timing."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import pytest

from makespan.errors import LeaseError
from makespan.models import load_fleet
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick.clock import ManualClock
from tests.conftest import FLEET_TOML


class _Recorded:
    """A tick step that records that it ran; after three runs it stops the planner (a
    planner that never steps down ends the test instead of ticking forever)."""

    name = "recorded"

    def __init__(self) -> None:
        self.runs = 0
        self.worker: PlannerWorker | None = None

    def run(self, ctx) -> None:
        self.runs += 1
        if self.runs >= 3 and self.worker is not None:
            self.worker.stop()


def _leader(r, settings) -> tuple[PlannerWorker, ManualClock, _Recorded, object]:
    clock = ManualClock(time.time(), monotonic_s=1000.0)
    # a lock TTL of 30 s (the keeper, were it running, would extend it after 10 s)
    worker = PlannerWorker(r, dataclasses.replace(settings, lease_ttl_s=60.0, critical_lane=False),
                           load_fleet(FLEET_TOML), clock=clock)
    recorded = _Recorded()
    worker.steps = (recorded,)
    recorded.worker = worker
    lock = worker._lead()
    assert lock is not None and r.get(worker.keys.planner_leader) is not None
    return worker, clock, recorded, lock


def test_a_leader_ticks_while_its_lock_is_held_and_steps_down_once_it_may_have_expired(r, settings):
    worker, clock, recorded, lock = _leader(r, settings)
    try:
        clock.advance(worker.lock_ttl_s - 0.5)
        worker.tick()
        assert recorded.runs == 1
        worker._extend_lock(lock)  # an extend that succeeded: the lock is held a TTL from now
        clock.advance(worker.lock_ttl_s - 0.5)
        worker.tick()
        assert recorded.runs == 2
        clock.advance(0.5)  # a TTL after the last extend was sent: it may have expired
        with pytest.raises(LeaseError, match="planner lock may have expired"):
            worker.tick()
        assert recorded.runs == 2  # no step ran
    finally:
        worker.close()
        lock.release()


def test_the_tick_loop_steps_down_and_gives_the_lock_back(r, settings, caplog):
    worker, clock, recorded, lock = _leader(r, settings)
    try:
        clock.advance(worker.lock_ttl_s)  # the keeper's extends all blocked: none succeeded
        with caplog.at_level(logging.ERROR, logger="makespan.planner"):
            worker._lead_until_stopped(lock)  # returns: deposed by its own deadline
        assert recorded.runs == 0  # it planned and dispatched nothing
        assert worker.lost.is_set()
        assert r.get(worker.keys.planner_leader) is None  # given back: a standby takes over at once
        assert worker.lock_held_until_s is None
        assert any("planner lock may have expired" in rec.getMessage() and "stepping down" in rec.getMessage()
                   for rec in caplog.records), [rec.getMessage() for rec in caplog.records]
    finally:
        worker.close()


def test_a_lock_extend_over_a_half_open_connection_fails_before_the_lock_can_expire(redis_url, settings):
    """The lock's commands go on a client of their own whose socket timeout fits the lock
    (Settings.planner_lock_socket_timeout_s: TTL - 2 x extend interval). With a 10 s socket
    timeout and a 3 s lock, an extend whose connection went silent waited the whole 10 s,
    long after the lock could have expired; now it fails after 1 s, and the keeper's next
    extend (a new connection) keeps the lock, within its TTL."""
    from urllib.parse import urlparse

    from bench.fault_proxy import SilentProxy
    from makespan.redis_conn import connect

    u = urlparse(redis_url)
    proxy = SilentProxy(u.hostname or "127.0.0.1", u.port or 6379)
    db = int(urlparse(redis_url).path.strip("/") or 0)
    url = proxy.url(db)
    tuned = dataclasses.replace(settings, redis_url=url, lease_ttl_s=6.0, redis_socket_timeout_s=10.0,
                                heartbeat_s=1.0, critical_lane=False)
    r = connect(url, settings=tuned)
    worker = PlannerWorker(r, tuned, load_fleet(FLEET_TOML), clock=ManualClock(time.time(), monotonic_s=1000.0))
    try:
        assert worker.lock_ttl_s == 3.0 and tuned.planner_lock_socket_timeout_s == pytest.approx(1.0)
        assert worker.lock_client.connection_pool.connection_kwargs["socket_timeout"] == pytest.approx(1.0)
        assert r.connection_pool.connection_kwargs["socket_timeout"] == 10.0  # the planner's own client keeps its
        lock = worker._lead()
        assert lock is not None
        worker.lock_held_until_s = None
        assert proxy.silence_open() >= 1  # every connection open now stops answering; new ones work
        started = time.monotonic()
        worker._extend_lock(lock)  # over the silenced connection: times out and fails
        took_s = time.monotonic() - started
        assert worker.lock_held_until_s is None and not worker.lost.is_set()
        assert took_s < worker.lock_ttl_s, f"an extend over a silent connection took {took_s:.1f} s"
        worker._extend_lock(lock)  # the keeper's next extend, over a new connection: the lock is still ours
        assert worker.lock_held_until_s is not None and not worker.lost.is_set()
        lock.release()
    finally:
        worker.close()
        r.close()
        proxy.close()


def test_the_lock_client_of_a_sentinel_url_reaches_the_same_primary(sentinel_set):
    """with_socket_timeout copies a Sentinel-managed client too: same service, database and
    credentials, its own pool with the shorter timeout."""
    from redis.sentinel import SentinelConnectionPool

    from makespan.redis_conn import connect, with_socket_timeout

    r = connect(sentinel_set.url_with())
    short = with_socket_timeout(r, 0.75)
    try:
        assert short is not r and type(short.connection_pool) is SentinelConnectionPool
        assert short.connection_pool.connection_kwargs["socket_timeout"] == 0.75
        short.set("mst-lock-client-probe", "1", ex=30)
        assert r.get("mst-lock-client-probe") == "1"
        r.delete("mst-lock-client-probe")
        assert with_socket_timeout(short, 5.0) is short  # already as short: the same client
    finally:
        short.close()
        r.close()


def test_closing_the_planner_closes_its_lock_clients_connections(private_redis, settings):
    """The leader lock's own client (:func:`makespan.redis_conn.with_socket_timeout`) shares
    no pool with the planner's; :meth:`PlannerWorker.close` must disconnect it. Before,
    ``Redis.close()`` of a client built on a pool it was handed left that pool's
    connections open until the worker was garbage-collected."""
    from makespan.redis_conn import connect
    from tests.live import wait_for

    own = dataclasses.replace(settings, redis_url=private_redis.url, critical_lane=False)
    r = connect(private_redis.url, settings=own)
    worker = PlannerWorker(r, own, load_fleet(FLEET_TOML))
    assert worker.lock_client is not r  # the default socket timeout is longer than the lock allows
    lock = worker._lead()
    assert lock is not None
    worker._release(lock)
    connected = len(r.client_list())
    worker.close()
    wait_for(lambda: len(r.client_list()) < connected, 30, "the lock client's connection closed")
    r.close()


def test_a_late_extend_of_an_ended_leadership_neither_deposes_nor_extends_the_next(r, settings):
    """The keeper thread of a leadership that ended is not joined: its extend, still in
    flight as the planner stepped down and led again, used to answer into the new
    leadership, and a LockNotOwnedError there set ``lost`` (one needless step-down). The
    answer of an extend sent for an ended leadership (its ``done`` set) is now ignored."""
    worker, _clock, _recorded, lock = _leader(r, settings)
    try:
        ended = threading.Event()
        ended.set()
        lock.release()  # the lock is no longer this leadership's: an extend raises LockNotOwnedError
        worker.lost.clear()
        worker.lock_held_until_s = None
        worker._extend_lock(lock, ended)
        assert not worker.lost.is_set() and worker.lock_held_until_s is None
        worker._extend_lock(lock, threading.Event())  # the same answer for a current leadership deposes it
        assert worker.lost.is_set()
    finally:
        worker.close()
