"""Issue 18, must-contain 2: Redis Sentinel for real.

One primary, one replica and three Debian ``redis-sentinel`` processes on localhost
(ports of their own; never the shared Redis). A planner, a GPU worker and the observer
reach Redis only through ``redis+sentinel://`` (makespan's clients through redis-py's
Sentinel, the Celery broker through kombu's ``sentinel://`` transport with
``master_name``). Jobs run; the primary is SIGKILLed; the Sentinels promote the
replica; the system carries on, and every job whose submit returned — with
``MAKESPAN_SUBMIT_WAIT_REPLICAS=1``, so each was on the replica before it was
acknowledged — completes on the new primary.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import replace

import pytest
import redis

from makespan.errors import StoreError
from makespan.keys import Keys
from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect, free_port
from makespan.settings import Settings
from tests.conftest import FLEET_TOML
from tests.live import wait_for

SERVICE = "makespan-test"
FLEET = """
name = "sentinel"
[[hosts]]
name = "h1"
gpu_count = 2
memory_mib = 40000
[endpoints.sim]
model = "sim/model"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
"""
TERMINAL = ("completed", "failed", "cancelled")

pytestmark = pytest.mark.skipif(not shutil.which("redis-sentinel") or not shutil.which("redis-server"),
                                reason="needs Debian's redis-server and redis-sentinel (apt-get install redis-sentinel)")


def _wait(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except redis.RedisError:
            pass
        time.sleep(0.1)
    raise TimeoutError(what)


def _role(client) -> str | None:
    try:
        return client.info("replication")["role"]
    except redis.RedisError:
        return None


@pytest.fixture
def sentinel_set(tmp_path):
    procs: list[subprocess.Popen] = []
    primary, replica = free_port(), free_port()
    sentinels = [free_port() for _ in range(3)]

    def spawn(args, name):
        log = open(tmp_path / f"{name}.log", "ab")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(p)
        return p

    servers = {}
    for name, port, extra in (("primary", primary, []), ("replica", replica, ["--replicaof", "127.0.0.1", str(primary)])):
        d = tmp_path / name
        d.mkdir()
        servers[name] = spawn(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d), "--save", "",
                               "--appendonly", "no", *extra], name)
    for i, port in enumerate(sentinels):
        conf = tmp_path / f"sentinel-{i}.conf"
        conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
                        f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n"
                        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                        f"sentinel failover-timeout {SERVICE} 10000\n"
                        f"sentinel parallel-syncs {SERVICE} 1\n")
        spawn(["redis-sentinel", str(conf)], f"sentinel-{i}")
    try:
        rep = redis.Redis(port=replica, decode_responses=True)
        _wait(lambda: rep.info("replication").get("master_link_status") == "up", 30, "the replica to sync")
        for port in sentinels:
            s = redis.Redis(port=port, decode_responses=True)
            _wait(lambda s=s: s.sentinel_master(SERVICE)["num-other-sentinels"] == 2
                  and s.sentinel_master(SERVICE)["num-slaves"] == 1, 30, "the Sentinels to see each other")
        url = "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in sentinels) + f"/{SERVICE}/0"
        info = {"url": url, "primary": servers["primary"], "primary_port": primary, "replica_port": replica}

        def restart_primary():
            info["primary"] = spawn(["redis-server", "--port", str(primary), "--bind", "127.0.0.1", "--dir",
                                     str(tmp_path / "primary"), "--save", "", "--appendonly", "no"], "primary")
        info["restart_primary"] = restart_primary

        def failed_over() -> bool:  # every Sentinel names the old replica as the primary
            try:
                return all(int(redis.Redis(port=p).sentinel_get_master_addr_by_name(SERVICE)[1]) == replica
                           for p in sentinels)
            except (redis.RedisError, TypeError):
                return False
        info["failed_over"] = failed_over
        yield info
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()


def test_jobs_survive_a_sentinel_failover(sentinel_set, tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    s = Settings(redis_url=sentinel_set["url"], key_prefix="sentinel", time_scale=0.01, lease_ttl_s=5.0,
                 heartbeat_s=0.5, batch_wait_s=0.02, planner_tick_s=0.05, redis_socket_timeout_s=2.0,
                 redis_connect_timeout_s=1.0, submit_wait_replicas=1, submit_wait_timeout_s=2.0)
    system = LiveSystem(path, fleet, s, tmp_path / "logs", planners=1, observer=True)
    system.start()
    try:
        r, keys = connect(s.redis_url), Keys(s.key_prefix)
        prod = Producer(r, keys, fleet, s)
        accepted = [prod.submit({"endpoint": "sim", "service_s": 20}).id for _ in range(6)]
        wait_for(lambda: r.hget(keys.job(accepted[0]), "state") in TERMINAL, 60, "a first job to end")
        sentinel_set["primary"].send_signal(signal.SIGKILL)
        sentinel_set["primary"].wait()  # the primary dies: the Sentinels fail over
        new_primary = redis.Redis(port=sentinel_set["replica_port"], decode_responses=True)
        refused: list[str] = []
        deadline = time.monotonic() + 90
        while len(accepted) < 14 and time.monotonic() < deadline:
            if sentinel_set["primary"].poll() is not None and sentinel_set["failed_over"]():
                sentinel_set["restart_primary"]()  # it comes back; the Sentinels make it the new replica
            try:
                accepted.append(prod.submit({"endpoint": "sim", "service_s": 20}).id)  # acknowledged: must survive
            except StoreError as e:  # no writable primary yet, or no replica acknowledged: not accepted
                refused.append(str(e))
                time.sleep(0.2)
        assert len(accepted) == 14, f"submits never succeeded again after the failover: {refused[-3:]}"
        assert _role(new_primary) == "master"
        # while the new primary had no replica, a submit was refused, never acknowledged unsafely
        assert any("replica(s) acknowledged" in e for e in refused), refused[-3:]

        def states():
            return [r.hget(keys.job(j), "state") for j in accepted]

        try:
            wait_for(lambda: all(x in TERMINAL for x in states()), 120, "every accepted job to end", 0.2)
        except TimeoutError:
            logs = {p.name: p.log_path.read_text(errors="replace")[-2000:] for p in system.procs}
            pytest.fail(f"accepted jobs did not end: {list(zip(accepted, states()))}; logs {logs}")
        assert states() == ["completed"] * 14
        assert [(p.name, p.popen.returncode) for p in system.procs if not p.alive()] == []
    finally:
        system.stop()


def test_submit_waiting_for_a_replica_that_is_not_there_raises(r, keys, settings):
    """The shared test Redis has no replica: with MAKESPAN_SUBMIT_WAIT_REPLICAS=1 a submit
    is written on the primary but not acknowledged (StoreError naming the job)."""
    fleet = load_fleet(FLEET_TOML)
    prod = Producer(r, keys, fleet, replace(settings, submit_wait_replicas=1, submit_wait_timeout_s=0.1))
    with pytest.raises(StoreError) as err:
        prod.submit({"endpoint": "embed", "service_s": 1})
    assert "only 0 of 1 replica(s) acknowledged it" in str(err.value)
    assert Producer(r, keys, fleet, settings).submit({"endpoint": "embed", "service_s": 1}).created  # no wait: accepted
