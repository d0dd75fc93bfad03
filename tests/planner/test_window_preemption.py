"""Preemption decided inside the CP-SAT window model (makespan.planner.window_preemption via
makespan.planner.cpsat.improve(preemption=True) and plan(..., "cpsat", preemption=True))."""

import random

import pytest

from makespan.planner import preemption_plan as pp
from makespan.planner import window_preemption as wp
from makespan.planner.api import plan
from makespan.planner.cpsat import improve
from makespan.planner.window_model import solve_window as _solve_window
from makespan.planner.evaluator import score
from makespan.planner.greedy import portfolio
from tests.planner.test_preemption_plan import _job, _state

OBJ = "weighted_completion"


def _total(p, batch, state, running_end):
    """Score of a plan with preemptions on every job it touches, plus the running jobs it
    does not cut at their original completions: comparable across decisions."""
    cut = {v for x in p.preemptions for v in x.victims}
    ev = pp.evaluate_preemptive(p, batch, state, OBJ) if p.preemptions else p
    kept = [(h.job, running_end[h.id]) for h in {h.id: h for h in state.running.values()}.values() if h.id not in cut]
    return score(ev) + pp.fixed_score(kept, OBJ)


def _critical_behind_low(n_gpus=4, n_crit=1, seed=1):
    """Every GPU held by a LOW job that started 5 s ago for 2000 s; a CRITICAL job (or
    ``n_crit``) waits; ten NORMAL/LOW jobs, some on a TP-2 endpoint (so the windowed LNS,
    not the whole-batch model, plans the batch)."""
    rng = random.Random(seed)
    running = [(_job(f"r{i}", "m1" if i % 2 else "m2", 3, 0.0, 2000.0, i), [f"g{i}"], 95.0, True)
               for i in range(n_gpus)]
    state = _state(100.0, running, n_gpus)
    batch = [_job(f"C{k}", "m1", 0, 100.0, 60.0 + 10 * k, 10 + k) for k in range(n_crit)]
    batch += [_job(f"b{k}", rng.choice(["m1", "m2", "t2"]), rng.choice([2, 3]), 50.0, rng.uniform(50, 400), 20 + k)
              for k in range(10)]
    return state, batch, {h.id: h.end_s for h in state.running.values()}


def test_window_takes_a_preemption_the_plan_without_it_cannot_match():
    state, batch, ends = _critical_behind_low()
    g = portfolio(batch, state)
    with_pre = improve(batch, state, g, time_limit_s=1.0, preemption=True)
    without = improve(batch, state, g, time_limit_s=1.0, preemption=False)
    assert not without.preemptions
    assert with_pre.stats["window_preemptions"] >= 1
    assert [p.job_id for p in with_pre.preemptions] == ["C0"]
    assert all(p.gain > 0 for p in with_pre.preemptions)
    # the plan replays exactly with its preemptions, and its score is what improve said
    assert score(pp.evaluate_preemptive(with_pre, batch, state, OBJ)) == pytest.approx(score(with_pre))
    assert _total(with_pre, batch, state, ends) < _total(without, batch, state, ends) - 1.0


def test_no_candidate_under_the_rules_means_no_preemption():
    """Holders of the same level, or not preemptable: the model gets no candidate."""
    rng = random.Random(4)
    for lvl, ok in [(0, True), (3, False)]:
        running = [(_job(f"r{i}", "m1", lvl, 0.0, 2000.0, i), [f"g{i}"], 95.0, ok) for i in range(3)]
        state = _state(100.0, running, 3)
        batch = [_job("C", "m1", 0, 100.0, 60.0, 10)] + [
            _job(f"b{k}", rng.choice(["m1", "t2"]), 2, 50.0, 100.0, 11 + k) for k in range(9)]
        g = portfolio(batch, state)
        assert wp.window_candidates(g, 0, len(g.assignments), batch, state) == []
        assert not improve(batch, state, g, time_limit_s=0.3, preemption=True).preemptions


