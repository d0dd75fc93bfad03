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

from makespan.broker import SentinelTransport, Transport
from makespan.keys import Keys
from makespan.producer import Producer
from makespan.redis_conn import connect
from tests.faults.private_redis import TERMINAL, fault_settings, live_system, process_logs
from tests.live import all_events, wait_for

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


def test_processes_ride_out_a_redis_outage_or_exit_non_zero(aof_redis, tmp_path):
    srv = aof_redis
    s = fault_settings(srv.url, "outage", worker_liveness_ttl_s=4.0)
    with live_system(tmp_path, s) as (system, fleet):
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
            pytest.fail(f"jobs did not end: {[(j, r.hgetall(keys.job(j))) for j in before + after]}; "
                        f"logs: {process_logs(system)}")
        assert [r.hget(keys.job(j), "state") for j in before + after] == ["completed"] * 8, \
            [(j, r.hget(keys.job(j), "reason")) for j in before + after]
        dead = [p.name for p in system.procs if not p.alive()]
        crashed = [(p.name, p.popen.returncode) for p in system.procs if not p.alive()]
        assert dead == [] or all(c != 0 for _n, c in crashed), crashed
        leases = [e for e in all_events(r, keys) if e.get("kind") == "leased"]
        assert len({e["job"] for e in leases}) == 8


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
