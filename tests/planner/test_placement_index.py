"""Index consistency (issue 21): the indexed placement (:mod:`makespan.planner.placement_index`)
chooses the group the full scan chooses, ties broken identically, on random fleets and
batches: every greedy member, the portfolio, and the index's own candidate list after
random placements. The index is switched on for every list (``INDEX_MIN_GROUPS`` 0), so
small fleets exercise it too."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from makespan.models import parse_fleet
from makespan.planner import placement_index
from makespan.planner.evaluator import score
from makespan.planner.greedy import MEMBERS, construct_built, fifo, member_builders, members, portfolio
from makespan.planner.list_schedule import fifo_order
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.partition import partition_built
from makespan.planner.placement_index import GroupIndex
from makespan.planner.replay import Replay
from makespan.planner.rules import Aware, rule_completion, rule_min_evict
from makespan.planner.simulator import simulate
from makespan.traces import read_trace

# times on a 1/8 s grid: sums stay exact, so equal starts are equal floats (ties are
# frequent, which is what the tie-break check needs) -- and off-grid values below
TIME = st.one_of(st.integers(0, 4000).map(lambda k: k / 8), st.floats(0, 500, allow_nan=False, allow_infinity=False))


@st.composite
def fleets_and_batches(draw):
    """A random fleet state (hosts of 1–8 GPUs, two memory sizes, TP 1/2/4 endpoints some
    with a sleep mode, residents including whole and broken gang instances, sleepers,
    set-point GPUs, busy GPUs, demand and shares) and a batch of 1–40 jobs."""
    hosts = draw(st.integers(1, 5))
    gpus: list[Gpu] = []
    for h in range(hosts):
        n = draw(st.integers(1, 8))
        mem = draw(st.sampled_from((40_000, 80_000)))
        gpus += [Gpu(f"h{h}-g{i}", f"h{h}", i, mem) for i in range(n)]
    n_eps = draw(st.integers(1, 6))
    eps: dict[str, EndpointModel] = {}
    for k in range(n_eps):
        tp = draw(st.sampled_from((1, 1, 1, 2, 4)))
        eps[f"e{k}"] = EndpointModel(f"e{k}", tp, draw(st.sampled_from((20_000, 60_000))),
                                     draw(st.sampled_from((30.0, 45.0, 90.0, 120.5))),
                                     draw(st.sampled_from((2.0, 5.0))),
                                     wake_s=draw(st.sampled_from((None, None, 10.0))))
    names = sorted(eps)
    now = draw(st.sampled_from((0.0, 100.0)))
    resident: dict[str, str | None] = {}
    asleep: dict[str, frozenset[str]] = {}
    free_at: dict[str, float] = {}
    for i, g in enumerate(gpus):
        kind = draw(st.integers(0, 3))
        if kind == 1:
            resident[g.uuid] = draw(st.sampled_from(names))
        elif kind == 2:  # a whole instance of a gang endpoint starting here (aligned)
            e = draw(st.sampled_from(names))
            tp = eps[e].tp
            if g.index % tp == 0:
                for other in gpus[i:i + tp]:
                    if other.host == g.host:
                        resident[other.uuid] = e
        if draw(st.booleans()):
            asleep[g.uuid] = frozenset(draw(st.sets(st.sampled_from(names), max_size=2)))
        if draw(st.booleans()):
            free_at[g.uuid] = now + draw(TIME)
    set_point: dict[str, str] = {}
    for g in gpus:
        if resident.get(g.uuid) is not None and eps[resident[g.uuid]].tp == 1 and draw(st.integers(0, 5)) == 0:
            set_point[g.uuid] = resident[g.uuid]  # type: ignore[assignment]
    demand = {e: draw(st.sampled_from((0.0, 1.0, 8.0))) for e in names}
    share: dict[str, float] = {}
    if draw(st.booleans()):
        w = [draw(st.integers(1, 5)) for _ in names]
        share = {e: x / sum(w) for e, x in zip(names, w)}
    state = FleetState(now, gpus, eps, free_at=free_at, resident=resident, set_point=set_point, asleep=asleep,
                       demand=demand, demand_share=share,
                       set_point_weight=draw(st.sampled_from((0.0, 0.0, 0.5))),
                       host_ram_mib={f"h{h}": 100_000 for h in range(hosts)} if draw(st.booleans()) else {})
    fits = [e for e in names if state.groups(eps[e].tp, eps[e].memory_mib)]
    if not fits:
        fits = names = ["solo"]
        eps["solo"] = EndpointModel("solo", 1, 1_000, 30.0, 2.0)
    n_jobs = draw(st.integers(1, 40))
    batch = [PlanJob(f"j{i}", draw(st.sampled_from(fits)), draw(st.sampled_from((1.0, 2.0, 4.0, 8.0))),
                     now + draw(TIME), draw(st.sampled_from((0.5, 10.0, 60.0, 100.25, 300.0))) + draw(TIME) / 64,
                     draw(st.integers(0, 3)), seq=i)
             for i in range(n_jobs)]
    return state, batch


def _key(assignments):
    return [(a.job_id, a.gpus, a.start_s, a.service_start_s, a.end_s, a.evicts, a.load) for a in assignments]


@pytest.fixture(autouse=True)
def index_every_list(monkeypatch):
    monkeypatch.setattr(placement_index, "INDEX_MIN_GROUPS", 0)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.function_scoped_fixture])


@SETTINGS
@given(fleets_and_batches())
def test_every_member_places_as_the_full_scan(case):
    state, batch = case
    for name, build in member_builders(batch, state).items():
        got = build(bound=math.inf)
        with placement_index.full_scan():
            want = build(bound=math.inf)
        assert (got is None) == (want is None), name
        if got is not None:
            assert _key(got[0]) == _key(want[0]), name


@SETTINGS
@given(fleets_and_batches())
def test_portfolio_and_fifo_equal_the_full_scan(case):
    state, batch = case
    got, got_fifo = portfolio(batch, state), fifo(batch, state)
    with placement_index.full_scan():
        want, want_fifo = portfolio(batch, state), fifo(batch, state)
    assert _key(got.assignments) == _key(want.assignments)
    assert got.stats == want.stats
    assert _key(got_fifo.assignments) == _key(want_fifo.assignments)


@SETTINGS
@given(fleets_and_batches())
def test_portfolio_is_the_best_member_with_its_shortcuts(case):
    """The portfolio's shortcuts (candidate indexes cloned from templates its members
    share, ``partition-spill`` skipped when ``partition``'s turn built it without a spill)
    select what scoring every member in full does (:func:`members`)."""
    state, batch = case
    plans = members(batch, state)
    best = min(plans, key=lambda p: (score(p), MEMBERS.index(p.policy)))
    got = portfolio(batch, state)
    assert got.stats["member"] == MEMBERS.index(best.policy)
    # the same groups (the portfolio's plan is the winner re-timed by the evaluator's replay)
    assert {a.job_id: a.gpus for a in got.assignments} == {a.job_id: a.gpus for a in best.assignments}


def test_a_kind_with_helpers_gets_its_own_index():
    """A job with helpers has its own candidate list (its endpoint's groups where the
    helpers fit too): indexed on its own, and a later kind's index is found without
    looking the helper kind up as an endpoint (main raised KeyError 'a+h' here)."""
    gpus = [Gpu(f"h{h}-g{i}", f"h{h}", i, 40_000 if h == 0 else 80_000) for h in range(2) for i in range(4)]
    eps = {"a": EndpointModel("a", 1, 30_000, 60.0, 5.0), "h": EndpointModel("h", 1, 30_000, 20.0, 5.0),
           "b": EndpointModel("b", 1, 30_000, 45.0, 5.0)}
    state = FleetState(0.0, gpus, eps)
    batch = [PlanJob("j0", "a", 1.0, 0.0, 100.0, 0, seq=0, helpers=("h",)),
             PlanJob("j1", "b", 1.0, 0.0, 100.0, 0, seq=1), PlanJob("j2", "a", 1.0, 0.0, 100.0, 0, seq=2)]
    for name, build in member_builders(batch, state).items():
        got = build(bound=math.inf)
        with placement_index.full_scan():
            want = build(bound=math.inf)
        assert (got is None) == (want is None), name
        if got is not None:
            assert _key(got[0]) == _key(want[0]), name
            assert got[0][0].gpus[0].startswith("h1-"), name  # the helper fits beside it on h1 only
    assert _key(portfolio(batch, state).assignments)


def test_partition_spill_report_says_when_a_job_spilled():
    """``report["spilled"]``: False when the spill construction placed every job as
    ``partition`` does, True once a job took another endpoint's group."""
    gpus = [Gpu(f"h0-g{i}", "h0", i, 80_000) for i in range(2)]
    eps = {"a": EndpointModel("a", 1, 20_000, 200.0, 5.0), "b": EndpointModel("b", 1, 20_000, 30.0, 5.0)}
    state = FleetState(0.0, gpus, eps, resident={"h0-g0": "a", "h0-g1": "b"})
    alloc = {"a": [("h0-g0",)], "b": [("h0-g1",)]}
    # three long jobs of b: the second waits 1,000 s on b's GPU, a's frees at 0 (200 s + 30 s penalty)
    busy = [PlanJob(f"b{i}", "b", 1.0, 0.0, 1_000.0, 0, seq=i) for i in range(3)]
    report: dict[str, bool] = {}
    spilled = partition_built(busy, state, True, alloc=alloc, report=report)
    assert report["spilled"] is True and spilled is not None
    assert _key(spilled[0]) != _key(partition_built(busy, state, False, alloc=alloc)[0])  # type: ignore[index]
    quiet = [PlanJob("a0", "a", 1.0, 0.0, 10.0, 0, seq=0), PlanJob("b0", "b", 1.0, 0.0, 10.0, 0, seq=1)]
    same = partition_built(quiet, state, True, alloc=alloc, report=report)
    assert report["spilled"] is False
    assert _key(same[0]) == _key(partition_built(quiet, state, False, alloc=alloc)[0])  # type: ignore[index]


