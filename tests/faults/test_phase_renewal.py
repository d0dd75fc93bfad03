"""Issue 18, failure 8: a phase renews its lease as it starts.

The heartbeat first renews one interval into a phase. A phase message that waited in
its host's queue for longer than TTL minus that interval (3 s TTL, 1 s heartbeat, a
2.5 s wait) found its lease gone on a healthy worker: the lease ran out at 3 s, before
the first renewal at 3.5 s, and the job's phase ended ``stale``. Here a real GPU worker
(no planner: nothing else renews or reclaims the lease) is handed a job's phases 6.5 s
after its 8 s lease was taken (2 s heartbeat: without the renewal at the phase's start,
the first renewal would come at 8.5 s at the earliest), both the phase-by-phase chain and
the warm fast path. The 1.5 s between the wait and the expiry is for the message's trip
to the worker and each hop of the chain on a loaded 2-core machine (with 0.5 s, as first
written, the phase chain lost its lease in a CI run that shared the 2 cores with a
benchmark).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from celery import chain

from makespan.celery_app import create_celery
from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import JOB_PHASES, PhaseContext, instance_value
from tests.live import wait_for

TTL_S, HEARTBEAT_S, QUEUE_WAIT_S = 8.0, 2.0, 6.5
HOST = "h1"
FLEET = """
name = "renewal"
[[hosts]]
name = "h1"
gpu_count = 1
memory_mib = 40000
[endpoints.sim]
model = "sim/model"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
"""


@pytest.fixture
def worker(tmp_path, settings):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    s = replace(settings, lease_ttl_s=TTL_S, heartbeat_s=HEARTBEAT_S)
    system = LiveSystem(path, fleet, s, tmp_path / "logs", planners=0, observer=False)
    system.start_gpu_worker(HOST)
    try:
        system.wait_workers(60, hosts=[HOST])
        yield system, fleet, s
    finally:
        system.stop()


@pytest.mark.parametrize("warm", [False, True], ids=["phase-chain", "warm-path"])
def test_a_phase_that_waited_most_of_the_ttl_keeps_its_lease(worker, r, keys, warm):
    system, fleet, s = worker
    gpu = fleet.hosts[0].gpus[0].uuid
    # execute lasts 1.5 s of wall time (150 workload s x 0.01): past the lease's first
    # expiry at 8 s unless the phase renewed it when it started
    job = Producer(r, keys, fleet, s).submit({"endpoint": "sim", "service_s": 150, "priority": "HIGH"}).id
    if warm:
        r.set(keys.resident(gpu), instance_value("sim", [gpu]))
    lease = LeaseStore(r, keys).acquire("L-wait", (gpu,), TTL_S, job_id=job, kind="job", holder=HOST,
                                        queue=keys.queue("HIGH"), instance=instance_value("sim", [gpu]))
    assert lease is not None and lease.warm is warm
    time.sleep(QUEUE_WAIT_S)  # the message "waited in the queue" this long
    ctx = PhaseContext("L-wait", lease.token, [gpu], HOST, "job", "sim", job, "HIGH", 150.0)
    app = create_celery(s)
    queue = keys.host_queue(HOST)
    try:
        if warm:
            app.send_task("makespan.warm_job", args=(ctx.__dict__,), queue=queue)
        else:
            chain(*[app.signature(f"makespan.{p}", args=(ctx.__dict__,), immutable=True).set(queue=queue)
                    for p in JOB_PHASES], app=app).apply_async()
        wait_for(lambda: r.hget(keys.job(job), "state") in ("completed", "failed", "cancelled"), 60,
                 "the job to end", 0.1)  # seconds of phases; the bound only stops a hang on a loaded host
    except TimeoutError:
        pytest.fail(f"the job never ended (state {r.hget(keys.job(job), 'state')!r}): its phase found the lease gone")
    finally:
        app.close()
    assert r.hget(keys.job(job), "state") == "completed"
    assert r.get(keys.gpu(gpu)) is None and not r.exists(keys.lease("L-wait"))
