"""OpenTelemetry tracing: one parent span per makespan, one child span per phase.

Trace shape (docs/metrics.md, "Spans")::

    makespan                         submit -> restore (ended by end_job_span)
    ├── allocate_gpus                planner: lease taken
    ├── apply_async/... run/...      CeleryInstrumentor spans (producer -> worker)
    ├── evict_if_needed              GPU worker phases (phase_span)
    ├── start_endpoints
    │   ├── process_spawn            (child_span inside the phase)
    │   └── health_check
    ├── execute_workload
    ├── clear_embeddings
    └── restore_baseline

The ``makespan`` span crosses processes: :func:`job_traceparent` picks its trace id and
span id at submit (nothing exported yet) and returns a W3C ``traceparent``
(https://www.w3.org/TR/trace-context/#traceparent-header) stored on the job record;
every phase span names it as parent; :func:`end_job_span` exports the ``makespan`` span
itself, with those ids, from submit time to the end of restore.

Exporters come from the standard variables
(https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/):

- ``OTEL_TRACES_EXPORTER``: comma list of ``otlp`` (HTTP/protobuf), ``console``,
  ``file`` (makespan's: JSON lines to ``MAKESPAN_TRACE_FILE``, for tests and demos)
  or ``none``. Unset: ``otlp`` when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, else nothing.
- ``OTEL_SDK_DISABLED=true`` switches tracing off.
- ``OTEL_SERVICE_NAME`` overrides the service name a process passes in.

With no exporter no SDK provider is installed: spans are the API's non-recording
spans and :func:`job_traceparent` returns ``""`` (tracing costs nothing).
"""

from __future__ import annotations

import atexit
import contextvars
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor,
                                            SpanExporter, SpanExportResult)
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from makespan.errors import ValidationError

log = logging.getLogger(__name__)

SPAN_MAKESPAN = "makespan"
SPAN_ALLOCATE = "allocate_gpus"
PHASE_SPAN_NAMES = {
    "evict": "evict_if_needed",
    "start_endpoint": "start_endpoints",
    "execute": "execute_workload",
    "clear": "clear_embeddings",
    "restore": "restore_baseline",
}
CHILD_SPAN_NAMES = ("process_spawn", "health_check", "endpoint_sleep", "endpoint_wake", "endpoint_stop")
SCOPE = "makespan"
TRACE_FILE_ENV = "MAKESPAN_TRACE_FILE"

_lock = threading.Lock()
_provider: TracerProvider | None = None
_provider_pid: int | None = None
_forced_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("makespan_forced_ids",
                                                                                    default=None)
_propagator = TraceContextTextMapPropagator()


class _ForcedIdGenerator(IdGenerator):
    """Random ids, except inside :func:`end_job_span`, which recreates the ids chosen at submit."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        forced = _forced_ids.get()
        return forced[1] if forced else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        forced = _forced_ids.get()
        return forced[0] if forced else self._random.generate_trace_id()


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to ``path``; safe across processes
    (one ``O_APPEND`` write per line). Fields: ``name, trace_id, span_id, parent_span_id``
    (hex; ``null`` for a root), ``start_ns, end_ns, kind, status, attributes, service, pid``."""

    def __init__(self, path: str):
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for s in spans:
            ctx = s.get_span_context()
            lines.append(json.dumps({
                "name": s.name,
                "trace_id": f"{ctx.trace_id:032x}",
                "span_id": f"{ctx.span_id:016x}",
                "parent_span_id": f"{s.parent.span_id:016x}" if s.parent else None,
                "start_ns": s.start_time, "end_ns": s.end_time,
                "kind": s.kind.name, "status": s.status.status_code.name,
                "attributes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in (s.attributes or {}).items()},
                "service": (s.resource.attributes.get("service.name") if s.resource else None),
                "pid": os.getpid(),
            }, separators=(",", ":")) + "\n")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                for line in lines:
                    os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:
            log.exception("could not write spans to %s", self.path)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def read_span_file(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The spans a :class:`JsonLinesSpanExporter` has written to ``path`` so far, oldest first.

    Safe to call while workers are still writing: a last line not yet ended by its newline
    (a write in progress) is left out, to be read by a later call. A missing file is ``[]``.

    Returns:
        One dict per span, with the fields the exporter documents.
    Raises:
        json.JSONDecodeError: a complete line that is not JSON (the file is not a span file).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    complete = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.decode().splitlines() if line.strip()]


