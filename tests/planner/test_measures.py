"""Measures and lower bounds on tiny hand-computed cases."""

import itertools

import pytest

from makespan.planner.measures import (JobRecord, build_report, idle_while_queued, lower_bounds, minus_length,
                              percentile, union)
from makespan.planner.model import EndpointModel, PlanJob

EP = {"e": EndpointModel("e", tp=1, memory_mib=1, cold_start_s=5.0, evict_s=1.0)}


def _two_jobs():
    a = JobRecord("a", "e", 0, 8.0, 0.0, 0.0, 10.0, 20.0, ("g0",), load="cold_start")
    b = JobRecord("b", "e", 3, 1.0, 0.0, 20.0, 20.0, 30.0, ("g0",))
    return [a, b]


def test_report_hand_computed():
    rep = build_report(_two_jobs(), policy="fifo", gpus=2, submitted=2, gpu_ids=["g0", "g1"])
    assert rep["weighted_completion_s"] == 8 * 20 + 1 * 30
    assert rep["makespan_s"] == 30
    assert rep["utilization"] == pytest.approx(20 / 60)
    assert rep["transition_gpu_s"] == 10
    assert rep["idle_gpu_s"] == 30
    # b waited [0, 20]; g0 was busy then, g1 idle the whole time.
    assert rep["idle_while_queued_gpu_s"] == 20
    assert rep["wait_s"]["CRITICAL"] == {"p50": 0.0, "p95": 0.0}
    assert rep["wait_s"]["LOW"]["p50"] == 20
    assert rep["wait_s"]["HIGH"] == {"p50": None, "p95": None}
    assert rep["transitions"] == {"evict": 0, "sleep": 0, "sleep_level1": 0, "sleep_level2": 0, "cold_start": 1, "wake": 0,
                                "restore": 0}
    assert rep["jobs"] == {"submitted": 2, "completed": 2, "failed": 0, "rejected": 0, "preempted": 0}
    for key in ("policy", "gpus", "drain", "planner", "lower_bounds", "best_over_lower_bound"):
        assert key in rep


def test_idle_while_queued_respects_eligibility_and_restores():
    recs = _two_jobs()
    assert idle_while_queued(recs, ["g0", "g1"], eligible={"e": ["g0"]}) == 0
    # g1 restoring during [5, 12] is not idle.
    assert idle_while_queued(recs, ["g0", "g1"], restores=[(5.0, 12.0, ("g1",))]) == 13


def test_restores_add_transition_time_and_count():
    rep = build_report(_two_jobs(), policy="x", gpus=2, submitted=2, restores=[(30.0, 35.0, ("g0",)), ("g1",)],
                       solve_times_s=[0.1, 0.3], lower_bound_weighted_s=95.0)
    assert rep["transition_gpu_s"] == 15
    assert rep["transitions"]["restore"] == 2
    assert rep["idle_gpu_s"] == 25
    assert rep["planner"]["batches"] == 2 and rep["planner"]["solve_s_p50"] == pytest.approx(0.2)
    assert rep["best_over_lower_bound"] == pytest.approx(190 / 95)


def test_failed_jobs_counted_not_scored():
    recs = _two_jobs() + [JobRecord("c", "e", 2, 2.0, 0.0, 30.0, 30.0, 31.0, ("g1",), status="failed")]
    rep = build_report(recs, policy="x", gpus=2, submitted=3)
    assert rep["jobs"]["failed"] == 1 and rep["jobs"]["completed"] == 2
    assert rep["weighted_completion_s"] == 190
    assert rep["makespan_s"] == 31


def test_interval_helpers_and_percentile():
    assert union([(3, 5), (0, 1), (1, 2), (4, 6), (7, 7)]) == [(0, 2), (3, 6)]
    assert minus_length([(0, 10)], [(2, 3), (5, 20)]) == 4
    assert minus_length([(0, 2), (4, 6)], [(1, 5)]) == 2
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([], 50) is None


def test_lower_bounds_hand_computed():
    jobs = [PlanJob("j1", "e", 1.0, 0.0, 2.0), PlanJob("j2", "e", 2.0, 0.0, 1.0)]
    lb = lower_bounds(jobs, EP, 1, resident={"e"})
    assert lb == {"makespan_s": 3.0, "weighted_completion_s": 5.0}  # j2 then j1: 2*1 + 1*3
    assert lower_bounds(jobs, EP, 1)["makespan_s"] == 7.0  # cold start 5 + longest 2
    late = jobs + [PlanJob("j3", "e", 1.0, 10.0, 20.0)]
    assert lower_bounds(late, EP, 1, resident={"e"})["makespan_s"] == 30.0
    # a later job of a cold endpoint may run warm on the instance its first job loaded: the
    # bound charged it a cold start too (a live replay finished before that "lower bound")
    two_gpus = [PlanJob("first", "e", 1.0, 0.0, 1.0), PlanJob("later", "e", 1.0, 10.0, 1.0)]
    assert lower_bounds(two_gpus, EP, 2)["makespan_s"] == 11.0  # 10 + 1, not 10 + 5 + 1
    # the schedule that reaches it: "first" cold on g0 (0 → 5 → 6), "later" warm on g0 at 10


def test_weighted_bound_below_every_single_gpu_order():
    """On one GPU without setups the optimum is some order; the bound is below all of them."""
    jobs = [PlanJob(f"j{i}", "e", w, r, p) for i, (w, r, p) in
            enumerate([(1, 0, 4), (3, 1, 2), (2, 2, 5), (5, 6, 1)])]
    best = float("inf")
    for order in itertools.permutations(jobs):
        t, tot = 0.0, 0.0
        for j in order:
            t = max(t, j.release_s) + j.service_s
            tot += j.weight * (t - j.release_s)
        best = min(best, tot)
    lb = lower_bounds(jobs, EP, 1, resident={"e"})["weighted_completion_s"]
    assert 0 < lb <= best + 1e-9
