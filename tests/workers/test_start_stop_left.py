"""A start phase does not start an endpoint beside the processes of a leftover whose stop
left them alive.

The start phase stops the leftovers on its GPUs (instances of a reclaimed lease) before it
starts its endpoint. Before, it started the endpoint whatever the stop reported: a process
of the leftover that outlived SIGKILL (stuck in the GPU driver, uninterruptible) kept its
GPU memory beside the new instance's (the same bug as the observer's recovery, fixed in
78960d3). Now the phase fails saying so (the job goes the normal failure way), starts
nothing, and the leftover's record stays ``stopping`` for the next start phase on its GPUs
or the orphan sweep.

Real Redis, a real endpoint process as the leftover, the phases in-process. What no test
can make for real is a process that survives SIGKILL: the driver the phase runner gets is
the process driver, whose real stop ends the leftover's real processes, reporting a real
process (a ``sleep`` this test owns) as the member left after SIGKILL, as
tests/workers/test_observer_stop_left.py does.
"""

from __future__ import annotations

import dataclasses
import subprocess
import uuid

import pytest

from makespan.driver_registry import DriverContext, no_wait
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.drivers.base import StopReport
from makespan.workers.drivers.process import ProcessDriver
from makespan.workers.drivers.registry import list_instances, register_instance
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner

GPU = "GPU-host-a-0"
FLEET = {
    "name": "start-left",
    "hosts": [{"name": "host-a", "gpu_count": 1, "memory_mib": 81920}],
    "endpoints": {"coder": {"model": "coder-model", "memory_mib_per_gpu": 1000, "cold_start_s": 1, "evict_s": 1,
                            "launch": {"driver": "process"}}},
}


class LeavesOneAfterSigkill(ProcessDriver):
    """The process driver whose stop reports ``stuck_pid`` alive after SIGKILL (see the
    module doc); every instance it starts is kept in ``started`` (the test stops them)."""

    def __init__(self, stuck_pid: int, started: list, **kw):
        super().__init__(**kw)
        self.stuck_pid, self.started = stuck_pid, started

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


def test_no_endpoint_starts_beside_a_leftovers_processes_that_outlived_sigkill(r, keys, settings, tmp_path,
                                                                              monkeypatch, stuck):
    monkeypatch.setenv("MAKESPAN_LOG_DIR", str(tmp_path))
    fleet = parse_fleet(FLEET)
    r.set(keys.fleet, fleet.model_dump_json())
    real = ProcessDriver(log_dir=tmp_path, grace_s=1.0)
    leftover = real.start(fleet.endpoints["coder"], [GPU], time_scale=0.01, host="host-a")
    started: list = []
    try:
        register_instance(r, keys, leftover)  # running, resident nowhere: a reclaimed lease's leftover
        job_id = Producer(r, keys, fleet, settings).submit({"endpoint": "coder", "service_s": 10}).id
        priority = r.hget(keys.job(job_id), "priority")
        lease_id = uuid.uuid4().hex
        lease = LeaseStore(r, keys).acquire(lease_id, (GPU,), settings.lease_ttl_s, job_id=job_id, kind="job",
                                            holder="host-a", queue=keys.queue(priority))
        assert lease is not None
        ctx = PhaseContext(lease_id, lease.token, [GPU], "host-a", "job", "coder", job_id, priority, 10.0)
        runner = PhaseRunner(r, settings, fleet)

        def driver(name, wait=no_wait, pause=None):
            assert name == "process", name
            return LeavesOneAfterSigkill(stuck.pid, started, log_dir=tmp_path, grace_s=1.0,
                                         context=DriverContext(fleet.endpoints, {}, wait, pause))

        monkeypatch.setattr(runner, "_driver", driver)
        assert runner.run(ctx, "evict") == "done"

        outcome = runner.run(ctx, "start_endpoint")

        assert started == [], "the endpoint was started beside the leftover's processes"
        assert outcome == "retried"  # a failed start: requeued, an attempt counted (it may go to other GPUs)
        record = r.hgetall(keys.job(job_id))
        assert record["state"] == "queued" and record["attempts"] == "1", record
        assert record["reason"].startswith("requeued: its endpoint failed to start (attempt 1 of 3): start_endpoint: ")
        assert "outlived SIGKILL" in record["reason"] and str(stuck.pid) in record["reason"], record
        # the leftover's record is kept for a later stop; nothing else is registered
        assert [(i.id, state) for i, state in list_instances(r, keys, with_state=True)] == [(leftover.id, "stopping")]
        assert not r.exists(keys.lease(lease_id)) and not r.exists(keys.gpu(GPU))  # the lease ended with the job
    finally:
        for inst in started:
            real.stop(inst)
        real.stop(leftover)
