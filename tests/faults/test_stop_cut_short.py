"""An endpoint instance leaves the registry only once its process group is gone.

A GPU worker's warm shutdown stops its idle endpoint processes. The endpoint here is a
real process (:mod:`makespan.workers.endpoint_server`) whose child ignores SIGTERM, so
the stop waits the process driver's 5 s grace before its SIGKILL; the worker's SIGTERM
bound (``MAKESPAN_SHUTDOWN_GRACE_S``, 4 s here) ends the worker first, mid-stop. Before,
the worker unregistered the instance before stopping it: cut off, it left the child
running and recorded nowhere, so nothing would ever stop it (its GPU memory leaked). Now
the instance stays registered, ``stopping``, owned by the worker that was stopping it,
and the next worker's start sweep (:func:`makespan.workers.orphans.sweep`) stops what is
left and forgets it.

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
from makespan.shutdown import EXIT_SHUTDOWN_TIMEOUT
from makespan.workers.drivers import get_driver
from makespan.workers.drivers.registry import register_instance
from makespan.workers.orphans import sweep
from tests.live import all_events, wait_for

HOST = "h1"
SHUTDOWN_GRACE_S = 4.0  # below the process driver's 5 s SIGTERM grace: the watchdog cuts the stop short
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


def test_an_endpoint_whose_stop_was_cut_short_stays_registered_until_its_group_is_gone(
        r, keys, settings, tmp_path, killer):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    s = replace(settings, shutdown_grace_s=SHUTDOWN_GRACE_S)
    system = LiveSystem(path, fleet, s, tmp_path / "logs", planners=0, observer=False)
    driver = get_driver("process", log_dir=tmp_path / "endpoints")
    # the set point's endpoint, as a GPU worker of this host registers one it started
    inst = driver.start(fleet.endpoints["stubborn"], [fleet.hosts[0].gpus[0].uuid], time_scale=0.0, host=HOST)
    try:
        children = httpx.get(inst.url + "/health", timeout=10).json()["children"]
        killer.extend([inst.pid, *children])
        assert len(children) == 1
        register_instance(r, keys, inst)
        worker = system.start_gpu_worker(HOST)
        system.wait_workers(90, hosts=[HOST])
        assert r.sismember(keys.instances, inst.id)  # its owner (this test) is alive: the start sweep keeps it

        os.killpg(worker.popen.pid, signal.SIGTERM)  # warm shutdown: stops the idle endpoint, cut off mid-grace
        code = worker.popen.wait(timeout=SHUTDOWN_GRACE_S + 60)
        assert code == EXIT_SHUTDOWN_TIMEOUT, f"the worker was to be cut off mid-stop (log: {worker.log_path})"
        inst.proc.wait(timeout=10)  # the server itself ended on the stop's SIGTERM ...
        assert _alive(children[0])  # ... its child ignored it, and the watchdog ended the stop before SIGKILL

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
