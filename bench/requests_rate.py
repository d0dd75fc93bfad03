"""Request rate of ``ctx.requests`` (:class:`makespan.workers.requests.RequestRunner`):
planned vs achieved requests/s, old (request leases taken and given back with blocking
redis-py calls on the event loop) vs new (awaited on the ``redis.asyncio`` twin), in the
same run, interleaved.

``nice -n 5 python -m bench.requests_rate [--latency-ms 400] [--rounds 2] [--redis-url URL] [--redis-rtt-ms 0,1]``

One real bundled endpoint server (``makespan.workers.endpoint_server --latency-ms L``)
per cell; ``senders`` runners (one thread and event loop each, as concurrent steps of a
GPU worker's pool) share its ``slots`` cap. Planned rate = slots / latency; achieved =
all requests / the wall time from the first send to the last answer. ``--redis-rtt-ms``:
each cell also through :class:`bench.fault_proxy.ProxyProcess` delaying every Redis reply
by that much (a Redis on another host; 0: direct). Keys under a private
prefix on the given Redis, deleted after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import httpx
import redis

from makespan.keys import Keys
from makespan.redis_conn import connect, free_port
from makespan.settings import DEFAULT_REDIS_URL
from makespan.workers.requests import POLL_S, REQUEST_LEASE_TTL_S, WAITER_TTL_S, RequestRunner
from bench.fault_proxy import ProxyProcess

CELLS = [  # (slots, senders, requests per sender)
    (32, 1, 320),
    (64, 1, 640),
    (32, 2, 320),
    (64, 2, 640),
]


class BlockingRunner(RequestRunner):
    """The old request-lease path: every lease call a blocking redis-py call on the loop."""

    async def _call(self, command: str, *args: Any) -> Any:
        return getattr(self.r, command)(*args)

    async def _try_acquire(self, member: str) -> int:
        return int(self._acquire(keys=[self.keys.req_leases(self.instance_id), self.keys.req_peak(self.instance_id),
                                       self.keys.req_waiters(self.instance_id)],
                                 args=[member, int(REQUEST_LEASE_TTL_S * 1000), self.slots,
                                       int(WAITER_TTL_S * 1000)]))

    async def _lease(self, member: str) -> int:  # the old waiter: a poll every POLL_S, no backoff
        n = await self._try_acquire(member)  # (the waiter count is the script's now, as in the runner)
        if n:
            return n
        try:
            while True:
                await asyncio.sleep(POLL_S)
                if self.should_stop():
                    return 0
                n = await self._try_acquire(member)
                if n:
                    return n
        finally:
            if not n:
                self.r.zrem(self.keys.req_waiters(self.instance_id), member)


def _serve(latency_ms: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "makespan.workers.endpoint_server", "--port", str(port),
                             "--latency-ms", str(latency_ms), "--model", "m"], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("endpoint server did not come up")


def _cell(r: redis.Redis, keys: Keys, url: str, cls: type[RequestRunner], slots: int, senders: int,
          per_sender: int) -> float:
    """Achieved requests/s of one cell."""
    instance = f"i-{uuid.uuid4().hex[:6]}"
    errors: list[str] = []

    def go(job: str) -> None:
        res = cls(r, keys, instance, url, "m", slots).run(job, {"requests": per_sender})
        if res.errors:
            errors.append(res.first_error)

    threads = [threading.Thread(target=go, args=(f"{instance}-{k}",)) for k in range(senders)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall_s = time.monotonic() - t0
    if errors:
        raise SystemExit(f"requests failed: {errors[0]}")
    return senders * per_sender / wall_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency-ms", type=float, default=400.0)
    ap.add_argument("--rounds", type=int, default=2, help="old/new pairs per cell (ABBA order)")
    ap.add_argument("--redis-url", default=os.environ.get("MAKESPAN_REDIS_URL", DEFAULT_REDIS_URL))
    ap.add_argument("--redis-rtt-ms", default="0,1",
                    help="comma-separated delays added to every Redis reply by bench.fault_proxy (0: direct), "
                         "a Redis on another host")
    args = ap.parse_args()
    direct = connect(args.redis_url)
    keys = Keys(f"bench-rr-{uuid.uuid4().hex[:8]}")
    proc, url = _serve(args.latency_ms)
    upstream = direct.connection_pool.connection_kwargs
    proxy = None
    print(f"# load before: {os.getloadavg()[0]:.2f}; latency {args.latency_ms:.0f} ms")
    print("| Redis +ms | slots | senders | requests | planned req/s | old req/s | new req/s | new/old |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    cells = [(float(rtt), *cell) for rtt in args.redis_rtt_ms.split(",") for cell in CELLS]
    try:
        for rtt_ms, slots, senders, per_sender in cells:
            r = direct
            if rtt_ms > 0:
                if proxy is None:
                    proxy = ProxyProcess(int(upstream["port"]), str(upstream["host"]))
                proxy.set_latency(rtt_ms / 1000.0)
                r = connect(proxy.url(int(upstream.get("db", 0))))
            rates: dict[str, list[float]] = {"old": [], "new": []}
            for k in range(args.rounds):
                order = [("old", BlockingRunner), ("new", RequestRunner)]
                for name, cls in (order if k % 2 == 0 else order[::-1]):
                    rates[name].append(_cell(r, keys, url, cls, slots, senders, per_sender))
            planned = slots / (args.latency_ms / 1000.0)
            old, new = statistics.median(rates["old"]), statistics.median(rates["new"])
            print(f"| {rtt_ms:g} | {slots} | {senders} | {senders * per_sender} | {planned:.0f} | {old:.1f} | {new:.1f} | "
                  f"{new / old:.2f} |", flush=True)
    finally:
        proc.terminate()
        proc.wait(5)
        if proxy is not None:
            proxy.close()
        for key in direct.scan_iter(f"{keys.prefix}:*", count=1000):
            direct.delete(key)
    print(f"# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
