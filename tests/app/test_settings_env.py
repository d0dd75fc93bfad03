"""Settings from MAKESPAN_* variables: numbers that may be zero, a choice among names."""

import pytest

from makespan.errors import ValidationError
from makespan.settings import Settings


@pytest.mark.parametrize("raw,value", [("0", 0.0), ("0.00", 0.0), ("2.5", 2.5)])
def test_retry_backoff_accepts_any_spelling_of_zero(monkeypatch, raw, value):
    monkeypatch.setenv("MAKESPAN_RETRY_BACKOFF_S", raw)
    assert Settings.from_env().retry_backoff_s == value


@pytest.mark.parametrize("raw", ["-1", "nan", "inf", "soon"])
def test_retry_backoff_refuses_negative_or_not_finite(monkeypatch, raw):
    monkeypatch.setenv("MAKESPAN_RETRY_BACKOFF_S", raw)
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_RETRY_BACKOFF_S"


@pytest.mark.parametrize("raw,mode", [("", "plan"), ("plan", "plan"), ("rule", "rule")])
def test_preemption_mode_from_env(monkeypatch, raw, mode):
    monkeypatch.setenv("MAKESPAN_PREEMPTION", raw)
    assert Settings.from_env().preemption == mode


def test_preemption_mode_refuses_unknown(monkeypatch):
    monkeypatch.setenv("MAKESPAN_PREEMPTION", "sometimes")
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_PREEMPTION"


def test_improver_executor_is_process_by_default_and_a_known_name(monkeypatch):
    monkeypatch.delenv("MAKESPAN_IMPROVER_EXECUTOR", raising=False)
    assert Settings.from_env().improver_executor == "process"
    monkeypatch.setenv("MAKESPAN_IMPROVER_EXECUTOR", "thread")
    assert Settings.from_env().improver_executor == "thread"
    monkeypatch.setenv("MAKESPAN_IMPROVER_EXECUTOR", "fork")
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_IMPROVER_EXECUTOR"


@pytest.mark.parametrize("raw,ok", [("0", True), ("19", True), ("", True), ("20", False), ("-1", False), ("5.5", False)])
def test_improver_nice_is_a_whole_number_from_0_to_19(monkeypatch, raw, ok):
    monkeypatch.setenv("MAKESPAN_IMPROVER_NICE", raw)
    if ok:
        assert Settings.from_env().improver_nice == (int(raw) if raw else 5)
    else:
        with pytest.raises(ValidationError) as ei:
            Settings.from_env()
        assert ei.value.field == "MAKESPAN_IMPROVER_NICE"


@pytest.mark.parametrize("raw, value", [(None, 0.0), ("", 0.0), ("0", 0.0), ("2.5", 2.5)])
def test_set_point_weight_from_env(monkeypatch, raw, value):
    if raw is None:
        monkeypatch.delenv("MAKESPAN_SET_POINT_WEIGHT", raising=False)
    else:
        monkeypatch.setenv("MAKESPAN_SET_POINT_WEIGHT", raw)
    s = Settings.from_env()
    assert s.set_point_weight == value
    assert Settings.from_env(**{}).to_env()["MAKESPAN_SET_POINT_WEIGHT"] == repr(value)


@pytest.mark.parametrize("raw", ["-1", "inf", "nan", "x"])
def test_set_point_weight_refuses_negative_or_not_finite(monkeypatch, raw):
    monkeypatch.setenv("MAKESPAN_SET_POINT_WEIGHT", raw)
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_SET_POINT_WEIGHT"


def test_policy_from_env_is_a_registered_name(monkeypatch):
    from makespan.planner.policies import POLICY_REGISTRY

    for name in POLICY_REGISTRY:
        monkeypatch.setenv("MAKESPAN_POLICY", name)
        assert Settings.from_env().policy == name
    monkeypatch.delenv("MAKESPAN_POLICY")
    assert Settings.from_env().policy == "default"


def test_unknown_policy_fails_with_the_list_of_names(monkeypatch):
    from makespan.planner.policies import POLICY_REGISTRY

    monkeypatch.setenv("MAKESPAN_POLICY", "bogus")
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_POLICY"
    assert ", ".join(POLICY_REGISTRY.names()) in ei.value.reason
    monkeypatch.delenv("MAKESPAN_POLICY")
    with pytest.raises(ValidationError) as ei:
        Settings.from_env(policy="bogus")  # the CLI's --policy
    assert ei.value.field == "policy"


