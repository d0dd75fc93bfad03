"""A workload function's failure, cancel and a Redis blip on the GPU worker's side, driven
in-process (run_warm / run_phases on a real Redis): three cases a review found that left a
job running on a lease nobody renewed, or retried a cancelled one (2026-12-04)."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest
import redis

import makespan
from makespan.client import Client
from makespan.models import fleet_version, load_fleet
from makespan.registry import publish
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner, instance_value
from makespan.workers.warm import run_phases, run_warm
from tests.conftest import FLEET_TOML

GPU = "GPU-host-a-3"
HOOKS: dict = {}


def _setup(r, keys, settings, *definitions):
    fleet = load_fleet(FLEET_TOML)
    r.set(keys.fleet, fleet.model_dump_json())
    r.set(keys.fleet_version, fleet_version(fleet))
    publish(r, keys, definitions, holder="test")
    return fleet, Client(r, settings)


def _lease(r, keys, settings, fleet, job_id, warm=True):
    """Lease GPU for the queued ``job_id`` (its ``embed`` instance resident when ``warm``)."""
    lease_id = uuid.uuid4().hex
    if warm:
        r.set(keys.resident(GPU), instance_value("embed", [GPU]))
    priority = r.hget(keys.job(job_id), "priority")
    lease = LeaseStore(r, keys).acquire(lease_id, (GPU,), settings.lease_ttl_s, job_id=job_id, kind="job",
                                        holder="host-a", queue=keys.queue(priority))
    assert lease is not None
    ctx = PhaseContext(lease_id, lease.token, [GPU], "host-a", "job", "embed", job_id, priority,
                       float(r.hget(keys.job(job_id), "service_s")))
    return ctx, PhaseRunner(r, settings, fleet)


def _undecodable() -> str:
    return "cannot read " + os.fsdecode(b"/data/caf\xe9.bin")  # a lone surrogate (surrogateescape)


@makespan.workload(endpoint="embed", name="tests.fail_undecodable")
def fail_undecodable(ctx):
    raise ValueError(_undecodable())


@makespan.workload(endpoint="embed", name="tests.fail_undecodable_retry", retries=1, retry_backoff_s=0.1)
def fail_undecodable_retry(ctx):
    raise ValueError(_undecodable())


@pytest.mark.parametrize("path", ["warm", "phases"])
def test_an_exception_whose_message_is_not_utf8_fails_the_job_with_its_error(r, keys, settings, path):
    """The message held a lone surrogate; the fenced commit's JSON carried its escape, which
    Lua's cjson refuses: the script failed, the job stayed running on an unrenewed lease and
    ran again at its expiry, never reporting the error."""
    fleet, client = _setup(r, keys, settings, fail_undecodable)
    job = client.submit("tests.fail_undecodable")
    ctx, runner = _lease(r, keys, settings, fleet, job.id, warm=path == "warm")
    assert (run_warm if path == "warm" else run_phases)(runner, ctx) == "failed"
    with pytest.raises(makespan.WorkloadError) as failure:
        job.result(timeout_s=1)
    assert failure.value.error_type == "ValueError" and failure.value.message == "cannot read /data/caf\\udce9.bin"
    assert not r.exists(keys.lease(ctx.lease_id)) and not r.exists(keys.gpu(GPU))


def test_an_exception_whose_message_is_not_utf8_is_retried(r, keys, settings):
    fleet, client = _setup(r, keys, settings, fail_undecodable_retry)
    job = client.submit("tests.fail_undecodable_retry")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    assert run_warm(runner, ctx) == "retried"
    assert job.status()["state"] == "delayed"


@makespan.workload(endpoint="embed", name="tests.runs_a_second")
def runs_a_second(ctx):
    HOOKS["started"].set()
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        if ctx.cancelled:
            return "stopped"
        time.sleep(0.01)
    return "done"


class _OneBlip:
    """The runner's client; its first read of ``cancel_requested`` while the function runs
    fails (a socket timeout, a dropped connection)."""

    def __init__(self, r):
        self._r, self.failed = r, False

    def hmget(self, key, *fields):  # the watcher reads the cancel request and the job's lease together
        if "cancel_requested" in fields and HOOKS["started"].is_set() and not self.failed:
            self.failed = True
            raise redis.ConnectionError("blip")
        return self._r.hmget(key, *fields)

    def __getattr__(self, name):
        return getattr(self._r, name)


def test_one_failed_cancel_poll_does_not_abandon_a_running_function(r, keys, settings):
    """One failed read used to end the watch: the job stayed running, its heartbeat stopped,
    and the function ran on unwatched while the lease expired."""
    HOOKS["started"] = threading.Event()
    fleet, client = _setup(r, keys, settings, runs_a_second)
    job = client.submit("tests.runs_a_second")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    blip = _OneBlip(r)
    runner.r = blip
    assert run_warm(runner, ctx) == "completed"
    assert blip.failed and job.result(timeout_s=1) == "done"


@makespan.workload(endpoint="embed", name="tests.cancelled_then_raises", retries=2, retry_backoff_s=0.2)
def cancelled_then_raises(ctx):
    HOOKS["cancel"]()  # the user's cancel lands, and the function raises before the watcher looks
    raise RuntimeError("interrupted")


def test_a_cancel_just_before_the_function_raises_is_a_cancel_not_a_retry(r, keys, settings):
    fleet, client = _setup(r, keys, settings, cancelled_then_raises)
    job = client.submit("tests.cancelled_then_raises")
    HOOKS["cancel"] = lambda: r.hset(keys.job(job.id), "cancel_requested", "1")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    assert run_warm(runner, ctx) == "cancelled"
    assert job.status()["state"] == "cancelled" and r.zcard(keys.delayed) == 0
    with pytest.raises(makespan.JobCancelled):
        job.result(timeout_s=1)


@makespan.workload(endpoint="embed", name="tests.make_list")
def make_list(ctx, n):
    return list(range(n))


@makespan.workload(endpoint="embed", name="tests.echo")
def echo(ctx, values):
    return values


def test_a_completed_dependency_stays_while_a_job_waits_on_it_past_retention(r, keys, settings):
    """B takes A's result as its argument and still waits (no free GPU) when retention's age
    passes: the sweep deleted A's summary and result, and B was then cancelled as if A had
    not completed (a review's find). A job something waits on is kept like a step of a
    running workload, and expires after its last dependant leaves the queue."""
    from makespan.workers.planner_worker import PlannerWorker
    from makespan.workers.retention import Retention

    fleet, client = _setup(r, keys, settings, make_list, echo)
    planner = PlannerWorker(r, settings, fleet, dispatch=lambda *args: None)
    planner.token = str(r.incr(keys.planner_fence))
    first = client.submit("tests.make_list", 3)
    second = client.submit("tests.echo", first)
    ctx, runner = _lease(r, keys, settings, fleet, first.id)
    assert run_warm(runner, ctx) == "completed"
    retention = Retention(r, settings)
    retention.sweep()
    retention.sweep(now_s=time.time() + settings.retention_age_s + 60)
    planner.form_batch()
    assert r.exists(keys.job(first.id)) and r.exists(keys.result(first.id))
    assert second.status()["state"] == "queued"
    ctx, runner = _lease(r, keys, settings, fleet, second.id)
    assert run_warm(runner, ctx) == "completed" and second.result(timeout_s=1) == [0, 1, 2]
    assert r.ttl(keys.job(first.id)) == -1  # kept without a TTL while B waited; the sweep expires it now
    retention.sweep(now_s=time.time() + 2 * settings.retention_age_s + 120)
    assert not r.exists(keys.job(first.id)) and not r.exists(keys.result(first.id))


def test_a_progress_note_that_is_not_utf8_is_stored_and_does_not_fail_the_function(r, keys, settings):
    """ctx.progress is best effort: a note with a lone surrogate (``os.fsdecode`` of a file
    name that is not UTF-8) used to raise UnicodeEncodeError out of the HSET into the
    user's function; it is stored as backslash text."""
    from makespan.workers.functions import progress_writer

    fleet, client = _setup(r, keys, settings, plain_preemptor)
    job = client.submit("tests.plain_preemptor")
    ctx, _ = _lease(r, keys, settings, fleet, job.id)
    events: list[dict] = []
    write = progress_writer(lambda ops: LeaseStore(r, keys).fenced(ctx.lease, ops), keys, job.id, "w",
                            emit=events.append)
    write(1.0, 2.0, os.fsdecode(b"card-\xe9.png"))
    assert r.hget(keys.job(job.id), "progress_note") == "card-\\udce9.png"
    assert r.hget(keys.job(job.id), "progress_done") == "1.0"
    assert events[-1]["note"] == "card-\\udce9.png"


@makespan.workload(endpoint="embed", name="tests.progress_after_cancel")
def progress_after_cancel(ctx):
    HOOKS["calls"] = calls = HOOKS.get("calls", 0) + 1
    if calls == 1:  # the first attempt runs until told to stop, then reports progress once more
        HOOKS["first_started"].set()
        ctx.cancelled.wait(30)
        HOOKS["second_running"].wait(30)
        ctx.progress(1, 10, "stale attempt")  # well within MAKESPAN_CANCEL_GRACE_S
        HOOKS["stale_wrote"].set()
        return "stale"
    ctx.progress(9, 10, "live attempt")
    HOOKS["second_running"].set()
    HOOKS["stale_wrote"].wait(30)
    HOOKS["read"].wait(30)  # the test reads the record while this attempt still runs
    return "live"


def test_a_preempted_attempt_does_not_overwrite_the_progress_of_the_next(r, keys, settings):
    """A run whose lease was preempted goes on until the cancel grace period ends (or for
    good, when stuck); its progress writes were not fenced and overwrote the progress of
    the attempt running now. They are fenced by the run's lease."""
    HOOKS.clear()
    HOOKS.update(first_started=threading.Event(), second_running=threading.Event(), stale_wrote=threading.Event(),
                 read=threading.Event())
    fleet, client = _setup(r, keys, settings, progress_after_cancel)
    job = client.submit("tests.progress_after_cancel")
    ctx1, runner1 = _lease(r, keys, settings, fleet, job.id)
    out1: list = []
    first = threading.Thread(target=lambda: out1.append(run_warm(runner1, ctx1)))
    first.start()
    assert HOOKS["first_started"].wait(20)
    assert LeaseStore(r, keys).preempt(ctx1.lease_id, "a-critical-job") == "preempted"
    ctx2, runner2 = _lease(r, keys, settings, fleet, job.id)
    out2: list = []
    second = threading.Thread(target=lambda: out2.append(run_warm(runner2, ctx2)))
    second.start()
    assert HOOKS["stale_wrote"].wait(20)
    record = r.hgetall(keys.job(job.id))  # while the second attempt runs
    HOOKS["read"].set()
    first.join(20)
    second.join(20)
    assert out1 == ["stale"] and out2 == ["completed"]
    assert record["state"] == "running"
    assert (record.get("progress_note"), record.get("progress_done")) == ("live attempt", "9.0"), record


@makespan.workload(endpoint="embed", helpers=("chat",), name="tests.holds_a_helper")
def holds_a_helper(ctx):
    HOOKS["started"].set()
    ctx.cancelled.wait(30)
    return "victim"


@makespan.workload(endpoint="embed", name="tests.plain_preemptor")
def plain_preemptor(ctx):
    return "preemptor"


def test_a_job_preempted_beside_its_helper_leaves_no_helper_running(r, keys, settings):
    """A job with a helper endpoint, preempted during execute, never reaches the clear phase
    that stops its helper. The preemption kept the GPU's resident marker, so the preemptor
    was dispatched warm and nothing stopped the helper: a process holding GPU memory on a
    GPU another lease holds, registered as running. The preemption now forgets the marker
    of a lease with helpers; the next start on the GPU is cold and stops the leftover."""
    from makespan.workers.drivers.registry import instances_on

    HOOKS["started"] = threading.Event()
    fleet, client = _setup(r, keys, settings, holds_a_helper, plain_preemptor)
    victim = client.submit("tests.holds_a_helper", priority="LOW")
    ctx1, runner1 = _lease(r, keys, settings, fleet, victim.id)
    out1: list = []
    thread = threading.Thread(target=lambda: out1.append(run_warm(runner1, ctx1)))
    thread.start()
    assert HOOKS["started"].wait(20)
    assert [i.endpoint for i in instances_on(r, keys, [GPU]) if i.endpoint == "chat"] == ["chat"]
    preemptor = client.submit("tests.plain_preemptor", priority="CRITICAL")
    assert LeaseStore(r, keys).preempt(ctx1.lease_id, preemptor.id) == "preempted"
    thread.join(20)
    assert out1 == ["stale"]
    ctx2, runner2 = _lease(r, keys, settings, fleet, preemptor.id, warm=False)
    assert run_warm(runner2, ctx2) == "completed"
    assert preemptor.result(timeout_s=1) == "preemptor"
    left = [i.id for i in instances_on(r, keys, [GPU]) if i.endpoint == "chat"]
    assert left == [], f"the victim's helper still runs on {GPU}: {left}"


@makespan.workload(endpoint="embed", name="tests.requests_on_a_simulated_endpoint", retries=2, retry_backoff_s=0.1)
def requests_on_a_simulated_endpoint(ctx):
    return ctx.requests(["hello"])


def test_requests_on_a_simulated_endpoint_fail_once_with_what_to_do(r, keys, settings):
    """ctx.requests on an endpoint without a server can never succeed: the job failed only
    after its retries (on the example fleet's simulated judge, minutes of cold starts), with a
    message that did not say what to change (found by a new-user trial)."""
    fleet, client = _setup(r, keys, settings, requests_on_a_simulated_endpoint)
    job = client.submit("tests.requests_on_a_simulated_endpoint")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    assert run_warm(runner, ctx) == "failed"
    with pytest.raises(makespan.WorkloadError) as err:
        job.result(timeout_s=1)
    assert err.value.error_type == "makespan.errors.NoEndpointServer" and "launch" in err.value.message
    assert r.hget(keys.job(job.id), "tries") in (None, "0")  # not retried


@makespan.workload(endpoint="embed", name="tests.raises_when_preempted", retries=1)
def raises_when_preempted(ctx):
    HOOKS.setdefault("attempts_seen", []).append(ctx.attempt)
    if len(HOOKS["attempts_seen"]) == 1:  # the first run stops when told to, by raising (as user code may)
        HOOKS["first_started"].set()
        ctx.cancelled.wait(30)
        HOOKS["cancel_reason"] = ctx.cancel_reason
        raise RuntimeError("stopped: the lease was lost")
    return "live"


def _first_run_started(r, keys, settings):
    """A job of ``tests.raises_when_preempted`` leased, its first run started in a thread:
    (fleet, job, the lease's context, the thread, the list its run's outcome is appended to)."""
    HOOKS.clear()
    HOOKS.update(first_started=threading.Event())
    fleet, client = _setup(r, keys, settings, raises_when_preempted)
    job = client.submit("tests.raises_when_preempted")
    ctx1, runner1 = _lease(r, keys, settings, fleet, job.id)
    out1: list = []
    first = threading.Thread(target=lambda: out1.append(run_warm(runner1, ctx1)))
    first.start()
    assert HOOKS["first_started"].wait(20)
    return fleet, job, ctx1, first, out1


def test_a_preemption_is_not_an_attempt_and_burns_no_retry(r, keys, settings):
    """What docs/workloads.md promises (review, 2026-12-06): a preempted run is not an attempt
    and does not use a retry, even when the function raises as it is stopped (its retry
    write is fenced by the lost lease); the next run has the same ``ctx.attempt``, status
    counts one attempt and ``job.result()`` returns the run that finished."""
    from makespan.producer import Producer

    fleet, job, ctx1, first, out1 = _first_run_started(r, keys, settings)
    assert LeaseStore(r, keys).preempt(ctx1.lease_id, "a-critical-job") == "preempted"
    first.join(20)
    assert out1 == ["stale"]
    assert HOOKS["cancel_reason"] == "preempted"  # not lease_lost: the function can tell (a new user's report)
    status = Producer(r, keys, fleet, settings).status(job.id)
    assert (status["state"], status["attempts"], status.get("tries", 0), status["preemptions"]) == ("queued", 0, 0, 1)
    ctx2, runner2 = _lease(r, keys, settings, fleet, job.id)
    assert run_warm(runner2, ctx2) == "completed"
    assert job.result(timeout_s=1) == "live" and HOOKS["attempts_seen"] == [1, 1]
    status = Producer(r, keys, fleet, settings).status(job.id)
    assert (status["attempts"], status.get("tries", 0), status["result_attempt"], status["preemptions"]) == (1, 0, 1, 1)


@makespan.workload(endpoint="embed", name="tests.quick_progress")
def quick_progress(ctx):
    for step in range(200):  # far faster than the 0.2 s throttle: only the first would be written
        ctx.progress(step + 1, 1000, f"step {step + 1}")
    try:
        ctx.progress(float("nan"), 1)
    except ValueError as e:
        return str(e)
    return "NaN accepted"


@makespan.workload(endpoint="embed", name="tests.async_fn")
async def async_fn(ctx, x):
    import asyncio

    await asyncio.sleep(0.01)
    return {"doubled": 2 * x}


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text for you")


@makespan.workload(endpoint="embed", name="tests.unprintable")
def unprintable(ctx):
    raise _Unprintable()


def test_the_last_progress_report_of_a_run_is_written_and_nan_is_refused(r, keys, settings):
    """A new user's loop reported (i, N) faster than the throttle: the completed job showed
    the first report only. ctx.progress(NaN) was stored and `makespan status` printed NaN
    (not JSON): it raises ValueError in the function instead."""
    fleet, client = _setup(r, keys, settings, quick_progress)
    job = client.submit("tests.quick_progress")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    assert run_warm(runner, ctx) == "completed"
    assert "finite numbers >= 0" in job.result(timeout_s=1)
    status = job.status()
    assert (status["progress_done"], status["progress_total"], status["progress_note"]) == (200.0, 1000.0, "step 200")


def test_a_new_lease_clears_the_progress_of_the_run_before(r, keys, settings):
    """After a preemption the leased job showed the cut run's progress (3/40) until the new
    run reported: the lease that starts a run clears it."""
    fleet, client = _setup(r, keys, settings, plain_preemptor)
    job = client.submit("tests.plain_preemptor")
    ctx, _ = _lease(r, keys, settings, fleet, job.id)
    r.hset(keys.job(job.id), mapping={"progress_done": "3.0", "progress_total": "40.0", "progress_note": "cut"})
    assert LeaseStore(r, keys).preempt(ctx.lease_id, "a-critical-job") == "preempted"
    assert r.hget(keys.job(job.id), "progress_done") == "3.0"  # the requeued job keeps what its run did
    _lease(r, keys, settings, fleet, job.id)
    status = job.status()
    assert status["state"] == "leased" and "progress_done" not in r.hgetall(keys.job(job.id)), status


def test_an_async_function_runs_and_an_unprintable_exception_is_reported(r, keys, settings):
    fleet, client = _setup(r, keys, settings, async_fn, unprintable)
    job = client.submit("tests.async_fn", 21)
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    assert run_warm(runner, ctx) == "completed" and job.result(timeout_s=1) == {"doubled": 42}
    job = client.submit("tests.unprintable")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    assert run_warm(runner, ctx) == "failed"
    with pytest.raises(makespan.WorkloadError) as failure:
        job.result(timeout_s=1)
    assert failure.value.error_type.endswith("_Unprintable") and "str() of the exception raised RuntimeError" in \
        failure.value.message, failure.value


def test_a_generator_function_is_refused_at_registration():
    with pytest.raises(makespan.ValidationError, match="generator function"):
        @makespan.workload(endpoint="embed", name="tests.gen")
        def gen(ctx):
            yield 1


@makespan.workload(endpoint="embed", name="tests.report_then_long_step")
def report_then_long_step(ctx):
    ctx.progress(0, 10, "loading")
    ctx.progress(5, 10, "half: now the long step")  # within the throttle's window of the first
    HOOKS["step"].wait(20)
    return "ok"


@makespan.workload(endpoint="embed", name="tests.await_forever")
async def await_forever(ctx):
    import asyncio

    HOOKS["awaiting"].set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:  # saves its state before it goes: a cleanup that awaits
        await asyncio.sleep(0.3)
        HOOKS["cleaned"] = True
        raise


@makespan.workload(endpoint="embed", name="tests.int_keys")
def int_keys(ctx):
    return {1: "a"}


def test_a_report_held_back_by_the_throttle_is_written_within_its_window(r, keys, settings):
    """Report, then a long step: `status` showed the first report for the whole step (the
    held-back one waited for the next report or the end; task-queue new user)."""
    HOOKS.clear()
    HOOKS["step"] = threading.Event()
    fleet, client = _setup(r, keys, settings, report_then_long_step)
    job = client.submit("tests.report_then_long_step")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    out: list = []
    thread = threading.Thread(target=lambda: out.append(run_warm(runner, ctx)))
    thread.start()
    try:
        from tests.live import wait_for

        wait_for(lambda: r.hget(keys.job(job.id), "progress_done") == "5.0", 5, "the held-back report")
        assert r.hget(keys.job(job.id), "progress_note") == "half: now the long step"
    finally:
        HOOKS["step"].set()
        thread.join(20)
    assert out == ["completed"]


def test_an_async_function_is_cancelled_at_its_await(r, keys, settings):
    """An awaiting async function ran on for the whole cancel grace period (10 s), its
    thread left in the background: the coroutine is cancelled at its await."""
    HOOKS.clear()
    HOOKS["awaiting"] = threading.Event()
    fleet, client = _setup(r, keys, settings, await_forever)
    job = client.submit("tests.await_forever")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    out: list = []
    thread = threading.Thread(target=lambda: out.append(run_warm(runner, ctx)))
    thread.start()
    assert HOOKS["awaiting"].wait(20)
    started = time.monotonic()
    assert job.cancel() == "cancel_requested"
    thread.join(20)
    took_s = time.monotonic() - started
    assert out == ["cancelled"] and took_s < settings.cancel_grace_s, (out, took_s)
    assert "did not stop within" not in r.hget(keys.job(job.id), "reason")
    assert HOOKS.get("cleaned")  # cancelled once: its cleanup was not cancelled in turn (review)


def test_a_result_with_a_key_that_is_not_a_string_fails_as_an_argument_would(r, keys, settings):
    fleet, client = _setup(r, keys, settings, int_keys)
    job = client.submit("tests.int_keys")
    ctx, runner = _lease(r, keys, settings, fleet, job.id)
    assert run_warm(runner, ctx) == "failed"
    with pytest.raises(makespan.WorkloadError, match="mapping keys must be strings, got int 1"):
        job.result(timeout_s=1)


def test_a_run_whose_lease_is_reclaimed_is_told_lease_lost(r, keys, settings, caplog):
    """The other way to lose a lease (it expired, the planner reclaimed it): ``lease_lost``;
    the worker's log says so at its default level (it said nothing: fresh-clone check)."""
    import logging

    fleet, job, ctx1, first, out1 = _first_run_started(r, keys, settings)
    r.zadd(keys.leases, {ctx1.lease_id: 0})  # expired on the server clock
    with caplog.at_level(logging.WARNING, logger="makespan.functions"):
        assert LeaseStore(r, keys).reclaim(ctx1.lease_id, max_attempts=3) in ("requeued", "delayed")
        first.join(20)
    assert out1 == ["stale"] and HOOKS["cancel_reason"] == "lease_lost"
    assert f"job {job.id}: its lease was lost while workload tests.raises_when_preempted ran" in caplog.text


def test_a_preempted_function_learns_it_without_waiting_for_a_heartbeat(r, keys, settings):
    """The run learned of its preemption only at its heartbeat's next renewal (up to
    ``heartbeat_s``, 2 s by default, added to every preemption: the preemptor's transitions
    wait for the run to end; breaker check). The watcher's cancel read also reads which
    lease the job holds: with a heartbeat that never renews in this test, the function
    still sees ``ctx.cancelled`` with reason ``preempted``."""
    import dataclasses

    slow_beat = dataclasses.replace(settings, lease_ttl_s=600.0, heartbeat_s=300.0)
    _fleet, _job, ctx1, first, out1 = _first_run_started(r, keys, slow_beat)
    assert LeaseStore(r, keys).preempt(ctx1.lease_id, "a-critical-job") == "preempted"
    first.join(30)  # the function waits on ctx.cancelled for 30 s: it ends now only if told
    assert not first.is_alive() and out1 == ["stale"]
    assert HOOKS["cancel_reason"] == "preempted"


def test_a_preempted_plain_execute_stops_without_waiting_for_a_heartbeat(r, keys, settings):
    """The same for a job with no function (its execute a wait of service_s): the phase's
    cancel read also reads the job's lease, so a preemption stops the wait at once."""
    import dataclasses

    from makespan.producer import Producer
    from tests.live import wait_for

    slow_beat = dataclasses.replace(settings, lease_ttl_s=600.0, heartbeat_s=300.0)
    fleet, _client = _setup(r, keys, slow_beat)
    job = Producer(r, keys, fleet, slow_beat).submit({"endpoint": "embed", "service_s": 3000.0}).id  # 30 wall s
    ctx1, runner1 = _lease(r, keys, slow_beat, fleet, job)
    out1: list = []
    first = threading.Thread(target=lambda: out1.append(run_warm(runner1, ctx1)))
    first.start()
    wait_for(lambda: r.hget(keys.job(job), "state") == "running", 20, "the execute to start")
    assert LeaseStore(r, keys).preempt(ctx1.lease_id, "a-critical-job") == "preempted"
    first.join(20)
    assert not first.is_alive() and out1 == ["stale"]


@pytest.mark.parametrize("options, says", [
    ({"helpers": "embed"}, "must be a list of endpoint names"),  # was ('e', 'm', 'b', 'e', 'd')
    ({"helpers": [5]}, "must be endpoint names"),
    ({"endpoint": 5}, "must be an endpoint name"),
    ({"endpoint": ""}, "must be an endpoint name"),
    ({"expected_s": 1e12}, "at most 2592000 s"),  # every submit then refused it as service_s
])
def test_decorator_options_that_fail_later_are_refused_at_registration(options, says):
    """Options the decorator took and that failed only at a worker or at every submit (a
    CLI review, 2026-12-07): refused where they are written, naming the option."""
    with pytest.raises(makespan.ValidationError, match=says):
        makespan.workload(**options)


def test_a_function_without_a_ctx_parameter_is_refused_at_registration():
    with pytest.raises(makespan.ValidationError, match="its first one receives the run's context"):
        @makespan.workload(endpoint="embed", name="tests.noctx")
        def noctx():
            return 1


@makespan.workload
def bare_workload(ctx, x):
    return x


def test_the_decorator_without_parentheses_registers_the_function():
    """``@makespan.workload`` bare replaced the function with the decorator's inner one."""
    assert isinstance(bare_workload, makespan.registry.WorkloadDef)
    assert bare_workload.name.endswith("bare_workload") and bare_workload.endpoint is None
    assert makespan.registry.REGISTRY[bare_workload.name] is bare_workload


def test_reloading_a_workload_module_redefines_its_functions(tmp_path, monkeypatch):
    """``importlib.reload`` (a notebook's %autoreload, a re-run cell) of a module of workload
    functions raised "already registered by" that same module; the new definition now
    replaces the old. Another module's function under a taken name is still refused (a
    notebook user, 2026-12-07)."""
    import importlib
    import sys

    module = tmp_path / "nb_reload_jobs.py"
    module.write_text("import makespan\n\n@makespan.workload(name='tests.nb_reload')\ndef shout(ctx, text):\n"
                      "    return text.upper()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        first = importlib.import_module("nb_reload_jobs")
        module.write_text(module.read_text().replace("text.upper()", "text.upper() + '!'"))
        importlib.invalidate_caches()
        second = importlib.reload(first)
        assert makespan.registry.REGISTRY["tests.nb_reload"].fn(None, "a") == "A!"
        assert second.shout is makespan.registry.REGISTRY["tests.nb_reload"]
        with pytest.raises(makespan.ValidationError, match="already registered by nb_reload_jobs.shout: give"):
            @makespan.workload(name="tests.nb_reload")
            def shout(ctx, text):  # another module's function (this test's) under the same name
                return text
    finally:
        makespan.registry.REGISTRY.pop("tests.nb_reload", None)
        sys.modules.pop("nb_reload_jobs", None)


def test_a_result_with_a_numpy_value_names_it_and_how_to_convert_it():
    """A function returning np.int64 got only "Object of type int64 is not JSON
    serializable"; arguments had the .item() hint and the path (a notebook user, 2026-12-07)."""
    np = pytest.importorskip("numpy")
    from makespan.results import ResultNotJson, encode_value

    with pytest.raises(ResultNotJson, match=r"the return value\['scores'\]\[1\] is of type numpy.float32: convert it "
                                             r"with \.item\(\)"):
        encode_value({"scores": [1.0, np.float32(0.5)]}, 1, 0.1, 1 << 20)
    with pytest.raises(ResultNotJson, match="the return value is the float nan"):
        encode_value(float("nan"), 1, 0.1, 1 << 20)


def test_a_functools_wraps_wrapper_that_takes_ctx_is_accepted():
    """The ctx check read the wrapped body's signature (inspect follows __wrapped__), so a
    decorator that takes ctx and calls a body with no parameters was refused (a verifier)."""
    import functools

    def uses_ctx(fn):
        @functools.wraps(fn)
        def wrapper(ctx, *args, **kwargs):
            return fn(*args, **kwargs)
        return wrapper

    try:
        @makespan.workload(endpoint="embed", name="tests.wrapped_ping")
        @uses_ctx
        def ping():
            return "pong"

        assert ping.fn(None) == "pong"
    finally:
        makespan.registry.REGISTRY.pop("tests.wrapped_ping", None)
    with pytest.raises(makespan.ValidationError, match="options go in the decorator's call"):
        makespan.workload(ping.fn, name="tests.dropped")  # its options would have been dropped


def test_the_per_job_errors_carry_the_job_and_a_dependency_cancel_names_the_dependency(r, keys, settings, caplog):
    """A client integrator: ``ResultTimeout`` and ``JobCancelled`` carried no ``job_id``, and a
    job cancelled because its dependency failed could not be told from a user's cancel without
    parsing the message; a Python submit of a child of a failed job said nothing (the CLI
    warned)."""
    fleet, client = _setup(r, keys, settings, make_list)
    parent = client.submit("tests.make_list", 3)
    with pytest.raises(makespan.ResultTimeout) as timed_out:
        parent.result(timeout_s=0)
    assert (timed_out.value.job_id, timed_out.value.state) == (parent.id, "queued")
    r.hset(keys.job(parent.id), mapping={"state": "failed", "reason": "execute: boom"})
    with caplog.at_level("WARNING", logger="makespan.client"):
        child = client.submit("tests.make_list", 2, depends_on=parent)
    assert f"dependency {parent.id} has already failed: this job will never run" in caplog.text
    assert child.id in caplog.text
    # the planner's tick cancels it with this reason (workers/batch.py)
    r.hset(keys.job(child.id), mapping={"state": "cancelled", "reason": f"dependency {parent.id} did not complete"})
    with pytest.raises(makespan.JobCancelled) as cancelled:
        child.result(timeout_s=1)
    assert (cancelled.value.job_id, cancelled.value.dependency) == (child.id, parent.id)
    assert cancelled.value.reason == f"dependency {parent.id} did not complete"
    other = client.submit("tests.make_list", 1)
    other.cancel()
    with pytest.raises(makespan.JobCancelled) as by_user:
        other.result(timeout_s=1)
    assert by_user.value.job_id == other.id and by_user.value.dependency is None
    assert client.job(child.id) == child and len({child, client.job(child.id), other}) == 2


def test_a_preempted_run_is_told_from_a_lost_lease_after_its_job_was_leased_again():
    """A verifier: a function's watcher read "preempted" off the job's reason, which a quick
    new lease of the job rewrites; it then logged a lost lease. preempt.lua's
    ``preempted_lease`` names the lease it cut and outlives the new lease."""
    from makespan.workers.functions import _lost_kind

    assert _lost_kind("", cut="L1", lease_id="L1") == "preempted"  # leased again: reason rewritten
    assert _lost_kind("preempted by job c", cut=None, lease_id="L1") == "preempted"
    assert _lost_kind("", cut="L0", lease_id="L1") == "lease"  # an earlier lease's preemption
    assert _lost_kind("requeued: lease expired (holder lost)", cut=None, lease_id="L1") == "lease"
