"""Helpers for tests that run the live system as real processes."""

from __future__ import annotations

import signal
import time
from typing import Any

from makespan import events as ev
from makespan.live import LiveSystem
from makespan.live import wait_for  # noqa: F401 - re-exported for the tests


def stop_checked(system: LiveSystem) -> None:
    """Stop a live system whose test has made its checks: SIGKILL every process it started
    (each process group, so pool children too), then stop the endpoint processes they
    registered (:meth:`LiveSystem.stop`). No graceful shutdown is waited for: a GPU worker's
    warm shutdown waits for its running phase and then stops its idle endpoints, seconds per
    test that check nothing here. How processes end on SIGTERM is checked where it is the
    point (tests/faults/test_sigterm_bound.py, the SIGTERM cases of test_live_workloads and
    the faults tests)."""
    system.kill("", signal.SIGKILL)
    system.stop()


def overlaps(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Pairs of leases that held the same GPU at the same time (must be empty); the
    chaos runner's checker, so tests and the fault bench judge leases the same way."""
    from bench.chaos_invariants import lease_overlaps

    return lease_overlaps(events)


def all_events(r, keys) -> list[dict[str, Any]]:
    return list(ev.read_all(r, keys.events))


def wait_worker_consuming(settings, pid: int, timeout_s: float = 120.0, stop=None) -> bool:
    """Wait until the Celery GPU worker whose process id is ``pid`` answers a broadcast
    (it consumes its queue): the readiness of one process, where several workers of a
    host share a node name. ``timeout_s`` bounds a hang (a worker start is seconds alone
    and tens of seconds on a loaded host), s. ``stop`` (a ``threading.Event``): give up
    when it is set. Returns True once it answers, False when ``stop`` was set first.

    Raises:
        AssertionError: no answer from ``pid`` within ``timeout_s``."""
    from makespan.celery_app import create_celery

    app = create_celery(settings)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                return False
            replies = app.control.broadcast("stats", reply=True, timeout=0.5) or []
            if any(stats.get("pid") == pid for reply in replies for stats in reply.values()):
                return True
    finally:
        app.close()
    raise AssertionError(f"GPU worker {pid} did not consume within {timeout_s} s")


def flower_receives_events(port: int, auth: tuple[str, str] | None = None) -> bool:
    """Whether the Flower serving on 127.0.0.1:``port`` (``auth``: its basic-auth user and
    password, if any) has received a Celery worker's event (its ``flower_worker_online``
    gauge, set by a worker's heartbeat every 2 s, is 1 for some worker): its event receiver
    is subscribed. Flower answers HTTP before that receiver (a
    thread of its own) subscribes, and Celery's events are published to the subscribers of
    the moment: the events of a task sent before it are missed for good."""
    import httpx

    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", auth=auth, timeout=3.0).text
    except httpx.HTTPError:
        return False
    return any(line.startswith("flower_worker_online{") and line.rsplit(" ", 1)[-1] in ("1", "1.0")
               for line in text.splitlines())
