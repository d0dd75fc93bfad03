"""Set-point restores in the plan's horizon (planner/restore.py): where the planner puts
them, what the evaluator accepts, and the set-point absence measure."""

import dataclasses

import pytest

from makespan.errors import PlannerError
from makespan.planner.api import plan
from makespan.planner.evaluator import InfeasiblePlan, evaluate
from makespan.planner.model import EndpointModel, FleetState, Gpu, Plan, PlanJob
from makespan.planner.replay import Replay
from makespan.planner.restore import plan_restores, set_point_absence, set_point_groups

EPS = {"m1": EndpointModel("m1", 1, 1000, 30.0, 5.0), "m2": EndpointModel("m2", 1, 1000, 60.0, 5.0),
       "t2": EndpointModel("t2", 2, 1000, 40.0, 5.0, wake_s=10.0)}


def _state():
    """4 GPUs on one host: m1 at its set point on g0, t2 (TP 2, sleep mode) on g2+g3."""
    gpus = [Gpu(f"g{i}", "a", i, 80000) for i in range(4)]
    sp = {"g0": "m1", "g2": "t2", "g3": "t2"}
    return FleetState(0.0, gpus, EPS, resident=dict(sp), set_point=dict(sp))


def _batch():
    # m2 work for every GPU: the planner evicts both set points; c is long, so the plan's
    # horizon ends well after some groups are done
    return [PlanJob("a", "m2", 2.0, 0.0, 100.0, seq=0), PlanJob("b", "m2", 2.0, 0.0, 100.0, seq=1),
            PlanJob("c", "m2", 2.0, 0.0, 900.0, seq=2), PlanJob("d", "m2", 2.0, 0.0, 100.0, seq=3),
            PlanJob("e", "t2", 1.0, 0.0, 50.0, seq=4)]


def test_set_point_groups_of_a_state():
    assert set_point_groups(_state()) == [("m1", ("g0",)), ("t2", ("g2", "g3"))]


@pytest.mark.parametrize("policy", ["fifo", "wspt", "portfolio", "cpsat"])
@pytest.mark.parametrize("at", ["group", "horizon"])
def test_restores_follow_the_groups_last_job_and_never_move_a_job(policy, at):
    st, batch = _state(), _batch()
    bare = plan(batch, st, policy, time_limit_s=0.2)
    p = plan(batch, st, policy, time_limit_s=0.2, restore_at=at)
    assert p.assignments == bare.assignments and p.objective == bare.objective  # no job delayed or moved
    assert bare.restores == []
    horizon = max(a.end_s for a in p.assignments)
    res = {a.gpus: a for a in p.restores}
    jobs = {j.id: j for j in batch}
    end = Replay(st)
    for a in sorted(p.assignments, key=lambda a: a.start_s):
        end.place(jobs[a.job_id], a.gpus, a.start_s)
    assert p.restores, "the batch evicts at least one set point"
    for ep, g in set_point_groups(st):
        if all(end.resident[u] == ep for u in g):
            assert g not in res  # the plan leaves the set point resident: no restore
            continue
        ours = [a for a in p.assignments if set(a.gpus) & set(g)]
        r = res[g]
        assert r.start_s == pytest.approx(max(a.end_s for a in ours) if at == "group" else horizon)
        assert all(a.end_s <= r.start_s + 1e-9 for a in ours)  # after the last job, no overlap
        assert r.job_id == f"restore:{ep}:{g[0]}" and r.end_s > r.start_s
    assert evaluate(p, batch, st).restores == p.restores


def test_restore_cost_follows_the_transition_rule():
    st = _state()
    batch = [PlanJob("a", "m2", 2.0, 0.0, 100.0, seq=0), PlanJob("b", "m2", 2.0, 0.0, 100.0, seq=1),
             PlanJob("c", "m2", 2.0, 0.0, 300.0, seq=2)]
    rep = Replay(st)
    placed = [rep.place(batch[0], ("g0",), 0.0), rep.place(batch[1], ("g2",), 0.0), rep.place(batch[2], ("g3",), 0.0)]
    r = {a.gpus: a for a in plan_restores(placed, batch, st, "group")}
    # g0: m1 evicted by a (ends 165 s): evict m2 5 s + cold start m1 30 s
    assert (r[("g0",)].start_s, r[("g0",)].end_s, r[("g0",)].evicts, r[("g0",)].load) == (165.0, 200.0, ("m2",), "cold_start")
    # t2 slept on g2 and g3 when m2 took them: a wake (5 s evict + 10 s) after c ends at 5 + 60 + 300 s
    assert (r[("g2", "g3")].start_s, r[("g2", "g3")].end_s, r[("g2", "g3")].load) == (365.0, 380.0, "wake")
    h = {a.gpus: a.start_s for a in plan_restores(placed, batch, st, "horizon")}
    assert h == {("g0",): 365.0, ("g2", "g3"): 365.0}
    assert evaluate(Plan("x", placed, restores=list(r.values())), batch, st).stats["restores"] == 2


