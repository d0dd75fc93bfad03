"""Issue 18, failure 5: stopping an endpoint stops its whole process group.

The bundled endpoint server, started by the real process driver, spawns children that
ignore SIGTERM (as vLLM's engine and tensor-parallel workers can outlive their API
server, holding the GPU). ``stop()`` must SIGKILL them after the grace period, leave
the group empty and say what it killed.
"""

from __future__ import annotations

import logging
import os
import signal

import httpx
import pytest

from makespan.models import EndpointSpec, LaunchSpec
from makespan.workers.drivers import get_driver, process_alive
from makespan.workers.drivers.process import group_members

STUBBORN = ("{python}", "-m", "makespan.workers.endpoint_server", "--port", "{port}",
            "--spawn-child-ignoring-sigterm", "2")


def _spec(command) -> EndpointSpec:
    return EndpointSpec(name="engine", model="m", tensor_parallel=1, memory_mib_per_gpu=1000, cold_start_s=1.0,
                        evict_s=1.0, wake_s=1.0, launch=LaunchSpec(driver="process", command=command))


@pytest.fixture
def killer():
    """SIGKILLs any pid a failing test leaves alive (only the pids it was given)."""
    pids: list[int] = []
    yield pids
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_children_ignoring_sigterm_are_killed_and_reported(tmp_path, caplog, killer):
    d = get_driver("process", log_dir=tmp_path, grace_s=0.5)
    inst = d.start(_spec(STUBBORN), ["GPU-x"], time_scale=0.0)
    children = httpx.get(inst.url + "/health", timeout=5).json()["children"]
    killer.extend(children)
    assert len(children) == 2 and set(children) <= set(group_members(inst.pid))
    with caplog.at_level(logging.WARNING, logger="makespan.workers.drivers.process"):
        report = d.stop(inst)
    assert not any(process_alive(c) for c in children), "a child that ignored SIGTERM outlived stop()"
    assert group_members(inst.pid) == []
    assert inst.proc.returncode == 0  # the leader itself ended on SIGTERM
    assert sorted(p for p, _ in report.killed) == sorted(children)
    assert all("signal.SIG_IGN" in cmd for _, cmd in report.killed)
    assert report.terminated == (inst.pid,) and report.left == () and not report.clean
    assert "SIGKILLed" in caplog.text and str(children[0]) in caplog.text
    assert d.stop(inst).killed == ()  # idempotent


def test_a_group_that_ends_on_sigterm_is_reported_clean(tmp_path):
    d = get_driver("process", log_dir=tmp_path, grace_s=2.0)
    inst = d.start(_spec(()), ["GPU-x"], time_scale=0.0)
    report = d.stop(inst)
    assert report.clean and report.terminated == (inst.pid,)
    assert group_members(inst.pid) == []


def test_stop_by_pid_kills_children_too(tmp_path, killer):
    """As after a GPU worker restart: the instance read back from the registry has no
    Popen handle, only the pid."""
    d = get_driver("process", log_dir=tmp_path, grace_s=0.5)
    inst = d.start(_spec(STUBBORN), ["GPU-x"], time_scale=0.0)
    children = httpx.get(inst.url + "/health", timeout=5).json()["children"]
    killer.extend(children)
    proc, inst.proc = inst.proc, None
    report = d.stop(inst)
    proc.wait(timeout=10)
    assert not any(process_alive(c) for c in children)
    assert sorted(p for p, _ in report.killed) == sorted(children)
