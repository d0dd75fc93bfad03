"""Helper endpoints placed with their job (issue 16): every placement pays their cold
starts after the main endpoint's transition, and a job goes only to groups where the
main endpoint and its helpers fit in GPU memory (makespan.planner.helpers)."""

import pytest

from makespan.planner.api import plan
from makespan.planner.evaluator import InfeasiblePlan, evaluate
from makespan.planner.helpers import group_fits, helpers_start_s, need_mib
from makespan.planner.model import Assignment, EndpointModel, FleetState, Gpu, Plan, PlanJob
from makespan.planner.replay import Replay

RENDERER = EndpointModel("renderer", 1, 30_000, cold_start_s=10.0, evict_s=2.0)
EMBED = EndpointModel("embed", 1, 20_000, cold_start_s=4.0, evict_s=1.0)
RERANK = EndpointModel("rerank", 1, 10_000, cold_start_s=3.0, evict_s=1.0)
WIDE = EndpointModel("wide", 2, 10_000, cold_start_s=5.0, evict_s=1.0)
ENDPOINTS = {e.name: e for e in (RENDERER, EMBED, RERANK, WIDE)}


def _state(memory_by_host: dict[str, int], resident: dict[str, str] | None = None) -> FleetState:
    gpus = [Gpu(f"{host}-{i}", host, i, mib) for host, mib in memory_by_host.items() for i in range(2)]
    return FleetState(now_s=0.0, gpus=gpus, endpoints=dict(ENDPOINTS), resident=dict(resident or {}))


def _job(job_id: str = "j", helpers: tuple[str, ...] = ("embed",), service_s: float = 5.0) -> PlanJob:
    return PlanJob(job_id, "renderer", 4.0, 0.0, service_s, helpers=helpers)


def test_the_price_is_the_helpers_cold_starts_after_the_main_transition():
    state = _state({"big": 80_000})
    rep = Replay(state)
    cold = rep.place(_job(helpers=("embed", "rerank")), ("big-0",))
    assert (cold.load, cold.service_start_s, cold.end_s) == ("cold_start", 10.0 + 4.0 + 3.0, 22.0)
    # the main endpoint warm: the helpers still start (the clear phase stopped the last ones)
    warm = rep.place(_job("k"), ("big-0",))
    assert (warm.load, warm.start_s, warm.service_start_s, warm.end_s) == ("warm", 22.0, 26.0, 31.0)
    plain = rep.place(_job("p", helpers=()), ("big-0",))
    assert (plain.load, plain.service_start_s) == ("warm", plain.start_s)
    assert helpers_start_s(("embed", "rerank"), ENDPOINTS) == 7.0


def test_the_plan_prices_the_helpers_in_its_objective():
    state = _state({"big": 80_000})
    with_helper = plan([_job()], state, "fifo")
    without = plan([_job(helpers=())], state, "fifo")
    assert with_helper.assignments[0].end_s == without.assignments[0].end_s + EMBED.cold_start_s
    assert with_helper.objective == pytest.approx(without.objective + 4.0 * EMBED.cold_start_s)


def test_memory_need_per_gpu_of_the_group():
    wide_main = EndpointModel("big", 2, 30_000, 10.0, 1.0)
    eps = {**ENDPOINTS, "big": wide_main}
    assert need_mib(wide_main, ("embed", "wide"), eps) == (60_000, 40_000)
    assert group_fits(("a", "b"), (60_000, 40_000), {"a": 60_000, "b": 40_000})
    assert not group_fits(("b", "a"), (60_000, 40_000), {"a": 60_000, "b": 40_000})


@pytest.mark.parametrize("policy", ["fifo", "min-evict", "wspt", "portfolio", "cpsat"])
def test_a_job_goes_only_where_its_helpers_fit(policy):
    # 'small' has 40 GB GPUs and holds the renderer warm: 30 + 20 GB does not fit there
    state = _state({"small": 40_000, "big": 80_000}, resident={"small-0": "renderer", "small-1": "renderer"})
    batch = [_job(f"j{i}") for i in range(4)] + [_job(f"p{i}", helpers=()) for i in range(2)]
    p = plan(batch, state, policy, time_limit_s=0.5)  # the greedy policies ignore the limit
    hosts = {a.job_id: a.gpus[0].split("-")[0] for a in p.assignments}
    assert all(hosts[f"j{i}"] == "big" for i in range(4)), hosts
    rep = Replay(state)
    assert rep.job_groups(_job()) == [("big-0",), ("big-1",)]
    assert rep.job_groups(_job(helpers=())) == rep.groups(RENDERER)


def test_the_evaluator_refuses_a_group_too_small_for_the_helpers():
    state = _state({"small": 40_000, "big": 80_000})
    bad = Plan("hand", [Assignment("j", ("small-0",), 0.0, 14.0, 19.0, (), "cold_start")])
    with pytest.raises(InfeasiblePlan, match="helpers embed"):
        evaluate(bad, [_job()], state, "hand")
    good = Plan("hand", [Assignment("j", ("big-0",), 0.0, 14.0, 19.0, (), "cold_start")])
    assert evaluate(good, [_job()], state, "hand").assignments[0].end_s == 19.0


def test_a_helper_wider_than_the_job_fits_nowhere():
    state = _state({"big": 80_000})
    assert Replay(state).job_groups(_job(helpers=("wide",))) == []
    with pytest.raises(ValueError, match="with its helpers wide"):
        plan([_job(helpers=("wide",))], state, "fifo")
