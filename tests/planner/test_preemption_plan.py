"""Preemption decided inside the plan, by score (makespan.planner.preemption_plan, plan(preemption=True),
simulate(preemption="plan"))."""

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from makespan.planner import preemption_plan as pp
from makespan.planner.api import plan
from makespan.planner.evaluator import InfeasiblePlan, evaluate, score
from makespan.planner.greedy import portfolio
from makespan.planner.model import Assignment, EndpointModel, FleetState, Gpu, Plan, PlanJob, RunningJob
from makespan.planner.simulator import simulate
from makespan.planner.tardiness_policy import tardiness_portfolio

EPS = {"m1": EndpointModel("m1", 1, 1000, 30.0, 5.0), "m2": EndpointModel("m2", 1, 1000, 60.0, 5.0),
       "t2": EndpointModel("t2", 2, 1000, 40.0, 5.0)}
W = {0: 8.0, 1: 4.0, 2: 2.0, 3: 1.0}


def _job(jid, ep, level, release_s, service_s, seq, deadline_s=None, deps=()):
    return PlanJob(jid, ep, W[level], release_s, service_s, level, deps=deps, deadline_s=deadline_s, seq=seq)


def _state(now_s, running, n=2, resident=None):
    """A fleet of ``n`` single-host GPUs at ``now_s`` with ``running``: list of
    (job, gpus, start_s, preemptable); each runs warm (resident = its endpoint)."""
    gpus = [Gpu(f"g{i}", "a", i, 80000) for i in range(n)]
    res = dict(resident or {})
    free_at, run = {}, {}
    for job, gs, start, ok in running:
        end = start + job.service_s
        for u in gs:
            res[u] = job.endpoint
            free_at[u] = end
            run[u] = RunningJob(job, tuple(gs), start, start, end, ok)
    return FleetState(now_s, gpus, EPS, free_at=free_at, resident=res, set_point={}, running=run)


def _branch_total(state, batch, cands, chosen, floor, objective):
    """Score of one branch by the evaluator on the same set of jobs: the batch plus every
    possible victim (at its original completion unless ``chosen`` cuts it), plus the work
    the cut victims already did (``lost_work_cost``, issue 19)."""
    every = {v.id: v for c in cands for v in c.victims}
    if chosen is None:
        p = evaluate(floor(batch, state), batch, state, objective=objective)
        cut = set()
    else:
        st2, rest, a = pp.apply(state, batch, chosen)
        p0 = floor(rest, st2)
        full = Plan(p0.policy, [a, *p0.assignments], preemptions=[
            pp.PlannedPreemption(chosen.job.id, tuple(v.id for v in chosen.victims), chosen.group, state.now_s)])
        p = pp.evaluate_preemptive(full, batch, state, objective)
        cut = {v.id for v in chosen.victims}
    lost = pp.lost_work_cost(chosen, state.now_s) if chosen is not None else 0.0
    return lost + score(p) + pp.fixed_score([(v.job, v.end_s) for k, v in every.items() if k not in cut], objective)


def _tiny(seed):
    rng = random.Random(seed)
    n = rng.choice([2, 3, 4])
    running = []
    for i in range(n):
        lvl = rng.choice([1, 2, 3, 3])
        job = _job(f"r{i}", rng.choice(["m1", "m2"]), lvl, 0.0, rng.uniform(50, 900), i)
        running.append((job, [f"g{i}"], rng.uniform(0, 90), rng.random() > 0.2))
    batch = [_job("C", rng.choice(["m1", "m2"]), rng.choice([0, 1]), 100.0, rng.uniform(20, 300), 10)]
    for k in range(rng.randint(0, 3)):
        batch.append(_job(f"b{k}", rng.choice(["m1", "m2"]), rng.choice([1, 2, 3]), rng.uniform(0, 100),
                          rng.uniform(20, 400), 11 + k))
    return _state(100.0, running, n), batch


