"""Helpers for tests that run the live system as real processes."""

from __future__ import annotations

import time
from typing import Any, Callable

from app import events as ev


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = cond()
        if out:
            return out
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def overlaps(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Pairs of leases that held the same GPU at the same time (must be empty); the
    chaos runner's checker, so tests and the fault bench judge leases the same way."""
    from bench.chaos_invariants import lease_overlaps

    return lease_overlaps(events)


def all_events(r, keys) -> list[dict[str, Any]]:
    return list(ev.read_all(r, keys.events))