def exporter_names(env: Mapping[str, str] | None = None) -> list[str]:
    """Exporters the environment asks for, e.g. ``["otlp"]``; ``[]`` means tracing off.

    Raises:
        ValidationError: an unknown exporter name in ``OTEL_TRACES_EXPORTER``, or ``file``
            without ``MAKESPAN_TRACE_FILE``.
    """
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        has_otlp = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        return ["otlp"] if has_otlp else []
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    if "none" in names:
        return []
    for n in names:
        if n not in ("otlp", "console", "file"):
            raise ValidationError("OTEL_TRACES_EXPORTER", raw, "use otlp, console, file or none")
    if "file" in names and not env.get(TRACE_FILE_ENV):
        raise ValidationError(TRACE_FILE_ENV, "", "OTEL_TRACES_EXPORTER=file needs a path in MAKESPAN_TRACE_FILE")
    return names


def build_provider(service_name: str, env: Mapping[str, str] | None = None) -> TracerProvider | None:
    """A configured SDK provider for the exporters of :func:`exporter_names`, or None.

    ``otlp`` uses the HTTP/protobuf exporter, which reads ``OTEL_EXPORTER_OTLP_*`` itself;
    ``file`` and ``console`` export synchronously (a prefork child may exit at any time).
    """
    env = os.environ if env is None else env
    names = exporter_names(env)
    if not names:
        return None
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name})
    # its exit-time shutdown is ours (:func:`shutdown_tracing`, bounded): the SDK's own waited on an OTLP
    # export in flight to a collector that accepts and never answers (10 s and more at exit)
    provider = TracerProvider(resource=resource, id_generator=_ForcedIdGenerator(), shutdown_on_exit=False)
    for n in names:
        if n == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            if env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") not in ("http/protobuf", ""):
                log.warning("only OTLP over http/protobuf is installed; ignoring OTEL_EXPORTER_OTLP_PROTOCOL=%s",
                            env.get("OTEL_EXPORTER_OTLP_PROTOCOL"))
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif n == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        elif n == "file":
            provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(env[TRACE_FILE_ENV])))
    return provider


def setup_tracing(service_name: str) -> bool:
    """Install the global tracer provider once per process; True if tracing is on.

    Idempotent; safe to call again in a forked child (the child keeps the inherited
    provider, whose batch processor restarts its thread after fork).
    """
    global _provider, _provider_pid
    with _lock:
        if _provider is not None:
            return True
        provider = build_provider(service_name)
        if provider is None:
            return False
        trace.set_tracer_provider(provider)
        _provider, _provider_pid = provider, os.getpid()
        atexit.register(shutdown_tracing)  # bounded, in place of the SDK's own exit-time shutdown
        return True


CLI_EXPORT_TIMEOUT_S = 2.0  # a command's span export at exit gives up after this (an OTLP collector that is down)


