"""A CP-SAT window given a preemption candidate whose group is partly free (issue 19
point 2): the free GPUs of that group are in the window's model (before: KeyError on a
free GPU that no window job was planned on, seen in bench/planner_policies.py with
reservations off)."""

from __future__ import annotations

from makespan.models import parse_fleet
from makespan.planner import window_preemption as wp
from makespan.planner.greedy import portfolio
from makespan.planner.model import PlanJob, RunningJob
from makespan.planner.simulator import fleet_state
from makespan.planner.window_model import solve_window

EIGHT = parse_fleet({"name": "eight", "hosts": [{"name": "h", "gpu_count": 8, "memory_mib": 81920}],
                     "endpoints": {"one": {"model": "s", "memory_mib_per_gpu": 1000, "cold_start_s": 30},
                                   "four": {"model": "g", "tensor_parallel": 4, "memory_mib_per_gpu": 1000,
                                            "cold_start_s": 30}}})


def test_window_models_the_free_gpus_of_a_partly_free_candidate_group():
    """GPUs 0-3: a LOW TP-4 job of ``four`` until 1,000 s (so ``four`` is warm there); GPU 4:
    a LOW TP-1 job until 1,000 s; GPUs 5-7 free. A HIGH TP-4 job of ``four`` is planned on
    0-3 at 1,000 s; cutting the TP-1 job lets it start now on 4-7, whose GPUs 5-7 no
    window job uses."""
    st = fleet_state(EIGHT, 100.0)
    u = [g.uuid for g in st.gpus]
    l4 = RunningJob(PlanJob("l4", "four", 1.0, 0.0, 970.0, 3, seq=0), tuple(u[:4]), 0.0, 30.0, 1000.0)
    l1 = RunningJob(PlanJob("l1", "one", 1.0, 0.0, 970.0, 3, seq=1), (u[4],), 0.0, 30.0, 1000.0)
    for x in u[:4]:
        st.free_at[x], st.resident[x], st.running[x] = 1000.0, "four", l4
    st.free_at[u[4]], st.resident[u[4]], st.running[u[4]] = 1000.0, "one", l1
    batch = [PlanJob("high", "four", 4.0, 100.0, 300.0, 1, seq=2)]
    g = portfolio(batch, st)
    assert tuple(g.by_job()["high"].gpus) == tuple(u[:4])
    pre = wp.window_candidates(g, 0, len(g.assignments), batch, st)
    assert any(set(c.group) - {x for a in g.assignments for x in a.gpus} - {u[4]} for c in pre)
    sol = solve_window(g, 0, len(g.assignments), {j.id: j for j in batch}, st, 1.0, 0, 1, 4, True,
                       "weighted_completion", pre)
    assert sol is not None
