"""Planner wake-ups with pools (real Redis): whatever queues a job, or ends the job it waits
on, wakes the planner of the pool the job is queued in, as a plain submit wakes its pool's
(``P:…:planner:wake``; the planner then plans at once instead of at its next periodic tick)."""

from __future__ import annotations

import time

from makespan.models import parse_fleet
from makespan.workers.leases import LeaseStore, finish_job_op
from makespan.workloads import advance_workloads, submit_workload, workload_status
from tests.pools.test_pools import FLEET, _planners, fleet_data

TWO_POOL_WORKLOAD = {"name": "w", "retry_budget": 1,
                     "steps": [{"name": "first", "endpoint": "onlya", "service_s": 1},
                               {"name": "second", "endpoint": "onlyb", "service_s": 1, "depends_on": ["first"]}]}


def _wakes(r, keys) -> dict[str, list[str]]:
    """Each pool's wake list ('' = the implicit pool's)."""
    return {pool: r.lrange(keys.for_pool(pool).planner_wake, 0, -1) for pool in ("", "a", "b")}


def test_a_workload_submit_wakes_the_planner_of_each_pool_a_step_is_queued_in(r, settings, keys):
    """submit_workload queued its steps and woke no planner: they waited for its next tick."""
    submit_workload(r, keys, FLEET, TWO_POOL_WORKLOAD, settings)
    assert _wakes(r, keys) == {"": [], "a": ["1"], "b": ["1"]}  # one wake-up per pool, none where no step is


def test_a_workload_submit_without_pools_wakes_the_planner(r, settings, keys):
    plain = parse_fleet(fleet_data(pools=False))
    submit_workload(r, keys, plain, TWO_POOL_WORKLOAD, settings)
    assert _wakes(r, keys) == {"": ["1"], "a": [], "b": []}


def test_a_step_retried_by_another_pools_planner_wakes_the_planner_of_the_steps_pool(r, settings, keys):
    """Every pool's planner advances the active workloads: pool b's retried a failed pool a
    step into pool a's queue and woke nobody."""
    wid = submit_workload(r, keys, FLEET, TWO_POOL_WORKLOAD, settings)
    first = workload_status(r, keys, wid)["steps"]["first"]["job"]
    r.zrem(keys.for_pool("a").queue("NORMAL"), first)
    r.hset(keys.job(first), mapping={"state": "failed", "reason": "boom"})  # as its GPU worker ends it
    for pool in ("a", "b"):
        r.delete(keys.for_pool(pool).planner_wake)
    assert advance_workloads(r, keys.for_pool("b"))["retried"] == 1  # pool b's planner's pass
    retry = workload_status(r, keys, wid)["steps"]["first"]["job"]
    assert retry != first and r.zscore(keys.for_pool("a").queue("NORMAL"), retry) is not None
    assert _wakes(r, keys)["a"] == ["1"]


def test_a_job_that_ends_wakes_the_planner_of_a_dependants_pool(r, settings, keys):
    """A pool a job's GPU worker woke only pool a's planner (its GPUs' pool) as the job
    completed: its dependant queued in pool b waited for pool b's next periodic tick."""
    workers, prod, sent = _planners(r, settings)
    dependency = prod.submit({"endpoint": "onlya", "service_s": 5}).id
    dependant = prod.submit({"endpoint": "onlyb", "service_s": 5, "depends_on": [dependency]}).id
    workers["a"].tick()
    ((ctx, _queue),) = sent["a"]
    for pool in ("a", "b"):
        r.delete(keys.for_pool(pool).planner_wake)
    assert LeaseStore(r, keys).fenced(ctx.lease, [finish_job_op(keys, dependency, "completed", time.time(), "")])
    assert _wakes(r, keys) == {"": [], "a": [], "b": ["1"]}  # the release's own wake-up is its GPU worker's
    assert r.hget(keys.job(dependant), "state") == "queued"
