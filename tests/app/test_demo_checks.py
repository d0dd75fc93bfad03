"""demo/replay fail fast: bad options before anything starts, a dead child while waiting."""

import time

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
