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

import subprocess
import sys
import threading

import httpx
import pytest
import redis

import makespan
from makespan import metrics, shutdown
from makespan.client import Client
from makespan.keys import WAKE_RELEASE
from makespan.models import fleet_version, load_fleet
from makespan.producer import Producer
from makespan.redis_conn import free_port
from makespan.registry import REGISTRY, end_host_marks_except, function_hosts, function_placement, publish
from makespan.workers.drivers.base import Instance
from makespan.workers.drivers.registry import register_instance
from makespan.workers.leases import Lease, LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner, instance_value
from makespan.workers.requests import request_drain
from makespan.workers.warm import run_phases, run_warm
from tests.conftest import FLEET_TOML
from tests.live import all_events, wait_for

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


def test_a_warm_job_leased_during_the_shutdown_is_handed_back_before_its_function_runs(r, keys, settings,
                                                                                       shutting_down):
    """A hostile-code check: a job handed back at a GPU worker's SIGTERM was leased straight back
    to the same host (its liveness was not yet withdrawn), onto the GPU where its endpoint was
    resident, and the warm path, which had no shutdown check, ran its function a second time."""
    fleet, client = _setup(r, keys, settings, marks_that_it_ran)
    job = client.submit("tests.hand_back_marks")
    ctx, runner = _lease(r, keys, settings, fleet, job.id, warm=True)
    assert run_warm(runner, ctx) == "handed_back"
    assert job.id not in RAN
    record = r.hgetall(keys.job(job.id))
    assert record["state"] == "queued" and record["attempts"] == "0"
    assert not r.exists(keys.lease(ctx.lease_id)) and not r.exists(keys.gpu(GPU))


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
    assert counted == {"lease_expired": 0.0, "worker_shutdown": 1.0, "function_missing": 0.0, "start_failed": 0.0,
                       "worker_lost": 0.0}
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


def _run_until_shutdown(r, keys, runner, ctx, path: str, busy=None) -> list[str]:
    """Run ``ctx``'s job (``path``: warm or phases) in a thread; once its execute runs (the
    job ``running``, and ``busy()`` when given), set SHUTTING_DOWN (as the worker's SIGTERM
    does) and return the run's outcome (empty: it did not end within 30 s of the shutdown)."""
    outcome: list[str] = []
    run = threading.Thread(target=lambda: outcome.append((run_warm if path == "warm" else run_phases)(runner, ctx)))
    run.start()
    try:
        wait_for(lambda: r.hget(keys.job(ctx.job_id), "state") == "running" and (busy is None or busy()), 30,
                 "the job's execute to start")
        shutdown.SHUTTING_DOWN.set()
        run.join(30)  # a bound on a hang only: the execute runs 1000 wall s unless stopped
    finally:
        shutdown.SHUTTING_DOWN.clear()
        if run.is_alive():  # the code before the fix: the execute runs on; its lease is taken away to end it
            r.delete(keys.gpu(GPU))  # the heartbeat's renew fails: the lease is lost, the run ends "stale"
            run.join(30)
    return outcome


def _assert_handed_back(r, keys, ctx) -> None:
    record = r.hgetall(keys.job(ctx.job_id))
    assert record["state"] == "queued" and record["attempts"] == "0", record
    assert not r.exists(keys.lease(ctx.lease_id)) and not r.exists(keys.gpu(GPU))
    reclaimed = [e for e in all_events(r, keys) if e["kind"] == "reclaimed"]
    assert [(e["outcome"], e["cause"]) for e in reclaimed] == [("requeued", "worker_shutdown")]


@pytest.mark.parametrize("path", ["warm", "phases"])
def test_an_execute_of_service_s_stops_at_the_shutdown_and_is_handed_back(r, keys, settings, path):
    """An execute that is no function, a wait of ``service_s`` (here 1000 wall s), did not
    watch the shutdown: it ran on until the watchdog cut the worker off, and its job waited
    for its lease to expire. Now it stops and its lease is handed back, as a function's."""
    fleet, _client = _setup(r, keys, settings)
    job_id = Producer(r, keys, fleet, settings).submit({"endpoint": "embed", "service_s": 100_000}).id
    ctx, runner = _lease(r, keys, settings, fleet, job_id, warm=path == "warm")
    assert _run_until_shutdown(r, keys, runner, ctx, path) == ["handed_back"]
    _assert_handed_back(r, keys, ctx)


