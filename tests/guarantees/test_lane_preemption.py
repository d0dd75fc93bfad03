"""The start-bounded lane takes strict priority's preemption (issue 19 point 4, second round).

One GPU; a LOW job of 2,200 s starts at t = 0 (60 s cold start); a CRITICAL job of 100 s
arrives at t = 2,000 s. Strict priority with the preemption rule (``fifo``) preempts the LOW job and
starts the CRITICAL one at once: its wait is 0. The default policy's scored preemption
declines (the LOW job's 2,000 s of work done and its restart cost more than the CRITICAL
job's 260 s wait at weight 8), and without preemption the lane's strict start is when the
LOW job ends, so before this change the CRITICAL job waited 260 s. The lane now computes the
strict start as the rule does (:func:`makespan.planner.fast_lane.rule_preemptions`)."""

from __future__ import annotations

import pytest

from makespan.models import parse_fleet
from makespan.planner.api import plan
from makespan.planner.model import PlanJob, RunningJob
from makespan.planner.simulator import fleet_state, simulate

ONE = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                   "endpoints": {"a": {"model": "a", "memory_mib_per_gpu": 1000, "cold_start_s": 60}}})


def _jobs():
    return [PlanJob("low", "a", 1.0, 0.0, 2200.0, 3, seq=0), PlanJob("crit", "a", 8.0, 2000.0, 100.0, 0, seq=1)]


def _sim(policy, **kw):
    return simulate(_jobs(), fleet_state(ONE, 0.0), policy, preemption="plan", restore=False, time_limit_s=0.05, **kw)


def test_critical_job_starts_when_strict_priority_would_preempt_for_it():
    fifo = _sim("fifo", reservation_after_s=None, lane_levels=())
    default = _sim("default")  # the simulator's defaults: the lane bounded on start, with the rule's preemptions
    without = _sim("default", lane_preempt=False)  # the lane of before: strict start without preemption
    waits = {name: r["wait_s"]["CRITICAL"]["p95"] for name, r in
             (("fifo", fifo), ("default", default), ("without", without))}
    assert waits["fifo"] == pytest.approx(0.0, abs=1.0)
    assert waits["without"] >= 200.0  # the scored decision alone declines the preemption
    assert waits["default"] <= 1.1 * waits["fifo"] + 30.0
    assert default["jobs"]["preempted"] == 1 and without["jobs"]["preempted"] == 0


def test_plan_takes_the_rule_preemption_for_a_start_bounded_job_only():
    st = fleet_state(ONE, 0.0)
    low = _jobs()[0]
    (gpu,) = (g.uuid for g in st.gpus)  # the LOW job running since t = 0 (60 s cold start), now t = 2,000 s
    st.now_s, st.free_at[gpu], st.resident[gpu] = 2000.0, 2260.0, "a"
    st.running = {gpu: RunningJob(low, (gpu,), 0.0, 60.0, 2260.0, True)}
    batch = [PlanJob("crit", "a", 8.0, 2000.0, 100.0, 0, seq=1)]
    kw = dict(preemption=True, lane_levels=(0,), time_limit_s=0.05)
    bounded = plan(batch, st, "default", lane_start_grace_s={0: 30.0}, **kw)
    assert [(x.job_id, x.victims) for x in bounded.preemptions] == [("crit", ("low",))]
    assert bounded.by_job()["crit"].start_s == pytest.approx(2000.0)
    off = plan(batch, st, "default", lane_start_grace_s={0: 30.0}, lane_preempt=False, **kw)
    on_completion = plan(batch, st, "default", lane_start_grace_s={}, **kw)  # not start-bounded: no rule preemption
    for p in (off, on_completion):
        assert not p.preemptions and p.by_job()["crit"].start_s >= 2260.0 - 1e-6
