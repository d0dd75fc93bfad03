"""The whole path on real processes: submit → queues → planner → leases → Celery GPU
workers → drain. Real Redis, real planner and worker processes (simulated endpoints)."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.run_report import drain_counts
from tests.live import all_events, overlaps, stop_checked, wait_for

FLEET = Path("examples/render-pipeline.toml").resolve()
TERMINAL = ("completed", "failed", "cancelled")


@pytest.fixture
def fleet():
    return load_fleet(FLEET)


@pytest.fixture
def system(settings, fleet, tmp_path):
    sys_ = LiveSystem(FLEET, fleet, settings, tmp_path / "logs")
    yield sys_
    stop_checked(sys_)


def _states(r, keys, ids):
    p = r.pipeline(transaction=False)
    for j in ids:
        p.hget(keys.job(j), "state")
    return p.execute()


def _wait_done(r, keys, ids, timeout_s):
    wait_for(lambda: all(s in TERMINAL for s in _states(r, keys, ids)), timeout_s, "jobs to finish", 0.25)


def _wait_drained(r, keys, fleet, timeout_s=30):
    """Wait for the planner's drain check made after the last job ended (it checks only
    once the fleet is idle and back at its set point: an earlier check, or a moment with
    no lease between a job's end and its group's restore, is not the end) to find nothing,
    and for the counts read here to be zero too."""
    last = max(e["ts"] for e in all_events(r, keys) if e["kind"] in ("completed", "failed", "cancelled"))

    def ok():
        rec = r.hgetall(keys.drain)
        if not rec.get("checked_at") or float(rec["checked_at"]) < last:
            return False
        d = drain_counts(r, keys, fleet)
        keys_ = ("leases", "agenda_entries", "busy_slots")
        return not any(int(rec[k]) for k in keys_) and not any(d[k] for k in keys_)
    wait_for(ok, timeout_s, "a drain check after the last job to find nothing")


def test_200_mixed_jobs_complete_and_drain(r, keys, settings, fleet, system):
    system.start()
    prod = Producer(r, keys, fleet, settings)
    rng = random.Random(7)
    eps = sorted(fleet.endpoints)
    ids = []
    for i in range(200):
        h = prod.submit({"endpoint": rng.choice(eps), "service_s": rng.uniform(5, 40),
                         "priority": rng.choice(["CRITICAL", "HIGH", "NORMAL", "LOW"]),
                         "idempotency_key": f"mixed-{i}"})
        ids.append(h.id)
    _wait_done(r, keys, ids, 240)
    assert _states(r, keys, ids) == ["completed"] * 200
    _wait_drained(r, keys, fleet)
    evs = all_events(r, keys)
    assert overlaps(evs) == []
    # the health observer ran throughout: no planned eviction or start raised an incident
    from makespan.workers.observer import list_incidents
    incidents = [i for i in list_incidents(r, keys) if i.get("kind") == "incident"]
    assert incidents == [], [(i["endpoint"], i["failure_mode"], i["effect"], i["agenda_context"], i["detected_at"])
                             for i in incidents]
    # every endpoint back at its set point
    from makespan.workers.phases import instance_value
    from makespan.workers.fleet_view import set_point_instances
    for ep, gpus in set_point_instances(fleet):
        assert r.mget([keys.resident(g) for g in gpus]) == [instance_value(ep, gpus)] * len(gpus)
    # every lease ran its phases in order (a preempted one stops early); the lease that
    # completed its job ran all four
    order = ["evict", "start_endpoint", "execute", "clear"]
    by_lease, final = {}, {}
    for e in evs:
        if e["kind"] == "phase_end" and e.get("job"):
            by_lease.setdefault(e["lease"], []).append(e["phase"])
        if e["kind"] == "completed":
            final[e["job"]] = e["lease"]
    assert all(ph == order[:len(ph)] for ph in by_lease.values())
    assert all(by_lease[final[j]] == order for j in ids)
    preempted = [e for e in evs if e["kind"] == "preempted"]
    assert all(e["priority"] in ("HIGH", "NORMAL", "LOW") for e in preempted)


def test_strict_priority_under_load(r, keys, settings, fleet, system):
    prod = Producer(r, keys, fleet, settings)
    low = [prod.submit({"endpoint": "embed", "service_s": 200, "priority": "LOW"}).id for _ in range(40)]
    system.start()
    wait_for(lambda: sum(1 for s in _states(r, keys, low) if s in ("leased", "running")) == 8, 30,
             "LOW jobs to occupy all 8 GPUs")
    crit = prod.submit({"endpoint": "embed", "service_s": 200, "priority": "CRITICAL"}).id
    t_sub = time.time()
    wait_for(lambda: r.hget(keys.job(crit), "state") in ("leased", "running", "completed"), 60, "CRITICAL to start")
    leases = [e for e in all_events(r, keys) if e["kind"] == "leased"]
    crit_ts = next(e["ts"] for e in leases if e["job"] == crit)
    # A planner tick already in flight when the CRITICAL job arrived may still lease a LOW
    # job; every later lease must wait for the CRITICAL one.
    settle_s = 10 * settings.planner_tick_s
    overtaken = [e["job"] for e in leases if e["job"] != crit and t_sub + settle_s < e["ts"] < crit_ts]
    assert overtaken == [], "LOW jobs were leased ahead of a waiting CRITICAL job"
    assert len([e for e in leases if t_sub < e["ts"] < crit_ts]) <= 1


def test_planner_kill_standby_takes_over(r, keys, settings, fleet, tmp_path):
    sys_ = LiveSystem(FLEET, fleet, settings, tmp_path / "logs", planners=2)
    try:
        sys_.start()
        def leads():
            return [e for e in all_events(r, keys) if e["kind"] == "planner_lead"]

        first = wait_for(leads, 20, "a planner to lead")[0]
        prod = Producer(r, keys, fleet, settings)
        before = [prod.submit({"endpoint": "chat", "service_s": 20}).id for _ in range(5)]
        _wait_done(r, keys, before, 60)
        leader = next(p for p in sys_.procs if p.popen.pid == first["pid"])
        standby = next(p for p in sys_.procs if p.name.startswith("planner-") and p is not leader)
        sys_.kill(leader.name, signal.SIGKILL)  # its lock is never released: the TTL must run out
        killed_at = time.time()
        after = [prod.submit({"endpoint": "chat", "service_s": 20}).id for _ in range(5)]
        took = wait_for(lambda: [e for e in leads() if e["ts"] > killed_at], 30, "the standby to lead")[0]
        assert took["pid"] == standby.popen.pid
        assert took["token"] > first["token"]  # a fresh planner fencing token
        lock_ttl_s = max(settings.lease_ttl_s / 2, 1.0)
        assert took["ts"] - killed_at <= lock_ttl_s + 3.0  # the TTL, not a lost lock (a loaded host: slack)
        _wait_done(r, keys, after, 60)
        assert _states(r, keys, before + after) == ["completed"] * 10
        assert overlaps(all_events(r, keys)) == []
    finally:
        stop_checked(sys_)


def test_gpu_worker_sigkill_mid_phase_recovers(r, keys, settings, fleet, system):
    system.start()
    prod = Producer(r, keys, fleet, settings)
    job = prod.submit({"endpoint": "embed", "service_s": 400, "priority": "HIGH"}).id  # 4 s of wall time
    wait_for(lambda: r.hget(keys.job(job), "state") == "running", 30, "the job to execute")
    host = r.hget(keys.lease(r.hget(keys.job(job), "lease")), "holder")
    killed = system.kill(f"gpu-{host}", signal.SIGKILL)
    assert killed
    t_kill = time.time()
    system.start_gpu_worker(host, n=1)
    _wait_done(r, keys, [job], 60)
    rec = r.hgetall(keys.job(job))
    assert rec["state"] == "completed"
    # reclaimed at least once (a second time if the restarted worker was not consuming
    # yet when the job was leased again), then ran to completion
    assert 1 <= int(rec["attempts"]) < settings.max_attempts
    evs = all_events(r, keys)
    reclaimed = [e for e in evs if e["kind"] == "reclaimed" and e.get("job") == job]
    assert reclaimed and reclaimed[0]["outcome"] == "requeued" and reclaimed[0]["ts"] >= t_kill
    assert overlaps(evs) == []
    _wait_drained(r, keys, fleet)
