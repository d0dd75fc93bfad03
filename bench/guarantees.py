"""The guarantees a scheduler is judged by (issue 19): each scenario's figure.

Run on a checkout to measure it; run it on two checkouts (before / after) to compare (it
prints one checkout's figures; ``--only N[,N]`` runs those scenarios alone):

    .venv/bin/python bench/guarantees.py [--skip-traces] [--seeds 3] [--windows 2] [--only 1,4]

Scenarios (simulator unless said; ``portfolio`` and ``default`` where named):

1. gang starved by small jobs: 8 GPUs in 2 hosts of 4; a NORMAL TP-4 job of 600 s at
   t = 1,800 s; a NORMAL TP-1 job of 300 s every 38 s for 4 h. Figure: the gang's wait, s.
2. preemption thrash: 1 GPU; a LOW job of 1,000 s at t = 0; a CRITICAL job of 50 s every
   400 s for 3 h. Figures per preemption mode: times the LOW job was preempted, its
   GPU-s thrown away, its completion, s.
3. a HIGH TP-8 gang and a LOW TP-4 job leaving 4 GPUs free (8 GPUs on one host): the
   preemptions and the HIGH job's wait, s, per mode.
4. priority inversion through a dependency (in-process planner ticks on the Redis at
   ``MAKESPAN_REDIS_URL``, a private key prefix deleted afterwards): 1 GPU; LOW ``L``, 10
   NORMAL, CRITICAL ``C`` depends_on=[L]. Figure: C's start position, per policy.
5. a steady CRITICAL stream (1 GPU, a 50 s CRITICAL job every 60 s for 2 h) and 5 LOW jobs
   of 300 s at t = 0: how many LOW jobs completed while the stream ran.
6. per-class p95 wait ÷ ``fifo`` on the bench's trace windows (bench/planner_common.py's
   rule, 200 jobs, 16 GPUs; ``--windows`` per trace × ``--seeds``), ``portfolio`` (the
   default policy's table is bench/planner_policies.py's).
7. a HIGH TP-8 job under a steady stream of 1-GPU LOW jobs (volcano#748): 8 GPUs, LOW jobs
   of 30 s at 1.5, 3 or 5 a second for 10 min, the HIGH job at t = 120 s. Figures per
   policy (``fifo``, ``portfolio``, ``default``) and with the fast lane off: the HIGH job's
   wait, s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from makespan.models import parse_fleet  # noqa: E402
from makespan.planner.model import PlanJob  # noqa: E402
from makespan.planner.simulator import simulate  # noqa: E402

W = {0: 8.0, 1: 4.0, 2: 2.0, 3: 1.0}


def _job(jid, ep, prio, release_s, service_s, seq):
    return PlanJob(jid, ep, W[prio], release_s, service_s, prio, seq=seq)


def _rec(rep, jid):
    return next(r for r in rep["schedule"]["jobs"] if r["id"] == jid)


def gang_starved(policies=("portfolio", "default")):
    fleet = parse_fleet({"name": "2x4", "hosts": [{"name": "a", "gpu_count": 4, "memory_mib": 81920},
                                                 {"name": "b", "gpu_count": 4, "memory_mib": 81920}],
                         "endpoints": {"one": {"model": "s", "memory_mib_per_gpu": 1000, "cold_start_s": 20},
                                       "four": {"model": "g", "tensor_parallel": 4, "memory_mib_per_gpu": 1000,
                                                "cold_start_s": 20}}})
    jobs = [_job(f"s{i}", "one", 2, 38.0 * i, 300.0, i) for i in range(int(4 * 3600 / 38))]
    jobs.append(_job("gang", "four", 2, 1800.0, 600.0, 10 ** 6))
    jobs.sort(key=lambda j: (j.release_s, j.seq))
    print("## 1. gang starved by small jobs (wait of the TP-4 job, s; small jobs started after its submission "
          "before it)")
    for pol in policies:
        rep = simulate(jobs, fleet, pol, restore=False, detail=True, time_limit_s=0.05)
        g = _rec(rep, "gang")
        ahead = sum(1 for r in rep["schedule"]["jobs"] if r["id"] != "gang" and r["submit_s"] > g["submit_s"]
                    and r["start_s"] < g["start_s"])
        print(f"  {pol:10} gang wait {g['start_s'] - g['submit_s']:8.0f} s   overtaken by {ahead:4d}   "
              f"weighted completion {rep['weighted_completion_s']:.4g}")


def thrash():
    fleet = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 10}}})
    jobs = [_job("low", "e", 3, 0.0, 1000.0, 0)] + [_job(f"c{i}", "e", 0, 400.0 * i, 50.0, i) for i in range(1, 28)]
    print("## 2. preemption thrash (the LOW job)")
    for mode in ("plan", "rule"):
        rep = simulate(jobs, fleet, "portfolio", preemption=mode, restore=False, detail=True)
        cuts = [e for e in rep["schedule"]["preemptions"] if "low" in e["victims"]]
        lost = sum(b - a for a, b, _g in rep["schedule"]["lost"])
        print(f"  {mode:5} preempted {len(cuts):3d} times   lost {lost:7.0f} GPU-s   "
              f"completed at {_rec(rep, 'low')['end_s']:7.0f} s")


def half_free_gang():
    fleet = parse_fleet({"name": "eight", "hosts": [{"name": "h", "gpu_count": 8, "memory_mib": 81920}],
                         "endpoints": {"small": {"model": "s", "tensor_parallel": 4, "memory_mib_per_gpu": 1000,
                                                 "cold_start_s": 30},
                                       "big": {"model": "b", "tensor_parallel": 8, "memory_mib_per_gpu": 1000,
                                               "cold_start_s": 30}}})
    jobs = [_job("low", "small", 3, 0.0, 1000.0, 0), _job("high", "big", 1, 100.0, 300.0, 1)]
    print("## 3. HIGH TP-8 gang, a LOW TP-4 job leaving 4 GPUs free")
    for mode in ("plan", "rule"):
        rep = simulate(jobs, fleet, "portfolio", preemption=mode, restore=False, detail=True)
        h = _rec(rep, "high")
        print(f"  {mode:5} preemptions {rep['jobs']['preempted']}   HIGH waited {h['start_s'] - h['submit_s']:6.0f} s")


def inversion(policies=("portfolio", "default")):
    from makespan.keys import Keys
    from makespan.producer import Producer
    from makespan.redis_conn import connect
    from makespan.settings import Settings
    from makespan.workers.phases import PhaseRunner
    from makespan.workers.planner_worker import PlannerWorker

    fleet = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 20000, "cold_start_s": 1}}})
    print("## 4. priority inversion through a dependency (start position of the CRITICAL job C, 1 = first)")
    url = os.environ.get("MAKESPAN_REDIS_URL", "redis://127.0.0.1:6379/0")
    for pol in policies:
        prefix = f"bench-guar-{uuid.uuid4().hex[:8]}"
        s = Settings(redis_url=url, key_prefix=prefix, time_scale=0.01, lease_ttl_s=60.0, heartbeat_s=0.5,
                     batch_wait_s=0.02, planner_tick_s=0.05, policy=pol)
        r = connect(url)
        sent = []
        w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q, sent=sent: sent.append(ctx))
        try:
            prod, runner = Producer(r, Keys(prefix), fleet, s), PhaseRunner(r, s, fleet)
            low = prod.submit({"endpoint": "e", "service_s": 5, "priority": "LOW"}).id
            for _ in range(10):
                prod.submit({"endpoint": "e", "service_s": 5, "priority": "NORMAL"})
            crit = prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL", "depends_on": [low]}).id
            for _ in range(60):
                w.tick()
                if len(sent) >= 12:
                    break
                if sent and r.hget(Keys(prefix).job(sent[-1].job_id), "state") == "leased":
                    runner._finish(sent[-1], "completed", "")
            order = [c.job_id for c in sent]
            pos = order.index(crit) + 1 if crit in order else None
            print(f"  {pol:10} C started {pos}{'th' if pos and pos > 3 else ''}   L started "
                  f"{order.index(low) + 1 if low in order else None}")
        finally:
            w.close()
            keys = list(r.scan_iter(f"{prefix}:*", count=1000))
            if keys:
                r.delete(*keys)


def critical_stream():
    fleet = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 10}}})
    jobs = [_job(f"low{i}", "e", 3, 0.0, 300.0, i) for i in range(5)]
    jobs += [_job(f"c{i}", "e", 0, 60.0 * i, 50.0, 10 + i) for i in range(1, 120)]
    print("## 5. steady CRITICAL stream (50 s every 60 s for 2 h) and 5 LOW jobs of 300 s")
    for mode in ("plan", "rule"):
        rep = simulate(jobs, fleet, "portfolio", preemption=mode, restore=False, detail=True)
        ends = sorted(_rec(rep, f"low{i}")["end_s"] for i in range(5))
        done = sum(e <= 7200.0 for e in ends)
        print(f"  {mode:5} LOW jobs done while the stream ran: {done}/5   first LOW done at {ends[0]:.0f} s   "
              f"preemptions {rep['jobs']['preempted']}")


def high_gang_under_low_stream(policies=("fifo", "portfolio", "default")):
    fleet = parse_fleet({"name": "eight", "hosts": [{"name": "h", "gpu_count": 8, "memory_mib": 81920}],
                         "endpoints": {"one": {"model": "s", "memory_mib_per_gpu": 1000, "cold_start_s": 20},
                                       "eight": {"model": "b", "tensor_parallel": 8, "memory_mib_per_gpu": 1000,
                                                 "cold_start_s": 30}}})
    print("## 7. HIGH TP-8 job under a stream of 1-GPU LOW jobs (the HIGH job's wait, s)")
    for rate in (1.5, 3.0, 5.0):
        jobs = [_job(f"l{i}", "one", 3, i / rate, 30.0, i) for i in range(int(600 * rate))]
        jobs = sorted(jobs + [_job("high", "eight", 1, 120.0, 200.0, 10 ** 6)], key=lambda j: (j.release_s, j.seq))
        rows = []
        for pol in policies:
            rep = simulate(jobs, fleet, pol, restore=False, detail=True, time_limit_s=0.05)
            rows.append(f"{pol} {_rec(rep, 'high')['start_s'] - 120.0:.0f}")
        rep = simulate(jobs, fleet, "portfolio", restore=False, detail=True, time_limit_s=0.05, lane_levels={},
                       lane_start_grace_s={})
        rows.append(f"portfolio without the fast lane {_rec(rep, 'high')['start_s'] - 120.0:.0f}")
        print(f"  {rate} LOW jobs/s: " + ", ".join(rows))


def _windows(path, fleet, n, gpus, k):
    """The bench's window rule (bench/planner_common.py ``select_windows``); [] when none passes."""
    from bench.planner_common import select_windows

    try:
        return select_windows(str(path), fleet, n, gpus, k)
    except ValueError:
        return []


