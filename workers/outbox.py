"""The planner's outbox: phase chains are published to the broker from one background
thread, in the order the planner leased them, so that a tick does not wait on the
broker for every job it starts.

Nothing about a job depends on when its message is sent: its lease is already
published (fenced) when it is queued here, and a message that never arrives (a lost
broker connection, a planner that dies with a full outbox) is recovered like any lost
message: the lease is never renewed, expires, and the reaper requeues the job.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from app import telemetry
from workers.phases import PhaseContext

log = logging.getLogger("makespan.planner")

Send = Callable[[PhaseContext, str, "bool | None"], None]


class Outbox:
    """A FIFO of (context, queue, warm) sent by one daemon thread with ``send``."""

    def __init__(self, send: Send):
        self._send = send
        self._q: queue.Queue = queue.Queue()
        self._t: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, ctx: PhaseContext, queue_name: str, warm: bool | None = None) -> None:
        """Queue one phase chain for sending (returns at once)."""
        with self._lock:
            if self._t is None or not self._t.is_alive():
                self._t = threading.Thread(target=self._run, name="planner-outbox", daemon=True)
                self._t.start()
        self._q.put((ctx, queue_name, warm))

    def _run(self) -> None:
        while True:
            ctx, queue_name, warm = self._q.get()
            try:
                with telemetry.use_traceparent(ctx.traceparent):
                    self._send(ctx, queue_name, warm)
            except Exception as e:  # noqa: BLE001 - recovered through lease expiry, see the module doc
                log.error("dispatch of lease %s (job %s) failed: %r; it will expire and be reclaimed",
                          ctx.lease_id, ctx.job_id or ctx.kind, e)
            finally:
                self._q.task_done()

    def flush(self) -> None:
        """Wait until every queued chain was sent (or failed)."""
        if self._t is not None:
            self._q.join()
