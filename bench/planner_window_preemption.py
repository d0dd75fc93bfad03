"""Preemption decided in the CP-SAT windows (planner/window_preemption.py) against the
greedy floor's decision alone, per batch.

Batches: the windows of ``bench/planner_cpsat.py`` (3 ITP windows × ``--seeds`` seeds; 64
jobs on 8 GPUs and 256 on 32; times ÷ 20), all queued now (release = now). Every GPU is
held by a running job: the trace's next single-GPU jobs after the window, one per GPU,
with their own priority levels (the rules decide which may be cut), each started a
seeded U(0, 0.3) of its service ago (resident: its endpoint). Policies, each with
``plan(..., preemption=True)`` at ``--limit`` s:

* ``floor``: ``portfolio`` — the greedy floor's scored decision only;
* ``cpsat/floor``: ``cpsat`` on the floor's branch, its windows not deciding preemptions;
* ``cpsat/window``: ``cpsat`` whose windows also decide them, and which may undo the
  floor's decision (:data:`makespan.planner.api.UNDO_SHARE`; the shipped default).

Score of a plan = the evaluator's score with its preemptions
(:func:`makespan.planner.preemption_plan.evaluate_preemptive`) + the uncut running jobs at their
own completions (the same jobs on every side). Prints per size the ratio cpsat/window ÷
cpsat/floor (median, mean, min, max; better / equal / worse batches) and the
preemptions each took. Per-batch lines go to stderr. The limit is wall time: a rerun
differs (more on a loaded machine), so compare runs of the same minutes.

``--undo-shares 0,0.25:0.25,0.25:1``: ``cpsat/window`` once per share of the limit spent
solving the batch without the floor's preemptions (:data:`makespan.planner.api.UNDO_SHARE`; 0: the
floor's branch only, as before the undo; ``S:W``: also that attempt's first-window share
:data:`makespan.planner.api.UNDO_WINDOW_SHARE` = W; W defaults to its value in makespan.planner.api, 1), interleaved per batch; a second table gives
each share ÷ the first one listed, and how often the floor's preemptions were undone.

    .venv/bin/python bench/planner_window_preemption.py [--limit 1] [--seeds 3] [--undo-shares 0,0.25:1]
"""

import argparse
import dataclasses
import random
import statistics as stt
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from makespan.traces import read_trace  # noqa: E402
from makespan.planner import preemption_plan as pp  # noqa: E402
from makespan.planner import api  # noqa: E402
from makespan.planner.api import plan  # noqa: E402
from makespan.planner.evaluator import score  # noqa: E402
from makespan.planner.model import RunningJob  # noqa: E402
from makespan.planner.simulator import fleet_state, to_plan_jobs  # noqa: E402
from planner_cpsat import SIZES, WINDOWS  # noqa: E402
from planner_common import BENCH_POLICIES, bench_fleet  # noqa: E402


def busy_batch(path: str, start: int, n: int, fleet, seed: int):
    """(batch, state): the window's n jobs queued now, every GPU held (module doc)."""
    rows = to_plan_jobs(read_trace(path, fleet, seed=seed, start=start, limit=n + 40 * len(fleet_state(fleet).gpus)), 20.0)
    base = fleet_state(fleet)
    now = base.now_s
    batch = [dataclasses.replace(j, release_s=now) for j in rows[:n]]
    rng = random.Random(seed)
    tp1 = [j for j in rows[n:] if base.endpoints[j.endpoint].tp == 1]
    running, free_at, resident = {}, dict(base.free_at), dict(base.resident)
    for g, job in zip(base.gpus, tp1):
        ran = rng.uniform(0.0, 0.3) * job.service_s
        job = dataclasses.replace(job, release_s=now - ran)
        running[g.uuid] = RunningJob(job, (g.uuid,), now - ran, now - ran, now - ran + job.service_s, True)
        free_at[g.uuid], resident[g.uuid] = now - ran + job.service_s, job.endpoint
    if len(running) < len(base.gpus):
        raise SystemExit(f"{path}: fewer than {len(base.gpus)} single-GPU jobs after the window")
    return batch, dataclasses.replace(base, free_at=free_at, resident=resident, running=running)