@pytest.mark.parametrize("seed", range(40))
def test_exhaustive_decision_is_the_better_branch_by_the_evaluator(seed):
    state, batch = _tiny(seed)
    job = batch[0]
    cands = pp.candidates(job, state, batch, per_job=10 ** 6)
    totals = {None: _branch_total(state, batch, cands, None, portfolio, "weighted_completion")}
    for c in cands:
        totals[c.group] = _branch_total(state, batch, cands, c, portfolio, "weighted_completion")
    br = pp.decide(batch, state, portfolio, "weighted_completion", per_job=10 ** 6, max_jobs=1)
    got = br.taken[0].gpus if br.taken else None
    best = min(totals.values())
    assert totals[got] == pytest.approx(best, rel=1e-9, abs=1e-6)
    if br.taken:
        assert totals[got] < totals[None]
        assert br.taken[0].gain == pytest.approx(totals[None] - totals[got], rel=1e-6, abs=1e-4)
    # plan() takes the best of its cheapest PER_JOB candidates (or none), evaluable on the
    # transformed state
    p = plan(batch, state, "portfolio", preemption=True)
    again = pp.evaluate_preemptive(p, batch, state)
    assert again.stats["score"] == pytest.approx(p.stats["score"], rel=1e-9, abs=1e-6)
    few = [None] + [c.group for c in pp.candidates(job, state, batch)]
    mine = [x.gpus for x in p.preemptions if x.job_id == "C"]
    assert len(mine) <= 1 and (mine[0] if mine else None) in few
    assert totals[mine[0] if mine else None] == pytest.approx(min(totals[g] for g in few), rel=1e-9, abs=1e-6)
    placed = sorted(a.job_id for a in p.assignments)
    victims = [v for x in p.preemptions for v in x.victims]
    assert placed == sorted([j.id for j in batch] + victims)  # no job lost or duplicated


def test_candidates_obey_the_level_rules_and_skip_what_must_not_be_cut():
    low, normal, high = _job("L", "m2", 3, 0.0, 900, 0), _job("N", "m2", 2, 0.0, 900, 1), _job("H", "m2", 1, 0.0, 900, 2)
    state = _state(100.0, [(low, ["g0"], 0.0, True), (high, ["g1"], 0.0, True)])
    crit, hi, norm = _job("C", "m1", 0, 100.0, 50, 5), _job("X", "m1", 1, 100.0, 50, 6), _job("Y", "m1", 2, 100.0, 50, 7)
    assert [c.group for c in pp.candidates(crit, state, [crit], 9)] == [("g0",), ("g1",)]
    assert [c.group for c in pp.candidates(hi, state, [hi], 9)] == [("g0",)]  # HIGH does not preempt HIGH
    assert pp.candidates(norm, state, [norm], 9) == []  # NORMAL never preempts
    locked = _state(100.0, [(low, ["g0"], 0.0, False), (normal, ["g1"], 0.0, True)])
    assert [c.victims[0].id for c in pp.candidates(crit, locked, [crit], 9)] == ["N"]  # not preemptable: untouched
    free = _state(100.0, [(low, ["g0"], 0.0, True)])  # g1 is free now: no preemption
    assert pp.candidates(crit, free, [crit], 9) == []
    dep = dataclasses.replace(crit, deps=("z",))  # a dependency still in the batch: cannot start now
    assert pp.candidates(dep, state, [dep, _job("z", "m1", 2, 0.0, 10, 9)], 9) == []
    later = dataclasses.replace(crit, release_s=200.0)
    assert pp.candidates(later, state, [later], 9) == []
    needed = _job("W", "m1", 2, 100.0, 10, 8, deps=("L",))  # a batch job depends on L: not a victim
    assert [c.group for c in pp.candidates(crit, state, [crit, needed], 9)] == [("g1",)]
    t2 = _job("T", "t2", 0, 100.0, 50, 9)  # a TP-2 group half held by a non-preemptable job
    assert pp.candidates(t2, locked, [t2], 9) == []


