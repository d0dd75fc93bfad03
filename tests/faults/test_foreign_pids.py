"""An instance record names a pid; nothing is signalled unless that pid runs the endpoint
process spawned for the instance (a security review: a record written into Redis made the
GPU worker's orphan sweep kill any process the worker could signal, e.g. ``sleep`` in
another session; after a host reboot, with Redis's records kept, a reused pid does the
same by accident). Real processes, real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from makespan.workers import orphans
from makespan.workers.drivers import get_driver
from makespan.workers.drivers.base import Instance
from makespan.workers.drivers.pids import INSTANCE_ENV, is_instance_process, process_alive
from makespan.workers.drivers.registry import list_instances, register_instance

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")


@pytest.fixture
def foreign():
    """A process in a session of its own that no makespan driver spawned (no marker, no GPUs)."""
    env = {k: v for k, v in os.environ.items() if k not in (INSTANCE_ENV, "CUDA_VISIBLE_DEVICES")}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env, start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _spawned(instance_id: str, gpus: str):
    env = {**os.environ, INSTANCE_ENV: instance_id, "CUDA_VISIBLE_DEVICES": gpus}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env, start_new_session=True)


def test_identity_is_read_from_the_process_environment(foreign):
    mine = _spawned("abc123", "GPU-a")
    legacy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                              env={**{k: v for k, v in os.environ.items() if k != INSTANCE_ENV},
                                   "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"})
    try:
        time.sleep(0.2)
        assert is_instance_process(mine.pid, "abc123", ["GPU-a"])
        assert not is_instance_process(mine.pid, "other", ["GPU-a"])
        # spawned by a version before the marker: its GPUs tell
        assert is_instance_process(legacy.pid, "any", ["GPU-a", "GPU-b"])
        assert not is_instance_process(legacy.pid, "any", ["GPU-c"])
        assert not is_instance_process(foreign.pid, "abc123", ["GPU-a"])
    finally:
        for proc in (mine, legacy):
            proc.kill()
            proc.wait()
    assert is_instance_process(mine.pid, "abc123", ["GPU-a"])  # nothing runs there: nothing to mistake


def test_the_driver_neither_signals_nor_counts_alive_a_foreign_pid(foreign):
    inst = Instance("chat", ["GPU-h-0"], "process", host="h", pid=foreign.pid, id="deadbeef0001")
    driver = get_driver("process")
    assert driver.is_alive(inst) is False  # its own process is gone: the pid runs another program
    report = driver.stop(inst)
    assert report.killed == () and foreign.poll() is None and process_alive(foreign.pid)


def test_the_orphan_sweep_forgets_a_record_naming_a_foreign_pid(r, keys, foreign):
    inst = Instance("chat", ["GPU-h-0"], "process", host="h", pid=foreign.pid, id="deadbeef0002",
                    owner_pid=999_999_999, url="http://127.0.0.1:1", port=1)
    register_instance(r, keys, inst, "starting")
    events = orphans.sweep(r, keys, "h")
    assert foreign.poll() is None, "the sweep killed a process it did not spawn"
    assert [e.get("action") for e in events] == ["forgotten"] and list_instances(r, keys) == []


def test_an_endpoint_process_gets_its_instance_marker_and_no_makespan_settings(monkeypatch, tmp_path):
    """The endpoint's environment carries its instance id (what the identity check reads)
    and none of makespan's settings: MAKESPAN_REDIS_URL holds the Redis password, and a model
    server running model code read it (security review)."""
    from makespan.models import EndpointSpec, LaunchSpec

    monkeypatch.setenv("MAKESPAN_REDIS_URL", "redis://:S3cr3t@127.0.0.1:6379/0")
    monkeypatch.setenv("HF_HOME", "/data/hf")  # the operator's own variables still reach the endpoint
    spec = EndpointSpec(name="chat", model="m", memory_mib_per_gpu=1000, cold_start_s=1.0, evict_s=1.0,
                        launch=LaunchSpec(driver="process"))
    driver = get_driver("process", log_dir=tmp_path, grace_s=2.0)
    inst = driver.start(spec, ["GPU-x"], time_scale=0.01)
    try:
        env = dict(item.split(b"=", 1) for item in open(f"/proc/{inst.pid}/environ", "rb").read().split(b"\0")
                   if b"=" in item)
        assert env[INSTANCE_ENV.encode()] == inst.id.encode()
        assert not [k for k in env if k.startswith(b"MAKESPAN_") and k != INSTANCE_ENV.encode()], sorted(env)
        assert env[b"HF_HOME"] == b"/data/hf" and env[b"CUDA_VISIBLE_DEVICES"] == b"GPU-x"
        assert driver.is_alive(inst)
    finally:
        driver.stop(inst)


@pytest.fixture
def orphaned_session():
    """Another program's daemon: its session leader (a process of its own session) forked it
    and exited, so it runs in a session whose id is the dead leader's pid. Yields (dead
    leader pid, daemon pid)."""
    leader = subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                               "child = os.fork()\n"
                               "if child:\n    print(child, flush=True)\n    os._exit(0)\n"
                               "time.sleep(600)\n"],
                              env={k: v for k, v in os.environ.items() if k not in (INSTANCE_ENV, "CUDA_VISIBLE_DEVICES")},
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
    daemon = int(leader.stdout.readline())
    leader.wait()
    yield leader.pid, daemon
    try:
        os.kill(daemon, 9)
    except ProcessLookupError:
        pass


def test_a_record_naming_the_dead_leader_of_another_session_signals_nothing(r, keys, orphaned_session):
    """A verifier: a record naming a daemon's dead session leader killed the daemon (the
    stop signalled the whole session)."""
    leader, daemon = orphaned_session
    assert not process_alive(leader) and process_alive(daemon)
    inst = Instance("chat", ["GPU-h-0"], "process", host="h", pid=leader, id="deadbeef0003")
    report = get_driver("process").stop(inst)
    assert process_alive(daemon) and report.killed == () and report.terminated == ()
    register_instance(r, keys, Instance("chat", ["GPU-h-0"], "process", host="h", pid=leader, id="deadbeef0004",
                                        owner_pid=999_999_999, url="http://127.0.0.1:1", port=1), "stopping")
    assert [e.get("action") for e in orphans.sweep(r, keys, "h")] == ["forgotten"]
    assert process_alive(daemon)


def test_a_record_with_no_gpus_names_no_process(r, keys, foreign):
    """A verifier: with ``gpus: []`` the older spawns' rule (CUDA_VISIBLE_DEVICES equal to the
    record's GPUs) matched any process without the variable ("" == "")."""
    assert not is_instance_process(foreign.pid, "any", [])
    inst = Instance("chat", [], "process", host="h", pid=foreign.pid, id="deadbeef0005", owner_pid=999_999_999,
                    url="http://127.0.0.1:1", port=1)
    register_instance(r, keys, inst, "starting")
    orphans.sweep(r, keys, "h")
    assert foreign.poll() is None
