"""A private redis-server started on a port that another process took first.

:func:`makespan.redis_conn.free_port` lets its port go when it returns: another process
(the redis-server of a test on the other xdist worker, an endpoint server) can bind it
before the redis-server started on it does. That server then exits at start
(``Address already in use``) and, worse, a plain PING reached the *other* server: the
start returned that server's URL, and the test went on in a Redis it shared with another
test (whose teardown later stopped it). Now the start checks that the server answering
is its own (``INFO server``'s ``process_id``) and tries another port.

Made deterministic here: ``free_port`` is replaced by one that hands out a taken port
first. Real redis-server processes (fails on the code before: the start returned the
other server's URL, or raised at its exit).
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator

import pytest

import bench.chaos_redis as chaos_redis
import makespan.redis_conn as redis_conn
from makespan.redis_conn import EmbeddedRedis, PortTaken, server_pid, start_embedded


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


REAL_FREE_PORT = redis_conn.free_port  # taken before a test replaces it


def _taken_first(port: int) -> Iterator[int]:
    """``port`` (taken), then free ports as :func:`free_port` chooses them."""
    return itertools.chain([port], iter(REAL_FREE_PORT, None))


@pytest.fixture
def other_redis() -> Iterator[EmbeddedRedis]:
    """Another redis-server, the one that took the port first."""
    emb = start_embedded()
    try:
        yield emb
    finally:
        emb.stop()


def test_a_port_another_redis_took_first_is_not_taken_for_ours(monkeypatch, other_redis):
    ports = _taken_first(_port_of(other_redis.url))
    monkeypatch.setattr(redis_conn, "free_port", lambda: next(ports))
    emb = start_embedded()
    try:
        assert emb.url != other_redis.url, "the start took another test's redis-server for its own"
        assert emb.process.poll() is None
        assert server_pid(emb.url) == emb.process.pid
        assert server_pid(other_redis.url) == other_redis.process.pid  # the other one untouched
    finally:
        emb.stop()


def test_a_port_bound_by_another_process_is_skipped():
    with socket.socket() as held:  # bound, not listening: what a starting server holds
        held.bind(("127.0.0.1", 0))
        ports = _taken_first(held.getsockname()[1])
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(redis_conn, "free_port", lambda: next(ports))
            emb = start_embedded()
        try:
            assert _port_of(emb.url) != held.getsockname()[1]
            assert server_pid(emb.url) == emb.process.pid
        finally:
            emb.stop()


def test_a_given_port_that_is_taken_is_refused_with_the_reason(other_redis):
    with pytest.raises(PortTaken, match="another redis-server|exited at start"):
        start_embedded(port=_port_of(other_redis.url))
    assert server_pid(other_redis.url) == other_redis.process.pid


def test_the_chaos_runners_server_skips_a_taken_port(monkeypatch, other_redis):
    ports = _taken_first(_port_of(other_redis.url))
    monkeypatch.setattr(chaos_redis, "free_port", lambda: next(ports))
    srv = chaos_redis.RedisServer()
    try:
        assert srv.url != other_redis.url and server_pid(srv.url) == srv.proc.pid
        srv.restart()  # the same port again: its own
        assert server_pid(srv.url) == srv.proc.pid
    finally:
        srv.stop()
