"""One log format for every makespan process (planner, GPU worker, observer).

``MAKESPAN_LOG_FORMAT``:

* ``text`` (the default): ``2026-12-07T19:18:23.330Z INFO makespan.planner [pid 28213]: …``:
  the time in UTC (ISO 8601, milliseconds, ``Z``), the level, the logger (which part of
  makespan wrote it) and the process id, so two planners writing to one journal are told
  apart;
* ``json``: one JSON object per line, ``{"time", "level", "logger", "pid", "message"}`` (the
  same time text; an exception's traceback under ``exc_info``), for a log shipper (Loki,
  Elasticsearch, Cloud Logging), by python-json-logger.

The GPU worker's Celery lines (Celery's own loggers, and makespan's in its pool processes)
get the same format through Celery's ``after_setup_logger`` / ``after_setup_task_logger``
signals (:func:`use_for_celery`); with ``json`` its start banner is left out (``--quiet``).
What a process prints outside logging (its start-up summary, a signal's notice) follows the
format too (:func:`as_line`); Celery's own ``worker: Warm shutdown`` notice is printed as text.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from makespan.errors import ValidationError

LOG_FORMATS = ("text", "json")  # MAKESPAN_LOG_FORMAT's values
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [pid %(process)d]: %(message)s"


def log_format_from_env() -> str:
    """``MAKESPAN_LOG_FORMAT`` in lower case, one of :data:`LOG_FORMATS` (unset or empty:
    ``text``).

    Raises:
        ValidationError: another value."""
    raw = os.environ.get("MAKESPAN_LOG_FORMAT", "").strip()
    kind = raw.lower() or "text"
    if kind not in LOG_FORMATS:
        raise ValidationError("MAKESPAN_LOG_FORMAT", raw, f"must be one of {', '.join(LOG_FORMATS)}")
    return kind


def _utc_stamp(unix_s: float) -> str:
    """``unix_s`` as both formats write a time: UTC, ISO 8601 with milliseconds and ``Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix_s)) + f".{int(unix_s * 1000) % 1000:03d}Z"


class _UtcTime:
    """The ``asctime`` of both formats (:func:`_utc_stamp`)."""

    converter = time.gmtime

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        return _utc_stamp(record.created)


class TextFormatter(_UtcTime, logging.Formatter):
    """:data:`TEXT_FORMAT` with UTC times."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)


def formatter(kind: str) -> logging.Formatter:
    """The formatter of ``kind`` (``text`` or ``json``, :data:`LOG_FORMATS`)."""
    if kind == "json":
        from pythonjsonlogger.json import JsonFormatter

        class _Json(_UtcTime, JsonFormatter):
            pass

        return _Json("%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
                     rename_fields={"asctime": "time", "levelname": "level", "name": "logger", "process": "pid"})
    return TextFormatter()


def as_line(message: str, level: str = "INFO", logger: str = "makespan") -> str:
    """``message`` as one line of ``MAKESPAN_LOG_FORMAT``, for what a process prints to stderr
    outside logging (a signal handler's notice, where logging's locks may deadlock; a start-up
    summary before logging is set up): ``message`` itself in ``text``, a JSON object with the
    fields of the ``json`` format in ``json`` (an invalid ``MAKESPAN_LOG_FORMAT`` reads as
    ``text``: it is refused where the process starts)."""
    try:
        kind = log_format_from_env()
    except ValidationError:
        kind = "text"
    if kind != "json":
        return message
    import json

    return json.dumps({"time": _utc_stamp(time.time()), "level": level, "logger": logger, "pid": os.getpid(), "message": message})


def configure(level: str, kind: str | None = None) -> None:
    """Root logging at ``level`` to stderr in format ``kind`` (None: :func:`log_format_from_env`),
    replacing handlers an earlier call installed; httpx at WARNING (not a line per health
    probe or request).

    Raises:
        ValidationError: ``MAKESPAN_LOG_FORMAT`` is not one of :data:`LOG_FORMATS`."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(kind or log_format_from_env()))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.captureWarnings(True)  # a library's warnings (Celery's SecurityWarning) in the same format
    logging.getLogger("httpx").setLevel(logging.WARNING)


def use_for_celery() -> None:
    """Give the handlers Celery sets up in a GPU worker (its own loggers and the task
    loggers, in every pool process) the format of ``MAKESPAN_LOG_FORMAT``; an invalid value
    was refused before the worker started (:func:`log_format_from_env`)."""
    from celery.signals import after_setup_logger, after_setup_task_logger

    def reformat(logger: logging.Logger | None = None, **_kwargs: Any) -> None:
        try:
            chosen = formatter(log_format_from_env())
        except ValidationError:
            return
        for handler in (logger.handlers if logger is not None else []):
            handler.setFormatter(chosen)

    after_setup_logger.connect(reformat, weak=False)
    after_setup_task_logger.connect(reformat, weak=False)


__all__ = ["LOG_FORMATS", "TEXT_FORMAT", "TextFormatter", "as_line", "configure", "formatter", "log_format_from_env",
           "use_for_celery"]
