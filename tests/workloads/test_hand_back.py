"""A GPU worker that shuts down hands its job leases back at once (PhaseRunner.hand_back):
a job whose execute has not started is requeued by the reclaim's script under the lease's
fencing token, counting no attempt (as a preemption counts none: rolling restarts must not
use up a job's attempts), and the planner is woken; a token
that is no longer current writes nothing. Before, such a job waited for its lease to
expire and the planner's reclaim.

In-process phases on a real Redis (as tests/workloads/test_failure_paths.py); the
shutdown is :data:`makespan.shutdown.SHUTTING_DOWN`, set here and cleared after each test.
"""

from __future__ import annotations

import threading

import pytest
import redis

import makespan
from makespan import metrics, shutdown
from makespan.client import Client
from makespan.keys import WAKE_RELEASE
from makespan.models import fleet_version, load_fleet
from makespan.registry import publish
from makespan.workers.leases import Lease, LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner, instance_value
from makespan.workers.warm import run_phases, run_warm
from tests.conftest import FLEET_TOML
from tests.live import all_events

GPU = "GPU-host-a-3"
RAN: list[str] = []
LOOPING = threading.Event()  # set once loops_until_cancelled runs


@makespan.workload(endpoint="embed", name="tests.hand_back_marks")
def marks_that_it_ran(ctx):
    RAN.append(ctx.job_id)
    return "ran"


@makespan.workload(endpoint="embed", name="tests.hand_back_loops")
def loops_until_cancelled(ctx):
    LOOPING.set()
    ctx.cancelled.wait(60)
    return {"cancel_reason": ctx.cancel_reason}


def _setup(r, keys, settings, *definitions):
    fleet = load_fleet(FLEET_TOML)
    r.set(keys.fleet, fleet.model_dump_json())
    r.set(keys.fleet_version, fleet_version(fleet))
    publish(r, keys, definitions, holder="test")
    return fleet, Client(r, settings)


def _lease(r, keys, settings, fleet, job_id, warm=False):
    """Lease GPU for the queued ``job_id`` (``warm``: its ``embed`` instance resident, the
    warm path; else nothing resident: the phase-by-phase path)."""
    if warm:
        r.set(keys.resident(GPU), instance_value("embed", [GPU]))
    priority = r.hget(keys.job(job_id), "priority")
    lease = LeaseStore(r, keys).acquire("L1", (GPU,), settings.lease_ttl_s, job_id=job_id, kind="job",
                                        holder="host-a", queue=keys.queue(priority))
    assert lease is not None
    ctx = PhaseContext("L1", lease.token, [GPU], "host-a", "job", "embed", job_id, priority,
                       float(r.hget(keys.job(job_id), "service_s")))
    return ctx, PhaseRunner(r, settings, fleet)


@pytest.fixture
def shutting_down():
    assert not shutdown.SHUTTING_DOWN.is_set()
    shutdown.SHUTTING_DOWN.set()
    try:
        yield
    finally:
        shutdown.SHUTTING_DOWN.clear()


def _snapshot(redis_url: str, prefix: str) -> dict[str, bytes | None]:
    """Every key of ``prefix``, DUMPed (a bytes client: the replies are binary)."""
    binary = redis.Redis.from_url(redis_url)
    try:
        return {key.decode(): binary.dump(key) for key in binary.scan_iter(f"{prefix}:*", count=1000)}
    finally:
        binary.close()


def test_a_job_whose_execute_has_not_started_is_handed_back_at_shutdown(r, keys, settings, shutting_down):
    fleet, client = _setup(r, keys, settings, marks_that_it_ran)
    job = client.submit("tests.hand_back_marks")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    wake = keys.for_pool(fleet.pool_of_host("host-a")).planner_wake
    r.delete(wake)

    assert run_phases(runner, ctx) == "handed_back"

    assert job.id not in RAN  # its workload never started
    record = r.hgetall(keys.job(job.id))
    assert record["state"] == "queued" and record["attempts"] == "0"  # a phase ran, but a hand-back is no attempt
    assert r.zscore(keys.queue(ctx.priority), job.id) is not None
    assert not r.exists(keys.lease(ctx.lease_id)) and not r.exists(keys.gpu(GPU)) and not r.exists(keys.phase(ctx.lease_id))
    assert r.lindex(wake, 0) == WAKE_RELEASE  # the planner plans it now, not at its next tick's reclaim
    reclaimed = [e for e in all_events(r, keys) if e["kind"] == "reclaimed"]
    assert [(e["job"], e["outcome"], e["cause"], e["attempt_counted"]) for e in reclaimed] == \
        [(job.id, "requeued", "worker_shutdown", False)]


