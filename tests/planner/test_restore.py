"""Set-point restore in the simulator, and the planner on the states restores and
preemptions leave (GPUs busy restoring, a preempted job back in the batch)."""

import pytest

from makespan.models import parse_fleet
from makespan.traces import read_trace
from makespan.planner.api import plan
from makespan.planner.evaluator import evaluate
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.replay import Replay
from makespan.planner.simulator import set_point_groups, simulate

EPS = {"m1": EndpointModel("m1", 1, 1000, 30.0, 5.0), "m2": EndpointModel("m2", 1, 1000, 60.0, 5.0),
       "t2": EndpointModel("t2", 2, 1000, 40.0, 5.0)}


def _state():
    gpus = [Gpu(f"g{i}", "a", i, 80000) for i in range(2)]
    return FleetState(0.0, gpus, EPS, resident={"g0": "m1"}, set_point={"g0": "m1"})


def _two_m2(extra=()):
    return [PlanJob("a", "m2", 2.0, 0.0, 100.0, 2, seq=0), PlanJob("b", "m2", 2.0, 0.0, 100.0, 2, seq=1), *extra]


def test_restore_when_idle_is_counted_and_reaches_the_set_point():
    rep = simulate(_two_m2(), _state(), "portfolio", detail=True)
    # g0 evicts m1 (5 s) and loads m2 (60 s): both GPUs run m2 until 165 s at the latest;
    # then m1 goes back on g0: evict m2 5 s + cold start 30 s
    assert rep["schedule"]["restores"] == [(165.0, 200.0, ("g0",))]
    assert rep["transitions"]["restore"] == 1 and rep["sim"]["restore"] is True
    assert rep["schedule"]["resident_end"]["g0"] == "m1"
    off = simulate(_two_m2(), _state(), "portfolio", restore=False, detail=True)
    assert off["transitions"]["restore"] == 0 and off["schedule"]["resident_end"]["g0"] == "m2"
    assert rep["transition_gpu_s"] == pytest.approx(off["transition_gpu_s"] + 35.0)


def test_idle_rule_waits_while_work_is_queued_or_arrives_first():
    # c arrives at 150 s, before the fleet idles at 165 s: the idle rule alone (no planned
    # restores) waits until c is done
    c = PlanJob("c", "m2", 2.0, 150.0, 100.0, 2, seq=2)
    rep = simulate(_two_m2([c]), _state(), "portfolio", planned_restore=None, detail=True)
    end = max(r["end_s"] for r in rep["schedule"]["jobs"])
    assert [r[0] for r in rep["schedule"]["restores"]] == [end]
    assert rep["sim"]["planned_restore"] is None


def test_planned_restore_runs_while_other_gpus_work():
    # the plan at 150 s puts c on g1 (m2 warm there, free at 160 s) and nothing more on g0:
    # g0's set point comes back when a ends at 165 s, while c runs until 260 s
    c = PlanJob("c", "m2", 2.0, 150.0, 100.0, 2, seq=2)
    rep = simulate(_two_m2([c]), _state(), "portfolio", detail=True)
    rec = {r["id"]: r for r in rep["schedule"]["jobs"]}
    assert tuple(rec["c"]["gpus"]) == ("g1",) and rec["c"]["end_s"] == 260.0
    assert rep["schedule"]["restores"] == [(165.0, 200.0, ("g0",))]
    # m1 absent on g0 from 0 s (a's evict begins) to 200 s; the idle rule alone: until 295 s
    assert rep["set_point_absent_gpu_s"] == pytest.approx(200.0)
    idle = simulate(_two_m2([c]), _state(), "portfolio", planned_restore=None)
    assert idle["set_point_absent_gpu_s"] == pytest.approx(295.0)
    # --no-restore: no restores at all; m1 stays absent until the last job ends at 260 s
    off = simulate(_two_m2([c]), _state(), "portfolio", restore=False, detail=True)
    assert off["transitions"]["restore"] == 0 and off["schedule"]["restores"] == []
    assert off["set_point_absent_gpu_s"] == pytest.approx(260.0) and off["sim"]["planned_restore"] is None