def test_planner_with_an_unknown_policy_fails_at_start_listing_the_names(tmp_path):
    """``MAKESPAN_POLICY=bogus makespan planner`` exits at once (before it connects to
    Redis or leases a job) with one line naming every registered policy."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from makespan.planner.policies import POLICY_REGISTRY

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MAKESPAN_POLICY": "bogus",
           "MAKESPAN_REDIS_URL": "redis://127.0.0.1:1/0"}  # nothing listens there: a start that got further would hang or fail differently
    out = subprocess.run([sys.executable, "-m", "makespan.cli", "planner", "--fleet",
                          str(root / "examples" / "render-pipeline.toml")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "MAKESPAN_POLICY: unknown policy" in out.stderr
    assert f"known: {', '.join(POLICY_REGISTRY.names())}" in out.stderr
    assert "Traceback" not in out.stderr


def test_planner_worker_with_an_unknown_policy_fails_when_built(r, settings):
    """Settings built without from_env (dataclasses.replace) still cannot start a planner
    that would die on its first job: the worker looks its policy up when it is built."""
    import dataclasses

    from makespan.errors import PlannerError
    from makespan.planner.policies import POLICY_REGISTRY
    from makespan.workers.planner_worker import PlannerWorker
    from tests.faults.test_priority_cases import ONE_GPU

    with pytest.raises(PlannerError, match=", ".join(POLICY_REGISTRY.names())):
        PlannerWorker(r, dataclasses.replace(settings, policy="bogus"), ONE_GPU, dispatch=lambda *a: None)


COUNTS = ["MAKESPAN_BATCH_SIZE", "MAKESPAN_MAX_ATTEMPTS", "MAKESPAN_RETENTION_JOBS", "MAKESPAN_RETENTION_BATCH",
          "MAKESPAN_EVENTS_MAX_LEN"]


@pytest.mark.parametrize("name", COUNTS)
@pytest.mark.parametrize("raw", ["0.5", "2.7"])
def test_counts_refuse_a_fraction_instead_of_truncating_it(monkeypatch, name, raw):
    """The counts were read as numbers and truncated: MAKESPAN_BATCH_SIZE=0.5 gave a batch
    of 0 jobs (the planner never started one, and read the whole queue each tick) and
    MAKESPAN_MAX_ATTEMPTS=0.5 failed every job on its first reclaim, both silently."""
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == name
    assert "whole number" in ei.value.reason


@pytest.mark.parametrize("name", COUNTS)
def test_counts_take_whole_numbers(monkeypatch, name):
    monkeypatch.setenv(name, "7")
    s = Settings.from_env()
    field = {"MAKESPAN_BATCH_SIZE": "batch_size", "MAKESPAN_MAX_ATTEMPTS": "max_attempts",
             "MAKESPAN_RETENTION_JOBS": "retention_jobs", "MAKESPAN_RETENTION_BATCH": "retention_batch",
             "MAKESPAN_EVENTS_MAX_LEN": "events_max_len"}[name]
    assert getattr(s, field) == 7
    assert s.to_env()[name] == "7"
    monkeypatch.setenv(name, "0")
    with pytest.raises(ValidationError):
        Settings.from_env()


BAD_URLS = ["redis://127.0.0.1:6379/abc",  # redis-py quietly used db 0, kombu refused it: every dispatch failed
            "redis://127.0.0.1:63x9/0",
            "redis+sentinel://127.0.0.1:abc/mymaster/0",  # a ValueError traceback
            "redis+sentinel://127.0.0.1:26379/mymaster/x",
            "redis+sentinel://127.0.0.1:26379",  # no service name
            "redis+sentinel://127.0.0.1:26379/mymaster/0/extra",
            "redis+sentinel://127.0.0.1:26379,/mymaster",
            "http://127.0.0.1:6379/0"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_malformed_redis_url_is_refused_naming_the_variable(monkeypatch, url):
    monkeypatch.setenv("MAKESPAN_REDIS_URL", url)
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_REDIS_URL"
    from makespan.redis_conn import connect

    with pytest.raises(ValidationError):
        connect(url)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "redis://:secret@127.0.0.1:6379/3", "redis://localhost",
                                 "rediss://u:p@h.example:6380/0?ssl_cert_reqs=required", "unix:///tmp/redis.sock?db=2",
                                 "redis+sentinel://s1:26379,s2:26379,s3/mymaster/0", "redis+sentinel://:pw@s1/mymaster"])
def test_well_formed_redis_urls_are_taken(monkeypatch, url):
    monkeypatch.setenv("MAKESPAN_REDIS_URL", url)
    assert Settings.from_env().redis_url == url


@pytest.mark.parametrize("url", ["redis+sentinel://127.0.0.1:abc/mymaster/0", "redis://127.0.0.1:6379/abc"])
@pytest.mark.parametrize("command", ["planner", "gpu-worker"])
def test_processes_with_a_malformed_redis_url_fail_in_one_line(tmp_path, r, prefix, url, command):
    """``makespan planner`` and ``makespan gpu-worker`` exit 2 with one line naming
    MAKESPAN_REDIS_URL: the planner printed a ValueError traceback for a bad Sentinel port,
    and with a database that is not a number led on db 0 while every dispatch of its
    leases failed in kombu."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    args = [sys.executable, "-m", "makespan.cli", command, "--fleet", str(root / "examples" / "render-pipeline.toml")]
    if command == "gpu-worker":
        args += ["--host", "host-a"]
    env = {**os.environ, "MAKESPAN_REDIS_URL": url, "MAKESPAN_KEY_PREFIX": prefix}  # `r` deletes its keys
    try:
        out = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as e:  # the planner before: it led on db 0, failing each dispatch
        pytest.fail(f"{command} with {url} kept running: {e.stderr!r}"[-2000:])
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "MAKESPAN_REDIS_URL" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("level,ok", [("verbose", False), ("debug", True)])
@pytest.mark.parametrize("command", ["planner", "gpu-worker"])
def test_a_bad_log_level_fails_in_one_line_and_any_case_is_taken(tmp_path, prefix, level, ok, command):
    """MAKESPAN_LOG_LEVEL=verbose crashed the planner (logging's ValueError) and the GPU
    worker (Celery's BadParameter) with a traceback; ``debug`` in lower case crashed the
    planner only (logging wants upper case, Celery takes either). Now a bad level fails in
    one line naming the variable, exit 2, and any case is taken by both. Checked with a
    Redis URL nobody listens on: a process that got past its level fails to connect."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    args = [sys.executable, "-m", "makespan.cli", command, "--fleet", str(root / "examples" / "render-pipeline.toml")]
    if command == "gpu-worker":
        args += ["--host", "host-a"]
    env = {**os.environ, "MAKESPAN_LOG_LEVEL": level, "MAKESPAN_KEY_PREFIX": prefix,
           "MAKESPAN_REDIS_URL": "redis://127.0.0.1:1/0", "MAKESPAN_REDIS_CONNECT_TIMEOUT_S": "0.2"}
    # a refused level ends the process: wait as long as a loaded host may take to start it (a
    # bound on a hang); a taken one keeps it trying to reach Redis: 10 s show it got past its level
    try:
        out = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=10 if ok else 120)
        stderr = out.stderr
    except subprocess.TimeoutExpired as e:  # still trying to reach Redis: it got past its log level
        out, stderr = None, (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    assert "BadParameter" not in stderr and "Unknown level" not in stderr, stderr[-2000:]
    if ok:
        assert "MAKESPAN_LOG_LEVEL" not in stderr, stderr[-2000:]
    else:
        assert out is not None and out.returncode == 2, stderr[-2000:]
        assert "MAKESPAN_LOG_LEVEL" in stderr and "Traceback" not in stderr, stderr[-2000:]


@pytest.mark.parametrize("ttl,heartbeat,ok", [("3", None, False),  # the default heartbeat, 2 s
                                              ("2", None, False), ("4", None, True), ("10", "6", False),
                                              ("1", "0.5", True)])
def test_a_heartbeat_slower_than_half_the_lease_ttl_is_refused(monkeypatch, ttl, heartbeat, ok):
    """MAKESPAN_LEASE_TTL_S=2 (to notice dead workers sooner) with the default 2 s
    heartbeat was taken: every lease expired between two renewals and its job was reclaimed
    until it failed; with a heartbeat above half the TTL one failed renewal (a Redis blip,
    retried a heartbeat later) loses the lease. Refused at start, naming both variables."""
    monkeypatch.setenv("MAKESPAN_LEASE_TTL_S", ttl)
    if heartbeat is None:
        monkeypatch.delenv("MAKESPAN_HEARTBEAT_S", raising=False)
    else:
        monkeypatch.setenv("MAKESPAN_HEARTBEAT_S", heartbeat)
    if ok:
        assert Settings.from_env().lease_ttl_s == float(ttl)
        return
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_HEARTBEAT_S" and "MAKESPAN_LEASE_TTL_S" in ei.value.reason


def test_a_heartbeat_override_is_checked_against_the_lease_ttl(monkeypatch):
    monkeypatch.delenv("MAKESPAN_HEARTBEAT_S", raising=False)
    monkeypatch.delenv("MAKESPAN_LEASE_TTL_S", raising=False)
    assert Settings.from_env(lease_ttl_s=5.0, heartbeat_s=1.0).heartbeat_s == 1.0  # the demo's
    with pytest.raises(ValidationError):
        Settings.from_env(lease_ttl_s=3.0)


@pytest.mark.parametrize("env,expect_code,in_stderr,not_in_stderr", [
    ({"MAKESPAN_METRICS_PORT": "abc"}, 2, "MAKESPAN_METRICS_PORT", "Traceback"),  # a ValueError traceback before
    ({"MAKESPAN_LOG_LEVEL": "verbose"}, 2, "MAKESPAN_LOG_LEVEL", "Traceback"),  # ignored before: it ran
    ({"MAKESPAN_LOG_LEVEL": "error"}, None, None, "Redis unavailable"),  # a WARNING line: logged at INFO before
])
def test_the_observer_reads_the_metrics_port_and_log_level_as_the_other_processes(tmp_path, prefix, env, expect_code,
                                                                                  in_stderr, not_in_stderr):
    """``makespan observer`` read MAKESPAN_METRICS_PORT with a bare int() (a traceback for
    a bad value) and logged at INFO whatever MAKESPAN_LOG_LEVEL said (docs/configuration.md:
    the CLI's log level). Redis is a port nobody listens on: a running observer logs
    'Redis unavailable' at WARNING and keeps trying (stopped here after a few seconds)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    full = {**os.environ, "MAKESPAN_KEY_PREFIX": prefix, "MAKESPAN_REDIS_URL": "redis://127.0.0.1:1/0",
            "MAKESPAN_SHUTDOWN_GRACE_S": "3", **env}
    p = subprocess.Popen([sys.executable, "-m", "makespan.cli", "observer", "--fleet",
                          str(root / "examples" / "render-pipeline.toml"), "--probe-interval-s", "0.2"],
                         cwd=tmp_path, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:  # a refused setting ends it: as long as a loaded host may take (a bound on a hang); else 8 s
        code = p.wait(timeout=8 if expect_code is None else 120)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        code = None
    stderr = p.communicate(timeout=30)[1]
    assert code == expect_code, stderr[-2000:]
    if in_stderr:
        assert in_stderr in stderr, stderr[-2000:]
    assert not_in_stderr not in stderr, stderr[-2000:]


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0?socket_timeout=3", "redis://127.0.0.1:6379/2?protocol=3",
                                 "unix:///tmp/r.sock?db=1&client_name=x"])
