"""Set-point absence weighed by the planner (FleetState.set_point_weight, issue 3): the
evaluator's term, the transition-aware rule, the CP-SAT window model's estimate, the
simulator's plumbing; and plans unchanged at weight 0."""

import hashlib
import math
from dataclasses import replace

import pytest

from makespan.errors import PlannerError
from makespan.planner.api import plan
from makespan.planner.cpsat import improve
from makespan.planner.evaluator import evaluate, score
from makespan.planner.greedy import construct, portfolio
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.replay import Replay
from makespan.planner.restore import planned_absence
from makespan.planner.simulator import simulate
from makespan.planner.synthetic import instance
from makespan.planner import window_model

EPS = {"sp": EndpointModel("sp", 1, 1000, 100.0, 5.0), "b": EndpointModel("b", 1, 1000, 100.0, 5.0),
       "t2": EndpointModel("t2", 2, 1000, 40.0, 5.0, wake_s=10.0)}
GPUS = [Gpu(f"g{i}", "a", i, 80000) for i in range(4)]


def _near(w: float = 0.0) -> tuple[list[PlanJob], FleetState]:
    """One job of b: g0 (set point sp, resident) finishes it at 155 (evict 5 + cold 100 +
    50), g1 (free at 10, empty) at 160; g2+g3 busy (a TP-2 set point)."""
    st = FleetState(0.0, GPUS, EPS, resident={"g0": "sp", "g1": None, "g2": "t2", "g3": "t2"},
                    set_point={"g0": "sp", "g2": "t2", "g3": "t2"},
                    free_at={"g0": 0.0, "g1": 10.0, "g2": 5000.0, "g3": 5000.0}, set_point_weight=w)
    return [PlanJob("j", "b", 1.0, 0.0, 50.0)], st


def test_weight_is_validated():
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(PlannerError, match="set_point_weight"):
            _near(bad)
    assert _near()[1].set_point_weight == 0.0


@pytest.mark.parametrize("policy", ["portfolio", "cpsat"])
def test_large_weight_keeps_the_set_point_when_a_free_group_is_almost_as_good(policy):
    batch, st = _near(0.0)
    assert plan(batch, st, policy, time_limit_s=0.2).assignments[0].gpus == ("g0",)  # 5 s earlier
    batch, st = _near(1.0)
    p = plan(batch, st, policy, time_limit_s=0.2)
    assert p.assignments[0].gpus == ("g1",) and p.assignments[0].end_s == 160.0
    assert p.stats["set_point_absent_gpu_s"] == 0.0 and p.stats["score"] == 160.0


def test_score_grows_by_weight_times_the_hand_computed_absence():
    batch, st0 = _near(0.0)
    on_g0 = construct("wspt", batch, st0)  # earliest completion: g0 from 0, ends 155
    base = evaluate(on_g0, batch, st0)
    assert base.stats["score"] == 155.0 and "set_point_absent_gpu_s" not in base.stats
    for w in (0.5, 3.0):
        p = evaluate(on_g0, batch, _near(w)[1])
        # sp absent on 1 GPU from 0 (evict starts) to the restore's end: 155 + evict b 5 + cold sp 100
        assert p.stats["set_point_absent_gpu_s"] == 260.0
        assert p.stats["score"] == 155.0 + w * 260.0 and p.objective == 155.0


def test_absence_counts_instances_absent_now_and_tp2_instances_whole():
    st = FleetState(0.0, GPUS, EPS, resident={"g0": None, "g1": "b", "g2": "t2", "g3": "t2"},
                    set_point={"g0": "sp", "g2": "t2", "g3": "t2"}, free_at={"g1": 1000.0}, set_point_weight=2.0)
    job = PlanJob("j", "b", 1.0, 0.0, 50.0)
    # j on g2 from 0: evicts t2 (5) + cold b (100), ends 155; the t2 restore evicts b (5) and
    # cold starts t2 (40: not asleep on g3) -> 200, on 2 GPUs = 400; sp absent now: its
    # restore on the idle g0 is a cold start, 0 -> 100 = 100 GPU-s
    p = evaluate([replace(construct("x", [job], st, "completion")[0], gpus=("g2",))], [job], st, check_times=False)
    assert p.assignments[0].end_s == 155.0
    assert p.stats["set_point_absent_gpu_s"] == 500.0 and p.stats["set_point_cost"] == 1000.0


