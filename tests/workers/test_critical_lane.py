"""The critical lane (makespan.workers.critical_lane, issue 21 point 2): a CRITICAL job is
leased the moment it is submitted, on a warm idle instance, a free group or by preempting
LOW work, without waiting for the tick. Real Redis, the real lease and preempt scripts,
the lane's real thread; dispatch is captured here (the live test with GPU worker processes
is tests/workers/test_critical_lane_live.py)."""

from __future__ import annotations

import logging

import dataclasses
import json
import threading
import time

import pytest

from makespan import events as ev
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.workers.critical_lane import CriticalLane
from makespan.workers.phases import instance_value
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick.claims import JobClaims
from makespan.workers.tick.steps import TICK_STEPS
from makespan.workloads import submit_workload
from tests.conftest import FLEET_TOML
from tests.live import wait_for

FLEET = load_fleet(FLEET_TOML)  # render-pipeline: 8 GPUs on host-a and host-b
ALL_GPUS = [gpu.uuid for host in FLEET.hosts for gpu in host.gpus]


def _worker(r, settings, **changes):
    sent: list = []
    s = dataclasses.replace(settings, lease_ttl_s=60.0, **changes)
    w = PlannerWorker(r, s, FLEET, dispatch=lambda ctx, queue: sent.append(ctx))
    w.token = ""
    return w, Producer(r, w.keys, FLEET, s), sent


def _lane(w) -> CriticalLane:
    return CriticalLane(w.env, w.kept, w.token, w.ticking.is_set)


def _lane_events(r, keys, job_id):
    return [e for e in ev.read_all(r, keys.events) if e["kind"] == "critical_lane" and e["job"] == job_id]


def _hold_with_low_jobs(r, w, prod, gpus_by_lease, ends_in_s=3600.0):
    """Lease each GPU group of ``gpus_by_lease`` to a LOW job planned to end in ``ends_in_s``
    workload s (running long; negative: past its planned end); returns the lease ids."""
    leases = []
    for n, gpus in enumerate(gpus_by_lease):
        jid = prod.submit({"endpoint": "renderer", "service_s": 3600, "priority": "LOW"}).id
        lease = w.leases.acquire(f"low-{n}", tuple(gpus), 60.0, job_id=jid, kind="job", holder="host-a",
                                 queue=w.keys.queue("LOW"),
                                 info={"planned_end_s": repr(w.now_s() + ends_in_s), "endpoint": "renderer",
                                       "priority": "LOW"})
        assert lease is not None
        leases.append(f"low-{n}")
    return leases


def test_a_warm_idle_instance_is_leased_at_once_then_a_free_group(r, settings):
    w, prod, sent = _worker(r, settings)
    warm_gpu = "GPU-host-b-3"
    r.set(w.keys.resident(warm_gpu), instance_value("embed", [warm_gpu]))
    r.set(w.keys.resident("GPU-host-a-0"), instance_value("coder", ["GPU-host-a-0", "GPU-host-a-1"]))
    r.set(w.keys.resident("GPU-host-a-1"), instance_value("coder", ["GPU-host-a-0", "GPU-host-a-1"]))
    lane = _lane(w)
    lane.start()
    try:
        first = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "CRITICAL"}).id
        wait_for(lambda: len(sent) == 1, 10, "the lane to lease the first CRITICAL job", 0.01)
        second = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "CRITICAL"}).id
        wait_for(lambda: len(sent) == 2, 10, "the lane to lease the second CRITICAL job", 0.01)
    finally:
        lane.stop(5)
    assert [c.job_id for c in sent] == [first, second]
    assert sent[0].gpus == [warm_gpu]  # the warm instance, though host-a comes first
    assert _lane_events(r, w.keys, first)[0]["outcome"] == "warm"
    # cold: a free GPU with nothing to evict (not the coder's), in fleet order
    assert sent[1].gpus == ["GPU-host-a-2"] and _lane_events(r, w.keys, second)[0]["outcome"] == "cold_start"
    for job_id in (first, second):
        assert r.hget(w.keys.job(job_id), "state") == "leased"
        assert r.zscore(w.keys.queue("CRITICAL"), job_id) is None
        assert _lane_events(r, w.keys, job_id)[0]["during_tick"] is False
    # the next tick reconciles: it sees the leases, plans nothing for these jobs
    w.tick()
    assert [c.job_id for c in sent if c.kind == "job"] == [first, second]


