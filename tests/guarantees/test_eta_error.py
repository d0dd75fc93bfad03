"""ETA at submit and at each planning point in the simulator, and the report's ETA error
per class (issue 19 point 5): actual start − the ETA the job got at submit."""

from __future__ import annotations

import pytest

from makespan.models import parse_fleet
from makespan.planner.measures import JobRecord, eta_error
from makespan.planner.model import PlanJob
from makespan.planner.simulator import simulate

ONE_GPU = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                       "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 10}}})


def test_a_late_critical_job_moves_the_etas_of_the_queue():
    """1 GPU, fifo: three NORMAL jobs of 100 s at t = 0 (the first cold-starts, 10 s), a
    CRITICAL job of 100 s at t = 50. At t = 0 n1 and n2 are told 110 s and 210 s; the
    CRITICAL job goes before them at t = 50, so each starts 100 s later than first told."""
    jobs = [PlanJob(f"n{i}", "e", 2.0, 0.0, 100.0, 2, seq=i) for i in range(3)]
    jobs.append(PlanJob("c", "e", 8.0, 50.0, 100.0, 0, seq=3))
    rep = simulate(jobs, ONE_GPU, "fifo", preemption=False, restore=False, detail=True,
                   reservation_after_s=None)
    starts = {r["id"]: r["start_s"] for r in rep["schedule"]["jobs"]}
    assert starts == pytest.approx({"n0": 0.0, "c": 110.0, "n1": 210.0, "n2": 310.0})
    etas = rep["schedule"]["etas"]
    assert etas["n1"][0] == pytest.approx([0.0, 110.0])  # at submit
    assert etas["n1"][1] == pytest.approx([50.0, 210.0])  # the next planning point: behind c
    assert etas["n2"][0] == pytest.approx([0.0, 210.0])
    assert etas["c"][0] == pytest.approx([50.0, 110.0])
    assert all(t1 > t0 for h in etas.values() for (t0, _), (t1, _) in zip(h, h[1:]))  # one entry a point
    err = rep["eta_error_s"]
    assert err["NORMAL"] == {"n": 3, "p50": pytest.approx(100.0), "p90": pytest.approx(100.0),
                             "mean": pytest.approx(200.0 / 3)}
    assert err["CRITICAL"] == {"n": 1, "p50": pytest.approx(0.0), "p90": pytest.approx(0.0),
                               "mean": pytest.approx(0.0)}
    assert err["HIGH"] == {"n": 0, "p50": None, "p90": None, "mean": None}


def test_a_preempted_job_keeps_its_first_eta():
    """1 GPU, plan preemption: a LOW job of 1,000 s at t = 0 is cut by a CRITICAL job at
    t = 200 and restarts after it: its error is its final start − 0 (its ETA at submit)."""
    jobs = [PlanJob("low", "e", 1.0, 0.0, 1000.0, 3, seq=0), PlanJob("c", "e", 8.0, 200.0, 50.0, 0, seq=1)]
    rep = simulate(jobs, ONE_GPU, "portfolio", preemption="plan", restore=False, detail=True,
                   reservation_after_s=None)
    assert rep["jobs"]["preempted"] == 1
    low = next(r for r in rep["schedule"]["jobs"] if r["id"] == "low")
    assert rep["schedule"]["etas"]["low"][0] == pytest.approx([0.0, 0.0])
    assert rep["eta_error_s"]["LOW"]["p50"] == pytest.approx(low["start_s"]) and low["start_s"] > 200.0
    assert rep["schedule"]["etas"]["c"][0][1] == pytest.approx(200.0)  # the preemptor's ETA: at once


def test_eta_error_percentiles_per_level():
    def rec(i, prio, start):
        return JobRecord(f"j{i}", "e", prio, 1.0, 0.0, start, start, start + 1, ("g",))
    recs = [rec(i, 1, float(10 * i)) for i in range(11)] + [rec(99, 3, 5.0)]
    out = eta_error(recs, {f"j{i}": 0.0 for i in range(11)})  # j99 has no ETA: left out
    assert out["HIGH"]["p50"] == pytest.approx(50.0) and out["HIGH"]["p90"] == pytest.approx(90.0)
    assert out["LOW"]["n"] == 0 and out["CRITICAL"]["p50"] is None
