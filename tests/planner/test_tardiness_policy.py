"""Weighted tardiness as a multi-GPU policy (planner/tardiness_policy.py): the evaluator's
objective, the single-machine optimum on one GPU, exhaustive search on small fleets with
transitions, and the greedy floor."""

import dataclasses
import random
import time

import pytest

from makespan.errors import PlannerError
from makespan.planner.api import plan
from makespan.planner.cpsat import SearchEffort
from makespan.planner.evaluator import TARDINESS_EPS, evaluate, score
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.synthetic import instance
from makespan.planner.tardiness import solve_single_machine
from makespan.planner.tardiness_policy import order_search, tardiness_members, tardiness_policy, tardiness_portfolio
from tests.planner.test_exactness import brute_force


def with_deadlines(batch, seed, k=(1.0, 3.0)):
    """Deadline d_j = r_j + U(k)·p_j, rounded to 0.1 s (seeded)."""
    rng = random.Random(seed)
    return [dataclasses.replace(j, deadline_s=round(j.release_s + rng.uniform(*k) * j.service_s, 1)) for j in batch]


def wt40_like(seed, n=10, tf=0.6, rdd=0.6):
    """One warm GPU, one endpoint, n jobs released at 0: p ~ U[1,100], w ~ U[1,10],
    d ~ U[P(1 − TF − RDD/2), P(1 − TF + RDD/2)] (the OR-Library wt40 generator)."""
    rng = random.Random(seed)
    p = [rng.randint(1, 100) for _ in range(n)]
    w = [rng.randint(1, 10) for _ in range(n)]
    tot = sum(p)
    d = [rng.randint(max(0, int(tot * (1 - tf - rdd / 2))), int(tot * (1 - tf + rdd / 2))) for _ in range(n)]
    st = FleetState(0.0, [Gpu("g0", "h", 0, 80_000)], {"e": EndpointModel("e", 1, 1000, 60.0, 5.0)},
                    resident={"g0": "e"})
    batch = [PlanJob(f"j{i}", "e", float(w[i]), 0.0, float(p[i]), deadline_s=float(d[i]), seq=i) for i in range(n)]
    return batch, st, (p, w, d)


def test_evaluator_scores_weighted_tardiness():
    eps = {"a": EndpointModel("a", 1, 1000, 10.0, 2.0)}
    st = FleetState(0.0, [Gpu("g0", "h", 0, 80_000)], eps, resident={"g0": "a"})
    batch = [PlanJob("x", "a", 2.0, 0.0, 20.0, deadline_s=15.0), PlanJob("y", "a", 3.0, 0.0, 10.0, deadline_s=100.0),
             PlanJob("z", "a", 5.0, 0.0, 5.0)]
    p = plan(batch, st, "fifo")  # x 0–20, y 20–30, z 30–35 (same priority: submission order)
    e = evaluate(p, batch, st, objective="weighted_tardiness")
    assert e.objective == 2.0 * 5.0  # only x is late; z has no deadline
    assert e.stats["weighted_completion"] == 2 * 20 + 3 * 30 + 5 * 35
    assert score(e) == pytest.approx(10.0 + TARDINESS_EPS * (40 + 90 + 175))
    assert evaluate(p, batch, st).objective == 40 + 90 + 175  # the default objective is unchanged
    with pytest.raises(PlannerError):
        evaluate(p, batch, st, objective="makespan")


@pytest.mark.parametrize("seed", range(4))
def test_one_gpu_reaches_the_single_machine_optimum(seed):
    batch, st, (p, w, d) = wt40_like(seed)
    # the reference ends at CP-SAT's proof (120 s is a backstop; it proves in about a second
    # alone, and ran out of a 4.5 s limit on a loaded host)
    ref = solve_single_machine(p, w, d, time_limit_s=120.0, ils_fraction=0.005)
    assert ref.optimal
    # bounded by work: 1500 decodes end the order search, the LNS ends at its own end with
    # 0.5 deterministic s per window; 120 s is a backstop
    got = tardiness_policy(batch, st, time_limit_s=120.0, max_evals=1500, effort=SearchEffort(deterministic_s=0.5))
    assert got.objective == pytest.approx(ref.value)
    assert evaluate(got, batch, st, objective="weighted_tardiness").objective == pytest.approx(got.objective)


@pytest.mark.parametrize("seed", range(4))
def test_exhaustive_optimum_with_transitions(seed):
    n_jobs, n_gpus = (5, 4) if seed % 2 else (6, 2)
    batch, st = instance(n_jobs, n_gpus, models=3, seed=seed, spread_s=100, gang=True)
    batch = with_deadlines(batch, seed)

    def cost(j, end):
        return j.weight * max(0.0, end - j.deadline_s) + TARDINESS_EPS * j.weight * (end - j.release_s)
    opt = brute_force(batch, st, cost)
    got = plan(batch, st, "tardiness", time_limit_s=30.0)
    assert got.stats["proven_optimal"] == 1.0
    assert score(got) == pytest.approx(opt, rel=1e-12)  # no future cost: state.demand is empty
    assert got.objective > 0  # the instances are tight enough to be non-trivial


