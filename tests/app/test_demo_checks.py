"""demo/replay fail fast: bad options before anything starts, a dead child while waiting."""

import time
from pathlib import Path

import pytest

from makespan.demo import DEMO_FLEET, run_demo
from makespan.errors import MakespanError, ValidationError
from makespan.live import LiveSystem
from makespan.models import load_fleet


@pytest.mark.parametrize("kw, field", [({"policy": "bogus"}, "--policy"), ({"n_jobs": 0}, "--jobs"),
                                       ({"report_path": "/proc/no-such-dir/r.json"}, "--report"),
                                       ({"report_path": "."}, "--report")])
def test_demo_rejects_bad_options_before_starting(tmp_path, kw, field):
    t0 = time.monotonic()
    with pytest.raises(ValidationError) as e:
        run_demo(**{"report_path": tmp_path / "r.json", "run_dir": tmp_path / "run", **kw})
    assert e.value.field == field
    assert not (tmp_path / "run").exists()  # nothing was started: no run directory, no processes
    assert time.monotonic() - t0 < 30


def test_check_alive_names_a_dead_child(r, settings, tmp_path):
    """A child that exits (here a planner given a fleet file that does not exist) is
    named by check_alive with its exit code and the last line of its log."""
    fleet = load_fleet(DEMO_FLEET)
    sys_ = LiveSystem(DEMO_FLEET, fleet, settings, tmp_path / "logs", observer=False)
    try:
        sys_.check_alive()  # nothing started: nothing dead
        p = sys_._spawn("planner-0", ["planner", "--fleet", str(tmp_path / "missing.toml")])
        p.popen.wait(timeout=60)
        with pytest.raises(MakespanError, match=r"planner-0 exited with code [1-9]\d*: .*missing\.toml"):
            sys_.check_alive()
    finally:
        sys_.stop()


def test_demo_summary_says_its_times_are_workload_seconds(tmp_path, monkeypatch):
    """The demo's summary prints the report's times, which are workload seconds, while
    ``makespan report`` prints wall seconds: each time carries its unit and the time scale
    that converts them. Before, the waits read "(s)" beside a wall time in s. (found by a
    new-user trial, 2026-12-05; fails on the code before its fix)"""
    from makespan import demo

    rep = {"policy": "portfolio", "gpus": 8, "time_scale": 0.002,
           "jobs": {"submitted": 3, "completed": 3, "failed": 0, "rejected": 0},
           "weighted_completion_s": 5400.0, "makespan_s": 1800.0, "utilization": 0.5,
           "idle_while_queued_gpu_s": 120.0, "transitions": 4, "best_over_lower_bound": 1.2,
           "wait_s": {"HIGH": {"p50": 30.0, "p95": 90.0}, "LOW": {"p50": None, "p95": None}},
           "set_point_absent_gpu_s": 60.0, "drain": "ok", "planner": "ok", "wall_s": 12.5}
    monkeypatch.setattr(demo.console, "width", 80)  # a terminal's: no line wraps
    with demo.console.capture() as cap:
        demo._print_summary(rep, tmp_path, None)
    lines = {line.split(" ")[0]: line for line in cap.get().splitlines() if line}
    assert lines["waits"] == "waits p50/p95 (workload s): HIGH 30/90"
    assert lines["weighted"] == "weighted completion 5400 workload s·w   makespan 1800 workload s"
    assert lines["utilization"] == "utilization 50.0%   idle-while-queued 120 GPU·workload s"
    assert lines["times"] == "times below in workload s (1 = 0.002 wall s); `makespan report` prints wall s"
    assert lines["set"] == "set points absent 60 GPU·workload s"
    assert "wall time 12.5 s" in lines["drain"]


@pytest.mark.parametrize("args, report", [([], "report.json"), (["--run-dir", "runs/x"], None),
                                          (["--run-dir", "runs/x", "--report", "r.json"], "r.json")])
def test_demo_writes_a_second_report_only_without_a_run_dir_or_when_asked(monkeypatch, args, report):
    """``makespan demo --run-dir D`` writes its report in D only; before, it also wrote
    ./report.json whatever --run-dir said (found by a new-user trial). Without --run-dir the
    report lands in ./report.json as before; --report asks for a copy wherever."""
    from typer.testing import CliRunner

    import makespan.demo
    from makespan.cli import app as cli_app

    seen = {}

    def fake_run_demo(**kw):
        seen.update(kw)
        return {"jobs": {"completed": 1, "submitted": 1}}

    monkeypatch.setattr(makespan.demo, "run_demo", fake_run_demo)
    res = CliRunner().invoke(cli_app, ["demo", *args])
    assert res.exit_code == 0, res.output
    assert seen["report_path"] == (None if report is None else Path(report))