def total(p, batch, state) -> float:
    cut = {v for x in p.preemptions for v in x.victims}
    ev = pp.evaluate_preemptive(p, batch, state) if p.preemptions else p
    kept = {h.id: h for h in state.running.values() if h.id not in cut}
    return score(ev) + pp.fixed_score([(h.job, h.end_s) for h in kept.values()], "weighted_completion")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=1.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--undo-shares", default=None, help="comma-separated shares of the limit (makespan.planner.api.UNDO_SHARE)")
    a = ap.parse_args()
    default_w = api.UNDO_WINDOW_SHARE
    shares = a.undo_shares.split(",") if a.undo_shares else [f"{api.UNDO_SHARE}:{api.UNDO_WINDOW_SHARE}"]
    by_share: list[tuple[int, list[dict[str, tuple[float, float]]]]] = []
    print("| jobs | GPUs | batches | window ÷ floor-only median | mean | min | max | better / equal / worse "
          "| preemptions floor / cpsat-floor / cpsat-window (mean) | window ÷ portfolio@plan median |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, g in SIZES:
        fleet = bench_fleet(g)
        ratios, vs_floor, pre = [], [], {"portfolio": [], "cpsat/floor": [], "cpsat": []}
        rows: list[dict[str, tuple[float, float]]] = []
        by_share.append((n, rows))
        for path, start in WINDOWS:
            for seed in range(a.seeds):
                batch, state = busy_batch(path, start, n, fleet, seed)
                got = {}
                row: dict[str, tuple[float, float]] = {}
                for pol in pre:
                    for share in (shares if pol == "cpsat" else [shares[-1]]):
                        head, _, tail = share.partition(":")
                        api.UNDO_SHARE, api.UNDO_WINDOW_SHARE = float(head), float(tail) if tail else default_w
                        p = plan(batch, state, BENCH_POLICIES.lookup(pol), time_limit_s=a.limit, preemption=True)
                        if pol == "cpsat":
                            row[share] = (total(p, batch, state), p.stats.get("undo_branch", 0.0))
                    got[pol] = total(p, batch, state)  # cpsat: the last share listed
                    pre[pol].append(len(p.preemptions))
                rows.append(row)
                if len(shares) > 1:
                    print("#   shares: " + " ".join(f"{k}={v[0]:.6g}/undone={v[1]:.0f}" for k, v in row.items()),
                          file=sys.stderr, flush=True)
                ratios.append(got["cpsat"] / got["cpsat/floor"])
                vs_floor.append(got["cpsat"] / got["portfolio"])
                print(f"# {Path(path).stem}@{start} seed={seed} n={n}: " + " ".join(
                    f"{k}={v:.6g}" for k, v in got.items()) + f" preemptions={[pre[k][-1] for k in pre]}",
                    file=sys.stderr, flush=True)  # progress; stdout holds only the table
        b = sum(r < 1 - 1e-9 for r in ratios)
        w = sum(r > 1 + 1e-9 for r in ratios)
        print(f"| {n} | {g} | {len(ratios)} | {stt.median(ratios):.4f} | {stt.mean(ratios):.4f} | {min(ratios):.4f} | "
              f"{max(ratios):.4f} | {b} / {len(ratios) - b - w} / {w} | "
              + " / ".join(f"{stt.mean(v):.1f}" for v in pre.values()) + f" | {stt.median(vs_floor):.4f} |",
              flush=True)

    if len(shares) > 1:
        print(f"\n| jobs | undo share | ÷ share {shares[0]} median | mean | min | max | better / equal / worse "
              "| floor's preemptions undone (batches) |")
        print("|---|---|---|---|---|---|---|---|")
        for n, rows in by_share:
            for share in shares[1:]:
                r = [row[share][0] / row[shares[0]][0] for row in rows]
                b, w = sum(x < 1 - 1e-9 for x in r), sum(x > 1 + 1e-9 for x in r)
                print(f"| {n} | {share} | {stt.median(r):.4f} | {stt.mean(r):.4f} | {min(r):.4f} | {max(r):.4f} | "
                      f"{b} / {len(r) - b - w} / {w} | {sum(row[share][1] for row in rows):.0f} |", flush=True)


if __name__ == "__main__":
    main()
