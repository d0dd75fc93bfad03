"""Per-workload report from recorded events: makespan, critical path, and the time
spent waiting, in transitions and executing.

Definitions (wall seconds; divide by ``time_scale`` for workload seconds):

* a step is *ready* when its last dependency completed (the workload's submission for
  a step without dependencies); it *ends* when its final attempt ends;
* per step: ``transition_s`` = Σ evict + start_endpoint phase durations over its
  attempts, ``executing_s`` = Σ execute phase durations, ``waiting_s`` = end − ready −
  transition_s − executing_s (queueing, planning, dispatch, failed attempts);
* makespan = last step end − workload submission;
* critical path: from the last-ending step, repeatedly the dependency that completed
  last, back to a step without dependencies (Kelley & Walker's critical path on the
  realised schedule); its waiting/transition/executing sums split the makespan.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import redis

from makespan import events as ev
from makespan.keys import Keys
from makespan.workloads import workload_status

TRANSITION_PHASES = ("evict", "start_endpoint")


def _phase_durations(evs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """job -> {phase: Σ wall s} from phase_start/phase_end pairs."""
    start: dict[tuple[str, str, str], float] = {}
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in evs:
        if e.get("kind") not in ("phase_start", "phase_end") or not e.get("job"):
            continue
        k = (e["job"], e.get("lease", ""), e["phase"])
        if e["kind"] == "phase_start":
            start[k] = e["ts"]
        elif k in start:
            out[e["job"]][e["phase"]] += e["ts"] - start.pop(k)
    return out


def workload_report(r: redis.Redis, keys: Keys, workload_id: str,
                    events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``{"workload", "state", "makespan_s", "critical_path": [steps],
    "critical_path_s": {"waiting", "transition", "executing"},
    "totals_s": {...}, "steps": {step: {ready_s, start_s, end_s, waiting_s, transition_s,
    executing_s, attempts, state}}}``; times relative to the workload's submission.

    Raises:
        makespan.errors.NotFoundError: no such workload."""
    st = workload_status(r, keys, workload_id)
    evs = events if events is not None else list(ev.read_all(r, keys.events))
    t0 = float(st["submitted_at"])
    phases = _phase_durations(evs)
    first_lease: dict[str, float] = {}
    end_ts: dict[str, float] = {}
    for e in evs:
        j = e.get("job")
        if not j:
            continue
        if e["kind"] == "leased":
            first_lease.setdefault(j, e["ts"])
        elif e["kind"] in ("completed", "failed", "cancelled"):
            end_ts[j] = e["ts"]
    deps: dict[str, list[str]] = st["deps"]
    steps: dict[str, dict[str, Any]] = {}
    for name, s in st["steps"].items():
        attempts = s["attempts"]
        end = end_ts.get(s["job"])
        if end is None:
            end = s["finished_at"]
        steps[name] = {"state": s["state"], "attempts": len(attempts), "end_ts": end,
                       "start_ts": min((first_lease[a] for a in attempts if a in first_lease), default=None),
                       "transition_s": sum(phases[a][p] for a in attempts for p in TRANSITION_PHASES),
                       "executing_s": sum(phases[a]["execute"] for a in attempts)}
    for name, s in steps.items():
        dep_ends = [steps[d]["end_ts"] for d in deps.get(name, ()) if steps[d]["end_ts"] is not None]
        ready = max(dep_ends, default=t0)
        s["ready_s"] = ready - t0
        s["start_s"] = None if s["start_ts"] is None else s["start_ts"] - t0
        s["end_s"] = None if s["end_ts"] is None else s["end_ts"] - t0
        span = 0.0 if s["end_ts"] is None or s["start_ts"] is None else s["end_ts"] - ready
        s["waiting_s"] = max(0.0, span - s["transition_s"] - s["executing_s"])
    ended = [n for n, s in steps.items() if s["end_ts"] is not None]
    path: list[str] = []
    if ended:
        cur: str | None = max(ended, key=lambda n: steps[n]["end_ts"])
        while cur is not None:
            path.append(cur)
            ds = [d for d in deps.get(cur, ()) if steps[d]["end_ts"] is not None]
            cur = max(ds, key=lambda d: steps[d]["end_ts"]) if ds else None
        path.reverse()
    makespan = max((steps[n]["end_ts"] for n in ended), default=t0) - t0

    def total(names: list[str], key: str) -> float:
        return round(sum(steps[n][key] for n in names), 6)
    out_steps = {n: {k: (round(v, 6) if isinstance(v, float) else v) for k, v in s.items()
                     if k not in ("start_ts", "end_ts")} for n, s in steps.items()}
    return {"workload": workload_id, "name": st.get("name"), "state": st["state"], "makespan_s": round(makespan, 6),
            "critical_path": path,
            "critical_path_s": {"waiting": total(path, "waiting_s"), "transition": total(path, "transition_s"),
                                "executing": total(path, "executing_s")},
            "totals_s": {"waiting": total(list(steps), "waiting_s"), "transition": total(list(steps), "transition_s"),
                         "executing": total(list(steps), "executing_s")},
            "steps": out_steps}
