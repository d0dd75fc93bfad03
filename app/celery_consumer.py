"""Celery's worker consumer, with its buffered task events published off the event loop.

With task events on (``-E``, which Flower needs), Celery's consumer buffers the ``task-*``
events of its pool and, for each buffered event, schedules a flush on its event loop
(``Consumer.on_send_event_buffered``): a ``PUBLISH`` round trip on the loop's thread,
during which the loop neither pops the next message nor dispatches it. On a GPU worker
whose pool threads hold the GIL between their own Redis calls, that round trip and the
wait for the GIL after it were the largest part of the time a leased job's message sat
before its task started (``bench/RESULTS.md``, "The consumer pops a burst").

:class:`Consumer` hands the flush to one daemon thread instead: it publishes what is
buffered, and events buffered while it publishes go out in its next publish. The events
are the same (Celery's dispatcher, its buffer and its ``task.multi`` messages, under its
own lock), delivered to Flower at most :data:`FLUSH_INTERVAL_S` later. Selected by the Celery
setting ``worker_consumer`` (:func:`makespan.celery_app.create_celery`).
"""

from __future__ import annotations

import logging
import threading
import time

from celery.worker.consumer import Consumer as CeleryConsumer

log = logging.getLogger("makespan.celery_consumer")


class Consumer(CeleryConsumer):
    """Celery's consumer whose buffered events are flushed by an :class:`EventFlusher`."""

    def on_send_event_buffered(self) -> None:
        flusher = getattr(self, "_event_flusher", None)
        if flusher is None:  # called from the pool's threads too: one flusher per consumer
            with _FLUSHER_LOCK:
                flusher = getattr(self, "_event_flusher", None)
                if flusher is None:
                    flusher = self._event_flusher = EventFlusher(self._flush_events)
        flusher.wake()

    def shutdown(self) -> None:
        flusher = getattr(self, "_event_flusher", None)
        if flusher is not None:
            flusher.stop()  # publishes what is still buffered, then ends
        super().shutdown()


_FLUSHER_LOCK = threading.Lock()


FLUSH_INTERVAL_S = 0.01


class EventFlusher:
    """A daemon thread that calls ``flush`` (Celery's ``Consumer._flush_events``) when it
    is woken, at most once per ``interval_s`` (the events buffered meanwhile go out in
    one ``task.multi`` message: one publish per job's three events cost the GPU worker
    about a fifth of its CPU at 400 jobs/s). A flush that raises is logged and the
    thread goes on (Celery's own flush keeps the events of a failed publish in its buffer
    when ``buffer_while_offline`` is set)."""

    def __init__(self, flush, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self._flush = flush
        self._interval_s = interval_s
        self._wanted = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="makespan-event-flusher", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wanted.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Flush once more and end the thread (waits at most ``timeout_s``)."""
        self._stopping = True
        self._wanted.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            try:
                self._flush()
            except Exception as e:  # noqa: BLE001 - events are advisory; the consumer goes on
                log.warning("publishing buffered task events failed: %r", e)
            if self._stopping:
                if not self._wanted.is_set():  # the stop's own wake is served by one more turn
                    return
                continue
            time.sleep(self._interval_s)  # let the next events gather
