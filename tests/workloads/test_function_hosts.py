"""A job of a workload function runs only on the hosts whose GPU worker registers it: with
host-a's worker on the old code and host-b's on the new, 6 of 8 jobs of the new function
were placed on host-a and failed for good (``makespan.UnknownWorkload``, workload-author
new user). Each GPU worker marks its fleet host for the names it registers
(``P:fn:hosts:{name}``) and the planner places the name's jobs there. Real planner and GPU
worker processes on real Redis."""

from __future__ import annotations

import contextlib
import signal
import uuid

import pytest

import makespan
from makespan.keys import Keys
from makespan.live import LiveSystem, delete_prefix, wait_for
from makespan.models import load_fleet
from makespan.redis_conn import connect
from makespan.registry import function_hosts

FLEET = """
name = "function-hosts-test"

[[hosts]]
name = "host-a"
gpu_count = 2
memory_mib = 81920

[[hosts]]
name = "host-b"
gpu_count = 1
memory_mib = 81920

[endpoints.sim]
model = "sim"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
"""


@contextlib.contextmanager
def _live(redis_url, tmp_path, monkeypatch, modules: str, modules_b: str | None = None, ready=None):
    """A planner and a GPU worker per host (``modules``; host-b ``modules_b`` when given) on a
    private key prefix; yields (the LiveSystem, a client) once ``ready(client)`` holds."""
    fleet_path = tmp_path / "fleet.toml"
    fleet_path.write_text(FLEET)
    prefix = f"mst-fh-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("MAKESPAN_REDIS_URL", redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", prefix)
    settings = makespan.settings.Settings(redis_url=redis_url, key_prefix=prefix, time_scale=0.01,
                                          workload_modules=modules)
    live = LiveSystem(fleet_path, load_fleet(fleet_path), settings, tmp_path / "logs", observer=False)
    client = makespan.connect(redis_url, key_prefix=prefix, fleet=fleet_path)
    try:
        live.start_gpu_worker("host-a")
        live.start_gpu_worker("host-b", env_extra={"MAKESPAN_WORKLOADS": modules_b} if modules_b else None)
        live.start_planner()
        live.wait_workers(90)
        wait_for(lambda: ready(client), 30, "the workers to publish their functions")
        yield live, client
    finally:
        live.stop()
        client.close()
        r = connect(redis_url)
        delete_prefix(r, Keys(prefix))
        r.close()


@pytest.fixture
def system(redis_url, tmp_path, monkeypatch):
    with _live(redis_url, tmp_path, monkeypatch, "tests.workloads.fns", "tests.workloads.fns,tests.workloads.fns_only_b",
               ready=lambda client: client.r.exists(client.keys.fn_live("only_b"))) as (_live_system, client):
        yield client


@pytest.fixture
def system_pair(redis_url, tmp_path, monkeypatch):
    with _live(redis_url, tmp_path, monkeypatch, "tests.workloads.fns", "tests.workloads.fns,tests.workloads.fns_only_b",
               ready=lambda client: client.r.exists(client.keys.fn_live("only_b"))) as pair:
        yield pair


def test_a_function_one_host_registers_runs_there_only(system):
    client = system
    assert function_hosts(client.r, client.keys, "only_b") == ("host-b",)
    assert function_hosts(client.r, client.keys, "add") == ("host-a", "host-b")
    jobs = [client.submit("only_b", n) for n in range(8)]
    others = [client.submit("add", n, 1) for n in range(4)]  # registered on both: any host
    results = [job.result(timeout_s=120) for job in jobs]
    assert [r["n"] for r in results] == list(range(8))
    assert {r["host"] for r in results} == {"host-b"}
    assert all(job.status()["attempts"] == 1 for job in jobs)
    assert [job.result(timeout_s=120)["sum"] for job in others] == [1, 2, 3, 4]
    # CRITICAL jobs go through the planner's critical lane, which places them itself
    urgent = [client.submit("only_b", 100 + n, priority="CRITICAL") for n in range(3)]
    assert {job.result(timeout_s=120)["host"] for job in urgent} == {"host-b"}


@pytest.fixture
def two_hosts_with_only_b(redis_url, tmp_path, monkeypatch):
    with _live(redis_url, tmp_path, monkeypatch, "tests.workloads.fns,tests.workloads.fns_only_b",
               ready=lambda client: function_hosts(client.r, client.keys, "only_b") == ("host-a", "host-b")) as pair:
        yield pair


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["clean-stop", "crash"])
def test_a_host_restarted_without_a_function_gets_none_of_its_jobs(two_hosts_with_only_b, stop_signal):
    live, client = two_hosts_with_only_b
    for proc in live.kill("gpu-host-b-0", stop_signal):
        proc.popen.wait(timeout=60)
        live.procs.remove(proc)  # stopped on purpose (wait_workers fails on a dead worker)
    live.start_gpu_worker("host-b", n=1, env_extra={"MAKESPAN_WORKLOADS": "tests.workloads.fns"})
    live.wait_workers(90)
    jobs = [client.submit("only_b", n) for n in range(8)]
    results = [job.result(timeout_s=120) for job in jobs]
    assert [result["n"] for result in results] == list(range(8))
    assert {result["host"] for result in results} == {"host-a"}
    assert all(job.status()["attempts"] == 1 for job in jobs)


def test_a_function_moved_by_restarting_its_old_host_first_waits_for_the_new_one(system_pair):
    """A deploy moves ``only_b`` from host-b to host-a, restarting host-b (without it) first:
    host-b's queued jobs of it failed there with makespan.UnknownWorkload (last stop's note).
    Now they wait, unplanned, with reason ``waiting_for_function``, and run on host-a once
    its worker registers the function; no attempt is used up."""
    live, client = system_pair
    jobs = [client.submit("only_b", n, delay_s=4) for n in range(4)]  # queued in 4 s
    for proc in live.kill("gpu-host-b-0", signal.SIGKILL):
        proc.popen.wait(timeout=60)
        live.procs.remove(proc)
    live.start_gpu_worker("host-b", n=1, env_extra={"MAKESPAN_WORKLOADS": "tests.workloads.fns"})
    live.wait_workers(90)
    wait_for(lambda: all(job.status().get("wait_reason") == "waiting_for_function" for job in jobs), 60,
             "the jobs to wait for a worker with their function")
    assert all(job.status()["state"] == "queued" for job in jobs)
    assert "host-b" in jobs[0].status()["wait_detail"]
    for proc in live.kill("gpu-host-a-0", signal.SIGTERM):
        proc.popen.wait(timeout=60)
        live.procs.remove(proc)
    live.start_gpu_worker("host-a", n=1,
                          env_extra={"MAKESPAN_WORKLOADS": "tests.workloads.fns,tests.workloads.fns_only_b"})
    results = [job.result(timeout_s=120) for job in jobs]
    assert [result["n"] for result in results] == list(range(4))
    assert {result["host"] for result in results} == {"host-a"}
    assert all(job.status()["attempts"] == 1 for job in jobs)