def test_every_gpu_held_by_low_work_preempts_the_cheapest_group(r, settings, caplog):
    w, prod, sent = _worker(r, settings)
    pairs = [ALL_GPUS[n:n + 2] for n in range(0, 8, 2)]
    leases = _hold_with_low_jobs(r, w, prod, pairs)
    victims_jobs = {lease: r.hget(w.keys.lease(lease), "job") for lease in leases}
    job = prod.submit({"endpoint": "summarizer", "service_s": 5, "priority": "CRITICAL"}).id  # TP 2
    with caplog.at_level(logging.INFO, logger="makespan.planner"):
        out = _lane(w).place(r.lpop(w.keys.planner_critical))
    assert out.outcome == "preempted" and len(out.victims) == 1
    (victim,) = out.victims
    # the log line names the victim's job, not only its lease
    assert f"preempted job {victims_jobs[victim]} (lease {victim}) for CRITICAL job {job}" in caplog.text
    # the lane's event names the victims' jobs beside their leases (a pools operator looked a lease id up as a job)
    assert out.victim_jobs == (victims_jobs[victim],)
    lane_events = [json.loads(f["e"]) for _i, f in r.xrange(w.keys.events)]
    assert [e["victim_jobs"] for e in lane_events if e["kind"] == "critical_lane"] == [[victims_jobs[victim]]]
    assert tuple(out.gpus) == tuple(pairs[leases.index(victim)])
    assert [c.job_id for c in sent] == [job] and sent[0].gpus == list(out.gpus)
    assert r.hget(w.keys.job(job), "state") == "leased"
    # the victim is back in its queue, its GPUs are the CRITICAL job's
    victim_job = victims_jobs[victim]
    assert r.hget(w.keys.job(victim_job), "state") == "queued"
    assert r.zscore(w.keys.queue("LOW"), victim_job) is not None
    assert all(r.get(w.keys.gpu(gpu)).split(":")[0] == sent[0].lease_id for gpu in out.gpus)


def test_holders_past_their_planned_end_are_preempted_not_waited_for(r, settings):
    """Every GPU held by LOW jobs 600 s past their planned ends: the lane took them for
    freeing now (their planned ends) and left the CRITICAL job waiting (``no_group``);
    they are expected to run as long again (as the tick's fleet state), so it preempts."""
    w, prod, sent = _worker(r, settings)
    _hold_with_low_jobs(r, w, prod, [ALL_GPUS[n:n + 2] for n in range(0, 8, 2)], ends_in_s=-600.0)
    job = prod.submit({"endpoint": "summarizer", "service_s": 5, "priority": "CRITICAL"}).id  # TP 2
    out = _lane(w).place(r.lpop(w.keys.planner_critical))
    assert out.outcome == "preempted" and len(out.victims) == 1
    assert [c.job_id for c in sent] == [job]


def test_critical_work_is_never_preempted_and_the_job_stays_queued_for_the_tick(r, settings):
    w, prod, sent = _worker(r, settings)
    for n, gpu in enumerate(ALL_GPUS):
        jid = prod.submit({"endpoint": "embed", "service_s": 3600, "priority": "CRITICAL"}).id
        r.lpop(w.keys.planner_critical)
        assert w.leases.acquire(f"crit-{n}", (gpu,), 60.0, job_id=jid, kind="job", holder="host-a",
                                queue=w.keys.queue("CRITICAL"), info={"priority": "CRITICAL"}) is not None
    job = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "CRITICAL"}).id
    out = _lane(w).place(r.lpop(w.keys.planner_critical))
    assert out.outcome == "no_group" and not sent
    assert r.hget(w.keys.job(job), "state") == "queued" and r.zscore(w.keys.queue("CRITICAL"), job) is not None


