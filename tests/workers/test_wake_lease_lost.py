"""A start phase wakes a sleeping process endpoint; its lease is preempted while the wake
runs and the preemptor loads another endpoint on the same GPU. The stale phase's wake used
to complete and mark the instance ``running`` (an unfenced registry write) before it saw
the lease lost: the woken instance stayed awake, registered running, not resident, on a GPU
another lease holds (its full GPU memory beside the preemptor's endpoint), and nothing put
it back to sleep or stopped it (found by a review). The wake now marks it ``waking``, fenced:
the preemptor's start stops it as a leftover, and a wake that ends after the lease was lost
stops it too."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.drivers import get_driver
from makespan.workers.drivers.registry import instances_on, register_instance, set_instance_state
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner

GPU = "GPU-h1-0"
FLEET = {
    "name": "wake-race",
    "hosts": [{"name": "h1", "gpu_count": 1, "memory_mib": 81920}],
    "endpoints": {
        # wake_s 300 x time scale 0.01 = a 3 s wake of the bundled endpoint server
        "chat": {"model": "m/chat", "memory_mib_per_gpu": 20000, "cold_start_s": 20, "evict_s": 5, "wake_s": 300,
                 "launch": {"driver": "process", "health_path": "/health", "health_timeout_s": 60}},
        "other": {"model": "m/other", "memory_mib_per_gpu": 20000, "cold_start_s": 10, "evict_s": 1},
    },
}


def _lease(r, keys, settings, fleet, job_id, endpoint):
    lease_id = uuid.uuid4().hex
    priority = r.hget(keys.job(job_id), "priority")
    lease = LeaseStore(r, keys).acquire(lease_id, (GPU,), settings.lease_ttl_s, job_id=job_id, kind="job",
                                        holder="h1", queue=keys.queue(priority))
    assert lease is not None
    ctx = PhaseContext(lease_id, lease.token, [GPU], "h1", "job", endpoint, job_id, priority,
                       float(r.hget(keys.job(job_id), "service_s")))
    return ctx, PhaseRunner(r, settings, fleet)


def test_a_wake_that_ends_after_the_lease_was_lost_leaves_no_awake_untracked_instance(r, keys, settings, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setenv("MAKESPAN_LOG_DIR", str(tmp_path))
    settings = dataclasses.replace(settings, heartbeat_s=0.2)
    fleet = parse_fleet(FLEET)
    r.set(keys.fleet, fleet.model_dump_json())
    driver = get_driver("process", log_dir=tmp_path, grace_s=2.0)
    sleeper = driver.start(fleet.endpoints["chat"], [GPU], time_scale=0.01, host="h1")
    try:
        driver.sleep(sleeper, 1)
        register_instance(r, keys, sleeper)
        set_instance_state(r, keys, sleeper.id, "asleep", sleep_level=1)
        prod = Producer(r, keys, fleet, settings)
        victim = prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW"}).id
        ctx1, runner1 = _lease(r, keys, settings, fleet, victim, "chat")
        assert runner1.run(ctx1, "evict") == "done"
        out1: list = []
        t1 = threading.Thread(target=lambda: out1.append(runner1.run(ctx1, "start_endpoint")))
        t1.start()
        # the wake (3 s) is in flight once the instance is marked waking. Waited for as long as
        # the phase runs (a fixed 2 s could pass before a loaded machine's phase reached the
        # wake: the preemption then came before it); the code before the fix had no waking
        # mark: the phase ran to its end, the wake done, and the check below fails
        hang = time.monotonic() + 60  # a bound on a hang only
        state = r.hget(keys.instance(sleeper.id), "state")
        while state != "waking" and t1.is_alive() and time.monotonic() < hang:
            time.sleep(0.02)
            state = r.hget(keys.instance(sleeper.id), "state")
        assert state == "waking" and t1.is_alive(), state
        preemptor = prod.submit({"endpoint": "other", "service_s": 10, "priority": "CRITICAL"}).id
        assert LeaseStore(r, keys).preempt(ctx1.lease_id, preemptor) == "preempted"
        ctx2, runner2 = _lease(r, keys, settings, fleet, preemptor, "other")
        assert runner2.run(ctx2, "evict") == "done"
        assert runner2.run(ctx2, "start_endpoint") == "done"
        t1.join(30)
        assert out1 == ["stale"]
        states = {i.id: st for i, st in instances_on(r, keys, [GPU], with_state=True)}
        # the GPU is the preemptor's: the old sleeper is stopped (unregistered, its process
        # gone), or still asleep; never awake and registered running beside the preemptor's
        if sleeper.id in states:
            assert states[sleeper.id] == "asleep" and driver.is_sleeping(sleeper), states
        else:
            assert not driver.is_alive(sleeper), f"{sleeper.id} unregistered but its process still runs"
        assert [i.endpoint for i, st in instances_on(r, keys, [GPU], with_state=True) if st == "running"] == ["other"]
    finally:
        driver.stop(sleeper)
