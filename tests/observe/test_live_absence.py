"""Set-point absence in the live report (app/run_report.py), from a run's events."""

import pytest

from makespan.models import parse_fleet
from makespan.run_report import live_report, residency_from_run
from makespan.planner.restore import set_point_absence, set_point_groups
from makespan.planner.simulator import fleet_state

FLEET = parse_fleet({
    "name": "t",
    "hosts": [{"name": "a", "gpu_count": 2, "memory_mib": 81920}],
    "endpoints": {
        "m1": {"model": "x", "memory_mib_per_gpu": 1000, "cold_start_s": 45, "set_point": [{"host": "a", "gpus": [0]}]},
        "m3": {"model": "z", "memory_mib_per_gpu": 1000, "cold_start_s": 20},
    },
})
G0, G1 = FLEET.gpu_uuids()


def _events(t0=1000.0):
    """j1 (m3) evicts the set point m1 on GPU 0 at +10 s, loads until +30 s, runs to +50 s;
    the restore runs +50…+95 s. j2 (m3) cold-starts on GPU 1 (no set point there)."""
    return [
        {"ts": t0 + 10, "kind": "leased", "lease": "L1", "job": "j1", "gpus": [G0]},
        {"ts": t0 + 12, "kind": "phase_end", "lease": "L1", "job": "j1", "phase": "evict", "evicted": ["m1"],
         "planned_s": 2, "gpus": [G0], "endpoint": "m3"},
        {"ts": t0 + 30, "kind": "phase_end", "lease": "L1", "job": "j1", "phase": "start_endpoint",
         "planned_s": 18, "gpus": [G0], "endpoint": "m3"},
        {"ts": t0 + 30, "kind": "phase_start", "lease": "L1", "job": "j1", "phase": "execute", "gpus": [G0]},
        {"ts": t0 + 50, "kind": "phase_end", "lease": "L1", "job": "j1", "phase": "execute", "gpus": [G0]},
        {"ts": t0 + 50, "kind": "restore_start", "lease": "R1", "gpus": [G0], "endpoint": "m1"},
        {"ts": t0 + 95, "kind": "restore_end", "lease": "R1", "gpus": [G0], "endpoint": "m1"},
        {"ts": t0 + 20, "kind": "leased", "lease": "L2", "job": "j2", "gpus": [G1]},
        {"ts": t0 + 40, "kind": "phase_end", "lease": "L2", "job": "j2", "phase": "start_endpoint",
         "planned_s": 20, "gpus": [G1], "endpoint": "m3"},
    ]


def test_residency_and_absence_from_events():
    res = residency_from_run(_events(), time_scale=2.0, t0=1000.0)
    assert res[G0][0] == (5.0, None) and res[G0][-1] == (47.5, "m1")
    state = fleet_state(FLEET)
    absent = set_point_absence(res, set_point_groups(state), state.resident, 0.0, 60.0)
    assert absent == pytest.approx(47.5 - 5.0)  # GPU 1 holds no set point: it never counts


def test_live_report_states_the_absence(r, keys):
    for j, sub in (("j1", 1000.0), ("j2", 1000.0)):
        r.hset(keys.job(j), mapping={"id": j, "endpoint": "m3", "priority": "NORMAL", "state": "completed",
                                     "submitted_at": sub, "finished_at": 1050.0, "service_s": 20.0,
                                     "lease": "L1" if j == "j1" else "L2"})
    rep = live_report(r, keys, FLEET, _events(), ["j1", "j2"], time_scale=1.0, policy="default")
    assert rep["set_point_absent_gpu_s"] == pytest.approx(95.0 - 10.0)
