"""Totals of a chaos series from its per-run lines (bench/chaos.py's output), also while it
is still running or after it was stopped: runs done, jobs and their states, faults drawn
per kind, violations per invariant (with the runs they came from), runs that could not
be made, and the mean seconds per part of a run.

Run: ``.venv/bin/python -m bench.chaos_summary /work/notes/chaos-200.txt``
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import Counter
from pathlib import Path

from bench.chaos import FAULTS
from bench.chaos_invariants import INVARIANTS

RUN = re.compile(r"^run\s+(\d+) seed (\d+) pool (\S+)\s+jobs (\d+) (\{.*?\}) faults (\[.*?\]) ([\d.]+) s (\{.*?\}) (.*)$")
ERROR = re.compile(r"^run\s+(\d+) seed (\d+) ERROR")


def summarize(lines: list[str]) -> dict:
    """The totals of the per-run lines in ``lines`` (other lines are ignored)."""
    out = {"runs": 0, "errors": [], "jobs": 0, "states": Counter(), "faults": Counter(), "violations": Counter(),
           "violating_runs": {}, "crashed": 0, "wall_s": 0.0, "parts_s": Counter(), "oom": 0}
    for line in lines:
        if ERROR.match(line):
            out["errors"].append(int(ERROR.match(line).group(2)))
            continue
        m = RUN.match(line.rstrip("\n"))
        if not m:
            continue
        _n, seed, _pool, jobs, states, faults, wall_s, parts, rest = m.groups()
        out["runs"] += 1
        out["jobs"] += int(jobs)
        out["states"].update(ast.literal_eval(states))
        out["faults"].update(f.split(":")[0] for f in ast.literal_eval(faults))
        out["wall_s"] += float(wall_s)
        out["parts_s"].update(ast.literal_eval(parts))
        oom = re.match(r"oom (\d+) ", rest)
        if oom:
            out["oom"] += int(oom.group(1))
        if rest.startswith("VIOLATIONS ") or " VIOLATIONS " in rest:
            body = rest.split("VIOLATIONS ", 1)[1]
            body = body.split(" crashed [", 1)[0]
            viol = json.loads(body)
            bad = {k: len(v) for k, v in viol.items() if v}
            out["violations"].update(bad)
            out["violating_runs"][int(seed)] = sorted(bad)
        if " crashed [" in rest or rest.startswith("crashed ["):
            out["crashed"] += len(ast.literal_eval(rest.split("crashed ", 1)[1]))
    return out


def report(s: dict) -> str:
    runs = max(s["runs"], 1)
    return "\n".join([
        f"runs {s['runs']} (runs that could not be made: {len(s['errors'])} {s['errors']}), jobs {s['jobs']} "
        f"{dict(s['states'])}, mean {s['wall_s'] / runs:.1f} s per run",
        "faults drawn: " + ", ".join(f"{k} {s['faults'][k]}" for k in FAULTS) + f" (total {sum(s['faults'].values())})",
        "violations: " + ", ".join(f"{k} {s['violations'][k]}" for k in INVARIANTS)
        + f" (total {sum(s['violations'].values())}); runs with one: {s['violating_runs'] or 'none'}",
        f"commands refused with OOM: {s['oom']}; processes that exited on their own: {s['crashed']}",
        "mean seconds per part: " + ", ".join(f"{k} {v / runs:.1f}" for k, v in s["parts_s"].items()),
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.chaos_summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("output", type=Path, help="a file bench.chaos wrote")
    a = ap.parse_args(argv)
    print(report(summarize(a.output.read_text(errors="replace").splitlines())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
