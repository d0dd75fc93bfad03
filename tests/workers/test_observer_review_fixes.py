"""The health observer's recovery (found by a review, 2026-12-04): each test fails on the
code before its fix. In-process observer cycles on the real Redis, real processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from makespan.models import parse_fleet
from makespan.workers.drivers.base import Instance
from makespan.workers.drivers.registry import instances_on, list_instances, register_instance
from makespan.workers.observer import Observer
from makespan.workers.phases import instance_value

GPU = "GPU-h1-0"


def _fleet(command: list[str]):
    return parse_fleet({"name": "observer-fixes", "hosts": [{"name": "h1", "gpu_count": 1, "memory_mib": 81920}],
                        "endpoints": {"coder": {"model": "m/coder", "memory_mib_per_gpu": 1000, "cold_start_s": 1,
                                                "evict_s": 1, "set_point": [{"host": "h1", "gpus": [0]}],
                                                "launch": {"driver": "process", "command": command,
                                                           "health_timeout_s": 1.0}}}})


NEVER_HEALTHY = [sys.executable, "-c", "import time; time.sleep(60)"]


def _crashed(r, keys, machine: str = "", endpoint: str = "coder") -> Instance:
    """A registered process instance whose process is gone (its pid exited)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    inst = Instance(endpoint, [GPU], "process", host="h1", time_scale=0.01, url="http://127.0.0.1:9", port=9,
                    pid=gone.pid, owner_pid=gone.pid, machine=machine)
    register_instance(r, keys, inst)
    r.set(keys.resident(GPU), instance_value(endpoint, [GPU]))
    return inst


def _cycle(r, keys, fleet, cycles: int = 1) -> list[dict]:
    observer = Observer(r, keys, fleet)
    try:
        return [incident for _ in range(cycles) for incident in observer.probe_once()]
    finally:
        observer.close()


def test_a_process_endpoint_of_another_machine_is_neither_probed_nor_restarted(r, keys, tmp_path, monkeypatch):
    """Its url is that machine's loopback and its pid that machine's: the observer (compose
    runs it in its own container) raised an incident, signalled whatever local process had
    that pid, and started the endpoint on its own machine."""
    monkeypatch.setenv("MAKESPAN_LOG_DIR", str(tmp_path))
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        remote = Instance("coder", [GPU], "process", host="h1", time_scale=0.01, url="http://127.0.0.1:9", port=9,
                          pid=bystander.pid, owner_pid=bystander.pid, machine="another-machine")
        register_instance(r, keys, remote)
        assert _cycle(r, keys, _fleet(NEVER_HEALTHY), cycles=2) == []
        assert bystander.poll() is None  # not signalled
        assert [i.id for i in list_instances(r, keys)] == [remote.id]
    finally:
        bystander.kill()
        bystander.wait()


def test_a_failed_restart_drops_the_warm_marker_and_leaves_no_process(r, keys, tmp_path, monkeypatch):
    """A failed restart left the GPU's resident marker naming the dead endpoint (jobs were
    then sent there as to a warm endpoint and failed for good), and the spawned process was
    registered only once healthy (an observer killed during its health check left a process
    nothing tracked)."""
    monkeypatch.setenv("MAKESPAN_LOG_DIR", str(tmp_path))
    crashed = _crashed(r, keys)
    seen_starting: list[str] = []
    cycled = threading.Event()

    def watch() -> None:  # for the whole cycle (a fixed 5 s could end before a loaded machine's spawn)
        deadline = time.monotonic() + 120  # a bound on a hang only
        while time.monotonic() < deadline and not seen_starting and not cycled.is_set():
            seen_starting.extend(i.id for i, st in instances_on(r, keys, [GPU], with_state=True) if st == "starting")
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        [incident] = _cycle(r, keys, _fleet(NEVER_HEALTHY))
    finally:
        cycled.set()
        watcher.join()
    assert incident["failure_mode"] == "process_exited"
    assert seen_starting and seen_starting[0] != crashed.id  # tracked from its spawn
    assert [(i.id, st) for i, st in instances_on(r, keys, [GPU], with_state=True)] == [(crashed.id, "failed")]
    assert r.get(keys.resident(GPU)) is None


