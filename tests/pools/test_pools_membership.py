"""Pools whose membership changed, or whose planner is down (real Redis, in-process planners
that lead as ``makespan planner --pool`` does, dispatch captured): a queued job is never left
in a queue no planner plans (:mod:`makespan.workers.pool_rehome`)."""

from __future__ import annotations

import dataclasses
import json
import time

from makespan.cli_why import explain
from makespan.keys import Keys
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick.clock import ManualClock
from tests.pools.test_pools import FLEET, fleet_data

MOVED_ONLYA = {"a": ["both"], "b": ["onlya", "onlyb", "both"]}  # the fleet file edit: onlya moves to pool b


def _fleet(endpoints: dict[str, list[str]] | None = None, pools: bool = True):
    data = fleet_data(pools=pools)
    for pool in data.get("pools", []):
        pool["endpoints"] = (endpoints or {}).get(pool["name"], pool["endpoints"])
    return parse_fleet(data)


class Planners:
    """One in-process planner per pool of ``fleet`` (the implicit one without pools), on one
    planner clock; ``lead(pool)`` takes that pool's leader lock as the planner process does."""

    def __init__(self, r, settings, fleet, clock: ManualClock | None = None):
        self.r, self.fleet = r, fleet
        self.settings = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0)
        self.clock = clock or ManualClock(time.time() + 3600.0)  # every job is released
        self.sent: dict[str | None, list] = {}
        self.workers: dict[str | None, PlannerWorker] = {}
        self.locks: dict[str | None, object] = {}
        for pool in fleet.pool_names() or [None]:
            self.sent[pool] = []
            self.workers[pool] = PlannerWorker(r, self.settings, fleet, clock=self.clock, pool=pool,
                                               dispatch=lambda ctx, q, pool=pool: self.sent[pool].append((ctx, q)))

    def lead(self, pool: str | None = None) -> PlannerWorker:
        self.locks[pool] = self.workers[pool]._lead()
        return self.workers[pool]

    def step_down(self, pool: str | None = None) -> None:
        self.locks.pop(pool).release()

    def tick(self, pool: str | None = None) -> list[str]:
        """One tick of ``pool``'s planner, a second of its clock later; the jobs it sent."""
        self.clock.advance(1.0)
        before = len(self.sent[pool])
        self.workers[pool].tick()
        return [ctx.job_id for ctx, _q in self.sent[pool][before:]]

    def close(self) -> None:
        for lock in self.locks.values():
            lock.release()
        self.locks.clear()


def _queued_in(r, keys: Keys, job: str) -> str | None:
    """The pool whose NORMAL queue holds ``job`` ('' = the implicit pool's), or None."""
    for pool in ("", "a", "b", "c"):
        if r.zscore(keys.for_pool(pool).queue("NORMAL"), job) is not None:
            return pool
    return None


def _events(r, keys: Keys, kind: str) -> list[dict]:
    return [json.loads(fields["e"]) for _id, fields in r.xrange(keys.events)
            if json.loads(fields["e"])["kind"] == kind]


def test_a_fleet_edit_moving_an_endpoint_to_another_pool_moves_its_queued_jobs_there(r, settings, keys):
    """Pool a's jobs of ``onlya`` were cancelled by pool a's restarted planner ("unknown
    endpoint; known: both") although the new fleet file runs ``onlya`` in pool b."""
    old = Planners(r, settings, FLEET)
    prod = Producer(r, keys, FLEET, old.settings)
    jobs = [prod.submit({"endpoint": "onlya", "service_s": 5}).id for _ in range(2)]
    assert {r.hget(keys.job(j), "pool") for j in jobs} == {"a"}
    new = Planners(r, settings, _fleet(MOVED_ONLYA), old.clock)  # both planners restarted with the edited file
    try:
        new.lead("b")
        new.lead("a")
        assert new.tick("a") == []
        for j in jobs:
            assert r.hget(keys.job(j), "state") == "queued", r.hget(keys.job(j), "reason")
            assert r.hget(keys.job(j), "pool") == "b" and _queued_in(r, keys, j) == "b"
        moved = _events(r, keys, "rerouted")
        assert {(e["job"], e["from"], e["to"]) for e in moved} == {(j, "a", "b") for j in jobs}
        assert sorted(new.tick("b")) == sorted(jobs)  # pool b's planner starts them on its hosts
        assert {q for _ctx, q in new.sent["b"]} <= {"gpu.b1", "gpu.b2"}
    finally:
        new.close()