def test_victim_is_never_placed_on_its_lost_gpus_before_the_preemptor_starts():
    low = _job("L", "m2", 3, 0.0, 1000, 0)
    state = _state(100.0, [(low, ["g0"], 0.0, True)], n=1)
    crit = _job("C", "m1", 0, 100.0, 50, 1)
    p = plan([crit], state, "portfolio", preemption=True)
    (x,) = p.preemptions
    assert x.victims == ("L",) and x.gpus == ("g0",)
    by = p.by_job()
    assert by["C"].start_s == 100.0 and by["L"].start_s >= by["C"].end_s
    # makespan.planner.evaluator.evaluate replays such a plan on the state its preemptions leave
    ev = evaluate(p, [crit], state)
    assert ev.preemptions == p.preemptions and ev.stats["score"] == pytest.approx(p.stats["score"])
    assert sorted(a.job_id for a in ev.assignments) == ["C", "L"]
    # a tampered plan that gives the victim its GPU back first is refused by the evaluator
    bad = Plan(p.policy, [by["C"], Assignment("L", ("g0",), 100.0, 105.0, 1105.0, ("m1",), "cold_start")],
               preemptions=p.preemptions)
    with pytest.raises(InfeasiblePlan):
        pp.evaluate_preemptive(bad, [crit], state)
    with pytest.raises(InfeasiblePlan):
        evaluate(bad, [crit], state)
    # preempting a holder the rules protect is refused too
    locked = _state(100.0, [(low, ["g0"], 0.0, False)], n=1)
    with pytest.raises(InfeasiblePlan, match="preemption rules"):
        pp.evaluate_preemptive(p, [crit], locked)


def test_waiting_when_the_victims_loss_is_larger():
    # HIGH job of 10 s behind a NORMAL job ending in 20 s that has run 880 s: waiting is cheaper
    normal = _job("N", "m2", 2, 0.0, 900, 0)
    state = _state(880.0, [(normal, ["g0"], 0.0, True)], n=1)
    hi = _job("H", "m1", 1, 880.0, 10, 1)
    p = plan([hi], state, "portfolio", preemption=True)
    assert p.preemptions == [] and p.by_job()["H"].start_s == pytest.approx(900.0)


def test_tardiness_objective_preempts_for_a_deadline_and_refuses_for_the_victims():
    # both GPUs run LOW/NORMAL jobs for 1000 s more; a HIGH job with a near deadline arrives
    lo = _job("L", "m2", 3, 0.0, 1100, 0)
    no = _job("N", "m2", 2, 0.0, 1100, 1, deadline_s=1105.0)  # its deadline: just after its end
    state = _state(100.0, [(lo, ["g0"], 0.0, True), (no, ["g1"], 0.0, True)])
    urgent = _job("H", "m1", 1, 100.0, 50, 2, deadline_s=300.0)
    p = plan([urgent], state, "tardiness-portfolio", preemption=True)
    assert [(x.victims, x.gpus) for x in p.preemptions] == [(("L",), ("g0",))]  # the one without a deadline
    # the same job with a far deadline: waiting costs no tardiness; cutting L (no deadline)
    # may still win on the weighted-completion tie-break, cutting N (deadline) never
    relaxed = dataclasses.replace(urgent, deadline_s=5000.0)
    assert all(x.victims == ("L",) and x.gain < 1.0
               for x in plan([relaxed], state, "tardiness-portfolio", preemption=True).preemptions)
    # ... while the weighted-completion policy preempts it all the same (w·wait dominates)
    assert len(plan([relaxed], state, "portfolio", preemption=True).preemptions) == 1
    # only the victim with a deadline is held: its lateness (2·(~1200−1105)) outweighs
    # nothing gained for a preemptor whose deadline waiting meets → refused
    only_n = _state(100.0, [(no, ["g0"], 0.0, True)], n=1)
    assert plan([relaxed], only_n, "tardiness-portfolio", preemption=True).preemptions == []
    # and a deadline the preemptor misses by more than the victim would: preempt
    tight = _job("H", "m1", 1, 100.0, 50, 2, deadline_s=200.0)
    pt = plan([tight], only_n, "tardiness-portfolio", preemption=True)
    assert [x.victims for x in pt.preemptions] == [("N",)]
    ev = pp.evaluate_preemptive(pt, [tight], only_n, "weighted_tardiness")
    assert ev.objective == pytest.approx(pt.objective)


