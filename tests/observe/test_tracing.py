"""Tracing: exporter selection, and one trace from submit to restore across real
Celery worker processes (prefork and threads pools), exported to a JSON-lines file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from makespan.errors import ValidationError
from makespan.telemetry import build_provider, exporter_names, parse_traceparent, read_span_file

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def test_exporter_selection_follows_otel_variables():
    assert exporter_names({}) == []
    assert exporter_names({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == ["otlp"]
    assert exporter_names({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}) == ["otlp"]
    assert exporter_names({"OTEL_TRACES_EXPORTER": "console"}) == ["console"]
    assert exporter_names({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"}) == []
    assert exporter_names({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}) == []
    assert exporter_names({"OTEL_TRACES_EXPORTER": "file", "MAKESPAN_TRACE_FILE": "/tmp/x"}) == ["file"]
    with pytest.raises(ValidationError):
        exporter_names({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValidationError) as e:
        exporter_names({"OTEL_TRACES_EXPORTER": "file"})
    assert e.value.field == "MAKESPAN_TRACE_FILE"
    assert build_provider("x", {}) is None
    p = build_provider("svc", {"OTEL_TRACES_EXPORTER": "console"})
    assert p is not None and p.resource.attributes["service.name"] == "svc"
    p = build_provider("svc", {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "other"})
    assert p.resource.attributes["service.name"] == "other"


def test_tracing_off_costs_nothing_and_yields_no_traceparent():
    code = ("from app import telemetry as t\n"
            "assert not t.setup_tracing('x')\n"
            "assert t.job_traceparent() == ''\n"
            "with t.phase_span('execute', '', {'job_id': 'j'}) as s:\n"
            "    assert not s.is_recording()\n"
            "t.end_job_span('', 0.0)\n"
            "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_parse_traceparent_rejects_garbage():
    assert parse_traceparent("") is None
    assert parse_traceparent("00-zz-yy-01") is None
    sc = parse_traceparent("00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    assert sc.trace_id == int("1" * 32, 16) and sc.span_id == int("2" * 16, 16)


def _read_spans(path: Path) -> list[dict]:
    return read_span_file(path)


def test_reading_the_span_file_leaves_out_a_line_still_being_written(tmp_path):
    # CI once read the file between the two halves of a worker's write (JSONDecodeError)
    path = tmp_path / "spans.jsonl"
    assert read_span_file(path) == []
    path.write_text('{"name":"a"}\n{"name":"b"}\n{"name":"mak')
    assert [x["name"] for x in read_span_file(path)] == ["a", "b"]
    with path.open("a") as f:
        f.write('espan"}\n')
    assert [x["name"] for x in read_span_file(path)] == ["a", "b", "makespan"]


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_one_trace_from_submit_to_restore_across_worker_processes(tmp_path, redis_url, prefix, r, pool):
    trace_file = tmp_path / "spans.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="file", MAKESPAN_TRACE_FILE=str(trace_file), TRACE_TEST_BROKER=redis_url,
               TRACE_TEST_PREFIX=prefix, PYTHONPATH=f"{HERE}{os.pathsep}{ROOT}")
    queue = f"gpu.trace-{pool}"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "trace_app", "worker", "-P", pool, "-c", "1", "-Q", queue,
         "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "WARNING"],
        cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        prod = subprocess.run([sys.executable, str(HERE / "trace_producer.py"), "job-1", queue], cwd=HERE, env=env,
                              capture_output=True, text=True, timeout=60)
        assert prod.returncode == 0, prod.stderr
        tp = prod.stdout.strip().splitlines()[-1]
        trace_id, root_id = tp.split("-")[1], tp.split("-")[2]
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and not any(s["name"] == "makespan" for s in _read_spans(trace_file)):
            assert worker.poll() is None, worker.stderr.read()
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    spans = _read_spans(trace_file)
    by_name = {s["name"]: s for s in spans}
    assert "makespan" in by_name, spans
    assert {s["trace_id"] for s in spans} == {trace_id}, "every span is in the job's trace"
    root = by_name["makespan"]
    assert root["span_id"] == root_id and root["parent_span_id"] is None
    for name in ("allocate_gpus", "evict_if_needed", "start_endpoints", "execute_workload", "clear_embeddings",
                 "restore_baseline"):
        assert by_name[name]["parent_span_id"] == root_id, name
        assert root["start_ns"] <= by_name[name]["start_ns"] and by_name[name]["end_ns"] <= root["end_ns"], name
    for name in ("process_spawn", "health_check"):
        assert by_name[name]["parent_span_id"] == by_name["start_endpoints"]["span_id"]
    publish, run = by_name["apply_async/trace_test.phases"], by_name["run/trace_test.phases"]
    assert publish["parent_span_id"] == root_id and run["parent_span_id"] == publish["span_id"]
    ex = by_name["execute_workload"]["attributes"]
    assert ex["makespan.job_id"] == "job-1" and ex["makespan.priority"] == "HIGH"
    assert ex["makespan.gpus"] == ["GPU-a-0", "GPU-a-1"] and ex["makespan.planned_s"] == 1.0
    assert ex["makespan.actual_s"] >= 0
    assert publish["pid"] == by_name["allocate_gpus"]["pid"] != by_name["execute_workload"]["pid"]
    assert by_name["execute_workload"]["service"] == "test-gpu-worker"
    assert by_name["allocate_gpus"]["service"] == "test-planner"
    if pool == "prefork":
        assert by_name["execute_workload"]["pid"] != worker.pid, "ran in a forked child"
    else:
        assert by_name["execute_workload"]["pid"] == worker.pid


HUNG_COLLECTOR_EXIT = r"""
import socket, sys, threading, time
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(16)
held = []
threading.Thread(target=lambda: [held.append(server.accept()) for _ in iter(int, 1)], daemon=True).start()
import os
os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{server.getsockname()[1]}"
os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # ms: the batch is sent soon, in the processor's thread
from makespan import telemetry
assert telemetry.setup_tracing("test-hung-collector")
with telemetry.phase_span("execute", telemetry.job_traceparent(), {"job_id": "j1"}):
    pass
