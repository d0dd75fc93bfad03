"""CP-SAT LNS improver: complete, evaluated plans, never worse than the greedy floor,
running work untouched."""

import pytest

from makespan.planner.cpsat import improve
from makespan.planner.evaluator import evaluate, score
from makespan.planner.greedy import portfolio
from makespan.planner.synthetic import instance


@pytest.mark.parametrize("seed", [0, 1])
def test_improver_never_worse_and_feasible(seed):
    batch, st = instance(40, 8, 6, seed=seed, spread_s=120)
    st.free_at[st.gpus[0].uuid] = 500.0  # running work on GPU 0 until t=500
    floor = portfolio(batch, st)
    out = improve(batch, st, floor, time_limit_s=0.4, seed=seed)
    again = evaluate(out, batch, st)
    assert again.objective == pytest.approx(out.objective)
    assert score(out) <= score(floor) + 1e-6
    assert out.stats["windows"] >= 1
    assert all(a.start_s >= 500.0 for a in out.assignments if st.gpus[0].uuid in a.gpus)


def test_tardiness_windows_stay_feasible_when_deadlines_have_passed():
    """A job already late at planning time has tardiness above the window horizon; the
    window model must still be feasible (its late variable's domain covers it)."""
    import dataclasses

    from makespan.planner.window_model import solve_window as _solve_window
    from makespan.planner.evaluator import evaluate
    from makespan.planner.greedy import fifo

    batch, st = instance(40, 8, 6, seed=4, spread_s=120)
    past = [dataclasses.replace(j, deadline_s=j.release_s + 2 * j.service_s - 5000.0) for j in batch]
    inc = evaluate(fifo(past, st), past, st, objective="weighted_tardiness")
    jobs = {j.id: j for j in past}
    for lo in (0, 12, 24):
        assert _solve_window(inc, lo, lo + 6, jobs, st, 0.5, 0, 1, 4, False, "weighted_tardiness") is not None
