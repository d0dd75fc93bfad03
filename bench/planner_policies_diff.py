"""Compare two outputs of bench/planner_policies.py replay by replay (same windows, seeds
and policies): per policy, the mean, min and max of weighted completion B ÷ A over the
replays, and the means of makespan, restores, set-point absence (GPU-s) and cold starts,
A → B. Reads the per-replay lines (``… wc=… mk=… cold=… restores=… absent=…``).

    .venv/bin/python bench/planner_policies.py --planned-restore none > a.txt
    .venv/bin/python bench/planner_policies.py --planned-restore group > b.txt
    .venv/bin/python bench/planner_policies_diff.py a.txt b.txt
"""
import re
import sys
import statistics as st
def load(path):
    out = {}
    for line in open(path):
        m = re.match(r"(\S+@\d+) seed=(\d+) (\S+)\s+wc=(\S+) mk=(\d+) cold=(\d+).* restores=(\d+) absent=(\d+)", line)
        if m:
            out[(m[1], m[2], m[3])] = dict(wc=float(m[4]), mk=float(m[5]), cold=int(m[6]), rest=int(m[7]), absent=float(m[8]))
    return out
if len(sys.argv) != 3:
    sys.exit("usage: planner_policies_diff.py A.txt B.txt")
a, b = load(sys.argv[1]), load(sys.argv[2])
for pol in ["fifo", "min-evict", "wspt", "portfolio", "cpsat-fast"]:
    ks = [k for k in a if k[2] == pol and k in b]
    if not ks:
        continue
    r = [b[k]["wc"] / a[k]["wc"] for k in ks]
    print(f"{pol:10s} n={len(ks)} wc b/a mean {st.mean(r):.4f} min {min(r):.4f} max {max(r):.4f} | "
          f"makespan {st.mean(a[k]['mk'] for k in ks):.0f} -> {st.mean(b[k]['mk'] for k in ks):.0f} | "
          f"restores {st.mean(a[k]['rest'] for k in ks):.2f} -> {st.mean(b[k]['rest'] for k in ks):.2f} | "
          f"absent {st.mean(a[k]['absent'] for k in ks):.0f} -> {st.mean(b[k]['absent'] for k in ks):.0f} "
          f"({st.mean(b[k]['absent'] for k in ks)/st.mean(a[k]['absent'] for k in ks)-1:+.1%}) | "
          f"cold {st.mean(a[k]['cold'] for k in ks):.1f} -> {st.mean(b[k]['cold'] for k in ks):.1f}")
