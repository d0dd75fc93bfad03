"""The observer does not start a second copy of an endpoint while the old copy's processes
still hold its GPUs.

An endpoint process died; the observer's recovery stops what is left of it and starts the
endpoint again on the same GPUs. Before, it started the new copy whatever the stop
reported: a process of the old one that outlived SIGKILL (stuck in the GPU driver,
uninterruptible) kept its GPU memory beside the new copy's, and the old record was
unregistered, so nothing would stop it again. Now the recovery fails saying so, starts
nothing, and keeps the old record (``failed``) for the next start phase on its GPUs or the
orphan sweep.

Real Redis, a real endpoint process and the observer's recovery in-process. What no test
can make for real is a process that survives SIGKILL: the driver here is the process
driver, whose real stop ends the endpoint's real processes, reporting a real process (a
``sleep`` this test owns) as the member left after SIGKILL, as the stop reports one stuck
in the GPU driver.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess

import pytest

from makespan.models import load_fleet
from makespan.workers.drivers.base import StopReport
from makespan.workers.drivers.process import ProcessDriver
from makespan.workers.drivers.registry import list_instances, register_instance
from makespan.workers.observer import Observer, list_incidents

FLEET = """
name = "obs-left"
[[hosts]]
name = "host-a"
gpu_count = 1
memory_mib = 81920
[endpoints.coder]
model = "coder-model"
memory_mib_per_gpu = 1000
cold_start_s = 1
evict_s = 1
set_point = [{ host = "host-a", gpus = [0] }]
[endpoints.coder.launch]
driver = "process"
"""


class LeavesOneAfterSigkill(ProcessDriver):
    """The process driver whose stop reports ``stuck_pid`` alive after SIGKILL (see the
    module doc); every instance it starts is kept in ``started`` (the test stops them)."""

    def __init__(self, stuck_pid: int, **kw):
        super().__init__(**kw)
        self.stuck_pid = stuck_pid
        self.started: list = []

    def start(self, *args, **kw):
        inst = super().start(*args, **kw)
        self.started.append(inst)
        return inst

    def stop(self, instance) -> StopReport:
        return dataclasses.replace(super().stop(instance), left=(self.stuck_pid,))


@pytest.fixture
def stuck():
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def test_no_second_copy_starts_while_the_old_ones_processes_are_left(r, keys, tmp_path, stuck):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    real = ProcessDriver(log_dir=tmp_path, grace_s=1.0)
    inst = real.start(fleet.endpoints["coder"], ["GPU-host-a-0"], time_scale=0.01, host="host-a")
    driver = LeavesOneAfterSigkill(stuck.pid, log_dir=tmp_path, grace_s=1.0)
    obs = Observer(r, keys, fleet, probe_interval_s=0.1, _drivers={"process": driver})
    try:
        register_instance(r, keys, inst)
        os.killpg(inst.pid, signal.SIGKILL)  # the endpoint dies
        inst.proc.wait(timeout=10)

        [incident] = obs.probe_once()  # the recovery runs inside the cycle
        assert incident["failure_mode"] == "process_exited"
        [listed] = list_incidents(r, keys)
        recovery = listed["recovery"]

        assert driver.started == [], "a second copy was started beside the old one's processes"
        assert recovery["outcome"].startswith("failed: ") and "outlived SIGKILL" in recovery["outcome"]
        # the old record is kept (failed: not probed again) for a later stop; nothing else is registered
        assert [(i.id, state) for i, state in list_instances(r, keys, with_state=True)] == [(inst.id, "failed")]
    finally:
        obs.close()
        for started in driver.started:
            real.stop(started)
        real.stop(inst)
