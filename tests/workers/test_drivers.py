"""Drivers with real processes: spawn, health check, CUDA_VISIBLE_DEVICES, stop
(SIGTERM, then SIGKILL after the grace period), health-check failure with backoff."""

from __future__ import annotations

import sys
import time

import httpx
import pytest

from makespan.errors import PhaseError, ValidationError
from makespan.models import EndpointSpec, LaunchSpec
from makespan.workers.drivers import get_driver
from makespan.workers.drivers import process_alive


def _spec(name="renderer", cold_start_s=30.0, tp=1, **launch) -> EndpointSpec:
    return EndpointSpec(name=name, model="render/cards-v2", tensor_parallel=tp, memory_mib_per_gpu=1000,
                        cold_start_s=cold_start_s, evict_s=5.0, wake_s=2.0,
                        launch=LaunchSpec(driver="process", **launch))


def test_process_driver_spawns_with_gpu_uuids_and_stops(tmp_path):
    d = get_driver("process", log_dir=tmp_path, grace_s=2.0)
    gpus = ["GPU-host-a-2", "GPU-host-a-3"]
    inst = d.start(_spec(tp=2), gpus, time_scale=0.01)  # 0.3 s model load
    try:
        assert d.health(inst)
        r = httpx.post(inst.url + "/v1/completions", json={"prompt": "card"}, timeout=5)
        assert r.status_code == 200
        d.sleep(inst)
        assert httpx.get(inst.url + "/is_sleeping").json()["is_sleeping"] is True
        d.wake(inst)
        assert httpx.get(inst.url + "/is_sleeping").json()["is_sleeping"] is False
    finally:
        d.stop(inst)
    assert inst.proc.returncode == 0  # SIGTERM was enough
    assert not d.health(inst)
    log = open(inst.log_path).read()
    assert "CUDA_VISIBLE_DEVICES=GPU-host-a-2,GPU-host-a-3" in log  # the child saw the UUIDs
    d.stop(inst)  # idempotent


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    d = get_driver("process", log_dir=tmp_path, grace_s=0.5)
    cmd = ("{python}", "-m", "makespan.workers.endpoint_server", "--port", "{port}", "--ignore-sigterm")
    inst = d.start(_spec(command=cmd), ["GPU-x"], time_scale=0.01)
    d.stop(inst)
    assert inst.proc.returncode == -9
    assert not process_alive(inst.pid)


def test_stop_by_pid_without_handle(tmp_path):
    d = get_driver("process", log_dir=tmp_path, grace_s=2.0)
    inst = d.start(_spec(), ["GPU-x"], time_scale=0.0)
    proc, inst.proc = inst.proc, None  # as if read back from the instance registry
    assert d.health(inst)
    d.stop(inst)
    proc.wait(timeout=5)
    assert not process_alive(inst.pid)


def test_health_check_that_never_passes_raises_phase_error(tmp_path):
    d = get_driver("process", log_dir=tmp_path, health_timeout_s=1.0, grace_s=0.5, backoff_initial_s=0.05)
    cmd = ("{python}", "-m", "makespan.workers.endpoint_server", "--port", "{port}", "--load-time-s", "3600")
    t0 = time.monotonic()
    with pytest.raises(PhaseError, match=r"did not pass within 1.0 s after \d+ probes \(last: HTTP 503\)") as ei:
        d.start(_spec(command=cmd), ["GPU-x"])
    probes = int(str(ei.value).split(" after ")[1].split()[0])
    assert 3 <= probes <= 8  # backoff: not a busy loop (1 s at 0.05 s steady would be ~20)
    assert time.monotonic() - t0 >= 1.0
    logs = list(tmp_path.iterdir())
    assert logs and "endpoint_server" in logs[0].read_text()  # the log is kept


def test_process_exiting_early_is_a_phase_error(tmp_path):
    d = get_driver("process", log_dir=tmp_path)
    with pytest.raises(PhaseError, match="exited with code 3.*: boom"):
        d.start(_spec(command=(sys.executable, "-c", "import sys; print('boom'); sys.exit(3)")), ["GPU-x"])
    # one that wrote nothing: the message says so, not an empty excerpt after the log's name
    with pytest.raises(PhaseError, match=r"exited with code 1 .*\(it wrote nothing: check its launch command\)"):
        d.start(_spec(command=(sys.executable, "-c", "import sys; sys.exit(1)")), ["GPU-x"])


def test_missing_executable_is_a_phase_error(tmp_path):
    d = get_driver("process", log_dir=tmp_path)
    with pytest.raises(PhaseError, match="cannot run"):
        d.start(_spec(command=("/nonexistent/makespan-bin",)), ["GPU-x"])


def test_simulated_driver_time_scaled():
    d = get_driver("simulated")
    t0 = time.monotonic()
    inst = d.start(_spec(cold_start_s=20.0), ["GPU-x"], time_scale=0.01)
    assert time.monotonic() - t0 >= 0.2
    assert inst.pid is None and d.health(inst)
    d.stop(inst)
    assert not d.health(inst)
    with pytest.raises(PhaseError, match="needs 1 GPUs"):
        d.start(_spec(), ["a", "b"], time_scale=0.0)


def test_vllm_command_and_unknown_driver():
    d = get_driver("vllm")
    spec = EndpointSpec(name="chat", model="meta-llama/Llama-3.1-8B-Instruct", tensor_parallel=2,
                        memory_mib_per_gpu=24000, cold_start_s=60,
                        launch=LaunchSpec(driver="vllm", sleep_mode=True, gpu_memory_utilization=0.85))
    argv = d.command(spec, 8123, 1.0)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.85"
    assert "--enable-sleep-mode" in argv
    assert d.extra_env(spec) == {"VLLM_SERVER_DEV_MODE": "1"}
    with pytest.raises(ValidationError, match="launch.driver"):
        get_driver("docker")
