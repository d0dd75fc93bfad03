"""One trace per job, its ``makespan`` root span included, whoever submits it and however
it ends (found by a review, 2026-12-05; each test fails on the code before its fix):

- a job submitted through the Python API (``makespan.connect().submit``) in a process
  whose environment turns tracing on got no traceparent (only the CLI set tracing up), so
  its phase spans were roots of unrelated traces and no ``makespan`` span was exported;
- a job cancelled while it ran (the GPU worker ends it ``cancelled``), or cancelled by a
  preemption (its cancel was requested), never had its ``makespan`` root span exported:
  its phase spans named a parent no backend ever received.

Real planner and GPU worker processes exporting to a JSON-lines file; the preemption case
on real Redis with the real preempt script and an in-memory exporter."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import makespan
from makespan import telemetry
from makespan.keys import Keys
from makespan.live import LiveSystem, delete_prefix
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect
from makespan.workers.leases import LeaseStore, preempt
from tests.live import stop_checked, wait_for

FLEET = (Path(__file__).parent.parent / "workloads" / "fleet.toml").resolve()
ROOT = Path(__file__).parent.parent.parent


@pytest.fixture(scope="module")
def traced(redis_url, tmp_path_factory):
    """A live system (planner + GPU worker with tests.workloads.fns) exporting spans to a file."""
    tmp = tmp_path_factory.mktemp("spans")
    marks = tmp / "marks"
    marks.mkdir()
    trace_file = tmp / "spans.jsonl"
    prefix = f"mst-sp-{uuid.uuid4().hex[:8]}"
    settings = makespan.settings.Settings(
        redis_url=redis_url, key_prefix=prefix, time_scale=0.01, lease_ttl_s=3.0, heartbeat_s=0.5,
        batch_wait_s=0.02, planner_tick_s=0.05, workload_modules="tests.workloads.fns", cancel_grace_s=0.5)
    env = {"OTEL_TRACES_EXPORTER": "file", "MAKESPAN_TRACE_FILE": str(trace_file),
           "MAKESPAN_TEST_MARK_DIR": str(marks)}
    system = LiveSystem(FLEET, load_fleet(FLEET), settings, tmp / "logs", observer=False, extra_env=env)
    system.start()
    client = makespan.connect(redis_url, key_prefix=prefix)
    try:
        wait_for(lambda: client.r.exists(client.keys.fn_live("add")), 30, "the worker to publish its functions")
        wait_for(lambda: client.r.exists(client.keys.fleet_version), 30, "the planner to publish the fleet")
        yield system, client, trace_file, marks, {**system._env(), **env}
    finally:
        stop_checked(system)
        r = connect(redis_url)
        delete_prefix(r, Keys(prefix))
        r.close()


def _spans(trace_file: Path, job_id: str) -> list[dict]:
    rows = telemetry.read_span_file(trace_file)
    return [x for x in rows if x["attributes"].get("makespan.job_id") == job_id]


def test_a_job_submitted_through_the_python_api_is_one_trace_with_its_root_span(traced):
    system, client, trace_file, _marks, env = traced
    code = ("import json, makespan\n"
            "c = makespan.connect()\n"
            "job = c.submit('add', 2, 3)\n"
            "tp = c.r.hget(c.keys.job(job.id), 'traceparent')\n"
            "print(json.dumps({'id': job.id, 'tp': tp, 'sum': job.result(timeout_s=60)['sum']}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["sum"] == 5
    assert got["tp"] and got["tp"].startswith("00-"), "the job was given a traceparent at submit"
    wait_for(lambda: any(s["name"] == "makespan" for s in _spans(trace_file, got["id"])), 30, "the job's root span")
    mine = _spans(trace_file, got["id"])
    assert {s["trace_id"] for s in mine} == {got["tp"].split("-")[1]}
    root = next(s for s in mine if s["name"] == "makespan")
    assert root["span_id"] == got["tp"].split("-")[2] and root["parent_span_id"] is None
    assert next(s for s in mine if s["name"] == "execute_workload")["parent_span_id"] == root["span_id"]


def test_a_job_cancelled_while_it_runs_ends_its_root_span(traced, monkeypatch):
    system, client, trace_file, marks, _env = traced
    tp = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    monkeypatch.setattr(telemetry, "job_traceparent", lambda: tp)  # this process exports nothing itself
    job = client.submit("wait_for_cancel")
    wait_for(lambda: (marks / f"{job.id}.started").exists(), 60, "the function to start")
    assert job.cancel() == "cancel_requested"
    wait_for(lambda: job.status()["state"] == "cancelled", 30, "the job to end cancelled")
    wait_for(lambda: any(s["name"] == "makespan" for s in _spans(trace_file, job.id)), 60, "the job's root span")
    mine = _spans(trace_file, job.id)
    root = next(s for s in mine if s["name"] == "makespan")
    assert root["trace_id"] == tp.split("-")[1] and root["span_id"] == tp.split("-")[2]
    assert root["attributes"]["makespan.state"] == "cancelled"
    assert root["status"] != "ERROR", "a cancel is not an error (it is not counted failed either)"
    assert next(s for s in mine if s["name"] == "execute_workload")["parent_span_id"] == root["span_id"]


@pytest.fixture
def exported(monkeypatch):
    """This process's tracing on, into an in-memory exporter (the global provider untouched)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=telemetry._ForcedIdGenerator())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(telemetry, "_provider", provider)
    monkeypatch.setattr(telemetry, "_tracer", lambda: provider.get_tracer(telemetry.SCOPE))
    return exporter