def test_a_stale_fencing_token_leases_nothing(r, settings):
    from makespan.errors import LeaseError

    w, prod, sent = _worker(r, settings)
    r.set(w.keys.planner_fence, "7")
    job = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "CRITICAL"}).id
    lane = CriticalLane(w.env, w.kept, "6", w.ticking.is_set)  # another planner leads now (token 7)
    with pytest.raises(LeaseError):
        lane.place(r.lpop(w.keys.planner_critical))
    assert not sent and r.hget(w.keys.job(job), "state") == "queued"
    assert not any(r.exists(w.keys.gpu(gpu)) for gpu in ALL_GPUS)


def test_only_queued_critical_jobs_whose_dependencies_completed_take_the_lane(r, settings):
    from makespan.workers.phases import PhaseRunner

    w, prod, sent = _worker(r, settings)
    lane = _lane(w)
    normal = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "NORMAL"}).id
    assert r.llen(w.keys.planner_critical) == 0  # only CRITICAL submits are pushed
    assert lane.place(normal).outcome == "not_queued"
    dep = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "CRITICAL"}).id
    r.lpop(w.keys.planner_critical)
    waiting = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "CRITICAL", "depends_on": [dep]}).id
    r.lpop(w.keys.planner_critical)
    assert lane.place(waiting).outcome == "deps"
    assert lane.place(dep).leased
    assert lane.place(dep).outcome == "not_queued"  # a second pop of the same id: leased once
    assert [c.job_id for c in sent] == [dep]
    assert r.llen(w.keys.planner_critical) == 0  # leased, not completed: the dependant is not released
    assert PhaseRunner(r, w.settings, FLEET)._finish(sent[0], "completed", "") == "completed"
    assert r.lrange(w.keys.planner_critical, 0, -1) == [waiting]  # released by its dependency's completion
    assert lane.place(r.lpop(w.keys.planner_critical)).leased
    assert [c.job_id for c in sent] == [dep, waiting]


def _critical_workload(r, w) -> tuple[str, dict[str, str]]:
    """Submit a CRITICAL workload of two embed steps, ``b`` after ``a`` (retry budget 1);
    returns its id and its step -> job id map."""
    spec = {"name": "urgent", "priority": "CRITICAL", "retry_budget": 1,
            "steps": [{"name": "a", "endpoint": "embed", "service_s": 5},
                      {"name": "b", "endpoint": "embed", "service_s": 5, "depends_on": ["a"]}]}
    wid = submit_workload(r, w.keys, FLEET, spec, w.settings)
    return wid, json.loads(r.hget(w.keys.workload(wid), "steps"))


def test_critical_workload_steps_take_the_lane_at_submit_and_when_released(r, settings):
    """A CRITICAL workload's first step is leased by the lane's thread the moment the
    workload is submitted, and the step after it the moment that one completes; no tick
    runs here, so only the lane can have placed them (they used to wait for the tick)."""
    from makespan.workers.phases import PhaseRunner

    w, _, sent = _worker(r, settings)
    lane = _lane(w)
    lane.start()
    try:
        _, steps = _critical_workload(r, w)
        wait_for(lambda: len(sent) == 1, 10, "the lane to lease the first step", 0.01)
        assert sent[0].job_id == steps["a"]
        assert r.hget(w.keys.job(steps["b"]), "state") == "queued" and not _lane_events(r, w.keys, steps["b"])
        assert PhaseRunner(r, w.settings, FLEET)._finish(sent[0], "completed", "") == "completed"
        wait_for(lambda: len(sent) == 2, 10, "the lane to lease the released step", 0.01)
    finally:
        lane.stop(5)
    assert sent[1].job_id == steps["b"] and lane.placed == 2
    for job_id in steps.values():
        (event,) = _lane_events(r, w.keys, job_id)
        assert event["outcome"] in ("warm", "cold_start")
    assert r.hget(w.keys.job(steps["b"]), "state") == "leased"
    assert r.zscore(w.keys.queue("CRITICAL"), steps["b"]) is None


