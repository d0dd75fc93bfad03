"""MAKESPAN_LOG_FORMAT: one log format for every process (an SRE found three: the planner's,
the observer's with the level and logger swapped, Celery's without a logger; local times
without an offset; no process id; no JSON)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.live import LiveSystem
from makespan.log_format import configure
from makespan.models import load_fleet
from makespan.producer import Producer
from tests.live import stop_checked, wait_for

FLEET = Path("examples/render-pipeline.toml").resolve()
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+ \[pid \d+\]: ")


@pytest.fixture
def restore_root_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_text_and_json_lines(capsys, restore_root_logging):
    configure("INFO", "text")
    logging.getLogger("makespan.planner").info("leads %s", "pool a")
    line = capsys.readouterr().err.strip()
    assert TEXT_LINE.match(line) and line.endswith("INFO makespan.planner [pid " + line.split("[pid ")[1]), line
    configure("INFO", "json")
    try:
        raise ValueError("bad row")
    except ValueError:
        logging.getLogger("makespan.phases").exception("job %s failed", "j1")
    record = json.loads(capsys.readouterr().err.strip())
    assert record["level"] == "ERROR" and record["logger"] == "makespan.phases" and record["message"] == "job j1 failed"
    assert record["time"].endswith("Z") and isinstance(record["pid"], int) and "ValueError: bad row" in record["exc_info"]


@pytest.mark.parametrize("command", [["planner", "--fleet", str(FLEET)], ["gpu-worker", "--fleet", str(FLEET),
                                                                          "--host", "render-a"]])
def test_an_unknown_log_format_fails_the_command_in_one_line(command, redis_url, prefix):
    res = CliRunner().invoke(cli_app, command, env={"MAKESPAN_LOG_FORMAT": "yaml", "MAKESPAN_REDIS_URL": redis_url,
                                                    "MAKESPAN_KEY_PREFIX": prefix})
    assert res.exit_code == 2 and "MAKESPAN_LOG_FORMAT" in res.output and "text, json" in res.output, res.output


def test_every_process_logs_json_lines(settings, r, keys, tmp_path):
    """Planner, GPU workers (Celery's own lines and makespan's, a library warning, the start-up
    summary and the SIGTERM notice) and observer, with MAKESPAN_LOG_FORMAT=json: every line is
    a JSON object with the five fields, but Celery's own ``worker: Warm shutdown`` notice (a
    new user found the banner, the start-up line and the signal notice in text)."""
    fleet = load_fleet(FLEET)
    system = LiveSystem(FLEET, fleet, settings, tmp_path / "logs",
                        extra_env={"MAKESPAN_LOG_FORMAT": "json", "MAKESPAN_LOG_LEVEL": "INFO"})
    system.start()
    try:
        job = Producer(r, keys, fleet, settings).submit({"endpoint": next(iter(fleet.endpoints)), "service_s": 1}).id
        wait_for(lambda: r.hget(keys.job(job), "state") == "completed", 60, "the job to complete")
    finally:
        stop_checked(system)
    loggers: dict[str, set[str]] = {}
    for proc in system.procs:
        for line in proc.log_path.read_text().splitlines():
            if not line.strip() or line == "worker: Warm shutdown (MainProcess)":
                continue
            record = json.loads(line)
            assert {"time", "level", "logger", "pid", "message"} <= set(record), line
            loggers.setdefault(proc.name.split("-")[0], set()).add(record["logger"])
    assert "makespan.planner" in loggers["planner"], loggers
    assert any(name.startswith("celery") for name in loggers["gpu"]), loggers  # Celery's own lines too
    assert any(name.startswith("makespan") for name in loggers["observer"]), loggers
    assert "makespan.gpu_worker" in loggers["gpu"], loggers  # its start-up summary


def test_a_signal_notice_follows_the_log_format(monkeypatch):
    from makespan.log_format import as_line

    monkeypatch.setenv("MAKESPAN_LOG_FORMAT", "json")
    record = json.loads(as_line("makespan planner: SIGTERM; ending within 20 s", logger="makespan.shutdown"))
    assert record["logger"] == "makespan.shutdown" and record["message"].startswith("makespan planner: SIGTERM")
    monkeypatch.setenv("MAKESPAN_LOG_FORMAT", "text")
    assert as_line("plain") == "plain"
