"""Learned transition durations (issue 20 point 4): the running estimate per (endpoint,
host, kind) replaces the fleet file's prior once enough were measured (a host never
observed is planned like the others), the live planner's endpoint models and the GPU
worker's planned figures use it, the observer's overrun rule follows it (a slow disk is
not an incident every time), and bench (b): a host whose true cold start is 2× the fleet
file's — planned vs actual error before and after 20 observations. Real Redis, the
simulated driver under the test's time scale, the phases run in process."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from makespan.estimates import (TRANSITION_WINDOW, TransitionEstimate, quantile, read_transition_windows,
                                transition_estimate, transition_record_ops)
from makespan.models import FleetSpec
from makespan.producer import Producer
from makespan.workers.fleet_view import learned_endpoint_models
from makespan.workers.leases import LeaseStore
from makespan.workers.observer import Observer, list_incidents
from makespan.workers.phases import PhaseContext, PhaseRunner
from makespan.workers.warm import run_phases


def _fleet(cold_start_s=10.0, evict_s=1.0) -> FleetSpec:
    return FleetSpec.model_validate({
        "name": "two-hosts",
        "hosts": [{"name": "host-a", "gpu_count": 1, "memory_mib": 81920},
                  {"name": "host-b", "gpu_count": 1, "memory_mib": 81920}],
        "endpoints": {name: {"model": f"m/{name}", "memory_mib_per_gpu": 1000, "cold_start_s": cold_start_s,
                             "evict_s": evict_s} for name in ("alpha", "beta")}})


def test_estimate_is_the_prior_until_enough_then_a_high_quantile(r, keys):
    w = {}
    assert transition_estimate(w, "alpha", "host-b", "cold_start", 10.0, 5, 0.9) == \
        TransitionEstimate(10.0, "prior", 0, None)
    for x in (20.0, 21.0, 19.0, 22.0):  # four: still the prior
        for op in transition_record_ops(keys, "alpha", "host-b", "cold_start", x):
            getattr(r, op[0].lower())(*op[1:])
    w = read_transition_windows(r, keys, ["alpha"], ["host-a", "host-b"])
    assert transition_estimate(w, "alpha", "host-b", "cold_start", 10.0, 5, 0.9).source == "prior"
    for op in transition_record_ops(keys, "alpha", "host-b", "cold_start", 30.0):
        getattr(r, op[0].lower())(*op[1:])
    w = read_transition_windows(r, keys, ["alpha"], ["host-a", "host-b"])
    est = transition_estimate(w, "alpha", "host-b", "cold_start", 10.0, 5, 0.9)
    assert est.source == "learned" and est.observations == 5 and est.last_s == 30.0
    assert est.seconds == pytest.approx(quantile([20, 21, 19, 22, 30], 0.9)) and est.seconds > 22
    # a host never observed is planned like the others; the planner's figure is over all hosts
    other = transition_estimate(w, "alpha", "host-a", "cold_start", 10.0, 5, 0.9)
    assert (other.source, other.seconds, other.last_s) == ("others", est.seconds, None)
    assert transition_estimate(w, "alpha", None, "cold_start", 10.0, 5, 0.9).seconds == est.seconds
    # a cold restore is the same load as a cold start: they pool
    assert transition_estimate(w, "alpha", "host-b", "restore", 10.0, 5, 0.9).source == "learned"
    # the window is capped
    for _ in range(TRANSITION_WINDOW + 10):
        for op in transition_record_ops(keys, "alpha", "host-b", "evict", 1.0):
            getattr(r, op[0].lower())(*op[1:])
    assert r.llen(keys.transition_times("alpha", "host-b", "evict")) == TRANSITION_WINDOW
    models = learned_endpoint_models(_fleet(), w, 5, 0.9)
    assert models["alpha"].cold_start_s == est.seconds and models["beta"].cold_start_s == 10.0


class Swaps:
    """Alternate alpha and beta jobs on one GPU of ``host``: every job evicts and cold-starts."""

    def __init__(self, r, keys, settings, fleet, host):
        self.r, self.keys, self.host = r, keys, host
        self.gpu = f"GPU-{host}-0"
        self.prod = Producer(r, keys, fleet, settings)
        self.runner = PhaseRunner(r, settings, fleet)
        self.n = 0

    def job(self, endpoint: str) -> PhaseContext:
        self.n += 1
        jid = self.prod.submit({"endpoint": endpoint, "service_s": 0.1, "priority": "HIGH"}).id
        lease = LeaseStore(self.r, self.keys).acquire(f"L{self.n}", (self.gpu,), 30.0, job_id=jid, kind="job",
                                                      holder=self.host, queue=self.keys.queue("HIGH"))
        ctx = PhaseContext(f"L{self.n}", lease.token, [self.gpu], self.host, "job", endpoint, jid, "HIGH", 0.1)
        assert run_phases(self.runner, ctx) == "completed"
        return ctx

    def cold_starts(self) -> list[dict]:
        out = []
        for _i, f in self.r.xrange(self.keys.events):
            e = json.loads(f["e"])
            if e["kind"] == "phase_end" and e.get("phase") == "start_endpoint":
                out += [t for t in e.get("transitions", ()) if t["kind"] == "cold_start"]
        return out


def _errors(ts: list[dict]) -> list[float]:
    return sorted(abs(t["actual_s"] - t["planned_s"]) / t["actual_s"] for t in ts)


def test_bench_b_a_host_twice_as_slow_is_learned(r, keys, settings):
    """Bench (b) of issue 20: host-b's true cold start is 2× the fleet file's. Before
    anything is learned the planned cold start is 50% off; after 20 observations of each
    endpoint the planned vs actual error's p50 is at most 10% (target of the issue)."""
    fleet = _fleet()
    s = dataclasses.replace(settings, simulated_slowdown="host-b=2", time_scale=0.005)
    swaps = Swaps(r, keys, s, fleet, "host-b")
    for i in range(2 * 26):  # 26 cold starts per endpoint: 20 to learn from, then 6 to judge by
        swaps.job("alpha" if i % 2 == 0 else "beta")
    ts = swaps.cold_starts()
    by_ep = {e: [t for t in ts if t["endpoint"] == e] for e in ("alpha", "beta")}
    before = _errors([t for v in by_ep.values() for t in v[:5]])  # planned with the prior
    # after 20 observations each; the p50 of 12 errors, not of 4 (a loaded CI host made the 4's
    # median 0.112 once, with two of the four at 0.07)
    after = _errors([t for v in by_ep.values() for t in v[20:]])
    assert all(t["planned_s"] == 10.0 for v in by_ep.values() for t in v[:5])
    # at least the slowdown's 50% off: the actual cold starts are wall time, which a loaded
    # host only lengthens (0.64 at a load of 18 on 2 cores), so the bound is one-sided
    assert quantile(before, 0.5) >= 0.45
    assert after and quantile(after, 0.5) <= 0.10, after
    # the live planner's model of these endpoints now carries the slow host's figure
    w = read_transition_windows(r, keys, ["alpha", "beta"], ["host-a", "host-b"])
    models = learned_endpoint_models(fleet, w, s.transition_min_observations, s.transition_quantile)
    assert models["alpha"].cold_start_s == pytest.approx(20.0, rel=0.1)