def test_a_critical_step_retry_takes_the_lane(r, settings):
    """A failed CRITICAL step's retry takes the lane; the failure releases nothing, the
    retry's completion releases the step after it."""
    from makespan.workers.phases import PhaseRunner
    from makespan.workloads import advance_workloads

    w, _, sent = _worker(r, settings)
    lane, runner = _lane(w), PhaseRunner(r, w.settings, FLEET)
    wid, steps = _critical_workload(r, w)
    assert r.lrange(w.keys.planner_critical, 0, -1) == [steps["a"]]  # b waits for a: not pushed
    assert lane.place(r.lpop(w.keys.planner_critical)).leased
    assert runner._finish(sent[0], "failed", "boom") == "failed"
    assert r.llen(w.keys.planner_critical) == 0  # a failed: b is not released
    assert advance_workloads(r, w.keys)["retried"] == 1
    retry = json.loads(r.hget(w.keys.workload(wid), "steps"))["a"]
    assert retry != steps["a"] and r.lrange(w.keys.planner_critical, 0, -1) == [retry]
    assert lane.place(r.lpop(w.keys.planner_critical)).leased and sent[1].job_id == retry
    assert runner._finish(sent[1], "completed", "") == "completed"
    assert r.lrange(w.keys.planner_critical, 0, -1) == [steps["b"]]
    assert lane.place(r.lpop(w.keys.planner_critical)).leased and sent[2].job_id == steps["b"]


def _jobs(sent):
    return [c for c in sent if c.kind == "job"]


class _Gate:
    """A tick step that blocks until released: a tick held in progress, deterministically."""

    name = "gate"

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def run(self, ctx) -> None:
        if ctx.batch and not self.entered.is_set():  # the first tick with a batch only
            self.entered.set()
            assert self.release.wait(60), "the test never released the tick"


def test_a_critical_job_is_leased_while_a_tick_is_in_progress(r, settings):
    """The tick's plan is held (a gate step after planning, before its starts); the CRITICAL
    job submitted meanwhile is leased by the lane, and the tick, released, leases nothing
    twice: every GPU has one lease at a time, the CRITICAL job one lease."""
    w, prod, sent = _worker(r, settings, batch_wait_s=0.0)
    gate = _Gate()
    at = [step.name for step in TICK_STEPS].index("start")
    w.steps = (*TICK_STEPS[:at], gate, *TICK_STEPS[at:])
    for _ in range(40):
        prod.submit({"endpoint": "embed", "service_s": 600, "priority": "LOW"})
    runner = threading.Thread(target=w.run, daemon=True)
    runner.start()
    try:
        assert gate.entered.wait(60), "the tick never reached its starts"
        job = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "CRITICAL"}).id
        wait_for(lambda: r.hget(w.keys.job(job), "state") == "leased", 10, "the lane to lease the job", 0.01)
        assert w.ticking.is_set() and not gate.release.is_set()  # the tick is still in progress
        # the lane records its event after the lease: wait for it (read at once, it raced the lane)
        wait_for(lambda: _lane_events(r, w.keys, job), 10, "the lane's event", 0.01)
        (event,) = _lane_events(r, w.keys, job)
        assert event["during_tick"] is True and event["outcome"] in ("warm", "cold_start")
        gate.release.set()
        wait_for(lambda: len(_jobs(sent)) == len(ALL_GPUS), 20, "the released tick to start the LOW jobs", 0.02)
    finally:
        gate.release.set()
        w.stop()
        runner.join(10)
    sent = _jobs(sent)
    assert [c.job_id for c in sent].count(job) == 1
    holders = [r.get(w.keys.gpu(gpu)) for gpu in ALL_GPUS]
    assert all(holders) and len({h.split(":")[0] for h in holders}) == len(ALL_GPUS)  # one lease per GPU
    assert sent[0].job_id == job  # the lane went first, while the tick was held


def test_claims_keep_the_tick_off_a_job_the_lane_holds_or_leased():
    claims = JobClaims()
    assert claims.take("a", 0.0)
    assert claims.take_free(["a", "b"]) == {"b"}  # the lane holds a: the tick takes only b
    assert not claims.take("b", 0.01)  # the lane waits while the tick holds b
    claims.release(["a"], settled=True)  # the lane leased a
    claims.release(["b"])
    assert claims.take_free(["a", "b"]) == {"b"}  # a stays the lane's: the tick never preempts for it
    started = time.monotonic()
    threading.Timer(0.05, claims.release, args=(["b"],)).start()
    assert claims.take("b", 5.0) and time.monotonic() - started < 5.0


