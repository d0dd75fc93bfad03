"""Issue 18: real memory pressure. Redis at ``maxmemory`` under ``noeviction`` refuses
every write that may grow memory and every command queued in a ``MULTI`` with ``OOM``.

The chaos runner's ``memory_pressure`` found a GPU worker that stopped on it
(``Unrecoverable error: OutOfMemoryError`` from kombu's ack, a ``MULTI`` on the unacked
index, raised inside Celery's event loop). The broker's connections now take ``OOM``
for what it is, a transient refusal: a connection error, so the ack is skipped (the
message comes back after the visibility timeout; phases are idempotent and fenced) and
the consumer reconnects until memory is freed. On a private redis-server, never the
shared one.
"""

from __future__ import annotations

import pytest
import redis
from kombu import Connection

from makespan.broker import Transport, out_of_memory
from makespan.redis_conn import connect, start_embedded


@pytest.fixture
def full_redis():
    """A private redis-server whose ``maxmemory`` (1 byte) is below what it uses."""
    emb = start_embedded()
    admin = connect(emb.url)
    try:
        yield emb, admin
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
        emb.stop()


def test_an_ack_refused_for_memory_frees_its_prefetch_slot(full_redis):
    emb, admin = full_redis
    conn = Connection(emb.url, transport=Transport)
    try:
        channel = conn.default_channel
        channel.qos.prefetch_count = 1  # worker_prefetch_multiplier=1
        dict.__setitem__(channel.qos._delivered, "tag-1", None)  # a message the consumer holds unacked
        assert not channel.qos.can_consume()
        admin.config_set("maxmemory", 1)
        channel.qos.ack("tag-1")  # kombu 5.7 raised OutOfMemoryError here, in the worker's event loop
        assert channel.qos.can_consume()  # the slot is free: the consumer fetches again
        with pytest.raises(redis.ConnectionError, match="out of memory"):
            channel.client.lpush("oom-probe", "x")  # every broker write: a connection error, then a reconnect
        admin.config_set("maxmemory", 0)  # memory freed: the same channel writes again
        assert channel.client.lpush("oom-probe", "x") == 1
    finally:
        admin.config_set("maxmemory", 0)
        conn.release()


def test_only_the_oom_reply_counts_as_out_of_memory():
    assert out_of_memory(redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"))
    assert not out_of_memory(redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"))
    assert not out_of_memory(redis.ConnectionError("Connection refused"))
