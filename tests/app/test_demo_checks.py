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


def _children(pid: int) -> list[int]:
    import subprocess

    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _running(pid: int) -> bool:
    """Alive and not a zombie (a child whose parent died is reparented; this machine's
    init may not reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_sigtermed_demo_stops_its_processes_and_its_embedded_redis(tmp_path):
    """``makespan demo`` stopped with SIGTERM (``timeout``, a CI cancel, ``kill``) died at
    once and left its planner, GPU workers, observer and the redis-server it started for
    itself running, each in a session of its own: SIGTERM now ends the run as Ctrl-C does
    (everything stopped, exit code 143). The demo starts its own Redis here: its URL names
    a port where nothing listens."""
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "MAKESPAN_REDIS_URL": "redis://127.0.0.1:1/0", "MAKESPAN_SHUTDOWN_GRACE_S": "15"}
    demo = subprocess.Popen([sys.executable, "-m", "makespan.cli", "demo", "--jobs", "5", "--run-dir",
                             str(tmp_path / "run"), "--report", str(tmp_path / "r.json")], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and demo.poll() is None:  # its redis-server, 2 GPU workers, planner, observer
            started |= set(_children(demo.pid))
            if len(started) >= 5 and (tmp_path / "run" / "logs" / "planner-0.log").exists():
                break
            time.sleep(0.2)
        assert demo.poll() is None and len(started) >= 5, demo.stderr.read().decode()[-2000:] if demo.poll() else started
        time.sleep(1.0)
        started |= set(_children(demo.pid))
        demo.send_signal(signal.SIGTERM)
        code = demo.wait(timeout=60)
        gone_by = time.monotonic() + 30
        while time.monotonic() < gone_by and any(_running(p) for p in started):
            time.sleep(0.2)
        left = [p for p in started if _running(p)]
        assert left == [], f"still running after the demo ended (exit {code}): {left}"
        assert code == 128 + signal.SIGTERM
    finally:
        for p in [demo.pid, *started]:
            if _running(p):
                try:
                    os.killpg(p, signal.SIGKILL)  # each child leads its own session
                except (ProcessLookupError, PermissionError):
                    pass


def test_demo_refuses_a_redis_that_refuses_its_password_instead_of_starting_its_own(tmp_path):
    """A Redis that answers but refuses the URL's credentials was taken for no Redis: the
    demo printed "none answered" and ran on an embedded redis-server, the user's Redis (and
    their wrong MAKESPAN_REDIS_URL) silently passed over. Now it fails with
    RedisAuthFailed's message, the password hidden; a port where nothing listens still
    gets an embedded Redis."""
    import subprocess

    from makespan import demo
    from makespan.errors import RedisAuthFailed
    from makespan.redis_conn import free_port, ping, redis_server_binary

    port = free_port()
    srv = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no", "--requirepass", "right-one", "--dir", str(tmp_path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = []
    try:
        deadline = time.monotonic() + 10
        while not ping(f"redis://:right-one@127.0.0.1:{port}/0") and time.monotonic() < deadline:
            time.sleep(0.05)
        for url in (f"redis://:wrong-one@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
            try:
                got = demo._redis(url)
            except RedisAuthFailed as e:
                assert "wrong-one" not in str(e)
                continue
            started.append(got[1])
            pytest.fail(f"{url}: refused credentials, yet the demo went on with {got[0]}")
        url, emb = demo._redis(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens: its own
        started.append(emb)
        assert emb is not None and url == emb.url and ping(url)
    finally:
        for emb in started:
            if emb is not None:
                emb.stop()
        srv.terminate()
        srv.wait(timeout=10)


def test_a_report_path_is_checked_not_created_and_written_whole(tmp_path):
    """The report path was opened for append before the run: a simulate interrupted by
    SIGINT left a 0-byte report (a new path) or the previous run's report looking current.
    It is checked without being created, and written whole at the end (a temporary file
    renamed over it)."""
    import json
    import os

    import pytest

    from makespan.errors import ValidationError
    from makespan.planner.simulator import writable_report_path, write_report

    fresh = tmp_path / "runs" / "report.json"
    assert writable_report_path(fresh) == fresh and not fresh.exists() and fresh.parent.is_dir()
    write_report(fresh, {"jobs": 1})
    assert json.loads(fresh.read_text()) == {"jobs": 1} and os.listdir(fresh.parent) == ["report.json"]
    with pytest.raises(ValidationError, match="is a folder"):
        writable_report_path(tmp_path)
    if os.getuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        with pytest.raises(ValidationError, match="cannot be written"):
            writable_report_path(locked / "report.json")
