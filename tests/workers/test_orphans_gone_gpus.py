"""After a host's GPUs got new UUIDs in the fleet file, `makespan hosts --instances` listed
instances on the old UUIDs for good (6 GPUs' worth on a 4-GPU host), through worker
restarts, and their resident markers and GPU instance sets stayed in Redis (a fleet-change
operator helper): the GPU worker's start sweep skipped simulated instances and kept any a
resident marker named. It now forgets an instance on GPUs its fleet file does not give the
host, simulated or not, with its markers; the others are kept as before. Real Redis."""

from __future__ import annotations

from makespan.workers.drivers.base import Instance
from makespan.workers.drivers.registry import list_instances, register_instance
from makespan.workers.orphans import GONE_GPUS, sweep
from makespan.workers.phases import instance_value


def test_the_start_sweep_forgets_instances_on_gpus_the_fleet_no_longer_gives_the_host(r, keys):
    old = Instance(endpoint="chat", gpus=["GPU-old-0", "GPU-old-1"], driver="simulated", host="host-b")
    kept = Instance(endpoint="embed", gpus=["GPU-new-0"], driver="simulated", host="host-b")
    elsewhere = Instance(endpoint="chat", gpus=["GPU-a-0"], driver="simulated", host="host-a")
    for inst in (old, kept, elsewhere):
        register_instance(r, keys, inst)
        for gpu in inst.gpus:
            r.set(keys.resident(gpu), instance_value(inst.endpoint, inst.gpus))
    handled = sweep(r, keys, "host-b", ["GPU-new-0", "GPU-new-1"])
    assert [(e["instance"], e["reason"], e["action"]) for e in handled] == [(old.id, GONE_GPUS, "forgotten")]
    assert sorted(inst.id for inst in list_instances(r, keys)) == sorted([kept.id, elsewhere.id])
    assert not r.exists(keys.resident("GPU-old-0"), keys.resident("GPU-old-1"), keys.gpu_instances("GPU-old-0"))
    assert r.get(keys.resident("GPU-new-0")) == instance_value("embed", ["GPU-new-0"])
    assert sweep(r, keys, "host-b") == []  # without the fleet's GPUs: simulated instances are not looked at


def test_an_endpoint_process_of_another_unix_user_is_kept_not_taken_for_gone(r, keys, monkeypatch, caplog):
    """A GPU worker restarted as another user (or an observer of another user) could not read
    the endpoint process's /proc/PID/environ, took the live process for gone, forgot it,
    and the next job started a second copy on its GPUs (a production-deployment helper).
    The start sweep keeps the record and the process driver takes the process as running;
    neither signals it. (Another user's /proc/PID/environ is made unreadable for this test's
    process, which runs as root here: the kernel's EACCES for another user.)"""
    import logging
    import subprocess
    from pathlib import Path

    from makespan.workers.drivers import pids
    from makespan.workers.drivers.process import ProcessDriver

    root_process = subprocess.Popen(["sleep", "120"])
    environ = f"/proc/{root_process.pid}/environ"

    class OtherUsersProc(type(Path())):  # the kernel's answer to another user's reader
        def read_bytes(self):
            if str(self) == environ:
                raise PermissionError(13, "Permission denied", environ)
            return super().read_bytes()

    monkeypatch.setattr(pids, "Path", OtherUsersProc)
    try:
        inst = Instance(endpoint="chat", gpus=["GPU-a-0"], driver="process", host="host-a", pid=root_process.pid,
                        owner_pid=2**22 + 7)  # its worker is gone
        register_instance(r, keys, inst)
        assert pids.of_another_user(root_process.pid) and not pids.is_instance_process(root_process.pid, inst.id, [])
        with caplog.at_level(logging.WARNING):
            assert sweep(r, keys, "host-a", ["GPU-a-0"]) == []
            (listed,) = list_instances(r, keys)
            assert ProcessDriver().is_alive(listed)
        assert "belongs to another Unix user" in caplog.text
        assert root_process.poll() is None  # not signalled
        assert listed.id == inst.id
    finally:
        root_process.kill()
        root_process.wait()


def test_a_redis_outage_is_said_once_per_job_not_ten_times_a_second(refused_port, caplog):
    """During a 12 s Redis outage one GPU worker logged 365 lines of `reading its cancel
    request failed` (10 a second per running job; a production-deployment helper)."""
    import logging
    import threading

    import redis

    from makespan.keys import Keys
    from makespan.workers.functions import _read_stop

    from redis.backoff import NoBackoff
    from redis.retry import Retry

    down = redis.Redis(port=refused_port, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    with caplog.at_level(logging.WARNING):
        for _ in range(20):
            assert _read_stop(down, Keys("p"), "job-out", "L1", threading.Event()) == ""
        _read_stop(down, Keys("p"), "job-other", "L2", threading.Event())
    said = [rec.getMessage() for rec in caplog.records if "reading its cancel request failed" in rec.getMessage()]
    assert len(said) == 2 and "job job-out" in said[0] and "job job-other" in said[1], said
