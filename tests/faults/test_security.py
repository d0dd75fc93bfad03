"""Security: JSON-only Celery (pickle refused), Redis AUTH/TLS/Sentinel URLs, Flower
behind authentication, launch commands only from the fleet file, payload size limit,
no secret in error output."""

from __future__ import annotations

import inspect
import pickle
from pathlib import Path

import pytest
import redis
from kombu.exceptions import ContentDisallowed
from kombu.serialization import dumps, loads, prepare_accept_content
from typer.testing import CliRunner

from makespan.celery_app import create_celery
from makespan.cli import app as cli_app
from makespan.errors import ValidationError
from makespan.models import load_fleet, parse_job
from makespan.redis_conn import connect, redacted
from makespan.settings import Settings
from tests.conftest import FLEET_TOML

FLEET = load_fleet(FLEET_TOML)
ROOT = Path(__file__).resolve().parents[2]


def test_celery_accepts_json_only_and_refuses_pickle():
    app = create_celery(Settings())
    c = app.conf
    assert (c.task_serializer, c.result_serializer, c.event_serializer) == ("json", "json", "json")
    assert list(c.accept_content) == ["json"] and list(c.result_accept_content) == ["json"]
    accept = prepare_accept_content(c.accept_content)  # what the worker's consumer checks against
    ctype, enc, body = dumps({"lease_id": "x"}, serializer="pickle")
    assert pickle.loads(body) == {"lease_id": "x"}
    with pytest.raises(ContentDisallowed):
        loads(body, ctype, enc, accept=accept)
    ctype, enc, body = dumps({"lease_id": "x"}, serializer="json")
    assert loads(body, ctype, enc, accept=accept) == {"lease_id": "x"}
    app.close()


def test_redis_url_with_password_and_tls():
    c = connect("rediss://:s3cret@cache.example:6380/2?ssl_cert_reqs=required")
    kw = c.connection_pool.connection_kwargs
    assert c.connection_pool.connection_class is redis.SSLConnection
    assert (kw["host"], kw["port"], kw["db"], kw["password"]) == ("cache.example", 6380, 2, "s3cret")
    c = connect("redis://user:pw@10.0.0.5:6379/1")
    kw = c.connection_pool.connection_kwargs
    assert c.connection_pool.connection_class is redis.Connection
    assert (kw["username"], kw["password"], kw["db"]) == ("user", "pw", 1)


def test_redis_sentinel_url():
    c = connect("redis+sentinel://:pw@s1:26379,s2:26380/mymaster/3")
    pool = c.connection_pool
    assert pool.service_name == "mymaster"
    assert pool.connection_kwargs["db"] == 3 and pool.connection_kwargs["password"] == "pw"
    hosts = [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
             for s in pool.sentinel_manager.sentinels]
    assert hosts == [("s1", 26379), ("s2", 26380)]


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "redis+sentinel://s1:26379", "memcached://x"])
def test_bad_redis_urls_are_refused(url):
    with pytest.raises(ValidationError) as ei:
        connect(url)
    assert ei.value.field == "redis_url"


def test_a_malformed_host_part_is_a_validation_error_without_the_password():
    """An unclosed IPv6 bracket gave a raw traceback (ValueError: Invalid IPv6 URL), a
    security review found."""
    with pytest.raises(ValidationError, match="not a valid URL") as ei:
        connect("redis://:S3cr3t@[::1:6413/13")
    assert "S3cr3t" not in str(ei.value)
    res = CliRunner().invoke(cli_app, ["status", "abc"], env={"MAKESPAN_REDIS_URL": "redis://:S3cr3t@[::1:6413/13"})
    assert res.exit_code == 2 and "not a valid URL" in res.output and "S3cr3t" not in res.output, res.output


def test_redacted_hides_the_password():
    assert redacted("redis://:s3cret@h:6379/0") == "redis://:***@h:6379/0"
    assert redacted("rediss://user:s3cret@h:6380/0") == "rediss://user:***@h:6380/0"
    assert redacted("redis://h:6379/0") == "redis://h:6379/0"
    # a password written without its leading colon (redis-py sends it as a user name): hidden
    # too (a security review saw it printed in clear in the refused-credentials error)
    assert redacted("redis://S3cr3t-PW@127.0.0.1:6413/13") == "redis://***@127.0.0.1:6413/13"
    assert redacted("redis+sentinel://S3cr3t@s1:26379,s2:26379/mymaster/0") == \
        "redis+sentinel://***@s1:26379,s2:26379/mymaster/0"


@pytest.mark.parametrize("url", ["redis+sentinel://:pa#ss@s1:26379,s2/mymaster/0",
                                 "redis+sentinel://app:pa?ss@s1/mymaster?sentinel_password=sp",
                                 "redis://:pa/ss@h:6379/0", "rediss://user:pa#ss@h:6380/0",
                                 "redis://:pa[ss@h:6379/0"])