def test_solver_policy_runs_on_the_chosen_branch():
    low = _job("L", "m2", 3, 0.0, 1000, 0)
    state = _state(100.0, [(low, ["g0"], 0.0, True), (_job("L2", "m2", 3, 0.0, 1000, 1), ["g1"], 0.0, True)])
    batch = [_job("C", "m1", 0, 100.0, 50, 2), _job("b", "m1", 2, 90.0, 30, 3)]
    p = plan(batch, state, "default", preemption=True, time_limit_s=0.2)
    assert len(p.preemptions) == 1 and p.policy != "portfolio"
    ev = pp.evaluate_preemptive(p, batch, state)
    assert ev.stats["score"] == pytest.approx(p.stats["score"], rel=1e-9)
    assert plan(batch, state, "wspt", preemption=True).preemptions == []  # baselines never do


def _stream(seed, n=60):
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 25.0)
        lvl = rng.choices([0, 1, 2, 3], [1, 2, 3, 4])[0]
        jobs.append(_job(f"j{i}", rng.choice(["m1", "m2", "t2"]), lvl, t,
                         rng.uniform(20, 500) * (3 if lvl == 3 else 1), i))
    return jobs


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10 ** 6), restore=st.booleans())
def test_simulated_plan_preemption_keeps_the_rules(seed, restore):
    jobs = _stream(seed)
    gpus = [Gpu(f"g{i}", "a", i, 80000) for i in range(4)]
    base = FleetState(0.0, gpus, EPS, resident={"g0": "m1", "g1": "m1"}, set_point={"g0": "m1", "g1": "m1"})
    rep = simulate(jobs, base, "portfolio", preemption="plan", restore=restore, detail=True)
    assert rep["sim"]["preemption_mode"] == "plan"
    recs = {r["id"]: r for r in rep["schedule"]["jobs"]}
    assert len(rep["schedule"]["jobs"]) == len(recs) == len(jobs)  # no job lost or duplicated
    level = {j.id: j.priority for j in jobs}
    assert rep["jobs"]["preempted"] == len(rep["schedule"]["lost"]) == sum(
        len(p["victims"]) for p in rep["schedule"]["preemptions"])
    cut_later = {v for p in rep["schedule"]["preemptions"] for v in p["victims"]}
    for p in rep["schedule"]["preemptions"]:
        assert level[p["job"]] <= 1 and (p["gain"] > 0 or p.get("rule"))  # rule: the fast lane's (fast_lane.py)
        pre = recs[p["job"]]
        if p["job"] not in cut_later:  # a HIGH preemptor may itself be cut by a later CRITICAL
            assert pre["start_s"] == p["t_s"] and sorted(pre["gpus"]) == sorted(p["gpus"])
        for v in p["victims"]:
            assert level[v] > level[p["job"]]  # CRITICAL over HIGH/NORMAL/LOW, HIGH over NORMAL/LOW
            vr = recs[v]
            if set(vr["gpus"]) & set(p["gpus"]):  # not re-placed there before the preemptor took them
                assert vr["start_s"] >= p["t_s"]
                if p["job"] not in cut_later:
                    assert vr["start_s"] >= pre["end_s"] - 1e-6  # nor while the preemptor holds them
            assert not v.startswith("restore:")
    by_gpu: dict[str, list] = {}
    sched = rep["schedule"]
    iv = [(r["start_s"], r["end_s"], r["gpus"]) for r in sched["jobs"]] + [tuple(x) for x in sched["restores"]] \
        + [tuple(x) for x in sched["lost"]]
    for a, b, gs in iv:
        for u in gs:
            by_gpu.setdefault(u, []).append((a, b))
    for u, xs in by_gpu.items():
        xs.sort()
        for (_a1, b1), (a2, _b2) in zip(xs, xs[1:]):
            assert a2 >= b1 - 1e-6, f"{u} double-booked"


