"""Pools (issue 21 point 3): the fleet file's ``[[pools]]``, the routing rule, and one planner
per pool on the same Redis (real Redis, the real tick, dispatch captured)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.errors import ValidationError
from makespan.keys import Keys
from makespan.models import parse_fleet
from makespan.pools import PoolChoice, PoolOffer, choose_pool
from makespan.producer import Producer
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick.clock import ManualClock


def fleet_data(pools=True) -> dict:
    """Hosts a1, a2 (pool a) and b1, b2 (pool b), one 80 GB GPU each; ``onlya`` and
    ``onlyb`` served by one pool, ``both`` by both."""
    data = {
        "name": "two-pools",
        "hosts": [{"name": h, "gpu_count": 1, "memory_mib": 80000} for h in ("a1", "a2", "b1", "b2")],
        "endpoints": {name: {"model": f"sim/{name}", "memory_mib_per_gpu": 10000, "cold_start_s": 5, "evict_s": 1}
                      for name in ("onlya", "onlyb", "both")},
    }
    if pools:
        data["pools"] = [{"name": "a", "hosts": ["a1", "a2"], "endpoints": ["onlya", "both"]},
                         {"name": "b", "hosts": ["b1", "b2"], "endpoints": ["onlyb", "both"]}]
    return data


FLEET = parse_fleet(fleet_data())


# -- the fleet file ------------------------------------------------------------------------

def test_pools_split_the_fleet_and_each_pool_fleet_holds_only_its_hosts():
    assert FLEET.pool_names() == ["a", "b"]
    assert FLEET.pools_serving("both") == ["a", "b"] and FLEET.pools_serving("onlyb") == ["b"]
    sub = FLEET.pool_fleet("a")
    assert [h.name for h in sub.hosts] == ["a1", "a2"] and sorted(sub.endpoints) == ["both", "onlya"]
    assert sub.pools == () and FLEET.pool_of_host("b2") == "b"
    no_pools = parse_fleet(fleet_data(pools=False))
    assert no_pools.pools_serving("both") == [] and no_pools.pool_of_host("a1") is None


def test_a_pool_without_endpoints_serves_every_endpoint_that_fits_its_hosts():
    data = fleet_data()
    data["pools"][1] = {"name": "b", "hosts": ["b1", "b2"]}
    assert parse_fleet(data).pool_endpoints("b") == ["onlya", "onlyb", "both"]


@pytest.mark.parametrize(("change", "field", "words"), [
    (lambda d: d["pools"][1]["hosts"].append("a1"), "pools.b.hosts", "already in pool 'a'"),
    (lambda d: d["pools"][1]["hosts"].remove("b2"), "pools", "in none: b2"),
    (lambda d: d["pools"][0]["hosts"].append("zz"), "pools.a.hosts", "unknown host"),
    (lambda d: d["pools"][0]["endpoints"].append("nope"), "pools.a.endpoints", "unknown endpoint"),
    (lambda d: d["pools"][1].update(name="a"), "pools.name", "unique"),
    (lambda d: d["pools"][1].update(name="b:x"), "fleet.pools.1.name", "pool names use"),
    (lambda d: d["pools"][1].update(endpoints=["both"]), "pools", "no pool serves endpoint(s) onlyb"),
    (lambda d: d["pools"][0].update(hosts=[]), "fleet.pools.0.hosts", "at least 1"),
])
def test_fleet_pool_errors_name_the_field_and_the_reason(change, field, words):
    data = fleet_data()
    change(data)
    with pytest.raises(ValidationError) as err:
        parse_fleet(data)
    assert err.value.field == field and words in str(err.value), str(err.value)


def test_an_endpoint_whose_gang_fits_no_host_of_the_pool_is_refused():
    data = fleet_data()
    data["hosts"].append({"name": "a3", "gpu_count": 2, "memory_mib": 80000})
    data["pools"][0]["hosts"].append("a3")
    data["endpoints"]["wide"] = {"model": "sim/wide", "memory_mib_per_gpu": 10000, "cold_start_s": 5,
                                 "tensor_parallel": 2}
    data["pools"][1]["endpoints"].append("wide")
    with pytest.raises(ValidationError, match="pools.b.endpoints: no host of the pool has"):
        parse_fleet(data)


def test_a_planner_needs_pool_on_a_fleet_with_pools(r, settings):
    with pytest.raises(ValidationError, match="run one planner per pool with --pool NAME"):
        PlannerWorker(r, settings, FLEET)
    with pytest.raises(ValidationError, match="unknown pool; known: a, b"):
        PlannerWorker(r, settings, FLEET, pool="c")
    with pytest.raises(ValidationError, match="this fleet declares no pools"):
        PlannerWorker(r, settings, parse_fleet(fleet_data(pools=False)), pool="a")


def test_pool_keys_are_scoped_and_the_implicit_pool_keeps_todays_keys():
    keys = Keys("p")
    assert keys.queue("HIGH") == "p:queue:high" and keys.planner_leader == "p:planner:leader"
    west = keys.for_pool("west")
    assert west.queue("HIGH") == "p:pool:west:queue:high" and west.planner_fence == "p:pool:west:planner:fence"
    assert west.job("j") == keys.job("j") and west.leases == keys.leases and west.delayed == keys.delayed
    assert keys.for_pool(None) == keys and keys.for_pool("") == keys


# -- the routing rule ----------------------------------------------------------------------

def _offer(pool, free=None, warm=None) -> PoolOffer:
    return PoolOffer(pool, 2, free or {}, warm or {}, 0.0)


def test_the_rule_prefers_a_pool_that_can_start_it_now_then_warm_then_least_loaded():
    busy_a = PoolChoice("a", 2, _offer("a"), ahead=0, queued=0)
    free_b = PoolChoice("b", 2, _offer("b", free={"b1": [0]}), ahead=0, queued=0)
    assert choose_pool(FLEET, "both", [busy_a, free_b]) == "b"
    # a free pool whose queue at this level already holds as many jobs as it has room: not "now"
    crowded_b = dataclasses.replace(free_b, ahead=1, queued=1)
    assert choose_pool(FLEET, "both", [busy_a, crowded_b]) == "a"  # least loaded: 2/2 held vs (1 + 1)/2
    warm_a = PoolChoice("a", 2, _offer("a", free={"a1": [0]}, warm={"both": 1}), ahead=0, queued=0)
    roomy_b = PoolChoice("b", 2, _offer("b", free={"b1": [0], "b2": [0]}), ahead=0, queued=0)
    assert choose_pool(FLEET, "both", [roomy_b, warm_a]) == "a"  # warm first
    assert choose_pool(FLEET, "both", [dataclasses.replace(warm_a, offer=_offer("a", free={"a1": [0]})),
                                       roomy_b]) == "b"  # more room
    dead_b = PoolChoice("b", 2, None, ahead=0, queued=0)
    assert choose_pool(FLEET, "both", [busy_a, dead_b]) == "a"  # a pool without a live offer is skipped
    assert choose_pool(FLEET, "both", [PoolChoice("a", 2, None, 0, 5), dead_b]) == "b"  # none live: least queued


# -- planners per pool on one Redis ----------------------------------------------------------

def _planners(r, settings):
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0)
    sent: dict[str, list] = {"a": [], "b": []}
    clock = ManualClock(time.time() + 3600.0)  # every job is released
    workers = {pool: PlannerWorker(r, s, FLEET, dispatch=lambda ctx, q, pool=pool: sent[pool].append((ctx, q)),
                                   clock=clock, pool=pool) for pool in ("a", "b")}
    return workers, Producer(r, Keys(s.key_prefix), FLEET, s), sent


def test_each_pools_planner_plans_its_own_queue_on_its_own_hosts(r, settings, keys):
    workers, prod, sent = _planners(r, settings)
    for_a = [prod.submit({"endpoint": "onlya", "service_s": 5}).id for _ in range(3)]
    for_b = [prod.submit({"endpoint": "onlyb", "service_s": 5}).id for _ in range(3)]
    assert r.zcard(keys.for_pool("a").queue("NORMAL")) == 3 and r.zcard(keys.queue("NORMAL")) == 0
    assert {r.hget(keys.job(j), "pool") for j in for_a} == {"a"}
    workers["a"].tick()
    assert {ctx.job_id for ctx, _q in sent["a"]} <= set(for_a) and len(sent["a"]) == 2  # two GPUs in pool a
    assert {q for _ctx, q in sent["a"]} <= {"gpu.a1", "gpu.a2"}
    assert r.zcard(keys.for_pool("b").queue("NORMAL")) == 3  # pool b's planner has not ticked
    workers["b"].tick()
    assert {ctx.job_id for ctx, _q in sent["b"]} <= set(for_b) and {q for _c, q in sent["b"]} <= {"gpu.b1", "gpu.b2"}
    offer = json.loads(r.get(keys.for_pool("a").pool_offer))
    assert offer["pool"] == "a" and offer["free"] == {} and offer["gpus"] == 2  # both GPUs leased this tick


def test_a_both_pools_job_goes_to_the_pool_with_free_gpus_and_a_reclaim_requeues_it_there(r, settings, keys):
    workers, prod, sent = _planners(r, settings)
    for _ in range(2):
        prod.submit({"endpoint": "onlya", "service_s": 5})
    workers["a"].tick()  # pool a's two GPUs are leased; its offer says so
    workers["b"].tick()  # pool b is idle: its offer has two free GPUs
    job = prod.submit({"endpoint": "both", "service_s": 5}).id
    assert r.hget(keys.job(job), "pool") == "b"
    workers["b"].tick()
    ((ctx, queue),) = sent["b"]
    assert ctx.job_id == job and queue in ("gpu.b1", "gpu.b2")
    # its lease expires (no GPU worker here): whichever planner reclaims it, it goes back to pool b's queue
    r.zadd(keys.leases, {ctx.lease_id: 1})
    workers["a"].tick()
    assert r.hget(keys.job(job), "state") == "queued"
    assert r.zscore(keys.for_pool("b").queue("NORMAL"), job) is not None
    assert r.zscore(keys.for_pool("a").queue("NORMAL"), job) is None
    assert r.llen(keys.for_pool("b").planner_wake) >= 1  # pool b's planner is woken


def test_without_pools_submit_and_keys_are_unchanged(r, settings, keys):
    fleet = parse_fleet(fleet_data(pools=False))
    job = Producer(r, keys, fleet, settings).submit({"endpoint": "both", "service_s": 5}).id
    assert r.hget(keys.job(job), "pool") is None and r.zscore(keys.queue("NORMAL"), job) is not None


def test_jobs_lists_a_job_queued_before_the_fleet_declared_pools(r, settings, keys):
    """Submitted on a fleet without pools, then the fleet file gains ``[[pools]]`` and no
    planner has routed it yet: ``makespan jobs`` still lists it (a review found it hidden)."""
    from makespan.cli_why import list_jobs

    job = Producer(r, keys, parse_fleet(fleet_data(pools=False)), settings).submit(
        {"endpoint": "both", "service_s": 5}).id
    r.set(keys.fleet, FLEET.model_dump_json())  # the new planners published the pooled fleet
    assert [j["id"] for j in list_jobs(r, keys, settings, ("queued",))] == [job]


def test_the_dashboard_and_why_read_every_pool(r, settings, keys, redis_url, prefix):
    from makespan.cli_why import explain, list_jobs
    from makespan.dashboard.state import snapshot

    workers, prod, _sent = _planners(r, settings)
    r.set(keys.fleet, FLEET.model_dump_json())  # what a leading planner publishes
    jobs = [prod.submit({"endpoint": ep, "service_s": 5}).id for ep in ("onlya", "onlya", "onlya", "onlyb")]
    workers["a"].tick()  # two of pool a's jobs start, the third waits; pool b has not ticked
    view = snapshot(r, keys)
    assert {(q["job"], q["pool"]) for q in view["queue"]} >= {(jobs[3], "b")}
    assert sorted(p["name"] for p in view["pools"]) == ["a", "b"] and view["plan"]["batch"] == 3
    assert [j["id"] for j in list_jobs(r, keys, settings, ("queued",))].count(jobs[3]) == 1
    assert explain(r, keys, settings, jobs[3])["state"] == "queued"
    # every pool's queued jobs without --pool (the first pool's too), a pool's alone with it,
    # and each job's pool in the JSON of why/jobs
    unfiltered = [j["id"] for j in list_jobs(r, keys, settings, ("queued",))]
    assert unfiltered.count(jobs[3]) == 1 and any(r.hget(keys.job(j), "pool") == "a" for j in unfiltered)
    assert [j["id"] for j in list_jobs(r, keys, settings, ("queued",), pool="b")] == [jobs[3]]
    assert jobs[3] not in [j["id"] for j in list_jobs(r, keys, settings, ("queued",), pool="a")]
    assert explain(r, keys, settings, jobs[3])["pool"] == "b"
    with pytest.raises(ValidationError, match="known: a, b"):
        list_jobs(r, keys, settings, ("queued",), pool="c")
    with pytest.raises(ValidationError, match="known: a, b"):  # `--pool ''`: not every pool
        list_jobs(r, keys, settings, ("queued",), pool="")
    # the listing shows each job's pool in a POOL column when the jobs are routed to pools
    listed = CliRunner().invoke(cli_app, ["jobs", "--state", "queued"],
                                env={"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix})
    assert listed.exit_code == 0, listed.output
    header, *lines = listed.output.splitlines()
    assert header.split()[:5] == ["ID", "PRIORITY", "ENDPOINT", "POOL", "STATE"]
    assert any(line.split()[:5] == [jobs[3], "NORMAL", "onlyb", "b", "queued"] for line in lines), listed.output
    # an endpoint the pool does not serve: nothing can list, and the warning says where its jobs go
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    crossed = CliRunner().invoke(cli_app, ["jobs", "--endpoint", "onlya", "--pool", "b"], env=env)
    assert crossed.exit_code == 0 and "pool 'b' does not serve endpoint 'onlya'" in crossed.output, crossed.output
    assert "its jobs go to 'a'" in crossed.output
    served = CliRunner().invoke(cli_app, ["jobs", "--endpoint", "onlyb", "--pool", "b"], env=env)
    assert served.exit_code == 0 and "warning" not in served.output and jobs[3] in served.output, served.output


def test_a_workloads_steps_go_to_their_pools_and_a_cancel_takes_them_out(r, settings, keys):
    from makespan.workloads import cancel_workload, submit_workload, workload_status

    wl = {"name": "w", "steps": [{"name": "first", "endpoint": "onlya", "service_s": 1},
                                 {"name": "second", "endpoint": "onlyb", "service_s": 1, "depends_on": ["first"]}]}
    wid = submit_workload(r, keys, FLEET, wl, settings)
    steps = workload_status(r, keys, wid)["steps"]
    first, second = steps["first"]["job"], steps["second"]["job"]
    assert r.zscore(keys.for_pool("a").queue("NORMAL"), first) is not None
    assert r.zscore(keys.for_pool("b").queue("NORMAL"), second) is not None
    assert r.hget(keys.job(second), "pool") == "b" and r.zcard(keys.queue("NORMAL")) == 0
    assert cancel_workload(r, keys, wid)["cancelled"] == 2
    assert r.zcard(keys.for_pool("a").queue("NORMAL")) == 0 and r.zcard(keys.for_pool("b").queue("NORMAL")) == 0


def test_a_critical_workloads_steps_take_the_critical_lane_of_their_own_pool(r, settings, keys):
    """Each CRITICAL step reaches the critical lane of the pool it is queued in: the first at
    submit (pool a), the second (pool b) when the first completes; the lanes lease both."""
    from makespan.workers.critical_lane import CriticalLane
    from makespan.workers.phases import PhaseRunner
    from makespan.workloads import submit_workload, workload_status

    workers, _prod, sent = _planners(r, settings)
    lanes = {}
    for pool, worker in workers.items():
        worker.token = ""
        lanes[pool] = CriticalLane(worker.env, worker.kept, worker.token, worker.ticking.is_set)
    wl = {"name": "w", "priority": "CRITICAL",
          "steps": [{"name": "first", "endpoint": "onlya", "service_s": 1},
                    {"name": "second", "endpoint": "onlyb", "service_s": 1, "depends_on": ["first"]}]}
    steps = workload_status(r, keys, submit_workload(r, keys, FLEET, wl, settings))["steps"]
    first, second = steps["first"]["job"], steps["second"]["job"]
    assert r.lrange(keys.for_pool("a").planner_critical, 0, -1) == [first]
    assert not r.exists(keys.for_pool("b").planner_critical) and not r.exists(keys.planner_critical)
    assert lanes["a"].place(r.lpop(keys.for_pool("a").planner_critical)).leased
    (ctx, _queue), = sent["a"]
    assert PhaseRunner(r, workers["a"].settings, FLEET)._finish(ctx, "completed", "") == "completed"
    assert r.lrange(keys.for_pool("b").planner_critical, 0, -1) == [second]
    assert lanes["b"].place(r.lpop(keys.for_pool("b").planner_critical)).leased
    assert [c.job_id for c, _q in sent["b"]] == [second] and not r.exists(keys.planner_critical)


def test_a_pool_planners_metrics_label_its_pools_gauges(r, settings, keys):
    from makespan.metrics import RedisStateCollector

    prod = Producer(r, keys, FLEET, settings)
    for _ in range(3):
        prod.submit({"endpoint": "onlyb", "service_s": 5, "priority": "HIGH"})
    families = {f.name: f for f in RedisStateCollector(r, keys.for_pool("b")).collect()}
    depth = {(s.labels["priority"], s.labels["pool"]): s.value for s in families["makespan_queue_depth_jobs"].samples}
    assert depth[("HIGH", "b")] == 3 and depth[("NORMAL", "b")] == 0
    assert all("pool" in s.labels for s in families["makespan_queued_jobs_by_reason"].samples)
    plain = {f.name: f for f in RedisStateCollector(r, keys).collect()}  # the implicit pool: no pool label
    assert all("pool" not in s.labels for s in plain["makespan_queue_depth_jobs"].samples)


@pytest.mark.parametrize("time_scale", [0.01, 1.0])
def test_a_dependency_in_another_pool_is_left_to_its_own_planner(r, settings, keys, time_scale):
    """A pool b job depends on a queued pool a job of an endpoint pool b does not serve: pool
    b's planner pulled the dependency into its own batch (to plan what its steps wait on)
    and the plan raised KeyError, ending the planner process (found by a review)."""
    workers, prod, sent = _planners(r, dataclasses.replace(settings, time_scale=time_scale))
    for _ in range(2):
        prod.submit({"endpoint": "onlya", "service_s": 500})
    workers["a"].tick()  # pool a full: the dependency stays queued there
    dependency = prod.submit({"endpoint": "onlya", "service_s": 5}).id
    dependant = prod.submit({"endpoint": "onlyb", "service_s": 5, "depends_on": [dependency]}).id
    assert (r.hget(keys.job(dependency), "pool"), r.hget(keys.job(dependant), "pool")) == ("a", "b")
    workers["b"].tick()
    workers["b"].tick()
    assert sent["b"] == [] and r.hget(keys.job(dependency), "state") == "queued"
    assert r.hget(keys.job(dependant), "wait_reason") == "waiting_for_dependency"


def test_an_idle_warm_instance_is_not_counted_twice_when_routing(r, settings, keys):
    """Pool a: one free GPU with an idle warm ``both`` instance and one job queued ahead;
    pool b: two free GPUs. The warm instance counted once as warm and once as a free gang,
    so pool a, which cannot start the job now, won."""
    from makespan.pools import publish_offer

    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    prod = Producer(r, Keys(s.key_prefix), FLEET, s)
    prod.submit({"endpoint": "onlya", "service_s": 500})  # queued in pool a, ahead of the next job
    publish_offer(r, keys.for_pool("a"), PoolOffer("a", 2, {"a1": [0]}, {"both": 1}, time.time()), 5.0)
    publish_offer(r, keys.for_pool("b"), PoolOffer("b", 2, {"b1": [0], "b2": [0]}, {}, time.time()), 5.0)
    job = prod.submit({"endpoint": "both", "service_s": 5}).id
    assert r.hget(keys.job(job), "pool") == "b"


def test_the_no_worker_warning_of_submit_counts_the_pools_that_serve_the_endpoint(r, keys, redis_url, prefix):
    """A worker of another pool runs no job of this endpoint, and a host of another pool is
    not where to start one (a reviewer's case: pool b's worker hid pool a's missing one)."""
    from makespan.workers.host_liveness import announce

    r.set(keys.fleet, FLEET.model_dump_json())
    announce(r, keys, "b1", "worker-b1", 30.0)
    r.set(keys.for_pool("a").planner_leader, "planner-a")
    r.set(keys.for_pool("b").planner_leader, "planner-b")
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    only_a = CliRunner().invoke(cli_app, ["submit", "--endpoint", "onlya", "--service-s", "1", "-q"], env=env)
    assert only_a.exit_code == 0 and "warning: no GPU worker runs on a1, a2 " in only_a.stderr, only_a.stderr
    assert "--host a1" in only_a.stderr and "b1" not in only_a.stderr and "planner" not in only_a.stderr
    only_b = CliRunner().invoke(cli_app, ["submit", "--endpoint", "onlyb", "--service-s", "1", "-q"], env=env)
    assert only_b.exit_code == 0 and only_b.stderr == "", only_b.stderr
    r.delete(keys.for_pool("b").planner_leader)  # pool b's planner stops: its jobs wait with no_planner
    leaderless = CliRunner().invoke(cli_app, ["submit", "--endpoint", "onlyb", "--service-s", "1", "-q"], env=env)
    assert "warning: no planner leads pool b " in leaderless.stderr and "--pool b" in leaderless.stderr, \
        leaderless.stderr
    assert "no GPU worker" not in leaderless.stderr
    # a repeated key names a job submitted before: whether it waits is not this submit's to say
    again = CliRunner().invoke(cli_app, ["submit", "--endpoint", "onlya", "--service-s", "1", "-q",
                                         "--idempotency-key", "k"], env=env)
    assert "warning: no GPU worker" in again.stderr
    r.hset(keys.job(again.stdout.strip()), "state", "completed")
    repeat = CliRunner().invoke(cli_app, ["submit", "--endpoint", "onlya", "--service-s", "1", "-q",
                                          "--idempotency-key", "k"], env=env)
    assert repeat.exit_code == 0 and repeat.stdout == again.stdout and repeat.stderr == "", repeat.stderr


def test_every_pools_planner_exports_the_queues_of_a_pool_no_planner_leads(r, settings, keys):
    """With both planners of pool b stopped, nothing exported b's queue depth or its
    no_planner count: an alert on them could never fire, in the very state it is for
    (operator check). Pool a's planner exports them while no planner of b leads."""
    from makespan.metrics import RedisStateCollector

    r.set(keys.fleet, FLEET.model_dump_json())
    r.set(keys.for_pool("a").planner_leader, "planner-a")
    prod = Producer(r, keys, FLEET, settings)
    for _ in range(2):
        prod.submit({"endpoint": "onlyb", "service_s": 5, "priority": "HIGH"})

    def exported():
        families = {f.name: f for f in RedisStateCollector(r, keys.for_pool("a")).collect()}
        depth = {(s.labels["priority"], s.labels["pool"]): s.value
                 for s in families["makespan_queue_depth_jobs"].samples}
        reasons = {(s.labels["reason"], s.labels["pool"]): s.value
                   for s in families["makespan_queued_jobs_by_reason"].samples}
        return depth, reasons

    def led() -> dict[str, float]:  # makespan_pool_led, per pool, as Redis says (a verifier: no series
        families = {f.name: f for f in RedisStateCollector(r, keys.for_pool("a")).collect()}  # told of b)
        return {s.labels["pool"]: s.value for s in families["makespan_pool_led"].samples}

    depth, reasons = exported()
    assert depth[("HIGH", "b")] == 2 and depth[("HIGH", "a")] == 0
    assert reasons[("no_planner", "b")] == 2 and reasons[("behind_batch", "b")] == 0
    assert led() == {"a": 1.0, "b": 0.0}
    r.set(keys.for_pool("b").planner_leader, "planner-b")  # b's planner leads: it exports its own
    depth, reasons = exported()
    assert ("HIGH", "b") not in depth and ("no_planner", "b") not in reasons
    assert led() == {"a": 1.0, "b": 1.0}


def test_a_pool_planner_that_stops_withdraws_its_offer(r, settings, keys):
    """A pools operator stopped pool b's only planner (SIGTERM) and at once submitted jobs of
    an endpoint both pools serve: they went to b, whose offer outlived its planner for the
    offer's TTL, though pool a had a leader (docs/scaling.md: a pool whose planner stopped
    leading is skipped). The planner now deletes its pool's offer as it releases the lock."""
    workers, prod, _sent = _planners(r, settings)
    for pool in ("a", "b"):
        workers[pool].tick()
    stopping = workers["b"]
    lock = stopping._lead()
    assert lock is not None and r.exists(keys.for_pool("b").pool_offer)
    stopping._release(lock)
    assert not r.exists(keys.for_pool("b").pool_offer)
    job = prod.submit({"endpoint": "both", "service_s": 5}).id
    assert r.hget(keys.job(job), "pool") == "a"