def test_evaluator_rejects_overlapping_late_and_foreign_restores():
    st, batch = _state(), _batch()
    p = plan(batch, st, "fifo", restore_at="group")
    r = next(a for a in p.restores if a.gpus == ("g0",))
    job = next(a for a in p.assignments if "g0" in a.gpus and a.end_s == r.start_s)
    early = dataclasses.replace(r, start_s=job.end_s - 10.0, service_start_s=job.end_s + 25.0, end_s=job.end_s + 25.0)
    with pytest.raises(InfeasiblePlan, match="restore starts at .* while its GPUs are busy"):
        evaluate(Plan("x", p.assignments, restores=[early]), batch, st)
    # a job planned on the GPUs after the restore: the restore would delay it, rejected
    later = [dataclasses.replace(a, start_s=a.start_s + 1000, service_start_s=a.service_start_s + 1000,
                                 end_s=a.end_s + 1000) if a is job else a for a in p.assignments]
    with pytest.raises(InfeasiblePlan, match="last work on its GPUs"):
        evaluate(Plan("x", later, restores=[r]), batch, st)
    foreign = dataclasses.replace(r, job_id="restore:m1:g1", gpus=("g1",))
    with pytest.raises(InfeasiblePlan, match="not a restore of a set-point instance"):
        evaluate(Plan("x", p.assignments, restores=[foreign]), batch, st)
    with pytest.raises(InfeasiblePlan, match="restored twice"):
        evaluate(Plan("x", p.assignments, restores=[r, r]), batch, st)
    wrong = dataclasses.replace(r, end_s=r.end_s + 1.0, service_start_s=r.end_s + 1.0)
    with pytest.raises(InfeasiblePlan, match="differs from the replay"):
        evaluate(Plan("x", p.assignments, restores=[wrong]), batch, st)


def test_restores_change_the_future_cost_they_see():
    st = dataclasses.replace(_state(), demand={"m1": 8.0})
    batch = [PlanJob("a", "m2", 2.0, 0.0, 100.0)]
    bare = evaluate(plan(batch, st, "fifo"), batch, st)
    p = plan(batch, st, "fifo", restore_at="group")
    if "g0" in p.assignments[0].gpus:  # m1's only instance evicted: restored, no future cost
        assert bare.stats["future_cost"] == 8.0 * 30.0
        assert p.stats["future_cost_restored"] == 0.0
    assert evaluate(p, batch, st).stats["restores"] == len(p.restores)


def test_empty_batch_restores_what_is_not_at_its_set_point():
    st = dataclasses.replace(_state(), resident={"g0": "m2", "g2": "t2", "g3": "t2"}, free_at={"g0": 40.0})
    p = plan([], st, "portfolio", restore_at="group")
    assert [(a.gpus, a.start_s, a.end_s) for a in p.restores] == [(("g0",), 40.0, 75.0)]
    assert plan([], st, "portfolio").restores == []
    with pytest.raises(PlannerError, match="unknown restore_at"):
        plan([], st, "portfolio", restore_at="never")
    with pytest.raises(PlannerError, match="unknown restore placement"):
        plan_restores([], [], st, at="never")


def test_set_point_absence_counts_gpu_seconds_of_broken_instances():
    sp = [("m1", ("g0",)), ("t2", ("g2", "g3"))]
    initial = {"g0": "m1", "g2": "t2", "g3": "t2"}
    events = {
        "g0": [(10.0, None), (75.0, "m2"), (200.0, None), (235.0, "m1")],  # m1 gone 10 → 235
        "g2": [(50.0, None), (110.0, "m2")],  # t2 instance broken from 50 on by one GPU: counts 2 GPUs
        "g3": [],
    }
    # [0, 300]: g0 225 s; the TP-2 instance 250 s × 2 GPUs
    assert set_point_absence(events, sp, initial, 0.0, 300.0) == pytest.approx(225.0 + 500.0)
    # clipped to [100, 220]: g0 120 s, t2 120 s × 2
    assert set_point_absence(events, sp, initial, 100.0, 220.0) == pytest.approx(120.0 + 240.0)
    assert set_point_absence({}, sp, initial, 0.0, 300.0) == 0.0


