"""Pools with real processes (issue 21 point 3's test): two pools on one Redis and one
Celery, a planner each plus a standby for pool a, a GPU worker per host.

* Jobs for both pools complete; pool a's leader is SIGKILLed: its standby takes over with a
  new fencing token and pool a's jobs complete, while pool b went on (its jobs complete
  before pool a has a new leader, and its token never changes).
* A job whose endpoint both pools serve goes to the pool that can start it first.
* No job is lost or run twice (one ``completed`` event and one execute phase each), and no
  GPU is held by two leases at once.
"""

from __future__ import annotations

import dataclasses
import json
import signal
from collections import Counter

from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from tests.live import all_events, overlaps, wait_for

FLEET = """
name = "two-pools"
[[hosts]]
name = "a1"
gpu_count = 1
memory_mib = 80000
[[hosts]]
name = "a2"
gpu_count = 1
memory_mib = 80000
[[hosts]]
name = "b1"
gpu_count = 1
memory_mib = 80000
[[hosts]]
name = "b2"
gpu_count = 1
memory_mib = 80000
[endpoints.onlya]
model = "sim/onlya"
memory_mib_per_gpu = 10000
cold_start_s = 5
evict_s = 1
[endpoints.onlyb]
model = "sim/onlyb"
memory_mib_per_gpu = 10000
cold_start_s = 5
evict_s = 1
[endpoints.both]
model = "sim/both"
memory_mib_per_gpu = 10000
cold_start_s = 5
evict_s = 1
[[pools]]
name = "a"
hosts = ["a1", "a2"]
endpoints = ["onlya", "both"]
[[pools]]
name = "b"
hosts = ["b1", "b2"]
endpoints = ["onlyb", "both"]
"""


def _leads(r, keys, pool):
    """(planner name, token) of each planner_lead event of ``pool``, in order."""
    return [(e["planner"], int(e["token"])) for e in all_events(r, keys)
            if e.get("kind") == "planner_lead" and e.get("pool") == pool]


def _states(r, keys, jobs):
    pipe = r.pipeline(transaction=False)
    for job in jobs:
        pipe.hget(keys.job(job), "state")
    return Counter(pipe.execute())


def _all_completed(r, keys, jobs):
    return _states(r, keys, jobs) == Counter({"completed": len(jobs)})


def _check_once_each(r, keys, jobs):
    evs = all_events(r, keys)
    done = Counter(e.get("job") for e in evs if e["kind"] == "completed")
    execd = Counter(e.get("job") for e in evs if e["kind"] == "phase_end" and e.get("phase") == "execute")
    assert all(done[j] == 1 and execd[j] == 1 for j in jobs), {j: (done[j], execd[j]) for j in jobs
                                                               if done[j] != 1 or execd[j] != 1}
    assert overlaps(evs) == []


def _system(tmp_path, settings):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=6.0)  # planner lock TTL 3 s
    return fleet, s, LiveSystem(path, fleet, s, tmp_path / "logs", planners=1, observer=False)