def test_a_planner_moves_a_job_only_to_a_pool_whose_leader_runs_the_same_fleet_file(r, settings, keys):
    """Pool a runs the edited file, pool b's leader still the old one: pool a does not hand
    pool b a job pool b would hand straight back (each move wakes the other planner)."""
    old = Planners(r, settings, FLEET)
    job = Producer(r, keys, FLEET, old.settings).submit({"endpoint": "onlya", "service_s": 5}).id
    new = Planners(r, settings, _fleet(MOVED_ONLYA), old.clock)
    try:
        old.lead("b")  # pool b not restarted yet
        new.lead("a")
        new.tick("a")
        assert _queued_in(r, keys, job) == "a" and r.hget(keys.job(job), "state") == "queued"
        old.step_down("b")  # pool b restarts with the edited file
        new.lead("b")
        new.tick("a")
        assert _queued_in(r, keys, job) == "b"
        assert new.tick("b") == [job]
    finally:
        old.close()
        new.close()


def test_pools_added_to_a_fleet_without_pools_take_the_jobs_of_the_implicit_queue(r, settings, keys):
    """Jobs queued before ``[[pools]]`` was added stayed in ``P:queue:*``, which no pool's
    planner reads: never planned."""
    plain_fleet = _fleet(pools=False)
    plain = Planners(r, settings, plain_fleet)
    prod = Producer(r, keys, plain_fleet, plain.settings)
    plain.lead()  # it published the fleet without pools
    plain.step_down()
    jobs = {ep: prod.submit({"endpoint": ep, "service_s": 5}).id for ep in ("onlya", "onlyb", "both")}
    assert {_queued_in(r, keys, j) for j in jobs.values()} == {""}
    pooled = Planners(r, settings, FLEET, plain.clock)
    try:
        pooled.lead("a")
        pooled.lead("b")
        started = pooled.tick("a")  # moves each to its pool (and starts pool a's in the same tick)
        assert [r.hget(keys.job(jobs[ep]), "pool") for ep in ("onlya", "onlyb")] == ["a", "b"]
        assert r.hget(keys.job(jobs["both"]), "pool") in ("a", "b") and r.zcard(keys.queue("NORMAL")) == 0
        started += pooled.tick("b")
        assert sorted(started) == sorted(jobs.values())
    finally:
        pooled.close()


def test_pools_removed_from_the_fleet_file_their_queued_and_later_requeued_jobs_reach_the_planner(r, settings, keys):
    """Pools removed: jobs queued in ``P:pool:*`` and a job whose lease is reclaimed after the
    change (its record names pool a, so the requeue put it in pool a's queue) were never
    planned by the implicit pool's planner."""
    pooled = Planners(r, settings, FLEET)
    prod = Producer(r, keys, FLEET, pooled.settings)
    try:
        pooled.lead("a")
        pooled.lead("b")
        leased = prod.submit({"endpoint": "onlya", "service_s": 5}).id
        assert pooled.tick("a") == [leased]
        queued = [prod.submit({"endpoint": ep, "service_s": 5}).id for ep in ("onlya", "onlyb")]
    finally:
        pooled.close()
    plain = Planners(r, settings, _fleet(pools=False), pooled.clock)
    try:
        plain.lead()
        assert sorted(plain.tick()) == sorted(queued)  # moved to P:queue:* and started in the same tick
        assert all(r.hget(keys.job(j), "pool") is None for j in queued)
        ((ctx, _q),) = pooled.sent["a"]
        r.zadd(keys.leases, {ctx.lease_id: 1})  # its lease expires (no GPU worker here)
        plain.tick()  # reclaimed: back in pool a's queue, which this planner does not read
        assert r.hget(keys.job(leased), "state") == "queued"
        assert plain.tick() == [leased]
    finally:
        plain.close()


def test_a_job_whose_pool_has_no_leader_goes_to_a_leading_pool_that_serves_its_endpoint(r, settings, keys):
    """Routed to pool a while its offer was live, then pool a's planner stopped (no standby):
    the job waited forever although pool b serves its endpoint and is idle. A job only pool
    a serves waits, and ``makespan why`` names the pool without a planner."""
    planners = Planners(r, settings, FLEET)
    prod = Producer(r, keys, FLEET, planners.settings)
    try:
        planners.lead("a")
        planners.tick("a")  # pool a's offer is live, pool b has none yet: a job of both goes to a
        planners.step_down("a")  # pool a's planner stops
        shared = prod.submit({"endpoint": "both", "service_s": 5}).id
        own = prod.submit({"endpoint": "onlya", "service_s": 5}).id
        assert r.hget(keys.job(shared), "pool") == "a"
        planners.lead("b")
        assert planners.tick("b") == [shared]
        assert r.hget(keys.job(shared), "pool") == "b"
        assert [(e["from"], e["to"]) for e in _events(r, keys, "rerouted")] == [("a", "b")]
        assert _queued_in(r, keys, own) == "a"
        why = explain(r, keys, planners.settings, own)
        assert why["reason"] == "no_planner" and "pool a" in why["detail"], why
    finally:
        planners.close()


