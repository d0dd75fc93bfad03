"""The critical lane on real processes: a planner process and Celery GPU worker processes
(simulated endpoints), real Redis. A CRITICAL job goes to a warm set-point instance, and,
with every GPU held by LOW work, preempts one of them; each runs its phases to completion
and no GPU ever holds two leases at once.

The planner waits ``batch_wait_s`` = 1 s before planning a small batch, so the tick never
beats the lane to these jobs (the lane does not wait: the race itself is safe either way,
tests/workers/test_critical_lane.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from makespan.keys import Keys
from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect
from makespan.workers.phases import instance_value
from tests.live import all_events, overlaps, wait_for

FLEET = Path("examples/render-pipeline.toml").resolve()
EMBED_GPU = "GPU-host-a-2"  # embed's set point


@pytest.fixture
def live(settings, tmp_path):
    fleet = load_fleet(FLEET)
    s = dataclasses.replace(settings, batch_wait_s=1.0, lease_ttl_s=5.0)
    system = LiveSystem(FLEET, fleet, s, tmp_path / "logs", observer=False)
    system.start(wait_s=120)
    client = connect(s.redis_url)
    yield system, Producer(client, Keys(s.key_prefix), fleet, s)
    system.stop()
    client.close()


def _lane_event(r, keys, job_id):
    found = [e for e in all_events(r, keys) if e["kind"] == "critical_lane" and e["job"] == job_id]
    return found[0] if found else None


def test_critical_jobs_take_the_lane_warm_and_by_preemption(r, keys, live):
    system, prod = live
    wait_for(lambda: r.get(keys.resident(EMBED_GPU)) == instance_value("embed", [EMBED_GPU]), 60,
             "the planner to restore embed's set point", 0.1)
    wait_for(lambda: not r.zcard(keys.leases), 60, "the set-point restores to end", 0.1)
    warm = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "CRITICAL"}).id
    wait_for(lambda: r.hget(keys.job(warm), "state") == "completed", 60, "the warm CRITICAL job to complete", 0.05)
    event = _lane_event(r, keys, warm)
    assert event is not None and event["outcome"] == "warm" and event["gpus"] == [EMBED_GPU]

    low = [prod.submit({"endpoint": "chat", "service_s": 3000, "priority": "LOW"}).id for _ in range(8)]
    wait_for(lambda: sum(r.hget(keys.job(j), "state") == "running" for j in low) == 8, 90,
             "eight LOW jobs to hold every GPU", 0.1)
    urgent = prod.submit({"endpoint": "chat", "service_s": 5, "priority": "CRITICAL"}).id
    wait_for(lambda: r.hget(keys.job(urgent), "state") == "completed", 60, "the CRITICAL job to complete", 0.05)
    event = _lane_event(r, keys, urgent)
    assert event is not None and event["outcome"] == "preempted" and len(event["victims"]) == 1
    requeued = [j for j in low if r.hget(keys.job(j), "preemptions") == "1"]
    assert len(requeued) == 1
    for job_id in low:
        prod.cancel(job_id)
    evs = all_events(r, keys)
    assert not overlaps(evs)
    assert sum(1 for e in evs if e["kind"] == "leased" and e.get("job") == urgent) == 1
    system.check_alive()