@SETTINGS
@given(fleets_and_batches(), st.lists(st.integers(0, 10_000), min_size=1, max_size=30))
def test_candidates_hold_every_rules_choice_after_random_placements(case, picks):
    """Place jobs on random groups (not a rule's choice: states no construction reaches),
    and after each placement the rules pick the same group from the index's candidates
    as from the full list, for every endpoint and a ready time before and after the
    free times."""
    state, batch = case
    rep = Replay(state)
    keys = {(ep.tp, ep.memory_mib): ep for ep in state.endpoints.values() if rep.groups(ep)}
    index = {k: GroupIndex(rep, rep.groups(ep)) for k, ep in keys.items()}
    aware = Aware(batch, state, 1.0, 1.0, gamma=2.0)
    share = Aware(batch, state, 1.0, 1.0, share=True)
    for step, pick in enumerate(picks):
        job = batch[step % len(batch)]
        ep = state.endpoints[job.endpoint]
        full = rep.groups(ep)
        for ready in {max(job.release_s, state.now_s), max(rep.free_at.values()) + 1.0, state.now_s + 50.25}:
            cands = index[(ep.tp, ep.memory_mib)].candidates(ready)
            assert set(cands) <= set(full) and cands == [g for g in full if g in set(cands)]  # fleet order
            for rule in (rule_completion, rule_min_evict, aware, share):
                assert rule(rep, job, cands, ready) == rule(rep, job, full, ready), (rule, ready)
        group = full[pick % len(full)]
        rep.place(job, group, max(rep.ready(job), rep.group_free(group)) + (pick % 3) * 0.5)
        for ix in index.values():
            ix.touch(group)


