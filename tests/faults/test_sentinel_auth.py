"""Redis Sentinel with authentication and TLS, set up as deployments run it.

Each test starts its own primary, replica and three ``redis-sentinel`` processes
(:class:`bench.chaos_redis.SentinelSet`, on free loopback ports, stopped at the end) in
one of the common setups: (a) the data nodes have ``requirepass`` and the Sentinels none;
(b) both have one password; (c) the Sentinels have their own; an ACL user on the data
nodes; and TLS everywhere (``rediss+sentinel://``). The URL's ``[user]:password@`` is the
data nodes' AUTH, ``?sentinel_password=`` the Sentinels' (docs/security.md).

Before, makespan's clients and the Celery broker sent the Sentinels no AUTH at all (b and
c: "No master found"), makespan's clients dropped the ACL user name (AUTH as ``default``:
refused), and a TLS Sentinel set could not be named at all.
"""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

import makespan
from bench.chaos_redis import SentinelSet, sentinel_binary
from makespan.celery_app import create_celery
from makespan.cli import app as cli_app
from makespan.errors import RedisAuthFailed, StoreError
from makespan.redis_conn import connect, redacted
from tests.faults.private_redis import ONE_HOST, fault_settings, live_system, process_logs, tls_files
from tests.live import wait_for

SETUPS = {
    "data-nodes-only": {"password": "data-pw-a1"},  # (a) the Sentinels without requirepass
    "one-password": {"password": "same-pw-b2", "sentinel_password": "same-pw-b2"},  # (b)
    "own-sentinel-password": {"password": "data-pw-c3", "sentinel_password": "sentinel-pw-c3"},  # (c)
    "acl-user": {"username": "makespan-app", "password": "data-pw-d4", "sentinel_password": "sentinel-pw-d4"},
}


def start_set(**options) -> SentinelSet:
    if not sentinel_binary():
        pytest.skip("needs redis-server (or redis-sentinel)")
    try:
        return SentinelSet(**options)
    except StoreError:  # a port free_port() chose was taken meanwhile: fresh ports
        return SentinelSet(**options)


def secrets(options: dict) -> list[str]:
    return [v for k, v in options.items() if k.endswith("password")]


def url_of(sset: SentinelSet) -> str:
    """The set's URL with the Sentinels' password where they have one."""
    return sset.url_with(query=f"sentinel_password={sset.sentinel_password}" if sset.sentinel_password else "")


def broker_round_trip(url: str, prefix: str) -> dict:
    """A message through the Celery broker (makespan's kombu Sentinel transport) on ``url``."""
    app = create_celery(fault_settings(url, prefix))
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(f"{prefix}-q")
        try:
            queue.put({"n": 1})
            message = queue.get(timeout=10)
            message.ack()
            return message.payload
        finally:
            queue.close()


@pytest.mark.parametrize("setup", list(SETUPS))
def test_clients_and_the_broker_authenticate_to_the_sentinels_and_the_primary(setup):
    options = SETUPS[setup]
    sset = start_set(**options)
    try:
        url = url_of(sset)
        r = connect(url)
        r.set("sentinel-auth:k", "v")
        assert r.get("sentinel-auth:k") == "v"
        assert r.acl_whoami() == options.get("username", "default")
        r.close()
        assert broker_round_trip(url, "sentinel-auth") == {"n": 1}
        if sset.sentinel_password:  # without the Sentinels' password: refused, saying where it goes
            with pytest.raises(RedisAuthFailed) as err:
                makespan.connect(sset.url, key_prefix="sentinel-auth")
            assert "?sentinel_password=" in str(err.value) and "the Sentinels answered" in str(err.value)
            assert not any(s in str(err.value) for s in secrets(options))
    finally:
        sset.stop()


def test_a_live_system_runs_a_job_through_sentinels_with_their_own_password(tmp_path):
    """Setup (c) with an ACL user on the data nodes, every process kind: the client's submit
    and result, the planner, a GPU worker (Celery through kombu's Sentinel transport) and the
    observer; no password in any process's log, nor in ``makespan status``."""
    options = SETUPS["acl-user"]
    sset = start_set(**options)
    try:
        _run_a_job(tmp_path, url_of(sset), secrets(options))
    finally:
        sset.stop()