def test_an_execute_of_requests_stops_sending_at_the_shutdown_and_is_handed_back(r, keys, settings, tmp_path):
    """An execute of a payload of requests (here 100 000 to a real endpoint server) did not
    watch the shutdown either. Now no request is sent after it, those in flight end (their
    request leases given back), and the job's lease is handed back."""
    fleet, _client = _setup(r, keys, settings)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "makespan.workers.endpoint_server", "--port", str(port),
                               "--latency-ms", "20", "--model", "m"], stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _healthy(url), 30, "the endpoint server")
        inst = Instance(endpoint="embed", gpus=[GPU], driver="simulated", host="host-a", time_scale=0.01, url=url)
        register_instance(r, keys, inst)
        job_id = Producer(r, keys, fleet, settings).submit(
            {"endpoint": "embed", "service_s": 10, "payload": {"requests": 100_000}}).id
        ctx, runner = _lease(r, keys, settings, fleet, job_id, warm=True)
        in_flight = lambda: request_drain(r, keys, [inst.id])["request_leases"] > 0  # noqa: E731
        assert _run_until_shutdown(r, keys, runner, ctx, "warm", busy=in_flight) == ["handed_back"]
        _assert_handed_back(r, keys, ctx)
        assert request_drain(r, keys, [inst.id]) == {"request_leases": 0, "waiters": 0}
        assert 0 < r.llen(keys.requests(job_id)) < 100_000  # some were sent, then none
    finally:
        server.terminate()
        server.wait(10)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


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


# -- a job whose workload function its worker lacks while another host's worker has it ---------
# The breaker restarted host-b's worker without ``only_b`` (host-a's still had it) and all 8
# ``only_b`` jobs submitted in the next 30 s failed for good with ``makespan.UnknownWorkload``:
# host-b's mark in ``P:fn:hosts:only_b`` outlived the restart. Now a clean stop ends its host's
# marks, a start ends its host's marks of the names it lacks, and a job that still reaches such a
# worker is handed back (no attempt counted) while another host's worker has its function; with
# none, it fails as before. (Live: tests/workloads/test_function_hosts.py.)

NAME = "tests.hand_back_marks"


def _mark(r, keys, host: str, ahead_ms: int = 30_000) -> None:
    seconds, micros = r.time()
    r.zadd(keys.fn_hosts(NAME), {host: seconds * 1000 + micros // 1000 + ahead_ms})


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "phase-by-phase"])
def test_a_job_of_a_function_another_host_registers_is_handed_back(r, keys, settings, monkeypatch, warm):
    fleet, client = _setup(r, keys, settings, marks_that_it_ran)
    job = client.submit(NAME)
    _mark(r, keys, "host-a")  # the stale mark of the worker that had it before its restart
    _mark(r, keys, "host-b")  # host-b's worker registers it
    ctx, runner = _lease(r, keys, settings, fleet, job.id, warm=warm)
    monkeypatch.delitem(REGISTRY, NAME)  # host-a's worker now runs without it

    assert (run_warm if warm else run_phases)(runner, ctx) == "handed_back"

    record = r.hgetall(keys.job(job.id))
    assert record["state"] == "queued" and record["attempts"] == "0"
    assert "does not register its workload function" in record["reason"]
    if not warm:  # handed back before its evict: no transition ran, no model loaded on the wrong host (review)
        assert [e for e in all_events(r, keys) if e.get("lease") == ctx.lease_id and e["kind"] == "phase_start"] == []
    assert r.zscore(keys.queue(ctx.priority), job.id) is not None
    assert not r.exists(keys.lease(ctx.lease_id)) and not r.exists(keys.gpu(ctx.gpus[0]))
    assert function_hosts(r, keys, NAME) == ("host-b",)  # the planner places it there now
    reclaimed = [e for e in all_events(r, keys) if e["kind"] == "reclaimed"]
    assert [(e["cause"], e["attempt_counted"]) for e in reclaimed] == [("function_missing", False)]


def test_a_starting_worker_ends_its_hosts_marks_of_the_names_it_lacks(r, keys, settings):
    _setup(r, keys, settings, marks_that_it_ran)  # published: P:fns has it
    _mark(r, keys, "host-a")
    _mark(r, keys, "host-b")
    assert end_host_marks_except(r, keys, "host-a", held={NAME}) == 0  # it holds it: its mark stays
    assert function_hosts(r, keys, NAME) == ("host-a", "host-b")
    assert end_host_marks_except(r, keys, "host-a", held=set()) == 1
    assert function_hosts(r, keys, NAME) == ("host-b",)
    # both marks expired (a restart after they ran out, or a rolling restart of every holder):
    # host-a, restarted without the function, is no holder, live, past or last (review)
    _mark(r, keys, "host-a", ahead_ms=-5_000)
    _mark(r, keys, "host-b", ahead_ms=-20_000)
    assert function_hosts(r, keys, NAME) == ("host-a", "host-b")
    assert end_host_marks_except(r, keys, "host-a", held=set()) == 1
    assert function_hosts(r, keys, NAME) == ("host-b",)  # its jobs wait for host-b
    # host-b, the last host marked, restarts without it too: its mark stays, so the jobs do
    # not go to any host (a new user saw them leased on a host with no worker and on one
    # that never had the function); no mark is live: they wait for a worker that registers it
    assert end_host_marks_except(r, keys, "host-b", held=set()) == 0
    assert function_placement(r, keys, NAME) == (("host-b",), False)
    # the same with host-b's mark live (it restarted within the mark's TTL): the mark ends now
    # (before: it stayed live, and the planner sent the jobs to host-b, whose worker failed them)
    _mark(r, keys, "host-b")
    assert function_placement(r, keys, NAME) == (("host-b",), True)
    assert end_host_marks_except(r, keys, "host-b", held=set()) == 1
    assert function_placement(r, keys, NAME) == (("host-b",), False)


