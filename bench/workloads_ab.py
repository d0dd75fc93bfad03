"""Workload DAGs: makespan's scheduling vs a per-step barrier baseline, paired A/B.

``python -m bench.workloads_ab [--live] [--reps 2] [--warmup 1] [--out bench-workloads.json]``

A = makespan: the whole DAG is submitted at once; a step starts when its own
dependencies complete, independent branches run side by side on their endpoints.
B = barrier: the steps run one at a time in topological order; every request of a
step finishes before any request of the next starts.

Both run in this process, in ABBA order per repetition; the figure is the ratio of
wall times A/B, with a 95% confidence interval (Student t on the log ratios of the
pairs). Per run: wall time, slot utilization per endpoint (busy slot-seconds /
(slots × span from its first request's start to its last request's end)),
idle-while-queued (live: slot-seconds an instance's slots sat idle while requests of
the step it serves had not started, summed over steps; simulator: GPU-seconds), the cap check (most requests in flight per instance, from the
per-request records, ≤ slots) and the drain check (request leases and waiters left).

Simulator mode (default): the planner's discrete-event simulator
(:func:`makespan.planner.simulator.simulate`) with each step's service time
⌈N / slots⌉ × latency; barrier = the same jobs chained in topological order.
``--live``: the live system (planner + GPU worker processes, real endpoint processes
of tests/workloads/fleet.toml: gen 5 ms/request 4 slots, judge 80 ms 2 slots, embed
5 ms 8 slots).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import uuid
from collections import defaultdict
from pathlib import Path

FLEET = Path(__file__).resolve().parent.parent / "tests" / "workloads" / "fleet.toml"
LAT_MS = {"gen": 5.0, "judge": 80.0, "embed": 5.0}

# name -> [(step, endpoint, requests, deps)]
TOPOLOGIES: dict[str, list[tuple[str, str, int, tuple[str, ...]]]] = {
    "linear": [("a", "gen", 40, ()), ("b", "judge", 8, ("a",)), ("c", "embed", 40, ("b",))],
    "diamond": [("a", "gen", 40, ()), ("b", "judge", 8, ("a",)), ("c", "embed", 80, ("a",)),
                ("d", "gen", 40, ("b", "c"))],
    "fan-out/fan-in": [("s", "gen", 20, ()), ("x", "judge", 6, ("s",)), ("y", "embed", 80, ("s",)),
                       ("z", "gen", 40, ("s",)), ("t", "embed", 20, ("x", "y", "z"))],
    "slow-bottleneck": [("j", "judge", 16, ()), ("g", "gen", 40, ()), ("e", "embed", 40, ("g",)),
                        ("f", "gen", 10, ("j", "e"))],
    "shared-endpoint": [("g1", "gen", 40, ()), ("g2", "gen", 40, ()), ("j", "judge", 4, ("g1", "g2"))],
    "hetero-caps": [("e", "embed", 80, ()), ("g", "gen", 80, ()), ("j", "judge", 4, ("e", "g"))],
    "latency-skew": [("slow", "judge", 16, ()), ("fast", "gen", 160, ()), ("m", "embed", 8, ("slow", "fast"))],
}


def topo(steps):
    done, out = set(), []
    while len(out) < len(steps):
        for s in steps:
            if s[0] not in done and all(d in done for d in s[3]):
                out.append(s)
                done.add(s[0])
    return out


def ratio_ci(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """Geometric-mean ratio A/B with a 95% Student-t interval on the log ratios."""
    logs = [math.log(a / b) for a, b in pairs if a > 0 and b > 0]
    m = statistics.fmean(logs)
    if len(logs) < 2:
        return {"ratio": math.exp(m), "lo": math.exp(m), "hi": math.exp(m), "n": len(logs)}
    t = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}.get(len(logs) - 1, 2.0)
    h = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return {"ratio": math.exp(m), "lo": math.exp(m - h), "hi": math.exp(m + h), "n": len(logs)}


def slot_util(intervals: dict[str, list[tuple[float, float]]], slots: dict[str, int]) -> dict[str, float]:
    out = {}
    for ep, ivs in intervals.items():
        span = max(b for _, b in ivs) - min(a for a, _ in ivs)
        out[ep] = round(sum(b - a for a, b in ivs) / (slots[ep] * span), 4) if span > 0 else 0.0
    return out


def idle_while_queued(step_ivs: list[tuple[float, float]], slots: int) -> float:
    """Slot-seconds of one step's instance left idle while requests of the step had not
    started yet: ∫ min(slots − in_flight(t), not_started(t))⁺ dt over the step's span
    (its first request's start to its last request's end; event sweep, exact)."""
    if not step_ivs:
        return 0.0
    pts = sorted({t for iv in step_ivs for t in iv})
    total = 0.0
    for a, b in zip(pts, pts[1:]):
        mid = (a + b) / 2
        in_flight = sum(1 for t0, t1 in step_ivs if t0 <= mid < t1)
        waiting = sum(1 for t0, _ in step_ivs if t0 > mid)
        total += max(0, min(slots - in_flight, waiting)) * (b - a)
    return total


def max_overlap(ivs):
    pts = sorted([(a, 1) for a, _ in ivs] + [(b, -1) for _, b in ivs], key=lambda p: (p[0], p[1]))
    cur = best = 0
    for _, d in pts:
        cur += d
        best = max(best, cur)
    return best


# -- simulator ---------------------------------------------------------------------------
def run_sim(name: str, mode: str, fleet) -> dict:
    from makespan.planner.model import PlanJob
    from makespan.planner.simulator import fleet_state, simulate

    steps = TOPOLOGIES[name]
    order = topo(steps)
    jobs = []
    for i, (s, ep, n, deps) in enumerate(order):
        slots = fleet.endpoints[ep].slots
        svc = math.ceil(n / slots) * LAT_MS[ep] / 1000.0
        d = deps if mode == "A" else ((order[i - 1][0],) if i else ())
        jobs.append(PlanJob(s, ep, 2.0, 0.0, svc, 2, tuple(d), None, i))
    rep = simulate(jobs, fleet_state(fleet), "portfolio", window_s=0.01)
    return {"wall_s": rep["makespan_s"], "idle_while_queued_gpu_s": rep.get("idle_while_queued_gpu_s", 0.0)}


# -- live --------------------------------------------------------------------------------
class Live:
    def __init__(self):
        from makespan.keys import Keys
        from makespan.live import LiveSystem
        from makespan.models import load_fleet
        from makespan.redis_conn import connect
        from makespan.settings import Settings

        self.fleet = load_fleet(FLEET)
        self.settings = Settings.from_env(key_prefix=f"bench-wl-{uuid.uuid4().hex[:6]}", time_scale=0.01,
                                          lease_ttl_s=3.0, heartbeat_s=0.5, planner_tick_s=0.02, batch_wait_s=0.01)
        self.keys = Keys(self.settings.key_prefix)
        self.r = connect(self.settings.redis_url)
        self.sys = LiveSystem(FLEET, self.fleet, self.settings, Path("/tmp/bench-workloads-logs"))
        self.sys.start()

    def close(self):
        from makespan.live import delete_prefix

        self.sys.stop()
        delete_prefix(self.r, self.keys)

    def _wait(self, wid):
        from makespan.workloads import workload_status

        while True:
            st = workload_status(self.r, self.keys, wid)
            if st["state"] != "running":
                return st
            time.sleep(0.01)

    def _submit(self, steps, deps_of):
        from makespan.workloads import submit_workload

        wl = {"name": "bench", "steps": [{"name": s, "endpoint": ep, "requests": n, "request_s": LAT_MS[ep] / 1000,
                                          "depends_on": list(deps_of(s, d))} for s, ep, n, d in steps]}
        return self._wait(submit_workload(self.r, self.keys, self.fleet, wl, self.settings))

    def run(self, name: str, mode: str) -> dict:
        steps = TOPOLOGIES[name]
        t0 = time.time()
        if mode == "A":
            sts = [self._submit(steps, lambda s, d: d)]
        else:
            sts = [self._submit([s], lambda s, d: ()) for s in topo(steps)]
        wall = time.time() - t0
        ivs, inst = defaultdict(list), defaultdict(list)
        iwq: dict[str, float] = defaultdict(float)
        for st in sts:
            assert st["state"] == "completed", st
            for step, rec in st["steps"].items():
                ep = next(e for s, e, _, _ in steps if s == step)
                step_ivs = []
                for x in self.r.lrange(self.keys.requests(rec["job"]), 0, -1):
                    x = json.loads(x)
                    ivs[ep].append((x["t0"], x["t1"]))
                    inst[(ep, x["instance"])].append((x["t0"], x["t1"]))
                    step_ivs.append((x["t0"], x["t1"]))
                iwq[ep] += idle_while_queued(step_ivs, self.fleet.endpoints[ep].slots)
        slots = {e: self.fleet.endpoints[e].slots for e in ivs}
        cap_ok = all(max_overlap(v) <= slots[e] for (e, _), v in inst.items())
        leases = sum(self.r.zcard(k) for k in self.r.scan_iter(f"{self.keys.prefix}:reqlease:*"))
        waiters = sum(int(self.r.get(k) or 0) for k in self.r.scan_iter(f"{self.keys.prefix}:reqwait:*"))
        # idle-while-queued (request level): slot-seconds an endpoint's slots sat idle
        # inside its active span while requests of its steps were already submitted
        util = slot_util(ivs, slots)
        return {"wall_s": wall, "slot_util": util, "cap_ok": cap_ok, "idle_while_queued_slot_s": sum(iwq.values()),
                "drain": {"request_leases": leases, "waiters": waiters}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--live", action="store_true")
    ap.add_argument("--reps", type=int, default=2, help="ABBA repetitions (4 runs each)")
    ap.add_argument("--out", default="")
    ap.add_argument("--only", default="", help="comma-separated topology names")
    ap.add_argument("--warmup", type=int, default=1,
                    help="discarded A and B runs per topology before the measured ones (the first run of a "
                         "live system pays every endpoint's cold start)")
    a = ap.parse_args(argv)
    from makespan.models import load_fleet

    fleet = load_fleet(FLEET)
    names = [n for n in TOPOLOGIES if not a.only or n in a.only.split(",")]
    live = Live() if a.live else None
    results = {}
    try:
        for name in names:
            runs = {"A": [], "B": []}
            for _ in range(a.warmup if live else 0):
                for mode in "AB":
                    live.run(name, mode)
            for _ in range(a.reps):
                for mode in "ABBA":
                    runs[mode].append(live.run(name, mode) if live else run_sim(name, mode, fleet))
            pairs = list(zip([x["wall_s"] for x in runs["A"]], [x["wall_s"] for x in runs["B"]]))
            ci = ratio_ci(pairs)
            row = {"A_wall_s": statistics.median(x["wall_s"] for x in runs["A"]),
                   "B_wall_s": statistics.median(x["wall_s"] for x in runs["B"]), **{f"ratio_{k}": v for k, v in ci.items()}}
            if live:
                for m in "AB":
                    eps = runs[m][0]["slot_util"].keys()
                    row[f"{m}_slot_util"] = {e: round(statistics.median(x["slot_util"][e] for x in runs[m]), 3)
                                             for e in eps}
                    row[f"{m}_cap_ok"] = all(x["cap_ok"] for x in runs[m])
                    row[f"{m}_idle_while_queued_slot_s"] = round(statistics.median(
                        x["idle_while_queued_slot_s"] for x in runs[m]), 4)
                    row[f"{m}_drain_zero"] = all(not any(x["drain"].values()) for x in runs[m])
            else:
                for m in "AB":
                    row[f"{m}_idle_while_queued_gpu_s"] = statistics.median(x["idle_while_queued_gpu_s"] for x in runs[m])
            results[name] = row
            print(f"{name:16s} A {row['A_wall_s']:.3f}s  B {row['B_wall_s']:.3f}s  ratio {ci['ratio']:.3f} "
                  f"[{ci['lo']:.3f}, {ci['hi']:.3f}]" + (f"  util A {row['A_slot_util']} B {row['B_slot_util']} "
                                                          f"iwq A {row['A_idle_while_queued_slot_s']:.3f} "
                                                          f"B {row['B_idle_while_queued_slot_s']:.3f} slot·s "
                                                          f"cap {row['A_cap_ok'] and row['B_cap_ok']} "
                                                          f"drain0 {row['A_drain_zero'] and row['B_drain_zero']}"
                                                          if live else
                                                          f"  idle-while-queued A {row['A_idle_while_queued_gpu_s']:.3f}"
                                                          f" B {row['B_idle_while_queued_gpu_s']:.3f} GPU·s"),
                  flush=True)
    finally:
        if live:
            live.close()
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
