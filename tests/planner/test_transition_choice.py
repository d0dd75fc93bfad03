"""The plan chooses the transition of each displaced instance (issue 20 point 3): sleep
level 1, level 2 or stop, by its score (makespan.planner.sleepers.choose_level)."""

from __future__ import annotations

import pytest

from makespan.planner.api import plan
from makespan.planner.evaluator import evaluate
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.sleepers import HOLD_COST_PER_GIB, choose_level, with_upcoming

COLD_S, WAKE1_S, WAKE2_S, EVICT_S = 60.0, 2.0, 6.0, 3.0
RAM_MIB = 20_000


def _endpoint(name: str, levels: tuple[int, ...] = (1, 2)) -> EndpointModel:
    options = tuple(o for o in ((1, WAKE1_S, RAM_MIB), (2, WAKE2_S, 0)) if o[0] in levels)
    return EndpointModel(name, 1, 20_000, COLD_S, EVICT_S, wake_s=options[0][1], asleep_gpu_mib=500,
                         asleep_ram_mib=options[0][2], sleep_options=options)


def _case(ram_budget_mib: int | None = None, levels: tuple[int, ...] = (1, 2)):
    """One GPU holding ``a`` at 0; ``b`` arrives at 1 s and displaces it; ``a`` is needed
    again at 30 s (and displaces ``b``, never needed again). (A job queued at the planning
    time counts as needing its endpoint for the whole plan, so ``b`` arrives after it.)"""
    eps = {"a": _endpoint("a", levels), "b": _endpoint("b", levels)}
    state = FleetState(0.0, [Gpu("g0", "h", 0, 80_000)], eps, resident={"g0": "a"},
                       host_ram_mib={"h": ram_budget_mib} if ram_budget_mib is not None else {})
    batch = [PlanJob("b1", "b", 8.0, 1.0, 10.0, 0, seq=0), PlanJob("a1", "a", 1.0, 30.0, 10.0, 3, seq=1)]
    return batch, state


def _by_job(p):
    return {a.job_id: a for a in p.assignments}


@pytest.mark.parametrize("policy", ["portfolio", "default"])
def test_needed_again_in_30s_sleeps_and_never_needed_again_is_stopped(policy):
    batch, state = _case()
    p = plan(batch, state, policy, time_limit_s=0.5)
    a = _by_job(p)
    assert a["b1"].sleep_levels == (("a", 1),)  # a is needed again at 30 s: level 1, the fastest wake
    assert a["a1"].load == "wake" and a["a1"].sleep_levels == (("b", 0),)  # b is never needed again: stopped
    assert a["a1"].transition_s == pytest.approx(EVICT_S + WAKE1_S)
    evaluate(p, batch, with_upcoming(state, batch))  # the evaluator replays the same choice (raises if not)


def test_ram_budget_forces_level_2():
    batch, state = _case(ram_budget_mib=RAM_MIB - 1)
    a = _by_job(plan(batch, state, "portfolio"))
    assert a["b1"].sleep_levels == (("a", 2),)
    assert a["a1"].load == "wake" and a["a1"].transition_s == pytest.approx(EVICT_S + WAKE2_S)


def test_ram_budget_without_level_2_stops():
    batch, state = _case(ram_budget_mib=RAM_MIB - 1, levels=(1,))
    a = _by_job(plan(batch, state, "portfolio"))
    assert a["b1"].sleep_levels == (("a", 0),)
    assert a["a1"].load == "cold_start" and a["a1"].transition_s == pytest.approx(EVICT_S + COLD_S)


@pytest.mark.parametrize("policy", ["fifo", "min-evict"])
def test_fixed_baselines_stop(policy):
    batch, state = _case()
    p = plan(batch, state, policy)
    a = _by_job(p)
    assert a["b1"].sleep_levels == (("a", 0),) and a["a1"].load == "cold_start"
    evaluate(p, batch, state)


def test_recent_demand_keeps_a_sleeper_without_queued_work():
    batch, state = _case()
    state.demand = {"b": 1.0}  # b is not in the batch after 30 s, but arrives often
    a = _by_job(plan(batch, state, "portfolio"))
    assert a["a1"].sleep_levels == (("b", 1),)


def test_choose_level_scores_memory_held_against_the_cold_start_saved():
    options = ((1, WAKE1_S, RAM_MIB), (2, WAKE2_S, 0))
    fits_all = lambda level, ram_mib: True  # noqa: E731
    # level 1 holds 20 GiB more RAM than level 2 for a 4 s faster wake: worth it from
    # need × 4 s > 0.1 × 20000/1024 weight·s, a need of about 0.49
    ram_gib = RAM_MIB / 1024
    threshold = HOLD_COST_PER_GIB * ram_gib / (WAKE2_S - WAKE1_S)
    assert choose_level(options, COLD_S, 500, threshold * 1.1, fits_all) == 1
    assert choose_level(options, COLD_S, 500, threshold * 0.9, fits_all) == 2
    assert choose_level(options, COLD_S, 500, 0.0, fits_all) == 0
    assert choose_level(options, COLD_S, 500, 1.0, lambda level, ram_mib: ram_mib == 0) == 2
    assert choose_level(options, COLD_S, 500, 1.0, lambda level, ram_mib: False) == 0


