"""The SIGTERM bound: every makespan process ends within ``shutdown_grace_s`` (+ 1 s) of
SIGTERM (docs/operations.md, "Stopping processes").

Each process first shuts down cleanly (the planner finishes its tick and releases its
lock, a GPU worker stops consuming and lets its running phases finish, the observer ends
its probe cycle, the dashboard closes its streams). :func:`arm` starts, when SIGTERM
arrives, a watchdog that ends the process with :data:`EXIT_SHUTDOWN_TIMEOUT` if the clean
shutdown has not finished after ``grace_s`` seconds: a phase still running (a long
execute) is cut off; its lease then expires and is reclaimed, as a lost worker's is.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("makespan.shutdown")

EXIT_SHUTDOWN_TIMEOUT = 4  # exit code of a process whose clean shutdown outlasted its grace period

_armed: threading.Timer | None = None
_lock = threading.Lock()


def arm(grace_s: float, process: str) -> threading.Timer:
    """Start (once per process) a daemon watchdog that ends the process with
    :data:`EXIT_SHUTDOWN_TIMEOUT` after ``grace_s`` seconds (wall clock); safe to call from
    a signal handler or a Celery signal. Returns the watchdog (the first one on later calls)."""
    global _armed
    with _lock:
        if _armed is None:
            _armed = threading.Timer(grace_s, _expire, args=(grace_s, process))
            _armed.daemon = True
            _armed.start()
        return _armed


def _expire(grace_s: float, process: str) -> None:
    msg = (f"makespan {process}: clean shutdown did not finish within {grace_s:g} s of SIGTERM "
           f"(MAKESPAN_SHUTDOWN_GRACE_S); exiting with code {EXIT_SHUTDOWN_TIMEOUT}")
    log.error("%s", msg)
    try:
        print(msg, file=sys.stderr, flush=True)
    finally:
        os._exit(EXIT_SHUTDOWN_TIMEOUT)