@pytest.mark.parametrize("preemption", ["plan", "rule"])
def test_the_ticks_preempt_step_never_preempts_for_a_job_the_lane_settled(r, settings, preemption):
    """The tick's batch may still hold a CRITICAL job the lane leased a moment ago: its
    Preempt step (both deciders) must not cut a victim for it. Here the job is left queued
    and only marked settled, so without the claims the step would preempt a LOW lease."""
    w, prod, sent = _worker(r, settings, preemption=preemption)
    pairs = [ALL_GPUS[n:n + 2] for n in range(0, 8, 2)]
    _hold_with_low_jobs(r, w, prod, pairs)
    job = prod.submit({"endpoint": "summarizer", "service_s": 5, "priority": "CRITICAL"}).id
    w.kept.claims.take(job, 0.0)
    w.kept.claims.release([job], settled=True)
    w.tick()
    assert not sent and r.zcard(w.keys.queue("LOW")) == 0  # no victim requeued
    w.kept.claims = JobClaims()  # not settled: the same tick preempts for it
    w.tick()
    assert [c.job_id for c in sent] == [job] and r.zcard(w.keys.queue("LOW")) == 1


def test_a_job_the_lane_ran_between_two_ticks_gets_a_drain_check(r, settings):
    """An idle fleet's drain is checked once per idle period; a CRITICAL job that the lane
    leases and that completes before the next tick is never seen running by a tick, yet it
    ends the idle period: the next idle tick checks the drain again (the chaos runner found
    "no clean drain check after the last job" when its last job went this way)."""
    from makespan.workers.phases import PhaseRunner

    w, prod, sent = _worker(r, settings)
    for endpoint, gpus in w.env.set_points:  # at the set point: an idle tick checks the drain
        for gpu in gpus:
            r.set(w.keys.resident(gpu), instance_value(endpoint, list(gpus)))
    w.tick()
    assert r.hget(w.keys.drain, "checks") == "1"
    job = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "CRITICAL"}).id
    assert _lane(w).place(job).leased and [c.job_id for c in sent] == [job]
    assert PhaseRunner(r, w.settings, FLEET)._finish(sent[0], "completed", "") == "completed"
    for endpoint, gpus in w.env.set_points:  # the job ran where no set point lives, or is back
        for gpu in gpus:
            r.set(w.keys.resident(gpu), instance_value(endpoint, list(gpus)))
    w.tick()
    assert r.hget(w.keys.drain, "checks") == "2"
    w.tick()  # the same idle period again: no third check
    assert r.hget(w.keys.drain, "checks") == "2"


