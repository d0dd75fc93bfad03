"""Capacity term of the cap-* greedy members and whole-instance counting of TP > 1 endpoints."""

from makespan.planner.evaluator import evaluate
from makespan.planner.greedy import construct
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.replay import Replay


def _state():
    gpus = [Gpu(f"g{i}", "h", i, 80_000) for i in range(3)]
    eps = {"a": EndpointModel("a", 1, 1000, 30.0, 5.0), "b": EndpointModel("b", 1, 1000, 30.0, 5.0)}
    return FleetState(0.0, gpus, eps, free_at={"g0": 50.0}, resident={"g0": "a", "g1": "b", "g2": "b"})


def test_capacity_term_waits_for_a_warm_gpu_under_a_backlog():
    st = _state()
    urgent = PlanJob("x", "a", 8.0, 0.0, 1.0, seq=0)  # first in WSPT order
    backlog = [PlanJob(f"b{i}", "b", 1.0, 0.0, 60.0, seq=1 + i) for i in range(10)]
    batch = [urgent, *backlog]
    plain = {a.job_id: a for a in construct("p", batch, st, "aware", gamma=0.0)}
    cap = {a.job_id: a for a in construct("c", batch, st, "aware", gamma=2.0)}
    # alone, x is done sooner by evicting b (which keeps g2) from the free g1 (36 s < 51 s) ...
    assert plain["x"].gpus == ("g1",) and plain["x"].load == "cold_start"
    # ... but that costs the ten queued b jobs 35 GPU-seconds of g1 and a reload of b
    assert cap["x"].gpus == ("g0",) and cap["x"].load == "warm"
    p, c = evaluate(list(plain.values()), batch, st), evaluate(list(cap.values()), batch, st)
    assert c.objective < p.objective
    assert c.stats["cold_starts"] < p.stats["cold_starts"]


def test_taking_one_gpu_of_a_gang_loses_the_whole_instance():
    gpus = [Gpu(f"g{i}", "h", i, 80_000) for i in range(4)]
    eps = {"t": EndpointModel("t", 2, 1000, 60.0, 5.0), "a": EndpointModel("a", 1, 1000, 30.0, 5.0)}
    st = FleetState(0.0, gpus, eps, resident={"g0": "t", "g1": "t", "g2": "t"})
    rep = Replay(st)
    assert rep.instances("t") == 3 and rep.whole_gpus("t") == 2  # g2 alone is no instance
    assert rep.whole_lost(("g0",), "t") == 2 and rep.whole_lost(("g2",), "t") == 0
    rep.place(PlanJob("j", "a", 1.0, 0.0, 1.0), ("g1",))
    assert rep.instances("t") == 2 and rep.whole_gpus("t") == 0
