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

A Celery prefork GPU worker's phases run in pool children, which Celery does not tell of
its warm shutdown: the worker opens a pipe before it forks them
(:func:`open_children_notice`) and :func:`arm` closes its write end; each child sets its
own :data:`SHUTTING_DOWN` at that EOF (:func:`watch_parent_notice`), and a SIGTERM that
reaches a child during a task does the same instead of ending it mid-phase
(:func:`hold_sigterm_during_task`, :func:`task_done`).
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
from typing import Any

from makespan.log_format import as_line

log = logging.getLogger("makespan.shutdown")

EXIT_SHUTDOWN_TIMEOUT = 1  # exit code of a process whose clean shutdown outlasted its grace period (faulthandler's)

SHUTTING_DOWN = threading.Event()
"""Set when this process's shutdown begins (:func:`arm`): work that can end early sees it
(a GPU worker's running workload function gets ``ctx.cancelled``, with ``cancel_reason``
``worker_shutdown``: :mod:`makespan.workers.functions`) and ends before the watchdog.
One per process: a Celery prefork child sets its own when its parent's shutdown begins
(:func:`watch_parent_notice`) or when SIGTERM reaches it during a task
(:func:`hold_sigterm_during_task`)."""

_armed = False
_lock = threading.Lock()
_deadline_monotonic: float | None = None  # when the watchdog fires (time.monotonic()); None: not armed
# A pool parent's notice to its forked children (open_children_notice): this process holds
# the write end open until its shutdown begins (arm closes it); children read the read end.
_notice_read_fd: int | None = None
_notice_write_fd: int | None = None
_PARENT_SHUTTING_DOWN = threading.Event()  # in a pool child: its parent's shutdown began (or the parent died)
# In a pool child (hold_sigterm_during_task): the SIGTERM handler the pool installed, a task
# running, a SIGTERM that came during one
_pool_sigterm_handler: Callable[..., object] | int | None = None
_task_running = False
_sigterm_during_task = False
_held_grace_s = 0.0


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
    signal. Sets :data:`SHUTTING_DOWN`; :func:`time_left_s` counts down from ``grace_s``;
    forked children that watch this process (:func:`open_children_notice`) are told.
    ``signal_name`` (``"SIGTERM"``, ``"SIGINT"``, ...) is the signal the stderr line names.
    Returns True if this call armed it."""
    global _armed, _deadline_monotonic
    SHUTTING_DOWN.set()
    with _lock:
        if _armed:
            return False
        _armed = True
        _deadline_monotonic = time.monotonic() + grace_s
    _tell_children()
    # the process's own stderr (fd 2): Celery replaces sys.stderr with a logging proxy that has no fd
    err = sys.__stderr__
    try:
        print(as_line(f"makespan {process}: {signal_name}; ending within {grace_s:g} s (MAKESPAN_SHUTDOWN_GRACE_S), "
                      f"else exit code {EXIT_SHUTDOWN_TIMEOUT} with every thread's traceback below",
                      logger="makespan.shutdown"), file=err, flush=True)
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


SIGHUP_IGNORED = ("SIGHUP ignored: makespan {process} does not reload (its settings are read at start: restart "
                  "it to change them), and it writes its logs to stdout/stderr or appends to files (rotate them "
                  "with copytruncate, not a HUP)\n")


def sighup_handler(process: str) -> Callable[[int, Any], None]:
    """A SIGHUP handler that ignores the signal and says so on stderr (a raw write: safe in
    a signal handler). A log rotator's ``kill -HUP`` or a ``systemctl reload`` killed the
    planner and the observer (Python's default action) and warm-restarted a Celery GPU
    worker (Celery's own handler re-executes it, past makespan's shutdown)."""
    text = SIGHUP_IGNORED.format(process=process).encode()

    def _ignore(_signum: int, _frame: Any) -> None:
        try:
            os.write(2, text)
        except OSError:
            pass
    return _ignore


def ignore_sighup(process: str) -> None:
    """In the main thread: SIGHUP is ignored, with a line on stderr (:func:`sighup_handler`)."""
    signal.signal(signal.SIGHUP, sighup_handler(process))


def _begin_without_watchdog(grace_s: float) -> None:
    """Set :data:`SHUTTING_DOWN` and the deadline :func:`time_left_s` counts to
    (``grace_s`` from now, unless one is set), starting no watchdog."""
    global _deadline_monotonic
    with _lock:
        if _deadline_monotonic is None:
            _deadline_monotonic = time.monotonic() + grace_s
    SHUTTING_DOWN.set()


def open_children_notice() -> None:
    """In a process about to fork children that run its work (a Celery prefork GPU worker,
    at ``worker_init``, before the pool starts): open the pipe through which its forked
    children learn that its shutdown began (:func:`watch_parent_notice`). This process
    keeps the write end open, and :func:`arm` closes it: every child then reads EOF at
    once, also a child forked later. Calling it again does nothing."""
    global _notice_read_fd, _notice_write_fd
    with _lock:
        if _notice_write_fd is not None or _armed:
            return
        _notice_read_fd, _notice_write_fd = os.pipe()  # not inherited across exec: endpoint processes never hold it


def _tell_children() -> None:
    """Close the notice's write end (:func:`open_children_notice`), once: every forked
    child that watches it reads EOF."""
    global _notice_write_fd
    with _lock:
        write_fd, _notice_write_fd = _notice_write_fd, None
    if write_fd is not None:
        os.close(write_fd)


def watch_parent_notice(grace_s: float) -> bool:
    """In a child forked after :func:`open_children_notice` (a Celery prefork pool child,
    at ``worker_process_init``): close the inherited write end, and wait in a daemon
    thread for EOF on the read end, which comes within milliseconds of the parent's
    :func:`arm` (its shutdown began) or of the parent's death. Then set this process's
    :data:`SHUTTING_DOWN` (a running workload function gets ``ctx.cancelled`` with
    ``cancel_reason`` ``worker_shutdown``, a wait of ``service_s`` or an endpoint start
    stops, and the phase runner hands the lease back) and the deadline :func:`time_left_s`
    counts to, ``grace_s`` from then (the parent's, a few milliseconds late). No watchdog
    of its own: the parent's ends the parent, and the pool child with it (Celery gives
    every prefork child ``PR_SET_PDEATHSIG`` SIGKILL, which also ends it when the parent
    dies unnoticed: SIGKILL, out of memory; without it, a child whose parent died hands
    its lease back too). Returns False when there is nothing to watch: no notice was
    opened, or this child was not forked (billiard's ``spawn``: a fresh interpreter).
    Call it in the child right after the fork, before it starts threads."""
    global _lock, _notice_read_fd, _notice_write_fd
    _lock = threading.Lock()  # a copy of the parent's, held in this child for good if a parent thread held it at the fork
    read_fd, write_fd, _notice_read_fd, _notice_write_fd = _notice_read_fd, _notice_write_fd, None, None
    if read_fd is None:
        return False
    if write_fd is not None:
        os.close(write_fd)  # else this child's own write end would keep its read from ever seeing EOF

    def _watch() -> None:
        try:
            while True:
                try:
                    if not os.read(read_fd, 64):  # nobody writes: EOF is the one thing that comes
                        break
                except InterruptedError:
                    continue
                except OSError:
                    return
            _PARENT_SHUTTING_DOWN.set()
            _begin_without_watchdog(grace_s)
        finally:
            os.close(read_fd)

    threading.Thread(target=_watch, name="makespan-parent-shutdown-watch", daemon=True).start()
    return True


def hold_sigterm_during_task(grace_s: float) -> None:
    """In a pool child's main thread, as a task starts (Celery ``task_prerun``): a SIGTERM
    that reaches this child while the task runs (a supervisor that signals the whole
    process group, as systemd does by default) sets :data:`SHUTTING_DOWN`, as the parent's
    shutdown does (:func:`watch_parent_notice`), instead of running the pool's handler
    (billiard's ends the child at once: the phase is cut off mid-way, its lease left to
    its TTL, and the parent logs a lost worker). The task then ends early and hands its
    lease back; :func:`task_done` passes the SIGTERM on unless the parent shuts down
    (its warm shutdown then ends this child). A SIGTERM between tasks runs the pool's
    handler. A pool that ignores SIGTERM (Celery's ``REMAP_SIGTERM=SIGQUIT``) is left to
    ignore it: held, it would set this child's shutdown for good, and the child, which
    nothing then ends, would hand back every later job it gets. Must run in the main
    thread (``signal.signal``)."""
    global _pool_sigterm_handler, _task_running, _held_grace_s
    _held_grace_s = grace_s
    current = signal.getsignal(signal.SIGTERM)
    if current == signal.SIG_IGN:  # nothing to hold: a SIGTERM does not end this child
        return
    if current is not _on_sigterm_in_task:  # the pool sets its handler after worker_process_init: wrap it here
        _pool_sigterm_handler = current
        signal.signal(signal.SIGTERM, _on_sigterm_in_task)
    _task_running = True


def _on_sigterm_in_task(signum: int, frame: object) -> None:
    """A pool child's SIGTERM handler (:func:`hold_sigterm_during_task`)."""
    global _sigterm_during_task
    if not _task_running:
        _pass_on_sigterm(signum, frame)
        return
    _sigterm_during_task = True
    _begin_without_watchdog(_held_grace_s)


def _pass_on_sigterm(signum: int, frame: object) -> None:
    """Run the SIGTERM handler the pool installed (:func:`hold_sigterm_during_task`),
    and leave it installed."""
    handler = _pool_sigterm_handler
    if callable(handler):
        signal.signal(signal.SIGTERM, handler)
        handler(signum, frame)
    elif handler != signal.SIG_IGN:  # the default action: end this process by the signal
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def task_done() -> None:
    """In a pool child, as a task ends (Celery ``task_postrun``): a SIGTERM that came
    during it (:func:`hold_sigterm_during_task`) now runs the pool's handler, unless the
    parent's shutdown began (then its warm shutdown ends this child)."""
    global _task_running, _sigterm_during_task
    _task_running = False
    if _sigterm_during_task and not _PARENT_SHUTTING_DOWN.is_set():
        _sigterm_during_task = False
        _pass_on_sigterm(int(signal.SIGTERM), None)
