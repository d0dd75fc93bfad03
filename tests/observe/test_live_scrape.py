"""Scrape the real planner, GPU worker and observer processes after a known workload:
the counters must match what was submitted and completed."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from makespan import events
from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from tests.live import stop_checked, wait_for

FLEET = Path("examples/render-pipeline.toml").resolve()
METRICS_PORT_RANGE = (20000, 25000)  # test_prometheus_live.py: 25000 up
KNOWN = [("embed", "CRITICAL")] * 2 + [("chat", "NORMAL")] * 3 + [("coder", "LOW")]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _total(samples: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def test_scrape_matches_a_known_workload(r, keys, settings, tmp_path):
    fleet = load_fleet(FLEET)
    # below the ephemeral range (LiveSystem skips bound ports), and apart from test_prometheus_live's
    # range: both systems' checks could pass for one port before either child binds it (xdist)
    base = random.Random().randrange(*METRICS_PORT_RANGE)
    system = LiveSystem(FLEET, fleet, settings, tmp_path / "logs", metrics_base_port=base)
    try:
        system.start()
        prod = Producer(r, keys, fleet, settings)
        ids = [prod.submit({"endpoint": ep, "priority": p, "service_s": 20}).id for ep, p in KNOWN]
        wait_for(lambda: all(r.hget(keys.job(j), "state") == "completed" for j in ids), 90, "jobs to complete")
        wait_for(lambda: r.hget(keys.drain, "checks"), 60, "the drain check")
        ports = system.metrics_ports
        workers = [_scrape(p) for n, p in ports.items() if n.startswith("gpu-")]
        planner = _scrape(ports["planner-0"])
        observer = _scrape(ports["observer"])
        for prio, n in (("CRITICAL", 2), ("NORMAL", 3), ("LOW", 1), ("HIGH", 0)):
            done = sum(_total(w, "makespan_jobs_completed_total", priority=prio) for w in workers)
            assert done == n, (prio, done)
        # one execute per job, unless a lease was lost after its execute (a loaded host's late
        # heartbeat: reclaimed, run again): the events say how many ran to their end
        executes = sum(1 for e in events.read_all(r, keys.events) if e.get("kind") == "phase_end"
                       and e.get("phase") == "execute" and e.get("job") in ids)
        assert executes >= len(KNOWN)
        assert sum(_total(w, "makespan_phase_seconds_count", phase="execute") for w in workers) == executes
        assert sum(_total(w, "makespan_gpu_seconds_total", state="busy") for w in workers) > 0
        assert _total(planner, "makespan_planner_solve_seconds_count") >= 1
        # every job is planned in a tick's batch, except a CRITICAL one the critical lane
        # placed the moment it was submitted (makespan.workers.critical_lane)
        lane = sum(1 for e in events.read_all(r, keys.events)
                   if e.get("kind") == "critical_lane" and e.get("outcome") in ("warm", "cold_start", "preempted"))
        assert _total(planner, "makespan_planner_batch_size_jobs_sum") + lane >= len(KNOWN)
        waits = _total(planner, "makespan_job_wait_seconds_count")
        assert waits == len(KNOWN)
        for prio in ("CRITICAL", "HIGH", "NORMAL", "LOW"):
            assert _total(planner, "makespan_queue_depth_jobs", priority=prio) == 0
        assert _total(planner, "makespan_drain_leftovers") == 0
        assert _total(observer, "makespan_incidents_total") == 0
        # every endpoint's series is there at 0 on the process that counts incidents (a first
        # incident is an increase() of it, not a series appearing at 1: a user's report)
        assert {dict(ls).get("endpoint") for n, ls in observer if n == "makespan_incidents_total"} \
            == set(fleet.endpoints), observer
    finally:
        stop_checked(system)


def test_metrics_ports_skip_ports_already_bound():
    """A metrics port another process holds would make that child exit at start: the
    live system skips it (and ports it gave out already)."""
    import socket

    from makespan.live import _bindable_from

    rng = random.Random()
    for _ in range(20):  # a base whose next port we can hold ourselves
        base = rng.randrange(*METRICS_PORT_RANGE)
        held = socket.socket()
        try:
            held.bind(("0.0.0.0", base + 1))
            break
        except OSError:
            held.close()
    with held:
        held.listen()
        got = _bindable_from(base, {base})
        assert got >= base + 2
        with socket.socket() as probe:
            probe.bind(("0.0.0.0", got))  # what it returned is free


def _leading(port: int) -> float | None:
    """``makespan_planner_leading`` of the planner serving ``port`` (None: not answering yet)."""
    try:
        return _total(_scrape(port), "makespan_planner_leading", pool="")
    except httpx.HTTPError:
        return None


def test_planner_leading_gauge_follows_the_leader_lock(r, keys, settings, tmp_path):
    """A leader exports makespan_planner_leading 1 and a standby 0; when the leader stops,
    the standby's turns 1 (an SRE alerts on the pool's sum being 0)."""
    fleet = load_fleet(FLEET)
    base = random.Random().randrange(*METRICS_PORT_RANGE)
    system = LiveSystem(FLEET, fleet, settings, tmp_path / "logs", observer=False, metrics_base_port=base)
    try:
        system.start_planner(0)
        leader_port = system.metrics_ports["planner-0"]
        wait_for(lambda: _leading(leader_port) == 1, 60, "planner-0 to lead")
        system.start_planner(1)
        standby_port = system.metrics_ports["planner-1"]
        wait_for(lambda: _leading(standby_port) is not None, 60, "planner-1 to serve /metrics")
        assert _leading(standby_port) == 0 and _leading(leader_port) == 1
        system.kill("planner-0", signal.SIGTERM)
        wait_for(lambda: _leading(standby_port) == 1, 60, "planner-1 to take over")
    finally:
        stop_checked(system)