def class_ratios(seeds: int, windows: int, policy: str = "portfolio"):
    from bench.planner_common import TRACES, bench_fleet, window_jobs

    gpus, n = 16, 200
    fleet = bench_fleet(gpus)
    print(f"## 6. per-class p95 wait ÷ fifo, {policy}, trace windows ({windows}/trace × {seeds} seeds, "
          f"{n} jobs, {gpus} GPUs)")
    ratios: dict[str, list[float]] = {k: [] for k in ("CRITICAL", "HIGH", "NORMAL", "LOW")}
    wc = []
    t0 = time.perf_counter()
    for path in TRACES:
        for st in _windows(path, fleet, n, gpus, windows):
            for seed in range(seeds):
                jobs, _ = window_jobs(path, fleet, st, n, seed, gpus)
                a = simulate(jobs, fleet, policy, seed)
                b = simulate(jobs, fleet, "fifo", seed)
                wc.append(a["weighted_completion_s"] / b["weighted_completion_s"])
                for lvl in ratios:
                    pa, pb = a["wait_s"][lvl]["p95"], b["wait_s"][lvl]["p95"]
                    if pa is not None and pb:
                        ratios[lvl].append(pa / pb)
                    elif pa is not None and pb is not None:  # fifo waited 0 at p95
                        ratios[lvl].append(1.0 if pa <= 1e-6 else float("inf"))
    for lvl, xs in ratios.items():
        if xs:
            print(f"  {lvl:8} p95 ÷ fifo: median {statistics.median(xs):.2f}  worst {max(xs):.2f}  (n={len(xs)})")
    print(f"  weighted completion ÷ fifo: mean {statistics.mean(wc):.3f}  ({time.perf_counter() - t0:.0f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-traces", action="store_true", help="skip scenario 6 (the trace windows)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--windows", type=int, default=2, help="windows per trace (4 traces)")
    ap.add_argument("--only", default="", help="comma list of scenario numbers to run (1-7; default: all)")
    args = ap.parse_args()
    scenarios = {1: gang_starved, 2: thrash, 3: half_free_gang, 4: inversion, 5: critical_stream,
                 6: lambda: class_ratios(args.seeds, args.windows), 7: high_gang_under_low_stream}
    try:
        chosen = [int(n) for n in args.only.split(",") if n.strip()] or list(scenarios)
    except ValueError:
        ap.error(f"--only {args.only!r}: scenario numbers 1-7, comma separated")
    unknown = [n for n in chosen if n not in scenarios]
    if unknown:
        ap.error(f"--only: no scenario {unknown[0]} (1-7)")
    for number in chosen:
        if number == 6 and args.skip_traces:
            continue
        scenarios[number]()


if __name__ == "__main__":
    main()
