"""Fixtures of the faults tests that break Redis: each gets a Redis deployment of its own
(helpers in :mod:`tests.faults.private_redis`)."""

from __future__ import annotations

import pytest

from bench.chaos_redis import RedisServer, SentinelSet, sentinel_binary
from makespan.errors import StoreError
from makespan.redis_conn import start_embedded


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
