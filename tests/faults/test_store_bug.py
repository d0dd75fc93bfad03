"""A Redis error reply caused by a bug (a Lua script on a key of the wrong type,
WRONGTYPE, wrong arguments) is not an outage: the store raises it as a ``StoreBug``
and the long-running loops log it once, at ERROR, with its traceback, as a bug. Before,
every ``redis.RedisError`` read as "Redis unavailable" and was retried without end.
Transient server states (LOADING, READONLY, OOM, ...) and connection errors stay outages."""

from __future__ import annotations

import logging
import threading

import pytest
import redis

from makespan.errors import StoreBug, StoreError
from makespan.models import load_fleet
from makespan.redis_conn import OutageLog, connect, is_store_bug, store_error
from makespan.store.jobs import JobStore
from makespan.workers import planner_worker
from makespan.workers.planner_worker import PlannerWorker
from tests.conftest import FLEET_TOML
from tests.live import wait_for


def test_a_script_on_a_key_of_the_wrong_type_is_a_bug(r, keys):
    r.set(keys.delayed, "not a sorted set")
    with pytest.raises(StoreError) as raised:
        JobStore(r, keys).promote_delayed(0.0, 10)
    assert isinstance(raised.value, StoreBug), type(raised.value).__mro__
    assert isinstance(raised.value, redis.ResponseError)  # callers that catch the redis-py class still do
    assert "script promote_delayed" in str(raised.value) and "WRONGTYPE" in str(raised.value)
    assert is_store_bug(raised.value)


def test_wrong_arguments_are_a_bug_and_an_unreachable_redis_is_not(r, keys, refused_port):
    with pytest.raises(redis.ResponseError) as wrong_args:
        r.execute_command("GET", keys.delayed, "extra")
    assert is_store_bug(wrong_args.value)
    assert isinstance(store_error(wrong_args.value, "get"), StoreBug)
    down = connect(f"redis://127.0.0.1:{refused_port}/0")
    with pytest.raises(redis.ConnectionError) as refused:
        down.get(keys.delayed)
    assert not is_store_bug(refused.value)
    outage = store_error(refused.value, "get")
    assert isinstance(outage, StoreError) and not isinstance(outage, StoreBug)


@pytest.mark.parametrize("reply", [
    "LOADING Redis is loading the dataset in memory",
    "READONLY You can't write against a read only replica.",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
    "TRYAGAIN Multiple keys request during rehashing of slot",
    "NOREPLICAS Not enough good replicas to write.",
    "OOM command not allowed when used memory > 'maxmemory'.",
    "ERR Error running script (call to f_0123): @user_script:1: @user_script: 1: -READONLY You can't write",
])
def test_transient_server_states_stay_outages(reply):
    error = redis.ResponseError(reply)
    assert not is_store_bug(error)
    assert not isinstance(store_error(error, "script x"), StoreBug)


def test_the_planner_tick_loop_logs_a_bug_once_not_an_outage(monkeypatch, r, keys, settings, caplog):
    """A real planner ticking on a real Redis whose delayed-jobs key has the wrong type."""
    made: list[OutageLog] = []

    class Counted(OutageLog):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(planner_worker, "OutageLog", Counted)
    r.set(keys.delayed, "not a sorted set")
    worker = PlannerWorker(r, settings, load_fleet(FLEET_TOML))
    thread = threading.Thread(target=worker._tick_until_deposed, daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="makespan.planner"):
            thread.start()
            wait_for(lambda: made and made[0].failures + getattr(made[0], "bugs", 0) >= 3, 30,
                     "three ticks failing on the bug")
            worker.stop()
            thread.join(10)
    finally:
        worker.stop()
        worker.close()
    assert not thread.is_alive()
    lines = [rec for rec in caplog.records if rec.name == "makespan.planner"]
    assert not any("Redis unavailable" in rec.getMessage() for rec in lines), [rec.getMessage() for rec in lines]
    assert made[0].failures == 0  # no outage opened
    assert len(lines) == 1, [rec.getMessage() for rec in lines]
    assert lines[0].levelno == logging.ERROR
    assert "a bug, not an outage" in lines[0].getMessage()
    assert "script promote_delayed" in lines[0].getMessage() and "WRONGTYPE" in lines[0].getMessage()
    assert lines[0].exc_info is not None and lines[0].exc_info[1] is not None  # with its traceback


