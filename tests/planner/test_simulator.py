"""Simulator smoke on a real trace window, and its invariants."""

import json

import pytest

from makespan.models import parse_fleet
from makespan.traces import read_trace
from makespan.planner.simulator import simulate
from makespan.simulation import run_simulation

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

    from makespan.cli import app as cli_app

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


@pytest.mark.parametrize("args,field", [
    (["--limit", "0"], "limit"), (["--limit", "-3"], "limit"), (["--start", "-1"], "start"),
    (["--start", "999999999"], "no rows from row 999999999"), (["--time-scale", "0"], "time_scale"),
    (["--time-limit-s", "0"], "time_limit_s"), (["--policy", "bogus"], "unknown policy"),
    (["--set-point-weight", "-1"], "set_point_weight"), (["--set-point-weight", "inf"], "set_point_weight"),
])
def test_cli_simulate_bad_input_is_one_clear_line(itp, tmp_path, args, field):
    from typer.testing import CliRunner

    from makespan.cli import app as cli_app

    out = tmp_path / "sub" / "r.json"
    res = CliRunner().invoke(cli_app, ["simulate", itp, "--fleet", "examples/render-pipeline.toml",
                                       "--report", str(out), *args])
    assert res.exit_code == 2, res.output
    assert field in res.output and "Traceback" not in res.output
    assert not out.exists()


def test_cli_simulate_set_point_weight_reaches_the_simulator(itp, tmp_path):
    from typer.testing import CliRunner

    from makespan.cli import app as cli_app

    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli_app, ["simulate", itp, "--fleet", "examples/render-pipeline.toml", "--limit", "20",
                                       "--set-point-weight", "2.5", "--report", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["sim"]["set_point_weight"] == 2.5


def test_cli_simulate_prewarm_reaches_the_simulator(itp, tmp_path):
    from typer.testing import CliRunner

    from makespan.cli import app as cli_app

    for flag, on in (("--prewarm", True), ("--no-prewarm", False)):
        out = tmp_path / f"r{flag}.json"
        res = CliRunner().invoke(cli_app, ["simulate", itp, "--fleet", "examples/render-pipeline.toml", "--limit", "20",
                                           flag, "--report", str(out)])
        assert res.exit_code == 0, res.output
        rep = json.loads(out.read_text())
        assert rep["sim"]["prewarm"] is on and "prewarm" in rep["transitions"]


def test_cli_simulate_bad_report_path_fails_before_the_run(itp, tmp_path):
    from typer.testing import CliRunner

    from makespan.cli import app as cli_app

    (tmp_path / "afile").write_text("")
    for bad, why in [(tmp_path / "afile" / "r.json", "cannot be written"), (tmp_path, "is a folder")]:
        res = CliRunner().invoke(cli_app, ["simulate", itp, "--fleet", "examples/render-pipeline.toml",
                                           "--limit", "20", "--report", str(bad)])
        assert res.exit_code == 2 and why in res.output, res.output
        assert '"weighted_completion_s"' not in res.output  # failed before simulating
    res = CliRunner().invoke(cli_app, ["simulate", str(tmp_path), "--fleet", "examples/render-pipeline.toml"])
    assert res.exit_code == 2 and "not a file" in res.output


def test_cli_simulate_time_scale_and_limit_reach_the_simulator(itp, tmp_path):
    from typer.testing import CliRunner

    from makespan.cli import app as cli_app

    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli_app, ["simulate", itp, "--fleet", "examples/render-pipeline.toml", "--limit", "30",
                                       "--policy", "default", "--time-limit-s", "0.02", "--time-scale", "20",
                                       "--report", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    assert rep["sim"]["time_scale"] == 20.0 and rep["jobs"]["completed"] == 30
    assert rep["sim"]["time_limit_s"] == 0.02
