"""The solver policies may undo the greedy floor's preemption decision
(makespan.planner.api._plan_preemptive: the floor's branch and the batch without its preemptions
are both solved, the plan of lower comparable score is returned)."""

import pytest

from makespan.planner import api
from makespan.planner import preemption_plan as pp
from makespan.planner.api import comparable_score, plan
from makespan.planner.evaluator import score
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob, RunningJob
from tests.planner.preemption_gen import instance, total

EPS = {"small": EndpointModel("small", 1, 20000, 30.0, 5.0), "big": EndpointModel("big", 1, 60000, 30.0, 5.0)}
W = {0: 8.0, 1: 4.0, 2: 2.0, 3: 1.0}
OBJ = "weighted_completion"


def _job(jid, ep, level, release_s, service_s, seq):
    return PlanJob(jid, ep, W[level], release_s, service_s, level, seq=seq)


def _greedy_trap():
    """g0 (80 GB), g1, g2 (40 GB) each held by a LOW job started 5 s ago for 2000 s (g2's
    not preemptable). CRITICAL C0 ("small", 1500 s) may cut g0 or g1; HIGH C1 ("big",
    300 s) fits only g0. The floor decides C0 first and alone: on g0, C1 waits for C0 there
    (on g1, C1 would wait for g0's holder, longer); C1 then has no candidate (C0 is not
    preemptable). Jointly better: C0 on g1 and C1 on g0 now. Six LOW jobs released later
    keep the batch off the exact path (and the first window easy: CP-SAT proves it optimal
    within 0.3 s here); the big endpoint keeps it off the whole-batch model (LNS windows)."""
    now = 100.0
    gpus = [Gpu("g0", "a", 0, 80000), Gpu("g1", "a", 1, 40000), Gpu("g2", "a", 2, 40000)]
    run, free_at, res = {}, {}, {}
    for i, ok in enumerate([True, True, False]):
        j = _job(f"r{i}", "small", 3, 0.0, 2000.0, i)
        run[f"g{i}"] = RunningJob(j, (f"g{i}",), 95.0, 95.0, 2095.0, ok)
        free_at[f"g{i}"], res[f"g{i}"] = 2095.0, "small"
    state = FleetState(now, gpus, EPS, free_at=free_at, resident=res, set_point={}, running=run)
    batch = [_job("C0", "small", 0, 100.0, 1500.0, 10), _job("C1", "big", 1, 100.0, 300.0, 11)]
    batch += [_job(f"b{k}", "small", 3, 3000.0, 100.0 + 20 * k, 20 + k) for k in range(6)]
    return state, batch


def test_solver_undoes_the_floors_preemption_for_a_better_pair(monkeypatch):
    state, batch = _greedy_trap()
    floor = plan(batch, state, "portfolio", preemption=True)
    assert [(p.job_id, p.gpus) for p in floor.preemptions] == [("C0", ("g0",))]
    got = plan(batch, state, "cpsat", preemption=True, time_limit_s=4.0)
    taken = {(p.job_id, tuple(p.gpus)) for p in got.preemptions}
    assert ("C0", ("g0",)) not in taken, "the floor's preemption is undone"
    assert taken == {("C0", ("g1",)), ("C1", ("g0",))}
    assert got.stats["undo_branch"] == 1.0 and got.stats["floor_preemptions_undone"] == 1.0
    assert got.stats["base_branch_score"] < got.stats["floor_branch_score"]
    got_total, ev = total(got, batch, state, OBJ)  # replays with its preemptions
    assert score(ev) == pytest.approx(score(got))
    assert got_total == pytest.approx(got.stats["base_branch_score"])
    assert got_total == pytest.approx(comparable_score(got, state, OBJ))
    # the floor's branch, solved with the whole limit (the plan before the undo existed)
    monkeypatch.setattr(api, "UNDO_SHARE", 0.0)
    floor_branch = plan(batch, state, "cpsat", preemption=True, time_limit_s=4.0)
    assert [(p.job_id, p.gpus) for p in floor_branch.preemptions][:1] == [("C0", ("g0",))]
    assert "undo_branch" not in floor_branch.stats
    assert got_total < total(floor_branch, batch, state, OBJ)[0] - 1000.0
    assert got_total < total(floor, batch, state, OBJ)[0] - 1000.0


@pytest.mark.parametrize("dl", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_never_worse_than_the_floor_branch_and_replays(seed, dl, monkeypatch):
    """Random small instances (tests/planner/preemption_gen.py; with deadlines: the
    tardiness policy): the returned plan replays through evaluate_preemptive with the
    score it states, its comparable score is the lower of the two branches' and never
    above the greedy floor's plan (the floor's own decision and branch). Half the limit
    on the branch without the floor's preemptions, so that branch wins on some of them
    (seeds 3 and 4 with deadlines here), not only the floor's."""
    monkeypatch.setattr(api, "UNDO_SHARE", 0.5)
    state, batch = instance(seed, deadlines=dl)
    pol, floor_pol, obj = (("tardiness", "tardiness-portfolio", "weighted_tardiness") if dl
                           else ("cpsat", "portfolio", "weighted_completion"))
    got = plan(batch, state, pol, preemption=True, time_limit_s=0.3)
    floor = plan(batch, state, floor_pol, preemption=True)
    got_total, ev = total(got, batch, state, obj)
    assert score(ev) == pytest.approx(score(got), rel=1e-9, abs=1e-6)
    assert got_total <= total(floor, batch, state, obj)[0] + 1e-6
    if floor.preemptions:
        st = got.stats
        assert st["floor_branch_score"] <= total(floor, batch, state, obj)[0] + 1e-6
        assert got_total == pytest.approx(min(st["floor_branch_score"], st["base_branch_score"]), abs=1e-6)
        assert st["undo_branch"] == float(st["base_branch_score"] < st["floor_branch_score"] - pp.MIN_GAIN)
    else:
        assert "undo_branch" not in got.stats