@pytest.mark.parametrize("learned", [False, True])
def test_observer_overrun_rule_uses_the_learned_duration(r, keys, settings, learned):
    """A host whose cold starts take 2× the fleet file's: with the prior every cold start
    overruns (an incident each time); once learned, none does."""
    fleet = _fleet(cold_start_s=60.0)
    s = dataclasses.replace(settings, simulated_slowdown="host-a=2")
    if learned:
        for _ in range(s.transition_min_observations):
            for op in transition_record_ops(keys, "alpha", "host-a", "cold_start", 120.0):
                getattr(r, op[0].lower())(*op[1:])
    swaps = Swaps(r, keys, s, fleet, "host-a")
    obs = Observer(r, keys, fleet, probe_interval_s=0.05, overrun_factor=1.5,
                   min_overrun_slack_s=0.0)  # the factor rule alone: 0.6 s planned against 1.2 s
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            obs.probe_once()
            stop.wait(0.05)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    try:
        swaps.job("alpha")  # 1.2 s of cold start against 0.6 s planned (prior) or 1.2 s (learned)
    finally:
        stop.set()
        t.join(5)
        obs.close()
    overruns = [i for i in list_incidents(r, keys) if i.get("failure_mode") == "transition_overrun"]
    assert (len(overruns) > 0) is (not learned), overruns


def test_makespan_transitions_prints_configured_learned_and_last(r, keys, settings, tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import FLEET_TOML

    for x in (70.0, 72.0, 71.0, 75.0, 73.0):
        for op in transition_record_ops(keys, "chat", "host-b", "wake", x / 8):
            getattr(r, op[0].lower())(*op[1:])
    env = {**os.environ, **settings.to_env()}
    out = subprocess.run([sys.executable, "-m", "makespan.cli", "transitions", "--fleet", FLEET_TOML, "--json"],
                         capture_output=True, text=True, env=env, timeout=60, check=True).stdout
    rows = {(x["endpoint"], x["kind"], x["host"]): x for x in map(json.loads, out.splitlines())}
    b = rows[("chat", "wake", "host-b")]
    assert (b["configured_s"], b["source"], b["observations"], b["last_s"]) == (8.0, "learned", 5, 9.125)
    assert b["learned_s"] == pytest.approx(quantile([x / 8 for x in (70, 72, 71, 75, 73)], 0.9), abs=1e-3)
    assert rows[("chat", "wake", "host-a")]["source"] == "others"
    assert rows[("coder", "cold_start", "*")]["source"] == "prior"
    assert ("coder", "wake", "*") not in rows  # no sleep mode: no wake row
    text = subprocess.run([sys.executable, "-m", "makespan.cli", "transitions", "--fleet", FLEET_TOML],
                          capture_output=True, text=True, env=env, timeout=60, check=True).stdout
    assert "configured_s" in text.splitlines()[0] and "learned_s" in text and "last_s" in text
