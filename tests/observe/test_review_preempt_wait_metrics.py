"""makespan_jobs_preempted_total ("Jobs preempted and requeued") and
makespan_job_wait_seconds ("Start minus submission") across preemptions, on real Redis
with the real lease, preempt and critical-lane code (dispatch captured). Found by a
review, 2026-12-05; each test fails on the code before its fix:

- the critical lane's preemptions were not counted at all (only the tick's were), and a
  victim whose cancel was requested (``preempt`` cancels it: not requeued) was counted;
- a job's wait was observed again at every lease: a preempted job re-leased later added
  a second "wait" of (second lease − submission), its first run included.
"""
from __future__ import annotations

import dataclasses

from makespan import metrics
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.workers.critical_lane import CriticalLane
from makespan.workers.leases import preempt
from makespan.workers.planner_worker import PlannerWorker
from tests.conftest import FLEET_TOML

FLEET = load_fleet(FLEET_TOML)  # render-pipeline: 8 GPUs on host-a and host-b
ALL_GPUS = [gpu.uuid for host in FLEET.hosts for gpu in host.gpus]


def _worker(r, settings):
    sent: list = []
    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    w = PlannerWorker(r, s, FLEET, dispatch=lambda ctx, queue: sent.append(ctx))
    w.token = ""
    return w, Producer(r, w.keys, FLEET, s), sent


def _hold_every_gpu(r, w, prod) -> dict[str, str]:
    """Lease every GPU pair to a LOW job (running long): lease id -> job id."""
    held = {}
    for n in range(0, 8, 2):
        jid = prod.submit({"endpoint": "renderer", "service_s": 3600, "priority": "LOW"}).id
        lease = w.leases.acquire(f"low-{n}", tuple(ALL_GPUS[n:n + 2]), 60.0, job_id=jid, kind="job",
                                 holder="host-a", queue=w.keys.queue("LOW"),
                                 info={"planned_end_s": repr(w.now_s() + 3600), "endpoint": "renderer",
                                       "priority": "LOW"})
        assert lease is not None
        held[f"low-{n}"] = jid
    return held


def _preempted(prio: str) -> float:
    return metrics._m().preempted.labels(prio)._value.get()


def _wait_count(prio: str) -> float:
    return next(s.value for s in metrics._m().wait.collect()[0].samples
                if s.name.endswith("_count") and s.labels["priority"] == prio)


def test_a_critical_lane_preemption_is_counted(r, settings, monkeypatch):
    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    w, prod, sent = _worker(r, settings)
    _hold_every_gpu(r, w, prod)
    job = prod.submit({"endpoint": "summarizer", "service_s": 5, "priority": "CRITICAL"}).id
    out = CriticalLane(w.env, w.kept, w.token, w.ticking.is_set).place(r.lpop(w.keys.planner_critical))
    assert out.outcome == "preempted" and len(out.victims) == 1 and [c.job_id for c in sent] == [job]
    assert _preempted("LOW") == 1.0


def test_a_victim_cancelled_by_its_preemption_is_not_counted_preempted(r, settings, monkeypatch):
    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    w, prod, _sent = _worker(r, settings)
    held = _hold_every_gpu(r, w, prod)
    lease_id, victim = next(iter(held.items()))
    assert prod.cancel(victim) == "cancel_requested"
    by = prod.submit({"endpoint": "summarizer", "service_s": 5, "priority": "HIGH"}).id
    assert preempt(r, w.keys, lease_id, by) == "cancelled"
    assert r.hget(w.keys.job(victim), "state") == "cancelled"
    assert _preempted("LOW") == 0.0  # cancelled, not requeued
    other_lease, other = list(held.items())[1]
    assert preempt(r, w.keys, other_lease, by) == "preempted"
    assert r.hget(w.keys.job(other), "state") == "queued"
    assert _preempted("LOW") == 1.0


def test_a_preempted_job_leased_again_has_one_wait(r, settings, monkeypatch):
    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    w, prod, sent = _worker(r, settings)
    r.set(w.keys.planner_leader, w.name)
    low = prod.submit({"endpoint": "embed", "service_s": 3600, "priority": "LOW"}).id
    w.tick()
    jobs = lambda: [c for c in sent if c.kind == "job"]  # noqa: E731 (a tick may send restores too)
    assert [c.job_id for c in jobs()] == [low]
    assert _wait_count("LOW") == 1.0
    first = jobs()[0]
    # preempted (requeued, its GPUs free): the next tick leases it again
    by = prod.submit({"endpoint": "embed", "service_s": 1, "priority": "HIGH"}).id
    assert preempt(r, w.keys, first.lease_id, by) == "preempted"
    # queued again, it shows no time of the lease it lost (its status read as leased/started)
    requeued = prod.status(low)
    assert requeued["state"] == "queued" and requeued.get("leased_at") is None and requeued.get("started_at") is None
    assert "leased_before" not in requeued
    assert prod.cancel(by) == "cancelled"
    w.tick()
    assert [c.job_id for c in jobs()] == [low, low] and jobs()[1].lease_id != first.lease_id
    assert r.hget(w.keys.job(low), "state") == "leased"
    assert _wait_count("LOW") == 1.0, "one job, one wait (from submission to its first start)"


