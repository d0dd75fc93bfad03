"""``MAKESPAN_REDIS_URL=unix:///path/redis.sock[?db=N]`` (docs/security.md) for real: a
private redis-server that listens on a Unix socket only, makespan's own clients and the
Celery broker both on it.

Before: every makespan client failed on its first command (redis-py's Unix socket
connection takes no TCP keepalive options: ``TypeError: ... unexpected keyword argument
'socket_keepalive'``), and the broker URL handed ``unix://`` to kombu, which knows Unix
sockets only as ``redis+socket://`` (``?db=N``: a TypeError building the connection;
without it: no socket path at all)."""

from __future__ import annotations

import subprocess

import pytest

from makespan.keys import Keys
from makespan.producer import Producer
from makespan.redis_conn import EmbeddedRedis, connect, redis_server_binary, wait_server_started
from tests.faults.private_redis import ONE_HOST, TERMINAL, fault_settings, live_system, process_logs
from tests.live import wait_for


@pytest.fixture
def unix_redis(tmp_path_factory):
    """A private redis-server on a Unix socket only (``port 0``); ``url`` is its ``unix://`` URL, db 3."""
    d = tmp_path_factory.mktemp("unix-redis")
    sock = d / "redis.sock"
    proc = subprocess.Popen([redis_server_binary(), "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
                             "--dir", str(d), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    emb = EmbeddedRedis(f"unix://{sock}?db=3", proc, str(d))
    try:
        # answering, not just its socket file made: the file exists from the bind, before the
        # listen (a connection then is refused), and a silent 10 s deadline went on regardless
        wait_server_started(proc, emb.url, 60)
        yield emb
    finally:
        emb.stop()


def test_makespan_clients_reach_redis_on_a_unix_socket(unix_redis):
    c = connect(unix_redis.url)
    assert c.ping()
    c.set("unix-probe", "1")
    assert c.connection_pool.connection_kwargs["db"] == 3
    c.delete("unix-probe")


def test_jobs_run_with_redis_on_a_unix_socket(unix_redis, tmp_path):
    """A planner, a GPU worker and the observer on the Unix socket: jobs complete, so the
    broker's messages go through the same Redis and database as makespan's keys."""
    s = fault_settings(unix_redis.url, "unixsock")
    with live_system(tmp_path, s, ONE_HOST) as (system, fleet):
        r, keys = connect(s.redis_url), Keys(s.key_prefix)
        ids = [Producer(r, keys, fleet, s).submit({"endpoint": "sim", "service_s": 10}).id for _ in range(3)]
        try:
            wait_for(lambda: all(r.hget(keys.job(j), "state") in TERMINAL for j in ids), 60, "the jobs to end", 0.2)
        except TimeoutError:
            pytest.fail(f"jobs did not end: {[r.hgetall(keys.job(j)) for j in ids]}; logs {process_logs(system)}")
        assert [r.hget(keys.job(j), "state") for j in ids] == ["completed"] * 3
        db0 = connect(unix_redis.url.replace("?db=3", "?db=0"))
        assert list(r.scan_iter(f"{keys.celery_prefix}*")), "Celery's keys are not in the URL's database"
        assert not list(db0.scan_iter("*")), "something wrote into database 0"
