"""Hints from the previous plan: repair to the current batch, use when better, never worse."""

import pytest

from makespan.planner import simulator, simulator_run
from makespan.planner.api import plan
from makespan.planner.cpsat import cpsat_policy, improve
from makespan.planner.evaluator import evaluate, score
from makespan.planner.greedy import fifo, portfolio
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.previous import repair
from makespan.planner.synthetic import instance


def _next_point(batch, st, gone: int, new: int):
    """The batch at the next planning point: the first ``gone`` jobs committed, ``new``
    jobs arrived, GPU 0 busy with running work until t=400."""
    extra, _ = instance(len(batch) + new, len(st.gpus), len(st.endpoints), seed=99, spread_s=60)
    eps = sorted(st.endpoints)
    added = [PlanJob(f"n{i}", eps[i % len(eps)], j.weight, 100.0, j.service_s, j.priority, seq=1000 + i)
             for i, j in enumerate(extra[:new])]
    st2 = FleetState(100.0, st.gpus, st.endpoints, free_at={st.gpus[0].uuid: 400.0},
                     resident=dict(st.resident))
    return batch[gone:] + added, st2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_repaired_previous_plan_is_feasible_and_keeps_groups(seed):
    batch, st = instance(50, 8, 6, seed=seed, spread_s=60)
    prev = portfolio(batch, st)
    batch2, st2 = _next_point(batch, st, gone=10, new=8)
    rep = repair(prev, batch2, st2)
    assert rep is not None
    again = evaluate(rep, batch2, st2)  # the evaluator accepts it as stated
    assert again.objective == pytest.approx(rep.objective)
    assert {a.job_id for a in rep.assignments} == {j.id for j in batch2}
    old = prev.by_job()
    assert rep.stats["kept"] == 40
    assert all(a.gpus == old[a.job_id].gpus for a in rep.assignments if a.job_id in old)
    assert all(a.start_s >= 400.0 for a in rep.assignments if st.gpus[0].uuid in a.gpus)  # running work kept


def test_repair_replaces_a_job_whose_group_no_longer_fits():
    batch, st = instance(12, 8, 3, seed=4, gang=False)
    prev = portfolio(batch, st)
    a0 = prev.assignments[0]
    bad = Assignment(a0.job_id, ("no-such-gpu",), a0.start_s, a0.service_start_s, a0.end_s)
    rep = repair(Plan("old", [bad] + prev.assignments[1:]), batch, st)
    assert rep is not None and rep.stats["kept"] == 11
    evaluate(rep, batch, st)


def test_improver_starts_from_a_better_previous_plan():
    batch, st = instance(40, 8, 6, seed=3, spread_s=120)
    worse, better = fifo(batch, st), portfolio(batch, st)
    assert score(better) < score(worse) - 1.0  # the constructed case: previous beats the floor
    out = improve(batch, st, worse, time_limit_s=0.0, previous=better)
    assert out.stats["previous_used"] == 1.0
    assert score(out) == pytest.approx(score(better))
    evaluate(out, batch, st)


@pytest.mark.parametrize("seed", [0, 1])
def test_improver_never_worse_than_floor_nor_previous(seed):
    batch, st = instance(60, 8, 6, seed=seed, spread_s=120)
    floor = portfolio(batch, st)
    batch2, st2 = _next_point(batch, st, gone=6, new=6)
    floor2 = portfolio(batch2, st2)
    for prev in (floor, fifo(batch, st)):  # one good, one poor previous plan
        rep = repair(prev, batch2, st2)
        out = improve(batch2, st2, floor2, time_limit_s=0.2, seed=seed, previous=prev)
        evaluate(out, batch2, st2)
        assert score(out) <= min(score(floor2), score(rep)) + 1e-6
        assert out.stats["previous_score"] == pytest.approx(score(rep))
        assert out.stats["previous_used"] == float(score(rep) < score(floor2) - 1e-6)


def test_small_batch_paths_take_previous_through_plan():
    batch, st = instance(6, 4, 3, seed=5, gang=False)  # exact path (≤ 7 jobs)
    worse = fifo(batch, st)
    out = plan(batch, st, "cpsat", time_limit_s=0.5, previous=worse)
    assert score(out) <= min(score(portfolio(batch, st)), score(worse)) + 1e-6
    assert out.stats["previous_score"] == pytest.approx(score(worse))
    batch, st = instance(20, 4, 3, seed=5, gang=False)  # whole-batch CP-SAT path
    out = cpsat_policy(batch, st, time_limit_s=0.3, previous=fifo(batch, st))
    assert score(out) <= score(portfolio(batch, st)) + 1e-6 and "previous_score" in out.stats


def test_simulator_passes_the_uncommitted_plan(monkeypatch):
    batch, st = instance(40, 4, 3, seed=6, spread_s=600, gang=False)
    seen = []

    def spy(b, state, policy, previous=None, **kw):
        out = portfolio(b, state)
        seen.append((state.now_s, previous, out))
        return out

    monkeypatch.setattr(simulator_run, "plan", spy)  # _Run.plan_point calls it
    simulator.simulate(batch, st, "portfolio", window_s=30.0)
    assert seen[0][1] is None and len(seen) > 2
    for (t0, _p, out0), (_t, prev, _o) in zip(seen, seen[1:]):
        later = {a.job_id for a in out0.assignments if a.start_s >= t0 + 30.0}
        assert {a.job_id for a in prev.assignments} == later  # the uncommitted rest, nothing committed
    assert any(p.assignments for _t, p, _o in seen[1:])
