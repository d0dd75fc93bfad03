"""Durability: a private redis-server with append-only persistence is SIGKILLed right
after the last submit returns and started again on the same directory; every
accepted job is still there (record, queue entry, idempotency key, event)."""

from __future__ import annotations

import json

from makespan.keys import Keys
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.settings import Settings
from bench.chaos import RedisServer, client
from tests.conftest import FLEET_TOML


def test_redis_crash_with_appendonly_loses_no_accepted_job():
    srv = RedisServer(appendfsync="everysec")  # compose's setting
    try:
        fleet = load_fleet(FLEET_TOML)
        keys = Keys("durable")
        s = Settings(redis_url=srv.url, key_prefix=keys.prefix)
        r = client(srv.url)
        prod = Producer(r, keys, fleet, s)
        ids = [prod.submit({"endpoint": "chat", "service_s": 5, "priority": p, "idempotency_key": f"k{i}"}).id
               for i, p in enumerate(["CRITICAL", "HIGH", "NORMAL", "LOW"] * 50)]
        srv.kill()  # a crash: no SHUTDOWN, no final rewrite
        srv.start()
        r2 = client(srv.url)
        p = r2.pipeline(transaction=False)
        for j in ids:
            p.hget(keys.job(j), "state")
        assert p.execute() == ["queued"] * len(ids)
        assert sum(r2.zcard(q) for q in keys.queues()) == len(ids)
        assert sum(1 for _i, f in r2.xrange(keys.events) if json.loads(f["e"])["kind"] == "submitted") == len(ids)
        # a client that retries after the crash gets its job back, not a second one
        again = Producer(r2, keys, fleet, s).submit({"endpoint": "chat", "service_s": 5, "idempotency_key": "k7"})
        assert not again.created and again.id == ids[7]
        r.close()
        r2.close()
    finally:
        srv.stop()
