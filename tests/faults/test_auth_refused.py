"""Refused credentials and unreachable Sentinels, as the long-running processes and the
client report them (a new user's trial).

Before: ``makespan planner``, ``makespan gpu-worker`` and the observer waited forever on
credentials Redis (or its Sentinels) refused, the planner printing "standing by: Redis
unavailable: No master found for 'x' : <redis.client.Redis(...1.5 KB of repr...)>" and the
GPU worker that repr again on every Celery reconnect; an unreachable Sentinel read as
"No master found", as a wrong service name did; and a wrong data password through Sentinel
got the advice in the plain ``redis://`` form.

Now each process exits non-zero at start with :class:`makespan.errors.RedisAuthFailed`'s one
line (naming ``?sentinel_password=`` where the Sentinels refused), credentials refused
after Redis accepted them once (a password rotated while running) are logged at ERROR as
that line and retried (docs/security.md), and no message holds a client's repr or a
password. Each test runs its own redis-server / redis-sentinel processes on free ports.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import makespan
from bench.chaos_redis import SENTINEL_SERVICE, SentinelSet, sentinel_binary
from makespan.celery_app import create_celery
from makespan.cli import app as cli_app
from makespan.errors import RedisAuthFailed, RedisUnreachable, StoreError
from makespan.models import load_fleet
from makespan.redis_conn import EXIT_REFUSED, connect, start_embedded
from makespan.workers.planner_worker import PlannerWorker
from tests.conftest import FLEET_TOML
from tests.faults.private_redis import ONE_HOST, fault_settings, write_fleet
from tests.live import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXIT_TIMEOUT_S = 90  # a refusing process ends long before this; it only stops a hang
DATA_PASSWORD, SENTINEL_PASSWORD = "data-pw-r7", "sentinel-pw-r7"
PREFIX = "auth-refused"
REPR = "<redis."  # the start of redis-py's client repr


@pytest.fixture(scope="module")
def sset():
    """A Sentinel set whose data nodes and Sentinels each have a password of their own."""
    if not sentinel_binary():
        pytest.skip("needs redis-server (or redis-sentinel)")
    try:
        s = SentinelSet(password=DATA_PASSWORD, sentinel_password=SENTINEL_PASSWORD)
    except StoreError:  # a port free_port() chose was taken meanwhile: fresh ports
        s = SentinelSet(password=DATA_PASSWORD, sentinel_password=SENTINEL_PASSWORD)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def password_redis():
    """A private redis-server with ``requirepass``; (the server, its URL with the password)."""
    emb = start_embedded()
    try:
        connect(emb.url).config_set("requirepass", DATA_PASSWORD)
        yield emb, emb.url.replace("redis://", f"redis://:{DATA_PASSWORD}@")
    finally:
        emb.stop()


def _assert_clean(text: str) -> None:
    assert REPR not in text, text[-3000:]
    assert DATA_PASSWORD not in text and SENTINEL_PASSWORD not in text, text[-3000:]


def _run(kind: str, url: str, fleet: Path) -> subprocess.CompletedProcess:
    argv = {"planner": [sys.executable, "-m", "makespan.cli", "planner", "--fleet", str(fleet)],
            "gpu-worker": [sys.executable, "-m", "makespan.cli", "gpu-worker", "--fleet", str(fleet), "--host", "h1",
                           "--pool", "solo"],
            "observer": [sys.executable, "-m", "makespan.workers.observer", "--fleet", str(fleet)]}[kind]
    env = {**os.environ, "MAKESPAN_REDIS_URL": url, "MAKESPAN_KEY_PREFIX": PREFIX,
           "MAKESPAN_REDIS_CONNECT_TIMEOUT_S": "1"}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=EXIT_TIMEOUT_S, cwd=ROOT)


@pytest.mark.parametrize("kind", ["planner", "gpu-worker", "observer"])
def test_a_process_exits_at_start_when_the_sentinels_refuse_their_auth(kind, sset, tmp_path):
    """The URL lacks ``?sentinel_password=``: one line naming it, exit non-zero, no repr."""
    fleet, _ = write_fleet(tmp_path, ONE_HOST)
    try:
        p = _run(kind, sset.url, fleet)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{kind} did not exit on refused credentials: {str(e.stderr)[-2000:]}")
    out = p.stdout + p.stderr
    assert p.returncode == (2 if kind == "planner" else EXIT_REFUSED), out[-3000:]
    assert out.count("refused the credentials") == 1 and "?sentinel_password=" in out, out[-3000:]
    _assert_clean(out)


@pytest.mark.parametrize("kind", ["planner", "gpu-worker", "observer"])
def test_a_process_exits_at_start_on_a_wrong_data_password(kind, password_redis, tmp_path):
    _emb, url = password_redis
    fleet, _ = write_fleet(tmp_path, ONE_HOST)
    try:
        p = _run(kind, url.replace(DATA_PASSWORD, "wrong-pw-r7"), fleet)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{kind} did not exit on refused credentials: {str(e.stderr)[-2000:]}")
    out = p.stdout + p.stderr
    assert p.returncode == (2 if kind == "planner" else EXIT_REFUSED), out[-3000:]
    assert out.count("refused the credentials") == 1 and "redis://[USER]:PASSWORD@HOST" in out, out[-3000:]
    assert "wrong-pw-r7" not in out
    _assert_clean(out)


def test_a_planner_whose_password_is_rotated_while_it_runs_logs_it_and_recovers(password_redis, caplog):
    """Refused after Redis accepted the planner once: logged at ERROR as RedisAuthFailed's
    line (no password), retried, and the planner leads again once the password is back."""
    emb, url = password_redis
    admin = connect(url)
    settings = fault_settings(url, f"{PREFIX}-rotate")
    w = PlannerWorker(connect(url, settings=settings), settings, load_fleet(FLEET_TOML))
    raised: list[BaseException] = []

    def body():
        try:
            w.run()
        except BaseException as e:  # noqa: BLE001 - reported below
            raised.append(e)

    t = threading.Thread(target=body, daemon=True)
    with caplog.at_level(logging.INFO, logger="makespan"):
        t.start()
        try:
            wait_for(lambda: admin.get(w.keys.planner_leader) is not None, 60, "the planner to lead")
            admin.config_set("requirepass", "rotated-pw-r7")
            admin.client_kill_filter(_type="normal", skipme=True)  # its connections must log in again
            wait_for(lambda: any("refused the credentials" in r.getMessage() and r.levelno == logging.ERROR
                                 for r in caplog.records), 60, "the refusal to be logged")
            assert t.is_alive() and not raised, raised  # it rides the refusal out
            connect(url.replace(DATA_PASSWORD, "rotated-pw-r7")).config_set("requirepass", DATA_PASSWORD)
            admin = connect(url)
            wait_for(lambda: any("answers again" in r.getMessage() for r in caplog.records), 60,
                     "the planner to see Redis accept it again")
            wait_for(lambda: admin.get(w.keys.planner_leader) is not None, 60, "the planner to lead again")
        finally:
            w.stop()
            t.join(30)
            for key in admin.scan_iter(f"{PREFIX}-rotate:*"):
                admin.delete(key)
    assert not raised, raised
    _assert_clean(caplog.text)
    assert "rotated-pw-r7" not in caplog.text


def test_an_unreachable_sentinel_is_told_from_a_wrong_service_name(sset, refused_port):
    nobody = f"redis+sentinel://:{DATA_PASSWORD}@127.0.0.1:{refused_port}/numaster/0"
    with pytest.raises(RedisUnreachable) as err:
        makespan.connect(nobody, key_prefix=PREFIX)
    text = str(err.value)
    assert f"no Sentinel answered at 127.0.0.1:{nobody.split(':')[3].split('/')[0]}" in text, text
    assert "Connection refused" in text and "No master found" not in text
    wrong_name = sset.url_with(query=f"sentinel_password={SENTINEL_PASSWORD}").replace(f"/{SENTINEL_SERVICE}/",
                                                                                        "/numaster/")
    with pytest.raises(RedisUnreachable) as err:
        makespan.connect(wrong_name, key_prefix=PREFIX)
    text = str(err.value)
    assert "know no master named 'numaster'" in text and f"only '{SENTINEL_SERVICE}'" in text, text
    assert "no Sentinel answered" not in text and "/SERVICE/DB" in text
    _assert_clean(text)


def test_the_cli_and_the_broker_say_no_sentinel_answered_without_a_repr(caplog, refused_port):
    """``makespan status`` and Celery's broker connection (what a GPU worker logs on each
    reconnect) on a Sentinel nobody listens at."""
    url = f"redis+sentinel://:{DATA_PASSWORD}@127.0.0.1:{refused_port}/numaster/0"
    status = CliRunner().invoke(cli_app, ["status", "some-job"],
                                env={"MAKESPAN_REDIS_URL": url, "MAKESPAN_KEY_PREFIX": PREFIX})
    assert status.exit_code == 69 and "no Sentinel answered at 127.0.0.1:" in status.output, status.output
    _assert_clean(status.output)
    app = create_celery(fault_settings(url, PREFIX))
    with app.connection_for_write() as conn:
        with pytest.raises(Exception) as err:  # noqa: PT011 - kombu may wrap it
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
    assert "no Sentinel answered at 127.0.0.1:" in str(err.value), str(err.value)[:3000]
    _assert_clean(str(err.value))


def test_a_planner_standing_by_on_an_unreachable_sentinel_logs_no_repr(caplog, refused_port):
    """An outage (nothing listens) is ridden out as before, in lines without a repr."""
    url = f"redis+sentinel://:{DATA_PASSWORD}@127.0.0.1:{refused_port}/numaster/0"
    settings = fault_settings(url, PREFIX)
    w = PlannerWorker(connect(url, settings=settings), settings, load_fleet(FLEET_TOML))
    t = threading.Thread(target=w.run, daemon=True)
    with caplog.at_level(logging.WARNING, logger="makespan"):
        t.start()
        try:
            wait_for(lambda: "standing by: Redis unavailable" in caplog.text, 60, "the outage to be logged")
            time.sleep(0.5)
            assert t.is_alive()
        finally:
            w.stop()
            t.join(30)
    assert "no Sentinel answered at 127.0.0.1:" in caplog.text, caplog.text[-3000:]
    _assert_clean(caplog.text)


def test_a_wrong_data_password_through_sentinel_gets_the_sentinel_url_form(sset):
    url = sset.url_with(userinfo=":wrong-pw-r7", query=f"sentinel_password={SENTINEL_PASSWORD}")
    with pytest.raises(RedisAuthFailed) as err:
        makespan.connect(url, key_prefix=PREFIX)
    text = str(err.value)
    assert "redis+sentinel://[USER]:PASSWORD@S1:PORT,.../SERVICE/DB" in text, text
    assert "redis://[USER]" not in text and "wrong-pw-r7" not in text
    _assert_clean(text)