def test_an_endpoint_on_leased_gpus_is_not_restarted_beside_the_lease(r, keys, tmp_path, monkeypatch):
    """The restart took no lease: a job leased onto the GPU meanwhile ended up beside a
    second model. With the GPUs leased the observer leaves them to the lease's holder."""
    monkeypatch.setenv("MAKESPAN_LOG_DIR", str(tmp_path))
    crashed = _crashed(r, keys)
    r.set(keys.gpu(GPU), "a-lease:7")
    [incident] = _cycle(r, keys, _fleet(NEVER_HEALTHY))
    assert incident["failure_mode"] == "process_exited"
    assert [(i.id, st) for i, st in instances_on(r, keys, [GPU], with_state=True)] == [(crashed.id, "failed")]
    assert r.get(keys.resident(GPU)) is None
    recovery = [e for _, e in r.xrange(keys.incidents) if e.get("kind") == "recovery"]
    assert recovery and recovery[-1]["outcome"].startswith("not restarted: its GPUs are leased")
    # the lease's job loads the endpoint again (its start phase): the incident, left "not
    # restarted" for good before (llama-swap user's check), is closed as recovered
    from makespan.workers.observer import list_incidents

    assert list_incidents(r, keys)[-1]["recovery"]["outcome"].startswith("not restarted")
    r.delete(keys.gpu(GPU))
    healthy = subprocess.Popen([sys.executable, "-m", "makespan.workers.endpoint_server", "--port", "0", "--model",
                                "m/coder"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        back = Instance("coder", [GPU], "process", host="h1", time_scale=0.01, url="http://127.0.0.1:9", port=9,
                        pid=healthy.pid, owner_pid=healthy.pid)
        register_instance(r, keys, back)
        observer = Observer(r, keys, _fleet(NEVER_HEALTHY))
        try:
            observer._close_given_up()
        finally:
            observer.close()
    finally:
        healthy.kill()
        healthy.wait()
    [closed] = list_incidents(r, keys)[-1:]
    assert closed["incident_id"] == incident["incident_id"] and closed["recovery"]["outcome"] == "recovered"
    assert closed["recovery"]["new_instance_id"] == back.id and not r.exists(keys.incidents_given_up)


def test_a_down_instance_of_an_endpoint_no_longer_in_the_fleet_is_reported_once(r, keys, tmp_path, monkeypatch):
    monkeypatch.setenv("MAKESPAN_LOG_DIR", str(tmp_path))
    _crashed(r, keys, endpoint="retired")
    assert len(_cycle(r, keys, _fleet(NEVER_HEALTHY), cycles=3)) == 1


def test_the_incident_names_a_set_point_only_for_an_endpoint_that_has_one(r, keys, tmp_path, monkeypatch):
    """The effect said "restarting it to its set point" also for an endpoint with no
    ``set_point`` in the fleet (found by a new-user check)."""
    monkeypatch.setenv("MAKESPAN_LOG_DIR", str(tmp_path))
    no_set_point = parse_fleet({"name": "observer-fixes", "hosts": [{"name": "h1", "gpu_count": 1,
                                                                     "memory_mib": 81920}],
                                "endpoints": {"coder": {"model": "m/coder", "memory_mib_per_gpu": 1000,
                                                        "cold_start_s": 1, "evict_s": 1,
                                                        "launch": {"driver": "process", "command": NEVER_HEALTHY,
                                                                   "health_timeout_s": 1.0}}}})
    _crashed(r, keys)
    [incident] = _cycle(r, keys, no_set_point)
    assert incident["effect"].endswith("; restarting it on the same GPUs"), incident["effect"]
    _crashed(r, keys)
    [incident] = _cycle(r, keys, _fleet(NEVER_HEALTHY))
    assert incident["effect"].endswith("; restarting it to its set point"), incident["effect"]
