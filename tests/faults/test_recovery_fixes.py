"""Regression cases for two faults the chaos runner found.

* A GPU worker killed after its execute phase finished but before clear: the reaper
  used to requeue the job, so its workload ran twice. Now it completes the job.
* A standby planner whose Redis went away (restart, dropped connection) used to crash
  in its lock loop; now it waits and keeps standing by.
"""

from __future__ import annotations

import threading
import time

from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect
from makespan.settings import Settings
from makespan.workers.leases import LeaseStore
from makespan.workers.planner_worker import PlannerWorker
from tests.conftest import FLEET_TOML
from tests.live import wait_for


def _leased_job(r, keys, settings, ttl_s):
    fleet = load_fleet(FLEET_TOML)
    jid = Producer(r, keys, fleet, settings).submit({"endpoint": "embed", "service_s": 5, "priority": "HIGH"}).id
    store = LeaseStore(r, keys)
    lease = store.acquire("L1", ("GPU-host-a-3",), ttl_s, job_id=jid, kind="job", holder="host-a",
                          queue=keys.queue("HIGH"))
    assert lease is not None
    return jid, store


def test_reclaim_after_execute_completes_instead_of_requeueing(r, keys, settings):
    jid, store = _leased_job(r, keys, settings, ttl_s=0.05)
    r.hset(keys.phase("L1"), "execute", "done")  # the holder died between execute and clear
    time.sleep(0.1)
    assert store.reclaim_expired(settings.max_attempts) == {"completed": 1}
    rec = r.hgetall(keys.job(jid))
    assert rec["state"] == "completed" and "after execute" in rec["reason"]
    assert r.zscore(keys.queue("HIGH"), jid) is None
    assert r.get(keys.gpu("GPU-host-a-3")) is None


def test_reclaim_before_execute_still_requeues(r, keys, settings):
    jid, store = _leased_job(r, keys, settings, ttl_s=0.05)
    r.hset(keys.phase("L1"), "start_endpoint", "done")
    time.sleep(0.1)
    assert store.reclaim_expired(settings.max_attempts) == {"requeued": 1}
    assert r.hget(keys.job(jid), "state") == "queued"
    assert r.zscore(keys.queue("HIGH"), jid) is not None


def test_standby_planner_outlives_an_unreachable_redis(prefix, refused_port):
    dead = f"redis://127.0.0.1:{refused_port}/0"  # nothing listens here
    s = Settings(redis_url=dead, key_prefix=prefix, lease_ttl_s=2.0)
    w = PlannerWorker(connect(dead, socket_connect_timeout=0.1), s, load_fleet(FLEET_TOML))
    out: list = []
    t = threading.Thread(target=lambda: out.append(w._lead()), daemon=True)
    t.start()
    time.sleep(0.8)
    assert t.is_alive(), "the standby's lock loop died on a connection error"
    w.stop()
    t.join(timeout=5)
    assert out == [None]


def test_duplicate_delivery_of_a_running_phase_does_not_run_it_twice(r, keys, settings):
    """The broker restores unacked messages when a connection drops, so the same phase
    task can arrive twice while the first copy still runs (found by bench/chaos.py)."""
    import json

    from makespan.workers.phases import PhaseContext, PhaseRunner

    jid, store = _leased_job(r, keys, settings, ttl_s=settings.lease_ttl_s)
    token = int(r.hget(keys.lease("L1"), "token"))
    ctx = PhaseContext("L1", token, ["GPU-host-a-3"], "host-a", "job", "embed", jid, "HIGH", 300.0)  # 3 s
    runner = PhaseRunner(r, settings, load_fleet(FLEET_TOML))
    out: list = []
    first = threading.Thread(target=lambda: out.append(runner.run(ctx, "execute")))
    first.start()
    # the first copy has claimed the phase and runs it for 3 s (a window a loaded host's
    # scheduling cannot close; a fixed 0.15 s sleep could end before the first copy began)
    wait_for(lambda: r.hget(keys.phase("L1"), "execute:claimed") == "1", 30, "the first copy to claim the phase",
             0.01)
    second = runner.run(ctx, "execute")
    first.join(timeout=10)
    assert (out, second) == (["done"], "stale")
    ends = [json.loads(f["e"]) for _i, f in r.xrange(keys.events)]
    assert sum(1 for e in ends if e["kind"] == "phase_end" and e.get("phase") == "execute") == 1
    assert runner.run(ctx, "execute") == "skipped"  # a late copy after it finished


