"""The GPU worker's start-up check of the fleet file against NVML (fake NVML here;
tests/workers/test_nvml_real.py runs the same checks on a real GPU when one is present)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from makespan.models import parse_fleet
from fake_nvml import FakeGpu, FakeNvml, four_gpu_host
from makespan.workers.discovery import NvmlDiscovery
from makespan.workers.host_check import check_host, host_toml

ENDPOINTS = {"m": {"model": "m", "tensor_parallel": 1, "memory_mib_per_gpu": 1000, "cold_start_s": 1,
                   "evict_s": 1, "slots": 1}}


def _host(gpus=None, **kw):
    spec = {"name": "h", **({"gpus": gpus} if gpus is not None else {}), **kw}
    return parse_fleet({"name": "f", "hosts": [spec], "endpoints": ENDPOINTS}).hosts[0]


def test_written_host_entry_round_trips_and_passes(tmp_path):
    found = NvmlDiscovery(four_gpu_host(mig_on=1)).discover(use_env=False)
    text = host_toml("h", found) + '\n[endpoints.m]\nmodel = "m"\ntensor_parallel = 1\nmemory_mib_per_gpu = 1000\n' \
        'cold_start_s = 1\nevict_s = 1\nslots = 1\n'
    import tomllib

    fleet = parse_fleet(tomllib.loads('name = "f"\n' + text))
    host = fleet.hosts[0]
    assert [g.uuid for g in host.gpus] == ["GPU-00aa-bbbb-cccc", "MIG-1-slice-0", "MIG-1-slice-1",
                                           "GPU-02aa-bbbb-cccc", "GPU-03aa-bbbb-cccc"]
    assert [g.index for g in host.gpus] == [0, 1, 1, 2, 3]
    assert check_host(host, found) == []


def test_missing_gpu_wrong_index_and_memory_promise_are_named():
    found = NvmlDiscovery(four_gpu_host()).discover(visible="2,3")
    host = _host([{"uuid": "GPU-02aa-bbbb-cccc", "index": 2, "memory_mib": 81559},
                  {"uuid": "GPU-03aa-bbbb-cccc", "index": 1, "memory_mib": 81920},
                  {"uuid": "GPU-00aa-bbbb-cccc", "index": 0, "memory_mib": 80000}])
    problems = check_host(host, found)
    assert len(problems) == 3
    assert "GPU-03aa-bbbb-cccc has NVML index 3, the fleet file says index 1" in problems[0]
    assert "GPU-03aa-bbbb-cccc has 81559 MiB, the fleet file promises memory_mib = 81920" in problems[1]
    assert "GPU-00aa-bbbb-cccc (fleet index 0) is not visible here" in problems[2]


def test_used_memory_does_not_fail_the_promise():
    nvml = FakeNvml([FakeGpu("GPU-busy", 46068, used_mib=900)])
    found = NvmlDiscovery(nvml).discover(use_env=False)
    assert check_host(_host([{"uuid": "GPU-busy", "index": 0, "memory_mib": 46068}]), found) == []


def test_simulated_hosts_are_not_checked():
    assert check_host(_host(gpu_count=2, memory_mib=1000), []) == []


def test_gpus_command_without_nvml_says_why(monkeypatch):
    # No NVIDIA driver on CI hosts: exit 1 and the reason on stderr, nothing on stdout.
    p = subprocess.run([sys.executable, "-m", "makespan.cli", "gpus"], capture_output=True, text=True, timeout=60)
    if p.returncode == 0:
        pytest.skip("this machine has GPUs (tests/workers/test_nvml_real.py covers it)")
    assert p.returncode == 1 and p.stdout == ""
    assert "NVML" in p.stderr or "pynvml" in p.stderr