def test_a_victim_cancelled_by_its_preemption_ends_its_root_span(r, keys, settings, exported):
    fleet = load_fleet(FLEET)
    gpu = fleet.hosts[0].gpus[0].uuid
    prod = Producer(r, keys, fleet, settings)
    tp = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    victim = prod.submit({"endpoint": "sim", "service_s": 3600, "priority": "LOW"}, traceparent=tp).id
    lease = LeaseStore(r, keys).acquire("victim-lease", (gpu,), 60.0, job_id=victim, kind="job", holder="h",
                                        queue=keys.queue("LOW"), info={"endpoint": "sim", "priority": "LOW"})
    assert lease is not None
    assert prod.cancel(victim) == "cancel_requested"
    by = prod.submit({"endpoint": "sim", "service_s": 5, "priority": "HIGH"}).id
    assert preempt(r, keys, lease.lease_id, by) == "cancelled"
    roots = [s for s in exported.get_finished_spans() if s.name == "makespan"]
    assert len(roots) == 1
    sc = roots[0].get_span_context()
    assert f"{sc.trace_id:032x}" == tp.split("-")[1] and f"{sc.span_id:016x}" == tp.split("-")[2]
    assert roots[0].attributes["makespan.job_id"] == victim and roots[0].attributes["makespan.state"] == "cancelled"


def test_a_job_cancelled_while_queued_ends_its_root_span(r, keys, settings, exported):
    """A job cancelled in its queue (never leased, or requeued by a preemption after it
    ran: its phase spans of the first run name this root) gets its ``makespan`` root span
    from the process that cancelled it, with state ``cancelled``: one trace per job,
    however it ends (found 2026-12-05: no process exported it)."""
    prod = Producer(r, keys, load_fleet(FLEET), settings)
    tp = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    job = prod.submit({"endpoint": "sim", "service_s": 5, "priority": "LOW"}, traceparent=tp).id
    assert exported.get_finished_spans() == ()
    assert prod.cancel(job) == "cancelled"
    roots = [s for s in exported.get_finished_spans() if s.name == "makespan"]
    assert len(roots) == 1
    sc = roots[0].get_span_context()
    assert f"{sc.trace_id:032x}" == tp.split("-")[1] and f"{sc.span_id:016x}" == tp.split("-")[2]
    assert roots[0].attributes["makespan.job_id"] == job and roots[0].attributes["makespan.state"] == "cancelled"
    assert roots[0].status.status_code.name != "ERROR"
    assert prod.cancel(job) == "cancelled"  # a second cancel of the ended job exports nothing more
    assert len([s for s in exported.get_finished_spans() if s.name == "makespan"]) == 1