def test_idle_fleet_keeps_one_idle_candidate():
    """On an idle fleet every idle GPU is the same candidate: the list holds the first."""
    gpus = [Gpu(f"h{h}-g{i}", f"h{h}", i, 80_000) for h in range(16) for i in range(8)]
    eps = {"a": EndpointModel("a", 1, 1_000, 60.0, 5.0), "b": EndpointModel("b", 2, 1_000, 90.0, 5.0)}
    state = FleetState(0.0, gpus, eps, resident={"h3-g1": "a"}, free_at={"h0-g0": 500.0})
    rep = Replay(state)
    index = GroupIndex(rep, rep.groups(eps["a"]))
    # busy h0-g0 (free later than ready), the first idle GPU h0-g1, the warm h3-g1
    assert index.candidates(10.0) == [("h0-g0",), ("h0-g1",), ("h3-g1",)]
    assert index.candidates(600.0) == [("h0-g0",), ("h3-g1",)]  # free by then: h0-g0 is the first idle one
    job = PlanJob("j", "a", 1.0, 0.0, 100.0)
    rep.place(job, ("h0-g1",))
    index.touch(("h0-g1",))
    assert index.candidates(10.0) == [("h0-g0",), ("h0-g1",), ("h0-g2",), ("h3-g1",)]
    order = fifo_order([job])
    built = construct_built(order, state, "completion")
    assert built is not None and built[0][0].gpus == ("h3-g1",)  # warm, as the full scan picks