def test_a_live_system_runs_a_job_on_a_tls_sentinel_set(tmp_path):
    """``rediss+sentinel://``: TLS to the Sentinels and the data nodes (a CA made here), with
    passwords on both, through every process kind."""
    if not shutil.which("openssl"):
        pytest.skip("needs openssl")
    options = {"password": "data-pw-t5", "sentinel_password": "sentinel-pw-t5"}
    try:
        sset = start_set(**options, tls=tls_files(tmp_path))
    except StoreError as e:
        pytest.skip(f"no TLS Sentinel set here (redis-server built without TLS?): {e}")
    try:
        url = url_of(sset)
        assert url.startswith("rediss+sentinel://") and "ssl_ca_certs=" in url
        r = connect(url)
        assert r.connection_pool.connection_class.__name__ == "SentinelManagedSSLConnection"
        r.close()
        _run_a_job(tmp_path, url, secrets(options))
    finally:
        sset.stop()


def _run_a_job(tmp_path, url: str, hidden: list[str]) -> None:
    s = fault_settings(url, "sentinel-auth", workload_modules="tests.workloads.fns")
    with live_system(tmp_path, s, ONE_HOST) as (system, _fleet):
        client = makespan.connect(url, key_prefix=s.key_prefix)
        wait_for(lambda: client.r.exists(client.keys.fn_live("add")), 60, "the GPU worker to publish its functions")
        job = client.submit("add", 2, 3)
        assert job.result(timeout_s=120)["sum"] == 5, process_logs(system)
        wait_for(lambda: client.r.exists(client.keys.observer), 60, "the observer's liveness record")
        status = CliRunner().invoke(cli_app, ["status", job.id],
                                    env={"MAKESPAN_REDIS_URL": url, "MAKESPAN_KEY_PREFIX": s.key_prefix})
        assert status.exit_code == 0, status.output
        assert json.loads(status.output)["state"] == "completed"
        assert [(p.name, p.popen.returncode) for p in system.procs if not p.alive()] == []
        client.close()
        logs = process_logs(system, tail_chars=10**7)
    for name, text in [*logs.items(), ("status", status.output), ("redacted", redacted(url))]:
        assert not [p for p in hidden if p in text], f"a password in {name}: {text[-2000:]}"


def test_redacted_hides_the_sentinels_password_too():
    url = "redis+sentinel://u:data-pw@s1:26379,s2/mymaster/0?sentinel_username=sa&sentinel_password=sent-pw"
    assert redacted(url) == "redis+sentinel://u:***@s1:26379,s2/mymaster/0?sentinel_username=sa&sentinel_password=***"
    assert redacted("rediss+sentinel://s1/m?ssl_password=key-pw&sentinel_password=x") == \
        "rediss+sentinel://s1/m?ssl_password=***&sentinel_password=***"


def test_one_parser_gives_the_clients_and_the_broker_the_same_credentials():
    """The userinfo (percent-decoded) goes to the data nodes, ``sentinel_*`` to the
    Sentinels only, ``?db=`` wins over the path, for makespan's clients and kombu alike."""
    from makespan.broker import broker_url
    from makespan.celery_app import broker_transport_options

    url = "redis+sentinel://app:p%40ss@s1,s2:26380/mymaster/2?sentinel_username=sa&sentinel_password=sp&db=3"
    pool = connect(url).connection_pool
    kw = pool.connection_kwargs
    assert (pool.service_name, kw["username"], kw["password"], kw["db"]) == ("mymaster", "app", "p@ss", 3)
    for s in pool.sentinel_manager.sentinels:
        skw = s.connection_pool.connection_kwargs
        assert (skw["username"], skw["password"]) == ("sa", "sp")
    assert broker_url(url) == ("sentinel://app:p%40ss@s1:26379/3;sentinel://app:p%40ss@s2:26380/3",
                               "makespan.broker:SentinelTransport")
    opts = broker_transport_options(fault_settings(url, "p"))
    assert opts["master_name"] == "mymaster"
    assert (opts["sentinel_kwargs"]["username"], opts["sentinel_kwargs"]["password"]) == ("sa", "sp")
    plain = broker_transport_options(fault_settings("redis+sentinel://:pw@s1/mymaster", "p"))["sentinel_kwargs"]
    assert "password" not in plain  # case (a): the Sentinels get no AUTH, never the data nodes' password


@pytest.mark.parametrize("url", ["redis+sentinel://s1/mymaster?socket_timeout=1",
                                 "redis+sentinel://s1/mymaster?ssl_ca_certs=/ca.pem",  # TLS is rediss+sentinel://
                                 "rediss+sentinel://s1/mymaster?db=x&sentinel_password=hidden-pw"])
def test_other_sentinel_url_options_are_refused(url):
    from makespan.errors import ValidationError

    with pytest.raises(ValidationError) as err:
        connect(url)
    assert err.value.field == "redis_url" and "hidden-pw" not in str(err.value)
