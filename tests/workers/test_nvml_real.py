"""GPU discovery, the fleet check and the endpoint launch against a real NVIDIA GPU.

Skipped where NVML finds no GPU (CI and laptops: tests/workers/test_discovery.py and
test_host_check.py cover the same code through a fake NVML). Run on a GPU host with
``python -m pytest tests/workers/test_nvml_real.py``; the figures of the last run on
real hardware are in docs/operations.md ("GPU discovery").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib

import httpx
import pytest

from makespan.workers.discovery import NvmlDiscovery
from makespan.workers.host_check import check_host, host_toml

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _real_gpus():
    try:
        import pynvml
    except ImportError:
        return []
    return NvmlDiscovery(pynvml).discover(use_env=False)


GPUS = _real_gpus()
pytestmark = pytest.mark.skipif(not GPUS, reason="no NVIDIA GPU visible through NVML on this machine")

ENDPOINT_TOML = ('[endpoints.m]\nmodel = "m"\ntensor_parallel = 1\nmemory_mib_per_gpu = 1000\ncold_start_s = 1\n'
                 'evict_s = 1\nslots = 1\nlaunch = { driver = "process", health_path = "/health", '
                 'health_timeout_s = 30 }\n')


def _child(code: str, env: dict[str, str]) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env}, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


DISCOVER = ("import json; from makespan.workers.discovery import NvmlDiscovery; "
            "print(json.dumps([g.uuid for g in NvmlDiscovery().discover()]))")


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="nvidia-smi not installed")
def test_discovery_matches_nvidia_smi():
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    smi = [tuple(x.strip() for x in line.split(",")) for line in out.strip().splitlines()]
    whole = [g for g in GPUS if g.mig_parent is None]
    if len(whole) != len(smi):
        pytest.skip("MIG slices configured: nvidia-smi lists the parents")
    assert [(str(g.index), g.uuid, str(g.memory_mib)) for g in whole] == smi


def test_cuda_visible_devices_by_index_and_by_uuid_prefix_name_the_same_gpu():
    last = GPUS[-1]
    by_index = _child(DISCOVER, {"CUDA_VISIBLE_DEVICES": str(last.index)})
    by_uuid = _child(DISCOVER, {"CUDA_VISIBLE_DEVICES": last.uuid[:12]})
    assert json.loads(by_index) == json.loads(by_uuid) == [last.uuid]
    assert json.loads(_child(DISCOVER, {"CUDA_VISIBLE_DEVICES": ""})) == []


def test_discovery_works_again_in_a_forked_child():
    d = NvmlDiscovery()
    parent = [g.uuid for g in d.discover(use_env=False)]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: NVML handles do not survive fork; discovery must re-initialise
        try:
            os.write(w, json.dumps([g.uuid for g in d.discover(use_env=False)]).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert json.loads(os.read(r, 65536)) == parent


def test_written_host_entry_passes_the_check_and_an_overpromise_fails():
    fleet = tomllib.loads('name = "real"\n' + host_toml("gpu-host", GPUS) + ENDPOINT_TOML)
    from makespan.models import parse_fleet

    host = parse_fleet(fleet).hosts[0]
    assert check_host(host, GPUS) == []
    fleet["hosts"][0]["gpus"][0]["memory_mib"] = GPUS[0].memory_mib + 1024
    problems = check_host(parse_fleet(fleet).hosts[0], GPUS)
    assert len(problems) == 1 and GPUS[0].uuid in problems[0]


def test_gpu_worker_refuses_a_fleet_that_does_not_match(tmp_path):
    g = GPUS[0]
    path = tmp_path / "fleet.toml"
    path.write_text(f'name = "real"\n[[hosts]]\nname = "gpu-host"\ngpus = [{{ uuid = "{g.uuid}", '
                    f'index = {g.index}, memory_mib = {g.memory_mib * 2} }}]\n' + ENDPOINT_TOML)
    p = subprocess.run([sys.executable, "-m", "makespan.cli", "gpu-worker", "--fleet", str(path), "--host", "gpu-host"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "promises memory_mib" in p.stderr and g.uuid in p.stderr


def test_process_endpoint_is_launched_on_the_leased_gpu_by_uuid(tmp_path):
    from makespan.models import parse_fleet
    from makespan.workers.drivers.process import ProcessDriver

    gpu = GPUS[-1]
    ep = parse_fleet(tomllib.loads('name = "real"\n' + host_toml("gpu-host", [gpu]) + ENDPOINT_TOML)).endpoints["m"]
    driver = ProcessDriver(log_dir=tmp_path)
    inst = driver.start(ep, [gpu.uuid], time_scale=0.01)
    try:
        health = httpx.get(f"{inst.url}/health", timeout=5).json()
        assert health == {"status": "ok", "cuda_visible_devices": gpu.uuid}
    finally:
        driver.stop(inst)
    # What a process launched with that environment sees: NVML and (where installed) CUDA.
    env = {"CUDA_VISIBLE_DEVICES": gpu.uuid}
    assert json.loads(_child(DISCOVER, env)) == [gpu.uuid]
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    seen = _child("import torch; print(torch.cuda.device_count(), torch.cuda.get_device_properties(0).uuid)", env)
    count, uuid = seen.split()
    assert count == "1" and gpu.uuid.endswith(uuid)


def test_used_memory_rises_under_allocation_while_total_stays():
    pytest.importorskip("torch")
    gpu = GPUS[0]
    code = ("import json, torch; from makespan.workers.discovery import NvmlDiscovery; d = NvmlDiscovery();"
            "before = d.discover()[0]; x = torch.empty(4 << 30, dtype=torch.uint8, device='cuda');"
            "torch.cuda.synchronize(); after = d.discover()[0];"
            "print(json.dumps([before.memory_mib, before.used_mib, after.memory_mib, after.used_mib]))")
    total0, used0, total1, used1 = json.loads(_child(code, {"CUDA_VISIBLE_DEVICES": gpu.uuid}))
    assert total0 == total1 == gpu.memory_mib
    assert used1 - used0 >= 4096  # 4 GiB allocated (plus the CUDA context)