def test_a_gpu_worker_phase_that_hits_a_bug_fails_its_job_at_once(r, keys, settings):
    """A phase body that hits a Redis bug used to re-raise it as an outage: the task
    failed, the lease ran out its TTL, and the job was requeued to hit the bug again, up to
    ``max_attempts``. Now the job fails at once through the phase runner's one catch of
    unanticipated errors, with the bug as its reason, and its lease is released."""
    import json

    from makespan.producer import Producer
    from makespan.workers.leases import LeaseStore
    from makespan.workers.phases import PhaseContext, PhaseRunner

    fleet = load_fleet(FLEET_TOML)
    job_id = Producer(r, keys, fleet, settings).submit({"endpoint": "embed", "service_s": 5, "priority": "HIGH"}).id
    lease = LeaseStore(r, keys).acquire("L1", ("GPU-host-a-3",), settings.lease_ttl_s, job_id=job_id, kind="job",
                                        holder="host-a", queue=keys.queue("HIGH"))
    assert lease is not None
    ctx = PhaseContext("L1", lease.token, ["GPU-host-a-3"], "host-a", "job", "embed", job_id, "HIGH", 300.0)
    r.set(keys.delayed, "not a sorted set")
    runner = PhaseRunner(r, settings, fleet)
    outcome = runner.guarded(ctx, "execute", lambda: str(JobStore(r, keys).promote_delayed(0.0, 10)))
    assert outcome == "failed"
    job = r.hgetall(keys.job(job_id))
    assert job["state"] == "failed"
    assert "WRONGTYPE" in job.get("reason", "") and "script promote_delayed" in job.get("reason", ""), job
    assert not r.exists(keys.lease("L1"))  # released at once, not held to the TTL
    failed = [json.loads(f["e"]) for _id, f in r.xrange(keys.events) if json.loads(f["e"])["kind"] == "failed"]
    assert failed and "Traceback" in failed[-1].get("traceback", ""), failed


def test_a_transient_reply_stays_an_outage_once_wrapped_or_in_a_pipeline(private_redis, r, keys, settings):
    """A Redis that refuses writes for a while (``NOREPLICAS``: ``min-replicas-to-write``
    with no replica left, as during a failover; ``BUSY`` and ``MISCONF`` come the same way,
    as plain ``ResponseError``s) is an outage. The store wraps the reply ("script
    promote_delayed: NOREPLICAS ...", :func:`store_error`) and redis-py prefixes a
    pipeline's ("Command # 1 (...) of pipeline caused error: NOREPLICAS ..."); read again,
    neither reply started with its code, so both read as bugs: a GPU worker's phase failed
    its job at once and the loops logged a bug instead of waiting the outage out."""
    from makespan.keys import Keys
    from makespan.producer import Producer
    from makespan.workers.leases import LeaseStore
    from makespan.workers.phases import PhaseContext, PhaseRunner

    refusing = connect(private_redis.url)
    private_keys = Keys("transient-reply")  # a private Redis, gone with the fixture
    refusing.zadd(private_keys.delayed, {"job-1": 0})
    refusing.config_set("min-replicas-to-write", 1)
    with pytest.raises(StoreError) as scripted:
        JobStore(refusing, private_keys).promote_delayed(1e12, 10)
    with pytest.raises(redis.ResponseError) as piped:
        refusing.pipeline(transaction=True).set(private_keys.seq, 1).execute()
    for error in (scripted.value, piped.value):
        assert "NOREPLICAS" in str(error), str(error)
        assert not is_store_bug(error), str(error)
        outage = OutageLog(logging.getLogger("makespan.test"), "a loop")
        outage.failed(error)
        assert (outage.failures, outage.bugs) == (1, 0), str(error)
    assert not isinstance(scripted.value, StoreBug)

    # a phase that hits it leaves the job to its lease's reclaim, as after any outage
    fleet = load_fleet(FLEET_TOML)
    job_id = Producer(r, keys, fleet, settings).submit({"endpoint": "embed", "service_s": 5, "priority": "HIGH"}).id
    lease = LeaseStore(r, keys).acquire("L1", ("GPU-host-a-3",), settings.lease_ttl_s, job_id=job_id, kind="job",
                                        holder="host-a", queue=keys.queue("HIGH"))
    assert lease is not None
    ctx = PhaseContext("L1", lease.token, ["GPU-host-a-3"], "host-a", "job", "embed", job_id, "HIGH", 300.0)

    def body() -> str:
        raise scripted.value

    with pytest.raises(StoreError):
        PhaseRunner(r, settings, fleet).guarded(ctx, "execute", body)
    assert r.hget(keys.job(job_id), "state") != "failed"
    assert r.exists(keys.lease("L1"))
