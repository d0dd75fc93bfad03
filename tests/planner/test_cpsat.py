"""CP-SAT LNS improver: complete, evaluated plans, never worse than the greedy floor,
running work untouched. Searches are bounded by effort (:class:`SearchEffort`), with a
wall-time backstop only, so what they find does not depend on the machine's load."""

import pytest

from makespan.planner.cpsat import SearchEffort, improve
from makespan.planner.evaluator import evaluate, score
from makespan.planner.greedy import portfolio
from makespan.planner.synthetic import instance


@pytest.mark.parametrize("seed", [0, 1])
def test_improver_never_worse_and_feasible(seed):
    batch, st = instance(40, 8, 6, seed=seed, spread_s=120)
    st.free_at[st.gpus[0].uuid] = 500.0  # running work on GPU 0 until t=500
    floor = portfolio(batch, st)
    # 8 windows of at most 0.2 deterministic s each (under load a 0.4 s wall limit ran out
    # in the descent, before any window)
    out = improve(batch, st, floor, time_limit_s=120.0, seed=seed, effort=SearchEffort(deterministic_s=0.2, windows=8))
    again = evaluate(out, batch, st)
    assert again.objective == pytest.approx(out.objective)
    assert score(out) <= score(floor) + 1e-6
    assert out.stats["windows"] == 8
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
        assert _solve_window(inc, lo, lo + 6, jobs, st, 120.0, 0, 1, 4, False, "weighted_tardiness",
                             deterministic_s=1.0) is not None