def test_a_redis_url_option_the_broker_cannot_take_is_refused(monkeypatch, url):
    """redis-py takes connection options in the URL's query, kombu only the TLS ones: the
    planner led and every dispatch failed on kombu's TypeError (an unexpected keyword
    argument), or a GPU worker crashed at start. Refused at start, naming the settings to
    use instead."""
    monkeypatch.setenv("MAKESPAN_REDIS_URL", url)
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_REDIS_URL" and "MAKESPAN_REDIS_" in ei.value.reason


@pytest.mark.parametrize("url,db", [("redis://127.0.0.1:6379?db=3", 3), ("redis://127.0.0.1:6379/1?db=4", 4),
                                    ("redis://127.0.0.1:6379/2", 2),
                                    ("rediss://127.0.0.1:6380?db=5&ssl_cert_reqs=required", 5)])
def test_the_broker_uses_the_database_the_url_names(monkeypatch, url, db):
    """``?db=N`` (redis-py's other spelling of the database, which wins over the path)
    crashed kombu; the broker now uses that database, as makespan's clients do."""
    from makespan.celery_app import create_celery
    from makespan.redis_conn import connect

    monkeypatch.setenv("MAKESPAN_REDIS_URL", url)
    s = Settings.from_env()
    conn = create_celery(s).connection_for_write()
    assert int(conn.virtual_host) == db
    assert connect(s.redis_url).connection_pool.connection_kwargs["db"] == db


