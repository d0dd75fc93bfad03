"""The worker consumer's event flusher (:mod:`makespan.celery_consumer`): buffered task
events go out from its own thread, several per publish, and none is left at stop."""

from __future__ import annotations

import threading

from makespan.celery_app import create_celery
from makespan.celery_consumer import Consumer, EventFlusher
from makespan.settings import Settings


def test_the_workers_use_the_consumer():
    app = create_celery(Settings.from_env())
    assert app.conf.worker_consumer == "makespan.celery_consumer:Consumer"
    from celery.utils.imports import symbol_by_name

    assert symbol_by_name(app.conf.worker_consumer) is Consumer


def test_wakes_during_a_flush_are_served_by_one_more_flush_off_the_callers_thread():
    first_flush_started = threading.Event()
    release_first_flush = threading.Event()
    flush_threads: list[threading.Thread] = []

    def flush() -> None:
        flush_threads.append(threading.current_thread())
        if len(flush_threads) == 1:
            first_flush_started.set()
            release_first_flush.wait(10)

    flusher = EventFlusher(flush, interval_s=0.0)
    flusher.wake()
    assert first_flush_started.wait(10)
    for _ in range(5):  # five events buffered while the first publish is on the wire
        flusher.wake()
    release_first_flush.set()
    flusher.stop()
    assert len(flush_threads) in (2, 3)  # one for the five wakes (and the stop's own, unless merged)
    assert threading.current_thread() not in flush_threads


def test_a_failing_flush_does_not_end_the_thread():
    calls: list[int] = []
    failed = threading.Event()

    def flush() -> None:
        calls.append(1)
        if len(calls) == 1:
            failed.set()
            raise ConnectionError("broker away")

    flusher = EventFlusher(flush, interval_s=0.0)
    flusher.wake()
    assert failed.wait(10)
    flusher.wake()
    flusher.stop()
    assert len(calls) >= 2  # the thread survived the error and flushed the later events