@pytest.mark.parametrize("seed", [0, 4, 6])
def test_exhaustive_optimum_with_demand_set(seed):
    """With ``demand`` set (as in the live worker and the simulator) the plan's score has a
    future-cost part; the exact search's bound must not mix it into the searched cost."""
    n_jobs, n_gpus = (5, 4) if seed % 2 else (6, 2)
    batch, st = instance(n_jobs, n_gpus, models=3, seed=seed, spread_s=100, gang=True)
    batch = with_deadlines(batch, seed)
    st.demand = {e: 8.0 for e in st.endpoints}
    st.demand_share = {e: 1 / len(st.endpoints) for e in st.endpoints}

    def cost(j, end):
        return j.weight * max(0.0, end - j.deadline_s) + TARDINESS_EPS * j.weight * (end - j.release_s)
    opt = brute_force(batch, st, cost)
    got = plan(batch, st, "tardiness", time_limit_s=30.0)
    assert got.stats["proven_optimal"] == 1.0
    searched = got.stats["weighted_tardiness"] + TARDINESS_EPS * got.stats["weighted_completion"]
    assert searched == pytest.approx(opt, rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_never_worse_than_its_floor_or_any_member(seed):
    batch, st = instance(30, 8, models=5, seed=seed, spread_s=200, gang=True)
    batch = with_deadlines(batch, seed)
    floor = tardiness_portfolio(batch, st)
    assert score(floor) == pytest.approx(min(score(m) for m in tardiness_members(batch, st)))
    got = plan(batch, st, "tardiness", time_limit_s=0.5)
    assert score(got) <= score(floor) + 1e-9
    assert got.stats["floor_score"] == pytest.approx(score(floor))
    again = evaluate(got, batch, st, objective="weighted_tardiness")
    assert again.objective == pytest.approx(got.objective) and score(again) == pytest.approx(score(got))
    for base in ("fifo", "wspt", "portfolio"):
        assert score(got) <= score(evaluate(plan(batch, st, base), batch, st, objective="weighted_tardiness")) + 1e-9


def test_without_deadlines_it_orders_by_weighted_completion():
    batch, st = instance(12, 4, models=3, seed=5, spread_s=50, gang=False)
    got = tardiness_portfolio(batch, st)
    assert got.objective == 0.0
    assert got.stats["weighted_completion"] <= plan(batch, st, "portfolio").objective + 1e-9


def test_simulator_reports_weighted_tardiness():
    from makespan.planner.simulator import simulate
    batch, st = instance(20, 4, models=3, seed=2, spread_s=300, gang=False)
    loose = [dataclasses.replace(j, deadline_s=j.release_s + 1e6) for j in batch]
    r = simulate(loose, st, "tardiness-portfolio")
    assert (r["weighted_tardiness_s"], r["tardy_jobs"], r["jobs_with_deadline"]) == (0.0, 0, 20)
    tight = [dataclasses.replace(j, deadline_s=j.release_s + 1.0) if i % 2 else j for i, j in enumerate(batch)]
    r = simulate(tight, st, "fifo")
    # every job with a deadline is late by at least its service time − 1 s
    assert r["tardy_jobs"] == r["jobs_with_deadline"] == 10
    assert r["weighted_tardiness_s"] >= sum(j.weight * (j.service_s - 1.0) for j in tight[1::2])


def test_order_search_is_deterministic_for_a_seed_and_never_worse():
    import time
    from makespan.planner.tardiness_policy import order_search
    batch, st = instance(25, 4, models=4, seed=7, spread_s=100, gang=True)
    batch = with_deadlines(batch, 7, k=(1.0, 2.0))
    floor = tardiness_portfolio(batch, st)
    runs = [order_search(batch, st, floor, time.perf_counter() + 60, seed=3, max_evals=150) for _ in range(2)]
    assert runs[0].stats["order_evals"] == 150
    assert [(a.job_id, a.gpus, a.start_s) for a in runs[0].assignments] == \
        [(a.job_id, a.gpus, a.start_s) for a in runs[1].assignments]
    assert score(runs[0]) <= score(floor)


def test_previous_plan_is_a_start_when_better():
    """A previous plan that scores lower than the floor is where the search starts, so the
    result is never worse than it (plan stability across planning points)."""
    batch, st = instance(30, 8, models=5, seed=1, spread_s=200, gang=True)
    batch = with_deadlines(batch, 1)
    floor = tardiness_portfolio(batch, st)
    good = order_search(batch, st, floor, time.perf_counter() + 60.0, seed=0, max_evals=300)  # 300 decodes end it
    assert score(good) < score(floor)  # the search found something the floor did not
    again = plan(batch, st, "tardiness", time_limit_s=0.01, previous=good)
    assert again.stats["previous_used"] == 1.0 and score(again) <= score(good) + 1e-6
    cold = plan(batch, st, "tardiness", time_limit_s=0.01)
    assert cold.stats["previous_used"] == 0.0


def _atc_reference(batch, st, k):
    """ATC as first written (every index recomputed at every step, O(n²)): what the
    incremental :func:`makespan.planner.tardiness_policy.atc_construct` must reproduce."""
    import math

    from makespan.planner.replay import Replay
    from makespan.planner.rules import aware_rule
    rep, rule, eps = Replay(st), aware_rule(batch, st), st.endpoints
    left, ids = list(batch), {j.id for j in batch}
    pbar = max(sum(j.service_s for j in left) / len(left), 1e-9)
    sbar = max(sum(eps[e].cold_start_s for e in {j.endpoint for j in left}) / len({j.endpoint for j in left}), 1e-9)
    out, placed = [], set()
    while left:
        t = max(st.now_s, min(rep.free_at.values()))
        avail = [j for j in left if all(d in placed or d not in ids for d in j.deps)]
        ready = {j.id: rep.ready(j) for j in avail}
        cands = [j for j in avail if ready[j.id] <= t] or \
            [j for j in avail if ready[j.id] == min(ready.values())]

        def index(j, t=t, ready=ready):
            ep = eps[j.endpoint]
            base = j.weight / max(j.service_s * ep.tp, 1e-9)
            if j.deadline_s is None:
                return (0.0, base, -j.seq)
            s = 0.0 if rep.whole_gpus(j.endpoint) >= ep.tp else ep.cold_start_s
            slack = max(j.deadline_s - j.service_s - s - max(t, ready[j.id]), 0.0)
            return (base * math.exp(-slack / (k * pbar) - s / (k * sbar)), base, -j.seq)
        job = max(cands, key=index)
        out.append(rep.place(job, rule(rep, job, rep.groups(eps[job.endpoint]), ready[job.id])))
        rule.placed(job)
        placed.add(job.id)
        left.remove(job)
    return out


def _varied(seed):
    """Deadlines on most jobs, some equal submission numbers, dependencies, busy GPUs."""
    rng = random.Random(seed)
    batch, st = instance(40, 8, models=4, seed=seed, spread_s=rng.choice((0.0, 300.0)), gang=seed % 2 == 0,
                         wake=seed % 3 == 0)
    batch = [dataclasses.replace(j, deadline_s=j.release_s + rng.uniform(2, 6) * j.service_s,
                                 seq=j.seq if seed % 2 else j.seq // 3) if rng.random() < 0.7 else j for j in batch]
    batch = [dataclasses.replace(j, deps=(batch[rng.randrange(i)].id,)) if i and rng.random() < 0.2 else j
             for i, j in enumerate(batch)]
    st.now_s = 20.0
    st.free_at = {g.uuid: rng.uniform(0, 300) for g in st.gpus if rng.random() < 0.5}
    return batch, st


@pytest.mark.parametrize("seed", range(6))
def test_incremental_atc_places_as_the_reference(seed):
    from makespan.planner.tardiness_policy import ATC_K, atc_construct
    batch, st = _varied(seed)
    for k in ATC_K:
        assert [vars(a) for a in atc_construct(batch, st, k)] == [vars(a) for a in _atc_reference(batch, st, k)]


@pytest.mark.parametrize("seed", range(6))
def test_pruned_floor_is_the_best_member(seed):
    """The floor built best-first with pruning is the first best-scored member of
    :func:`tardiness_members`, replayed by ``evaluate``."""
    batch, st = _varied(seed)
    plans = tardiness_members(batch, st)
    best = min(plans, key=score)
    got = tardiness_portfolio(batch, st)
    assert [vars(a) for a in got.assignments] == [vars(a) for a in best.assignments]
    assert {k: v for k, v in got.stats.items() if k != "member"} == best.stats and got.objective == best.objective


def test_tardiness_prune_bound_never_exceeds_the_final_score():
    from makespan.planner.evaluator import TARDINESS_EPS
    from makespan.planner.list_schedule import TardinessPrune
    from makespan.planner.tardiness_policy import atc_built
    batch, st = _varied(3)
    asg, rep = atc_built(batch, st, 1.0)
    final = next(p for p in tardiness_members(batch, st) if p.policy == "atc-1")
    free = {g.uuid: max(st.free_at.get(g.uuid, st.now_s), st.now_s) for g in st.gpus}
    pr = TardinessPrune(batch, st.now_s, score(final), free, TARDINESS_EPS)
    jobs = {j.id: j for j in batch}
    for a in asg:  # replaying the construction's placements: the bound stays below the score
        for u in a.gpus:
            free[u] = a.end_s
        assert pr.placed(jobs[a.job_id], a.gpus, a.end_s)
        assert pr.done + pr.rest <= score(final) * (1 + 1e-12) + 1e-12
