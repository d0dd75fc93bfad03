"""A small known workload as recorded events (wall seconds from T0)."""

from __future__ import annotations

T0 = 1_700_000_000.0
G = ["GPU-host-a-0", "GPU-host-a-1", "GPU-host-a-2"]


def ev(t: float, kind: str, **kw) -> dict:
    return {"ts": T0 + t, "kind": kind, **kw}


def known_events() -> list[dict]:
    """j1 HIGH on a TP-2 group with every phase; j2 LOW executes only; j3 CRITICAL fails.

    j1: submitted 0, leased 1, evict 1-2, start_endpoint 2-4, execute 4-10, clear 10-11,
        restore 11-13, completed 13.  j2: submitted 0.5, leased 2, execute 2-5, completed 5.
    j3: submitted 3, leased 5.5, execute 5.5-6 then failed at 6 on GPU 2. Drain at 13.5.
    """
    a = dict(job="j1", lease="l1", gpus=G[:2], host="host-a", endpoint="judge", priority="HIGH", time_scale=0.01)
    b = dict(job="j2", lease="l2", gpus=G[2:], host="host-a", endpoint="embed", priority="LOW", time_scale=0.01)
    c = dict(job="j3", lease="l3", gpus=G[2:], host="host-a", endpoint="chat", priority="CRITICAL", time_scale=0.01)
    out = [ev(0, "submitted", job="j1", priority="HIGH", endpoint="judge"),
           ev(0.5, "submitted", job="j2", priority="LOW", endpoint="embed"),
           ev(1, "leased", **a)]
    for name, s, e in (("evict", 1, 2), ("start_endpoint", 2, 4), ("execute", 4, 10), ("clear", 10, 11)):
        out += [ev(s, "phase_start", phase=name, planned_s=100.0, **a),
                ev(e, "phase_end", phase=name, actual_s=float(e - s), **a)]
    out += [ev(11, "restore_start", phase="restore", **a), ev(13, "restore_end", phase="restore", **a),
            ev(13, "completed", **a)]
    out += [ev(2, "leased", **b), ev(2, "phase_start", phase="execute", **b),
            ev(5, "phase_end", phase="execute", **b), ev(5, "completed", **b)]
    out += [ev(3, "submitted", job="j3", priority="CRITICAL", endpoint="chat"), ev(5.5, "leased", **c),
            ev(5.5, "phase_start", phase="execute", **c), ev(6, "phase_end", phase="execute", **c),
            ev(6, "failed", **c), ev(13.5, "drain")]
    return sorted(out, key=lambda e: e["ts"])