@pytest.mark.parametrize("ttl,heartbeat,socket_timeout,says", [
    (10.0, 2.0, 5.0, None),  # the defaults: 2 x 2 + 5 = 9 s <= 10
    (10.0, 2.0, 6.0, None),  # exactly the TTL
    (3.0, 0.5, 5.0, "set MAKESPAN_REDIS_SOCKET_TIMEOUT_S to at most 2 s"),  # the tests' TTL with the default timeout
    (10.0, 3.0, 5.0, "set MAKESPAN_REDIS_SOCKET_TIMEOUT_S to at most 4 s"),  # a heartbeat from_env takes (<= TTL/2)
    (2.0, 1.0, 5.0, "raise MAKESPAN_LEASE_TTL_S or lower MAKESPAN_HEARTBEAT_S"),  # no socket timeout fits
])
def test_settings_a_blocked_renewal_would_lose_a_lease_with_are_warned_of(ttl, heartbeat, socket_timeout, says):
    """A Redis socket timeout as long as the lease TTL (or so long that, after one renewal
    blocked for all of it, the next renewal a heartbeat later comes after the expiry) was
    taken without a word: a half-open connection then lost the lease and the job was
    reclaimed while its worker still ran it. Too many settings in use have it (the tests'
    3 s TTL with the default 5 s timeout, the fault benches') to refuse it as the heartbeat
    rule does: a GPU worker warns as it starts (the warning seen in a real worker's log:
    tests/workers/test_unexpected_errors.py)."""
    from makespan.settings import lease_renewal_warning

    warning = lease_renewal_warning(Settings(lease_ttl_s=ttl, heartbeat_s=heartbeat,
                                             redis_socket_timeout_s=socket_timeout))
    if says is None:
        assert warning is None
        return
    assert warning is not None and says in warning
    assert f"MAKESPAN_REDIS_SOCKET_TIMEOUT_S ({socket_timeout:g} s) is too long for MAKESPAN_LEASE_TTL_S ({ttl:g} s)" \
        in warning and f"{2 * heartbeat + socket_timeout:g} s after the last renewal" in warning



