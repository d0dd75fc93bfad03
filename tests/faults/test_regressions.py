"""Regression cases from the field that apply to this design (issue 7, part 2).

Cases covered elsewhere: the agenda lock TTL and heartbeat cases in
tests/workers/test_agenda.py; CUDA_VISIBLE_DEVICES and MIG slices through a fake NVML
in tests/workers/test_discovery.py; strict priority under load and a GPU worker
SIGKILLed mid-phase in tests/test_live_path.py.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from makespan.errors import ValidationError
from makespan.live import LiveSystem
from makespan.metrics import RedisStateCollector
from makespan.models import load_fleet, parse_fleet
from makespan.producer import Producer
from makespan.run_report import drain_counts
from makespan.planner.api import plan
from tests.live import all_events, overlaps, wait_for
from makespan.workers.planner_worker import PlannerWorker

TERMINAL = ("completed", "failed", "cancelled")


def _states(r, keys, ids):
    p = r.pipeline(transaction=False)
    for j in ids:
        p.hget(keys.job(j), "state")
    return p.execute()


# -- an endpoint whose health check always fails ------------------------------------------
NEVER_HEALTHY = """
name = "never-healthy"
[[hosts]]
name = "h1"
gpu_count = 2
memory_mib = 40000
[endpoints.broken]
model = "broken/model"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
launch = {{ driver = "process", command = ["{python}", "-c", "import time; time.sleep(120)"], health_timeout_s = 1.5 }}
[endpoints.fine]
model = "fine/model"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
"""


def test_endpoint_never_healthy_is_retried_then_fails_the_job_and_frees_the_gpus(r, keys, settings, tmp_path):
    # a failed start counts an attempt and requeues the job (a start can fail for a passing
    # reason); after max_attempts the job fails with the last start's error. It failed at
    # its first start before.
    path = tmp_path / "fleet.toml"
    path.write_text(NEVER_HEALTHY.format(python=sys.executable))
    fleet = load_fleet(path)
    settings = replace(settings, max_attempts=2)
    system = LiveSystem(path, fleet, settings, tmp_path / "logs")
    try:
        system.start()
        prod = Producer(r, keys, fleet, settings)
        bad = prod.submit({"endpoint": "broken", "service_s": 10, "priority": "HIGH"}).id
        wait_for(lambda: r.hget(keys.job(bad), "state") in TERMINAL, 60, "the broken job to end", 0.2)
        rec = r.hgetall(keys.job(bad))
        assert rec["state"] == "failed"
        assert rec["reason"].startswith("its endpoint failed to start (2 attempts); last: start_endpoint: ")
        assert "health check" in rec["reason"] and "probes" in rec["reason"]
        assert rec["attempts"] == "2"
        assert prod.status(bad)["attempts"] == 2  # not one more than it made (a verifier)
        events = [e for e in all_events(r, keys) if e.get("job") == bad]
        backs = [e for e in events if e["kind"] == "reclaimed"]
        assert [(e["cause"], e["outcome"], e["attempt_counted"]) for e in backs] == [
            ("start_failed", "requeued", True), ("start_failed", "failed", True)]
        assert all("health check" in e["error"] for e in backs)
        requeued = [e for e in events if e["kind"] == "requeued"]
        assert len(requeued) == 1 and requeued[0]["reason"].startswith("handed back: its endpoint failed to start: ")
        assert len([e for e in events if e["kind"] == "leased"]) == 2
        # the GPUs are free again: later jobs run on them
        ok = [prod.submit({"endpoint": "fine", "service_s": 10}).id for _ in range(4)]
        wait_for(lambda: all(s in TERMINAL for s in _states(r, keys, ok)), 60, "later jobs", 0.2)
        assert _states(r, keys, ok) == ["completed"] * 4
        assert drain_counts(r, keys, fleet)["leases"] == 0
        assert overlaps(all_events(r, keys)) == []
    finally:
        system.stop()


# -- an impossible job among jobs that fit -------------------------------------------------
EIGHT_GPU_HOSTS = {"name": "f", "hosts": [{"name": f"h{i}", "gpu_count": 8, "memory_mib": 81920} for i in range(2)],
                   "endpoints": {"small": {"model": "m", "memory_mib_per_gpu": 20000, "cold_start_s": 10},
                                 "big": {"model": "m", "tensor_parallel": 8, "memory_mib_per_gpu": 60000,
                                         "cold_start_s": 10}}}


def test_only_the_job_needing_16_gpus_on_8_gpu_hosts_is_rejected(r, keys, settings):
    fleet = parse_fleet(EIGHT_GPU_HOSTS)
    prod = Producer(r, keys, fleet, settings)
    ok = [prod.submit({"endpoint": ep, "service_s": 10}).id for ep in ("small", "big", "small", "big", "small")]
    assert prod.queue_depths()["NORMAL"] == 5
    doc = json.loads(json.dumps(EIGHT_GPU_HOSTS))
    doc["endpoints"]["huge"] = {"model": "m", "tensor_parallel": 16, "memory_mib_per_gpu": 60000, "cold_start_s": 10}
    with pytest.raises(ValidationError) as ei:  # the fleet refuses an endpoint no host can run
        parse_fleet(doc)
    assert ei.value.field == "endpoints.huge.tensor_parallel" and "8 GPUs" in ei.value.reason
    # a job naming an endpoint the fleet does not have is refused before anything is written
    with pytest.raises(ValidationError) as ei:
        prod.submit({"endpoint": "huge", "service_s": 10})
    assert ei.value.field == "job.endpoint"
    assert prod.queue_depths()["NORMAL"] == 5 and len(ok) == 5


# -- every queue-depth figure we publish sums to 20 ----------------------------------------
def test_queue_depth_figures_sum_to_20(r, keys, settings):
    from prometheus_client import CollectorRegistry, generate_latest

    fleet = load_fleet(Path("examples/render-pipeline.toml"))
    prod = Producer(r, keys, fleet, settings)
    for lvl in ("CRITICAL", "HIGH", "NORMAL", "LOW"):
        for _ in range(5):
            prod.submit({"endpoint": "chat", "service_s": 10, "priority": lvl})
    depths = prod.queue_depths()
    assert depths == {"CRITICAL": 5, "HIGH": 5, "NORMAL": 5, "LOW": 5}
    reg = CollectorRegistry()
    reg.register(RedisStateCollector(r, keys))
    text = generate_latest(reg).decode()
    gauge = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("makespan_queue_depth_jobs{")]
    assert sum(gauge) == 20 and len(gauge) == 4
    w = PlannerWorker(r, settings, fleet, dispatch=lambda *a: None)
    batch = w.form_batch()
    assert len(batch) == 20 and [j.priority for j in batch] == sorted(j.priority for j in batch)


# -- 24 jobs of 2,000 MiB for one 46,068 MiB GPU ------------------------------------------
def test_memory_admission_on_one_46068_mib_gpu(r, keys, settings):
    """Our model: a job holds its GPU group exclusively (``slots`` is request concurrency
    inside that job), so at most ONE of the 24 runs on the GPU at any time — stronger
    than the "at most 23 by memory" bound (23 × 2,000 ≤ 46,068 < 24 × 2,000). An endpoint
    whose memory exceeds the GPU is refused by the fleet, and the plan never overlaps
    two jobs on the GPU."""

    fleet = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 46068}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 2000, "cold_start_s": 1,
                                             "slots": 24}}})
    with pytest.raises(ValidationError) as ei:
        parse_fleet({**fleet.model_dump(), "endpoints": {"e": {"name": "e", "model": "m", "memory_mib_per_gpu": 46069,
                                                                "cold_start_s": 1}}})
    assert ei.value.field == "endpoints.e.memory_mib_per_gpu"
    prod = Producer(r, keys, fleet, settings)
    for _ in range(24):
        prod.submit({"endpoint": "e", "service_s": 10})
    w = PlannerWorker(r, settings, fleet, dispatch=lambda *a: None)
    state, _busy = w.fleet_state()
    p = plan(w.form_batch(), state, settings.policy)
    ivs = sorted((a.start_s, a.end_s) for a in p.assignments)
    assert len(ivs) == 24
    assert all(b0 >= a1 - 1e-9 for (a0, a1), (b0, b1) in zip(ivs, ivs[1:]))  # never two at once
    # and the live planner leases one at a time
    w.token = ""
    assert w.tick() is True
    assert r.zcard(keys.leases) == 1


def test_waiting_for_workers_with_no_time_left_says_so(settings, tmp_path):
    # wait_workers(timeout_s=0) raised NameError ('seen' unbound) instead of its MakespanError
    from makespan.errors import MakespanError

    path = tmp_path / "fleet.toml"
    path.write_text(NEVER_HEALTHY.format(python=sys.executable))
    system = LiveSystem(path, load_fleet(path), settings, tmp_path / "logs")
    with pytest.raises(MakespanError, match="not ready within 0 s"):
        system.wait_workers(timeout_s=0)