time.sleep(0.5)  # the batch's export is now in flight, and never answered
print("exiting", flush=True)
"""


def test_a_collector_that_never_answers_does_not_hold_the_exit(tmp_path):
    """An observability engineer: with the OTLP endpoint on a listener that accepts and never
    answers, a GPU worker's stop ran past the Procfile's 4 s shutdown grace (its watchdog then
    exited 1) and the planner's interpreter exit took 10 s and more: the SDK's own exit-time
    shutdown waited for the export in flight. The exit's flush is bounded now
    (``SHUTDOWN_EXPORT_S``): the process ends, with a warning."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", HUNG_COLLECTOR_EXIT], env=env, capture_output=True, text=True,
                          timeout=60)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert "exiting" in done.stdout
    assert "trace export at exit did not finish within 2.0 s" in done.stderr
    assert took < 9.0, f"the exit took {took:.1f} s: the exporter's own 10 s timeout held it"


def test_the_exit_flush_during_a_shutdown_stays_within_the_watchdogs_grace(tmp_path):
    """A verifier: a GPU worker whose job stopped late in its shutdown grace left the bounded
    flush (2 s) more than the watchdog allowed: exit 1 with a watchdog dump. The flush now
    waits at most what the watchdog leaves, less a margin."""
    script = HUNG_COLLECTOR_EXIT.replace('print("exiting", flush=True)',
                                         'from makespan import shutdown\n'
                                         'shutdown.arm(1.5, "test")  # the watchdog: exit 1 at 1.5 s\n'
                                         'print("exiting", flush=True)')
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "trace export at exit did not finish within 1.0 s" in done.stderr, done.stderr