@pytest.mark.parametrize("ttl, socket_timeout, lock_timeout", [
    (10.0, 5.0, 5.0 / 3),  # the defaults: lock 5 s, extend every 1.67 s: the lock's commands wait 1.67 s at most
    (3.0, 5.0, 0.5),  # the tests' settings: lock 1.5 s
    (30.0, 5.0, 5.0),  # lock 15 s, extend every 5 s: 2 x 5 + 5 = 15 fits the socket timeout itself
    (10.0, 1.5, 1.5),
])
def test_settings_a_blocked_planner_lock_extend_fails_before_the_lock_can_expire(ttl, socket_timeout, lock_timeout):
    """The planner's leader lock (half the lease TTL, extended every third of it) and the
    Redis socket timeout were never compared: with the defaults (a 5 s lock, a 5 s timeout)
    one extend blocked on a half-open connection outlived the lock. The lock's commands now
    wait at most TTL - 2 x extend interval (Settings.planner_lock_socket_timeout_s, on a
    client of their own), and the planner steps down when its lock may have expired anyway;
    planner_lock_warning speaks only for a lock client whose timeout could not be shortened."""
    from makespan.settings import planner_lock_warning

    settings = Settings(lease_ttl_s=ttl, redis_socket_timeout_s=socket_timeout)
    assert settings.planner_lock_ttl_s == max(ttl / 2, 1.0)
    assert settings.planner_lock_renewal_s == settings.planner_lock_ttl_s / 3
    assert settings.planner_lock_socket_timeout_s == pytest.approx(lock_timeout)
    assert 2 * settings.planner_lock_renewal_s + settings.planner_lock_socket_timeout_s <= settings.planner_lock_ttl_s + 1e-9
    assert planner_lock_warning(settings) is None  # the lock's own timeout always fits
    if socket_timeout > lock_timeout + 1e-9:  # a lock client that kept the socket timeout: said as the planner starts
        warning = planner_lock_warning(settings, socket_timeout)
        assert warning is not None and f"wait up to {socket_timeout:g} s for Redis" in warning, warning
        assert f"retried {2 * settings.planner_lock_renewal_s + socket_timeout:g} s after the last one" in warning