def setup_cli_tracing() -> bool:
    """:func:`setup_tracing` for a short-lived ``makespan`` command that exports spans at exit
    (a cancel ends queued jobs' root spans): unless ``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`` or
    ``OTEL_EXPORTER_OTLP_TIMEOUT`` is set, the OTLP export gives up after
    :data:`CLI_EXPORT_TIMEOUT_S` (its default of 10 s, with retries, held the command's exit
    that long when the collector was down)."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")):
        os.environ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"] = repr(CLI_EXPORT_TIMEOUT_S)
    return setup_tracing("makespan-cli")


SHUTDOWN_EXPORT_S = 2.0  # a process's span flush at exit gives up after this (a hung OTLP collector)
EXIT_MARGIN_S = 0.5  # during a shutdown, the flush ends this long before the watchdog would end the process


def shutdown_tracing(timeout_s: float = SHUTDOWN_EXPORT_S) -> None:
    """Flush and shut the provider down (a worker's or the planner's exit, and at interpreter
    exit: registered by :func:`setup_tracing`), waiting at most ``timeout_s``: the flush and
    the exporter's shutdown run in a daemon thread, and spans still unexported then are
    dropped, with a warning. An OTLP collector that accepts connections and never answers
    held a GPU worker's stop past the Procfile's 4 s shutdown grace (its watchdog then
    exited 1) and the planner's interpreter exit 10 s: the export in flight waits for the
    exporter's own timeout (``OTEL_EXPORTER_OTLP_TIMEOUT``, 10 s). During a shutdown
    (:func:`makespan.shutdown.time_left_s`) it waits at most what the watchdog leaves, less
    :data:`EXIT_MARGIN_S`: a job that stopped late in the grace left the flush too little
    time, and the watchdog ended the process (exit 1). Tracing is off afterwards."""
    global _provider
    with _lock:
        provider, _provider = _provider, None
    if provider is None:
        return
    from makespan import shutdown

    left = shutdown.time_left_s()  # a shutdown under way: within what its watchdog leaves, less a margin to exit
    if left is not None:
        timeout_s = max(0.0, min(timeout_s, left - EXIT_MARGIN_S))

    def flush_and_shut() -> None:
        try:
            provider.force_flush(int(timeout_s * 1000))
            provider.shutdown()
        except Exception as e:  # noqa: BLE001 - an exporter's own error must not fail the exit
            log.warning("trace export at exit failed: %s: %s", type(e).__name__, e)

    closer = threading.Thread(target=flush_and_shut, name="makespan-trace-shutdown", daemon=True)
    closer.start()
    closer.join(timeout_s)
    if closer.is_alive():
        log.warning("trace export at exit did not finish within %.1f s (the OTLP collector does not answer?): spans "
                    "not yet exported are dropped", timeout_s)


def tracing_enabled() -> bool:
    return _provider is not None


def _tracer() -> trace.Tracer:
    return trace.get_tracer(SCOPE)


def _attrs(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Span attributes under ``makespan.``; lists become string tuples, None is dropped."""
    out: dict[str, Any] = {}
    for k, v in (attributes or {}).items():
        if v is None:
            continue
        key = k if "." in k else f"makespan.{k}"
        if isinstance(v, (list, tuple)):
            v = tuple(str(x) for x in v)
        elif not isinstance(v, (str, bool, int, float)):
            v = str(v)
        out[key] = v
    return out


