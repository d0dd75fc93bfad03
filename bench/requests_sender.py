"""Throughput and CPU of the request sender of ``ctx.requests``
(:class:`makespan.workers.requests.RequestRunner`) against one bundled endpoint server, the
HTTP client of the old sender (one ``httpx.AsyncClient`` whose pool holds every slot's
connection) and of the new one (one single-connection client per slot), paired in one run.

``python -m bench.requests_sender [--slots 32,64] [--requests-per-slot 40] [--rounds 2] [--latency-ms 400]``

Planned rate = slots ÷ latency; dilation = wall ÷ (⌈requests ÷ slots⌉ × latency), the
runner's start (clients, event loop, the Redis twin) and its final write included; CPU =
this process's CPU time per request (the sender's own cost: the server is another
process). Request leases are taken on the Redis at ``--redis-url`` under a private prefix,
deleted after. Rounds alternate old/new (ABBA).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from typing import Any

import httpx

from makespan.keys import Keys
from makespan.redis_conn import connect
from makespan.settings import DEFAULT_REDIS_URL
from makespan.workers.requests import RequestResult, RequestRunner
from bench.requests_rate import _serve


class OneClientRunner(RequestRunner):
    """The old sender: one ``AsyncClient`` with a pool of ``slots`` connections, which
    httpcore scans (a socket poll per connection) for every request it assigns."""

    async def run_async(self, job_id: str, payload: dict[str, Any]) -> RequestResult:
        n = int(payload.get("requests", 0))
        res = RequestResult()
        limits = httpx.Limits(max_connections=self.slots, max_keepalive_connections=self.slots)
        sem = asyncio.Semaphore(self.slots)
        async with self._connected(), httpx.AsyncClient(timeout=60.0, limits=limits) as client:
            clients: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
            for _ in range(self.slots):  # the same client for every slot: one shared pool
                clients.put_nowait(client)
            await asyncio.gather(*(self._one(clients, sem, i, payload, job_id, res) for i in range(n)))
        return res


def _cell(r: Any, url: str, cls: type[RequestRunner], slots: int, requests: int, latency_ms: float) -> dict[str, float]:
    keys = Keys(f"bench-sender-{uuid.uuid4().hex[:6]}")
    t0, c0 = time.monotonic(), time.process_time()
    res = cls(r, keys, "i", url, "m", slots).run("job", {"requests": requests})
    wall_s, cpu_s = time.monotonic() - t0, time.process_time() - c0
    r.delete(keys.requests("job"), keys.req_peak("i"), keys.req_leases("i"), keys.req_waiters("i"))
    if res.errors:
        raise SystemExit(f"requests failed: {res.first_error}")
    ideal_s = -(-requests // slots) * latency_ms / 1000.0
    return {"req_s": requests / wall_s, "dilation": wall_s / ideal_s, "cpu_ms": cpu_s * 1000.0 / requests,
            "p95_ms": res.summary()["latency_ms_p95"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", default="32,64")
    ap.add_argument("--requests-per-slot", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2, help="old/new pairs per cell (ABBA order)")
    ap.add_argument("--latency-ms", type=float, default=400.0)
    ap.add_argument("--redis-url", default=os.environ.get("MAKESPAN_REDIS_URL", DEFAULT_REDIS_URL))
    a = ap.parse_args()
    r = connect(a.redis_url)
    proc, url = _serve(a.latency_ms)
    print(f"requests_sender: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()[0]:.2f}, "
          f"latency {a.latency_ms:g} ms\n")
    print("| slots | requests | planned req/s | old req/s | new req/s | new ÷ old | old / new dilation "
          "| old / new sender CPU ms/request | old / new p95 ms |")
    print("|---:|---:|---:|---:|---:|---:|---|---|---|")
    try:
        for slots in [int(s) for s in a.slots.split(",")]:
            n = slots * a.requests_per_slot
            runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
            for k in range(a.rounds):
                order = [("old", OneClientRunner), ("new", RequestRunner)]
                for name, cls in (order if k % 2 == 0 else order[::-1]):
                    runs[name].append(_cell(r, url, cls, slots, n, a.latency_ms))

            def med(name: str, field: str, runs: dict[str, list[dict[str, float]]] = runs) -> float:
                return statistics.median(x[field] for x in runs[name])
            print(f"| {slots} | {n} | {slots * 1000.0 / a.latency_ms:.0f} | {med('old', 'req_s'):.1f} "
                  f"| {med('new', 'req_s'):.1f} | {med('new', 'req_s') / med('old', 'req_s'):.2f} "
                  f"| {med('old', 'dilation'):.3f} / {med('new', 'dilation'):.3f} "
                  f"| {med('old', 'cpu_ms'):.2f} / {med('new', 'cpu_ms'):.2f} "
                  f"| {med('old', 'p95_ms'):.0f} / {med('new', 'p95_ms'):.0f} |", flush=True)
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
