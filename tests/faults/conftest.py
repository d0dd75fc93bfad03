"""Fixtures of the faults tests that break Redis: each gets a Redis deployment of its own
(helpers in :mod:`tests.faults.private_redis`)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from bench.chaos_redis import RedisServer, SentinelSet, sentinel_binary
from makespan.errors import StoreError
from makespan.redis_conn import EmbeddedRedis, free_port, ping, redis_server_binary, start_embedded
from tests.faults.private_redis import tls_files


@pytest.fixture
def private_redis():
    """A private redis-server without persistence (:class:`makespan.redis_conn.EmbeddedRedis`)."""
    emb = start_embedded()
    try:
        yield emb
    finally:
        emb.stop()


@pytest.fixture
def aof_redis():
    """A private append-only redis-server that can be SIGKILLed and started again on the
    same port and directory (:class:`bench.chaos_redis.RedisServer`)."""
    srv = RedisServer()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def sentinel_set():
    """A primary, a replica and three Sentinels (:class:`bench.chaos_redis.SentinelSet`);
    skipped where neither ``redis-sentinel`` nor ``redis-server`` is installed."""
    if not sentinel_binary():
        pytest.skip("needs redis-server (or redis-sentinel)")
    try:
        sset = SentinelSet()
    except StoreError:  # the set did not form: a port free_port() chose can be taken by a process another
        sset = SentinelSet()  # test started before the Sentinel bound it; a second set gets fresh ports
    try:
        yield sset
    finally:
        sset.stop()


@pytest.fixture
def tls_redis(tmp_path_factory):
    """A private redis-server that speaks only TLS, with a certificate of a CA of its own;
    its ``url`` is a ``rediss://`` URL that verifies it (``ssl_cert_reqs=required``).
    Skipped where openssl is missing or redis-server was built without TLS."""
    if not shutil.which("openssl"):
        pytest.skip("needs openssl")
    d = tmp_path_factory.mktemp("tls-redis")
    files = tls_files(d)
    port = free_port()
    proc = subprocess.Popen([redis_server_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", files["cert"], "--tls-key-file", files["key"],
                             "--tls-ca-cert-file", files["ca"], "--tls-auth-clients", "no", "--dir", str(d),
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={files['ca']}"
    emb = EmbeddedRedis(url, proc, str(d))
    try:
        deadline = time.monotonic() + 10
        while not ping(url, 0.5):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip("redis-server did not start with TLS (built without it?)")
            time.sleep(0.05)
        yield emb
    finally:
        emb.stop()