def tracing_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for tracing (:func:`exporter_names` not empty); a bad
    ``OTEL_TRACES_EXPORTER`` counts as no (logged), as it would stop no submit."""
    try:
        return bool(exporter_names(env))
    except ValidationError as e:
        log.warning("tracing off in this process: %s", e)
        return False


def job_traceparent() -> str:
    """Choose the ids of a job's ``makespan`` span; return its W3C traceparent, or ``""``
    when tracing is off. Call at submit and store the string on the job record. If a
    span is current (e.g. a producer's request span, whatever provider made it), the job
    joins its trace.

    Tracing is on here when this process set it up (:func:`setup_tracing`), when its
    environment asks for it (the ``OTEL_*`` variables the workers read: a program that
    submits through :func:`makespan.connect` sets nothing up itself, and nothing is
    exported at submit) or when a span is current. The ids need no provider: the
    workers export every span of the job, the ``makespan`` span included."""
    parent = trace.get_current_span().get_span_context()
    if _provider is None and not parent.is_valid and not tracing_requested():
        return ""
    gen = RandomIdGenerator()
    trace_id = parent.trace_id if parent.is_valid else gen.generate_trace_id()
    return f"00-{trace_id:032x}-{gen.generate_span_id():016x}-01"


def sibling_traceparent(traceparent: str) -> str:
    """A traceparent in the same trace as ``traceparent`` with a new span id (the next
    job of a workload, a retried step); ``""`` for an empty or malformed one."""
    sc = parse_traceparent(traceparent)
    if sc is None:
        return ""
    return f"00-{sc.trace_id:032x}-{RandomIdGenerator().generate_span_id():016x}-01"


def parse_traceparent(traceparent: str) -> trace.SpanContext | None:
    """The remote span context of a traceparent string, or None if it is empty or malformed."""
    if not traceparent:
        return None
    ctx = _propagator.extract({"traceparent": traceparent})
    sc = trace.get_current_span(ctx).get_span_context()
    return sc if sc.is_valid else None


def _parent_context(traceparent: str) -> otel_context.Context | None:
    return _propagator.extract({"traceparent": traceparent}) if parse_traceparent(traceparent) else None


@contextmanager
def use_traceparent(traceparent: str) -> Iterator[None]:
    """Make the job's ``makespan`` span the current parent (e.g. around ``apply_async`` so
    that CeleryInstrumentor's publish span joins the job's trace)."""
    ctx = _parent_context(traceparent)
    if ctx is None:
        yield
        return
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


def phase_span(name: str, traceparent: str,
               attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[trace.Span]:
    """A span ``name`` (a phase name such as ``execute`` or a span name such as
    ``execute_workload``) whose parent is the job's ``makespan`` span.

    ``attributes`` (keys get a ``makespan.`` prefix): job_id, priority, endpoint, gpus,
    host, lease_id, planned_s (workload s). ``makespan.actual_s`` (wall s) is set on exit
    unless given. Exceptions are recorded on the span and re-raised. With an empty or
    malformed traceparent the span's parent is the current span.

    With no tracer provider installed in this process, no traceparent and a current span
    that does not record (the GPU worker's common case, tracing off), the span is the
    current span itself, as the API's no-op tracer would make it, without entering it
    (nothing to record, nothing to attach)."""
    if not traceparent and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        current = trace.get_current_span()
        if isinstance(current, trace.NonRecordingSpan):
            return nullcontext(current)
    return _phase_span(name, traceparent, attributes)


@contextmanager
def _phase_span(name: str, traceparent: str, attributes: Mapping[str, Any] | None) -> Iterator[trace.Span]:
    """:func:`phase_span` with a span started (and made current) by the tracer."""
    span_name = PHASE_SPAN_NAMES.get(name, name)
    ctx = _parent_context(traceparent)
    t0 = time.perf_counter()
    with _tracer().start_as_current_span(span_name, context=ctx, attributes=_attrs(attributes)) as span:
        try:
            yield span
        finally:
            if span.is_recording() and "actual_s" not in (attributes or {}):
                span.set_attribute("makespan.actual_s", time.perf_counter() - t0)


@contextmanager
def child_span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[trace.Span]:
    """A child of the current span (``process_spawn`` and ``health_check`` inside
    ``start_endpoints``)."""
    with _tracer().start_as_current_span(name, attributes=_attrs(attributes)) as span:
        yield span


def end_job_span(traceparent: str, start_ts: float, attributes: Mapping[str, Any] | None = None,
                 end_ts: float | None = None, error: str | None = None) -> None:
    """Export the job's ``makespan`` span with the ids of ``traceparent``, from
    ``start_ts`` (unix s, the submit time) to ``end_ts`` (default now). Call once, after
    restore (or when the job fails or is cancelled; ``error`` sets an ERROR status)."""
    sc = parse_traceparent(traceparent)
    if sc is None or _provider is None:
        return
    token = _forced_ids.set((sc.trace_id, sc.span_id))
    try:
        span = _tracer().start_span(SPAN_MAKESPAN, context=otel_context.Context(), kind=trace.SpanKind.INTERNAL,
                                    attributes=_attrs(attributes), start_time=int(start_ts * 1e9))
    finally:
        _forced_ids.reset(token)
    end = time.time() if end_ts is None else end_ts
    span.set_attribute("makespan.makespan_s", max(0.0, end - start_ts))
    if error:
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))
    span.end(end_time=int(end * 1e9))


JOB_SPAN_FIELDS = ("traceparent", "submitted_at", "priority", "endpoint", "reason")
"""The job record's fields :func:`end_job_span_of_record` reads."""


def end_job_span_of_record(job_id: str, state: str, record: Mapping[str, str | None]) -> None:
    """:func:`end_job_span` for a job that a path other than its GPU worker ended (a
    reclaim, a preemption, a cancel while queued), from its record's
    :data:`JOB_SPAN_FIELDS` (missing ones None). Nothing when tracing is off or the job
    has no traceparent; ``failed`` sets an ERROR status (a cancel is not an error)."""
    traceparent = record.get("traceparent")
    if not traceparent or not tracing_enabled():
        return
    reason = record.get("reason")
    end_job_span(traceparent, float(record.get("submitted_at") or time.time()),
                 {"job_id": job_id, "priority": record.get("priority"), "endpoint": record.get("endpoint"),
                  "state": state, "reason": reason or None},
                 error=(reason or state) if state == "failed" else None)


def end_cancelled_job_spans(r: Any, jobs: Sequence[tuple[str, str]]) -> None:
    """The root spans of jobs cancelled while queued or delayed (no GPU worker ends them):
    ``jobs`` is ``(job id, its record's key)`` pairs, read in one pipeline of the Redis
    client ``r``. Reads nothing when tracing is off."""
    if not jobs or not tracing_enabled():
        return
    pipe = r.pipeline(transaction=False)
    for _, job_key in jobs:
        pipe.hmget(job_key, *JOB_SPAN_FIELDS)
    for (job_id, _), values in zip(jobs, pipe.execute()):
        end_job_span_of_record(job_id, "cancelled", dict(zip(JOB_SPAN_FIELDS, values)))


# -- Celery -----------------------------------------------------------------------------------

_PREFORK_NAMES = {"prefork", "processes", "celery.concurrency.prefork:taskpool"}


def _is_prefork(pool_cls: Any) -> bool:
    if isinstance(pool_cls, str):
        return pool_cls.lower() in _PREFORK_NAMES
    return getattr(pool_cls, "__module__", "").endswith("concurrency.prefork")


def _instrument() -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    inst = CeleryInstrumentor()
    if not inst.is_instrumented_by_opentelemetry:
        inst.instrument()


def instrument_celery(app: Any, service_name: str = "makespan-gpu-worker") -> None:
    """Trace a Celery app's workers, whatever their pool.

    - prefork: tracing and ``CeleryInstrumentor`` start in each child at
      ``worker_process_init``; ``worker_process_shutdown`` flushes the child's spans.
    - threads, solo, eventlet, gevent: they start at ``worker_init`` (no child process).
    - ``worker_shutdown`` flushes the main process.

    In a producer (the planner), call :func:`instrument_producer` instead.
    """
    from celery import signals

    def on_worker_init(sender: Any = None, **_kw: Any) -> None:
        if not _is_prefork(getattr(sender, "pool_cls", None) or app.conf.worker_pool):
            if setup_tracing(service_name):
                _instrument()

    def on_process_init(**_kw: Any) -> None:
        if setup_tracing(service_name):
            _instrument()

    def on_shutdown(**_kw: Any) -> None:
        shutdown_tracing()

    for sig, fn in ((signals.worker_init, on_worker_init), (signals.worker_process_init, on_process_init),
                    (signals.worker_process_shutdown, on_shutdown), (signals.worker_shutdown, on_shutdown)):
        sig.connect(fn, weak=False)


def instrument_producer(service_name: str) -> bool:
    """Tracing plus ``CeleryInstrumentor`` in a process that only sends tasks; True if on."""
    if setup_tracing(service_name):
        _instrument()
        return True
    return False
