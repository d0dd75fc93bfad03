"""An endpoint instance leaves the registry only once its process group is gone, and a
GPU worker's shutdown stops it before its SIGTERM bound.

A GPU worker's warm shutdown stops its idle endpoint processes. The endpoint here is a
real process (:mod:`makespan.workers.endpoint_server`) whose child ignores SIGTERM, so
the stop waits for the process driver's grace (5 s) before its SIGKILL.

1. The worker's SIGTERM bound (``MAKESPAN_SHUTDOWN_GRACE_S``, 4 s here as in the Procfile)
   is below that grace. Before, the watchdog ended the worker mid-stop every time (exit
   code 1, the child left running). Now the stop's grace is bounded by the shutdown time
   left: the child is SIGKILLed in time, the instance forgotten, the worker exits 0.
2. A stop cut short all the same (the worker SIGKILLed mid-stop): before, the worker
   unregistered the instance before stopping it, so the child ran on recorded nowhere
   and nothing would ever stop it (its GPU memory leaked). Now the instance stays
   registered, ``stopping``, owned by the worker that was stopping it, and the next
   worker's start sweep (:func:`makespan.workers.orphans.sweep`) stops what is left and
   forgets it.

A real GPU worker process and a real endpoint process; no planner, no observer.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import httpx
import pytest

from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.workers.drivers import get_driver
from makespan.workers.drivers.registry import register_instance
from makespan.workers.orphans import sweep
from tests.live import all_events, wait_for

HOST = "h1"
PROCFILE_GRACE_S = 4.0  # the Procfile's MAKESPAN_SHUTDOWN_GRACE_S: below the process driver's 5 s SIGTERM grace
SHUTDOWN_GRACE_S = 20.0  # beyond that grace: a stop cut short here is the test's SIGKILL of the worker
FLEET = """
name = "stop-cut-short"
[[hosts]]
name = "h1"
gpu_count = 1
memory_mib = 40000
[endpoints.stubborn]
model = "stubborn"
memory_mib_per_gpu = 6000
cold_start_s = 1
evict_s = 600
[endpoints.stubborn.launch]
driver = "process"
health_timeout_s = 60
command = ["{python}", "-m", "makespan.workers.endpoint_server", "--port", "{port}", "--model", "stubborn",
           "--spawn-child-ignoring-sigterm", "1"]
"""


def _alive(pid: int) -> bool:
    """The process runs and is not a zombie (read here, not from the code under test)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def killer():
    """SIGKILLs the pids a failing test leaves alive (only those it was given)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _stubborn_endpoint_and_worker(r, keys, settings, tmp_path, killer, shutdown_grace_s: float):
    """A registered endpoint process of HOST with one SIGTERM-ignoring child, and a GPU
    worker of HOST consuming: ``(system, driver, instance, child pids, worker)``."""
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    s = replace(settings, shutdown_grace_s=shutdown_grace_s)
    system = LiveSystem(path, fleet, s, tmp_path / "logs", planners=0, observer=False)
    driver = get_driver("process", log_dir=tmp_path / "endpoints")
    # the set point's endpoint, as a GPU worker of this host registers one it started
    inst = driver.start(fleet.endpoints["stubborn"], [fleet.hosts[0].gpus[0].uuid], time_scale=0.0, host=HOST)
    children = httpx.get(inst.url + "/health", timeout=10).json()["children"]
    killer.extend([inst.pid, *children])
    assert len(children) == 1
    register_instance(r, keys, inst)
    worker = system.start_gpu_worker(HOST)
    system.wait_workers(90, hosts=[HOST])
    assert r.sismember(keys.instances, inst.id)  # its owner (this test) is alive: the start sweep keeps it
    return system, driver, inst, children, worker


def test_a_worker_shutdown_kills_a_stubborn_endpoint_child_before_its_watchdog(r, keys, settings, tmp_path, killer):
    system, driver, inst, children, worker = _stubborn_endpoint_and_worker(r, keys, settings, tmp_path, killer,
                                                                           PROCFILE_GRACE_S)
    try:
        os.killpg(worker.popen.pid, signal.SIGTERM)  # warm shutdown: stops the idle endpoint
        code = worker.popen.wait(timeout=PROCFILE_GRACE_S + 60)
        assert code == 0, f"the watchdog cut the endpoint's stop short (log: {worker.log_path})"
        inst.proc.wait(timeout=10)  # the server ended on the stop's SIGTERM ...
        assert not _alive(children[0]), "its child, which ignores SIGTERM, outlived the worker's shutdown"
        assert not r.sismember(keys.instances, inst.id) and not r.exists(keys.instance(inst.id))
        assert not r.smembers(keys.gpu_instances(inst.gpus[0]))
    finally:
        system.stop()
        driver.stop(inst)


def test_an_endpoint_whose_stop_was_cut_short_stays_registered_until_its_group_is_gone(
        r, keys, settings, tmp_path, killer):
    system, driver, inst, children, worker = _stubborn_endpoint_and_worker(r, keys, settings, tmp_path, killer,
                                                                           SHUTDOWN_GRACE_S)
    try:
        os.killpg(worker.popen.pid, signal.SIGTERM)  # warm shutdown: stops the idle endpoint ...
        inst.proc.wait(timeout=30)  # ... whose server ends on the stop's SIGTERM, while its child ignores it:
        wait_for(lambda: r.hget(keys.instance(inst.id), "state") == "stopping", 10, "the stop to mark it stopping")
        os.killpg(worker.popen.pid, signal.SIGKILL)  # the stop is cut short within its 5 s grace (a kill -9)
        worker.popen.wait(timeout=30)
        assert _alive(children[0])

        # the child still runs, so the instance is still recorded: stopping, owned by the dead worker
        assert r.sismember(keys.instances, inst.id), "forgotten while a process of its group still runs"
        state, owner = r.hmget(keys.instance(inst.id), "state", "owner_pid")
        assert state == "stopping" and int(owner) == worker.popen.pid

        # the next worker's start sweep finishes the stop
        handled = sweep(r, keys, HOST)
        assert [(e["instance"], e["reason"], e["action"]) for e in handled] == [
            (inst.id, "stopping, its worker is gone", "stopped")]
        assert handled[0]["killed"] == children
        wait_for(lambda: not _alive(children[0]), 10, "the child that ignored SIGTERM to be killed")
        assert not r.sismember(keys.instances, inst.id) and not r.exists(keys.instance(inst.id))
        assert not r.smembers(keys.gpu_instances(inst.gpus[0]))
        assert any(e["kind"] == "endpoint_orphan" and e.get("instance") == inst.id for e in all_events(r, keys))
    finally:
        system.stop()
        driver.stop(inst)