def test_a_killed_pool_leader_is_replaced_by_its_standby_while_the_other_pool_goes_on(r, keys, settings, tmp_path):
    fleet, s, system = _system(tmp_path, settings)
    system.start(wait_s=120)
    try:
        wait_for(lambda: _leads(r, keys, "a") and _leads(r, keys, "b"), 60, "a leader in each pool")
        standby = system.start_planner(1, "a")  # stands by: pool a's lock is held
        prod = Producer(r, keys, fleet, s)
        first = [prod.submit({"endpoint": ep, "service_s": 20}).id for ep in ("onlya", "onlyb") for _ in range(6)]
        wait_for(lambda: _all_completed(r, keys, first), 120, "the first jobs of both pools to complete")
        leader_a, token_a = _leads(r, keys, "a")[-1]
        leader_b, token_b = _leads(r, keys, "b")[-1]
        killed = next(p for p in system.procs if p.name.startswith("planner-a-") and
                      leader_a.startswith(f"planner-{p.popen.pid}-"))
        assert killed is not standby  # the standby started after the first leader took the lock
        # the leader dies with pool a's jobs running and queued (2 GPUs, 6 jobs), not between them
        for_a = [prod.submit({"endpoint": "onlya", "service_s": 20}).id for _ in range(6)]
        wait_for(lambda: _states(r, keys, for_a)["queued"] < 6, 60, "pool a's leader to lease some of its jobs")
        system.kill(killed.name, signal.SIGKILL)
        killed.popen.wait(timeout=30)
        for_b = [prod.submit({"endpoint": "onlyb", "service_s": 20}).id for _ in range(6)]
        assert {r.hget(keys.job(j), "pool") for j in for_a} == {"a"}
        # pool b goes on: its jobs complete, and pool a has no new leader before the lock's TTL
        wait_for(lambda: _all_completed(r, keys, for_b), 120, "pool b's jobs to complete")
        wait_for(lambda: _leads(r, keys, "a")[-1][1] > token_a, 60, "pool a's standby to take over")
        leader_a2, token_a2 = _leads(r, keys, "a")[-1]
        assert leader_a2.startswith(f"planner-{standby.popen.pid}-") and token_a2 > token_a
        assert _leads(r, keys, "b")[-1] == (leader_b, token_b)  # pool b's leader never changed
        wait_for(lambda: _all_completed(r, keys, for_a), 120, "pool a's jobs to complete under its new leader")
        jobs = first + for_a + for_b
        _check_once_each(r, keys, jobs)
        hosts = {e["job"]: e["host"] for e in all_events(r, keys) if e["kind"] == "phase_end" and
                 e.get("phase") == "execute"}
        assert {hosts[j] for j in for_a} <= {"a1", "a2"} and {hosts[j] for j in for_b} <= {"b1", "b2"}
    finally:
        system.stop()


def test_a_job_both_pools_serve_goes_to_the_pool_that_can_start_it_first(r, keys, settings, tmp_path):
    fleet, s, system = _system(tmp_path, settings)
    system.start(wait_s=120)
    try:
        wait_for(lambda: r.exists(keys.for_pool("a").pool_offer, keys.for_pool("b").pool_offer) == 2, 60,
                 "both pools' offers")
        prod = Producer(r, keys, fleet, s)
        # pool a's two GPUs are taken by long jobs: a job of `both` can start now only in pool b
        long_a = [prod.submit({"endpoint": "onlya", "service_s": 1500}).id for _ in range(2)]
        wait_for(lambda: _states(r, keys, long_a)["running"] == 2, 60, "pool a's long jobs to run")
        wait_for(lambda: json.loads(r.get(keys.for_pool("a").pool_offer) or '{"free": {"x": 1}}')["free"] == {},
                 30, "pool a's offer to show no free GPU")
        to_b = prod.submit({"endpoint": "both", "service_s": 20}).id
        assert r.hget(keys.job(to_b), "pool") == "b"
        wait_for(lambda: _all_completed(r, keys, [to_b] + long_a), 120, "the jobs to complete")
        # both pools idle now; pool b keeps an idle warm instance of `both`: the next one goes there
        wait_for(lambda: json.loads(r.get(keys.for_pool("b").pool_offer) or "{}").get("warm", {}).get("both"), 30,
                 "pool b's offer to show its warm `both` instance")
        wait_for(lambda: len(json.loads(r.get(keys.for_pool("a").pool_offer) or "{}").get("free", {})) == 2, 30,
                 "pool a's GPUs free again")
        warm = prod.submit({"endpoint": "both", "service_s": 20}).id
        assert r.hget(keys.job(warm), "pool") == "b"
        # pool b's GPUs taken: the next `both` job goes to pool a
        long_b = [prod.submit({"endpoint": "onlyb", "service_s": 1500}).id for _ in range(2)]
        wait_for(lambda: _states(r, keys, long_b)["running"] == 2 and _all_completed(r, keys, [warm]), 60,
                 "pool b's long jobs to run")
        wait_for(lambda: json.loads(r.get(keys.for_pool("b").pool_offer) or '{"free": {"x": 1}}')["free"] == {},
                 30, "pool b's offer to show no free GPU")
        to_a = prod.submit({"endpoint": "both", "service_s": 20}).id
        assert r.hget(keys.job(to_a), "pool") == "a"
        jobs = long_a + [to_b, warm] + long_b + [to_a]
        wait_for(lambda: _all_completed(r, keys, jobs), 120, "every job to complete")
        _check_once_each(r, keys, jobs)
    finally:
        system.stop()
