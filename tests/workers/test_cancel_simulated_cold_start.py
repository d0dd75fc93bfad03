"""A cancel cuts a simulated cold start short: an endpoint without a server (the
``simulated`` driver) models its cold start as a wait of ``cold_start_s`` × the time scale,
and that wait watched only the lease, not the job's cancel, so a job cancelled during it
held its GPUs to the end of the wait. Now the wait watches the signal execute watches
(``cancel_requested``): the job ends ``cancelled`` and its lease is released within
moments (found by a new-user trial; fails on the code before).

A live system (planner and GPU worker as real processes) on the test's key prefix."""
from __future__ import annotations

import dataclasses
import time

from makespan.live import wait_for
from makespan.producer import Producer
from tests.faults.private_redis import live_system

COLD_START_S = 6000  # workload s: 60 wall s at the test settings' time scale of 0.01
FLEET = f"""
name = "slow-start"
[[hosts]]
name = "h1"
gpu_count = 1
memory_mib = 40000
[endpoints.sim]
model = "sim/model"
memory_mib_per_gpu = 20000
cold_start_s = {COLD_START_S}
evict_s = 1
"""


def test_a_cancel_during_a_simulated_cold_start_releases_the_gpus_at_once(r, keys, settings, tmp_path):
    s = dataclasses.replace(settings, lease_ttl_s=10.0)  # the lease could not simply lapse within the bound
    with live_system(tmp_path, s, FLEET, observer=False) as (system, fleet):
        gpu = fleet.hosts[0].gpus[0].uuid
        prod = Producer(r, keys, fleet, system.settings)
        job = prod.submit({"endpoint": "sim", "service_s": 1}).id
        lease = wait_for(lambda: r.hget(keys.job(job), "lease"), 60, "the job's lease")
        wait_for(lambda: r.hget(keys.phase(lease), "start_endpoint:claimed"), 60, "its cold start to begin")
        time.sleep(0.5)  # well inside the 60 s wait

        t0 = time.monotonic()
        assert prod.cancel(job) == "cancel_requested"
        wait_for(lambda: r.hget(keys.job(job), "state") == "cancelled", 20, "the job to end cancelled")
        took_s = time.monotonic() - t0

        assert took_s < 5.0, f"{took_s:.1f} s from the cancel to the end of a 60 s cold start"
        assert "start_endpoint: cancelled" in (r.hget(keys.job(job), "reason") or "")
        # the lease was released the normal way: the GPU is free, the lease forgotten
        assert not r.exists(keys.gpu(gpu)) and not r.exists(keys.lease(lease))
        assert r.zscore(keys.leases, lease) is None
        assert not r.exists(keys.resident(gpu))  # nothing half-started is left resident


def test_a_cancel_during_a_simulated_execute_ends_the_job_at_once(r, keys, settings, tmp_path):
    """A job with no function nor requests (its execute is a sleep of ``service_s`` × the time
    scale) cancelled mid-execute ends ``cancelled`` within moments; before, the sleep watched
    only the lease, and the job ran to the end and *completed* (found by a new-user trial:
    ``makespan cancel`` printed cancel_requested and nothing else happened)."""
    fleet_text = FLEET.replace(f"cold_start_s = {COLD_START_S}", "cold_start_s = 1")
    with live_system(tmp_path, settings, fleet_text, observer=False) as (system, fleet):
        gpu = fleet.hosts[0].gpus[0].uuid
        prod = Producer(r, keys, fleet, system.settings)
        job = prod.submit({"endpoint": "sim", "service_s": 6000}).id  # 60 wall s
        lease = wait_for(lambda: r.hget(keys.job(job), "lease"), 60, "the job's lease")
        wait_for(lambda: r.hget(keys.phase(lease), "execute:claimed"), 60, "its execute to begin")
        time.sleep(0.5)  # well inside the 60 s execute

        t0 = time.monotonic()
        assert prod.cancel(job) == "cancel_requested"
        wait_for(lambda: r.hget(keys.job(job), "state") in ("cancelled", "completed"), 30, "the job to end")
        took_s = time.monotonic() - t0
        assert r.hget(keys.job(job), "state") == "cancelled"
        assert took_s < 5.0, f"{took_s:.1f} s from the cancel to the end of a 60 s execute"
        assert "execute: cancelled while waiting" in (r.hget(keys.job(job), "reason") or "")
        wait_for(lambda: not r.exists(keys.gpu(gpu)), 10, "the GPU to be released")


def test_a_cancel_during_a_real_cold_start_stops_the_process_and_releases_the_gpus(r, keys, settings, tmp_path):
    """The same for an endpoint that is a real process (the bundled endpoint server, its
    health check failing for its 300 wall s load): the cancel used to wait for the health
    check to pass (or time out) before the job ended; now the probe pauses watch the
    cancel, the process group is stopped and forgotten, and the lease is released."""
    import sys

    from makespan.workers.drivers.pids import process_alive

    fleet_text = FLEET.replace(f"cold_start_s = {COLD_START_S}", "cold_start_s = 30000").replace(
        "evict_s = 1", 'evict_s = 1\nlaunch = { driver = "process", health_timeout_s = 600, command = '
        f'["{sys.executable}", "-m", "makespan.workers.endpoint_server", "--port", "{{port}}", "--model", '
        '"{model}", "--load-time-s", "{load_time_s}"] }')
    s = dataclasses.replace(settings, lease_ttl_s=60.0)  # the lease could not simply lapse within the bound
    with live_system(tmp_path, s, fleet_text, observer=False) as (system, fleet):
        gpu = fleet.hosts[0].gpus[0].uuid
        prod = Producer(r, keys, fleet, system.settings)
        job = prod.submit({"endpoint": "sim", "service_s": 1}).id
        lease = wait_for(lambda: r.hget(keys.job(job), "lease"), 60, "the job's lease")
        pid = int(wait_for(lambda: next((r.hget(keys.instance(i), "pid") for i in r.smembers(keys.instances)), None),
                           60, "the endpoint process to be spawned and tracked"))
        assert process_alive(pid)
        wait_for(lambda: r.hget(keys.phase(lease), "start_endpoint:claimed"), 60, "its cold start to begin")

        t0 = time.monotonic()
        assert prod.cancel(job) == "cancel_requested"
        wait_for(lambda: r.hget(keys.job(job), "state") == "cancelled", 120, "the job to end cancelled")
        took_s = time.monotonic() - t0

        assert took_s < 60.0, f"{took_s:.1f} s from the cancel to the end of a 300 s cold start"
        assert "start_endpoint: cancelled" in (r.hget(keys.job(job), "reason") or "")
        wait_for(lambda: not process_alive(pid), 30, "the endpoint process to be stopped")
        assert not r.exists(keys.gpu(gpu)) and not r.exists(keys.lease(lease))
        assert not r.exists(keys.resident(gpu))
        assert r.scard(keys.instances) == 0  # forgotten, not left 'starting'
