"""Health observer as its own process against real endpoint processes and Redis.

Probe interval 0.3 s; endpoint cold start 20 s × time_scale 0.01 = 0.2 s. "Within two
probe intervals" is checked in probe cycles (the incident's cycle minus the cycle of
the instance's last healthy probe), not in wall-clock seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from makespan.models import load_fleet
from makespan.workers.agenda import AgendaTracker, server_now_s
from makespan.workers.drivers import get_driver
from makespan.workers.drivers.registry import list_instances, register_instance, unregister_instance
from makespan.workers.observer import FAILURE_THRESHOLD, MIN_OVERRUN_SLACK_S, Observer, list_incidents
from tests.live import wait_for

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROBE_S = 0.3
FLEET = """
name = "obs"
[[hosts]]
name = "host-a"
gpu_count = 2
memory_mib = 81920
[endpoints.coder]
model = "coder-model"
memory_mib_per_gpu = 1000
cold_start_s = 20
evict_s = 1
set_point = [{ host = "host-a", gpus = [0] }]
[endpoints.coder.launch]
driver = "process"
"""


@pytest.fixture
def fleet_path(tmp_path):
    p = tmp_path / "fleet.toml"
    p.write_text(FLEET)
    return p


@pytest.fixture
def driver(tmp_path):
    return get_driver("process", log_dir=tmp_path, grace_s=2.0)


@pytest.fixture
def observer(redis_url, prefix, fleet_path, tmp_path, r, keys, driver):
    env = {**os.environ, "MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix,
           "MAKESPAN_LOG_DIR": str(tmp_path)}
    with open(tmp_path / "observer.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "makespan.workers.observer", "--fleet", str(fleet_path),
                                 "--probe-interval-s", str(PROBE_S), "--overrun-factor", "1.5"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    yield proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)  # bounds a hang only: a loaded host delays a clean shutdown by seconds
    for inst in list_instances(r, keys):  # instances the observer restarted
        driver.stop(inst)


def _cycle(r, keys) -> int:
    return int(r.hget(keys.observer, "cycle") or 0)


def _wait_cycles(r, keys, n: int, timeout_s: float = 60.0) -> int:  # a bound on a hang (a loaded machine)
    target = _cycle(r, keys) + n
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _cycle(r, keys) >= target:
            return target
        time.sleep(0.05)
    raise AssertionError(f"observer did not reach cycle {target}")


def _wait_recovered(r, keys, timeout_s: float = 60.0) -> list[dict]:  # a restarted endpoint process: seconds
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        incs = list_incidents(r, keys)
        if incs and all(i["recovery"] for i in incs if i["instance_id"]):
            return incs
        time.sleep(0.05)
    raise AssertionError(f"no recovered incident; incidents: {list_incidents(r, keys)}")


def _start(r, keys, fleet_path, driver):
    fleet = load_fleet(fleet_path)
    inst = driver.start(fleet.endpoints["coder"], ["GPU-host-a-0"], time_scale=0.01, host="host-a")
    register_instance(r, keys, inst)
    return inst


def test_killed_endpoint_raises_incident_and_recovers(r, keys, fleet_path, driver, observer):
    inst = _start(r, keys, fleet_path, driver)
    _wait_cycles(r, keys, 2)
    os.kill(inst.pid, signal.SIGKILL)
    inst.proc.wait()
    [inc] = _wait_recovered(r, keys)
    assert inc["endpoint"] == "coder" and inc["instance_id"] == inst.id
    assert inc["failure_mode"] in ("process_exited", "health_check_failed")
    assert int(inc["cycle"]) - int(inc["last_ok_cycle"]) <= 2  # within two probe intervals
    assert inc["agenda_context"] == [] and inc["gpus"] == ["GPU-host-a-0"]
    assert inc["recovery"]["outcome"] == "recovered"
    [new] = list_instances(r, keys)  # back at the set point: one coder on GPU 0
    assert new.id == inc["recovery"]["new_instance_id"] != inst.id
    assert new.gpus == ["GPU-host-a-0"] and new.endpoint == "coder"
    assert httpx.get(new.url + "/health", timeout=2).status_code == 200
    assert AgendaTracker(r, keys).count() == 0  # the RESTART_RECOVERY entry was completed


def test_no_incident_during_planned_eviction(r, keys, fleet_path, driver, observer):
    inst = _start(r, keys, fleet_path, driver)
    _wait_cycles(r, keys, 1)
    agenda = AgendaTracker(r, keys)
    with agenda.register("op-evict", "POSITIVE", ["coder"], inst.gpus, 30.0, lock_ttl_s=2.0):
        driver.stop(inst)  # the planned eviction
        _wait_cycles(r, keys, 3)  # the observer saw it down, under the entry, three times
        assert list_incidents(r, keys) == []
        restored = driver.start(load_fleet(fleet_path).endpoints["coder"], inst.gpus, 0.01, "host-a")
        pipe = r.pipeline()
        unregister_instance(r, keys, inst.id, pipe=pipe)
        register_instance(r, keys, restored, pipe=pipe)
        pipe.execute()
    _wait_cycles(r, keys, 2)
    assert list_incidents(r, keys) == []


def test_overrunning_transition_raises_incident_and_recovers(r, keys, fleet_path, driver, observer):
    inst = _start(r, keys, fleet_path, driver)
    agenda = AgendaTracker(r, keys)
    with agenda.register("op-slow", "POSITIVE", ["coder"], inst.gpus, 0.5, lock_ttl_s=2.0):
        driver.stop(inst)  # evicted, and the holder never restores it
        [inc] = _wait_recovered(r, keys)
    assert inc["failure_mode"] == "transition_overrun"
    assert [c["op_id"] for c in inc["agenda_context"]] == ["op-slow"]
    # late only past the slack's floor: 0.5 s planned, max(0.5 × 0.5 s, 2 s) of slack
    assert inc["detected_at"] > inc["agenda_context"][0]["planned_start"] + 0.5 + MIN_OVERRUN_SLACK_S
    assert inc["recovery"]["outcome"] == "recovered"
    [new] = list_instances(r, keys)
    assert httpx.get(new.url + "/health", timeout=2).status_code == 200


def test_overrun_slack_is_the_factor_with_a_floor_in_seconds(r, keys, fleet_path):
    """A transition is late past its expected end plus the larger of (factor − 1) × its
    planned length and the floor: the floor for a short (time-scaled) transition, whose
    holder a loaded host runs late by its scheduling jitter; the factor for a long one."""
    obs = Observer(r, keys, load_fleet(fleet_path), overrun_factor=1.5)
    short = {"planned_start": 1000.0, "expected_end": 1000.03}  # a 3 s cold start × time scale 0.01
    long = {"planned_start": 1000.0, "expected_end": 1060.0}
    assert obs.late_after(short) == pytest.approx(1000.03 + MIN_OVERRUN_SLACK_S)
    assert obs.late_after(long) == pytest.approx(1060.0 + 30.0)
    no_floor = Observer(r, keys, load_fleet(fleet_path), overrun_factor=1.5, min_overrun_slack_s=0.0)
    assert no_floor.late_after(short) == pytest.approx(1000.045)
    obs.close(), no_floor.close()


def test_overrun_without_instance_reported_once(r, keys, fleet_path):
    obs = Observer(r, keys, load_fleet(fleet_path), probe_interval_s=0.1, overrun_factor=1.5,
                   min_overrun_slack_s=0.0)
    agenda = AgendaTracker(r, keys)
    with agenda.register("op-on-time", "POSITIVE", ["coder"], ["GPU-host-a-0"], 30.0):
        assert obs.probe_once() == []  # within its 30 s
    with agenda.register("op-late", "POSITIVE", ["coder"], ["GPU-host-a-0"], 0.1) as entry:
        late_after = obs.late_after({"planned_start": entry.planned_start, "expected_end": entry.planned_start + 0.1})
        while server_now_s(r) <= late_after:  # past the overrun point on the Redis clock
            time.sleep(0.02)
        [inc] = obs.probe_once()
        assert inc["failure_mode"] == "transition_overrun" and inc["instance_id"] == ""
        assert inc["host"] == "host-a"  # from its GPUs (it was empty)
        assert obs.probe_once() == []  # once per operation
        assert list_incidents(r, keys)[0]["recovery"] is None  # pending while the transition runs
    assert obs.probe_once() == []  # the entry closed: the late transition ended
    obs.close()
    [listed] = list_incidents(r, keys)
    assert listed["recovery"]["outcome"] == "recovered: the late transition ended (its agenda entry closed)", listed
    assert listed["recovery"]["recovery_s"] >= 0.0  # it stayed pending for ever before


def test_overruns_reported_are_forgotten_once_their_entries_close(r, keys, fleet_path):
    """P:incidents:seen (the op ids already reported as overrunning) holds only the open
    entries: over many overrunning transitions that close it does not grow, and an open
    one is still reported once. Before, every op id stayed in it for ever. (found by a
    review, 2026-12-05; fails on the code before its fix)"""
    obs = Observer(r, keys, load_fleet(fleet_path), probe_interval_s=0.1, overrun_factor=1.0,
                   min_overrun_slack_s=0.0)  # late as soon as the Redis clock passes the expected end
    agenda = AgendaTracker(r, keys)
    reported = 0
    for rnd in range(20):
        entries = [agenda.register(f"op-{rnd}-{i}", "POSITIVE", ["coder"], ["GPU-host-a-0"], 0.0, heartbeat=False)
                   for i in range(10)]
        while server_now_s(r) <= max(e.expected_end for e in entries):  # a TIME tick at most
            time.sleep(0.001)
        raised = obs.probe_once()
        assert {i["failure_mode"] for i in raised} == {"transition_overrun"} and len(raised) == 10
        assert obs.probe_once() == []  # still open: once per operation
        assert r.hlen(keys.incidents_overruns) == 10, f"round {rnd}: {r.hlen(keys.incidents_overruns)} op ids kept"
        reported += len(raised)
        for e in entries:
            assert agenda.complete(e)
    assert reported == 200
    obs.probe_once()  # the cycle after the last closures
    assert r.hlen(keys.incidents_overruns) == 0
    assert all(i["recovery"] is not None for i in list_incidents(r, keys, count=1000))  # each one closed
    obs.close()


def test_positive_entry_on_other_gpus_does_not_hide_failure(r, keys, fleet_path, tmp_path):
    fleet = load_fleet(fleet_path)
    sim = get_driver("simulated")
    inst = sim.start(fleet.endpoints["coder"], ["GPU-host-a-0"], time_scale=0.0, host="host-a")
    inst.stopped = True  # a simulated instance that is down
    register_instance(r, keys, inst)
    obs = Observer(r, keys, fleet)
    with AgendaTracker(r, keys).register("op-other", "POSITIVE", ["coder"], ["GPU-host-a-1"], 30.0):
        # judged after FAILURE_THRESHOLD failed probes in a row, not at the first
        assert [obs.probe_once() for _ in range(FAILURE_THRESHOLD - 1)] == [[]] * (FAILURE_THRESHOLD - 1)
        [inc] = obs.probe_once()
    obs.close()
    assert inc["failure_mode"] == "health_check_failed"
    [rec] = list_incidents(r, keys)
    assert rec["recovery"]["outcome"] == "recovered"


def test_an_overrun_whose_holder_died_is_closed_as_such_not_as_recovered(r, keys, fleet_path):
    """A GPU worker SIGKILLed mid-transition: its agenda entry's lock expires and the reap
    deletes the entry. The observer read the closed entry as a transition that ended and
    wrote "recovered" (review, 2026-12-06)."""
    obs = Observer(r, keys, load_fleet(fleet_path), probe_interval_s=0.1, overrun_factor=1.0,
                   min_overrun_slack_s=0.0)
    agenda = AgendaTracker(r, keys)
    entry = agenda.register("op-dead", "POSITIVE", ["coder"], ["GPU-host-a-0"], 0.0, lock_ttl_s=0.3,
                            heartbeat=False)  # nobody renews its lock: a dead holder
    while server_now_s(r) <= entry.expected_end:
        time.sleep(0.001)
    [inc] = obs.probe_once()
    wait_for(lambda: not r.exists(agenda.lock_key("op-dead")), 5, "the entry's lock to expire")
    assert obs.probe_once() == []  # reaps the entry, then closes its incident
    obs.close()
    [listed] = list_incidents(r, keys)
    assert listed["incident_id"] == inc["incident_id"]
    assert listed["recovery"]["outcome"].startswith("closed: the transition did not finish: its holder stopped renewing"), listed
    assert r.hlen(keys.incidents_overruns) == 0


def test_a_probe_that_fails_now_and_then_restarts_nothing(r, keys, fleet_path):
    """One slow or failed probe of a live instance restarted a healthy set point (a driver
    author's report: a 1.5 s /health answer, then SIGTERM and a cold start of the model). An
    instance is judged after FAILURE_THRESHOLD failed probes in a row; a probe that passes
    in between starts the count again."""
    fleet = load_fleet(fleet_path)
    inst = get_driver("simulated").start(fleet.endpoints["coder"], ["GPU-host-a-0"], time_scale=0.0, host="host-a")
    register_instance(r, keys, inst)
    obs = Observer(r, keys, fleet, failure_threshold=3)
    answers = iter([False, False, True, False, False, True, False])
    obs._healthy = lambda _inst: next(answers)  # the probe's answers, as a loaded server gives them
    assert [obs.probe_once() for _ in range(7)] == [[]] * 7
    assert list_incidents(r, keys) == [] and obs.failed_probes == {inst.id: 1}
    obs._healthy = lambda _inst: False  # down for good: the third failure in a row is the incident
    assert obs.probe_once() == []
    [inc] = obs.probe_once()
    obs.close()
    assert inc["failure_mode"] == "health_check_failed" and inc["instance_id"] == inst.id