def _without_wall_times(report: dict) -> dict:
    out = json.loads(json.dumps(report, default=str))
    out["sim"].pop("wall_s", None)
    out["planner"] = {k: v for k, v in out["planner"].items() if not k.startswith("solve_s")}
    return out


def test_simulator_report_is_unchanged_by_the_index(traces):
    """A simulated trace window (preemption, restores, reservations, fast lane: every
    planning point through the portfolio) gives the same report, byte for byte but the
    planner's wall times, with the index on every list and with the full scan."""
    fleet = parse_fleet({
        "name": "t",
        "hosts": [{"name": "a", "gpu_count": 4, "memory_mib": 81920},
                  {"name": "b", "gpu_count": 4, "memory_mib": 40960}],
        "endpoints": {
            "m1": {"model": "x", "memory_mib_per_gpu": 1000, "cold_start_s": 45,
                   "set_point": [{"host": "a", "gpus": [0]}]},
            "m2": {"model": "y", "memory_mib_per_gpu": 1000, "cold_start_s": 120, "wake_s": 10},
            "m3": {"model": "z", "memory_mib_per_gpu": 50000, "cold_start_s": 200},
            "g2": {"model": "w", "tensor_parallel": 2, "memory_mib_per_gpu": 1000, "cold_start_s": 90},
        },
    })
    jobs = read_trace(str(traces / "msft-itp-2021" / "cluster02.csv"), fleet, seed=1, start=2000, limit=60)
    indexed = simulate(jobs, fleet, "portfolio", seed=1, time_scale=20)
    with placement_index.full_scan():
        scanned = simulate(jobs, fleet, "portfolio", seed=1, time_scale=20)
    assert indexed["jobs"]["completed"] == 60
    assert json.dumps(_without_wall_times(indexed), sort_keys=True) == json.dumps(_without_wall_times(scanned),
                                                                                   sort_keys=True)


@SETTINGS
@given(fleets_and_batches())
def test_fast_lane_equals_the_full_scan(case):
    """The lane's placements (planner/fast_lane.py ``_Candidates``) on the index: the same
    lane plan, allowed starts and enforced plan as the full scan, with the default lane
    (CRITICAL, and HIGH with its peer floor) and every job's level moved into the lane."""
    from makespan.planner import fast_lane

    state, batch = case
    lanes = [(fast_lane.DEFAULT_LANE_LEVELS, fast_lane.DEFAULT_START_GRACE), ({0: 1.0, 1: 1.25, 2: 1.0, 3: 2.0}, None)]
    for levels, grace in lanes:
        p = portfolio(batch, state)
        got_lane = fast_lane.lane_plan(batch, state, levels, grace)
        got, got_late = fast_lane.enforce(p, batch, state, levels, start_grace_s=grace)
        with placement_index.full_scan():
            want_lane = fast_lane.lane_plan(batch, state, levels, grace)
            want, want_late = fast_lane.enforce(p, batch, state, levels, start_grace_s=grace)
        assert _key(got_lane[1]) == _key(want_lane[1]) and got_lane[2] == want_lane[2]
        assert got_late == want_late and _key(got.assignments) == _key(want.assignments)
