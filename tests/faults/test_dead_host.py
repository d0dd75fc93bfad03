"""Issue 18, must-contain 8 (the dead-host gate): a GPU worker that dies is noticed, and its
host's queue gets no new leases until a consumer is back.

Real processes (a planner and one GPU worker per host on the shared Redis, this test's key
prefix): host ``h1`` is the only one with the memory of endpoint ``big``. Its worker is
stopped (SIGKILL: noticed when its liveness key expires; SIGTERM: withdrawn at once, long
before the TTL), then a ``big`` job and a ``sim`` job are submitted: the ``sim`` job runs on
``h2``, the ``big`` job is never leased (no ``leased`` event, 0 attempts) and waits with
reason ``host_down``. A new worker for ``h1`` starts, and the ``big`` job runs there.
Before the gate, the ``big`` job was leased to ``h1``'s queue and requeued at every lease
expiry, over and over.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys

import pytest

from makespan.live import LiveSystem
from makespan.models import fleet_version, load_fleet
from makespan.producer import Producer
from tests.live import all_events, wait_for

FLEET = """
name = "dead-host"
[[hosts]]
name = "h1"
gpu_count = 1
memory_mib = 80000
[[hosts]]
name = "h2"
gpu_count = 1
memory_mib = 20000
[endpoints.sim]
model = "sim/model"
memory_mib_per_gpu = 10000
cold_start_s = 5
evict_s = 1
[endpoints.big]
model = "sim/big"
memory_mib_per_gpu = 40000
cold_start_s = 5
evict_s = 1
"""


@pytest.mark.parametrize(("sig", "liveness_ttl_s"), [(signal.SIGKILL, 2.0), (signal.SIGTERM, 120.0)],
                         ids=["sigkill", "sigterm"])
def test_a_dead_hosts_queue_gets_no_lease_until_a_worker_is_back(r, keys, settings, tmp_path, sig, liveness_ttl_s):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    s = dataclasses.replace(settings, worker_liveness_ttl_s=liveness_ttl_s)
    system = LiveSystem(path, fleet, s, tmp_path / "logs", planners=1, observer=False)
    system.start()
    try:
        wait_for(lambda: all(r.exists(keys.host_live(h)) for h in ("h1", "h2")), 30, "both hosts announced")
        # each real GPU worker publishes its fleet file's version with its liveness (worker_fleets)
        assert [r.get(keys.host_fleet(h)) for h in ("h1", "h2")] == [fleet_version(fleet)] * 2
        (worker,) = system.kill("gpu-h1", sig)
        worker.popen.wait(timeout=60)
        # SIGKILL: the key expires (TTL); SIGTERM: the worker withdrew it (the TTL is far longer than this wait)
        wait_for(lambda: not r.exists(keys.host_live("h1")), liveness_ttl_s + 10 if sig == signal.SIGKILL else 5,
                 "host h1's liveness key to go")
        prod = Producer(r, keys, fleet, s)
        big = prod.submit({"endpoint": "big", "service_s": 10}).id
        small = prod.submit({"endpoint": "sim", "service_s": 10}).id
        wait_for(lambda: r.hget(keys.job(small), "state") == "completed", 60, "the sim job to complete on h2")
        wait_for(lambda: r.hget(keys.job(big), "wait_reason") == "host_down", 30, "the big job's wait reason")
        rec = r.hgetall(keys.job(big))
        assert rec["state"] == "queued" and int(rec.get("attempts") or 0) == 0, rec
        assert "h1" in rec["wait_detail"]
        leased = [e for e in all_events(r, keys) if e.get("kind") == "leased" and e.get("job") == big]
        assert leased == [], "a job was leased to a host with no GPU worker"
        why = subprocess.run([sys.executable, "-m", "makespan.cli", "why", big], capture_output=True, text=True,
                             env={**os.environ, **s.to_env()}, timeout=60)
        assert why.returncode == 0 and "host_down" in why.stdout, why.stdout + why.stderr
        system.start_gpu_worker("h1", 1)
        wait_for(lambda: r.hget(keys.job(big), "state") == "completed", 90, "the big job to run on h1's new worker")
        leased = [e for e in all_events(r, keys) if e.get("kind") == "leased" and e.get("job") == big]
        assert [e["gpus"] for e in leased] == [["GPU-h1-0"]]
    finally:
        system.stop()