@pytest.mark.parametrize("mode", ["rule", "plan"])
def test_simulated_restore_does_not_take_a_gpu_a_requeued_victim_starts_on(mode):
    """Two LOW ``small`` jobs hold host a's pair; X (on b0, b's only GPU) ends at 50 s and
    leaves ``other`` there, off b0's set point ``base``. At 100 s a CRITICAL ``big`` (TP 2,
    60 GB: host a only) preempts both LOW jobs. The plan of the CRITICAL job alone leaves
    b0 idle (a restore at 100 s) — but a victim can start on b0 at 100 s, and a restore
    committed before the victims were requeued (the rule's first pass) delayed it."""
    from makespan.planner.simulator import simulate

    eps = {"small": EndpointModel("small", 1, 20000, 5.0, 5.0), "other": EndpointModel("other", 1, 20000, 5.0, 5.0),
           "base": EndpointModel("base", 1, 20000, 5.0, 5.0), "big": EndpointModel("big", 2, 60000, 5.0, 5.0)}
    gpus = [Gpu("a0", "a", 0, 80000), Gpu("a1", "a", 1, 80000), Gpu("b0", "b", 0, 40000)]
    base = FleetState(0.0, gpus, eps, resident={"a0": "small", "a1": "small", "b0": "other"}, set_point={"b0": "base"})
    jobs = [PlanJob("V1", "small", 1.0, 0.0, 1000.0, 3, seq=0), PlanJob("V2", "small", 1.0, 0.0, 1000.0, 3, seq=1),
            PlanJob("X", "other", 2.0, 0.0, 50.0, 2, seq=2), PlanJob("C", "big", 8.0, 100.0, 10.0, 0, seq=3)]
    rep = simulate(jobs, base, "portfolio", preemption=mode, restore=True, detail=True)
    recs = {r["id"]: r for r in rep["schedule"]["jobs"]}
    assert tuple(recs["X"]["gpus"]) == ("b0",) and recs["X"]["end_s"] == 50.0
    assert [(p["t_s"], p["job"], sorted(p["victims"])) for p in rep["schedule"]["preemptions"]] == \
        [(100.0, "C", ["V1", "V2"])]
    on_b0 = [v for v in ("V1", "V2") if tuple(recs[v]["gpus"]) == ("b0",)]
    assert len(on_b0) == 1 and recs[on_b0[0]]["start_s"] == 100.0, rep["schedule"]["restores"]


def test_simulated_plan_restores_wait_while_the_batch_is_full():
    """As the live worker: a plan's restores are committed only when the batch holds every
    queued job. With ``max_batch=1`` and two queued jobs, the plan of the first leaves g1
    idle, but J2 (not in the batch) needs it: no restore at 0 (it would be evicted again
    for J2), one after J2."""
    from makespan.planner.simulator import simulate

    eps = {"other": EndpointModel("other", 1, 20000, 5.0, 5.0), "base": EndpointModel("base", 1, 20000, 5.0, 5.0)}
    gpus = [Gpu("g0", "a", 0, 80000), Gpu("g1", "a", 1, 80000)]
    base = FleetState(0.0, gpus, eps, resident={"g0": "other", "g1": "other"}, set_point={"g1": "base"})
    jobs = [PlanJob("J1", "other", 2.0, 0.0, 100.0, 2, seq=0), PlanJob("J2", "other", 2.0, 0.0, 100.0, 2, seq=1)]
    full = simulate(jobs, base, "portfolio", restore=True, detail=True, max_batch=1)
    roomy = simulate(jobs, base, "portfolio", restore=True, detail=True, max_batch=256)
    j2 = {r["id"]: r for r in full["schedule"]["jobs"]}["J2"]
    assert [tuple(r[2]) for r in full["schedule"]["restores"]] == [("g1",)]
    assert full["schedule"]["restores"][0][0] >= j2["end_s"]
    assert full["transitions"]["restore"] == 1
    assert [(r[0], tuple(r[2])) for r in roomy["schedule"]["restores"]] == [(100.0, ("g1",))]
