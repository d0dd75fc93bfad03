"""Operator commands on a deep queue: ``makespan jobs`` and a filtered ``makespan cancel``
as the CLI runs them (:func:`makespan.cli_why.scan_jobs`,
:meth:`makespan.producer.Producer.cancel_outcomes`), with ``--jobs`` queued jobs.

Run: ``.venv/bin/python -m bench.cli_listing [--jobs 20000] [--redis-url URL]``

It starts a private redis-server unless ``--redis-url`` is given, submits ``--jobs`` jobs
(LOW and NORMAL, one endpoint) through the real producer with no planner running, marks a
planner as leading (so every job's reason is ``behind_batch``, the case that read the
queues most), lists them all, then cancels them all, and prints per step the wall time and
the client's round trips (single commands plus pipeline executes) per 1,000 jobs. For an
old/new comparison run it in two trees in the same minute (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import time
import uuid

from makespan.cli_why import scan_jobs
from makespan.keys import Keys
from makespan.live import delete_prefix
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect, start_embedded
from makespan.settings import Settings

FLEET = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                     "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})


class RoundTrips:
    """Counts a client's round trips: single commands and pipeline executes."""

    def __init__(self, r) -> None:
        self.count = 0
        send, pipeline = r.execute_command, r.pipeline

        def counted_send(*args, **kwargs):
            self.count += 1
            return send(*args, **kwargs)

        def counted_pipeline(*args, **kwargs):
            pipe = pipeline(*args, **kwargs)
            execute = pipe.execute

            def counted_execute(*a, **k):
                self.count += 1
                return execute(*a, **k)

            pipe.execute = counted_execute
            return pipe

        r.execute_command, r.pipeline = counted_send, counted_pipeline


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--redis-url", default=None)
    a = ap.parse_args(argv)
    embedded = None if a.redis_url else start_embedded()
    url = a.redis_url or embedded.url
    prefix = f"bench-cli-{uuid.uuid4().hex[:8]}"
    settings = Settings(redis_url=url, key_prefix=prefix)
    keys = Keys(prefix)
    r = connect(url)
    try:
        prod = Producer(r, keys, FLEET, settings)
        ids = [prod.submit({"endpoint": "e", "service_s": 10, "priority": ("LOW", "NORMAL")[i % 2]}).id
               for i in range(a.jobs)]
        r.set(keys.planner_leader, "bench", px=3_600_000)
        trips = RoundTrips(r)
        started = time.perf_counter()
        rows, _cut_at = scan_jobs(r, keys, settings, ("queued",), limit=a.jobs)
        list_s, list_trips = time.perf_counter() - started, trips.count
        trips.count = 0
        started = time.perf_counter()
        outcomes = prod.cancel_outcomes(ids)
        cancel_s, cancel_trips = time.perf_counter() - started, trips.count
        cancelled = sum(1 for outcome in outcomes if outcome is not None and outcome.state == "cancelled")
        per_k = 1000 / max(1, a.jobs)
        print(f"jobs={a.jobs} listed={len(rows)} list_s={list_s:.2f} list_round_trips_per_1000={list_trips * per_k:.1f} "
              f"cancelled={cancelled} cancel_s={cancel_s:.2f} cancel_round_trips_per_1000={cancel_trips * per_k:.1f}")
    finally:
        delete_prefix(connect(url), keys)
        if embedded is not None:
            embedded.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
