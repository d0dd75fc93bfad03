"""Helpers for tests that run the live system as real processes."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable

from app import events as ev

END_KINDS = ("completed", "failed", "cancelled", "restore_end", "reclaimed", "preempted")


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = cond()
        if out:
            return out
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def lease_intervals(events: list[dict[str, Any]]) -> dict[str, list[tuple[float, float, str]]]:
    """GPU -> [(lease start, lease end, lease id)] from recorded events (the Redis view)."""
    start: dict[str, tuple[float, list[str]]] = {}
    out: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for e in events:
        lid = e.get("lease")
        if not lid:
            continue
        if e["kind"] in ("leased", "restore_start"):
            start[lid] = (e["ts"], e.get("gpus") or [])
        elif e["kind"] in END_KINDS and lid in start:
            t0, gpus = start.pop(lid)
            for g in gpus:
                out[g].append((t0, e["ts"], lid))
    for lid, (t0, gpus) in start.items():  # never ended
        for g in gpus:
            out[g].append((t0, float("inf"), lid))
    return out


def overlaps(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Pairs of leases that held the same GPU at the same time (must be empty)."""
    bad = []
    for g, ivs in lease_intervals(events).items():
        ivs.sort()
        for (a0, a1, la), (b0, b1, lb) in zip(ivs, ivs[1:]):
            if b0 < a1:
                bad.append((g, la, lb))
    return bad


def all_events(r, keys) -> list[dict[str, Any]]:
    return list(ev.read_all(r, keys.events))
