"""Issue 18, failures 2 and 9: GPU workers and the observer survive a Redis role change.

On a private Redis (never the shared one): a planner, two GPU workers and the observer
run; the Redis becomes a replica of an unreachable primary for 3 s (``REPLICAOF``: every
blocked ``BRPOP`` ends with ``UNBLOCKED``, every write answers ``READONLY``), then a
primary again (``REPLICAOF NO ONE``). The GPU workers used to log ``Unrecoverable error:
… UNBLOCKED`` and exit 0, and the jobs submitted afterwards failed as their leases
expired with no consumer. Now every process is still running, the jobs submitted
before and after all complete, and a worker that really cannot go on (its Redis user
loses the right to ``BRPOP``) exits non-zero.
"""

from __future__ import annotations

import time

import pytest

from bench.chaos_redis import RefusingPort
from makespan.keys import Keys
from makespan.producer import Producer
from makespan.redis_conn import connect
from tests.faults.private_redis import TERMINAL, fault_settings, live_system, process_logs
from tests.live import wait_for


@pytest.fixture
def live(private_redis, tmp_path):
    with live_system(tmp_path, fault_settings(private_redis.url, "rolechange")) as (system, fleet):
        yield system, fleet, system.settings


def _states(r, keys, ids):
    return [r.hget(keys.job(j), "state") for j in ids]


def test_workers_and_observer_survive_a_role_change(live, private_redis):
    _survive_a_role_change(*live)


def test_workers_survive_a_role_change_over_tls(tls_redis, tmp_path):
    """The same over ``rediss://``: the broker URL kept kombu's own transport for TLS, so
    none of makespan's broker fixes applied there, and a GPU worker on a TLS Redis (a
    managed service's failover) stopped on ``Unrecoverable error: … UNBLOCKED``."""
    with live_system(tmp_path, fault_settings(tls_redis.url, "rolechange-tls")) as (system, fleet):
        _survive_a_role_change(system, fleet, system.settings)


def _survive_a_role_change(system, fleet, s):
    r, keys = connect(s.redis_url), Keys(s.key_prefix)
    prod = Producer(r, keys, fleet, s)
    before = [prod.submit({"endpoint": "sim", "service_s": 100}).id for _ in range(2)]
    wait_for(lambda: all(x in ("running", "leased") + TERMINAL for x in _states(r, keys, before)), 30,
             "the first jobs to be leased")
    refusing = RefusingPort()  # a primary nobody answers on (no other server can take the port meanwhile)
    try:
        r.execute_command("REPLICAOF", "127.0.0.1", str(refusing.port))
        time.sleep(3.0)
        r.execute_command("REPLICAOF", "NO", "ONE")
    finally:
        refusing.close()
    time.sleep(2.0)
    dead = [(p.name, p.popen.returncode) for p in system.procs if not p.alive()]
    assert dead == [], f"processes ended on the role change: {dead}"
    after = [prod.submit({"endpoint": "sim", "service_s": 10}).id for _ in range(4)]
    try:
        wait_for(lambda: all(x in TERMINAL for x in _states(r, keys, before + after)), 90, "every job to end", 0.2)
    except TimeoutError:
        pytest.fail(f"jobs did not end: {[(j, r.hgetall(keys.job(j))) for j in before + after]}; "
                    f"logs: {process_logs(system)}")
    assert _states(r, keys, before + after) == ["completed"] * 6, \
        [(j, r.hget(keys.job(j), "reason")) for j in before + after]
    assert [p.name for p in system.procs if not p.alive()] == []


def test_a_gpu_worker_that_cannot_go_on_exits_non_zero(live, private_redis):
    system, fleet, s = live
    r = connect(s.redis_url)
    r.execute_command("ACL", "SETUSER", "default", "-brpop")  # its consumer can never read its queue again
    workers = [p for p in system.procs if p.name.startswith("gpu-")]
    for p in workers:
        p.popen.wait(timeout=60)
    assert [p.popen.returncode for p in workers] == [1, 1], \
        "a GPU worker stopped on an unrecoverable error with exit code 0: a restart-on-failure supervisor leaves it down"
