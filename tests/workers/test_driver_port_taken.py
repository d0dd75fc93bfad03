"""An endpoint process whose port another process took between its choice and the bind.

:func:`makespan.redis_conn.free_port` lets its port go when it returns, and a model server
binds its port seconds after it is spawned: an outgoing connection or another server can
take the port meanwhile. The process then exits before its health check passes
(``Address already in use``) and the start failed, costing the job an attempt. Now :class:`ProcessDriver` starts the same
instance again on another port, up to ``PORT_TRIES`` ports.

Made deterministic: the driver's ``free_port`` is replaced by one that hands out a port a
listening socket of this test holds, then free ports. Real endpoint processes and HTTP
health checks (fails on the code before: the start raised PhaseError at the first exit).
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

import makespan.workers.drivers.process as process_driver
from makespan.errors import PhaseError
from makespan.models import EndpointSpec, LaunchSpec
from makespan.redis_conn import free_port
from makespan.workers.drivers import get_driver


def _spec() -> EndpointSpec:
    return EndpointSpec(name="renderer", model="render/cards-v2", tensor_parallel=1, memory_mib_per_gpu=1000,
                        cold_start_s=10.0, evict_s=1.0, launch=LaunchSpec(driver="process"))


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port held by a listening socket for the test's length."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_a_taken_port_is_retried_on_another_with_the_same_instance(tmp_path, monkeypatch, held_port):
    ports = itertools.chain([held_port], iter(free_port, None))
    monkeypatch.setattr(process_driver, "free_port", lambda: next(ports))
    spawned: list[tuple[str, int | None, int | None]] = []
    driver = get_driver("process", log_dir=tmp_path, grace_s=2.0)
    inst = driver.start(_spec(), ["GPU-a"], time_scale=0.01,
                        on_spawn=lambda instance: spawned.append((instance.id, instance.pid, instance.port)))
    try:
        assert inst.port != held_port
        assert httpx.get(f"{inst.url}/health", timeout=5).status_code == 200  # our process answers there
        assert [port for _, _, port in spawned] == [held_port, inst.port]  # registered again, on its new port
        assert {instance_id for instance_id, _, _ in spawned} == {inst.id}  # the same instance, the same record
        assert spawned[0][1] != spawned[1][1] == inst.pid
        log = (tmp_path / f"renderer-{inst.id}.log").read_text()
        assert "Address already in use" in log and log.count("# ") >= 2  # both tries in the one log
    finally:
        driver.stop(inst)


def test_every_port_taken_fails_the_start_with_port_taken(tmp_path, monkeypatch, held_port):
    monkeypatch.setattr(process_driver, "free_port", lambda: held_port)
    driver = get_driver("process", log_dir=tmp_path, grace_s=2.0)
    spawned: list[int | None] = []
    with pytest.raises(process_driver.PortTaken, match=f"given port {held_port}, which another") as caught:
        driver.start(_spec(), ["GPU-a"], time_scale=0.01, on_spawn=lambda instance: spawned.append(instance.pid))
    assert isinstance(caught.value, PhaseError)  # callers that handle a failed start handle this one
    assert len(spawned) == process_driver.PORT_TRIES


def test_an_exit_for_another_reason_is_not_retried(tmp_path):
    driver = get_driver("process", log_dir=tmp_path)
    spec = _spec()
    # the phrase in its argv (written to the log's header line) is not the process's own output
    spec = spec.model_copy(update={"launch": LaunchSpec(driver="process", command=(
        "{python}", "-c", "import sys; print('no model weights'); sys.exit(3)  # not: Address already in use"))})
    spawned: list[int | None] = []
    with pytest.raises(PhaseError, match="no model weights") as caught:
        driver.start(spec, ["GPU-a"], on_spawn=lambda instance: spawned.append(instance.pid))
    assert not isinstance(caught.value, process_driver.PortTaken)
    assert len(spawned) == 1


# try 1 binds the port it is given (a taken one: Address already in use); any later try
# fails for another reason
_BIND_THEN_FAIL = """
import os, socket, sys
port, marker = int(sys.argv[1]), sys.argv[2]
if not os.path.exists(marker):
    open(marker, "w").close()
    socket.socket().bind(("127.0.0.1", port))
print("no model weights")
sys.exit(3)
"""


def test_a_retry_that_fails_for_another_reason_is_that_failure(tmp_path, monkeypatch, held_port):
    """Every try writes to the one log: the second try's exit is judged by its own output,
    not by the first try's address-in-use error above it."""
    ports = itertools.chain([held_port], iter(free_port, None))
    monkeypatch.setattr(process_driver, "free_port", lambda: next(ports))
    spec = _spec().model_copy(update={"launch": LaunchSpec(driver="process", command=(
        "{python}", "-c", _BIND_THEN_FAIL, "{port}", str(tmp_path / "tried")))})
    spawned: list[int | None] = []
    driver = get_driver("process", log_dir=tmp_path)
    with pytest.raises(PhaseError, match="no model weights") as caught:
        driver.start(spec, ["GPU-a"], on_spawn=lambda instance: spawned.append(instance.port))
    assert not isinstance(caught.value, process_driver.PortTaken)
    assert spawned[0] == held_port and len(spawned) == 2


def test_a_respawn_that_fails_leaves_no_old_pid_to_signal(tmp_path, monkeypatch, held_port):
    """The second try's spawn fails (a full disk): the caller then stops the instance it
    was handed at the first spawn; that stop must not signal the first try's pid, reaped
    and free for the system to reuse."""
    ports = itertools.chain([held_port], iter(free_port, None))
    monkeypatch.setattr(process_driver, "free_port", lambda: next(ports))
    real_popen, spawns = subprocess.Popen, []

    def popen(*args, **kwargs):
        spawns.append(args[0])
        if len(spawns) == 2:
            raise OSError(28, "No space left on device")
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(process_driver.subprocess, "Popen", popen)
    tracked = []
    driver = get_driver("process", log_dir=tmp_path, grace_s=0.5)
    with pytest.raises(PhaseError, match="cannot run"):
        driver.start(_spec(), ["GPU-a"], time_scale=0.01, on_spawn=tracked.append)
    signalled = []
    monkeypatch.setattr(process_driver.os, "killpg", lambda pid, sig: signalled.append((pid, sig)))
    monkeypatch.setattr(process_driver.os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    driver.stop(tracked[0])  # what the GPU worker's start phase and the observer do with it
    assert signalled == [] and tracked[0].pid is None


def test_a_cancel_between_tries_spawns_no_second_process(tmp_path, monkeypatch, held_port):
    """The phase runner's pause raises once the job's cancel is requested: checked before
    the next try, so a cancelled start spawns nothing more."""
    from makespan.driver_registry import DriverContext
    from makespan.errors import PhaseCancelled

    monkeypatch.setattr(process_driver, "free_port", lambda: held_port)

    def cancelled_pause(wall_s: float) -> None:  # the cancel comes after the first try's exit
        if wall_s == process_driver.RETRY_PAUSE_S:
            raise PhaseCancelled("cancelled while waiting")
        time.sleep(wall_s)

    driver = process_driver.ProcessDriver(log_dir=tmp_path, backoff_initial_s=0.01, backoff_max_s=0.04,
                                          context=DriverContext(pause=cancelled_pause))
    spawned: list[int | None] = []
    with pytest.raises(PhaseCancelled):
        driver.start(_spec(), ["GPU-a"], time_scale=0.01, on_spawn=lambda instance: spawned.append(instance.pid))
    assert len(spawned) == 1