def test_a_dependant_the_planner_cancels_ends_its_root_span(r, keys, settings, exported):
    """The planner cancels a queued job whose dependency will never complete: that job's
    root span is ended by the planner (state ``cancelled``, with the reason)."""
    import dataclasses

    from makespan.workers.planner_worker import PlannerWorker

    fleet = load_fleet(FLEET)
    s = dataclasses.replace(settings, key_prefix=keys.prefix, lease_ttl_s=60.0, policy="portfolio")
    planner = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: None)
    planner.token = str(r.incr(planner.keys.planner_fence))  # the planner's cancel is fenced: lead
    prod = Producer(r, planner.keys, fleet, s)
    first = prod.submit({"endpoint": "sim", "service_s": 5, "priority": "LOW"}).id
    tp = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    then = prod.submit({"endpoint": "sim", "service_s": 5, "priority": "LOW", "depends_on": [first]},
                       traceparent=tp).id
    assert prod.cancel(first) == "cancelled"
    planner.tick()
    assert r.hget(planner.keys.job(then), "state") == "cancelled"
    roots = [sp for sp in exported.get_finished_spans()
             if sp.name == "makespan" and sp.attributes["makespan.job_id"] == then]
    assert len(roots) == 1 and f"{roots[0].get_span_context().trace_id:032x}" == tp.split("-")[1]
    assert roots[0].attributes["makespan.state"] == "cancelled"
    assert f"dependency {first}" in roots[0].attributes["makespan.reason"]


def test_a_workload_is_one_trace_its_steps_and_retries_each_with_their_own_root_span(r, keys, settings,
                                                                                     exported):
    """A multi-step workload's steps carried no traceparent, so with tracing on their phase
    spans fell into unrelated traces and no ``makespan`` span was exported for them. Now
    every step (and every retry of one) has its own span id in the workload's one trace, and
    cancelling the workload ends the root spans of the steps it cancelled."""
    from makespan.workloads import advance_workloads, cancel_workload, submit_workload
    from tests.conftest import FLEET_TOML

    spec = {"name": "wl", "priority": "LOW", "retry_budget": 1,
            "steps": [{"name": "a", "endpoint": "embed", "service_s": 10},
                      {"name": "b", "endpoint": "embed", "service_s": 10, "depends_on": ["a"]}]}
    wid = submit_workload(r, keys, load_fleet(FLEET_TOML), spec, settings)
    first = json.loads(r.hget(keys.workload(wid), "steps"))
    tps = {step: r.hget(keys.job(job_id), "traceparent") for step, job_id in first.items()}
    assert all(tps.values()) and tps["a"].split("-")[1] == tps["b"].split("-")[1]  # one trace
    assert tps["a"].split("-")[2] != tps["b"].split("-")[2]  # a root span each
    r.zrem(keys.queue("LOW"), first["a"])
    r.hset(keys.job(first["a"]), "state", "failed")
    assert advance_workloads(r, keys)["retried"] == 1
    retried = json.loads(r.hget(keys.workload(wid), "steps"))["a"]
    retry_tp = r.hget(keys.job(retried), "traceparent")
    assert retry_tp.split("-")[1] == tps["a"].split("-")[1] and retry_tp.split("-")[2] != tps["a"].split("-")[2]
    assert cancel_workload(r, keys, wid)["cancelled"] == 2
    roots = {sp.attributes["makespan.job_id"]: sp for sp in exported.get_finished_spans() if sp.name == "makespan"}
    assert set(roots) == {retried, first["b"]}
    assert all(sp.attributes["makespan.state"] == "cancelled" for sp in roots.values())
    assert {f"{sp.get_span_context().span_id:016x}" for sp in roots.values()} == {retry_tp.split("-")[2],
                                                                                   tps["b"].split("-")[2]}


def test_a_delayed_job_cancelled_from_the_cli_ends_its_root_span(traced):
    """``makespan cancel`` of a delayed job (no GPU worker will end it) exports its root span
    when its environment asks for tracing (the command set no tracing up: found by an
    observability review, 2026-12-07)."""
    system, client, trace_file, _marks, env = traced
    cli = [sys.executable, "-m", "makespan.cli"]
    sub = subprocess.run([*cli, "submit", "-q", "add", "--args", "[2, 3]", "--delay-s", "300"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().splitlines()[-1]
    out = subprocess.run([*cli, "cancel", job_id], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "cancelled", out.stdout + out.stderr
    roots = [s for s in _spans(trace_file, job_id) if s["name"] == "makespan"]
    assert len(roots) == 1, "the cancelling command exported the job's root span, once"
    assert roots[0]["attributes"]["makespan.state"] == "cancelled"
