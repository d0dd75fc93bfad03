"""A GPU worker's warm shutdown (SIGTERM) tells a running workload function to stop.

The function loops until ``ctx.cancelled``. Before, nothing set it on shutdown: the
worker's warm shutdown waited for the function until its SIGTERM bound's watchdog ended
the process (exit code 1), the function never told. Now the shutdown sets
``ctx.cancel_reason = "worker_shutdown"`` and ``ctx.cancelled``, the function returns, the
worker ends cleanly (exit code 0), and the job is not lost: its run is given up, the worker
hands its lease back at once (the reclaim's script under the lease's fencing token: no
attempt counted, as for a preemption), and the next worker runs it to the end. Before the hand-back the job
waited for its lease to expire (here 60 s) and the planner's reclaim.

The same with ``--pool prefork``, where the function runs in a pool child: before, the
child never learnt of its parent's shutdown (a SIGTERM to the worker's process group ended
it at once, mid-function; one to the worker alone left the function running until the
watchdog); now it does (:func:`makespan.shutdown.watch_parent_notice`,
:func:`makespan.shutdown.hold_sigterm_during_task`).

Real planner and GPU worker processes loading ``tests.workloads.fns``, real Redis.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from dataclasses import replace

import psutil
import pytest

import makespan
from makespan.live import LiveSystem
from makespan.models import load_fleet
from tests.live import all_events, wait_for

HOST = "h1"
SHUTDOWN_GRACE_S = 20.0  # the watchdog's bound: a function not told to stop is cut off only then
LEASE_TTL_S = 60.0  # far beyond the shutdown: a job requeued when the worker exits was handed back, not reclaimed
FLEET = """
name = "worker-shutdown"
[[hosts]]
name = "h1"
gpu_count = 1
memory_mib = 40000
[endpoints.sim]
model = "sim/model"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
"""


@contextmanager
def _live_system(r, keys, settings, tmp_path, pool: str, extra_env: dict[str, str] | None = None):
    """A planner and one GPU worker (``pool``) loading ``tests.workloads.fns`` with this
    module's shutdown grace and lease TTL; yields (system, client, marks directory)."""
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    marks = tmp_path / "marks"
    marks.mkdir()
    s = replace(settings, workload_modules="tests.workloads.fns", shutdown_grace_s=SHUTDOWN_GRACE_S,
                lease_ttl_s=LEASE_TTL_S)
    system = LiveSystem(path, load_fleet(path), s, tmp_path / "logs", pool=pool, observer=False,
                        extra_env={"MAKESPAN_TEST_MARK_DIR": str(marks), **(extra_env or {})})
    client = makespan.connect(s.redis_url, key_prefix=s.key_prefix)
    try:
        system.start()
        yield system, client, marks
    finally:
        system.stop()
        client.close()


def _started(r, keys, client, system, marks, function: str, *args):
    """Submit ``function(*args)`` once the worker published it, wait until it runs; returns
    (job, the GPU worker's process)."""
    wait_for(lambda: r.exists(keys.fn_live(function)), 30, "the worker to publish its functions")
    job = client.submit(function, *args)
    wait_for(lambda: (marks / f"{job.id}.started").exists(), 60, "the function to start")
    (worker,) = [p for p in system.procs if p.name == f"gpu-{HOST}-0"]
    return job, worker


@pytest.mark.parametrize(("pool", "sigterm_to"), [("threads", "group"), ("prefork", "group"), ("prefork", "parent")])
def test_a_running_function_sees_the_worker_shutdown_and_its_job_is_requeued(r, keys, settings, tmp_path, pool,
                                                                             sigterm_to):
    """``sigterm_to``: "group", the worker's whole process group (as systemd's default
    KillMode and ``LiveSystem.stop`` do: a prefork child gets SIGTERM too, and before
    ended at once, mid-function, its lease left to expire); "parent", the worker's main
    process alone (``docker stop``, Kubernetes, ``kill PID``: a prefork child learns of
    the shutdown only from its parent; before, its function ran on until the watchdog)."""
    with _live_system(r, keys, settings, tmp_path, pool) as (system, client, marks):
        job, worker = _started(r, keys, client, system, marks, "loop_until_told_why")

        if sigterm_to == "group":
            os.killpg(worker.popen.pid, signal.SIGTERM)
        else:
            os.kill(worker.popen.pid, signal.SIGTERM)
        code = worker.popen.wait(timeout=SHUTDOWN_GRACE_S + 60)
        reason_file = marks / f"{job.id}.cancel_reason"
        told = reason_file.read_text().split() if reason_file.exists() else []
        assert told == ["worker_shutdown"], f"the function was not told why it was to stop: {told}"
        assert code == 0, f"the worker's shutdown waited for the function until its watchdog (log: {worker.log_path})"

        # not lost, and not left to the lease's expiry: the worker handed the lease back before it exited
        reclaimed = [e for e in all_events(r, keys) if e["kind"] == "reclaimed" and e.get("job") == job.id]
        assert [(e["outcome"], e.get("cause")) for e in reclaimed] == [("requeued", "worker_shutdown")], \
            f"the job waits for its lease ({LEASE_TTL_S:g} s) to expire: {reclaimed}"
        assert r.hget(keys.job(job.id), "state") == "queued"  # its host has no live worker: the planner waits
        assert r.zcard(keys.leases) == 0 and not r.exists(keys.gpu(system.fleet.hosts[0].gpus[0].uuid))
        assert r.hget(keys.job(job.id), "attempts") == "0"  # a hand-back is no attempt
        assert not r.exists(keys.result(job.id))  # the given-up run stored nothing

        system.procs.remove(worker)
        system.start_gpu_worker(HOST, 1)
        assert job.result(timeout_s=120) == {"resumed_at_attempt": 1}  # the given-up run was no attempt