def test_a_clean_stop_keeps_the_host_as_a_past_holder(r, keys, settings):
    """A worker that held the function and stopped cleanly: its host's live mark ends but
    stays a past holder, so while no other host has the function its jobs wait for it."""
    from makespan.registry import withdraw

    _setup(r, keys, settings, marks_that_it_ran)
    r.delete(keys.fn_hosts(NAME))
    _mark(r, keys, "host-a")
    withdraw(r, keys, [NAME], "test", host="host-a")
    assert function_hosts(r, keys, NAME) == ("host-a",)  # no live mark: the last holder
    _mark(r, keys, "host-b")
    assert function_hosts(r, keys, NAME) == ("host-b",)  # a live one elsewhere: there


def test_a_job_of_a_function_no_other_host_has_is_handed_back_to_wait(r, keys, settings, monkeypatch):
    """The only host marked for the function is this one, restarted without it: its mark
    ends, and the job is handed back before any transition, no attempt counted, to wait
    (``waiting_for_function``) for a worker that registers the function (before: it failed
    with makespan.UnknownWorkload, so a deploy that restarted the old host first lost them)."""
    fleet, client = _setup(r, keys, settings, marks_that_it_ran)
    job = client.submit(NAME)
    _mark(r, keys, "host-a")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    monkeypatch.delitem(REGISTRY, NAME)

    assert run_phases(runner, ctx) == "handed_back"

    record = r.hgetall(keys.job(job.id))
    assert record["state"] == "queued" and record.get("attempts", "0") == "0", record
    assert function_placement(r, keys, NAME) == ((ctx.host,), False)  # no live mark: the planner holds it
    assert [e for e in all_events(r, keys) if e.get("lease") == ctx.lease_id and e["kind"] == "phase_start"] == []


@pytest.mark.parametrize("holders", [["host-a", "host-z"], ["host-z"]], ids=["unusable-other", "unusable-last"])
def test_no_hand_back_when_no_other_holder_can_run_the_job(r, keys, settings, monkeypatch, holders):
    """The function's only other holder, live or last, cannot hold the job's endpoint (here:
    no such host in this fleet; live: a host too small, or in another pool), where the planner
    places the job anywhere again (placeable_hosts) and a hand-back repeated for ever (a
    review saw 2,568 in 25 s): the job fails at once, before any transition (no model loaded
    for it)."""
    fleet, client = _setup(r, keys, settings, marks_that_it_ran)
    job = client.submit(NAME)
    for host in holders:
        _mark(r, keys, host, ahead_ms=60_000 if len(holders) > 1 else -5_000)
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    monkeypatch.delitem(REGISTRY, NAME)

    assert run_phases(runner, ctx) == "failed"

    record = r.hgetall(keys.job(job.id))
    assert record["state"] == "failed" and "makespan.UnknownWorkload" in record["reason"]
    assert [e for e in all_events(r, keys) if e.get("lease") == ctx.lease_id and e["kind"] == "phase_start"] == []


def test_a_job_handed_back_for_its_function_too_often_fails(r, keys, settings):
    """The backstop: whatever the worker's check misses, a job handed back for a missing
    function more than FN_MISSING_BACKS_MAX times fails with the reason, not for ever."""
    from makespan.store.leases import FN_MISSING_BACKS_MAX

    fleet, client = _setup(r, keys, settings, marks_that_it_ran)
    job = client.submit(NAME)
    outcomes = []
    for _ in range(FN_MISSING_BACKS_MAX + 1):
        ctx, _runner = _lease(r, keys, settings, fleet, job.id)
        outcomes.append(LeaseStore(r, keys).hand_back(ctx.lease, settings.max_attempts, cause="function_missing")[0])
    assert outcomes == ["requeued"] * FN_MISSING_BACKS_MAX + ["failed"]
    record = r.hgetall(keys.job(job.id))
    assert record["state"] == "failed" and "registered only on GPU workers that cannot run it" in record["reason"]


CRASHING_WORKER = """
import os, signal
from celery import signals
import makespan.workers.tasks  # noqa: F401 - the GPU worker's signal handlers
signals.worker_init.send(sender=None)
def my_crashing_workload():
    os.kill(os.getpid(), signal.SIGSEGV)
my_crashing_workload()
"""


def test_a_workload_that_crashes_the_gpu_worker_leaves_its_stack_on_stderr(prefix):
    """A hostile-code check: a function whose native code segfaulted ended the GPU worker with
    nothing in its log to name it; the worker now enables faulthandler as it starts."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MAKESPAN_KEY_PREFIX": prefix}
    done = subprocess.run([sys.executable, "-c", CRASHING_WORKER], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert "Segmentation fault" in done.stderr and "in my_crashing_workload" in done.stderr, done.stderr
