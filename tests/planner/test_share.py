"""Share-shortfall future cost (FleetState.demand_share) and the share-aware greedy members."""

from makespan.planner.api import plan
from makespan.planner.evaluator import evaluate, share_shortfall_cost
from makespan.planner.greedy import MEMBERS, members
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob


def _state(share):
    gpus = [Gpu(f"g{i}", "h", i, 80_000) for i in range(4)]
    eps = {"a": EndpointModel("a", 1, 1000, 100.0, 5.0), "b": EndpointModel("b", 1, 1000, 60.0, 5.0)}
    res = {"g0": "a", "g1": "a", "g2": "b", "g3": "b"}
    return FleetState(0.0, gpus, eps, free_at={"g0": 150.0, "g1": 150.0}, resident=res,
                      demand={"a": 2.0, "b": 1.0}, demand_share=share)


def test_shortfall_cost_formula():
    st = _state({"a": 0.75, "b": 0.25})
    assert share_shortfall_cost(st, "a", 2) == 2.0 * 100.0 * (3 - 2)
    assert share_shortfall_cost(st, "b", 2) == 0.0
    assert share_shortfall_cost(st, "a", 0) == 2.0 * 100.0 * 3


def test_future_cost_charges_a_plan_that_evicts_a_model_below_its_share():
    st = _state({"a": 0.5, "b": 0.5})
    batch = [PlanJob("j", "a", 1.0, 0.0, 10.0)]
    cold = evaluate([], [], st)  # nothing placed: no shortfall
    assert cold.stats["future_cost"] == 0.0
    p = plan(batch, st, "portfolio")
    # loading a on g2 (done at 115 s) evicts b below its share (2 GPUs, +60 weight·s):
    # waiting for the warm g0 (done at 160 s) is cheaper; without a share it is not
    assert p.assignments[0].gpus in (("g0",), ("g1",)), p.assignments
    assert plan(batch, _state({}), "portfolio").assignments[0].gpus == ("g2",)
    forced = evaluate([type(p.assignments[0])("j", ("g2",), 0.0, 105.0, 115.0, ("b",), "cold_start")], batch, st)
    assert forced.stats["future_cost"] == 1.0 * 60.0 * 1


def test_share_members_only_with_a_share():
    batch = [PlanJob("j", "a", 1.0, 0.0, 10.0)]
    assert len(members(batch, _state({}))) == len(MEMBERS) - 2
    assert len(members(batch, _state({"a": 0.5, "b": 0.5}))) == len(MEMBERS)


def test_replay_does_not_write_into_the_state_history():
    from makespan.planner.replay import Replay
    st = _state({})
    st.end_of = {"old": 5.0}
    rep = Replay(st)
    rep.place(PlanJob("j", "a", 1.0, 0.0, 10.0, deps=("old",)), ("g2",))
    assert st.end_of == {"old": 5.0}
    assert rep.end_of["j"] == 5.0 + 5.0 + 100.0 + 10.0  # after its dependency, evict b, cold start a
    cp = rep.copy()
    cp.place(PlanJob("k", "b", 1.0, 0.0, 1.0), ("g3",))
    assert "k" not in rep.end_of and "k" in cp.end_of


def test_plan_time_limit_keyword():
    import pytest

    from makespan.errors import PlannerError
    from makespan.planner.synthetic import instance
    batch, st = instance(12, 4, models=3, seed=1)
    fast = plan(batch, st, "cpsat", time_limit_s=0.0)  # no LNS window fits: the greedy floor
    assert fast.stats["windows"] == 0.0
    assert abs(fast.objective - plan(batch, st, "portfolio").objective) < 1e-6
    assert plan(batch, st, "wspt", time_limit_s=0.5).objective == plan(batch, st, "wspt").objective
    with pytest.raises(PlannerError):
        plan(batch, st, "cpsat", time_limit_s=-1.0)
