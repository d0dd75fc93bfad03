"""Invariants of a chaos run (bench/chaos.py), checked from Redis and recorded events.

* ``lost``: an accepted job neither completed nor failed/cancelled with a reason;
* ``completed_twice``: a job with more than one ``completed`` event or execute phase;
* ``gpu_overlap``: a GPU leased to two holders at once (:func:`lease_overlaps`);
* ``drain``: leases, agenda entries, busy slots or leaked reverse-dependency index entries
  (``awaited_entries``) left, or no drain check after the last job;
* ``set_point``: a set-point endpoint not resident on its GPUs;
* ``incident``: an incident with no injected fault in the window before it.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import redis

from makespan.keys import Keys
from makespan.run_report import drain_counts

INVARIANTS = ("lost", "completed_twice", "gpu_overlap", "drain", "set_point", "incident")
TERMINAL = ("completed", "failed", "cancelled")


def _events(r: redis.Redis, keys: Keys) -> list[dict]:
    out = []
    for _id, f in r.xrange(keys.events):
        try:
            out.append(json.loads(f["e"]))
        except (KeyError, ValueError):
            continue
    return out


LEASE_ENDS = ("completed", "failed", "cancelled", "restore_end", "reclaimed", "preempted")


def lease_overlaps(events: list[dict]) -> list[tuple[str, str, str]]:
    """(gpu, lease a, lease b) for leases that held a GPU at the same time, from the
    recorded events (the Redis view): a lease holds its GPUs from ``leased`` (or
    ``restore_start``) until its first end event (``LEASE_ENDS``; for ``reclaimed``, its
    ``expired_at`` if earlier), or forever."""
    start: dict[str, tuple[float, list[str]]] = {}
    ivs: dict[str, list[tuple[float, float, str]]] = {}
    for e in events:
        lid = e.get("lease")
        if not lid:
            continue
        if e["kind"] in ("leased", "restore_start"):
            start[lid] = (e["ts"], e.get("gpus") or [])
        elif e["kind"] in LEASE_ENDS and lid in start:
            t0, gpus = start.pop(lid)
            # a reclaimed lease stopped holding its GPUs when its keys expired (fencing
            # refuses its holder from then on), which can be before the reaper ran
            end = min(e["ts"], e.get("expired_at") or e["ts"])
            for g in gpus:
                ivs.setdefault(g, []).append((t0, end, lid))
    for lid, (t0, gpus) in start.items():
        for g in gpus:
            ivs.setdefault(g, []).append((t0, float("inf"), lid))
    bad = []
    for g, xs in ivs.items():
        xs.sort()
        for (_a0, a1, la), (b0, _b1, lb) in zip(xs, xs[1:]):
            if b0 < a1:
                bad.append((g, la, lb))
    return bad


def check_invariants(r: redis.Redis, keys: Keys, fleet, accepted: list[str], faults: list[tuple[float, str]],
                     fault_window_s: float) -> dict[str, list[str]]:
    """Violations per invariant (see module doc); every list empty means a clean run."""
    from makespan.workers.phases import instance_value
    from makespan.workers.fleet_view import set_point_instances

    v: dict[str, list[str]] = {k: [] for k in INVARIANTS}
    p = r.pipeline(transaction=False)
    for j in accepted:
        p.hmget(keys.job(j), "state", "reason")
    for j, (state, reason) in zip(accepted, p.execute()):
        if state == "completed":
            continue
        if state in ("failed", "cancelled") and reason:
            continue
        v["lost"].append(f"{j}: state={state} reason={reason!r}")
    evs = _events(r, keys)
    done = Counter(e.get("job") for e in evs if e["kind"] == "completed" and e.get("job"))
    execd = Counter(e.get("job") for e in evs if e["kind"] == "phase_end" and e.get("phase") == "execute")
    v["completed_twice"] += [f"{j}: {n} completed events" for j, n in done.items() if n > 1]
    v["completed_twice"] += [f"{j}: executed {n} times" for j, n in execd.items() if n > 1]
    v["gpu_overlap"] += [f"{g}: {a} and {b}" for g, a, b in lease_overlaps(evs)]
    d = drain_counts(r, keys, fleet)
    left = {k: d[k] for k in ("leases", "agenda_entries", "busy_slots", "awaited_entries") if d[k]}
    if left:
        v["drain"].append(f"left behind {left}: {d['left']}")
    last_end = max((e["ts"] for e in evs if e["kind"] in TERMINAL), default=0.0)
    if not any(e["kind"] == "drain" and e["ts"] >= last_end and not any(e.get(k) for k in left) for e in evs):
        v["drain"].append("no clean drain check after the last job")
    for ep, gpus in set_point_instances(fleet):
        have = r.mget([keys.resident(g) for g in gpus])
        if have != [instance_value(ep, gpus)] * len(gpus):
            v["set_point"].append(f"{ep} on {gpus}: resident {have}")
    for _id, rec in r.xrange(keys.incidents):
        if rec.get("kind") != "incident":
            continue
        at = float(rec.get("detected_at") or rec.get("ts") or time.time())
        if not any(at - fault_window_s <= t <= at for t, _ in faults):
            v["incident"].append(f"{rec.get('endpoint')} {rec.get('mode') or rec.get('failure_mode')} at {at:.2f}")
    return v
