"""The SIGTERM bound: every makespan process ends within ``shutdown_grace_s`` (+ 1 s) of
SIGTERM (docs/operations.md, "Stopping processes").

Each process first shuts down cleanly (the planner finishes its tick and releases its
lock, a GPU worker stops consuming and lets its running phases finish, the observer ends
its probe cycle, the dashboard closes its streams). :func:`arm` starts, when SIGTERM
arrives (:func:`on_sigterm` sees it at once, whatever the main thread is doing), a
watchdog that ends the process with :data:`EXIT_SHUTDOWN_TIMEOUT` if the clean shutdown
has not finished after ``grace_s`` seconds: a phase still running (a long evict, a
set-point restore's start, or a function that ignores its cancel) is cut off; its lease
then expires and is reclaimed, as a lost worker's is. A GPU worker hands back at once
(``makespan.workers.phases.PhaseRunner.hand_back``) the lease of a job whose execute
stopped on :data:`SHUTTING_DOWN` (a workload function's, a wait of ``service_s`` or a
payload of requests), and of one whose endpoint start stopped on it (a process endpoint's
cold start at its next pause between health probes, a wake awaiting its answer, a helper
endpoint's start, a modelled start's wait: the processes that start spawned are stopped
first, ``PhaseRunner._paced_cancellable``).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger("makespan.shutdown")

EXIT_SHUTDOWN_TIMEOUT = 1  # exit code of a process whose clean shutdown outlasted its grace period (faulthandler's)

SHUTTING_DOWN = threading.Event()
"""Set when this process's shutdown begins (:func:`arm`): work that can end early sees it
(a GPU worker's running workload function gets ``ctx.cancelled``, with ``cancel_reason``
``worker_shutdown``: :mod:`makespan.workers.functions`) and ends before the watchdog.
One per process: a Celery prefork child's stays unset when its parent shuts down (the
``worker_shutting_down`` signal, which arms, is sent in the parent only)."""

_armed = False
_lock = threading.Lock()
_deadline_monotonic: float | None = None  # when the watchdog fires (time.monotonic()); None: not armed


def time_left_s() -> float | None:
    """Seconds left (>= 0) before this process's watchdog ends it (:func:`arm`); None while
    no shutdown began. Work that must finish before it (the process driver's stop of an
    endpoint: its SIGKILL comes before the watchdog) bounds its waits by it."""
    deadline = _deadline_monotonic
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def arm(grace_s: float, process: str, signal_name: str = "SIGTERM") -> bool:
    """Start (once per process) the watchdog: ``faulthandler.dump_traceback_later`` with
    ``exit=True``, a C thread that needs no GIL, so it fires also while the interpreter
    finalizes or a C call holds the GIL: after ``grace_s`` seconds (wall clock) it writes
    every thread's traceback to stderr (where the shutdown was stuck) and ends the process
    with :data:`EXIT_SHUTDOWN_TIMEOUT`. Safe to call from a signal handler or a Celery
    signal. Sets :data:`SHUTTING_DOWN`; :func:`time_left_s` counts down from ``grace_s``.
    ``signal_name`` (``"SIGTERM"``, ``"SIGINT"``, ...) is the signal the stderr line names.
    Returns True if this call armed it."""
    global _armed, _deadline_monotonic
    SHUTTING_DOWN.set()
    with _lock:
        if _armed:
            return False
        _armed = True
        _deadline_monotonic = time.monotonic() + grace_s
    # the process's own stderr (fd 2): Celery replaces sys.stderr with a logging proxy that has no fd
    err = sys.__stderr__
    try:
        print(f"makespan {process}: {signal_name}; ending within {grace_s:g} s (MAKESPAN_SHUTDOWN_GRACE_S), else exit "
              f"code {EXIT_SHUTDOWN_TIMEOUT} with every thread's traceback below", file=err, flush=True)
        faulthandler.dump_traceback_later(grace_s, repeat=False, file=err, exit=True)
    except (AttributeError, OSError, RuntimeError, ValueError) as e:  # no usable fd 2: a Python timer instead
        log.warning("faulthandler watchdog unavailable (%s); a thread timer ends the process instead", e)
        timer = threading.Timer(grace_s, os._exit, args=(EXIT_SHUTDOWN_TIMEOUT,))
        timer.daemon = True
        timer.start()
    return True


def on_sigterm(grace_s: float, process: str, stop: Callable[[], None]) -> Callable[[], None]:
    """In the main thread: make SIGTERM call ``stop`` (from the main thread, as Python runs
    signal handlers) and arm the watchdog (:func:`arm`) at once, from a helper thread, even
    while the main thread is inside a long C call (a blocking Redis read, a solver): the
    C-level handler writes the signal to a wakeup pipe (``signal.set_wakeup_fd``) that the
    helper thread reads. Not for a process whose event loop owns the wakeup fd (uvicorn:
    the dashboard arms from its own handler). Returns a function that puts the previous
    handler and wakeup fd back and closes the pipe (for a caller that returns instead of
    exiting; calling it again does nothing): the helper thread then closes the read end
    and ends, so a process that calls this repeatedly keeps no fd of it."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    old_handler = signal.signal(signal.SIGTERM, lambda *_a: stop())
    restored = threading.Event()

    def restore() -> None:
        if restored.is_set():  # a second close could close an fd number reused since
            return
        restored.set()
        signal.signal(signal.SIGTERM, old_handler)
        signal.set_wakeup_fd(old_fd)
        os.close(write_fd)  # the helper thread's read returns b'': it closes read_fd and ends

    def _watch() -> None:
        # Reads until the write end is closed (restore), also after SIGTERM was seen: the
        # wakeup fd stays set until then, and a read end closed early would make every
        # later signal's write fail (a warning on stderr each time).
        try:
            while True:
                try:
                    got = os.read(read_fd, 64)
                except OSError:
                    return
                if not got:
                    return
                if int(signal.SIGTERM) in got:
                    arm(grace_s, process)  # once per process: a second SIGTERM changes nothing
        finally:
            os.close(read_fd)

    threading.Thread(target=_watch, name="makespan-sigterm-watch", daemon=True).start()
    return restore