def test_model_refuses_a_preemption_that_costs_more_than_it_saves():
    """The victims end in 2 s; cutting one would restart 2000 s of work: never taken."""
    running = [(_job(f"r{i}", "m1", 3, 0.0, 1900.0, i), [f"g{i}"], -1798.0, True) for i in range(3)]
    state = _state(100.0, running, 3)
    batch = [_job("C", "m1", 0, 100.0, 60.0, 10)] + [_job(f"b{k}", "t2" if k % 2 else "m1", 2, 50.0, 100.0, 11 + k)
                                                    for k in range(9)]
    g = portfolio(batch, state)
    hi = wp.preemptive_window_end(g, batch, state, 6, 16)
    pre = wp.window_candidates(g, 0, hi, batch, state)
    assert pre, "the rules allow it"
    sol = _solve_window(g, 0, hi, {j.id: j for j in batch}, state, 1.0, 0, 1, 4, True, OBJ, pre)
    assert sol is not None and sol.taken == []
    assert not improve(batch, state, g, time_limit_s=0.5, preemption=True).preemptions


def test_solver_adds_preemptions_after_the_greedy_decider():
    """Five CRITICAL jobs behind LOW holders: the greedy decider tries three jobs per
    planning point; the CP-SAT windows of ``cpsat`` take the others, and the chained
    plan (floor's preemptions, then the solver's) replays exactly and scores lower."""
    state, batch, ends = _critical_behind_low(n_gpus=8, n_crit=5, seed=3)
    floor = plan(batch, state, "portfolio", preemption=True)
    solver = plan(batch, state, "cpsat", preemption=True, time_limit_s=1.0)
    assert len(floor.preemptions) == 3
    assert len(solver.preemptions) > 3 and solver.stats["window_preemptions"] >= 1
    assert [p.job_id for p in solver.preemptions[:3]] == [p.job_id for p in floor.preemptions]
    ev = pp.evaluate_preemptive(solver, batch, state, OBJ)
    assert score(ev) == pytest.approx(score(solver))
    assert _total(solver, batch, state, ends) < _total(floor, batch, state, ends)


@pytest.mark.parametrize("seed", range(12))
def test_random_instances_never_worse_and_replay_exactly(seed):
    """Random holders (levels, preemptable or not, mid-run) and batches: the improver with
    window preemption is never worse than its start (victims counted at their original
    completions), each preemption obeys the rules (evaluate_preemptive checks them) and
    every job is placed exactly once."""
    rng = random.Random(seed)
    n = rng.choice([3, 4, 6])
    running = []
    for i in range(n):
        job = _job(f"r{i}", rng.choice(["m1", "m2"]), rng.choice([1, 2, 3, 3]), 0.0, rng.uniform(100, 1500), i)
        running.append((job, [f"g{i}"], rng.uniform(-500, 99), rng.random() > 0.2))
    state = _state(100.0, running, n)
    batch = [_job(f"C{k}", rng.choice(["m1", "m2"]), rng.choice([0, 1]), 100.0, rng.uniform(20, 300), 10 + k)
             for k in range(rng.randint(1, 3))]
    batch += [_job(f"b{k}", rng.choice(["m1", "m2", "t2"]), rng.choice([1, 2, 3]), rng.uniform(0, 150),
                   rng.uniform(20, 400), 20 + k) for k in range(rng.randint(6, 14))]
    ends = {h.id: h.end_s for h in state.running.values()}
    g = portfolio(batch, state)
    p = improve(batch, state, g, time_limit_s=0.4, seed=seed, preemption=True)
    assert _total(p, batch, state, ends) <= _total(g, batch, state, ends) + 1e-6
    ev = pp.evaluate_preemptive(p, batch, state, OBJ)
    cut = [v for x in p.preemptions for v in x.victims]
    assert len(cut) == len(set(cut))
    placed = sorted(a.job_id for a in ev.assignments)
    assert placed == sorted([j.id for j in batch] + cut)
