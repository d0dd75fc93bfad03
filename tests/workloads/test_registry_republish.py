"""After a Redis outage a GPU worker publishes its workload functions again within the
host re-announce cadence (issue 18, new user): it used to wait for its next
``LIVE_TTL_S / 3`` renewal, so for up to ~10 s after Redis was back every submit was
refused with "no live GPU worker registered this workload" although the worker was up.
A real GPU worker process on a private redis-server (stopped, then started again empty on
the same port)."""

from __future__ import annotations

import time
import uuid

import makespan
from makespan.keys import Keys
from makespan.live import LiveSystem, wait_for
from makespan.models import load_fleet
from makespan.redis_conn import EmbeddedRedis, connect, start_embedded
from makespan.workers.host_liveness import RENEW_FRACTION

FLEET = """
name = "republish-test"

[[hosts]]
name = "host-a"
gpu_count = 1
memory_mib = 81920

[endpoints.sim]
model = "sim"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
"""

LIVENESS_TTL_S = 4.0  # the host is re-announced (and a failed publish retried) every 1 s
BACK_WITHIN_S = 6.0  # the retry cadence (1 s) plus a loaded host's slack; the old code took ~10 s (LIVE_TTL_S / 3)


def test_functions_are_published_again_soon_after_redis_returns(tmp_path):
    fleet_path = tmp_path / "fleet.toml"
    fleet_path.write_text(FLEET)
    server: EmbeddedRedis = start_embedded()
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    prefix = f"mst-rp-{uuid.uuid4().hex[:8]}"
    settings = makespan.settings.Settings(redis_url=server.url, key_prefix=prefix, time_scale=0.01,
                                          workload_modules="tests.workloads.fns",
                                          worker_liveness_ttl_s=LIVENESS_TTL_S,
                                          redis_socket_timeout_s=2.0, redis_connect_timeout_s=1.0)
    system = LiveSystem(fleet_path, load_fleet(fleet_path), settings, tmp_path / "logs", observer=False)
    try:
        worker = system.start_gpu_worker("host-a")
        system.wait_workers(90)
        r = connect(server.url)
        live_key = Keys(prefix).fn_live("add")
        wait_for(lambda: r.exists(live_key), 30, "the worker to publish 'add'")
        r.close()

        server.stop()  # the outage: the next publish fails
        wait_for(lambda: "publishing workload functions failed" in worker.log_path.read_text(errors="replace"),
                 30, "a publish to fail")
        server = start_embedded(port=port)  # back, empty, right after the failed publish
        back_at = time.monotonic()
        r = connect(server.url)
        wait_for(lambda: r.exists(live_key), 30, "the worker to publish 'add' again")
        took_s = time.monotonic() - back_at
        assert took_s < BACK_WITHIN_S, (f"'add' live again {took_s:.1f} s after Redis came back (host re-announce "
                                        f"every {LIVENESS_TTL_S * RENEW_FRACTION:.1f} s)")
        assert worker.alive()
        client = makespan.connect(server.url, key_prefix=prefix, fleet=fleet_path)
        try:
            assert client.submit("add", 1, 2).created
        finally:
            client.close()
    finally:
        system.stop()
        server.stop()
