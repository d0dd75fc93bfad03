"""A job that may run only on some hosts (``PlanJob.hosts``: a workload function registered by
the GPU workers of those hosts alone) is placed only there by every policy and refused
elsewhere by the evaluator; ``Replay.job_groups`` (which the fast lane, the reservation and
the scored preemption candidates read) filters them. The live worker's paths (the kept
plan's follower, the tick's preemptions) are tested in
tests/workers/test_function_hosts_paths.py, the plan and the critical lane end to end in
tests/workloads/test_function_hosts.py."""

from dataclasses import replace

import pytest
from hypothesis import given, settings as hyp_settings, strategies as st

from makespan.planner.api import plan
from makespan.planner.evaluator import InfeasiblePlan, evaluate
from makespan.planner.model import Assignment, PlanJob
from makespan.planner.replay import Replay
from makespan.planner.synthetic import instance


def _host(uuid: str) -> str:
    return uuid.split("-")[0]


@pytest.mark.parametrize("policy", ["fifo", "min-evict", "wspt", "portfolio", "cpsat", "default"])
def test_every_policy_places_a_hosts_job_only_on_its_hosts(policy):
    batch, state = instance(30, 16, seed=3)  # two hosts h0, h1 of 8 GPUs
    only_h1 = [replace(j, hosts=("h1",)) if i % 2 == 0 else j for i, j in enumerate(batch)]
    out = plan(only_h1, state, policy, time_limit_s=0.2)
    hosts_of = {a.job_id: {_host(u) for u in a.gpus} for a in out.assignments}
    for job in only_h1:
        if job.hosts:
            assert hosts_of[job.id] == {"h1"}, (job.id, hosts_of[job.id])
    assert len(hosts_of) == len(only_h1)


def test_the_evaluator_refuses_a_hosts_job_on_another_host():
    batch, state = instance(1, 16, seed=1, gang=False)
    job = replace(batch[0], hosts=("h1",))
    with pytest.raises(InfeasiblePlan):
        evaluate([Assignment(job.id, ("h0-g0",), 0.0, 0.0, job.service_s, "cold_start")], [job], state, "fifo")


@hyp_settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), hosts=st.sampled_from([("h0",), ("h1",), ("h0", "h1"), ()]))
def test_job_groups_are_the_endpoints_groups_on_its_hosts(seed, hosts):
    batch, state = instance(5, 16, seed=seed)
    rep = Replay(state)
    for job in batch:
        narrowed = replace(job, hosts=hosts)
        everything = rep.job_groups(job)
        assert rep.job_groups(narrowed) == [g for g in everything if not hosts or _host(g[0]) in hosts]


def test_a_hosts_job_with_no_group_on_its_hosts_is_refused_clearly():
    batch, state = instance(1, 8, seed=2, gang=False)  # one host, h0
    with pytest.raises(ValueError, match="on hosts h9"):
        plan([replace(batch[0], hosts=("h9",))], state, "fifo")


def test_plan_job_keeps_hosts_apart_from_helpers_in_the_group_cache():
    batch, state = instance(2, 16, seed=5, gang=False)
    rep = Replay(state)
    a, b = replace(batch[0], hosts=("h0",)), replace(batch[0], id="other", hosts=("h1",))
    assert {_host(g[0]) for g in rep.job_groups(a)} == {"h0"}
    assert {_host(g[0]) for g in rep.job_groups(b)} == {"h1"}
    assert isinstance(a, PlanJob) and a.narrowed and not batch[1].narrowed
