"""``telemetry.phase_span`` with tracing off (no tracer provider in the process) gives what
the OpenTelemetry API's no-op tracer gives: with no traceparent, the current span itself
(the GPU worker's common case, taken without entering a span); with one, a non-recording
span that carries the job's trace to what runs inside."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from makespan import telemetry


@pytest.fixture(autouse=True)
def _no_provider():
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.skip("a tracer provider is installed in this test process")


def test_without_a_traceparent_the_span_is_the_current_one():
    outer = trace.get_current_span()
    with telemetry.phase_span("execute", "", {"job_id": "j1"}) as span:
        assert span is outer and trace.get_current_span() is outer and not span.is_recording()
        span.set_attribute("makespan.planned_s", 1.0)  # a no-op, as on the no-op tracer's span
    assert trace.get_current_span() is outer


def test_with_a_traceparent_the_job_trace_reaches_the_code_inside():
    traceparent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    with telemetry.phase_span("execute", traceparent, {"job_id": "j1"}) as span:
        assert trace.get_current_span() is span and not span.is_recording()
        assert span.get_span_context().trace_id == int("ab" * 16, 16)
    with pytest.raises(ValueError):  # an error inside is re-raised
        with telemetry.phase_span("execute", traceparent):
            raise ValueError("boom")
