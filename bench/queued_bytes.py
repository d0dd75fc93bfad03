"""Bench (d) of issue 21: Redis bytes per queued job.

Run: ``.venv/bin/python -m bench.queued_bytes [--jobs 100000] [--kinds plain,payload,function]``

It starts a private redis-server (so ``INFO memory`` is ours alone), submits ``--jobs``
jobs of one kind through the real producer (:class:`makespan.producer.Producer`, the submit
script) with no planner running, so every one stays queued, and reports per queued job:

* ``used_memory`` growth ÷ jobs (``INFO memory``: the whole server's bytes, so the record,
  its queue entry, its ``submitted`` event in ``P:events`` and Redis's own overhead);
* ``MEMORY USAGE`` of one job record (and its encoding: ``listpack`` when every field is
  at most ``hash-max-listpack-value`` bytes, else the much larger ``hashtable``), of the
  queue ÷ jobs, of the event stream ÷ jobs;
* the fields of one record with their sizes.

Kinds: ``plain`` (endpoint and service time), ``payload`` (a 40-byte payload object), ``function``
(a workload function with two arguments; its name is registered for the run). Then it
flushes that private server between kinds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from makespan.keys import Keys
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect, start_embedded
from makespan.settings import Settings

FLEET_TOML = os.path.join(os.path.dirname(__file__), "..", "examples", "render-pipeline.toml")
KINDS: dict[str, dict[str, Any]] = {
    "plain": {"endpoint": "embed", "service_s": 5},
    "payload": {"endpoint": "embed", "service_s": 5, "payload": {"prompt": "summarise the ticket", "n": 1}},
    "function": {"endpoint": "embed", "service_s": 5, "workload": "bench_fn", "args": [1, "a"]},
}


def _bench_fn(ctx, n, label):  # noqa: ARG001 - the registered function's signature only
    return None


def _register(r, keys: Keys) -> None:
    """Publish ``bench_fn`` as a live workload function (as a GPU worker does)."""
    from makespan import registry

    registry.publish(r, keys, [registry.workload("embed", name="bench_fn")(_bench_fn)])


def measure(url: str, kind: str, jobs: int) -> dict[str, Any]:
    """Submit ``jobs`` jobs of ``kind`` on a flushed private server; bytes per queued job."""
    r = connect(url)
    r.flushall()  # the bench's own server, started by main()
    settings = Settings(redis_url=url, key_prefix="makespan")
    keys = Keys(settings.key_prefix)
    fleet = load_fleet(FLEET_TOML)
    prod = Producer(r, keys, fleet, settings)
    if kind == "function":
        _register(r, keys)
    prod.submit(KINDS[kind])  # scripts loaded, keys created: the baseline holds one job
    time.sleep(0.2)
    before = int(r.info("memory")["used_memory"])
    started = time.monotonic()
    for _ in range(jobs - 1):
        prod.submit(KINDS[kind])
    submit_s = time.monotonic() - started
    after = int(r.info("memory")["used_memory"])
    queue = keys.queue("NORMAL")
    sample = r.zrange(queue, 0, 0)[0]
    record = r.hgetall(keys.job(sample))
    out = {
        "kind": kind, "jobs": r.zcard(queue),
        "used_memory_per_job": round((after - before) / (jobs - 1), 1),
        "record_bytes": r.memory_usage(keys.job(sample), samples=0),
        "record_encoding": r.object("encoding", keys.job(sample)),
        "queue_bytes_per_job": round(r.memory_usage(queue, samples=0) / jobs, 1),
        "events_bytes_per_job": round((r.memory_usage(keys.events, samples=0) or 0) / jobs, 1),
        "fields": {name: len(value) for name, value in sorted(record.items())},
        "submit_s": round(submit_s, 1),
    }
    r.flushall()
    r.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--kinds", default="plain,payload,function")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    server = start_embedded()
    try:
        rows = [measure(server.url, kind, args.jobs) for kind in args.kinds.split(",")]
    finally:
        server.stop()
    for row in rows:
        print(json.dumps(row))
    print("| kind | queued jobs | used_memory Δ per job, B | record B (encoding) | queue B/job | events B/job |")
    print("|---|---|---|---|---|---|")
    for x in rows:
        print(f"| {x['kind']} | {x['jobs']:,} | {x['used_memory_per_job']} | {x['record_bytes']} "
              f"({x['record_encoding']}) | {x['queue_bytes_per_job']} | {x['events_bytes_per_job']} |")
    print(f"load average: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
