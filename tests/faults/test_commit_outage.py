"""A short Redis outage (SIGKILL + restart from the AOF, well inside the lease TTL) right
as the execute phase's workload ends: the finished run was thrown away (its commit failed
on the first error) and the job's workload ran again once the lease expired, although the
lease was still ours when Redis came back. The commit is retried while the lease may live
(found by a review, 2026-12-04; fails on the code before)."""
from __future__ import annotations

import threading
import tomllib
import uuid

from bench.chaos_redis import RedisServer
from makespan.keys import Keys
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect
from makespan.settings import Settings
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner
from tests.faults.private_redis import TWO_HOSTS


def test_execute_commit_survives_a_short_outage_inside_the_ttl():
    srv = RedisServer()
    try:
        prefix = f"scr-{uuid.uuid4().hex[:8]}"
        keys = Keys(prefix)
        fleet = parse_fleet(tomllib.loads(TWO_HOSTS))
        s = Settings(redis_url=srv.url, key_prefix=prefix, time_scale=0.01, lease_ttl_s=6.0, heartbeat_s=0.5,
                     redis_socket_timeout_s=1.0, redis_connect_timeout_s=0.5)
        r = connect(srv.url, settings=s)
        job = Producer(r, keys, fleet, s).submit({"endpoint": "sim", "service_s": 100}).id  # 1 s of wall time
        gpu = fleet.hosts[0].gpus[0].uuid
        lease = LeaseStore(r, keys).acquire("L1", (gpu,), s.lease_ttl_s, job_id=job, kind="job", holder="h1",
                                            queue=keys.queue("NORMAL"))
        assert lease is not None
        ctx = PhaseContext("L1", lease.token, [gpu], "h1", "job", "sim", job, "NORMAL", 100.0)
        runner = PhaseRunner(connect(srv.url, settings=s), s, fleet)
        assert runner.run(ctx, "evict") == "done"
        assert runner.run(ctx, "start_endpoint") == "done"

        real_sleep = runner._sleep
        restarted = threading.Event()

        def sleep_then_outage(*a, **kw):  # the workload ends; Redis goes away for 0.7 s right then
            real_sleep(*a, **kw)
            srv.kill()
            threading.Timer(0.7, lambda: (srv.start(), restarted.set())).start()
        runner._sleep = sleep_then_outage
        try:
            out = runner.run(ctx, "execute")
        except Exception as e:  # noqa: BLE001
            out = repr(e)
        restarted.wait(10)
        r2 = connect(srv.url, settings=s)
        lease_live = r2.get(keys.gpu(gpu)) == f"L1:{lease.token}"
        assert lease_live, "the lease expired: the outage was too long for this test"
        assert out == "done", f"execute lost its finished run to a 0.7 s outage: {out}"
        assert r2.hget(keys.phase("L1"), "execute") == "done" and not r2.exists(keys.busy("L1"))
    finally:
        srv.stop()