def test_simulator_modes_and_flags():
    jobs = [_job("L1", "m2", 3, 0.0, 1000, 0), _job("L2", "m2", 3, 0.0, 1000, 1), _job("X", "m1", 0, 100.0, 50, 2)]
    gpus = [Gpu(f"g{i}", "a", i, 80000) for i in range(2)]
    base = FleetState(0.0, gpus, EPS, set_point={})
    for mode in ("rule", "plan"):
        rep = simulate(jobs, base, "portfolio", preemption=mode, restore=False, detail=True)
        assert rep["jobs"]["preempted"] == 1 and rep["sim"]["preemption_mode"] == mode
        assert next(r for r in rep["schedule"]["jobs"] if r["id"] == "X")["start_s"] == 100.0
    off = simulate(jobs, base, "portfolio", preemption=False, restore=False)
    assert off["jobs"]["preempted"] == 0 and off["sim"]["preemption"] is False
    # fifo keeps the fixed rule in "plan" mode (no gain recorded: the rule decided)
    rep = simulate(jobs, base, "fifo", preemption="plan", restore=False, detail=True)
    assert rep["jobs"]["preempted"] == 1 and "gain" not in rep["schedule"]["preemptions"][0]
    with pytest.raises(Exception, match="preemption"):
        simulate(jobs, base, "portfolio", preemption="sometimes")


def test_tardiness_floor_is_used_for_tardiness_policies():
    # the same decision as deciding directly with the tardiness floor and objective
    state, batch = _tiny(3)
    batch = [dataclasses.replace(j, deadline_s=j.release_s + 2 * j.service_s) for j in batch]
    br = pp.decide(batch, state, tardiness_portfolio, "weighted_tardiness")
    p = plan(batch, state, "tardiness-portfolio", preemption=True)
    assert [x.gpus for x in p.preemptions] == [x.gpus for x in br.taken]


@pytest.mark.parametrize("mode", ["rule", "plan", "bogus"])
def test_cli_simulate_preemption_mode(traces, tmp_path, mode):
    import json

    from typer.testing import CliRunner

    from makespan.cli import app as cli_app

    out = tmp_path / "r.json"
    itp = str(traces / "msft-itp-2021" / "cluster02.csv")
    res = CliRunner().invoke(cli_app, ["simulate", itp, "--fleet", "examples/render-pipeline.toml", "--limit", "60",
                                       "--report", str(out), "--preemption-mode", mode, "-q"])
    if mode == "bogus":
        assert res.exit_code != 0 and "preemption" in res.output
        return
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    assert rep["sim"]["preemption_mode"] == mode and rep["jobs"]["completed"] == 60


def _two_hosts():
    """Host a: two 80 GB GPUs; host b: two 40 GB GPUs. ``big`` (TP 1, 60 GB) fits only
    host a. Set point: a1 -> m1 (resident there now: t2)."""
    eps = dict(EPS, big=EndpointModel("big", 1, 60000, 30.0, 5.0))
    gpus = [Gpu("a0", "a", 0, 80000), Gpu("a1", "a", 1, 80000), Gpu("b0", "b", 0, 40000), Gpu("b1", "b", 1, 40000)]
    return eps, gpus


