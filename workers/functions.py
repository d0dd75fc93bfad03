"""Running a workload function in the execute phase (:mod:`makespan.registry` defines them).

:func:`run_function` calls ``fn(ctx, *args, **kwargs)`` in a thread of its own while the
phase's thread watches four things every 50 ms: the lease (the heartbeat keeps renewing
it; a lost lease stops the call), the GPU worker's shutdown (SIGTERM:
:data:`makespan.shutdown.SHUTTING_DOWN`), a cancel requested on the job record, and the
workload's ``timeout_s``. Any of them sets ``ctx.cancel_reason`` (:data:`CANCEL_REASONS`)
and then ``ctx.cancelled``; a function that has not
returned ``Settings.cancel_grace_s`` later is stopped by :class:`WorkloadStopped`
raised in its thread (``PyThreadState_SetAsyncExc``: it lands at the next Python
bytecode, so a call blocked inside C code is stopped once it returns to Python).

Outcomes: the encoded result (:func:`makespan.results.encode_value`), or
:class:`WorkloadFailed` (an exception, a timeout, a result that is too large or not
JSON), :class:`makespan.errors.PhaseCancelled` or :class:`makespan.errors.StaleFencingToken`
(the lease was lost, or the worker shuts down: the run is given up as if its lease were
lost, whatever the function returned, and the phase runner hands the lease back at once,
which requeues the job as a reclaim would: ``PhaseRunner.hand_back``).
The phase runner commits the result, a retry or the failure (workers/phase_execute.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import json
import math
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from makespan import metrics
from makespan.errors import NoEndpointServer, PhaseCancelled, PhaseError, StaleFencingToken, StoreError, utf8_text
from makespan.keys import Keys
from makespan.registry import REGISTRY, WorkloadDef
from makespan.results import ResultNotJson, ResultTooLarge, encode_value, resolve_references
from makespan.workload_spec import ROUTES

log = logging.getLogger("makespan.functions")
WATCH_S = 0.05  # how often the phase thread checks lease, cancel and timeout
PROGRESS_EVERY_S = 0.2  # most one progress write per this many seconds (the last one always)
READ_FAILED_EVERY_S = 30.0  # a failing read of a job's cancel request is logged once per this per job
_READ_FAILED_SAID: dict[str, float] = {}  # job id -> monotonic time its failing read was last logged
CANCEL_REASONS = {"cancel": "cancel_requested", "timeout": "timeout", "lease": "lease_lost",
                  "preempted": "preempted", "shutdown": "worker_shutdown"}
"""``ctx.cancel_reason`` by what the watcher saw: the job's cancel was requested, the
workload's ``timeout_s`` passed, the lease was lost (``preempted``: taken by a preemption,
which requeued the job; ``lease_lost``: it expired or was reclaimed), the GPU worker shuts
down (SIGTERM)."""


class WorkloadStopped(BaseException):
    """Raised inside a workload function's thread that ignored ``ctx.cancelled`` for
    longer than the grace period. A BaseException, so ``except Exception`` in user
    code does not swallow it."""


class WorkloadFailed(PhaseError):
    """A workload function's run failed: ``retryable`` says whether its retries apply
    (an exception or a timeout: yes; a result over the size limit or not JSON: no)."""

    def __init__(self, error_type: str, message: str, traceback_text: str = "", retryable: bool = True):
        self.error_type, self.message, self.traceback_text, self.retryable = error_type, message, traceback_text, retryable
        super().__init__(f"{error_type}: {message}" if message else f"{error_type} (no message)")


class CancelEvent(threading.Event):
    """``ctx.cancelled``: a :class:`threading.Event` whose truth is whether it is set, so
    ``while not ctx.cancelled:`` and ``if ctx.cancelled: return`` mean what they read as (a
    plain Event is always true: such a loop ended at once, found by a new-user check);
    ``is_set()``, ``wait(timeout)`` work as on any Event.

    While a run's lease is watched (:meth:`watch_lease`), it also reads as set the moment
    that lease's local deadline has passed (:class:`makespan.workers.heartbeat.LeaseLost`),
    with ``cancel_reason`` ``lease_lost``: a function resumed after its worker was paused
    past the lease TTL sees it at its first check, before the watcher thread runs again."""

    _lease: Any = None  # the run's LeaseLost while watched
    _on_expired: Callable[[], None] | None = None

    def watch_lease(self, lease_lost: Any, on_expired: Callable[[], None]) -> None:
        """Read as set once ``lease_lost`` (a ``LeaseLost``) is past its deadline, calling
        ``on_expired`` (which writes the reason) first."""
        self._lease, self._on_expired = lease_lost, on_expired

    def is_set(self) -> bool:
        if super().is_set():
            return True
        lease = self._lease
        if lease is not None and lease.past_deadline():
            lease.set()  # latched: a renewal answered later must not make the run's result count again
            if self._on_expired is not None:
                self._on_expired()
            self.set()
            return True
        return False

    def wait(self, timeout: float | None = None) -> bool:
        super().wait(timeout)
        return self.is_set()

    def __bool__(self) -> bool:
        return self.is_set()


@dataclass
class WorkloadContext:
    """What a workload function gets as its first argument.

    Attributes:
        job_id / priority / attempt: the job, its level (``"HIGH"``) and this attempt (1-based).
        workload: the function's registered name.
        gpus: the leased GPU UUIDs, in lease order.
        cuda_visible_devices: ``",".join(gpus)``: set it as ``CUDA_VISIBLE_DEVICES`` in
            a child process (CUDA accepts GPU UUIDs there).
        host: the GPU host's name in the fleet.
        endpoint: the endpoint the job runs on.
        endpoint_url: base URL of the endpoint instance leased for the job (None for a
            simulated endpoint, which has no server).
        endpoint_urls: base URL of every endpoint instance on the leased GPUs (the main
            endpoint and its helpers), by endpoint name.
        time_scale: wall seconds per workload second of this worker (1 in production;
            below 1 in demos and tests that compress time).
        cancelled: set when the job is cancelled, times out or loses its lease, or the GPU
            worker shuts down: return soon (a :class:`CancelEvent`: ``if ctx.cancelled:``
            reads whether it is set); also set once the function has returned or raised,
            so work it left running in threads of its own (a ``ctx.requests`` fan-out) stops.
        cancel_reason: why ``cancelled`` was set while the function ran, written before it
            is set: ``"cancel_requested"``, ``"timeout"``, ``"preempted"`` (a higher-priority
            job took the GPUs), ``"lease_lost"`` (the lease expired or was reclaimed) or
            ``"worker_shutdown"`` (on the last three the job is requeued and runs again: save
            what lets the next attempt resume); None while not cancelled (and after a normal return).
    """

    job_id: str
    priority: str
    attempt: int
    workload: str
    gpus: list[str]
    host: str
    endpoint: str
    endpoint_url: str | None
    endpoint_urls: dict[str, str]
    time_scale: float = 1.0
    cancelled: threading.Event = field(default_factory=CancelEvent)
    cancel_reason: str | None = None
    _progress: Callable[[float, float, str | None], None] | None = field(default=None, repr=False)
    _requests: Callable[..., list[Any]] | None = field(default=None, repr=False)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.gpus)

    def progress(self, done: float, total: float, note: str | None = None) -> None:
        """Report progress (``done`` of ``total`` units): shown by ``makespan status``,
        :meth:`makespan.client.Job.status` (``progress_done``/``progress_total``/
        ``progress_note``) and the metric ``makespan_workload_progress``. Writes are
        throttled to one per 0.2 s (the last one of a run is always written, when the
        function returns or raises).

        Raises:
            ValueError: ``done`` or ``total`` is not a finite number >= 0."""
        if isinstance(done, (bool, str)) or isinstance(total, (bool, str)):
            raise ValueError(f"ctx.progress: done and total must be numbers (got {done!r}, {total!r})")
        try:
            done_f, total_f = float(done), float(total)
        except (TypeError, ValueError):
            raise ValueError(f"ctx.progress: done and total must be numbers (got {done!r}, {total!r})") from None
        if not (math.isfinite(done_f) and math.isfinite(total_f) and done_f >= 0 and total_f >= 0):
            raise ValueError(f"ctx.progress: done and total must be finite numbers >= 0 (got {done!r}, {total!r})")
        if self._progress is not None:
            self._progress(done_f, total_f, note)

    def requests(self, prompts: Sequence[str | dict[str, Any]], *, route: str = "/v1/completions",
                 max_tokens: int = 16, timeout_s: float = 60.0, raw: bool = False,
                 endpoint: str | None = None) -> list[Any]:
        """Send one OpenAI-compatible request per prompt to the leased endpoint instance
        (or ``endpoint``'s instance among :attr:`endpoint_urls`) under the endpoint's
        concurrency cap, shared with every other sender through request leases
        (:mod:`makespan.workers.requests`).

        Args:
            prompts: strings (a ``prompt``, chat ``content`` or embedding ``input``), or
                whole request bodies (dicts; ``model`` is filled in).
            route: ``/v1/completions``, ``/v1/chat/completions`` or ``/v1/embeddings``.
            raw: return each response's JSON instead of its text (the completion's text,
                the chat message's content, or the embedding vector).
        Returns:
            One answer per prompt, in order.
        Raises:
            TypeError: ``prompts`` is a single string or body, not a sequence of them.
            ValueError: ``route`` is not one of the three routes above (checked before
                anything is sent, as a workload file's ``route`` is at submit).
            makespan.errors.PhaseError: no instance to send to, or a request failed.
        """
        if isinstance(prompts, (str, bytes, dict)):
            raise TypeError(f"ctx.requests: prompts must be a list of prompts or request bodies, got one "
                            f"{type(prompts).__name__} (wrap it: [prompt])")
        if route not in ROUTES:
            raise ValueError(f"ctx.requests: unknown route {route!r}; use one of {', '.join(ROUTES)}")
        if self._requests is None:
            raise NoEndpointServer(f"ctx.requests: endpoint {self.endpoint!r} of this job has no server instance (a "
                                   "simulated endpoint: give it a launch driver that runs a server, e.g. "
                                   "launch = {driver = \"process\"}, docs/drivers.md); not retried")
        return self._requests(list(prompts), route=route, max_tokens=max_tokens, timeout_s=timeout_s, raw=raw,
                              endpoint=endpoint)


UNKNOWN_WORKLOAD = "makespan.UnknownWorkload"  # WorkloadFailed.error_type of lookup's failure


def lookup(name: str, host: str) -> WorkloadDef:
    """The registered function ``name``.

    Raises:
        WorkloadFailed: not registered in this GPU worker (not retryable)."""
    definition = REGISTRY.get(name)
    if definition is None:
        raise WorkloadFailed(UNKNOWN_WORKLOAD,
                             f"workload {name!r} is not registered on the GPU worker of host {host!r}; start it with "
                             f"--workloads naming the module that defines it (registered here: "
                             f"{', '.join(sorted(REGISTRY)) or 'none'})", retryable=False)
    return definition


_SIGNATURES: dict[Any, inspect.Signature | None] = {}
""":func:`_signature_of`'s cache: a function's signature (None: it cannot be read), by the
function object."""
_SIGNATURES_MAX = 1024  # cleared when it holds more functions (tests register many)


def _read_signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``inspect.signature(fn)``, or None when it cannot be read; cached per function
    object (read once, not on every job: it was ~2% of the GPU worker's CPU per job), and
    read each time for a callable that cannot be a dict key (unhashable)."""
    try:
        return _SIGNATURES[fn]
    except KeyError:
        pass
    except Exception:  # noqa: BLE001 - an unhashable callable (or one whose hash fails): no cache
        return _read_signature(fn)
    signature = _read_signature(fn)
    if len(_SIGNATURES) >= _SIGNATURES_MAX:
        _SIGNATURES.clear()
    _SIGNATURES[fn] = signature
    return signature


def _check_binds(definition: WorkloadDef, ctx: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Raise a not retryable :class:`WorkloadFailed` (``TypeError``) when ``(ctx, *args,
    **kwargs)`` do not bind to the function's signature (one that cannot be read is not checked)."""
    signature = _signature_of(definition.fn)
    if signature is None:
        return
    try:
        signature.bind(ctx, *args, **kwargs)
    except TypeError as e:
        raise WorkloadFailed("TypeError", f"the arguments do not match {definition.name}{signature}: {e} (not retried: "
                                          "every attempt would fail the same way)", retryable=False) from None


def _raise_in_thread(thread: threading.Thread) -> bool:
    ident = thread.ident
    if ident is None:
        return False
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(WorkloadStopped)) == 1


def _cancel_outcome(outcome: dict[str, Any], stop_tried: bool, still_running: bool, grace_s: float) -> str:
    """How a cancelled function's run ended, for the job's reason: it returned or raised
    after ``ctx.cancelled`` was set, or did not stop within ``grace_s`` and was stopped
    (``still_running``: its thread is blocked outside Python code and is left to finish)."""
    not_stopped = f"did not stop within the {grace_s:g} s grace period after ctx.cancelled was set"
    if outcome.get("stopped"):
        return f"{not_stopped} and was stopped"
    if still_running:
        return (f"{not_stopped} and was told to stop, but its thread still runs: it is blocked outside Python code "
                "(a sleep, a read, a C call) or caught the stop (WorkloadStopped, in an except BaseException or a bare "
                "except); it is left to run in the GPU worker's process and its result is discarded")
    late = f" ({not_stopped})" if stop_tried else ""
    if "error" in outcome:
        return f"raised {outcome['error'][0]} after ctx.cancelled was set{late}"
    return f"returned after ctx.cancelled was set{late}"


def _message(error: BaseException) -> str:
    """``str(error)`` as UTF-8 text; an exception whose ``__str__`` itself raises is still
    reported (it was taken for a function stopped before it returned)."""
    try:
        return utf8_text(error)
    except Exception as inner:  # noqa: BLE001 - user code's __str__
        return f"<str() of the exception raised {type(inner).__name__}: {utf8_text(repr(inner))}>"


async def _until_cancelled(coroutine: Any, cancelled: threading.Event) -> Any:
    """Run an ``async def`` function's coroutine as a task and cancel it (``CancelledError``
    at its ``await``) once ``cancelled`` is set (a cancel, ``timeout_s``, a lost lease, the
    worker's shutdown): an exception raised into its thread cannot interrupt the event loop's
    wait, so without this an awaiting function ran on for the whole cancel grace period."""
    task = asyncio.ensure_future(coroutine)
    while not task.done() and not cancelled.is_set():
        await asyncio.wait({task}, timeout=WATCH_S)
    if not task.done():
        # once: a function that catches CancelledError to save its state gets the rest of the
        # cancel grace period for it, as a plain function does after ctx.cancelled
        task.cancel()
    return await task


def _call(definition: WorkloadDef, ctx: WorkloadContext, args: list[Any], kwargs: dict[str, Any],
          outcome: dict[str, Any]) -> None:
    """Run the function in this thread into ``outcome``: ``value``, ``stopped``, or
    ``error`` (type, message, traceback) with ``retryable``."""
    try:
        value = definition.fn(ctx, *args, **kwargs)
        if inspect.iscoroutine(value):  # an async def function: run on an event loop of its own
            value = asyncio.run(_until_cancelled(value, ctx.cancelled))
        outcome["value"] = value
    except WorkloadStopped:
        outcome["stopped"] = True
    except BaseException as e:  # noqa: BLE001 - user code: every failure is reported
        # as UTF-8 text: a message with a lone surrogate (an undecodable file name) must
        # still be logged, stored and raised by job.result() (errors.utf8_text)
        outcome["error"] = (f"{type(e).__module__}.{type(e).__qualname__}".removeprefix("builtins."),
                            _message(e), utf8_text(traceback.format_exc()))
        outcome["retryable"] = not isinstance(e, NoEndpointServer)


def _lost_kind(reason: str | None, cut: str | None = None, lease_id: str | None = None) -> str:
    """``"preempted"`` when a preemption ended the run's lease: the job record's
    ``preempted_lease`` (``cut``) names it (``preempt.lua`` writes it; it outlives a new
    lease of the job, which rewrites the reason: a verifier), or its ``reason`` says
    "preempted by …"; else ``"lease"`` (expired, reclaimed)."""
    if cut is not None and lease_id is not None and cut == lease_id:
        return "preempted"
    return "preempted" if (reason or "").startswith("preempted") else "lease"


def _lost_why(r: redis.Redis, keys: Keys, job_id: str, lease_id: str | None = None) -> str:
    """:func:`_lost_kind` of the job's record as read now (``"lease"`` when Redis does not answer)."""
    try:
        reason, cut = r.hmget(keys.job(job_id), "reason", "preempted_lease")
    except redis.RedisError:
        return "lease"
    return _lost_kind(reason, cut, lease_id)


def _watch_lease_deadline(ctx: WorkloadContext, lease_lost: threading.Event) -> None:
    """Let ``ctx.cancelled`` read as set once ``lease_lost``'s local deadline passes
    (a ``LeaseLost``; another event: nothing to watch), reason ``lease_lost``."""
    if not (isinstance(ctx.cancelled, CancelEvent) and hasattr(lease_lost, "past_deadline")):
        return

    def lease_expired() -> None:  # written before ctx.cancelled reads set
        if ctx.cancel_reason is None:
            ctx.cancel_reason = CANCEL_REASONS["lease"]

    ctx.cancelled.watch_lease(lease_lost, lease_expired)


def _read_stop(r: redis.Redis, keys: Keys, job_id: str, lease_id: str | None, lease_lost: threading.Event) -> str:
    """One read of the job's record by the watcher: ``"cancel"`` (a cancel was requested),
    ``"preempted"`` or ``"lease"`` (the record no longer names ``lease_id``: preempted or
    reclaimed meanwhile; ``lease_lost`` is set), else "" (also on a Redis blip: the function
    runs on, the heartbeat watches the lease)."""
    try:  # the reason in the same read: a planner that leases the job again meanwhile rewrites it
        cancel, holder, reason, cut = r.hmget(keys.job(job_id), "cancel_requested", "lease", "reason",
                                              "preempted_lease")
    except redis.RedisError as e:  # said once per READ_FAILED_EVERY_S per job: it is read 10 times a second
        now = time.monotonic()
        if now - _READ_FAILED_SAID.get(job_id, float("-inf")) >= READ_FAILED_EVERY_S:
            if len(_READ_FAILED_SAID) > 4096:
                _READ_FAILED_SAID.clear()
            _READ_FAILED_SAID[job_id] = now
            log.warning("job %s: reading its cancel request failed (%r); trying again (said again after %g s "
                        "if it goes on)", job_id, e, READ_FAILED_EVERY_S)
        return ""
    if cancel == "1":
        return "cancel"
    if lease_id is not None and holder != lease_id:
        lease_lost.set()
        return _lost_kind(reason, cut, lease_id)
    return ""


def run_function(definition: WorkloadDef, ctx: WorkloadContext, args: list[Any], kwargs: dict[str, Any], *,
                 r: redis.Redis, keys: Keys, lease_lost: threading.Event, grace_s: float,
                 result_max_bytes: int, shutting_down: threading.Event | None = None,
                 lease_id: str | None = None) -> tuple[str, float]:
    """Call the function (see the module doc) and return (result JSON, wall seconds).
    ``shutting_down``: set when the GPU worker's shutdown begins
    (:data:`makespan.shutdown.SHUTTING_DOWN`); None: not watched. ``lease_id``: the lease
    the run holds; the watcher's read of the job's cancel request also reads which lease the
    job holds, so a preemption or a reclaim (which take the lease off the job's record) sets
    ``lease_lost`` within that read's interval (2 × ``WATCH_S``), not at the heartbeat's next
    renewal (up to ``heartbeat_s`` later; a preemptor's transitions wait for the run to end).

    Raises:
        StaleFencingToken: the lease was lost, or ``shutting_down`` was set while the
            function ran (the job will be handed back or reclaimed, and requeued: not a failure).
        PhaseCancelled: a cancel was requested while it ran.
        WorkloadFailed: it raised, timed out, or returned a value that cannot be stored; the
            arguments do not bind to its parameters (``TypeError``, not retryable: every
            retry would fail the same way; the submit checks this when the worker that
            registered the function published its parameters, so it is met when the
            function's parameters changed while the job waited, or an older worker registered it).
    """
    args, kwargs = resolve_references(r, keys, args, kwargs)
    _check_binds(definition, ctx, args, kwargs)
    outcome: dict[str, Any] = {}

    started = time.monotonic()
    _watch_lease_deadline(ctx, lease_lost)
    thread = threading.Thread(target=_call, args=(definition, ctx, args, kwargs, outcome),
                              name=f"workload-{ctx.job_id[:8]}", daemon=True)
    thread.start()
    why = ""
    stop_at = None
    stop_tried = False
    cancel_checked = 0.0
    flush_due = getattr(ctx._progress, "flush_due", None)
    while thread.is_alive():
        thread.join(WATCH_S)
        if not thread.is_alive():
            break
        if flush_due is not None:
            flush_due()
        now = time.monotonic()
        if not why:
            if lease_lost.is_set():
                why = _lost_why(r, keys, ctx.job_id, lease_id)
            elif shutting_down is not None and shutting_down.is_set():
                why = "shutdown"
            elif definition.timeout_s is not None and now - started > definition.timeout_s:
                why = "timeout"
            elif now - cancel_checked > 2 * WATCH_S:
                cancel_checked = now
                why = _read_stop(r, keys, ctx.job_id, lease_id, lease_lost)
            if why:
                if not ctx.cancelled.is_set():  # else the reason is written (a passed lease deadline)
                    ctx.cancel_reason = CANCEL_REASONS[why]
                ctx.cancelled.set()
                stop_at = now + grace_s
        elif stop_at is not None and now >= stop_at:
            log.warning("job %s: workload %s ignored ctx.cancelled for %.1f s: stopping it", ctx.job_id,
                        definition.name, grace_s)
            _raise_in_thread(thread)
            stop_tried = True
            thread.join(1.0)
            stop_at = None  # one try: a thread stuck in C code is left to finish as a daemon
            if thread.is_alive():
                log.warning("job %s: workload %s still runs after it was told to stop: it is blocked outside Python "
                            "code (a sleep, a read, a C call) or caught makespan's WorkloadStopped (an except "
                            "BaseException or a bare except); its thread is left to run in this process, using its "
                            "CPU and whatever it holds, until it returns (restart the GPU worker to end it)",
                            ctx.job_id, definition.name)
                break
    wall_s = time.monotonic() - started
    flush = getattr(ctx._progress, "flush", None)
    if flush is not None and not thread.is_alive():
        flush()  # the last report the throttle held back (written only while the lease is current)
    ctx.cancelled.set()  # the run is over: a ctx.requests fan-out the function left running in its own threads stops
    if why in ("lease", "preempted") or lease_lost.is_set():
        if why != "preempted":  # a preemption is the planner's choice; a lost lease is worth an operator's look
            log.warning("job %s: its lease was lost while workload %s ran (expired or reclaimed: this worker was "
                        "paused, overloaded or cut off from Redis for the lease TTL); its result is discarded and the "
                        "job runs again", ctx.job_id, definition.name)
        raise StaleFencingToken("lease lost while the workload function ran")
    if why == "shutdown":
        log.info("job %s: the GPU worker is shutting down: workload %s %s; its result is discarded and its "
                    "lease handed back, which requeues the job", ctx.job_id, definition.name,
                    _cancel_outcome(outcome, stop_tried, thread.is_alive(), grace_s))
        raise StaleFencingToken("the GPU worker is shutting down: the workload function was given up")
    if why == "cancel":
        raise PhaseCancelled(f"cancelled while running (workload {definition.name} "
                             f"{_cancel_outcome(outcome, stop_tried, thread.is_alive(), grace_s)})")
    if why == "timeout":  # how it ended, as a cancel says it (breaker: a thread still asleep was not said)
        raise WorkloadFailed("makespan.WorkloadTimeout", f"ran longer than timeout_s={definition.timeout_s} s; it "
                             f"{_cancel_outcome(outcome, stop_tried, thread.is_alive(), grace_s)}")
    if "error" in outcome:
        error_type, message, tb = outcome["error"]
        raise WorkloadFailed(error_type, message, tb, retryable=outcome.get("retryable", True))
    if outcome.get("stopped") or "value" not in outcome:
        raise WorkloadFailed("makespan.WorkloadStopped", "the function was stopped before it returned")
    try:
        return encode_value(outcome["value"], ctx.attempt, wall_s, result_max_bytes), wall_s
    except (ResultTooLarge, ResultNotJson) as e:
        raise WorkloadFailed(f"makespan.{type(e).__name__}", str(e), retryable=False) from None


def celery_progress_emitter() -> Callable[[dict[str, Any]], None] | None:
    """A sender of ``task-progress`` events for the Celery task running in this thread
    (Flower shows the task in state ``PROGRESS`` with the progress as its ``result``
    until it ends), callable from any thread; None outside a Celery task. The task's
    request is read here, in the task's own thread (``Task.request`` is thread-local)."""
    from celery import current_task

    task = current_task._get_current_object() if current_task else None
    request = getattr(task, "request", None)
    if task is None or request is None or not request.id or not request.hostname:
        return None
    app, task_id, hostname = task.app, request.id, request.hostname

    def emit(progress: dict[str, Any]) -> None:
        try:
            with app.events.default_dispatcher(hostname=hostname) as dispatcher:
                dispatcher.send("task-progress", uuid=task_id, result=json.dumps(progress), retry=False)
        except Exception as e:  # noqa: BLE001 - monitoring is best effort
            log.debug("task-progress event not sent: %s", e)
    return emit


class ProgressWriter:
    """The ``ctx.progress`` of one run (:func:`progress_writer`): call it with (done, total,
    note); :meth:`flush` writes the last report the throttle held back (the run's runner
    calls it when the function returns or raises)."""

    def __init__(self, write: Callable[[float, float, str | None, bool], None],
                 pending: dict[str, Any]) -> None:
        self._write, self._pending = write, pending
        # the function's thread reports, the run's watcher flushes: one at a time, so an older
        # report never lands after a newer one and a held-back one is never dropped
        self._lock = threading.Lock()

    def __call__(self, done: float, total: float, note: str | None) -> None:
        with self._lock:
            self._write(done, total, note, False)

    def flush(self) -> None:
        with self._lock:
            report = self._pending.pop("report", None)
            if report is not None:
                self._write(*report, True)

    def flush_due(self) -> None:
        """Write the held-back report once the throttle's window has passed (the run's
        watcher calls it every WATCH_S): a report followed by a long step is shown within
        the window, not only at the next report or the end."""
        with self._lock:
            report = self._pending.get("report")
            if report is not None and time.monotonic() - self._pending.get("since", 0.0) >= PROGRESS_EVERY_S:
                self._pending.pop("report", None)
                self._write(*report, True)


def progress_writer(fenced: Callable[[list[tuple]], bool], keys: Keys, job_id: str, workload: str,
                    emit: Callable[[dict[str, Any]], None] | None = None) -> ProgressWriter:
    """The ``ctx.progress`` of one run: a throttled HSET of ``progress_*`` on the job
    record, the progress counter, and (``emit``) a Celery ``task-progress`` event for Flower;
    a report the throttle holds back is written by the next one, or by :meth:`ProgressWriter.flush`.

    ``fenced(ops) -> bool`` applies the write only while the run's lease is current
    (:meth:`makespan.workers.leases.LeaseStore.fenced` with the run's lease): a run whose
    lease was preempted or reclaimed (it may go on for the cancel grace period, or for good
    when stuck) never overwrites the progress of the attempt that runs now; its first
    refused write ends its progress reports."""
    last = {"t": 0.0, "done": 0.0, "stale": False}
    pending: dict[str, Any] = {}

    def write(done: float, total: float, note: str | None, flushing: bool) -> None:
        now = time.monotonic()
        final = flushing or (total > 0 and done >= total)
        if last["stale"]:
            return
        if not final and now - last["t"] < PROGRESS_EVERY_S:
            pending["report"] = (done, total, note)  # written by the next report past the throttle, or flush()
            pending["since"] = last["t"]  # flush_due writes it a window after the last write
            return
        pending.pop("report", None)
        last["t"] = now
        fields: dict[str, Any] = {"progress_done": repr(done), "progress_total": repr(total), "progress_at": repr(time.time())}
        # a report without a note clears the last one (it described an earlier step)
        fields["progress_note"] = utf8_text(note)[:200] if note is not None else ""  # a lone surrogate fails the HSET
        try:
            if not fenced([("HSET", keys.job(job_id), *[part for pair in fields.items() for part in pair])]):
                last["stale"] = True  # the lease is gone: this run's progress is no longer the job's
                return
        except (redis.RedisError, StoreError) as e:  # progress is best effort: never fail the run for it
            log.warning("job %s: progress not written: %s", job_id, e)
        metrics.workload_progress(workload, done - last["done"], total)
        last["done"] = done
        if emit is not None:
            emit({"job_id": job_id, "done": done, "total": total, "note": fields.get("progress_note")})

    return ProgressWriter(write, pending)