def test_a_password_with_a_character_that_ends_the_host_part_is_hidden_too(url):
    """A '/', '?' or '#' in a password that is not percent-encoded ends urlparse's netloc
    before the '@' (a '[' makes urlparse raise): the password was not found, and the error
    of the URL it made invalid showed it whole (``every Sentinel needs a host (got
    'redis+sentinel://:pa#ss@s1...')``). Everything before the host is hidden now."""
    shown = redacted(url)
    assert "ss@" not in shown and "pa" not in shown.split("@")[0], shown
    assert shown.endswith(url.rpartition("@")[2].replace("sentinel_password=sp", "sentinel_password=***")), shown
    try:
        connect(url)
    except (ValidationError, ValueError) as e:
        assert "pa#ss" not in str(e) and "pa?ss" not in str(e) and "pa/ss" not in str(e), str(e)


def test_cli_error_does_not_print_the_redis_password(prefix, refused_port):
    url = f"redis://:s3cret-pw@127.0.0.1:{refused_port}/0"  # nothing listens: the submit fails
    res = CliRunner().invoke(cli_app, ["submit", "--fleet", FLEET_TOML, "--endpoint", "chat", "--service-s", "5"],
                             env={"MAKESPAN_REDIS_URL": url, "MAKESPAN_KEY_PREFIX": prefix})
    assert res.exit_code != 0
    assert "s3cret-pw" not in res.output and "s3cret-pw" not in str(res.exception or "")


@pytest.mark.parametrize("extra", [{"launch": {"command": ["sh", "-c", "id"]}}, {"command": ["rm", "-rf", "/"]},
                                   {"model": "evil/model"}, {"tensor_parallel": 8}, {"driver": "process"}])
def test_no_job_field_can_choose_what_runs(extra):
    with pytest.raises(ValidationError) as ei:
        parse_job({"endpoint": "renderer", "service_s": 5, **extra}, FLEET)
    assert ei.value.reason == "unknown key"


def test_endpoint_name_cannot_smuggle_arguments():
    for ep in ("renderer --evil", "renderer;id", "../renderer", "renderer\n--port=1"):
        with pytest.raises(ValidationError) as ei:
            parse_job({"endpoint": ep, "service_s": 5}, FLEET)
        assert ei.value.field == "job.endpoint"


def test_drivers_take_the_launch_spec_from_the_fleet_only():
    """A driver's start sees the fleet's EndpointSpec, GPUs, time scale and host: no
    job payload reaches it, so a payload (opaque to makespan) cannot alter argv."""
    from makespan.workers.drivers import get_driver

    for name in ("process", "vllm", "simulated"):
        params = list(inspect.signature(get_driver(name).start).parameters)
        assert params[:2] == ["endpoint", "gpus"] and "payload" not in params


def test_payload_size_limit():
    limit = Settings().max_payload_bytes
    fill = limit - len('{"b": ""}')
    parse_job({"endpoint": "chat", "service_s": 5, "payload": {"b": "x" * fill}}, FLEET)  # exactly the limit
    with pytest.raises(ValidationError) as ei:
        parse_job({"endpoint": "chat", "service_s": 5, "payload": {"b": "x" * (fill + 1)}}, FLEET)
    assert ei.value.field == "job.payload" and str(limit) in ei.value.reason
    # it names the setting that raises the limit and the way around it (found by a new-user trial)
    assert "MAKESPAN_MAX_PAYLOAD_BYTES" in ei.value.reason and "pass a reference: a path or URL" in ei.value.reason


def test_the_payload_limit_is_raised_by_its_setting(monkeypatch):
    monkeypatch.setenv("MAKESPAN_MAX_PAYLOAD_BYTES", str(1024 * 1024))
    settings = Settings.from_env()
    assert settings.max_payload_bytes == 1024 * 1024
    assert settings.to_env()["MAKESPAN_MAX_PAYLOAD_BYTES"] == str(1024 * 1024)
    parse_job({"endpoint": "chat", "service_s": 5, "payload": {"b": "x" * 500_000}}, FLEET,
              settings.max_payload_bytes)
    monkeypatch.setenv("MAKESPAN_MAX_PAYLOAD_BYTES", "0")
    with pytest.raises(ValidationError, match="MAKESPAN_MAX_PAYLOAD_BYTES"):
        Settings.from_env()


def test_compose_protects_flower_and_persists_redis():
    text = (ROOT / "compose" / "compose.yaml").read_text()
    assert "--basic-auth=" in text
    assert '"--appendonly", "yes"' in text


def test_a_sentinel_password_in_the_query_is_percent_decoded_and_a_bare_plus_is_a_space():
    """docs/security.md: percent-encode ``+`` in ``?sentinel_password=`` (as in any URL query
    redis-py parses); the userinfo's ``+`` stays a ``+``."""
    from makespan.settings import parse_sentinel_url

    parsed = parse_sentinel_url("redis+sentinel://:a+b@s1/mymaster?sentinel_password=a%2Bb")
    assert (parsed.password, parsed.sentinel_password) == ("a+b", "a+b")
    assert parse_sentinel_url("redis+sentinel://s1/mymaster?sentinel_password=a+b").sentinel_password == "a b"


