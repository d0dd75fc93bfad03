"""Following the last plan (workers/follow.py): a tick woken by releases starts the kept
plan's next jobs without re-planning, and falls back to the full tick whenever that would
not be what a fresh plan does (real Redis, in-process planner ticks on a manual clock)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from makespan.models import Priority, parse_fleet
from makespan.planner.model import Assignment, Plan, PlanJob
from makespan.producer import Producer
from makespan.workers.critical_lane import CriticalLane
from makespan.workers.follow import _unread_heads, next_starts
from makespan.workers.phases import PhaseRunner
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick import steps
from makespan.workers.tick.clock import ManualClock
from makespan.workers.tick.context import FormedBatch, KeptPlan

TWO = parse_fleet({"name": "two", "hosts": [{"name": "h", "gpu_count": 2, "memory_mib": 81920}],
                   "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})


@pytest.fixture
def planned(monkeypatch):
    """Counts the tick's plan() calls (PlanBatch's)."""
    calls = []
    real = steps.plan

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(steps, "plan", counting)
    return calls


def _worker(r, settings, **changes):
    s = dataclasses.replace(settings, batch_size=256, lease_ttl_s=60.0, policy="portfolio", **changes)
    sent = []
    clock = ManualClock(time.time())
    w = PlannerWorker(r, s, TWO, dispatch=lambda ctx, q: sent.append(ctx), clock=clock)
    return w, sent, clock, Producer(r, w.keys, TWO, w.settings)


def _finish(r, w, ctx):
    assert PhaseRunner(r, w.settings, TWO)._finish(ctx, "completed", "") == "completed"


def test_a_release_starts_the_kept_plans_next_job_on_that_gpu_without_planning(r, settings, planned):
    w, sent, clock, prod = _worker(r, settings)
    ids = [prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id for _ in range(6)]
    w.tick()
    assert len(sent) == 2 and len(planned) == 1
    kept = w.kept.followed
    assert kept is not None and kept.done == {c.job_id for c in sent}
    gpu = sent[0].gpus[0]
    expected = next(a.job_id for a in sorted(kept.plan.assignments, key=lambda a: a.start_s)
                    if a.job_id not in kept.done and gpu in a.gpus)
    _finish(r, w, sent[0])
    clock.advance(0.1)
    assert w.tick()
    assert len(planned) == 1  # followed: no plan
    assert sent[-1].job_id == expected and sent[-1].gpus == [gpu]
    assert set(ids) >= {c.job_id for c in sent}


def test_a_high_job_or_a_stale_plan_makes_the_next_tick_plan(r, settings, planned):
    w, sent, clock, prod = _worker(r, settings)
    for _ in range(6):
        prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
    w.tick()
    high = prod.submit({"endpoint": "e", "service_s": 100, "priority": "HIGH"}).id
    _finish(r, w, sent[0])
    w.tick()
    assert len(planned) == 2 and sent[-1].job_id == high  # planned: HIGH goes first
    assert w.kept.followed is None  # a plan with a HIGH job is not followed
    _finish(r, w, sent[-1])
    w.tick()  # NORMAL only again: planned, kept
    assert len(planned) == 3 and w.kept.followed is not None
    _finish(r, w, sent[-1])
    clock.advance(w.settings.plan_follow_s + 0.1)  # older than plan_follow_s: planned again
    w.tick()
    assert len(planned) == 4


def test_a_cancelled_next_job_is_passed_over_and_the_tick_plans(r, settings, planned):
    w, sent, clock, prod = _worker(r, settings)
    ids = [prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id for _ in range(6)]
    w.tick()
    kept = w.kept.followed
    gpu = sent[0].gpus[0]
    nxt = next(a.job_id for a in sorted(kept.plan.assignments, key=lambda a: a.start_s)
               if a.job_id not in kept.done and gpu in a.gpus)
    prod.cancel(nxt)
    _finish(r, w, sent[0])
    w.tick()
    assert len(planned) == 2  # the follow's lease failed: the full tick planned
    assert sent[-1].job_id != nxt and sent[-1].job_id in ids
    assert r.hget(w.keys.job(nxt), "state") == "cancelled"


def test_plan_follow_s_zero_plans_every_tick(r, settings, planned):
    w, sent, clock, prod = _worker(r, settings, plan_follow_s=0.0)
    for _ in range(6):
        prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
    w.tick()
    assert w.kept.followed is None
    _finish(r, w, sent[0])
    w.tick()
    assert len(planned) == 2


def _job(job_id: str, endpoint: str = "e", level: Priority = Priority.NORMAL, seq: int = 0) -> PlanJob:
    return PlanJob(job_id, endpoint, float(level.weight), 0.0, 10.0, int(level), (), None, seq)


def _kept(assignments: list[Assignment], jobs: list[PlanJob], done: set[str] = frozenset()) -> KeptPlan:
    formed = FormedBatch(own_level={job.id: Priority(job.priority) for job in jobs})
    return KeptPlan(Plan("portfolio", assignments), {job.id: job for job in jobs}, formed, 0.0, set(done))


def test_next_starts_keeps_each_gpus_order_and_moves_a_job_to_an_unplanned_warm_instance():
    jobs = [_job(name, seq=i) for i, name in enumerate("abcdx")] + [_job("f", endpoint="other")]
    plan = [Assignment("a", ("g0",), 0, 0, 10), Assignment("b", ("g0",), 10, 10, 20),
            Assignment("c", ("g0",), 20, 20, 30), Assignment("d", ("g1", "g2"), 0, 0, 10),
            Assignment("x", ("g1",), 10, 10, 20), Assignment("f", ("g0",), 30, 30, 40)]
    kept = _kept(plan, jobs, done={"a"})
    residents = {"g0": "e@g0", "g1": "e@g1", "g2": None, "g3": "e@g3", "g4": "other@g4"}
    starts = next_starts(kept, {"g2"}, residents)
    # g0: b is next; d waits for g2 (held), so x (behind d on g1) does not start; g3 is
    # planned for nothing and holds e: the earliest-planned unstarted e job of size 1 not
    # chosen (x, planned at 10 behind d) moves there; g4 holds `other`, whose job f (planned
    # on g0, last) moves there
    assert [(a.job_id, a.gpus) for a in starts] == [("b", ("g0",)), ("x", ("g3",)), ("f", ("g4",))]
    assert starts[1].load == "warm"
    starts = next_starts(kept, {"g2", "g3", "g4"}, residents)
    assert [(a.job_id, a.gpus) for a in starts] == [("b", ("g0",))]


def test_unread_heads_lets_the_queue_window_slide_but_not_a_job_ahead_of_the_plan():
    jobs = [_job("n1", seq=1), _job("n2", seq=2), _job("l1", level=Priority.LOW, seq=3)]
    kept = _kept([], jobs)
    normal_only = _kept([], jobs[:2])
    q = {Priority.CRITICAL: (), Priority.HIGH: (), Priority.NORMAL: ("n1", "n2"), Priority.LOW: ("l1",)}
    assert _unread_heads(kept, q) == []
    assert _unread_heads(normal_only, {**q, Priority.NORMAL: ("n1", "n2", "n3"), Priority.LOW: ()}) == ["n3"]  # slid
    assert _unread_heads(kept, {**q, Priority.NORMAL: ("n1", "n2", "n3")}) is None  # a new NORMAL before l1
    assert _unread_heads(normal_only, {**q, Priority.NORMAL: ("n0", "n1", "n2")}) is None  # ahead of n1 (requeued)
    assert _unread_heads(kept, {**q, Priority.HIGH: ("h1",)}) is None
    assert _unread_heads(kept, {**q, Priority.LOW: ("l1", "l2")}) == ["l2"]
    started = _kept([], jobs[:2], done={"n1"})  # n1 started, then queued again (a victim): not read
    assert _unread_heads(started, {**q, Priority.NORMAL: ("n1", "n2"), Priority.LOW: ()}) is None


def test_a_new_job_like_the_kept_ones_does_not_stop_following_but_a_shorter_one_does(r, settings, planned):
    w, sent, clock, prod = _worker(r, settings)
    for _ in range(6):
        prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
    w.tick()
    prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})  # alike: queued behind the kept ones
    _finish(r, w, sent[0])
    w.tick()
    assert len(planned) == 1  # followed
    short = prod.submit({"endpoint": "e", "service_s": 1, "priority": "NORMAL"}).id
    _finish(r, w, sent[-1])
    w.tick()
    assert len(planned) == 2 and sent[-1].job_id == short  # a fresh plan starts the short job first


def test_a_deadline_job_stops_following(r, settings, planned):
    w, sent, clock, prod = _worker(r, settings)
    for _ in range(6):
        prod.submit({"endpoint": "e", "service_s": 1000, "priority": "NORMAL"})
    w.tick()
    prod.submit({"endpoint": "e", "service_s": 1000, "priority": "NORMAL", "deadline_s": 60})
    _finish(r, w, sent[0])
    w.tick()
    assert len(planned) == 2  # a fresh plan decides (the policy weighs the deadline or not)


def test_a_victim_of_the_critical_lane_is_not_passed_over(r, settings, planned):
    w, sent, clock, prod = _worker(r, settings)
    ids = [prod.submit({"endpoint": "e", "service_s": 100, "priority": "LOW"}).id for _ in range(6)]
    w.tick()
    crit = prod.submit({"endpoint": "e", "service_s": 100, "priority": "CRITICAL"}).id
    w.kept.starting_gpus = frozenset()
    clock.advance(0.2)
    out = CriticalLane(w.env, w.kept, w.token, lambda: False).place(crit)
    assert out.outcome == "preempted", out
    victim = next(c for c in sent if c.lease_id == out.victims[0])
    other = next(c for c in sent if c.lease_id != out.victims[0])
    assert r.hget(w.keys.job(victim.job_id), "state") == "queued"
    clock.advance(0.1)
    _finish(r, w, other)
    w.tick()
    assert sent[-1].job_id == victim.job_id and victim.job_id in ids  # the victim, queued first, goes first


def test_reasons_are_rewritten_within_a_second_after_a_followed_tick_fills_the_fleet(r, settings):
    w, sent, clock, prod = _worker(r, settings)
    a = [prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id for _ in range(6)]
    w.tick()
    waiting = a[-1]
    before = r.hget(w.keys.job(waiting), "wait_at")
    clock.advance(0.1)
    _finish(r, w, sent[0])
    w.tick()  # followed: the fleet is full again
    assert w.kept.reasons_stale
    clock.advance(1.0)
    w.tick()  # every GPU held: a batch is formed for the reasons all the same
    assert r.hget(w.keys.job(waiting), "wait_at") != before
    assert not w.kept.reasons_stale


def test_a_job_alike_kept_ones_is_planned_once_its_likes_have_all_started(r, settings, planned):
    w, sent, clock, prod = _worker(r, settings)
    for service_s in (100, 100, 100, 100, 500, 500, 500, 500):
        prod.submit({"endpoint": "e", "service_s": service_s, "priority": "NORMAL"})
    w.tick()
    x = prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id  # alike the 100 s ones
    running = list(sent)
    for _ in range(2):  # the two other 100 s jobs start by following; x is behind them
        done = running.pop(0)
        _finish(r, w, done)
        w.tick()
        running.append(sent[-1])
        assert len(planned) == 1 and sent[-1].job_id != x
    assert x in w.kept.followed.alike
    _finish(r, w, running.pop(0))
    w.tick()  # only 500 s jobs are left in the kept plan: x is no longer alike one, the tick plans
    assert len(planned) == 2 and sent[-1].job_id == x


FOUR = parse_fleet({"name": "four", "hosts": [{"name": "h", "gpu_count": 4, "memory_mib": 81920}],
                    "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})


def test_queued_short_jobs_are_not_passed_by_longer_kept_jobs_in_one_tick(r, settings, planned):
    """Four releases in one tick: the kept plan's next jobs there are one short and three
    long ones, while three short jobs it did not read are queued: a fresh plan starts the
    short ones (found by a review: following started the long ones)."""
    s = dataclasses.replace(settings, batch_size=256, lease_ttl_s=60.0, policy="portfolio")
    sent = []
    w = PlannerWorker(r, s, FOUR, dispatch=lambda ctx, q: sent.append(ctx), clock=ManualClock(time.time()))
    prod = Producer(r, w.keys, FOUR, w.settings)
    short = [prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id for _ in range(5)]
    for _ in range(4):
        prod.submit({"endpoint": "e", "service_s": 500, "priority": "NORMAL"})
    w.tick()
    first = list(sent)
    assert {c.job_id for c in first} <= set(short) and len(first) == 4
    later = [prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id for _ in range(3)]
    for ctx in first:
        assert PhaseRunner(r, w.settings, FOUR)._finish(ctx, "completed", "") == "completed"
    w.tick()
    assert len(planned) == 2
    assert {c.job_id for c in sent[len(first):]} == {short[4], *later}


def test_a_cordoned_host_does_not_stop_following_but_a_cordon_change_does(r, settings, planned):
    """A host out of service for a while (cordoned, or its worker down) leaves the rest of
    the fleet followed as before; a cordon that changes (or a host that comes back) makes
    the next tick plan (the freed GPUs are a fresh plan's to give)."""
    from makespan.workers.host_liveness import announce, cordon, uncordon

    fleet = parse_fleet({"name": "two-hosts", "hosts": [{"name": "h", "gpu_count": 2, "memory_mib": 81920},
                                                        {"name": "g", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})
    s = dataclasses.replace(settings, batch_size=256, lease_ttl_s=60.0, policy="portfolio")
    sent = []
    clock = ManualClock(time.time())
    w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: sent.append(ctx), clock=clock)
    prod = Producer(r, w.keys, fleet, w.settings)
    for host in ("h", "g"):
        announce(r, w.keys, host, f"worker-{host}", 60.0)
    cordon(r, w.keys, "g", "maintenance")
    for _ in range(6):
        prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
    w.tick()
    assert len(sent) == 2 and {c.gpus[0] for c in sent} == {"GPU-h-0", "GPU-h-1"} and len(planned) == 1
    assert w.kept.followed is not None  # kept although a host takes no lease
    PhaseRunner(r, w.settings, fleet)._finish(sent[0], "completed", "")
    clock.advance(0.1)
    w.tick()
    assert len(planned) == 1 and len(sent) == 3 and sent[-1].gpus == sent[0].gpus  # followed, on host h
    assert uncordon(r, w.keys, "g") is not None
    clock.advance(0.1)
    w.tick()
    assert len(planned) == 2 and sent[-1].gpus == ["GPU-g-0"]  # planned: g's GPU is free again