def test_a_job_arriving_during_a_restore_waits_for_its_gpus():
    d = PlanJob("d", "m1", 8.0, 170.0, 10.0, 0, seq=2)  # m1 is being restored on g0 over [165, 200)
    rep = simulate(_two_m2([d]), _state(), "portfolio", detail=True)
    rec = next(r for r in rep["schedule"]["jobs"] if r["id"] == "d")
    assert rep["schedule"]["restores"][0][:2] == (165.0, 200.0)
    assert tuple(rec["gpus"]) != ("g0",) or rec["start_s"] >= 200.0
    assert rep["jobs"]["preempted"] == 0  # a restore is never a victim


def test_trace_ends_at_the_set_point(traces):
    fleet = parse_fleet({
        "name": "t",
        "hosts": [{"name": "a", "gpu_count": 4, "memory_mib": 81920}],
        "endpoints": {
            "m1": {"model": "x", "memory_mib_per_gpu": 1000, "cold_start_s": 45,
                   "set_point": [{"host": "a", "gpus": [1]}]},
            "m2": {"model": "y", "memory_mib_per_gpu": 1000, "cold_start_s": 120, "wake_s": 10},
            "g2": {"model": "w", "tensor_parallel": 2, "memory_mib_per_gpu": 1000, "cold_start_s": 90,
                   "set_point": [{"host": "a", "gpus": [2, 3]}]},
        },
    })
    jobs = read_trace(str(traces / "msft-itp-2021" / "cluster02.csv"), fleet, seed=1, start=2000, limit=60)
    rep = simulate(jobs, fleet, "portfolio", seed=1, time_scale=20, detail=True)
    sp = set_point_groups(fleet)
    uuid = [g.uuid for g in fleet.hosts[0].gpus]
    assert sorted(sp) == [("g2", (uuid[2], uuid[3])), ("m1", (uuid[1],))]
    assert rep["transitions"]["restore"] >= 1  # m2 ran last on GPU 1
    assert all(rep["schedule"]["resident_end"][u] == ep for ep, g in sp for u in g)
    assert rep["jobs"]["completed"] == 60


@pytest.mark.parametrize("policy", ["fifo", "min-evict", "wspt", "portfolio", "cpsat"])
def test_planner_accepts_restoring_gpus_and_a_preempted_job(policy):
    st = _state()
    rep = Replay(st)
    victim = PlanJob("v", "m2", 1.0, 0.0, 500.0, 3, seq=0)
    a = rep.place(victim, ("g1",), 0.0)
    rep.unplace(a, 30.0)  # preempted at 30 s, in its 60 s cold start: g1 holds nothing now
    assert rep.resident["g1"] is None and rep.free_at["g1"] == 30.0 and "v" not in rep.end_of
    rep.place(PlanJob("x", "m2", 2.0, 0.0, 100.0, 2, seq=1), ("g0",), 0.0)
    r = rep.restore(("g0",), "m1", 160.0)  # restoring g0 over [160, 195)
    assert (r.start_s, r.end_s, r.evicts, r.load) == (160.0, 195.0, ("m2",), "cold_start")
    now = 170.0
    state = FleetState(now, st.gpus, EPS, free_at=dict(rep.free_at), resident=dict(rep.resident),
                       set_point=st.set_point, end_of=rep.end_of, asleep=dict(rep.asleep))
    batch = [victim, PlanJob("n", "m1", 8.0, 165.0, 20.0, 0, seq=2), PlanJob("t", "t2", 2.0, 168.0, 20.0, 2, seq=3)]
    p = plan(batch, state, policy, time_limit_s=0.2)
    ev = evaluate(p, batch, state)  # raises InfeasiblePlan on any violation
    assert sorted(x.job_id for x in ev.assignments) == ["n", "t", "v"]
    for x in ev.assignments:
        assert x.start_s >= now
        if "g0" in x.gpus:
            assert x.start_s >= 195.0
