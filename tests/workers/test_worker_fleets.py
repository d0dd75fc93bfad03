"""A rolling change of the fleet file: the planner leases a job only on hosts whose live GPU
worker's fleet file can run it (makespan.workers.worker_fleets). Before, a job of an endpoint
the planner's new file added was leased on a worker still running the old file and failed
there for good (``this GPU worker's fleet ... has no endpoint``), and a CRITICAL one could
preempt running work for it. In-process planner ticks and the critical lane on a real
Redis (the real GPU worker's announcement: tests/faults/test_dead_host.py)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.models import fleet_version, parse_fleet
from makespan.producer import Producer
from makespan.workers.critical_lane import CriticalLane
from makespan.workers.host_liveness import announce
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick.clock import ManualClock
from makespan.workers.worker_fleets import read_worker_fleets


def _fleet(with_new: bool, new_tp: int = 1):
    """Hosts h1 and h2 (2 GPUs each), endpoint ``old``; with ``with_new`` also ``new``."""
    endpoints = {"old": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}
    if with_new:
        endpoints["new"] = {"model": "n", "memory_mib_per_gpu": 10000, "cold_start_s": 1, "tensor_parallel": new_tp}
    return parse_fleet({"name": "rolling", "hosts": [{"name": h, "gpu_count": 2, "memory_mib": 81920}
                                                     for h in ("h1", "h2")], "endpoints": endpoints})


NEW, OLD = _fleet(True), _fleet(False)


@pytest.fixture
def env(monkeypatch, settings):
    monkeypatch.setenv("MAKESPAN_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", settings.key_prefix)


def _planner(r, settings, **changes):
    s = dataclasses.replace(settings, lease_ttl_s=60.0, **changes)
    sent: list = []
    w = PlannerWorker(r, s, NEW, dispatch=lambda ctx, q: sent.append(ctx), clock=ManualClock(time.time()))
    w.token = ""
    return w, Producer(r, w.keys, NEW, s), sent


def test_the_versions_published_with_liveness_name_the_hosts_that_cannot_run_an_endpoint(r, settings):
    w, _prod, _sent = _planner(r, settings)
    announce(r, w.keys, "h1", "worker-h1", 60.0, OLD)
    announce(r, w.keys, "h2", "worker-h2", 60.0, NEW)
    assert r.get(w.keys.host_fleet("h1")) == fleet_version(OLD)
    assert r.pttl(w.keys.host_fleet("h1")) > 0  # expires with the liveness mark
    fleets = read_worker_fleets(r, w.keys, NEW)
    assert fleets.hosts_lacking(NEW, "new") == ("h1",)
    assert fleets.hosts_lacking(NEW, "old") == ()
    assert fleets.hosts_lacking(NEW, "old", ["new"]) == ("h1",)  # a helper it lacks
    # another tensor_parallel for the endpoint counts as lacking it
    announce(r, w.keys, "h2", "worker-h2", 60.0, _fleet(True, new_tp=2))
    assert read_worker_fleets(r, w.keys, NEW).hosts_lacking(NEW, "new") == ("h1", "h2")


def test_a_job_of_a_new_endpoint_runs_only_where_the_worker_has_it_and_waits_while_none_does(r, settings, env):
    w, prod, sent = _planner(r, settings)
    announce(r, w.keys, "h1", "worker-h1", 60.0, OLD)  # not restarted yet
    announce(r, w.keys, "h2", "worker-h2", 60.0, OLD)
    job = prod.submit({"endpoint": "new", "service_s": 5, "priority": "NORMAL"}).id
    plain = prod.submit({"endpoint": "old", "service_s": 5, "priority": "NORMAL"}).id
    w.tick()
    assert [ctx.job_id for ctx in sent] == [plain]  # the other endpoint's jobs go on
    assert r.hget(w.keys.job(job), "state") == "queued"
    res = CliRunner().invoke(cli_app, ["why", job])
    assert res.exit_code == 0 and "host_fleet_differs, no ETA" in res.output, res.output
    assert f"h1 (fleet version {fleet_version(OLD)}; no 'new')" in res.output and "h2" in res.output, res.output
    assert f"than the planner's (version {fleet_version(NEW)})" in res.output, res.output  # which side is older
    announce(r, w.keys, "h2", "worker-h2-new", 60.0, NEW)  # h2's worker restarts with the new file
    w.clock.advance(2.0)  # past the reason refresh
    w.tick()
    assert [(ctx.job_id, ctx.host) for ctx in sent if ctx.job_id == job] == [(job, "h2")]


def test_a_gpu_swap_waits_for_the_hosts_worker_to_run_the_new_file(r, settings, env):
    """h2's GPUs got new UUIDs in the planner's file while h2's worker still ran the old one
    (the planner restarted first, as docs/operations.md allows): every job leased there
    failed at its first phase, 31 in 40 s, without retry (fleet-change operator helper). The
    jobs wait on h2 (host_fleet_differs, naming the GPUs) and run on h1; once h2's worker
    runs the new file they run there too."""
    raw = NEW.model_dump()
    raw["hosts"][1]["gpus"] = [{"index": n, "uuid": f"GPU-swapped-{n}", "memory_mib": 81920} for n in range(2)]
    raw["hosts"][1].pop("gpu_count", None)
    swapped = parse_fleet(raw)
    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    sent: list = []
    w = PlannerWorker(r, s, swapped, dispatch=lambda ctx, q: sent.append(ctx), clock=ManualClock(time.time()))
    w.token = ""
    prod = Producer(r, w.keys, swapped, s)
    announce(r, w.keys, "h1", "worker-h1", 60.0, swapped)  # restarted with the new file
    announce(r, w.keys, "h2", "worker-h2", 60.0, NEW)  # not yet: the old UUIDs
    fleets = read_worker_fleets(r, w.keys, swapped)
    assert fleets.hosts_lacking(swapped, "old") == ("h2",) and "other GPUs" in fleets.detail(["h2"])
    jobs = [prod.submit({"endpoint": "old", "service_s": 5, "priority": "NORMAL"}).id for _ in range(4)]
    w.tick()
    assert {ctx.host for ctx in sent} == {"h1"} and len(sent) == 2  # h1's two GPUs; none leased on h2
    for job in jobs:
        if job not in {ctx.job_id for ctx in sent}:
            assert r.hget(w.keys.job(job), "state") == "queued"
    r.set(w.keys.fleet, swapped.model_dump_json())
    res = CliRunner().invoke(cli_app, ["hosts", "--json"])  # the idle host says why it gets nothing (a verifier)
    reasons = {row["host"]: row["reason"] for row in map(json.loads, res.stdout.splitlines())}
    assert "lacks GPUs the planner's gives this host" in reasons["h2"] and "lacks" not in reasons["h1"], reasons
    announce(r, w.keys, "h1", "worker-h1", 60.0, NEW)  # another file, but the same endpoints and h1's GPUs
    res = CliRunner().invoke(cli_app, ["hosts", "--json"])
    reasons = {row["host"]: row["reason"] for row in map(json.loads, res.stdout.splitlines())}
    assert "fleet file" not in reasons["h1"] and "lacks GPUs" in reasons["h2"], reasons  # nothing of h1 (a verifier)
    announce(r, w.keys, "h1", "worker-h1", 60.0, swapped)
    announce(r, w.keys, "h2", "worker-h2-new", 60.0, swapped)
    w.clock.advance(2.0)
    w.tick()
    assert [ctx.host for ctx in sent[2:]] == ["h2", "h2"]
    assert {ctx.gpus[0] for ctx in sent[2:]} <= {"GPU-swapped-0", "GPU-swapped-1"}
    # the same GPUs in another order, or one more, in the worker's file: not gated (a verifier)
    for gpus in (list(reversed(raw["hosts"][1]["gpus"])),
                 [*raw["hosts"][1]["gpus"], {"index": 2, "uuid": "GPU-extra", "memory_mib": 81920}]):
        other = dict(raw, hosts=[raw["hosts"][0], dict(raw["hosts"][1], gpus=gpus)])
        announce(r, w.keys, "h2", "worker-h2-other", 60.0, parse_fleet(other))
        assert read_worker_fleets(r, w.keys, swapped).hosts_lacking(swapped, "old") == ()


@pytest.mark.parametrize("mode", ["rule", "plan"])
def test_no_preemption_for_a_job_no_live_worker_can_run(r, settings, env, mode):
    """A HIGH job of ``new`` while LOW work holds every GPU and no worker has ``new``: before,
    a LOW job was preempted and the HIGH job then failed on the worker. Nothing is preempted;
    once h2's worker has the file, the preemption is on h2."""
    w, prod, sent = _planner(r, settings, preemption=mode, critical_lane=False, policy="portfolio")
    for host in ("h1", "h2"):
        announce(r, w.keys, host, f"worker-{host}", 60.0, OLD)
    for n, gpu in enumerate(("GPU-h1-0", "GPU-h1-1", "GPU-h2-0", "GPU-h2-1")):
        low = prod.submit({"endpoint": "old", "service_s": 3600, "priority": "LOW"}).id
        assert w.leases.acquire(f"low-{n}", (gpu,), 60.0, job_id=low, kind="job", holder=w.fleet.host_of(gpu),
                                queue=w.keys.queue("LOW"),
                                info={"planned_end_s": repr(w.now_s() + 3600), "endpoint": "old",
                                      "priority": "LOW"}) is not None
    job = prod.submit({"endpoint": "new", "service_s": 5, "priority": "HIGH"}).id
    w.tick()
    assert sent == [] and r.zcard(w.keys.leases) == 4  # nothing preempted
    announce(r, w.keys, "h2", "worker-h2-new", 60.0, NEW)
    w.clock.advance(2.0)
    w.tick()
    assert [(ctx.job_id, ctx.host) for ctx in sent] == [(job, "h2")]


