"""The live planner worker starts a plan's set-point restore while jobs are queued
(workers/drain.py ``RestorePlanned``): in-process against real Redis, dispatch captured."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import instance_value
from makespan.workers.planner_worker import PlannerWorker

FLEET = parse_fleet({"name": "two",
                     "hosts": [{"name": "a", "gpu_count": 1, "memory_mib": 40000},
                               {"name": "b", "gpu_count": 1, "memory_mib": 81920}],
                     "endpoints": {"base": {"model": "b", "memory_mib_per_gpu": 20000, "cold_start_s": 2,
                                            "set_point": [{"host": "a", "gpus": [0]}]},
                                   "other": {"model": "o", "memory_mib_per_gpu": 60000, "cold_start_s": 60}}})
G0, G1 = FLEET.hosts[0].gpus[0].uuid, FLEET.hosts[1].gpus[0].uuid


def _run(r, keys, settings, **kw):
    """GPU 1 (host b) holds ``other`` and GPU 0 (host a) nothing: its set point ``base``
    is not resident. Two ``other`` jobs are queued; ``other`` fits only host b's memory,
    so the plan runs both on GPU 1 and leaves GPU 0 idle until the horizon end."""
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0, **kw)
    sent = []
    w = PlannerWorker(r, s, FLEET, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = ""
    r.set(keys.resident(G1), instance_value("other", [G1]))
    prod = Producer(r, keys, FLEET, s)
    ids = [prod.submit({"endpoint": "other", "service_s": 1, "priority": "NORMAL"}).id for _ in range(2)]
    w.tick()
    return sent, ids


def test_plan_restore_starts_on_an_idle_set_point_group_while_jobs_wait(r, keys, settings):
    sent, ids = _run(r, keys, settings)
    jobs = [c for c in sent if c.kind == "job"]
    restores = [c for c in sent if c.kind == "restore"]
    assert len(jobs) == 1 and jobs[0].gpus == [G1]  # the other job waits for GPU 1
    assert [(c.endpoint, c.gpus) for c in restores] == [("base", [G0])]
    assert r.get(keys.gpu(G0))  # GPU 0 is leased to the restore


def test_no_plan_restore_when_the_batch_may_leave_jobs_out(r, keys, settings):
    sent, _ = _run(r, keys, settings, batch_size=2)  # a full batch: a queued job beyond it might need GPU 0
    assert [c.kind for c in sent] == ["job"]
    assert not r.get(keys.gpu(G0))


PAIR = parse_fleet({"name": "pair+one",
                    "hosts": [{"name": "a", "gpu_count": 2, "memory_mib": 81920},
                              {"name": "b", "gpu_count": 1, "memory_mib": 40000}],
                    "endpoints": {"big": {"model": "g", "memory_mib_per_gpu": 60000, "tensor_parallel": 2,
                                          "cold_start_s": 5},
                                  "small": {"model": "s", "memory_mib_per_gpu": 20000, "cold_start_s": 5},
                                  "base": {"model": "b", "memory_mib_per_gpu": 20000, "cold_start_s": 5,
                                           "set_point": [{"host": "b", "gpus": [0]}]}}})
A0, A1, B0 = PAIR.hosts[0].gpus[0].uuid, PAIR.hosts[0].gpus[1].uuid, PAIR.hosts[1].gpus[0].uuid


@pytest.mark.parametrize("mode", ["plan", "rule"])
def test_no_plan_restore_on_a_group_a_requeued_victim_could_take(r, keys, settings, mode):
    """Two LOW ``small`` jobs hold host a's pair; a CRITICAL ``big`` (TP 2, fits only
    host a) preempts them. GPU b0 is free and not at its set point ``base``: the plan of
    the CRITICAL job alone leaves it idle, so a planned restore would start there now —
    but the victims just went back to the queue (the batch no longer holds every queued
    job) and one of them can start on b0 at once. The restore must not take b0 first."""
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0, preemption=mode)
    sent = []
    w = PlannerWorker(r, s, PAIR, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = ""
    prod = Producer(r, keys, PAIR, s)
    lows = []
    for u in (A0, A1):
        jid = prod.submit({"endpoint": "small", "service_s": 1000, "priority": "LOW"}).id
        lease = LeaseStore(r, keys).acquire(uuid.uuid4().hex, (u,), 60.0, job_id=jid, kind="job", holder="a",
                                            queue=keys.queue("LOW"),
                                            info={"planned_end_s": repr(w.now_s() + 1e6), "endpoint": "small",
                                                  "priority": "LOW"})
        assert lease is not None
        r.set(keys.resident(u), instance_value("small", [u]))
        lows.append(jid)
    crit = prod.submit({"endpoint": "big", "service_s": 10, "priority": "CRITICAL"}).id
    w.tick()
    assert [(c.job_id, c.gpus) for c in sent if c.kind == "job"] == [(crit, [A0, A1])]
    assert sorted(r.hget(keys.job(j), "state") for j in lows) == ["queued", "queued"]
    w.tick()  # a victim starts on b0 at once; no restore took it in between
    assert [c.kind for c in sent] == ["job", "job"], [(c.kind, c.job_id, c.gpus) for c in sent]
    assert sent[1].job_id in lows and sent[1].gpus == [B0]


LATER = parse_fleet({"name": "pair",
                     "hosts": [{"name": "a", "gpu_count": 2, "memory_mib": 81920}],
                     "endpoints": {"big": {"model": "g", "memory_mib_per_gpu": 60000, "tensor_parallel": 2,
                                           "cold_start_s": 5},
                                   "small": {"model": "s", "memory_mib_per_gpu": 20000, "cold_start_s": 5},
                                   "base": {"model": "b", "memory_mib_per_gpu": 20000, "cold_start_s": 5,
                                            "set_point": [{"host": "a", "gpus": [0]}]}}})
L0, L1 = LATER.hosts[0].gpus[0].uuid, LATER.hosts[0].gpus[1].uuid


@pytest.mark.parametrize("time_scale", [1.0, 0.01])
def test_a_restore_planned_later_is_not_started_now(r, keys, settings, time_scale):
    """a1 runs a NORMAL job for 100 s more; a NORMAL ``big`` job (TP 2) is planned on
    a0+a1 after it, so the restore of a0's set point falls after that job, minutes from
    now. a0 is free, but the restore must not start now (it would delay the big job)."""
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0, time_scale=time_scale)
    sent = []
    w = PlannerWorker(r, s, LATER, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = ""
    prod = Producer(r, keys, LATER, s)
    jid = prod.submit({"endpoint": "small", "service_s": 1000, "priority": "NORMAL"}).id
    assert LeaseStore(r, keys).acquire(uuid.uuid4().hex, (L1,), 60.0, job_id=jid, kind="job", holder="a",
                                       queue=keys.queue("NORMAL"),
                                       info={"planned_end_s": repr(w.now_s() + 100.0), "endpoint": "small",
                                             "priority": "NORMAL"})
    big = prod.submit({"endpoint": "big", "service_s": 50, "priority": "NORMAL"}).id
    w.tick()
    assert sent == [], [(c.kind, c.gpus) for c in sent]
    assert r.get(keys.gpu(L0)) is None and r.hget(keys.job(big), "state") == "queued"


def test_an_idle_restore_waits_for_a_delayed_job_due_before_it_would_end(r, keys, settings):
    """Nothing queued or running, but a job waits out a retry backoff (or a delay_s) that
    ends before the set point's restore would: the restore waited for nothing and started
    (a 3 s wake in a 1 s backoff), and the retry was leased only after it (a driver author's
    report). The idle tick leaves the set point off until that job is queued; a delayed job
    due after the restore would end does not hold it."""
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0, time_scale=1.0)
    fleet = parse_fleet({**FLEET.model_dump(), "endpoints": {
        **{name: spec.model_dump() for name, spec in FLEET.endpoints.items()},
        "small": {"model": "s", "memory_mib_per_gpu": 1000, "cold_start_s": 1}}})  # fits host a, unlike `other`
    sent = []
    w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = ""
    prod = Producer(r, keys, fleet, s)
    # `other` fits host b only: a restore on host a does not delay it
    prod.submit({"endpoint": "other", "service_s": 1, "priority": "NORMAL", "delay_s": 1.0})
    soon = prod.submit({"endpoint": "small", "service_s": 1, "priority": "NORMAL", "delay_s": 1.0})  # base: 2 s load
    w.tick()
    assert [c for c in sent if c.kind == "restore"] == [] and r.get(keys.gpu(G0)) is None
    assert prod.cancel(soon.id) == "cancelled"
    prod.submit({"endpoint": "small", "service_s": 1, "priority": "NORMAL", "delay_s": 600.0})  # due long after
    # a job of the set point's own endpoint due soon is helped by the restore, not delayed (a verifier's
    # report: the first version held every restore for any delayed job of the fleet)
    prod.submit({"endpoint": "base", "service_s": 1, "priority": "NORMAL", "delay_s": 1.0})
    w.tick()
    w.tick()
    assert [(c.endpoint, c.gpus) for c in sent if c.kind == "restore"] == [("base", [G0])]
