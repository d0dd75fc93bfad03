"""Retention and idempotency keys (found by a review, 2026-12-04): each test fails on the
code before its fix. In-process on the real Redis."""

from __future__ import annotations

import time
import types

import pytest
import redis

from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.settings import Settings
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner
from makespan.workers.retention import Retention
from tests.conftest import FLEET_TOML

GPU = "GPU-host-a-3"


def _settings(redis_url, prefix, **kw) -> Settings:
    return Settings(redis_url=redis_url, key_prefix=prefix, time_scale=0.01, lease_ttl_s=3.0, heartbeat_s=0.5,
                    retention_sweep_s=0.0, **kw)


def _lease(r, keys, job_id) -> PhaseContext:
    lease = LeaseStore(r, keys).acquire("L-" + job_id, (GPU,), 30.0, job_id=job_id, kind="job", holder="host-a",
                                        queue=keys.queue("NORMAL"))
    assert lease is not None
    return PhaseContext("L-" + job_id, lease.token, [GPU], "host-a", "job", "embed", job_id, "NORMAL", 1.0)


def test_an_idempotency_key_lives_as_long_as_the_summary_a_dependant_keeps(r, keys, redis_url, prefix):
    """Compaction gave the key the retention TTL even when the record was kept (a queued
    job waits on it): the key died first, and the same key then created a second job while
    the first one's summary still answered."""
    settings = _settings(redis_url, prefix, retention_age_s=60)
    fleet = load_fleet(FLEET_TOML)
    producer = Producer(r, keys, fleet, settings)
    first = producer.submit({"endpoint": "embed", "service_s": 1, "idempotency_key": "nightly"})
    waiting = producer.submit({"endpoint": "embed", "service_s": 1, "depends_on": [first.id]})
    assert PhaseRunner(r, settings, fleet)._finish(_lease(r, keys, first.id), "completed", "") == "completed"
    assert Retention(r, settings).sweep().compacted == 1
    assert r.ttl(keys.job(first.id)) == -1 and r.ttl(keys.idem("nightly")) == -1  # kept while `waiting` waits
    Retention(r, settings).sweep(time.time() + 3 * 60)  # past the age limit: kept, still waited on
    again = producer.submit({"endpoint": "embed", "service_s": 1, "idempotency_key": "nightly"})
    assert (again.id, again.created) == (first.id, False)
    assert r.hget(keys.job(waiting.id), "state") == "queued"


def test_a_dependant_submitted_after_compaction_keeps_the_idempotency_key_too(r, keys, redis_url, prefix):
    settings = _settings(redis_url, prefix, retention_age_s=60)
    fleet = load_fleet(FLEET_TOML)
    producer = Producer(r, keys, fleet, settings)
    first = producer.submit({"endpoint": "embed", "service_s": 1, "idempotency_key": "k2"})
    assert PhaseRunner(r, settings, fleet)._finish(_lease(r, keys, first.id), "completed", "") == "completed"
    assert Retention(r, settings).sweep().compacted == 1
    assert r.ttl(keys.job(first.id)) > 0 and r.ttl(keys.idem("k2")) > 0
    producer.submit({"endpoint": "embed", "service_s": 1, "depends_on": [first.id]})
    assert r.ttl(keys.job(first.id)) == -1 and r.ttl(keys.idem("k2")) == -1


SKEW_S = 120.0  # a GPU worker's or a producer's clock this far behind the planner's


def test_a_job_finished_on_a_host_whose_clock_runs_behind_keeps_its_summary(r, keys, redis_url, prefix, monkeypatch):
    """The finished index was scored on the finishing host's clock and the sweep compared it
    with the planner's: with a skew past the retention age the summary and the key were
    deleted at the next sweep (the same key then created a second job). Scored and swept on
    the Redis server's clock."""
    import makespan.producer as producer_module

    settings = _settings(redis_url, prefix, retention_age_s=60)
    fleet = load_fleet(FLEET_TOML)
    producer = Producer(r, keys, fleet, settings)
    done = producer.submit({"endpoint": "embed", "service_s": 1, "idempotency_key": "once"})
    ctx = _lease(r, keys, done.id)
    runner = PhaseRunner(r, settings, fleet)
    assert runner.leases.fenced(ctx.lease, runner._finish_ops(ctx, "completed", "", time.time() - SKEW_S))
    cancelled = producer.submit({"endpoint": "embed", "service_s": 1, "idempotency_key": "c1", "delay_s": 600})
    monkeypatch.setattr(producer_module, "time", types.SimpleNamespace(time=lambda: time.time() - SKEW_S))
    assert producer.cancel(cancelled.id) == "cancelled"
    monkeypatch.undo()
    Retention(r, settings).sweep()
    assert r.exists(keys.job(done.id)) and r.exists(keys.job(cancelled.id))
    again = producer.submit({"endpoint": "embed", "service_s": 1, "idempotency_key": "once"})
    assert (again.id, again.created) == (done.id, False)


class _FailsOnce:
    """A client whose next pipeline fails on execute (a connection dropped, a Redis restart)."""

    def __init__(self, r):
        self._r, self.armed = r, True

    def __getattr__(self, name):
        return getattr(self._r, name)

    def pipeline(self, *args, **kwargs):
        pipe = self._r.pipeline(*args, **kwargs)
        if self.armed:
            self.armed = False

            def fail(*_args, **_kwargs):
                pipe.reset()
                raise redis.ConnectionError("Connection closed by server.")
            pipe.execute = fail
        return pipe


def test_a_failed_compaction_round_trip_loses_no_finished_job(r, keys, redis_url, prefix):
    """The sweep popped the finished ids, then compacted them in a second round trip: when
    that failed they were in no index any more, their full records and idempotency keys
    never got a TTL. The ids leave the finished index in the compaction script itself."""
    settings = _settings(redis_url, prefix, retention_age_s=60)
    producer = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    job = producer.submit({"endpoint": "embed", "service_s": 1, "idempotency_key": "k", "payload": {"big": "x" * 1000}})
    assert producer.cancel(job.id) == "cancelled"
    with pytest.raises(redis.ConnectionError):
        Retention(_FailsOnce(r), settings).sweep()
    assert Retention(r, settings).sweep().compacted == 1
    assert r.zscore(keys.finished, job.id) is None and r.zscore(keys.retained, job.id) is not None
    assert r.ttl(keys.job(job.id)) > 0 and r.ttl(keys.idem("k")) > 0
