"""Issue 18, failure 9: a GPU worker died in a Redis outage (kombu ``'NoneType' object has
no attribute 'hostname'``), and with no supervisor the planner kept leasing to its queue.

* The kombu race, made deterministic: ``Transport.supports_batch_publish`` read
  ``self.client`` twice, and a connection closed by another thread in between (Celery
  resets its connections in an outage; ``Connection._do_close_transport`` sets
  ``client = None``) raised exactly that ``AttributeError`` from a publish. makespan's
  transports (:mod:`makespan.broker`) read it once.
* A real outage: a private redis-server SIGKILLed for several seconds, then started again
  on the same port and directory (append-only file). Every process either rides it out
  or exits non-zero (a restart-on-failure supervisor must see it), a host whose worker
  is gone gets no lease, and the jobs submitted before and after all complete.
"""

from __future__ import annotations

import time

import pytest
from kombu import Connection

from bench.chaos import RedisServer
from makespan.broker import SentinelTransport, Transport
from makespan.keys import Keys
from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect
from makespan.settings import Settings
from tests.live import all_events, wait_for

FLEET = """
name = "outage"
[[hosts]]
name = "h1"
gpu_count = 1
memory_mib = 40000
[[hosts]]
name = "h2"
gpu_count = 1
memory_mib = 40000
[endpoints.sim]
model = "sim/model"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
"""
TERMINAL = ("completed", "failed", "cancelled")
OUTAGE_S = 8.0


class _ClosedWhileRead:
    """A kombu connection that another thread closes right after its transport options are
    read (the moment of the race): the transport's ``client`` becomes None."""

    def __init__(self, transport, real):
        self._transport, self._real = transport, real

    @property
    def transport_options(self):
        options = self._real.transport_options
        self._transport.client = None  # Connection._do_close_transport, from another thread
        return options

    @property
    def hostname(self):
        return self._real.hostname


@pytest.mark.parametrize("transport_cls", [Transport, SentinelTransport])
def test_a_transport_closed_mid_publish_does_not_raise(transport_cls):
    conn = Connection("redis://127.0.0.1:1/0", transport=transport_cls)
    transport = conn.transport
    transport.client = _ClosedWhileRead(transport, conn)
    assert transport.supports_batch_publish in (True, False)  # kombu 5.7's raised AttributeError: 'hostname'
    transport.client = None
    assert transport.supports_batch_publish is False


def test_processes_ride_out_a_redis_outage_or_exit_non_zero(tmp_path):
    srv = RedisServer()
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    s = Settings(redis_url=srv.url, key_prefix="outage", time_scale=0.01, lease_ttl_s=3.0, heartbeat_s=0.5,
                 batch_wait_s=0.02, planner_tick_s=0.05, redis_socket_timeout_s=2.0, redis_connect_timeout_s=1.0,
                 worker_liveness_ttl_s=4.0)
    system = LiveSystem(path, fleet, s, tmp_path / "logs", planners=1, observer=True)
    system.start()
    try:
        r, keys = connect(s.redis_url), Keys(s.key_prefix)
        prod = Producer(r, keys, fleet, s)
        before = [prod.submit({"endpoint": "sim", "service_s": 200}).id for _ in range(4)]
        wait_for(lambda: all(r.hget(keys.job(j), "state") != "queued" for j in before[:2]), 30,
                 "the first jobs to be leased")
        srv.kill()  # the outage: connections refused, then a restart from the append-only file
        outage_start = time.monotonic()
        wait_for(lambda: time.monotonic() - outage_start >= OUTAGE_S, OUTAGE_S + 5, "the outage to last", 0.5)
        srv.start()
        exited = [(p.name, p.popen.returncode) for p in system.procs if not p.alive()]
        assert all(code != 0 for _name, code in exited), f"a process exited 0 in an outage: {exited}"
        r = connect(s.redis_url)
        prod = Producer(r, keys, fleet, s)
        after = [prod.submit({"endpoint": "sim", "service_s": 10}).id for _ in range(4)]
        for h in fleet.hosts:  # a worker that died is replaced, as its supervisor would
            if not any(p.alive() for p in system.procs if p.name.startswith(f"gpu-{h.name}-")):
                system.start_gpu_worker(h.name, 1)
        try:
            wait_for(lambda: all(r.hget(keys.job(j), "state") in TERMINAL for j in before + after), 120,
                     "every job to end", 0.3)
        except TimeoutError:
            logs = {p.name: p.log_path.read_text(errors="replace")[-3000:] for p in system.procs}
            pytest.fail(f"jobs did not end: {[(j, r.hgetall(keys.job(j))) for j in before + after]}; logs: {logs}")
        assert [r.hget(keys.job(j), "state") for j in before + after] == ["completed"] * 8, \
            [(j, r.hget(keys.job(j), "reason")) for j in before + after]
        dead = [p.name for p in system.procs if not p.alive()]
        crashed = [(p.name, p.popen.returncode) for p in system.procs if not p.alive()]
        assert dead == [] or all(c != 0 for _n, c in crashed), crashed
        leases = [e for e in all_events(r, keys) if e.get("kind") == "leased"]
        assert len({e["job"] for e in leases}) == 8
    finally:
        system.stop()
        srv.stop()


@pytest.mark.parametrize("transport_cls", [Transport])
def test_closing_a_channel_of_a_closed_transport_is_a_connection_error(redis_url, transport_cls):
    """The crash the chaos runner's ``redis_restart`` found (gpu-worker ``Unrecoverable
    error: AttributeError("'NoneType' object has no attribute 'hostname'")``): Celery's
    consumer closes its connection after an outage; closing the channel restores its
    unacked messages through a new pool built from the transport's ``client``, which was
    already None. It must be a connection error, which ``ignore_errors`` (Celery's close)
    swallows, so the consumer reconnects instead of the worker stopping."""
    from kombu.common import ignore_errors

    conn = Connection(redis_url, transport=transport_cls)
    try:
        channel = conn.default_channel
        dict.__setitem__(channel.qos._delivered, "tag-1", None)  # a message it holds unacked
        conn.transport.client = None  # that connection's transport is closed
        channel._pool = None  # the pool was reset by the connection error
        ignore_errors(conn, channel.close)  # kombu 5.7: AttributeError 'hostname', the worker stopped
    finally:
        conn.transport.client = conn
        ignore_errors(conn, conn.release)
