"""Saturated-fleet benchmark in the simulator: work-conserving admission (makespan's
planner: every free GPU may take any queued job, strict priority order, a peer level
gets the next released slot) against a strict-partition admission policy (each
priority level owns a fixed share of the GPUs and never borrows), same jobs, same run.

Run: ``.venv/bin/python -m bench.saturated [--gpus 16] [--seed 0]``

Workload (seeded): a LOW backlog of mixed-duration jobs (10–600 s, log-uniform, TP 1
and TP 2) at t=0 saturating the fleet; at ``--peer-at-s`` a HIGH peer arrives as a
fan-out (``--fanout`` shards submitted at once) plus a trickle. Every GPU starts with
both endpoints' set point resident so admission, not cold starts, is what differs.

Measures (design notes, "Measures"), over the saturated window [first submission,
last job start] where some job always waits:
- slot utilization: GPU-seconds held by jobs (transition + service) ÷ (GPUs × window);
- idle-while-queued: GPU-seconds a GPU sat idle while a job it could serve waited
  (:func:`makespan.planner.measures.idle_while_queued`), and its share of GPU-seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from typing import Any

import makespan.planner.simulator as sim
import makespan.planner.simulator_run as sim_run
from makespan.planner.measures import JobRecord, idle_while_queued, union
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob


def workload(gpus: int, seed: int, peer_at_s: float, fanout: int, backlog: int) -> tuple[list[PlanJob], FleetState]:
    rng = random.Random(seed)
    fleet = [Gpu(f"h{i // 8}-g{i % 8}", f"h{i // 8}", i % 8, 80_000) for i in range(gpus)]
    eps = {"small": EndpointModel("small", 1, 20_000, 30.0, 3.0), "pair": EndpointModel("pair", 2, 20_000, 60.0, 5.0)}
    resident = {g.uuid: "small" for g in fleet}
    jobs: list[PlanJob] = []

    def job(prio: int, t: float) -> None:
        ep = "pair" if rng.random() < 0.25 else "small"
        svc = round(math.exp(rng.uniform(math.log(10), math.log(600))), 1)
        jobs.append(PlanJob(f"j{len(jobs)}", ep, (8.0, 4.0, 2.0, 1.0)[prio], t, svc, prio, seq=len(jobs)))

    for _ in range(backlog):
        job(3, 0.0)  # LOW backlog
    for _ in range(fanout):
        job(1, peer_at_s)  # HIGH fan-out arrives late
    t = peer_at_s
    for _ in range(fanout // 2):
        t += rng.expovariate(1 / 20.0)
        job(1, round(t, 1))
    return jobs, FleetState(0.0, fleet, eps, resident=resident, set_point=dict(resident))


def _run(jobs: list[PlanJob], state: FleetState, policy: str, window_s: float) -> list[JobRecord]:
    """Simulate and return the per-job records (captured from the simulator's own recorder)."""
    got: list[JobRecord] = []
    orig = sim_run._record

    def capture(job, a, base):
        rec = orig(job, a, base)
        got.append(rec)
        return rec

    sim_run._record = capture
    try:
        sim.simulate(jobs, state, policy, window_s=window_s)
    finally:
        sim_run._record = orig
    return got


def work_conserving(jobs, state, policy, window_s) -> list[JobRecord]:
    return _run(jobs, state, policy, window_s)


def strict_partition(jobs, state, policy, window_s, shares: dict[int, float]) -> list[JobRecord]:
    """Each level runs alone on its own slice of GPUs (by host order); no borrowing."""
    out: list[JobRecord] = []
    gpus = list(state.gpus)
    start = 0
    levels = sorted(shares)
    for k, lvl in enumerate(levels):
        n = len(gpus) - start if k == len(levels) - 1 else max(2, round(shares[lvl] * len(gpus)))
        part = gpus[start:start + n]
        start += n
        sub = FleetState(0.0, part, state.endpoints, resident={g.uuid: state.resident.get(g.uuid) for g in part},
                         set_point={g.uuid: state.set_point.get(g.uuid) for g in part})
        mine = [j for j in jobs if j.priority == lvl]
        if mine:
            out += _run(mine, sub, policy, window_s)
    return out


def measure(records: list[JobRecord], state: FleetState) -> dict[str, Any]:
    gpu_ids = [g.uuid for g in state.gpus]
    t0 = min(r.submit_s for r in records)
    t1 = max(r.start_s for r in records)  # after this no job waits
    held = 0.0
    for r in records:
        for _ in r.gpus:
            held += max(0.0, min(r.end_s, t1) - max(r.start_s, t0))
    cap = len(gpu_ids) * (t1 - t0)
    clipped = [JobRecord(r.id, r.endpoint, r.priority, r.weight, r.submit_s, r.start_s, r.service_start_s, r.end_s,
                         r.gpus, r.load) for r in records]
    iwq = idle_while_queued(clipped, gpu_ids)
    end = max(r.end_s for r in records)
    wait = {lvl: sorted(r.start_s - r.submit_s for r in records if r.priority == lvl) for lvl in (1, 3)}
    return {
        "jobs": len(records), "window_s": t1 - t0, "slot_utilization": held / cap if cap else 0.0,
        "idle_while_queued_gpu_s": iwq, "idle_while_queued_share": iwq / cap if cap else 0.0,
        "makespan_s": end - t0,
        "weighted_completion_s": sum(r.weight * (r.end_s - r.submit_s) for r in records),
        "wait_p50_s": {("HIGH" if k == 1 else "LOW"): (round(v[len(v) // 2], 1) if v else None) for k, v in wait.items()},
        "cold_starts": sum(1 for r in records if r.load == "cold_start"),
        "busy_union_s": sum(b - a for a, b in union((r.start_s, r.end_s) for r in records)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backlog", type=int, default=400)
    ap.add_argument("--fanout", type=int, default=64)
    ap.add_argument("--peer-at-s", type=float, default=900.0)
    ap.add_argument("--policy", default="wspt")
    ap.add_argument("--window-s", type=float, default=1.0, help="simulator commit window (the live tick)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    jobs, state = workload(a.gpus, a.seed, a.peer_at_s, a.fanout, a.backlog)
    rows = {
        "work_conserving": measure(work_conserving(jobs, state, a.policy, a.window_s), state),
        "strict_partition": measure(strict_partition(jobs, state, a.policy, a.window_s, {1: 0.5, 3: 0.5}), state),
    }
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        for name, m in rows.items():
            print(f"{name:17s} jobs={m['jobs']} window_s={m['window_s']:.0f} slot_util={m['slot_utilization']:.4f} "
                  f"idle_while_queued={m['idle_while_queued_gpu_s']:.0f} GPU-s "
                  f"({100 * m['idle_while_queued_share']:.2f}%) makespan_s={m['makespan_s']:.0f} "
                  f"wait_p50_s={m['wait_p50_s']} cold_starts={m['cold_starts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