def test_a_leading_pools_jobs_are_not_taken_by_another_pool(r, settings, keys):
    planners = Planners(r, settings, FLEET)
    prod = Producer(r, keys, FLEET, planners.settings)
    try:
        planners.lead("a")
        for _ in range(2):
            prod.submit({"endpoint": "onlya", "service_s": 500})
        planners.tick("a")  # pool a is full; its offer is live, pool b has none yet
        waiting = prod.submit({"endpoint": "both", "service_s": 5}).id
        assert r.hget(keys.job(waiting), "pool") == "a"
        planners.lead("b")
        assert planners.tick("b") == []  # pool a leads: its job stays there, for its planner to plan
        assert _queued_in(r, keys, waiting) == "a" and _events(r, keys, "rerouted") == []
    finally:
        planners.close()


def test_the_dashboard_lists_a_delayed_job_once_with_its_own_pool(r, settings, keys):
    """The delayed set is shared by every pool: each pool's queue listed every delayed job,
    so with two pools each appeared twice, once under the wrong pool, and counted twice."""
    from makespan.dashboard.state import snapshot

    r.set(keys.fleet, FLEET.model_dump_json())  # what a leading planner publishes
    prod = Producer(r, keys, FLEET, settings)
    later = prod.submit({"endpoint": "onlyb", "service_s": 5, "delay_s": 600}).id
    now = prod.submit({"endpoint": "onlya", "service_s": 5}).id
    view = snapshot(r, keys)
    assert sorted((q["job"], q["pool"], q["state"]) for q in view["queue"]) == sorted(
        [(later, "b", "delayed"), (now, "a", "queued")])
    assert view["counts"]["delayed"] == 1 and view["counts"]["queued"] == 1
    assert {p["name"]: p["queued"] for p in view["pools"]} == {"a": 1, "b": 1}


def test_a_leaderless_pools_jobs_behind_a_batch_of_jobs_no_other_pool_serves_are_taken(r, settings, keys):
    """Pool b's planner read only the first ``batch_size`` entries of the leaderless pool a's
    queue: jobs of ``onlya`` (which pool b does not serve) at its head hid the ``both`` job
    behind them for good."""
    planners = Planners(r, dataclasses.replace(settings, batch_size=2), FLEET)
    prod = Producer(r, keys, FLEET, planners.settings)
    try:
        planners.lead("a")
        planners.tick("a")  # pool a's offer is live, pool b has none yet: a job of both goes to a
        planners.step_down("a")  # pool a's planner stops
        own = [prod.submit({"endpoint": "onlya", "service_s": 5}).id for _ in range(3)]
        shared = prod.submit({"endpoint": "both", "service_s": 5}).id
        assert r.hget(keys.job(shared), "pool") == "a"
        planners.lead("b")
        started = [job for _ in range(3) for job in planners.tick("b")]  # a look a second
        assert started == [shared] and r.hget(keys.job(shared), "pool") == "b"
        assert {_queued_in(r, keys, job) for job in own} == {"a"}  # they wait for pool a's planner
    finally:
        planners.close()


def test_jobs_of_a_pool_gone_from_the_file_go_to_a_pool_a_planner_leads(r, settings, keys):
    """Pools declared with jobs queued in the implicit pool: pool b's planner, started first,
    moved them into pool a (file order: no pool had an offer yet), where no planner led, and
    its next tick moved them back (an SRE's report). They go to a led pool at once."""
    plain = Planners(r, settings, _fleet(pools=False))
    prod = Producer(r, keys, plain.fleet, plain.settings)
    jobs = [prod.submit({"endpoint": "both", "service_s": 5}).id for _ in range(3)]
    pooled = Planners(r, settings, FLEET, plain.clock)
    try:
        pooled.lead("b")  # pool a's planner has not started yet
        pooled.tick("b")
        assert all(_queued_in(r, keys, j) in ("b", None) for j in jobs)  # queued in b, or started by b
        assert {r.hget(keys.job(j), "pool") for j in jobs} == {"b"}
        assert {e["to"] for e in _events(r, keys, "rerouted")} == {"b"}  # never through pool a
    finally:
        pooled.close()
