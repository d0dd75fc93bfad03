"""Preemption regression cases against the planner worker (in-process, real Redis,
dispatch stubbed): a CRITICAL job that cannot start even by preempting must not evict
anything, and a HIGH job that fits on free GPUs runs without preempting."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest

from makespan.errors import ValidationError
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.workers.leases import LeaseStore
from makespan.workers.planner_worker import PlannerWorker

FLEET = load_fleet(Path("examples/render-pipeline.toml"))


def _running(r, keys, w, prod, endpoint, priority, gpus):
    """A job of ``priority`` holding ``gpus`` (a lease ending far in the future)."""
    jid = prod.submit({"endpoint": endpoint, "service_s": 1000, "priority": priority}).id
    lease = LeaseStore(r, keys).acquire(uuid.uuid4().hex, tuple(gpus), 60.0, job_id=jid, kind="job",
                                        holder=FLEET.host_of(gpus[0]), queue=keys.queue(priority),
                                        info={"planned_end_s": repr(w.now_s() + 1e6), "endpoint": endpoint,
                                              "priority": priority})
    assert lease is not None
    return jid


def _setup(r, keys, settings):
    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    sent = []
    w = PlannerWorker(r, s, FLEET, dispatch=lambda ctx, q: sent.append(ctx))
    return w, Producer(r, keys, FLEET, s), sent


def _preempted(r, keys):
    return [json.loads(f["e"]) for _i, f in r.xrange(keys.events) if json.loads(f["e"])["kind"] == "preempted"]


def test_critical_that_can_never_fit_and_a_high_job_needing_4_gpus(r, keys, settings):
    """The CRITICAL job that no host can run is refused at submit, so it never waits in a
    queue; the HIGH 4-GPU job starts on the free host; the LOW jobs keep their GPUs."""
    w, prod, sent = _setup(r, keys, settings)
    lows = [_running(r, keys, w, prod, "chat", "LOW", [f"GPU-host-b-{i}"]) for i in (0, 3)]
    with pytest.raises(ValidationError) as ei:
        prod.submit({"endpoint": "judge-16-gpus", "service_s": 10, "priority": "CRITICAL"})
    assert ei.value.field == "job.endpoint"
    high = prod.submit({"endpoint": "judge", "service_s": 10, "priority": "HIGH"}).id  # tensor_parallel 4
    for _ in range(3):
        w.tick()
    assert _preempted(r, keys) == []
    assert [c.job_id for c in sent] == [high] and sent[0].gpus == [f"GPU-host-a-{i}" for i in range(4)]
    assert [r.hget(keys.job(j), "state") for j in lows] == ["leased", "leased"]


def test_critical_that_cannot_start_even_by_preempting_evicts_nothing(r, keys, settings):
    w, prod, sent = _setup(r, keys, settings)
    # host-a: a CRITICAL 4-GPU job (not preemptible); host-b: CRITICAL on b-0, LOW on b-1
    _running(r, keys, w, prod, "judge", "CRITICAL", [f"GPU-host-a-{i}" for i in range(4)])
    _running(r, keys, w, prod, "chat", "CRITICAL", ["GPU-host-b-0"])
    low = _running(r, keys, w, prod, "chat", "LOW", ["GPU-host-b-1"])
    # needs 4 GPUs of one host: both hosts hold a CRITICAL job, so preempting LOW cannot start it
    crit = prod.submit({"endpoint": "judge", "service_s": 10, "priority": "CRITICAL"}).id
    high = prod.submit({"endpoint": "summarizer", "service_s": 10, "priority": "HIGH"}).id  # fits b-2, b-3
    for _ in range(3):
        w.tick()
    assert _preempted(r, keys) == []
    assert [c.job_id for c in sent] == [high]
    assert r.hget(keys.job(crit), "state") == "queued"
    assert r.hget(keys.job(low), "state") == "leased"  # the LOW job keeps its GPU


def test_critical_preempts_once_when_every_gpu_is_held_by_low_jobs(r, keys, settings):
    """The control: the same planner does preempt when it helps (so the case above can fail)."""
    w, prod, sent = _setup(r, keys, settings)
    for h in ("a", "b"):
        for i in range(4):
            _running(r, keys, w, prod, "chat", "LOW", [f"GPU-host-{h}-{i}"])
    crit = prod.submit({"endpoint": "chat", "service_s": 10, "priority": "CRITICAL"}).id
    for _ in range(3):
        w.tick()
    assert len(_preempted(r, keys)) == 1  # one victim, no preempt/re-admit loop
    assert r.hget(keys.job(crit), "state") == "leased"
    assert [c.job_id for c in sent] == [crit]


def _held_until(r, keys, w, prod, priority, gpu, end_in_s, service_s):
    """A ``chat`` job of ``priority`` holding ``gpu``, leased now, planned to end in ``end_in_s``."""
    jid = prod.submit({"endpoint": "chat", "service_s": service_s, "priority": priority}).id
    lease = LeaseStore(r, keys).acquire(uuid.uuid4().hex, (gpu,), 60.0, job_id=jid, kind="job",
                                        holder=FLEET.host_of(gpu), queue=keys.queue(priority),
                                        info={"planned_end_s": repr(w.now_s() + end_in_s), "endpoint": "chat",
                                              "priority": priority})
    assert lease is not None
    return jid


@pytest.mark.parametrize("mode", ["plan", "rule", "plan+lane"])
def test_scored_preemption_waits_when_the_victims_loss_is_larger(r, keys, settings, mode):
    """Every GPU runs a LOW job that ends in 1000 s but would restart a 30000 s service if
    cut: the scored decision (MAKESPAN_PREEMPTION=plan, the default) alone lets the CRITICAL
    job wait (8 × 1000 w·s < 30000 w·s; here without the lane's start bound); the fixed rule
    preempts (1000 s > the 60 s cold start), and so does the default fast lane, whose start
    bound takes the rule's preemption for a CRITICAL job (planner/fast_lane.py, "Preemption")."""
    lane = {} if mode == "plan+lane" else {"fast_lane_start": ""}
    w, prod, sent = _setup(r, keys, dataclasses.replace(settings, preemption=mode.removesuffix("+lane"), **lane))
    lows = [_held_until(r, keys, w, prod, "LOW", f"GPU-host-{h}-{i}", 1000.0, 30000.0)
            for h in ("a", "b") for i in range(4)]
    crit = prod.submit({"endpoint": "chat", "service_s": 10, "priority": "CRITICAL"}).id
    w.tick()
    if mode == "plan":
        assert _preempted(r, keys) == [] and sent == []
        assert r.hget(keys.job(crit), "state") == "queued"
        assert all(r.hget(keys.job(j), "state") == "leased" for j in lows)
    else:
        assert len(_preempted(r, keys)) == 1 and [c.job_id for c in sent] == [crit]


def test_scored_preemption_spares_a_job_that_only_has_to_clear(r, keys, settings):
    """A LOW lease whose execute phase is done is never a victim of the scored decision."""
    w, prod, sent = _setup(r, keys, settings)
    for h in ("a", "b"):
        for i in range(4):
            _running(r, keys, w, prod, "chat", "LOW", [f"GPU-host-{h}-{i}"])
    for lid in {v.split(":")[0] for v in LeaseStore(r, keys).gpu_holders([g.uuid for g in w.env.gpus]).values() if v}:
        r.hset(keys.phase(lid), "execute", "done")
    crit = prod.submit({"endpoint": "chat", "service_s": 10, "priority": "CRITICAL"}).id
    w.tick()
    assert _preempted(r, keys) == [] and r.hget(keys.job(crit), "state") == "queued"


@pytest.mark.parametrize("mode", ["plan", "rule"])
def test_a_job_a_queued_step_waits_on_is_never_the_victim(r, keys, settings, mode):
    """Every GPU runs a LOW job; seven of them are dependencies of queued steps (their
    dependents wait outside the batch, so no score sees their delay): the CRITICAL job
    preempts the eighth, under either decider."""
    w, prod, sent = _setup(r, keys, dataclasses.replace(settings, preemption=mode))
    lows = [_running(r, keys, w, prod, "chat", "LOW", [f"GPU-host-{h}-{i}"]) for h in ("a", "b") for i in range(4)]
    free = lows[5]
    steps = [prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW", "depends_on": [j]}).id
             for j in lows if j != free]
    crit = prod.submit({"endpoint": "chat", "service_s": 10, "priority": "CRITICAL"}).id
    w.tick()
    assert [e["job"] for e in _preempted(r, keys)] == [free]
    assert [c.job_id for c in sent] == [crit]
    assert all(r.hget(keys.job(j), "state") == "leased" for j in lows if j != free)
    assert all(r.hget(keys.job(j), "state") == "queued" for j in steps)