def _wait_sum(prio: str) -> float:
    return next(s.value for s in metrics._m().wait.collect()[0].samples
                if s.name.endswith("_sum") and s.labels["priority"] == prio)


def test_a_delayed_job_waits_from_its_due_time(r, settings, monkeypatch):
    """A job submitted with ``delay_s`` observed its delay as wait (a 600 s delay landed in the
    ≤ 300 s+ buckets of the wait panel): its wait counts from its due time (an observability
    review, 2026-12-07; fails on the code before)."""
    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    w, prod, sent = _worker(r, settings)
    r.set(w.keys.planner_leader, w.name)
    job = prod.submit({"endpoint": "embed", "service_s": 1, "priority": "NORMAL"}).id
    seconds, micros = r.time()
    now = seconds + micros / 1e6
    # as a job submitted 600 s ago with delay_s = 598 leaves its record once promoted
    r.hset(w.keys.job(job), mapping={"submitted_at": repr(now - 600.0), "not_before": repr(now - 2.0)})
    w.tick()
    assert [c.job_id for c in sent if c.kind == "job"] == [job]
    assert _wait_count("NORMAL") == 1.0
    assert 1.0 <= _wait_sum("NORMAL") < 60.0, _wait_sum("NORMAL")


def test_a_preemptors_first_lease_outlives_the_victims_wind_down(r, settings, monkeypatch):
    """A CRITICAL job leased by the critical lane after preempting LOW jobs whose functions
    ignore ctx.cancelled waited for a GPU worker slot while the victims wound down (up to
    cancel_grace_s, 10 s, the lease TTL): its lease expired before its first phase, was
    reclaimed and counted an attempt (a verifier, 2026-12-07). Its first TTL is now
    lease_ttl_s + cancel_grace_s; a lease on free GPUs keeps lease_ttl_s."""
    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    w, prod, sent = _worker(r, settings)
    _hold_every_gpu(r, w, prod)
    job = prod.submit({"endpoint": "summarizer", "service_s": 5, "priority": "CRITICAL"}).id
    out = CriticalLane(w.env, w.kept, w.token, w.ticking.is_set).place(r.lpop(w.keys.planner_critical))
    assert out.outcome == "preempted" and [c.job_id for c in sent] == [job]
    granted_ms, expires_ms = r.hmget(w.keys.lease(sent[0].lease_id), "granted_ms", "expires_ms")
    ttl_ms = int(expires_ms) - int(granted_ms)
    grace_ms = 1000 * w.env.settings.cancel_grace_s
    assert 1000 * w.env.settings.lease_ttl_s < ttl_ms <= 1000 * w.env.settings.lease_ttl_s + grace_ms, ttl_ms


def test_any_lease_on_a_host_whose_victims_wind_down_gets_the_longer_first_ttl(r, settings):
    """The longer first TTL covered only a start in the same call as its preemption; a
    preemptor started at the next tick (its lease refused at first), or another job placed
    on that host meanwhile, waited for the same worker slots with the plain TTL (a verifier,
    2026-12-07). It now follows the host's last preemption, in every path."""
    from makespan.planner.model import PlanJob
    from makespan.workers.starts import _lease_request, note_preemption
    from makespan.workers.tick.context import TickContext

    w, _prod, _sent = _worker(r, settings)
    ctx = TickContext(w.env, w.kept, w.token)
    host_a = [g.uuid for g in FLEET.hosts[0].gpus]
    host_b = [g.uuid for g in FLEET.hosts[1].gpus]
    job = PlanJob("j1", "embed", 2.0, 0.0, 1.0, 2)
    plain_s, grace_s = w.env.settings.lease_ttl_s, w.env.settings.cancel_grace_s
    assert _lease_request(ctx, job, (host_a[3],), 10.0, "warm")["ttl_s"] == plain_s
    note_preemption(ctx, host_a[:2])  # victims on host-a's first two GPUs
    assert _lease_request(ctx, job, (host_a[3],), 10.0, "warm")["ttl_s"] == plain_s + grace_s  # same host
    assert _lease_request(ctx, job, (host_b[0],), 10.0, "warm")["ttl_s"] == plain_s  # another host's slots
    w.kept.preempted_at[FLEET.hosts[0].name] -= grace_s + 1  # the wind-down is over
    assert _lease_request(ctx, job, (host_a[3],), 10.0, "warm")["ttl_s"] == plain_s
