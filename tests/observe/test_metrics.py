"""Prometheus metrics scraped over real HTTP: a planner-like process with the Redis state
collector, and a prefork Celery worker whose children record events (multiprocess mode)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from makespan.metrics import KOMBU_SEP, celery_queue_lists
from makespan.redis_conn import free_port

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def scrape(port: int, timeout_s: float = 20.0) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape, retrying until the server answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2.0).text
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _env(redis_url: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROMETHEUS_"))}
    env.update(MAKESPAN_REDIS_URL=redis_url, MAKESPAN_KEY_PREFIX=prefix, TRACE_TEST_BROKER=redis_url,
               TRACE_TEST_PREFIX=prefix, PYTHONPATH=f"{HERE}{os.pathsep}{ROOT}")
    return env


def test_celery_queue_lists_follow_kombu_priority_steps():
    assert celery_queue_lists("p:celery:", "gpu.a") == [
        "p:celery:gpu.a", f"p:celery:gpu.a{KOMBU_SEP}3", f"p:celery:gpu.a{KOMBU_SEP}6", f"p:celery:gpu.a{KOMBU_SEP}9"]


def test_planner_scrape_shows_state_and_events(redis_url, prefix, keys, r):
    # state: 2 CRITICAL + 5 LOW queued; gpu.host-a holds 1+2+1 messages over three priority
    # steps; gpu.host-b (from the stored fleet) is empty; 3 leases, 1 agenda entry; a drain
    # check that left 1 busy slot; 2 incidents in the stream.
    r.zadd(keys.queue("CRITICAL"), {"c1": 1, "c2": 2})
    r.zadd(keys.queue("LOW"), {f"l{i}": i for i in range(5)})
    pre = keys.celery_prefix
    r.rpush(f"{pre}gpu.host-a", "m")
    r.rpush(f"{pre}gpu.host-a{KOMBU_SEP}3", "m", "m")
    r.rpush(f"{pre}gpu.host-a{KOMBU_SEP}9", "m")
    r.set(keys.fleet, json.dumps({"hosts": [{"name": "host-a"}, {"name": "host-b"}]}))
    r.zadd(keys.leases, {"l1": 1, "l2": 2, "l3": 3})
    r.zadd(keys.agenda_index, {"op1": 1})
    r.hset(keys.drain, mapping={"leases": 0, "agenda_entries": 0, "busy_slots": 1, "checks": 4})
    r.xadd(keys.incidents, {"e": "{}"})
    r.xadd(keys.incidents, {"e": "{}"})
    r.hset(keys.submit_counts, mapping={"CRITICAL": 1, "HIGH": 2, "LOW": 3})  # the submit scripts' counts
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "metrics_planner.py"), str(port)], cwd=ROOT,
                            env=_env(redis_url, prefix), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        m = scrape(port)
    finally:
        proc.kill()
        proc.wait()
    g = lambda name, **lb: m[(name, tuple(sorted(lb.items())))]  # noqa: E731
    assert g("makespan_redis_up") == 1
    assert g("makespan_queue_depth_jobs", priority="CRITICAL") == 2
    assert g("makespan_queue_depth_jobs", priority="LOW") == 5
    assert g("makespan_queue_depth_jobs", priority="HIGH") == 0
    assert g("makespan_celery_queue_messages", queue="gpu.host-a") == 4
    assert g("makespan_celery_queue_messages", queue="gpu.host-b") == 0
    assert g("makespan_active_leases") == 3 and g("makespan_active_agenda_entries") == 1
    assert g("makespan_drain_leftovers", item="busy_slots") == 1 and g("makespan_drain_leftovers", item="leases") == 0
    assert g("makespan_drain_checks_total") == 4
    assert g("makespan_incident_stream_entries") == 2
    assert g("makespan_jobs_submitted_total", priority="LOW") == 3
    assert g("makespan_jobs_submitted_total", priority="HIGH") == 2
    assert g("makespan_jobs_submitted_total", priority="NORMAL") == 0
    assert g("makespan_jobs_preempted_total", priority="LOW") == 1
    assert g("makespan_jobs_failed_total", priority="HIGH") == 1
    assert g("makespan_job_wait_seconds_count", priority="HIGH") == 3
    assert g("makespan_job_wait_seconds_bucket", le="0.5", priority="HIGH") == 2
    assert g("makespan_job_wait_seconds_sum", priority="HIGH") == pytest.approx(4.32)
    assert g("makespan_planner_solve_seconds_count") == 2
    assert g("makespan_planner_batch_size_jobs_sum") == 9
    assert g("makespan_gpu_seconds_total", state="idle") == pytest.approx(12.5)
    assert g("makespan_incidents_total", endpoint="coder") == 1


def test_scrape_answers_with_redis_down(tmp_path):
    code = ("import httpx, sys\n"
            "from app import metrics\n"
            "from makespan.settings import Settings\n"
            "s = Settings(redis_url='redis://127.0.0.1:1/0')\n"
            "srv = metrics.start_metrics_server(int(sys.argv[1]), settings=s, addr='127.0.0.1')\n"
            "print(httpx.get(f'http://127.0.0.1:{sys.argv[1]}/metrics').text)\n")
    out = subprocess.run([sys.executable, "-c", code, str(free_port())], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("PROMETHEUS_")})
    assert "makespan_redis_up 0.0" in out.stdout, out.stderr
    # the serving process's own series, as every Prometheus Python exporter has them
    for series in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                   "process_start_time_seconds", "python_info{"):
        assert f"\n{series}" in out.stdout, series


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_worker_children_report_through_parent(redis_url, prefix, r, pool):
    """6 jobs (2 GPUs, execute 2.0 s each) recorded by pool processes appear in the parent's scrape."""
    port, queue = free_port(), f"gpu.metrics-{pool}"
    env = _env(redis_url, prefix)
    proc = subprocess.Popen([sys.executable, str(HERE / "metrics_worker.py"), str(port), pool, queue], cwd=HERE,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        send = ("import sys; from metrics_worker import job\n"
                "for i in range(6): job.apply_async(args=['HIGH', 2.0, 2], queue=sys.argv[1])\n")
        subprocess.run([sys.executable, "-c", send, queue], cwd=HERE, env=env, check=True, timeout=60)
        deadline = time.monotonic() + 180  # bounds a hang only: a prefork worker's start on a loaded host
        done = 0.0
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            m = scrape(port)
            done = m.get(("makespan_jobs_completed_total", (("priority", "HIGH"),)), 0.0)
            if done >= 6:
                # one scrape is no snapshot: it may read the transition histogram before a job's
                # records and its completed counter after them (CI once saw 5 evicts beside 6
                # completed); every record of the six is in before this second scrape
                m = scrape(port)
                break
            time.sleep(0.2)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert done == 6
    assert m[("makespan_gpu_seconds_total", (("state", "busy"),))] == pytest.approx(6 * 2.0 * 2)
    assert m[("makespan_gpu_seconds_total", (("state", "transition"),))] == pytest.approx(6 * 0.25 * 2)
    assert m[("makespan_transition_seconds_count", (("kind", "evict"),))] == 6
    assert m[("makespan_phase_seconds_count", (("phase", "execute"),))] == 6


def test_labelled_counters_start_at_zero_for_every_known_label(monkeypatch, r, keys):
    """A quiet fleet exports 0 for every priority, phase, transition kind and endpoint
    (a labelled series otherwise appears only at its first increment: 'No data')."""
    from prometheus_client import CollectorRegistry

    from makespan.metrics import PRIORITIES, TRANSITION_KINDS, Metrics, RedisStateCollector

    m = Metrics(CollectorRegistry())
    for prio in PRIORITIES:
        for name in ("makespan_jobs_failed_total", "makespan_jobs_preempted_total",
                     "makespan_jobs_completed_total"):
            assert m.registry.get_sample_value(name, {"priority": prio}) == 0, (name, prio)
        assert m.registry.get_sample_value("makespan_job_wait_seconds_count", {"priority": prio}) == 0
    for kind in TRANSITION_KINDS:
        assert m.registry.get_sample_value("makespan_transition_seconds_count", {"kind": kind}) == 0
    assert m.registry.get_sample_value("makespan_incidents_total", {"endpoint": "chat"}) is None
    m.declare_endpoints(["chat", "coder"])
    assert m.registry.get_sample_value("makespan_incidents_total", {"endpoint": "chat"}) == 0
    # a GPU worker's workload functions (RegistryPublisher.start): a series born at its first
    # run made increase() miss that run (an observability engineer's first-error alert)
    assert m.registry.get_sample_value("makespan_workload_runs_total", {"workload": "judge", "outcome": "error"}) is None
    m.declare_workloads(["judge"])
    for outcome in ("ok", "error", "retried", "cancelled", "interrupted"):
        assert m.registry.get_sample_value("makespan_workload_runs_total",
                                           {"workload": "judge", "outcome": outcome}) == 0, outcome
    assert m.registry.get_sample_value("makespan_workload_progress_units_total", {"workload": "judge"}) == 0

    # the planner's state collector declares the endpoints of the fleet stored at P:fleet
    import makespan.metrics as metrics_mod

    monkeypatch.setattr(metrics_mod, "_metrics", Metrics(CollectorRegistry()))
    r.set(keys.fleet, json.dumps({"hosts": [{"name": "h"}], "endpoints": {"judge": {}, "embed": {}}}))
    list(RedisStateCollector(r, keys).collect())
    reg = metrics_mod._metrics.registry
    assert reg.get_sample_value("makespan_incidents_total", {"endpoint": "judge"}) == 0
    assert reg.get_sample_value("makespan_incidents_total", {"endpoint": "embed"}) == 0


def test_metrics_server_binds_the_address_of_makespan_metrics_addr(monkeypatch):
    """``MAKESPAN_METRICS_ADDR`` chooses the interface (a security review: the servers
    listened on every interface with no way to change it)."""
    from makespan.metrics import start_metrics_server
    from makespan.redis_conn import free_port

    monkeypatch.setenv("MAKESPAN_METRICS_ADDR", "127.0.0.1")
    server = start_metrics_server(free_port(), redis_state=False, multiprocess=False, endpoints=())
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()


def test_a_killed_process_metrics_directory_is_swept(tmp_path):
    """A GPU worker ended by SIGKILL leaves its multiprocess directory (its exit hook never
    runs); the next process that starts a metrics server there removes those of dead pids
    of its own PID namespace and keeps the others (an observability review and its verifier,
    2026-12-07)."""
    import os
    import subprocess

    from makespan import metrics

    namespace = metrics._pid_namespace()
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = tmp_path / f"makespan-prom-{dead.pid}-ns{namespace}-abc"
    gone.mkdir()
    (gone / "counter_1.db").write_bytes(b"x")
    alive = tmp_path / f"makespan-prom-{os.getpid()}-ns{namespace}-def"
    alive.mkdir()
    other = tmp_path / "makespan-prom-notapid-x"
    other.mkdir()
    # another PID namespace (a container sharing the volume): its pid means nothing here
    elsewhere = tmp_path / f"makespan-prom-{dead.pid}-ns1-ghi"
    elsewhere.mkdir()
    older = tmp_path / f"makespan-prom-{dead.pid}-jkl"  # named before namespaces were: kept
    older.mkdir()
    assert metrics.sweep_dead_multiprocess_dirs(str(tmp_path)) == [str(gone)]
    assert not gone.exists() and alive.exists() and other.exists() and elsewhere.exists() and older.exists()


def test_a_metrics_port_in_use_is_one_line_and_exit_2_for_every_process(redis_url, prefix, tmp_path):
    """A leader and a standby on one host with the same MAKESPAN_METRICS_PORT: the second
    crashed with exit 1 and a 70-line OSError traceback, which the docs call a bug (a
    production-deployment helper). It is one line naming the setting, exit 2."""
    import socket

    from tests.conftest import FLEET_TOML

    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    port = taken.getsockname()[1]
    env = {**_env(redis_url, prefix), "MAKESPAN_METRICS_PORT": str(port)}
    try:
        for argv in (["planner", "--fleet", FLEET_TOML], ["observer", "--fleet", FLEET_TOML]):
            out = subprocess.run([sys.executable, "-m", "makespan.cli", *argv], cwd=ROOT, env=env, capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode == 2, (argv, out.returncode, out.stderr[-2000:])
            assert "MAKESPAN_METRICS_PORT: in use: each process that serves metrics needs its own port" in out.stderr
            assert "Traceback" not in out.stderr, out.stderr[-2000:]
    finally:
        taken.close()
