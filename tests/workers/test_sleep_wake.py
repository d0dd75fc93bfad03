"""Sleep mode through every driver (issue 20 point 1): the bundled endpoint server as a
real process over real HTTP (both levels: host RAM held at level 1 only, configurable
times), the process driver, the vLLM preset (running the bundled server as its
``vllm`` executable) and the simulated driver."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest

from makespan.errors import PhaseError
from makespan.models import EndpointSpec, LaunchSpec
from makespan.workers.drivers import get_driver
from makespan.workers.drivers.simulated import SimulatedDriver


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _spec(name="chat", driver="process", command=(), wake_s=3.0, evict_s=2.0, sleep_level=1) -> EndpointSpec:
    return EndpointSpec(name=name, model="meta-llama/Llama-3.1-8B-Instruct", memory_mib_per_gpu=1000,
                        cold_start_s=20.0, evict_s=evict_s, wake_s=wake_s, sleep_level=sleep_level,
                        launch=LaunchSpec(driver=driver, command=tuple(command)))


SERVER = ("{python}", "-m", "makespan.workers.endpoint_server", "--port", "{port}", "--model", "{model}",
          "--sleep-s", "{sleep_s}", "--wake-s", "{wake_s}", "--sleep-ram-mib", "64")


def test_bundled_server_sleeps_and_wakes_at_both_levels(tmp_path):
    """Level 1 holds host RAM while asleep and frees it on wake; level 2 holds none; the
    server refuses requests while asleep but answers its health check (as vLLM does),
    and each transition takes the configured time."""
    d = get_driver("process", log_dir=tmp_path, grace_s=2.0)
    inst = d.start(_spec(command=SERVER, evict_s=30.0, wake_s=40.0), ["GPU-x"], time_scale=0.01)  # 0.3 s, 0.4 s
    try:
        assert d.is_sleeping(inst) is False
        rss_awake = _rss_mib(inst.pid)
        t0 = time.monotonic()
        d.sleep(inst, 1)
        assert time.monotonic() - t0 >= 0.3
        assert d.is_sleeping(inst) is True
        assert _metric(inst.url, "endpoint_sleep_level") == 1
        assert _metric(inst.url, "endpoint_sleep_ram_mib") == 64
        assert _rss_mib(inst.pid) - rss_awake >= 60  # the "weights" really sit in host RAM
        assert httpx.get(inst.url + "/health", timeout=5).status_code == 200
        assert httpx.post(inst.url + "/v1/completions", json={"prompt": "x"}, timeout=5).status_code == 503
        t0 = time.monotonic()
        d.wake(inst)
        assert time.monotonic() - t0 >= 0.4
        assert d.is_sleeping(inst) is False
        assert _metric(inst.url, "endpoint_sleep_ram_mib") == 0
        assert httpx.post(inst.url + "/v1/completions", json={"prompt": "x"}, timeout=5).status_code == 200
        d.sleep(inst, 2)
        assert d.is_sleeping(inst) is True
        assert _metric(inst.url, "endpoint_sleep_level") == 2
        assert _metric(inst.url, "endpoint_sleep_ram_mib") == 0  # level 2 drops the weights
        d.wake(inst)
        assert d.is_sleeping(inst) is False
        with pytest.raises(PhaseError, match="sleep level must be 1 or 2"):
            d.sleep(inst, 3)
        assert httpx.post(inst.url + "/sleep?level=3", timeout=5).status_code == 400
    finally:
        d.stop(inst)


def test_failing_wake_is_a_phase_error(tmp_path):
    d = get_driver("process", log_dir=tmp_path, grace_s=2.0)
    inst = d.start(_spec(command=(*SERVER, "--fail-wake")), ["GPU-x"], time_scale=0.0)
    try:
        d.sleep(inst, 1)
        with pytest.raises(PhaseError, match="wake_up answered HTTP 500"):
            d.wake(inst)
        assert d.is_sleeping(inst) is True
    finally:
        d.stop(inst)


def test_vllm_preset_sleeps_and_wakes_a_real_server(tmp_path):
    """The vLLM preset's own command line (``serve MODEL ... --enable-sleep-mode``, with
    ``VLLM_SERVER_DEV_MODE=1``) run by the bundled server standing in for ``vllm``."""
    d = get_driver("vllm", log_dir=tmp_path, grace_s=2.0)
    spec = _spec(driver="vllm", command=(sys.executable, "-m", "makespan.workers.endpoint_server"), sleep_level=2)
    argv = d.command(spec, 8000, 1.0)
    assert "--enable-sleep-mode" in argv and d.extra_env(spec) == {"VLLM_SERVER_DEV_MODE": "1"}
    inst = d.start(spec, ["GPU-x"], time_scale=0.01)
    try:
        assert httpx.get(inst.url + "/v1/models", timeout=5).json()["data"][0]["id"] == spec.model
        d.sleep(inst, 2)
        assert d.is_sleeping(inst) is True
        d.wake(inst)
        assert d.is_sleeping(inst) is False
    finally:
        d.stop(inst)


def test_process_driver_without_a_sleep_mode_raises(tmp_path):
    """A server without the sleep routes (404): sleep is a PhaseError, so the worker stops it."""
    d = get_driver("process", log_dir=tmp_path, grace_s=2.0)
    cmd = (sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1")
    inst = d.start(EndpointSpec(name="plain", model="m", memory_mib_per_gpu=1, cold_start_s=1.0,
                                launch=LaunchSpec(driver="process", command=cmd, health_path="/")),
                   ["GPU-x"], time_scale=0.0)
    try:
        with pytest.raises(PhaseError, match="POST /sleep"):
            d.sleep(inst, 1)
        with pytest.raises(PhaseError, match="is_sleeping"):
            d.is_sleeping(inst)
    finally:
        d.stop(inst)


def test_simulated_driver_wakes_from_level_2_at_its_level_2_wake_time():
    """A simulated instance slept at level 2 wakes in ``wake_level2_s``, one slept at level 1
    in ``wake_s`` (before, every wake took ``wake_s``: a simulated fleet learned level-2
    wakes as fast as level-1 ones)."""
    spec = _spec(driver="simulated", evict_s=1.0, wake_s=3.0).model_copy(update={"wake_level2_s": 30.0})
    waits: list[float] = []
    from makespan.workers.drivers.base import DriverContext

    d = SimulatedDriver({"chat": spec}, context=DriverContext(wait=waits.append))
    inst = d.start(spec, ["GPU-x"], time_scale=1.0)
    d.sleep(inst, 2)
    d.wake(inst)
    d.sleep(inst, 1)
    d.wake(inst)
    assert waits == [20.0, 1.0, 30.0, 1.0, 3.0]  # cold start, sleep, level-2 wake, sleep, level-1 wake


def test_simulated_driver_sleep_and_wake_are_time_scaled():
    spec = _spec(driver="simulated", evict_s=20.0, wake_s=30.0)
    d = SimulatedDriver({"chat": spec}, slowdown={"host-b": 2.0})
    inst = d.start(spec, ["GPU-x"], time_scale=0.01, host="host-b")
    t0 = time.monotonic()
    d.sleep(inst, 1)
    assert time.monotonic() - t0 >= 0.4  # evict_s 20 × 2 (host-b) × 0.01
    assert d.is_sleeping(inst)
    t0 = time.monotonic()
    d.wake(inst)
    assert time.monotonic() - t0 >= 0.6  # wake_s 30 × 2 × 0.01
    assert not d.is_sleeping(inst)
    d.stop(inst)
    with pytest.raises(PhaseError, match="stopped"):
        d.wake(inst)


def test_the_default_command_passes_wake_flags_only_to_an_endpoint_with_a_sleep_mode():
    """The bundled server's default command line names ``--wake-s`` only for an endpoint with
    a ``wake_s`` (it read as a sleep mode in ``ps`` for one without: the cold start stood in)."""
    d = get_driver("process")
    with_sleep = d.command(_spec(wake_s=3.0), 8000, 0.5)
    assert with_sleep[with_sleep.index("--wake-s") + 1] == repr(1.5)
    without = d.command(_spec(wake_s=None), 8000, 0.5)
    assert "--wake-s" not in without and "--wake-level2-s" not in without
    assert without[without.index("--load-time-s") + 1] == repr(10.0)