def _case(seed: int, w: float):
    batch, st = instance(30 if seed % 2 else 12, 8, models=4, seed=seed, spread_s=200.0, gang=seed % 3 != 0,
                         wake=seed % 2 == 0)
    st.set_point = {u: e for u, e in st.resident.items() if e is not None}
    st.set_point_weight = w
    return batch, st


def _digest(p) -> str:
    s = repr([(a.job_id, a.gpus, round(a.start_s, 6), round(a.end_s, 6)) for a in p.assignments])
    return hashlib.sha1(s.encode()).hexdigest()[:12]


# (seed, policy) -> (plan digest, score, restores) on main before set_point_weight existed
# (c851031); the same instances with set points on every resident GPU
BEFORE = {(0, "fifo"): ("7d471be39fe7", 8906.7, 3), (1, "portfolio"): ("835a5c52f5d0", 28617.9, 3),
          (2, "wspt"): ("8726be66e72f", 7597.6, 6), (3, "portfolio"): ("7f5d425f1d9e", 29450.5, 2),
          (4, "portfolio"): ("69137f792c95", 7126.4, 3), (5, "portfolio"): ("fe192f59a9b9", 36637.2, 5)}


def test_weight_zero_plans_are_unchanged():
    for (seed, policy), want in BEFORE.items():
        batch, st = _case(seed, 0.0)
        p = plan(batch, st, policy, restore_at="group")
        got = (_digest(p), round(p.stats["score"], 6), len(p.restores))
        assert got == want, (seed, policy)
        assert not any(k.startswith("set_point") for k in p.stats)


@pytest.mark.parametrize("seed", range(6))
def test_cpsat_never_worse_than_portfolio_with_weight(seed):
    batch, st = _case(seed, 5.0)
    floor = portfolio(batch, st)
    p = plan(batch, st, "cpsat", time_limit_s=0.3)
    assert score(evaluate(p, batch, st)) <= score(floor) + 1e-6
    assert p.stats["score"] == pytest.approx(score(evaluate(p, batch, st)))


@pytest.mark.parametrize("seed", range(4))
def test_window_model_hint_stays_feasible_and_scored_with_the_term(seed):
    """verify_hint with the set-point term: the incumbent's hint (its term included) is a
    solution of the model, so the window's solution is never above the hint's objective;
    the improver (windows decoded, accepted by the evaluator) is never worse."""
    batch, st = _case(seed, 5.0)
    floor = portfolio(batch, st)
    jobs = {j.id: j for j in batch}
    # 2 s of wall time: at 0.3 s a loaded machine sometimes gave CP-SAT no time to find any
    # solution (None), which says nothing about the hint; the assertion is about the objective
    sol = window_model.solve_window(floor, 0, min(6, len(batch)), jobs, st, 2.0, 0, 1, 4, True)
    assert sol is not None and sol.objective <= sol.hint_objective + 1e-6
    p = improve(batch, st, floor, time_limit_s=0.3, verify_hint=True)
    assert score(p) <= score(floor) + 1e-6


def test_planned_absence_is_zero_without_set_points():
    batch, st = _case(0, 1.0)
    st.set_point = {}
    p = evaluate(portfolio(batch, st), batch, st)
    assert p.stats["set_point_absent_gpu_s"] == 0.0
    assert planned_absence([], {}, Replay(st), st) == 0.0


def test_simulator_passes_the_weight_and_is_unchanged_at_zero():
    batch, st = _case(1, 0.0)
    # CRITICAL-only lane: the lane's forced HIGH starts (the default since 2026-12-03) take the
    # group that starts them in time whatever the set point, so the weight's effect is seen without them
    lane = {"lane_levels": (0,), "lane_start_grace_s": {0: 30.0}}
    a = simulate(batch, st, "portfolio", **lane)
    b = simulate(batch, st, "portfolio", set_point_weight=0.0, **lane)
    for r in (a, b):  # wall-clock figures
        r["sim"].pop("wall_s")
        r.pop("planner")
    assert a["sim"]["set_point_weight"] == 0.0
    assert a == b
    c = simulate(batch, st, "portfolio", set_point_weight=50.0, **lane)
    assert c["sim"]["set_point_weight"] == 50.0
    assert c["set_point_absent_gpu_s"] <= a["set_point_absent_gpu_s"]
    with pytest.raises(PlannerError):
        simulate(batch, st, "portfolio", set_point_weight=-1.0)