def test_a_sigterm_to_a_prefork_child_alone_hands_its_job_back_and_the_worker_runs_it_again(r, keys, settings,
                                                                                            tmp_path):
    """SIGTERM to one prefork pool child (not its worker) while its function runs: the
    function is told (``worker_shutdown``: its process ends) and the lease handed back, as
    at the worker's shutdown; the child then ends as the pool's own SIGTERM handler ends it
    (it does not live on with its shutdown set, handing back every later job), the worker,
    not shutting down, forks another, and that one runs the job to the end."""
    with _live_system(r, keys, settings, tmp_path, "prefork") as (system, client, marks):
        job, worker = _started(r, keys, client, system, marks, "loop_until_told_why")
        (child,) = psutil.Process(worker.popen.pid).children()

        child.send_signal(signal.SIGTERM)
        assert job.result(timeout_s=120) == {"resumed_at_attempt": 1}  # the given-up run was no attempt
        assert (marks / f"{job.id}.cancel_reason").read_text().split() == ["worker_shutdown"]
        reclaimed = [e for e in all_events(r, keys) if e["kind"] == "reclaimed" and e.get("job") == job.id]
        assert [(e["outcome"], e.get("cause")) for e in reclaimed] == [("requeued", "worker_shutdown")]
        child.wait(timeout=10)  # ended: not left running with its shutdown set
        assert worker.alive()
        assert [c.pid for c in psutil.Process(worker.popen.pid).children()] != [child.pid]


def test_a_prefork_child_whose_pool_ignores_sigterm_stays_a_worker_after_a_sigterm(r, keys, settings, tmp_path):
    """Celery's ``REMAP_SIGTERM=SIGQUIT`` (its pool children ignore SIGTERM; the worker's
    own SIGTERM is a cold shutdown): a SIGTERM to one child during a job is ignored as the
    pool asks, not held and turned into that child's shutdown. Else the child would live
    on with its shutdown set and hand back every job it gets (a hand-back is no attempt:
    the job would go round for ever)."""
    with _live_system(r, keys, settings, tmp_path, "prefork", {"REMAP_SIGTERM": "SIGQUIT"}) as (system, client, marks):
        first, worker = _started(r, keys, client, system, marks, "sleep_ignoring_cancel", 3)
        (child,) = psutil.Process(worker.popen.pid).children()

        child.send_signal(signal.SIGTERM)
        assert first.result(timeout_s=60) == "slept"  # ignored: the job ran to its end, once
        assert child.is_running() and worker.alive()
        second = client.submit("add", 1, 2)
        assert second.result(timeout_s=30)["sum"] == 3
        reclaimed = [e for e in all_events(r, keys) if e["kind"] == "reclaimed"]
        assert reclaimed == [], f"jobs handed back by a child that is not shutting down: {reclaimed}"


def test_a_function_that_crashes_its_prefork_child_is_requeued_at_once_counting_an_attempt(r, keys, settings,
                                                                                           tmp_path):
    """A hostile-code check: a function that segfaulted its prefork pool child left its lease
    to the TTL (here 60 s) and then a reason that blamed a GPU worker that "stopped renewing
    it", while the worker, alive, had seen its child die (Celery's WorkerLostError). The worker
    now hands the lease back at once, an attempt counted, naming the death; the job's next run
    completes."""
    with _live_system(r, keys, settings, tmp_path, "prefork") as (system, client, marks):
        wait_for(lambda: r.exists(keys.fn_live("crashes_once")), 30, "the worker to publish its functions")
        job = client.submit("crashes_once")
        assert job.result(timeout_s=LEASE_TTL_S - 10) == {"attempt": 2}  # before the lease's TTL
        reclaimed = [e for e in all_events(r, keys) if e["kind"] == "reclaimed" and e.get("job") == job.id]
        assert [(e["outcome"], e.get("cause"), e["attempt_counted"]) for e in reclaimed] == [
            ("requeued", "worker_lost", True)], reclaimed
        assert "signal 11" in reclaimed[0]["error"] and "pool process running it died" in reclaimed[0]["error"]
        (worker,) = [p for p in system.procs if p.name == f"gpu-{HOST}-0"]
        assert worker.alive()