def test_the_critical_lane_skips_hosts_whose_worker_cannot_run_the_job(r, settings):
    w, prod, sent = _planner(r, settings)
    lane = CriticalLane(w.env, w.kept, w.token, w.ticking.is_set)
    for host in ("h1", "h2"):
        announce(r, w.keys, host, f"worker-{host}", 60.0, OLD)
    job = prod.submit({"endpoint": "new", "service_s": 5, "priority": "CRITICAL"}).id
    assert lane.place(r.lpop(w.keys.planner_critical)).outcome == "no_worker_fleet" and not sent
    assert r.hget(w.keys.job(job), "state") == "queued"
    announce(r, w.keys, "h2", "worker-h2-new", 60.0, NEW)
    r.rpush(w.keys.planner_critical, job)
    out = lane.place(r.lpop(w.keys.planner_critical))
    assert out.leased and [(ctx.job_id, ctx.host) for ctx in sent] == [(job, "h2")]



def test_no_set_point_restore_on_a_host_whose_worker_lacks_the_endpoint(r, settings):
    """The new file gives ``new`` a set point on h1: the idle fleet's restore there would fail
    on h1's old worker (and be retried after its backoff, failing again); it waits for it."""
    raw = NEW.model_dump()
    raw["endpoints"]["new"]["set_point"] = [{"host": "h1", "gpus": [0]}]
    fleet = parse_fleet(raw)
    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    sent: list = []
    w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: sent.append(ctx), clock=ManualClock(time.time()))
    w.token = ""
    announce(r, w.keys, "h1", "worker-h1", 60.0, OLD)
    w.tick()
    assert sent == [] and not r.exists(w.keys.gpu("GPU-h1-0"))
    # the idle fleet's drain check runs meanwhile and counts the set point (it waited for it:
    # blind for the whole rolling change, found by a verifier)
    drain = r.hgetall(w.keys.drain)
    assert drain.get("set_points_failed") == "1" and drain.get("checks") == "1", drain
    announce(r, w.keys, "h1", "worker-h1-new", 60.0, fleet)
    w.clock.advance(1.0)
    w.tick()
    assert [(ctx.kind, ctx.endpoint, ctx.gpus) for ctx in sent] == [("restore", "new", ["GPU-h1-0"])]


def test_a_submit_no_live_workers_file_can_run_warns(r, settings, env):
    """``makespan submit`` of an endpoint no live worker's file has returned silently; only
    ``makespan why`` said host_fleet_differs (verifier)."""
    w, _prod, _sent = _planner(r, settings)
    r.set(w.keys.fleet, NEW.model_dump_json())
    r.set(w.keys.fleet_version, fleet_version(NEW))
    for host in ("h1", "h2"):
        announce(r, w.keys, host, f"worker-{host}", 60.0, OLD)
    res = CliRunner().invoke(cli_app, ["submit", "--endpoint", "new", "--service-s", "5"])
    assert res.exit_code == 0, res.output
    assert "reason host_fleet_differs" in res.output and f"h1 (fleet version {fleet_version(OLD)}; no 'new')" in res.output
    res = CliRunner().invoke(cli_app, ["submit", "--endpoint", "old", "--service-s", "5"])
    assert res.exit_code == 0 and "host_fleet_differs" not in res.output, res.output