@pytest.mark.parametrize("w, group", [(0.0, ("g0",)), (1.0, ("g1",))])
def test_window_model_term_moves_the_job_off_the_set_point(w, group):
    """The window's own choice (before the evaluator): a warm job k of sp on g0 (ends 10)
    and j on g1 (free at 20); the model moves j after k on g0 (ends 10 + σ 105 + 50, 10 s
    earlier than on g1) without the term and keeps it on g1 with it."""
    batch, st = _near(w)
    st.free_at["g1"] = 20.0
    batch = [PlanJob("k", "sp", 1.0, 0.0, 10.0, seq=0), replace(batch[0], seq=1)]
    rep = Replay(st)
    inc = evaluate([rep.place(batch[0], ("g0",)), rep.place(batch[1], ("g1",))], batch, st)
    sol = window_model.solve_window(inc, 0, 2, {j.id: j for j in batch}, st, 1.0, 0, 1, 4, True)
    assert sol is not None and sol.optimal and sol.groups == {"k": ("g0",), "j": group}


@pytest.mark.parametrize("rule", ["aware", "share"])
@pytest.mark.parametrize("tp", [1, 2])
def test_aware_rule_charges_the_absence(rule, tp):
    """The transition-aware rule alone (single-GPU and gang paths, with and without the
    share term) keeps the set point at a large weight and takes it at weight 0."""
    eps = dict(EPS, b=EndpointModel("b", tp, 1000, 100.0, 5.0))
    gpus = [Gpu(f"g{i}", "a", i, 80000) for i in range(4)]
    sp = {"g0": "sp", "g1": "sp"} if tp == 2 else {"g0": "sp"}
    eps["sp"] = EndpointModel("sp", tp, 1000, 100.0, 5.0)
    for w, want in ((0.0, ("g0", "g1")[:tp]), (1.0, ("g2", "g3")[:tp])):
        st = FleetState(0.0, gpus, eps, resident=dict(sp), set_point=dict(sp),
                        free_at={"g1": 0.0 if tp == 2 else 1000.0, "g2": 10.0, "g3": 10.0}, set_point_weight=w,
                        demand_share={"b": 1.0} if rule == "share" else {})
        got = construct("x", [PlanJob("j", "b", 1.0, 0.0, 50.0)], st, rule)[0].gpus
        assert got == want, (w, got)


@pytest.mark.parametrize("at", ["group", "horizon", "group-demand"])
def test_the_absence_does_not_depend_on_where_the_plan_puts_its_restores(at):
    batch, st = _case(3, 1.0)
    bare = plan(batch, st, "portfolio")
    p = plan(batch, st, "portfolio", restore_at=at)
    again = evaluate(p, batch, st)
    assert p.restores and again.stats["set_point_absent_gpu_s"] == bare.stats["set_point_absent_gpu_s"] > 0
    assert again.stats["set_point_cost"] == bare.stats["set_point_cost"]


def test_plan_level_preemption_keeps_the_weight_on_the_states_it_builds():
    """preemption_plan.apply builds new FleetStates for a preemption's branch: the weight
    goes with them (else the branch's plans would be scored without the term)."""
    from makespan.planner.model import RunningJob
    from makespan.planner.preemption_plan import Candidate, apply

    batch, st = _case(5, 2.0)
    job = batch[0]
    g = st.groups(st.endpoints[job.endpoint].tp)[0]
    victim = RunningJob(replace(batch[-1], id="v", priority=3), g, -100.0, -50.0, 500.0)
    st.running = {u: victim for u in g}
    st.free_at.update({u: 500.0 for u in g})
    st2, _rest, _a = apply(st, batch, Candidate(replace(job, priority=0), g, (victim,), 100.0 * len(g)))
    assert st2.set_point_weight == 2.0
