"""Issue 18, failure 1: a half-open connection must not wedge a process.

A :class:`SilentProxy` sits between the client and the real Redis; after the first
command it silences every open connection (new ones still work). A ``connect()``
client's next command and a kombu publish must come back (answered over a new
connection, or raising) within a bound set by ``MAKESPAN_REDIS_SOCKET_TIMEOUT_S``,
instead of waiting forever for a reply that never comes.
"""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlparse

import pytest
import redis

from makespan.celery_app import create_celery
from makespan.redis_conn import connect
from makespan.settings import Settings

from bench.fault_proxy import SilentProxy

SOCKET_TIMEOUT_S = 0.5
# A command may time out once (socket timeout), then redis-py or kombu reconnects and
# retries over a new connection: a few timeouts plus backoff, well under redis-py 8's
# own default of 5 s (and forever on redis-py 5 or kombu without a socket timeout).
BOUND_S = 6 * SOCKET_TIMEOUT_S


@pytest.fixture
def proxy(redis_url):
    u = urlparse(redis_url)
    p = SilentProxy(u.hostname or "127.0.0.1", u.port or 6379)
    yield p
    p.close()


def _db(redis_url: str) -> int:
    path = urlparse(redis_url).path.strip("/")
    return int(path or 0)


def _within(fn, bound_s: float) -> tuple[bool, object]:
    """Run ``fn`` in a thread; (finished within ``bound_s``, its result or exception)."""
    out: list = []

    def body():
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 - the outcome is reported, not hidden
            out.append(e)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(bound_s)
    return (not t.is_alive()), (out[0] if out else None)


def test_connect_client_does_not_block_on_a_half_open_connection(monkeypatch, redis_url, proxy, r, prefix):
    monkeypatch.setenv("MAKESPAN_REDIS_SOCKET_TIMEOUT_S", repr(SOCKET_TIMEOUT_S))
    c = connect(proxy.url(_db(redis_url)))
    c.set(f"{prefix}:k", "v")
    sock = c.connection_pool._available_connections[0]._sock
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    if hasattr(socket, "TCP_KEEPIDLE"):  # the kernel default (7200 s) finds nothing in time
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
    assert proxy.silence_open() >= 1
    finished, out = _within(lambda: c.get(f"{prefix}:k"), BOUND_S)
    assert finished, f"GET on a half-open connection still blocked after {BOUND_S} s"
    assert out == "v" or isinstance(out, redis.TimeoutError), out
    c.close()


def test_kombu_publish_does_not_block_on_a_half_open_connection(redis_url, proxy, r, prefix, keys):
    s = Settings(redis_url=proxy.url(_db(redis_url)), key_prefix=prefix, redis_socket_timeout_s=SOCKET_TIMEOUT_S,
                 redis_connect_timeout_s=SOCKET_TIMEOUT_S)
    app = create_celery(s)
    queue = keys.host_queue("half-open")
    app.send_task("makespan.none", args=(1,), queue=queue)  # opens the broker connection
    assert proxy.silence_open() >= 1
    finished, out = _within(lambda: app.send_task("makespan.none", args=(2,), queue=queue), BOUND_S)
    assert finished, f"kombu publish on a half-open connection still blocked after {BOUND_S} s"
    assert not isinstance(out, BaseException) or isinstance(out, (redis.RedisError, OSError)), repr(out)
    app.close()


def test_default_consumer_deaf_spell_ends_before_a_default_lease_expires():
    """A GPU worker's Celery consumer on a half-open connection is dropped by kombu within
    its 1 s ``brpop_timeout`` + 2 × ``health_check_interval`` (kombu's Redis transport,
    ``Channel._brpop_read``); meanwhile its host still looks live and the planner leases to
    it. At the defaults that spell must end before a lease of the default TTL expires, so
    the job's phases are consumed by the same worker instead of the lease being reclaimed
    (kombu's own 25 s default gave 51 s against a 10 s TTL). The broker options carry it."""
    from makespan.celery_app import broker_transport_options

    settings = Settings()
    deaf_bound_s = 1.0 + 2 * settings.redis_health_check_interval_s
    assert deaf_bound_s < settings.lease_ttl_s, (deaf_bound_s, settings.lease_ttl_s)
    assert broker_transport_options(settings)["health_check_interval"] == settings.redis_health_check_interval_s