def test_a_hand_back_is_counted_in_the_reclaimed_leases_metric(r, keys, settings, shutting_down, monkeypatch):
    """makespan_leases_reclaimed_total counted only the planner's reclaims of expired leases:
    a hand-back (the same reclaim script, at a GPU worker's shutdown) went uncounted. Now
    each is counted with ``cause`` ``worker_shutdown``; an expiry's is ``lease_expired``."""
    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    fleet, client = _setup(r, keys, settings, marks_that_it_ran)
    job = client.submit("tests.hand_back_marks")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    assert run_phases(runner, ctx) == "handed_back"
    counted = {cause: metrics._m().reclaimed.labels(cause)._value.get() for cause in metrics.RECLAIM_CAUSES}
    assert counted == {"lease_expired": 0.0, "worker_shutdown": 1.0}
    assert runner.hand_back(ctx) == "stale"  # a stale token handed nothing back: not counted
    assert metrics._m().reclaimed.labels("worker_shutdown")._value.get() == 1.0


def test_rolling_restarts_do_not_use_up_a_jobs_attempts(r, keys, settings, shutting_down):
    """More hand-backs than MAKESPAN_MAX_ATTEMPTS (a GPU worker restarted that often while the
    job was leased) leave the job queued with its attempts untouched: the hand-back counted
    one attempt each at first, as a reclaim does, and failed the job at the third."""
    fleet, client = _setup(r, keys, settings, marks_that_it_ran)
    job = client.submit("tests.hand_back_marks")
    for _ in range(settings.max_attempts + 1):
        ctx, runner = _lease(r, keys, settings, fleet, job.id)
        assert run_phases(runner, ctx) == "handed_back"
        record = r.hgetall(keys.job(job.id))
        assert record["state"] == "queued" and record["attempts"] == "0", record
    assert job.id not in RAN


@pytest.mark.parametrize("path", ["warm", "phases"])
def test_a_function_stopped_by_the_shutdown_is_handed_back(r, keys, settings, path):
    fleet, client = _setup(r, keys, settings, loops_until_cancelled)
    job = client.submit("tests.hand_back_loops")
    ctx, runner = _lease(r, keys, settings, fleet, job.id, warm=path == "warm")
    LOOPING.clear()
    outcome: list[str] = []
    run = threading.Thread(target=lambda: outcome.append((run_warm if path == "warm" else run_phases)(runner, ctx)))
    run.start()
    try:
        assert LOOPING.wait(30), "the function did not start"
        shutdown.SHUTTING_DOWN.set()  # the worker's SIGTERM, as shutdown.arm() sets it
        run.join(30)
    finally:
        shutdown.SHUTTING_DOWN.clear()
    assert outcome == ["handed_back"]
    record = r.hgetall(keys.job(job.id))
    assert record["state"] == "queued" and record["attempts"] == "0"
    assert not r.exists(keys.result(job.id)) and not r.exists(keys.lease(ctx.lease_id)) and not r.exists(keys.gpu(GPU))
    reclaimed = [e for e in all_events(r, keys) if e["kind"] == "reclaimed"]
    assert [(e["outcome"], e["cause"]) for e in reclaimed] == [("requeued", "worker_shutdown")]


def test_a_stale_token_hands_nothing_back(r, keys, prefix, settings):
    fleet, client = _setup(r, keys, settings, marks_that_it_ran)
    job = client.submit("tests.hand_back_marks")
    ctx, _runner = _lease(r, keys, settings, fleet, job.id)
    store = LeaseStore(r, keys)
    before = _snapshot(settings.redis_url, prefix)
    for token in (ctx.token - 1, ctx.token + 1):  # an older holder's, or one never issued
        assert store.hand_back(Lease(ctx.lease_id, token, (GPU,)), settings.max_attempts) == ("stale", "")
    assert store.hand_back(Lease("not-a-lease", ctx.token, (GPU,)), settings.max_attempts) == ("stale", "")
    assert _snapshot(settings.redis_url, prefix) == before
    assert r.hget(keys.job(job.id), "state") == "leased"

    # the lease's own token hands it back, once
    assert store.hand_back(ctx.lease, settings.max_attempts) == ("requeued", job.id)
    assert store.hand_back(ctx.lease, settings.max_attempts) == ("stale", "")
