"""Simulator smoke on a real trace window, and its invariants."""

import json

import pytest

from app.models import parse_fleet
from app.traces import read_trace
from planner.simulator import run_simulation, simulate
FLEET = {
    "name": "t",
    "hosts": [{"name": "a", "gpu_count": 4, "memory_mib": 81920}, {"name": "b", "gpu_count": 4, "memory_mib": 81920}],
    "endpoints": {
        "m1": {"model": "x", "memory_mib_per_gpu": 1000, "cold_start_s": 45, "set_point": [{"host": "a", "gpus": [0]}]},
        "m2": {"model": "y", "memory_mib_per_gpu": 1000, "cold_start_s": 120, "wake_s": 10},
        "m3": {"model": "z", "memory_mib_per_gpu": 1000, "cold_start_s": 200},
        "g2": {"model": "w", "tensor_parallel": 2, "memory_mib_per_gpu": 1000, "cold_start_s": 90},
    },
}


@pytest.fixture(scope="module")
def itp(traces):
    return str(traces / "msft-itp-2021" / "cluster02.csv")


@pytest.fixture(scope="module")
def fleet():
    return parse_fleet(FLEET)


@pytest.mark.parametrize("policy", ["fifo", "portfolio"])
def test_simulate_trace_window(itp, fleet, policy):
    jobs = read_trace(itp, fleet, seed=1, start=2000, limit=80)
    rep = simulate(jobs, fleet, policy, seed=1, time_scale=20)
    assert rep["jobs"]["submitted"] == 80 and rep["jobs"]["completed"] == 80
    assert rep["makespan_s"] >= rep["lower_bounds"]["makespan_s"] - 1e-6
    assert rep["weighted_completion_s"] >= rep["lower_bounds"]["weighted_completion_s"] - 1e-6
    assert rep["best_over_lower_bound"] >= 1.0
    assert 0 < rep["utilization"] <= 1.0
    assert rep["planner"]["batches"] > 0
    # every job waited at least 0 and the wait quantiles are ordered
    for lvl in rep["wait_s"].values():
        if lvl["p50"] is not None:
            assert 0 <= lvl["p50"] <= lvl["p95"]


def test_run_simulation_writes_report(itp, tmp_path, fleet):
    f = tmp_path / "fleet.toml"
    f.write_text('''name = "t"
[[hosts]]
name = "a"
gpu_count = 2
memory_mib = 1000
[endpoints.e]
model = "x"
memory_mib_per_gpu = 500
cold_start_s = 30
''')
    out = tmp_path / "r.json"
    rep = run_simulation(itp, f, "wspt", seed=0, start=0, limit=20, report_path=out, time_scale=10)
    assert json.loads(out.read_text())["weighted_completion_s"] == pytest.approx(rep["weighted_completion_s"])
    # one endpoint, cold once per GPU at most
    assert rep["transitions"]["cold_start"] <= 2


@pytest.mark.parametrize("flags", [[], ["--no-preemption", "--no-restore"]])
def test_cli_simulate_preemption_and_restore_flags(itp, tmp_path, flags):
    from typer.testing import CliRunner

    from app.cli import app as cli_app

    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli_app, ["simulate", itp, "--fleet", "examples/render-pipeline.toml", "--limit", "60",
                                       "--report", str(out), *flags])
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    on = not flags
    assert rep["sim"]["preemption"] is on and rep["sim"]["restore"] is on
    assert rep["jobs"]["completed"] == 60
    if not on:
        assert rep["jobs"]["preempted"] == 0 and rep["transitions"]["restore"] == 0
    else:  # this window's CRITICAL/HIGH jobs arrive behind long lower-level jobs
        assert rep["jobs"]["preempted"] > 0 and rep["transitions"]["restore"] > 0
