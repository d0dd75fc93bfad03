"""A Redis that answers with an error, not with the data: a database number it does not
have (``SELECT`` at connect: ``DB index is out of range``), a key of another program
(``WRONGTYPE``). The CLI printed a traceback (exit 1), ``makespan.connect`` raised a raw
redis-py error, and the planner, observer and GPU worker idled or looped forever (a
new-user review, 2026-12-07; each case fails on the code before its fix). Now: one line
naming the URL and what to check, exit 2 for commands; a refusal for the processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

import makespan
from makespan.cli import app as cli_app
from makespan.errors import RedisConfigError, StoreError
from makespan.redis_conn import answer_refused, connect
from tests.conftest import FLEET_TOML

ROOT = Path(__file__).resolve().parents[2]


def _out_of_range_url(redis_url: str) -> str:
    return redis_url.rsplit("/", 1)[0] + "/99"  # a default Redis has databases 0-15


@pytest.mark.parametrize("args", [["jobs"], ["why", "0123abcd"], ["workload-status", "w1"], ["cancel", "--endpoint", "embed"], ["ready", "--timeout-s", "5"], ["incidents"], ["hosts"], ["status", "0123abcd"], ["result", "0123abcd"], ["submit", "--endpoint", "embed", "--service-s", "1"], ["submit-workload", "examples/synth.yaml"]])
def test_a_command_on_a_database_redis_does_not_have_says_so(redis_url, prefix, args):
    url = _out_of_range_url(redis_url)
    res = CliRunner().invoke(cli_app, args, env={"MAKESPAN_REDIS_URL": url, "MAKESPAN_KEY_PREFIX": prefix})
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert f"Redis at {url} answered with an error" in res.output and "DB index is out of range" in res.output
    assert "MAKESPAN_REDIS_URL" in res.output


def test_a_key_of_another_program_is_named_not_a_traceback(redis_url, prefix, r, keys):
    r.set(keys.queue("NORMAL"), "not a sorted set")  # another program's string where a queue should be
    res = CliRunner().invoke(cli_app, ["jobs"], env={"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix})
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "WRONGTYPE" in res.output and "MAKESPAN_KEY_PREFIX" in res.output


def test_connect_raises_a_makespan_error(redis_url):
    with pytest.raises(StoreError, match="DB index is out of range"):
        makespan.connect(_out_of_range_url(redis_url))


def test_answer_refused_tells_an_error_answer_from_an_outage(redis_url, refused_port):
    bad = connect(_out_of_range_url(redis_url))
    with pytest.raises(RedisConfigError, match="planner refuses to run"):
        answer_refused(bad, "planner")
    bad.close()
    down = connect(f"redis://127.0.0.1:{refused_port}/0")
    with pytest.raises(redis.ConnectionError):  # not answering: the caller waits, as before
        answer_refused(down, "planner")
    down.close()
    good = connect(redis_url)
    answer_refused(good, "planner")  # PONG: nothing
    good.close()


@pytest.mark.parametrize("command, exit_code", [("planner", 2), ("observer", 3)])
def test_the_processes_refuse_to_start_on_it(redis_url, prefix, command, exit_code):
    env = {"PATH": "/usr/bin:/bin", "MAKESPAN_REDIS_URL": _out_of_range_url(redis_url), "MAKESPAN_KEY_PREFIX": prefix}
    out = subprocess.run([sys.executable, "-m", "makespan.cli", command, "--fleet", FLEET_TOML], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == exit_code, out.stdout + out.stderr
    assert "refuses to run" in out.stderr and "DB index is out of range" in out.stderr, out.stderr


def test_a_published_fleet_key_that_is_not_a_fleet_is_named(redis_url, prefix, r, keys):
    """`makespan hosts` printed a JSONDecodeError traceback (exit 1) for another program's
    value at the fleet key (a verifier, 2026-12-07)."""
    r.set(keys.fleet, "x")
    res = CliRunner().invoke(cli_app, ["hosts"], env={"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix})
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert f"the published fleet ({keys.fleet}) is not a fleet" in res.output, res.output
