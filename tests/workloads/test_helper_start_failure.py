"""A job with two helper endpoints whose second helper never comes up (found by a review):
its start fails, or the job is cancelled while it starts. The first helper was started and
registered on the job's GPU, but the phase recorded the helpers it started only after the
last one, so the job's end (failed or cancelled, no clear phase) stopped none of them: a real
endpoint process ran on, holding GPU memory, with no lease, no resident marker and no job.
Only a later cold start on that GPU would have stopped it; a warm job of the same main
endpoint never does.

The GPU worker's phase code (``run_phases``) on the real Redis, with a real endpoint process
(the bundled endpoint server) as the first helper.
"""

from __future__ import annotations

import sys
import threading
import time
import tomllib

import pytest

import makespan
from makespan.client import Client
from makespan.models import fleet_version, parse_fleet
from makespan.registry import publish
from makespan.workers.drivers.process import process_alive
from makespan.workers.drivers.registry import instances_on
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner
from makespan.workers.warm import run_phases

GPU = "GPU-hh-0"
FLEET = """
name = "helpers"
[[hosts]]
name = "hh"
gpu_count = 1
memory_mib = 80000
[endpoints.main]
model = "main"
memory_mib_per_gpu = 10000
cold_start_s = 1
evict_s = 1
[endpoints.one]
model = "one"
memory_mib_per_gpu = 10000
cold_start_s = 1
evict_s = 1
launch = {{ driver = "process", health_timeout_s = 60, command = ["{python}", "-m", "makespan.workers.endpoint_server", "--port", "{{port}}", "--model", "{{model}}"] }}
[endpoints.two]
model = "two"
memory_mib_per_gpu = 10000
cold_start_s = {two_cold_start_s}
evict_s = 1
{two_launch}
"""


@makespan.workload(endpoint="main", helpers=("one", "two"), name="tests.two_helpers")
def two_helpers(ctx):
    return "ran"


@pytest.mark.parametrize("how", ["second_helper_fails", "cancelled_while_second_starts"])
def test_a_job_whose_second_helper_never_starts_leaves_no_helper_running(r, keys, settings, how):
    if how == "second_helper_fails":  # a process that exits before its health check
        two = dict(two_cold_start_s=1, two_launch='launch = { driver = "process", command = ["false"], '
                                                  'health_timeout_s = 30 }')
    else:  # simulated: a 20 s (wall) cold start, cut short by the cancel
        two = dict(two_cold_start_s=2000, two_launch="")
    fleet = parse_fleet(tomllib.loads(FLEET.format(python=sys.executable, **two)))
    r.mset({keys.fleet: fleet.model_dump_json(), keys.fleet_version: fleet_version(fleet)})
    publish(r, keys, [two_helpers], holder="test")
    client = Client(r, settings)
    job = client.submit("tests.two_helpers")
    lease = LeaseStore(r, keys).acquire("L1", (GPU,), settings.lease_ttl_s, job_id=job.id, kind="job",
                                        holder="hh", queue=keys.queue("NORMAL"))
    assert lease is not None
    ctx = PhaseContext("L1", lease.token, [GPU], "hh", "job", "main", job.id, "NORMAL", 1.0)

    seen: dict = {}

    def cancel_once_one_runs() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ones = [i for i in instances_on(r, keys, [GPU]) if i.endpoint == "one"]
            if ones:
                seen["one"] = ones[0]
                if how == "cancelled_while_second_starts":
                    time.sleep(0.3)  # into two's start
                    client.job(job.id).cancel()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=cancel_once_one_runs, daemon=True)
    watcher.start()
    runner = PhaseRunner(r, settings, fleet)
    try:
        outcome = run_phases(runner, ctx)
        watcher.join(10)
        # a failed start gives the lease back counting an attempt: the job is queued again
        assert outcome == ("retried" if how == "second_helper_fails" else "cancelled")
        assert job.status()["state"] == ("queued" if how == "second_helper_fails" else "cancelled")
        one = seen["one"]
        left = [(i.endpoint, i.id) for i in instances_on(r, keys, [GPU]) if i.endpoint != "main"]
        assert left == [], f"helpers still registered on {GPU} after the job ended: {left}"
        deadline = time.monotonic() + 10
        while process_alive(one.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_alive(one.pid), f"helper 'one' (pid {one.pid}) still runs"
        assert not r.exists(keys.lease("L1")) and not r.exists(keys.gpu(GPU))
    finally:  # whatever the outcome, no endpoint process of this test outlives it
        for inst in instances_on(r, keys, [GPU]):
            runner._stop_instance(inst)