def test_the_liveness_ttl_must_be_under_the_lease_ttl_or_a_warning_says_why():
    """An operator's kill -9 of a worker: with both TTLs at 10 s its reclaimed jobs were
    leased to the dead host again (the host still looked live). The default is under it,
    and settings that are not get a warning naming the fix."""
    from makespan.settings import Settings, liveness_warning

    assert liveness_warning(Settings()) is None  # the defaults: 7 s, under 10 − 2 s and over 4/3 × 5 s
    warned = liveness_warning(Settings(lease_ttl_s=10.0, worker_liveness_ttl_s=10.0))
    assert warned is not None and "not under MAKESPAN_LEASE_TTL_S − MAKESPAN_HEARTBEAT_S (8 s)" in warned
    # between half the lease TTL and the TTL less a heartbeat: a lease renewed a heartbeat before
    # the death expires 4 s after it, the host looks live for 5 (a review's case)
    assert liveness_warning(Settings(lease_ttl_s=6.0, heartbeat_s=2.0, worker_liveness_ttl_s=5.0)) is not None
    short = liveness_warning(Settings(worker_liveness_ttl_s=5.0, redis_socket_timeout_s=5.0))
    assert short is not None and "too short for MAKESPAN_REDIS_SOCKET_TIMEOUT_S" in short


def test_a_retention_age_above_the_result_ttl_is_warned():
    """Results then expire before their jobs' summaries: a finished job is found, its result
    is not (``ResultExpired``; workload-author new user)."""
    from makespan.settings import retention_warning

    assert retention_warning(Settings()) is None  # 1 h summaries, 7-day results
    warned = retention_warning(Settings(retention_age_s=30 * 86400.0))
    assert warned is not None and "MAKESPAN_RESULT_TTL_S" in warned and "ResultExpired" in warned


def test_a_submit_wait_as_long_as_the_socket_timeout_is_refused(monkeypatch):
    """A WAIT for replicas that outlasts the socket timeout ended as a read timeout, reported as
    "Redis did not answer" instead of the replicas' count (second review)."""
    monkeypatch.setenv("MAKESPAN_SUBMIT_WAIT_REPLICAS", "1")
    monkeypatch.setenv("MAKESPAN_SUBMIT_WAIT_TIMEOUT_S", "5")
    with pytest.raises(ValidationError, match="must be below MAKESPAN_REDIS_SOCKET_TIMEOUT_S"):
        Settings.from_env()
    monkeypatch.setenv("MAKESPAN_SUBMIT_WAIT_TIMEOUT_S", "2")
    assert Settings.from_env().submit_wait_timeout_s == 2.0


def test_a_gpu_worker_given_a_makespan_pool_as_its_celery_pool_fails_in_one_line(tmp_path, prefix):
    """``makespan gpu-worker --pool west`` (the planner's --pool is a makespan pool) exited 1
    after Celery's 187-line traceback (new-user check): now exit 2, one line that says what
    --pool is here and which pool the fleet file puts the host in."""
    import os
    import subprocess
    import sys

    fleet = tmp_path / "pools.toml"
    fleet.write_text('name = "p"\n[[hosts]]\nname = "west-a"\ngpu_count = 1\nmemory_mib = 81920\n'
                     '[[hosts]]\nname = "east-a"\ngpu_count = 1\nmemory_mib = 81920\n'
                     '[endpoints.e]\nmodel = "m"\nmemory_mib_per_gpu = 1000\ncold_start_s = 1\n'
                     '[[pools]]\nname = "west"\nhosts = ["west-a"]\n[[pools]]\nname = "east"\nhosts = ["east-a"]\n')
    env = {**os.environ, "MAKESPAN_REDIS_URL": "redis://127.0.0.1:1/0", "MAKESPAN_KEY_PREFIX": prefix}
    out = subprocess.run([sys.executable, "-m", "makespan.cli", "gpu-worker", "--fleet", str(fleet), "--host", "west-a",
                          "--pool", "west"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and "one of threads, prefork, solo" in out.stderr, out.stderr
    assert "puts host west-a in pool west" in out.stderr, out.stderr