@pytest.mark.parametrize("time_scale", [0.01, 1.0])
@pytest.mark.parametrize("path", ["lane", "tick"])
@pytest.mark.parametrize("mode", ["rule", "plan"])
def test_no_preemption_onto_a_host_without_a_live_gpu_worker(r, settings, time_scale, path, mode):
    """h1's GPU worker is gone while its LOW job's lease is still live: a CRITICAL job must
    preempt the LOW job on h2, not h1's, where nothing would run it (the lane and the rule
    picked h1's group, and the CRITICAL job waited for the lease to expire)."""
    from makespan.models import parse_fleet
    from makespan.workers import host_liveness
    from makespan.workers.tick.clock import ManualClock

    fleet = parse_fleet({"name": "two", "hosts": [{"name": "h1", "gpu_count": 1, "memory_mib": 81920},
                                                  {"name": "h2", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})
    s = dataclasses.replace(settings, batch_size=256, lease_ttl_s=60.0, policy="portfolio", time_scale=time_scale,
                            preemption=mode)
    sent = []
    clock = ManualClock(time.time())
    w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: sent.append(ctx), clock=clock)
    prod = Producer(r, w.keys, fleet, s)
    for host in ("h1", "h2"):
        host_liveness.announce(r, w.keys, host, f"worker-{host}", 60)
    for _ in range(2):
        prod.submit({"endpoint": "e", "service_s": 1e6, "priority": "LOW"})
    w.tick()
    assert len(sent) == 2
    r.delete(w.keys.host_live("h1"))
    clock.advance(30.0)  # the LOW jobs ran a while (their leased_at is on the real clock, which ran on too)
    critical = prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL"}).id
    if path == "lane":
        CriticalLane(w.env, w.kept, w.token, lambda: False).place(critical)
    else:
        w.tick()
    placed = [ctx for ctx in sent if ctx.job_id == critical]
    assert placed and placed[0].host == "h2", [(ctx.job_id, ctx.host) for ctx in sent]


def test_a_victim_whose_lease_ended_by_itself_still_lets_the_preemptor_start(r, settings, monkeypatch):
    """The chosen victim finished on its own between the lane's read and its preemption
    (``preempt`` answers ``gone``): its GPUs are free, so the CRITICAL job is leased there
    (the lane gave up with ``lost_race`` and the job waited for the next tick)."""
    from makespan.store.leases import LeaseStore as StoreLeases
    from makespan.workers import critical_lane

    w, prod, sent = _worker(r, settings)
    pairs = [ALL_GPUS[n:n + 2] for n in range(0, 8, 2)]
    _hold_with_low_jobs(r, w, prod, pairs)
    job = prod.submit({"endpoint": "summarizer", "service_s": 5, "priority": "CRITICAL"}).id  # TP 2

    def ended_meanwhile(redis_client, keys, lease_id, by_job, planner_token=""):
        for gpu in r.hget(keys.lease(lease_id), "gpus").strip("[]").replace('"', "").split(","):
            r.delete(keys.gpu(gpu.strip()))  # the victim's worker released its GPUs ...
        r.zrem(keys.leases, lease_id)
        r.delete(keys.lease(lease_id))
        return StoreLeases(redis_client, keys).preempt(lease_id, by_job, planner_token)  # ... so: "gone"

    monkeypatch.setattr(critical_lane, "preempt", ended_meanwhile)
    out = _lane(w).place(r.lpop(w.keys.planner_critical))
    assert out.outcome == "preempted" and [c.job_id for c in sent] == [job]
    assert r.hget(w.keys.job(job), "state") == "leased"



def _helped_worker(r, settings):
    """A fleet where a job with the helper ``aux`` fits only on h2 (h1's 20000 MiB hold ``e``
    but not ``e`` + ``aux``, 25000 MiB); h1 comes first in fleet order."""
    from makespan.models import parse_fleet
    from makespan.workers.tick.clock import ManualClock

    fleet = parse_fleet({"name": "helped", "hosts": [{"name": "h1", "gpu_count": 1, "memory_mib": 20000},
                                                     {"name": "h2", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1},
                                       "aux": {"model": "x", "memory_mib_per_gpu": 15000, "cold_start_s": 2}}})
    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    sent: list = []
    w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, queue: sent.append(ctx), clock=ManualClock(time.time()))
    w.token = ""
    return w, Producer(r, w.keys, fleet, s), sent


@pytest.mark.parametrize("path", ["free", "preempt"])
def test_a_critical_job_with_helpers_is_leased_only_where_its_helpers_fit(r, settings, path):
    """A job's ``helpers`` start on its GPUs after its main endpoint (planner/helpers.py):
    the lane placed it by its main endpoint alone, on h1 where ``aux`` does not fit (its
    start phase would fail for memory), and planned its end without the helpers' start."""
    w, prod, sent = _helped_worker(r, settings)
    if path == "preempt":  # every GPU held by LOW work: the victim must be h2's
        for n, gpu in enumerate(("GPU-h1-0", "GPU-h2-0")):
            jid = prod.submit({"endpoint": "e", "service_s": 3600, "priority": "LOW"}).id
            assert w.leases.acquire(f"low-{n}", (gpu,), 60.0, job_id=jid, kind="job", holder=w.fleet.host_of(gpu),
                                    queue=w.keys.queue("LOW"),
                                    info={"planned_end_s": repr(w.now_s() + 3600), "endpoint": "e",
                                          "priority": "LOW"}) is not None
    job = prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL", "helpers": ["aux"]}).id
    out = _lane(w).place(r.lpop(w.keys.planner_critical))
    assert out.leased and out.gpus == ("GPU-h2-0",), out
    assert out.victims == (("low-1",) if path == "preempt" else ())
    assert [c.job_id for c in sent] == [job] and sent[0].host == "h2"
    # planned to end after main's cold start (1 s), aux's (2 s) and its service (5 s)
    assert float(r.hget(w.keys.lease(sent[0].lease_id), "planned_end_s")) == pytest.approx(w.now_s() + 8.0)


