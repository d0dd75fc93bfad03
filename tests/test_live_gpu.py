"""The live path on a real NVIDIA GPU: discovery → fleet check → lease → evict → start a
real endpoint process on the GPU by UUID → requests over HTTP → restore the set point,
with NVML memory sampled throughout.

Skipped where NVML finds no GPU (CI). The endpoint processes hold GPU memory like
model servers holding weights (``endpoint_server --hold-gpu-mib``, torch), so NVML
shows whether the evicted model really left the GPU before the next one loaded.
``MAKESPAN_TEST_FAKE_GPU=1`` runs the same flow on a machine without a GPU (made-up
UUID, memory checks skipped) to develop the test.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.run_report import drain_counts
from tests.live import all_events, overlaps, wait_for
from makespan.workers.discovery import DiscoveredGpu, NvmlDiscovery
from makespan.workers.host_check import host_toml
from makespan.workers.phases import parse_instance

FAKE = os.environ.get("MAKESPAN_TEST_FAKE_GPU") == "1"


def _gpus() -> list[DiscoveredGpu]:
    if FAKE:
        return [DiscoveredGpu("GPU-fake-0000", 81920, 0, "fake")]
    try:
        import pynvml
    except ImportError:
        return []
    return NvmlDiscovery(pynvml).discover()


GPUS = _gpus()
pytestmark = pytest.mark.skipif(not GPUS, reason="no NVIDIA GPU visible through NVML on this machine")
BASE_MIB, SWAP_MIB = 8192, 16384  # GPU memory each endpoint process really holds


def _endpoint(name: str, hold_mib: int, set_point: str = "") -> str:
    cmd = ["{python}", "-m", "makespan.workers.endpoint_server", "--port", "{port}", "--model", "{model}",
           "--load-time-s", "{load_time_s}", "--latency-ms", "5", "--hold-gpu-mib", str(hold_mib)]
    # The fleet promises more memory per GPU than both processes hold, so the planner
    # cannot keep both resident on one GPU and has to evict: the swap this test watches.
    return (f'[endpoints.{name}]\nmodel = "{name}"\ntensor_parallel = 1\nmemory_mib_per_gpu = '
            f'{GPUS[0].memory_mib * 6 // 10}\ncold_start_s = 2\nevict_s = 1\nslots = 4\n{set_point}'
            f'launch = {{ driver = "process", health_path = "/health", health_timeout_s = 180, '
            f'command = {json.dumps(cmd)} }}\n')


class MemorySampler(threading.Thread):
    """NVML used memory (MiB) of one GPU every 50 ms: [(unix s, used_mib)]."""

    def __init__(self, uuid: str):
        super().__init__(daemon=True)
        self.uuid, self.samples, self.stop = uuid, [], threading.Event()
        self.d = NvmlDiscovery()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            g = next((g for g in self.d.discover(use_env=False) if g.uuid == self.uuid), None)
            if g is not None:
                self.samples.append((time.time(), g.used_mib))


def test_swap_on_a_real_gpu_frees_memory_and_restores_the_set_point(r, keys, settings, tmp_path):
    gpu = GPUS[0]
    text = ('name = "gpu-live"\n' + host_toml("gpu-host", [gpu]) +
            _endpoint("base", BASE_MIB, f'set_point = [{{ host = "gpu-host", gpus = [{gpu.index}] }}]\n') +
            _endpoint("swap", SWAP_MIB))
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    fleet = load_fleet(path)
    env = {"CUDA_VISIBLE_DEVICES": ""} if FAKE else {}  # FAKE: torch must not find a GPU here either
    system = LiveSystem(path, fleet, settings, tmp_path / "logs", extra_env=env)
    sampler = MemorySampler(gpu.uuid)

    def resident() -> str | None:
        inst = parse_instance(r.get(keys.resident(gpu.uuid)))
        return inst[0] if inst else None

    def idle() -> bool:
        return not r.zcard(keys.leases) and not r.get(keys.gpu(gpu.uuid))

    try:
        system.start()
        sampler.start()
        wait_for(lambda: resident() == "base" and idle(), 240, "the set point (base resident)", 0.2)
        t_base = time.time()
        prod = Producer(r, keys, fleet, settings)
        ids = [prod.submit({"endpoint": "swap", "service_s": 1, "payload": {"requests": 20, "prompt": "q{i}"}}).id
               for _ in range(3)]
        wait_for(lambda: all(r.hget(keys.job(j), "state") == "completed" for j in ids), 300,
                 "the swap jobs to complete", 0.2)
        wait_for(lambda: resident() == "base" and idle(), 240, "the set point restored", 0.2)
        time.sleep(0.5)
    finally:
        sampler.stop.set()
        system.stop()
    evs = all_events(r, keys)
    leased = [e for e in evs if e["kind"] == "leased" and e.get("job") in ids]
    assert len(leased) == 3 and all(e["gpus"] == [gpu.uuid] for e in leased)
    evicted = [e for e in evs if e["kind"] == "phase_end" and e.get("phase") == "evict" and e.get("evicted")]
    assert any(e["evicted"] == ["base"] for e in evicted)
    for j in ids:
        recs = [json.loads(x) for x in r.lrange(keys.requests(j), 0, -1)]
        assert len(recs) == 20 and all(x["ok"] for x in recs)
    assert not overlaps(evs)
    d = drain_counts(r, keys, fleet)
    assert (d["leases"], d["agenda_entries"], d["busy_slots"]) == (0, 0, 0), d["left"]
    if FAKE:
        return
    used = [u for t, u in sampler.samples if t >= t_base]
    assert used, "no NVML samples"
    # The swap model was loaded (its memory seen) but never beside the base model:
    # the evicted process had released its memory before the next one allocated.
    assert max(used) >= SWAP_MIB
    assert max(used) < BASE_MIB + SWAP_MIB
    end = [u for t, u in sampler.samples[-5:]]
    assert all(BASE_MIB <= u < SWAP_MIB for u in end), end  # back at the set point: base alone
    print(f"NVML used MiB after the set point: min {min(used)} max {max(used)} end {end}", file=sys.stderr)