def test_late_reclaim_keeps_the_new_holders_resident_marker(r, keys, settings):
    """The GPU key expired and a newer lease took the GPU before the reaper ran (found by
    bench/chaos.py): reclaiming the old lease must not wipe what the new holder loaded,
    and its event says when the old lease really ended."""
    import json

    jid, store = _leased_job(r, keys, settings, ttl_s=0.05)
    time.sleep(0.1)  # expired: the GPU key is gone, the lease index still names it
    assert store.acquire("L2", ("GPU-host-a-3",), 30.0, kind="restore", holder="host-a") is not None
    r.set(keys.resident("GPU-host-a-3"), "embed@GPU-host-a-3")  # the new holder loaded its endpoint
    assert store.reclaim_expired(settings.max_attempts) == {"requeued": 1}
    assert r.get(keys.resident("GPU-host-a-3")) == "embed@GPU-host-a-3"
    assert r.get(keys.gpu("GPU-host-a-3")).startswith("L2:")
    ev = next(json.loads(f["e"]) for _i, f in r.xrange(keys.events) if json.loads(f["e"])["kind"] == "reclaimed")
    assert ev["expired_at"] < ev["ts"]


def test_failed_dispatch_does_not_kill_the_planner_and_the_job_is_requeued(r, keys, settings):
    """kombu raised AttributeError from a publish while Redis restarted (found by
    bench/chaos.py): the planner must keep going; the lease expires and the job returns."""
    import dataclasses

    def broken(ctx, queue):
        raise AttributeError("'NoneType' object has no attribute 'client'")

    s = dataclasses.replace(settings, lease_ttl_s=0.3)
    fleet = load_fleet(FLEET_TOML)
    jid = Producer(r, keys, fleet, s).submit({"endpoint": "embed", "service_s": 5, "priority": "HIGH"}).id
    w = PlannerWorker(r, s, fleet, dispatch=broken)
    w.token = ""
    w.tick()
    assert r.hget(keys.job(jid), "state") == "leased"
    time.sleep(0.4)
    w.leases.reclaim_expired(s.max_attempts)
    # no phase of it ever started: not an attempt (issue 18 failure 2)
    assert r.hget(keys.job(jid), "state") == "queued" and r.hget(keys.job(jid), "attempts") == "0"


def test_planner_loop_survives_a_wrapped_redis_error(r, keys, settings):
    """The agenda reaper wraps a dropped connection in StoreError; the planner's loop
    exited on it (found by bench/chaos.py). Now a failed tick is retried."""
    from makespan.errors import StoreError

    w = PlannerWorker(r, settings, load_fleet(FLEET_TOML), dispatch=lambda *a: None)
    calls = []

    def flaky_tick():
        calls.append(1)
        if len(calls) == 1:
            raise StoreError("agenda reap: Connection closed by server.")
        w.stop()
        return False

    w.tick = flaky_tick
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive() and len(calls) == 2


def test_a_lease_reclaimed_between_renew_and_claim_runs_no_phase_and_leaves_no_phase_hash(r, keys, settings):
    """The phase task renews its lease, then (a pause: GC, a loaded host) the lease expires
    and the planner reclaims it (its phase hash deleted, the job requeued) before the task
    claims the phase. The claim must see the lease is gone: the phase does not run, and no
    phase hash is recreated (found by a review: the bare HSETNX recreated it with no TTL and
    the execute phase of the reclaimed lease ran)."""
    import json

    from makespan.workers.phases import PhaseContext, PhaseRunner

    jid, store = _leased_job(r, keys, settings, ttl_s=settings.lease_ttl_s)
    token = int(r.hget(keys.lease("L1"), "token"))
    ctx = PhaseContext("L1", token, ["GPU-host-a-3"], "host-a", "job", "embed", jid, "HIGH", 300.0)
    runner = PhaseRunner(r, settings, load_fleet(FLEET_TOML))
    outcomes: list = []
    renew = runner.leases.renew

    def renew_then_lose(lease, ttl_s):
        held = renew(lease, ttl_s)
        if not outcomes:  # once, right after the phase's own renew: the lease expires and is reclaimed
            r.zadd(keys.leases, {"L1": 0})  # expired on any clock
            outcomes.append(store.reclaim("L1", settings.max_attempts))
        return held

    runner.leases.renew = renew_then_lose  # type: ignore[method-assign]
    ran: list[str] = []
    execute = runner._phase_execute
    runner._phase_execute = lambda *a: (ran.append("execute"), execute(*a))[1]  # type: ignore[method-assign]
    assert runner.run(ctx, "execute") == "stale"
    assert outcomes == ["requeued"]
    assert ran == [], "a phase of the reclaimed lease ran"
    assert r.exists(keys.phase("L1")) == 0, "the claim recreated the reclaimed lease's phase hash"
    assert r.hget(keys.job(jid), "state") == "queued"
    kinds = [json.loads(f["e"])["kind"] for _i, f in r.xrange(keys.events)]
    assert "phase_start" not in kinds