def test_a_critical_job_whose_helpers_fit_nowhere_free_is_left_to_the_tick(r, settings):
    """h2 held by CRITICAL work (never a victim), h1 free but too small for ``e`` + ``aux``:
    the lane leases nothing (``no_group``), the job stays queued."""
    w, prod, sent = _helped_worker(r, settings)
    held = prod.submit({"endpoint": "e", "service_s": 3600, "priority": "CRITICAL"}).id
    r.lpop(w.keys.planner_critical)
    assert w.leases.acquire("crit", ("GPU-h2-0",), 60.0, job_id=held, kind="job", holder="h2",
                            queue=w.keys.queue("CRITICAL"), info={"priority": "CRITICAL"}) is not None
    job = prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL", "helpers": ["aux"]}).id
    assert _lane(w).place(r.lpop(w.keys.planner_critical)).outcome == "no_group" and not sent
    assert r.hget(w.keys.job(job), "state") == "queued"


def test_a_redis_bug_while_placing_is_logged_as_a_bug(r, settings, caplog):
    """A Redis reply that is a bug (here WRONGTYPE: the job's key is no hash) is logged by
    the lane's thread at ERROR as a bug with its traceback (OutageLog.bug), as the tick loop
    does, not as "placing failed (Redis)"; the failure is still recorded."""

    w, prod, sent = _worker(r, settings)
    r.set(w.keys.job("broken"), "not a hash")
    lane = _lane(w)
    with caplog.at_level(logging.INFO, logger="makespan.planner"):
        lane.start()
        try:
            r.rpush(w.keys.planner_critical, "broken")
            wait_for(lambda: _lane_events(r, w.keys, "broken"), 10, "the lane's error event", 0.01)
        finally:
            lane.stop(5)
    (event,) = _lane_events(r, w.keys, "broken")
    assert event["outcome"] == "error" and "WRONGTYPE" in event["error"]
    lines = [rec for rec in caplog.records if rec.name == "makespan.planner" and rec.levelno >= logging.WARNING]
    assert lines and all(rec.levelno == logging.ERROR and rec.exc_info for rec in lines), \
        [(rec.levelname, rec.getMessage()) for rec in lines]
    assert "a bug, not an outage" in lines[0].getMessage() and "WRONGTYPE" in lines[0].getMessage()
    assert not sent


def test_the_ticks_rule_preemption_places_a_job_only_where_its_helpers_fit(r, settings):
    """The tick's preemption rule (``MAKESPAN_PREEMPTION=rule``) chose the group by the main
    endpoint alone, like the lane before: with every GPU held by LOW work it cut h1's job
    (first in fleet order), where ``aux`` does not fit beside ``e``, and planned the end
    without the helpers' start. Now it cuts h2's, where they fit."""
    w, prod, sent = _helped_worker(r, dataclasses.replace(settings, preemption="rule", critical_lane=False))
    for n, gpu in enumerate(("GPU-h1-0", "GPU-h2-0")):
        jid = prod.submit({"endpoint": "e", "service_s": 3600, "priority": "LOW"}).id
        assert w.leases.acquire(f"low-{n}", (gpu,), 60.0, job_id=jid, kind="job", holder=w.fleet.host_of(gpu),
                                queue=w.keys.queue("LOW"),
                                info={"planned_end_s": repr(w.now_s() + 3600), "endpoint": "e",
                                      "priority": "LOW"}) is not None
    job = prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL", "helpers": ["aux"]}).id
    w.tick()
    assert [c.job_id for c in sent] == [job] and sent[0].host == "h2", [(c.job_id, c.host) for c in sent]
    assert r.exists(w.keys.lease("low-0")) and not r.exists(w.keys.lease("low-1"))
    # planned to end after main's cold start (1 s), aux's (2 s) and its service (5 s)
    assert float(r.hget(w.keys.lease(sent[0].lease_id), "planned_end_s")) == pytest.approx(w.now_s() + 8.0)