def test_preemptive_plan_with_restores_is_evaluated_and_committed():
    """A TP-2 LOW job holds host a; a CRITICAL ``big`` job takes a0 from it. The victim
    restarts on host b (free), a1 is left idle, so its set point m1 is restored at once —
    on the state the preemption leaves. evaluate / evaluate_preemptive accept the plan
    and keep its restores; the simulator commits preemption, victim and restore at the
    same planning point without overlap."""
    eps, gpus = _two_hosts()
    low = _job("V", "t2", 3, 0.0, 1000, 0)
    run = RunningJob(low, ("a0", "a1"), 0.0, 0.0, 1000.0, True)
    state = FleetState(100.0, gpus, eps, free_at={"a0": 1000.0, "a1": 1000.0}, resident={"a0": "t2", "a1": "t2"},
                       set_point={"a1": "m1"}, running={"a0": run, "a1": run})
    crit = _job("C", "big", 0, 100.0, 50, 1)
    p = plan([crit], state, "portfolio", preemption=True, restore_at="group")
    assert [(x.job_id, x.victims, x.gpus) for x in p.preemptions] == [("C", ("V",), ("a0",))]
    by = p.by_job()
    assert by["C"].start_s == 100.0 and by["V"].gpus[0].startswith("b") and by["V"].start_s == 100.0
    assert [(r.job_id, r.gpus, r.start_s) for r in p.restores] == [("restore:m1:a1", ("a1",), 100.0)]
    for ev in (evaluate(p, [crit], state), pp.evaluate_preemptive(p, [crit], state)):
        assert [r.job_id for r in ev.restores] == ["restore:m1:a1"] and ev.preemptions == p.preemptions
        assert ev.stats["score"] == pytest.approx(p.stats["score"], rel=1e-9)
    # a restore stated on the preemptor's GPU while it runs there is refused
    bad = dataclasses.replace(p, restores=[Assignment("restore:m1:a1", ("a0",), 100.0, 135.0, 135.0, ("big",),
                                                      "cold_start")])
    with pytest.raises(InfeasiblePlan):
        evaluate(bad, [crit], state)

    base = FleetState(0.0, gpus, eps, resident={"a0": "t2", "a1": "t2"}, set_point={"a1": "m1"})
    rep = simulate([low, crit], base, "portfolio", preemption="plan", restore=True, detail=True)
    sched = rep["schedule"]
    assert [(x["t_s"], x["job"], x["victims"]) for x in sched["preemptions"]] == [(100.0, "C", ["V"])]
    recs = {r["id"]: r for r in sched["jobs"]}
    assert recs["C"]["start_s"] == 100.0 and tuple(recs["C"]["gpus"]) == ("a0",)
    assert recs["V"]["start_s"] == 100.0 and recs["V"]["gpus"][0].startswith("b")
    assert [(a, tuple(g)) for a, _b, g in sched["restores"]][:1] == [(100.0, ("a1",))]
    assert sched["resident_end"]["a1"] == "m1"


def test_evaluate_checks_the_preemptors_stated_times():
    """check_times covers the preemptor's assignment too: a plan stating a shorter
    transition or completion for it than the replay is refused (as for any job)."""
    low = _job("L", "m2", 3, 0.0, 1000, 0)
    state = _state(100.0, [(low, ["g0"], 0.0, True)], n=1)
    crit = _job("C", "m1", 0, 100.0, 50, 1)
    p = plan([crit], state, "portfolio", preemption=True)
    c = p.by_job()["C"]
    assert c.load == "cold_start"
    for bad_c in (dataclasses.replace(c, end_s=c.end_s - 20.0),
                  dataclasses.replace(c, service_start_s=c.start_s, end_s=c.start_s + 50.0, load="warm")):
        bad = dataclasses.replace(p, assignments=[bad_c if a.job_id == "C" else a for a in p.assignments])
        with pytest.raises(InfeasiblePlan, match="C"):
            pp.evaluate_preemptive(bad, [crit], state)
        assert pp.evaluate_preemptive(bad, [crit], state, check_times=False).by_job()["C"].end_s == c.end_s


@pytest.mark.parametrize("mode", ["rule", "plan"])
def test_a_victim_cut_while_loading_does_not_wake_later(mode):
    """V (sleep-mode endpoint) is cut 20 s into its 60 s cold start: its load was abandoned
    (the live preempt script forgets what is resident), so nothing of it sleeps on the GPU.
    When it restarts after C it cold starts again (as the plan's state transformation,
    makespan.planner.preemption_plan.apply, assumes) — not a 10 s wake."""
    eps = {"s": EndpointModel("s", 1, 1000, 60.0, 5.0, wake_s=10.0), "c": EndpointModel("c", 1, 1000, 30.0, 5.0)}
    base = FleetState(0.0, [Gpu("g0", "a", 0, 80000)], eps, resident={}, set_point={})
    jobs = [_job("V", "s", 3, 0.0, 1000.0, 0), _job("C", "c", 0, 20.0, 10.0, 1)]
    rep = simulate(jobs, base, "portfolio", preemption=mode, restore=False, detail=True)
    recs = {r["id"]: r for r in rep["schedule"]["jobs"]}
    assert rep["jobs"]["preempted"] == 1 and (recs["C"]["start_s"], recs["C"]["end_s"]) == (20.0, 60.0)
    assert recs["V"]["load"] == "cold_start" and recs["V"]["end_s"] == pytest.approx(60.0 + 5.0 + 60.0 + 1000.0)
