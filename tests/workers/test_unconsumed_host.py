"""A fleet host no GPU worker has ever run on: a new-user check started the planners and no
GPU worker, and every lease on such a host expired and was taken again, each time publishing
one more Celery message to a queue nobody read (Redis grew about 10 KB/s for 16 GPUs, without
bound), while the jobs could have run on live hosts. Now the first lease there that expires
unconsumed makes the planner take the host as down (``P:hosts:seen`` = ``unconsumed:...``)
until a worker announces itself. In-process planner ticks on a real Redis (dispatch captured)."""

from __future__ import annotations

import dataclasses

from makespan.cli_hosts import host_rows
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.host_liveness import announce
from makespan.workers.planner_worker import PlannerWorker

FLEET = parse_fleet({"name": "two", "hosts": [{"name": h, "gpu_count": 1, "memory_mib": 81920} for h in ("h", "g")],
                     "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 20000, "cold_start_s": 1}}})


def test_a_host_whose_lease_expired_unconsumed_is_down_until_a_worker_announces_it(r, keys, settings):
    s = dataclasses.replace(settings, lease_ttl_s=60.0, preemption="off")
    sent: list = []
    w = PlannerWorker(r, s, FLEET, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = ""
    prod = Producer(r, keys, FLEET, s)
    announce(r, keys, "h", "worker-h", 600.0)  # host g: no GPU worker has run there
    jobs = [prod.submit({"endpoint": "e", "service_s": 3600, "priority": "NORMAL"}).id for _ in range(2)]
    w.tick()
    assert sorted(ctx.host for ctx in sent) == ["g", "h"]  # never seen: not gated at first
    on_g = next(ctx for ctx in sent if ctx.host == "g")
    assert {row["host"]: row["worker"] for row in host_rows(r, keys, FLEET)}["g"] == "never"
    r.zadd(keys.leases, {on_g.lease_id: 0})  # its lease expires (server clock): nobody consumed it
    r.delete(keys.gpu(on_g.gpus[0]))
    w.tick()
    w.tick()
    assert [ctx.host for ctx in sent].count("g") == 1  # not leased there again
    record = r.hgetall(keys.job(on_g.job_id))
    assert record["state"] == "queued" and record["wait_reason"] == "waiting_for_gpus"  # planned behind h's job
    rows = {row["host"]: row for row in host_rows(r, keys, FLEET)}
    assert (rows["g"]["worker"], rows["g"]["state"]) == ("never (unconsumed)", "down")
    assert "a lease there expired unconsumed" in rows["g"]["reason"]
    announce(r, keys, "g", "worker-g", 600.0)  # a worker starts there
    w.tick()
    assert [ctx.host for ctx in sent].count("g") == 2 and sent[-1].job_id == on_g.job_id
    assert set(jobs) == {ctx.job_id for ctx in sent}


def test_a_lease_whose_phase_was_claimed_does_not_mark_its_host(r, keys, settings):
    """A worker consumed the lease (claimed a phase) and then died: the host is not marked
    unconsumed (it is not gated by this; a worker ran there) and its job is leased again."""
    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    sent: list = []
    w = PlannerWorker(r, s, FLEET, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = ""
    prod = Producer(r, keys, FLEET, s)
    announce(r, keys, "h", "worker-h", 600.0)
    for _ in range(2):
        prod.submit({"endpoint": "e", "service_s": 3600, "priority": "NORMAL"})
    w.tick()
    on_g = next(ctx for ctx in sent if ctx.host == "g")
    r.hset(keys.phase(on_g.lease_id), "evict:claimed", "1")  # a worker there started it
    r.zadd(keys.leases, {on_g.lease_id: 0})
    r.delete(keys.gpu(on_g.gpus[0]))
    w.tick()
    assert r.hget(keys.hosts_seen, "g") is None
    assert [ctx.host for ctx in sent].count("g") == 2  # leased there again
