"""Bench (b) of issue 20: learned transition durations on a host that is slower than the
fleet file says.

    .venv/bin/python bench/learned_durations.py [--slowdown 2] [--jobs 60] [--time-scale 0.005]

Two simulated endpoints (cold start 10 s, evict 1 s in the fleet file) alternate on one
GPU of ``host-b``, whose true transitions take ``--slowdown`` × the fleet file's
(``MAKESPAN_SIMULATED_SLOWDOWN``): every job evicts one and cold-starts the other. The
phases run in process (the GPU worker's :class:`makespan.workers.phases.PhaseRunner`) on
the Redis at ``MAKESPAN_REDIS_URL`` under a private key prefix, deleted afterwards.
Figures: planned vs actual error |actual − planned| ÷ actual per transition kind, p50 and
p90, for the transitions planned with the prior (before the minimum of observations) and
for those after 20 observations of that endpoint; and the planner's learned cold start.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from makespan.estimates import quantile, read_transition_windows  # noqa: E402
from makespan.keys import Keys  # noqa: E402
from makespan.models import FleetSpec  # noqa: E402
from makespan.producer import Producer  # noqa: E402
from makespan.redis_conn import connect  # noqa: E402
from makespan.settings import Settings  # noqa: E402
from makespan.workers.fleet_view import learned_endpoint_models  # noqa: E402
from makespan.workers.leases import LeaseStore  # noqa: E402
from makespan.workers.phases import PhaseContext, PhaseRunner  # noqa: E402
from makespan.workers.warm import run_phases  # noqa: E402

FLEET = {"name": "two-hosts",
         "hosts": [{"name": "host-a", "gpu_count": 1, "memory_mib": 81920},
                   {"name": "host-b", "gpu_count": 1, "memory_mib": 81920}],
         "endpoints": {n: {"model": f"m/{n}", "memory_mib_per_gpu": 1000, "cold_start_s": 10.0, "evict_s": 1.0}
                       for n in ("alpha", "beta")}}


def run(slowdown: float, jobs: int, time_scale: float) -> dict:
    fleet = FleetSpec.model_validate(FLEET)
    keys = Keys(f"bench-learned-{uuid.uuid4().hex[:8]}")
    s = dataclasses.replace(Settings.from_env(), key_prefix=keys.prefix, time_scale=time_scale,
                            simulated_slowdown=f"host-b={slowdown:g}", lease_ttl_s=30.0, heartbeat_s=1.0)
    r = connect(s.redis_url)
    try:
        prod, runner, gpu = Producer(r, keys, fleet, s), PhaseRunner(r, s, fleet), "GPU-host-b-0"
        for i in range(jobs):
            ep = "alpha" if i % 2 == 0 else "beta"
            jid = prod.submit({"endpoint": ep, "service_s": 0.1, "priority": "HIGH"}).id
            lease = LeaseStore(r, keys).acquire(f"L{i}", (gpu,), 30.0, job_id=jid, kind="job", holder="host-b",
                                                queue=keys.queue("HIGH"))
            run_phases(runner, PhaseContext(f"L{i}", lease.token, [gpu], "host-b", "job", ep, jid, "HIGH", 0.1))
        seen: dict[tuple[str, str], int] = {}
        rows: dict[str, dict[str, list[float]]] = {}
        for _i, f in r.xrange(keys.events):
            e = json.loads(f["e"])
            for t in e.get("transitions") or () if e["kind"] == "phase_end" else ():
                n = seen[(t["endpoint"], t["kind"])] = seen.get((t["endpoint"], t["kind"]), 0) + 1
                err = abs(t["actual_s"] - t["planned_s"]) / t["actual_s"]
                phase = ("prior" if n <= s.transition_min_observations else "after_20" if n > 20 else None)
                if phase:
                    rows.setdefault(t["kind"], {}).setdefault(phase, []).append(err)
        w = read_transition_windows(r, keys, fleet.endpoints, ["host-a", "host-b"])
        models = learned_endpoint_models(fleet, w, s.transition_min_observations, s.transition_quantile)
        return {"slowdown": slowdown, "jobs": jobs, "time_scale": time_scale,
                "error": {k: {p: {"n": len(v), "p50": round(quantile(v, 0.5), 4), "p90": round(quantile(v, 0.9), 4)}
                              for p, v in sorted(d.items())} for k, d in sorted(rows.items())},
                "planner_cold_start_s": {n: round(m.cold_start_s, 3) for n, m in models.items()},
                "fleet_cold_start_s": 10.0}
    finally:
        batch = list(r.scan_iter(f"{keys.prefix}:*", count=1000))
        if batch:
            r.delete(*batch)
        r.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slowdown", type=float, default=2.0)
    p.add_argument("--jobs", type=int, default=60)
    p.add_argument("--time-scale", type=float, default=0.005)
    a = p.parse_args()
    out = run(a.slowdown, a.jobs, a.time_scale)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
