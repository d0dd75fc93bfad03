"""A Redis outage that hits a waiting request's removal from the waiter count: the count
(``P:reqwaiters:{instance}``, the drain check's ``waiters``) must not stay above zero for
good. It was a counter (INCR, DECR on the way out, a failed DECR only logged): the
restarted Redis brought the INCR back from its append-only file and the count stayed at 1
forever. Now a waiter counts until a deadline (found by a review; fails on the code before).

A private append-only Redis (killed and started again), a real HTTP endpoint, two real
request runners on one instance with one slot: one holds the slot, the other waits."""
from __future__ import annotations

import threading
import time
import uuid
from http.server import ThreadingHTTPServer

from bench.chaos_redis import RedisServer
from makespan.errors import StoreError
from makespan.keys import Keys
from makespan.redis_conn import connect
from makespan.settings import Settings
from makespan.workers import requests as requests_module
from makespan.workers.requests import RequestRunner, request_drain
from tests.faults.private_redis import completion_server

WAITER_TTL_S = 1.0  # the test's waiter deadline (10 s in production)


def _server(release: threading.Event) -> ThreadingHTTPServer:
    def answer(_body: dict) -> str:
        release.wait(30)  # the slot stays held until the test lets it go
        return "ok"

    return completion_server(answer)


def _until(check, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_a_waiter_whose_removal_an_outage_lost_stops_counting(monkeypatch):
    monkeypatch.setattr(requests_module, "WAITER_TTL_S", WAITER_TTL_S, raising=False)
    srv = RedisServer()
    release = threading.Event()
    httpd = _server(release)
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    prefix = f"wtr-{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix)
    s = Settings(redis_url=srv.url, key_prefix=prefix, redis_socket_timeout_s=1.0, redis_connect_timeout_s=0.5)
    r = connect(srv.url, settings=s)
    outcome: dict[str, str] = {}

    def send(job: str) -> None:
        try:
            res = RequestRunner(connect(srv.url, settings=s), keys, "inst", url, "m", 1).run(job, {"requests": 1})
            outcome[job] = f"ok {res.ok}"
        except Exception as e:  # noqa: BLE001 - the waiter's request fails with the outage
            outcome[job] = f"raised {'StoreError' if isinstance(e, StoreError) else type(e).__name__}"

    holder = threading.Thread(target=send, args=("holder",), daemon=True)
    waiter = threading.Thread(target=send, args=("waiter",), daemon=True)
    try:
        holder.start()
        assert _until(lambda: request_drain(r, keys, ["inst"])["request_leases"] == 1, 10)
        waiter.start()
        assert _until(lambda: request_drain(r, keys, ["inst"])["waiters"] == 1, 10)

        srv.kill()  # the waiter's next try fails, and so does its removal from the count
        waiter.join(10)
        assert outcome.get("waiter") == "raised StoreError"
        srv.start()  # the append-only file brings the waiter count back
        release.set()
        holder.join(15)
        assert outcome.get("holder") == "ok 1"  # its lease was given back through the outage

        # nobody waits any more: the count is back to zero once the lost waiter's deadline passed
        assert _until(lambda: request_drain(r, keys, ["inst"]) == {"request_leases": 0, "waiters": 0},
                      WAITER_TTL_S + 5), request_drain(r, keys, ["inst"])
        # and the key itself goes with it (no state left behind per instance)
        assert _until(lambda: not r.exists(keys.req_waiters("inst")), WAITER_TTL_S + 5)
    finally:
        release.set()
        httpd.shutdown()
        srv.stop()