def test_a_malformed_dashboard_credential_is_not_echoed():
    """An entry without its colon may be a password: the error names its position only
    (a verifier saw ``(got 'secretonly')``)."""
    from makespan.dashboard.app import DashboardConfig

    cfg = DashboardConfig(redis_url="redis://127.0.0.1:6379/0", key_prefix="p", basic_auth="ops:pw,S3cr3tOnly")
    with pytest.raises(ValidationError, match="entry 2 must be user:password") as ei:
        cfg.credentials()
    assert "S3cr3tOnly" not in str(ei.value)


def _fresh_tmpdir(monkeypatch, tmp_path: Path) -> None:
    import tempfile

    monkeypatch.delenv("MAKESPAN_LOG_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_default_log_dir_is_private(monkeypatch, tmp_path):
    import os

    from makespan.workers.drivers.process import default_log_dir

    _fresh_tmpdir(monkeypatch, tmp_path)
    log_dir = default_log_dir()
    assert log_dir == tmp_path / f"makespan-logs-{os.getuid()}"
    assert log_dir.stat().st_mode & 0o777 == 0o700
    assert default_log_dir() == log_dir  # the second call finds its own directory
    # a MAKESPAN_LOG_DIR it creates is private too (it was 0755; a production-deployment helper)
    monkeypatch.setenv("MAKESPAN_LOG_DIR", str(tmp_path / "srv" / "logs"))
    assert default_log_dir().stat().st_mode & 0o777 == 0o700


def test_default_log_dir_of_someone_else_is_refused(monkeypatch, tmp_path):
    import os

    from makespan.workers.drivers.process import default_log_dir

    _fresh_tmpdir(monkeypatch, tmp_path)
    squatted = tmp_path / f"makespan-logs-{os.getuid()}"
    squatted.mkdir(mode=0o755)
    squatted.chmod(0o755)  # ours, open to others (an older makespan's, a umask): closed again, not refused
    assert default_log_dir() == squatted and squatted.stat().st_mode & 0o777 == 0o700
    squatted.rmdir()
    squatted.write_text("")  # not a directory
    with pytest.raises(PermissionError, match="not a private directory"):
        default_log_dir()
    squatted.unlink()
    if os.getuid() == 0:  # as root the owner check can be tried too
        squatted.mkdir(mode=0o700)
        os.chown(squatted, 65534, 65534)
        with pytest.raises(PermissionError, match="owner uid 65534"):
            default_log_dir()
    monkeypatch.setenv("MAKESPAN_LOG_DIR", str(tmp_path / "mine"))
    assert default_log_dir() == tmp_path / "mine"  # the way out the error names


def test_a_gpu_worker_refuses_to_start_without_a_usable_endpoint_log_dir(tmp_path):
    """A GPU worker whose fleet starts endpoint processes checks the endpoint log directory
    at start: one line naming the way out, exit 2, before Celery starts. It started before
    and failed every start phase on it, one job after another."""
    import os
    import subprocess
    import sys

    fleet = tmp_path / "fleet.toml"
    fleet.write_text('name = "logs"\n[[hosts]]\nname = "h"\ngpu_count = 1\nmemory_mib = 81920\n'
                     '[endpoints.web]\nmodel = "m"\nmemory_mib_per_gpu = 1000\ncold_start_s = 1\n'
                     '[endpoints.web.launch]\ndriver = "process"\n'
                     'command = ["python3", "-m", "http.server", "{port}"]\n')
    (tmp_path / f"makespan-logs-{os.getuid()}").write_text("")  # squatted: not a directory
    env = {k: v for k, v in os.environ.items() if k != "MAKESPAN_LOG_DIR"}
    env.update(TMPDIR=str(tmp_path), MAKESPAN_REDIS_URL="redis://127.0.0.1:1/0")
    worker = subprocess.run([sys.executable, "-m", "makespan.cli", "gpu-worker", "--fleet", str(fleet), "--host", "h"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert worker.returncode == 2, worker.stderr
    assert "the endpoint log directory cannot be used" in worker.stderr and "MAKESPAN_LOG_DIR" in worker.stderr
    assert "Traceback" not in worker.stderr
    # a directory that exists but takes no file (a verifier's MAKESPAN_LOG_DIR=/proc started, then every start failed)
    env["MAKESPAN_LOG_DIR"] = "/proc"
    worker = subprocess.run([sys.executable, "-m", "makespan.cli", "gpu-worker", "--fleet", str(fleet), "--host", "h"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert worker.returncode == 2 and "the endpoint log directory cannot be used" in worker.stderr, worker.stderr