@pytest.mark.parametrize("jobs", [140, 200])
def test_a_host_ram_budget_never_makes_an_infeasible_plan(jobs, traces):
    """Whether a displaced instance may sleep depends on the RAM the host's other sleepers
    hold, so a construction (placing in its own order) and the evaluator (replaying in start
    order) could disagree: a wake in the construction was a cold start in the replay, and
    the portfolio (140 jobs) and the aging reservation (200 jobs) raised InfeasiblePlan on
    this Alibaba window with half of the endpoints sleep-capable and a host RAM budget
    (bench/swap_heavy.py). The plans are now re-timed in start order
    (makespan.planner.evaluator.evaluate_retimed) and every job completes."""
    pytest.importorskip("bench.swap_heavy")
    from bench.planner_common import ALIBABA, window_jobs
    from bench.swap_heavy import window_fleet
    from makespan.planner.simulator import simulate

    fleet = window_fleet(16, True)
    assert fleet.host_ram_budgets()  # the case needs a host RAM budget
    window, _ = window_jobs(ALIBABA, fleet, 400, jobs, 0, 16)
    report = simulate(window, fleet, "portfolio", 0)
    assert report["jobs"]["completed"] == jobs and report["jobs"]["failed"] == 0


@pytest.mark.parametrize(("ram_budget_mib", "level"), [(None, 1), (RAM_MIB - 1, 2)])
def test_the_simulator_report_counts_sleeps_per_level(ram_budget_mib, level):
    """The report's ``transitions`` split ``sleep`` by level (``sleep_level1``,
    ``sleep_level2``). In virtual time ``a1`` is not known when ``b1`` displaces ``a`` (no
    demand for ``a`` yet: stopped); ``a1`` then displaces ``b``, in recent demand: it sleeps
    at level 1, or at level 2 when the host RAM budget leaves no room for its weights."""
    from makespan.planner.simulator import simulate

    batch, state = _case(ram_budget_mib=ram_budget_mib)
    rep = simulate(batch, state, "portfolio", 0, restore=False, detail=True)
    tr = rep["transitions"]
    assert tr["sleep"] == 1
    assert (tr["sleep_level1"], tr["sleep_level2"]) == ((1, 0) if level == 1 else (0, 1))
    a1 = next(j for j in rep["schedule"]["jobs"] if j["id"] == "a1")
    assert (a1["sleeps"], a1["sleep_levels"]) == (("b",), (level,))


@pytest.mark.parametrize("level", [1, 2])
def test_the_cpsat_window_prices_a_wake_at_the_level_it_sleeps_at(level):
    """The CP-SAT window model's transition of a group where the job's model sleeps is the
    wake of the level it sleeps at (as the replay times it), not the first option's."""
    from makespan.planner.window_model import _transition_s, _window_data

    eps = {"a": _endpoint("a"), "b": _endpoint("b")}
    state = FleetState(0.0, [Gpu("g0", "h", 0, 80_000)], eps, resident={"g0": "b"},
                       asleep={"g0": frozenset({"a"})}, asleep_level={("g0", "a"): level})
    batch = [PlanJob("a1", "a", 2.0, 0.0, 10.0, 2, seq=0)]
    incumbent = plan(batch, state, "portfolio")
    wake_s = WAKE1_S if level == 1 else WAKE2_S
    assert incumbent.assignments[0].transition_s == pytest.approx(EVICT_S + wake_s)  # the replay's timing
    data = _window_data(incumbent, 0, 1, {j.id: j for j in batch}, state, 4, ())
    assert _transition_s(data, ("g0",), "a") == EVICT_S + wake_s


@pytest.mark.parametrize("policy", ["portfolio", "default"])
def test_a_displaced_set_point_sleeps_and_its_restore_wakes_it(policy):
    """A set-point endpoint that a job displaces sleeps even when no job of it is forecast:
    its set-point restore is certain need (SET_POINT_NEED_WEIGHT). The planned restore then
    wakes it instead of a cold start. It used to be stopped (a 3.4 s cold start instead
    of a 0.7 s wake for the demo fleet's set point, found by a llama-swap user)."""
    eps = {"a": _endpoint("a"), "b": _endpoint("b")}
    state = FleetState(0.0, [Gpu("g0", "h", 0, 80_000)], eps, resident={"g0": "a"}, set_point={"g0": "a"})
    batch = [PlanJob("b1", "b", 8.0, 1.0, 10.0, 0, seq=0)]  # nothing of "a" is queued or forecast
    p = plan(batch, state, policy, time_limit_s=0.5, restore_at="group")
    a = _by_job(p)
    assert a["b1"].sleep_levels == (("a", 1),)
    restore = next(x for x in p.restores if x.job_id.startswith("restore:a:"))
    assert restore.load == "wake" and restore.transition_s == pytest.approx(EVICT_S + WAKE1_S)
    # the same displacement of an endpoint that is not the GPU's set point still stops it
    plain = FleetState(0.0, [Gpu("g0", "h", 0, 80_000)], eps, resident={"g0": "a"})
    assert _by_job(plan(batch, plain, policy, time_limit_s=0.5))["b1"].sleep_levels == (("a", 0),)
