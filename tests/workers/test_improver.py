"""The default policy in the live planner: greedy per tick, CP-SAT improver on a
background thread (workers/improver.py); the improved plan is adopted only when it
scores better on the tick that uses it."""

from __future__ import annotations

import dataclasses

from app.producer import Producer
from planner.api import plan
from planner.evaluator import evaluate, score
from planner.model import PlanJob
from planner.synthetic import instance
from tests.faults.test_priority_cases import ONE_GPU
from workers.improver import BackgroundImprover, adapt
from workers.planner_worker import PlannerWorker

SEED = 25  # a 6-job, 2-GPU batch where the portfolio is 2,841.3 and the optimum 1,927.0


def _case():
    batch, state = instance(6, 2, models=3, seed=SEED, gang=False)
    return batch, state, plan(batch, state, "portfolio"), plan(batch, state, "default", time_limit_s=5)


def test_case_has_an_improvement_to_find():
    _b, _s, floor, best = _case()
    assert score(best) < 0.9 * score(floor) and best.stats["proven_optimal"] == 1.0


def test_adapt_keeps_order_and_groups_and_never_loses_on_the_same_state():
    batch, state, _floor, best = _case()
    out = adapt(best, batch, state)
    assert out is not None and score(out) <= score(best) + 1e-6
    assert {a.job_id: a.gpus for a in out.assignments} == {a.job_id: a.gpus for a in best.assignments}
    evaluate(out, batch, state)  # feasible under the evaluator (raises otherwise)


def test_adapt_drops_started_jobs_and_places_new_ones():
    batch, state, _floor, best = _case()
    first = min(best.assignments, key=lambda a: a.start_s).job_id
    new = PlanJob("late", batch[0].endpoint, 8.0, 0.0, 30.0, 0, seq=99)
    rest = [j for j in batch if j.id != first] + [new]
    out = adapt(best, rest, state)
    assert out is not None
    assert sorted(a.job_id for a in out.assignments) == sorted(j.id for j in rest)
    assert adapt(best, [new], state) is None  # nothing of the improved plan is left


def test_background_improver_adopts_only_a_better_plan():
    batch, state, floor, best = _case()
    imp = BackgroundImprover("default", time_limit_s=5)
    assert imp.best(floor, batch, state) is floor  # nothing solved yet
    assert imp.offer(batch, state)
    assert imp.wait_idle(30)
    assert not imp.offer(batch, state)  # the same batch is not solved twice
    got = imp.best(floor, batch, state)
    assert score(got) == score(best) and imp.stats["adopted"] == 1
    assert got.stats["greedy_score"] == score(floor)
    assert imp.best(best, batch, state) is best  # not strictly better than the floor: floor kept
    short = BackgroundImprover("default", time_limit_s=5)
    assert not short.worth_solving(49.0) and short.worth_solving(50.0)  # 10 time limits
    worse = BackgroundImprover("fifo", time_limit_s=1)
    worse.offer(batch, state)
    assert worse.wait_idle(10)
    assert worse.best(floor, batch, state) is floor


def test_live_planner_runs_the_default_policy_with_the_improver(r, keys, settings):
    assert settings.policy == "default"
    settings = dataclasses.replace(settings, solve_time_limit_s=0.01)  # plans of ~0.46 wall s: ≥ 10 limits
    sent = []
    w = PlannerWorker(r, settings, ONE_GPU, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = ""
    prod = Producer(r, keys, ONE_GPU, settings)
    for i in range(4):
        prod.submit({"endpoint": "e", "service_s": 10 + i})
    w.tick()
    assert len(sent) == 1 and w.improver is not None
    assert w.improver.stats["offered"] == 1  # the three left queued went to the improver
    assert w.improver.wait_idle(10)
    w.tick()  # GPU still leased: nothing starts, the same three are not solved again
    assert len(sent) == 1 and w.improver.stats["offered"] == 1


def test_background_improver_for_tardiness_adopts_by_weighted_tardiness(r, settings):
    import pytest
    batch, state = instance(6, 2, models=3, seed=4, gang=False)
    batch = [dataclasses.replace(j, deadline_s=round(j.release_s + 1.5 * j.service_s, 1)) for j in batch]
    floor = plan(batch, state, "tardiness-portfolio")  # weighted tardiness 1,193.2
    imp = BackgroundImprover("tardiness", time_limit_s=5)
    assert imp.objective == "weighted_tardiness"
    assert imp.offer(batch, state) and imp.wait_idle(30)
    got = imp.best(floor, batch, state)
    assert imp.stats["adopted"] == 1
    assert got.objective == pytest.approx(974.6) and got.objective < floor.objective  # exact search's optimum
    assert evaluate(got, batch, state, objective="weighted_tardiness").objective == pytest.approx(got.objective)
    w = PlannerWorker(r, dataclasses.replace(settings, policy="tardiness"), ONE_GPU, dispatch=lambda *a: None)
    assert w.improver is not None and w.improver.objective == "weighted_tardiness"
