"""Retention on a real Redis: compaction, count and age limits, idempotency keys, events cap."""

from __future__ import annotations

import json
import time
from dataclasses import replace

from app.producer import Producer
from app.models import load_fleet
from workers.retention import SUMMARY_FIELDS, Retention, finished_key, mark_finished, retained_key
from tests.conftest import FLEET_TOML


def _finish(r, keys, jid: str, at_s: float) -> None:
    r.zrem(keys.queue("normal"), jid)
    r.hset(keys.job(jid), mapping={"state": "completed", "finished_at": repr(at_s), "reason": ""})
    mark_finished(r, keys, jid, at_s)


def test_compacts_then_expires_by_count_with_idempotency_keys(r, keys, settings):
    fleet = load_fleet(FLEET_TOML)
    s = replace(settings, retention_jobs=3, retention_age_s=3600.0, retention_batch=100, events_max_len=10)
    prod = Producer(r, keys, fleet, s)
    ids = [prod.submit({"endpoint": "embed", "service_s": 1, "payload": {"x": "y" * 500},
                        "idempotency_key": f"k{i}"}).id for i in range(5)]
    now = time.time()
    for i, jid in enumerate(ids):
        _finish(r, keys, jid, now - 10 + i)
    ret = Retention(r, s)
    out = ret.sweep(now)  # compaction, then the count limit: the two oldest go with their keys
    assert out.compacted == 5 and out.expired == 2
    rec = r.hgetall(keys.job(ids[-1]))
    assert "spec" not in rec and set(rec) <= set(SUMMARY_FIELDS)
    assert rec["state"] == "completed" and rec["idem"] == "k4"
    assert 0 < r.ttl(keys.job(ids[-1])) <= 3600 and 0 < r.ttl(keys.idem("k4")) <= 3600
    assert ret.sweep(now).expired == 0
    assert not r.exists(keys.job(ids[0])) and not r.exists(keys.idem("k0")) and not r.exists(keys.idem("k1"))
    assert r.zcard(retained_key(keys)) == 3 and r.get(keys.idem("k2")) == ids[2]
    again = prod.submit({"endpoint": "embed", "service_s": 1, "idempotency_key": "k0"})
    assert again.created and again.id != ids[0]


def test_age_limit_events_cap_and_unfinished_jobs_wait(r, keys, settings):
    fleet = load_fleet(FLEET_TOML)
    s = replace(settings, retention_jobs=1000, retention_age_s=60.0, retention_batch=100, events_max_len=10)
    prod = Producer(r, keys, fleet, s)
    ids = [prod.submit({"endpoint": "embed", "service_s": 1}).id for i in range(300)]
    now = time.time()
    _finish(r, keys, ids[0], now - 120)  # older than the age limit
    _finish(r, keys, ids[1], now)
    mark_finished(r, keys, ids[2], now)  # marked but still queued: must not be compacted
    ret = Retention(r, s)
    out = ret.sweep(now)
    assert out.compacted == 2 and out.pending == 1 and out.expired == 1
    assert json.loads(r.hget(keys.job(ids[2]), "spec"))["endpoint"] == "embed"
    assert not r.exists(keys.job(ids[0])) and r.exists(keys.job(ids[1]))
    assert r.xlen(keys.events) < 300  # trimmed towards events_max_len (approximate: whole nodes)
    assert r.zscore(finished_key(keys), ids[2]) is not None
