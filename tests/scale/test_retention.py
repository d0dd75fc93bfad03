"""Retention on a real Redis: compaction, count and age limits, idempotency keys, events cap."""

from __future__ import annotations

import time
from dataclasses import replace

from makespan.producer import Producer
from makespan.models import load_fleet
from makespan.workers.retention import SUMMARY_FIELDS, Retention, finished_key, mark_finished, retained_key
from tests.conftest import FLEET_TOML


def _finish(r, keys, jid: str, at_s: float) -> None:
    r.zrem(keys.queue("normal"), jid)
    r.hset(keys.job(jid), mapping={"state": "completed", "finished_at": repr(at_s), "reason": ""})
    mark_finished(r, keys, jid, at_s)


def test_compacts_then_expires_by_count_with_idempotency_keys(r, keys, settings, caplog):
    fleet = load_fleet(FLEET_TOML)
    s = replace(settings, retention_jobs=3, retention_age_s=3600.0, retention_batch=100, events_max_len=10)
    prod = Producer(r, keys, fleet, s)
    ids = [prod.submit({"endpoint": "embed", "service_s": 1, "payload": {"x": "y" * 500},
                        "idempotency_key": f"k{i}"}).id for i in range(4)]
    ids.append(prod.submit({"endpoint": "embed", "service_s": 1, "idempotency_key": "k4", "depends_on": ids[:2]}).id)
    now = time.time()
    r.hset(keys.job(ids[-1]), "pool", "east")  # a pooled fleet's job (makespan.pools): `jobs --pool` lists it after compaction
    r.hset(keys.job(ids[-1]), mapping={"lease": "L-last", "token": "7"})  # the lease it last held, as its finish left it
    for i, jid in enumerate(ids):
        _finish(r, keys, jid, now - 10 + i)
    ret = Retention(r, s)
    with caplog.at_level("WARNING", logger="makespan.workers.retention"):
        out = ret.sweep(now)  # compaction, then the count limit: the two oldest go with their keys
    assert out.compacted == 5 and out.expired == 2
    # ... long before the age limit: said (a large-queue check found keys reused, their work run again)
    [warning] = [rec.getMessage() for rec in caplog.records if "MAKESPAN_RETENTION_JOBS=3" in rec.getMessage()]
    assert "deleted 2 finished-job summaries younger than MAKESPAN_RETENTION_AGE_S=3600 s" in warning
    rec = r.hgetall(keys.job(ids[-1]))
    assert "spec" not in rec and set(rec) <= set(SUMMARY_FIELDS)
    assert rec["state"] == "completed" and rec["idem"] == "k4" and rec["pool"] == "east"
    # status: the lease it last held, with its fencing token (the token was dropped: null)
    assert prod.status(ids[-1])["lease"] == "L-last" and prod.status(ids[-1])["token"] == 7
    assert prod.status(ids[-1])["deps"] == ids[:2]  # not [] ("had none") once compacted
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
    assert r.hget(keys.job(ids[2]), "endpoint") == "embed" and r.hexists(keys.job(ids[2]), "spec")
    assert not r.exists(keys.job(ids[0])) and r.exists(keys.job(ids[1]))
    assert r.xlen(keys.events) < 300  # trimmed towards events_max_len (approximate: whole nodes)
    assert r.zscore(finished_key(keys), ids[2]) is not None


def test_workload_steps_request_records_and_finished_workloads_are_bounded(r, keys, settings):
    from makespan.workloads import Workload, advance_workloads, submit_workload, workload_status

    fleet = load_fleet(FLEET_TOML)
    s = replace(settings, retention_jobs=1, retention_age_s=60.0, retention_batch=100)
    wl = Workload("wl")
    a = wl.step("a", "embed", service_s=1)
    wl.step("b", "embed", service_s=1, after=[a])
    wid = submit_workload(r, keys, fleet, wl, s)
    ids = workload_status(r, keys, wid)["steps"]
    ja, jb = ids["a"]["job"], ids["b"]["job"]
    other = Producer(r, keys, fleet, s).submit({"endpoint": "embed", "service_s": 1}).id
    now = time.time()
    r.rpush(keys.requests(ja), '{"i": 0}')
    r.rpush(keys.requests(other), '{"i": 0}')
    _finish(r, keys, ja, now - 120)  # step a done long ago while b still waits: a's state must stay
    _finish(r, keys, other, now - 100)
    ret = Retention(r, s)
    ret.sweep(now)
    assert r.hget(keys.job(ja), "state") == "completed" and r.ttl(keys.job(ja)) == -1
    assert r.llen(keys.requests(ja)) == 1 and r.ttl(keys.requests(ja)) == -1  # results of finished steps kept
    assert not r.exists(keys.job(other)) and not r.exists(keys.requests(other))  # age limit: record and requests
    ret.sweep(now)
    assert r.hget(keys.job(ja), "state") == "completed"  # still kept: its workload runs
    _finish(r, keys, jb, now)
    assert advance_workloads(r, keys)["finished"] == 1
    assert workload_status(r, keys, wid)["state"] == "completed"
    later = now + 61
    ret.sweep(later)
    ret.sweep(later)
    assert not r.exists(keys.workload(wid)) and r.zscore(keys.workloads, wid) is None
    assert r.zcard(keys.workloads_done) == 0
    assert not r.exists(keys.job(ja)) and not r.exists(keys.requests(ja))


def test_a_repeated_key_of_a_compacted_job_still_says_what_it_ignored(r, keys, settings):
    """A new user resubmitted a finished job's key with another function and arguments: the
    summary no longer held the spec, and the caller got the first job's result with no word.
    The summary keeps a digest of each spec key, so the repeat names what differs."""
    fleet = load_fleet(FLEET_TOML)
    s = replace(settings, retention_jobs=100, retention_age_s=3600.0, retention_batch=100)
    prod = Producer(r, keys, fleet, s)
    first = {"endpoint": "embed", "service_s": 1, "workload": "shout", "args": ["alpha"], "idempotency_key": "k5"}
    jid = prod.submit(first).id
    _finish(r, keys, jid, time.time() - 1)
    assert Retention(r, s).sweep(time.time()).compacted == 1
    assert "spec" not in r.hgetall(keys.job(jid))
    assert prod.submit(first).ignored == ()  # the same request: nothing ignored
    other = prod.submit({**first, "workload": "add", "args": [1, 2]})
    assert not other.created and other.id == jid and other.ignored == ("args", "workload")
    assert prod.submit({**first, "payload": {"n": 1}}).ignored == ("payload",)
    # a summary written before the digest was kept: the function name still compares
    r.hdel(keys.job(jid), "spec_digest")
    assert prod.submit({**first, "workload": "add"}).ignored == ("workload",)


def test_a_workload_steps_summary_keeps_its_step_name(r, keys, settings):
    """A finished workload step's job page lost its step name once the retention sweep
    compacted the record (a verifier): the summary keeps ``step`` beside ``workload_id``."""
    from makespan.workloads import cancel_workload, submit_workload

    fleet = load_fleet(FLEET_TOML)
    wid = submit_workload(r, keys, fleet, {"name": "wl", "steps": [{"name": "gen", "endpoint": "chat",
                                                                      "service_s": 5}]}, settings)
    assert cancel_workload(r, keys, wid)["cancelled"] == 1
    assert Retention(r, settings).sweep().compacted == 1
    (job_id,) = r.zrange(keys.retained, 0, -1)
    assert r.hmget(keys.job(job_id), "workload_id", "step") == [wid, "gen"]
