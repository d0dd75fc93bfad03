"""Helpers for tests that run the live system as real processes."""

from __future__ import annotations

from typing import Any

from makespan import events as ev
from makespan.live import wait_for  # noqa: F401 - re-exported for the tests


def overlaps(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Pairs of leases that held the same GPU at the same time (must be empty); the
    chaos runner's checker, so tests and the fault bench judge leases the same way."""
    from bench.chaos_invariants import lease_overlaps

    return lease_overlaps(events)


def all_events(r, keys) -> list[dict[str, Any]]:
    return list(ev.read_all(r, keys.events))
