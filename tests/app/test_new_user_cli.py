"""What a new user tripped on (issue 16): ``makespan ready`` on a misspelt name, Redis
down at submit and connect, ``makespan jobs`` without a header or finished jobs, and
``status`` showing ``attempts: 0`` beside ``result_attempt: 1``. Real Redis, the real CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import makespan
from makespan.cli import app as cli_app
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.registry import REGISTRY, publish, withdraw
from tests.conftest import FLEET_TOML


def _env(redis_url: str, prefix: str) -> dict[str, str]:
    return {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}


def test_ready_on_a_misspelt_name_lists_the_live_names_and_fails(r, keys, redis_url, prefix):
    from tests.workloads import fns  # noqa: F401 - registers 'add', 'boom', ...

    publish(r, keys, [REGISTRY["add"], REGISTRY["boom"]], ttl_s=30, holder="test")
    r.set(keys.fleet, "{}")
    res = CliRunner().invoke(cli_app, ["ready", "ad", "--timeout-s", "0.3"], env=_env(redis_url, prefix))
    assert res.exit_code == 1, res.output
    assert "waiting for workload 'ad'" in res.output
    assert "live workload functions: add, boom" in res.output and "did you mean 'add' instead of 'ad'?" in res.output
    # said as the wait begins, not only once the whole timeout passed (a new user waited 60 s for it)
    early = "note: no GPU worker has registered workload 'ad'; did you mean 'add'?"
    assert early in res.output and res.output.index(early) < res.output.index("not ready after"), res.output
    assert CliRunner().invoke(cli_app, ["ready", "add", "--timeout-s", "1"], env=_env(redis_url, prefix)).exit_code == 0


def test_ready_waits_for_a_planner_that_leads_not_only_a_published_fleet(r, keys, redis_url, prefix):
    """The fleet key outlives its planner: ``ready`` printed "ready" with every planner
    stopped, and the job a script then submitted waited (no_planner). A function submit says
    so too, as a plain job's does."""
    from tests.workloads import fns  # noqa: F401 - registers 'add', 'boom', ...

    from makespan.models import parse_fleet

    fleet = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"sim": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 1}}})
    publish(r, keys, [REGISTRY["add"]], ttl_s=30, holder="test")
    r.set(keys.fleet, fleet.model_dump_json())  # published by a planner that has stopped since
    res = CliRunner().invoke(cli_app, ["ready", "add", "--timeout-s", "0.3"], env=_env(redis_url, prefix))
    assert res.exit_code == 1 and "a planner leading the fleet (none leads now)" in res.output, res.output
    sub = CliRunner().invoke(cli_app, ["submit", "add", "--args", "[1, 2]", "-q"], env=_env(redis_url, prefix))
    assert sub.exit_code == 0 and "warning: no planner leads this fleet" in sub.output, sub.output
    assert "the job waits queued, reason no_planner" in sub.output
    later = CliRunner().invoke(cli_app, ["submit", "add", "--args", "[1, 2]", "--delay-s", "2", "-q"],
                               env=_env(redis_url, prefix))  # delayed first: not "waits queued" (fresh-clone check)
    assert later.exit_code == 0 and "the job stays delayed past its delay" in later.output, later.output
    r.set(keys.planner_leader, "planner-1")  # a planner leads again
    res = CliRunner().invoke(cli_app, ["ready", "add", "--timeout-s", "1"], env=_env(redis_url, prefix))
    assert res.exit_code == 0 and res.output.strip() == "ready", res.output


def test_ready_waits_for_the_planners_fleet_to_have_the_functions_endpoint(r, keys, redis_url, prefix):
    """A GPU worker checks a function's endpoint against its own fleet file: with the planner
    on another one, ``ready`` said "ready" and every submit then failed (unknown endpoint)."""
    from tests.workloads import fns  # noqa: F401 - registers 'add' (endpoint 'sim')

    from makespan.models import parse_fleet

    other = parse_fleet({"name": "other", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"echo": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 1}}})
    publish(r, keys, [REGISTRY["add"]], ttl_s=30, holder="test")
    r.set(keys.fleet, other.model_dump_json())
    r.set(keys.planner_leader, "planner-1")
    res = CliRunner().invoke(cli_app, ["ready", "add", "--timeout-s", "0.3"], env=_env(redis_url, prefix))
    assert res.exit_code == 1, res.output
    assert "the planner's fleet to have endpoint 'sim' of workload 'add'" in res.output and "'other'" in res.output


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_redis_down_names_the_url_and_the_variable(prefix):
    url = f"redis://:s3cret@127.0.0.1:{_closed_port()}/0"
    shown = url.replace(":s3cret@", ":***@")
    with pytest.raises(makespan.RedisUnreachable) as err:
        makespan.connect(url, key_prefix=prefix)
    assert shown in str(err.value) and "MAKESPAN_REDIS_URL" in str(err.value) and "s3cret" not in str(err.value)
    assert isinstance(err.value, makespan.StoreError)  # callers that catch StoreError still do
    env = {**os.environ, **_env(url, prefix)}
    cli = subprocess.run([sys.executable, "-m", "makespan.cli", "submit", "add", "--args", "[1, 2]"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode != 0 and "Traceback" not in cli.stderr, cli.stderr
    assert shown in cli.stderr and "MAKESPAN_REDIS_URL" in cli.stderr and "s3cret" not in cli.stderr
    script = subprocess.run([sys.executable, "-c", "import makespan; makespan.connect().submit('add', 1, 2)"],
                            env=env, capture_output=True, text=True, timeout=60)
    last = script.stderr.strip().splitlines()[-1]
    assert last.startswith("makespan.errors.RedisUnreachable: cannot reach Redis at " + shown), script.stderr
    assert "redis/connection.py" not in script.stderr  # no redis-py traceback chained under it


def test_a_client_whose_redis_goes_away_says_so_at_submit(prefix):
    """A Client built without connect()'s check (Redis gone since): submit raises
    RedisUnreachable naming the URL, not a bare StoreError."""
    from makespan.client import Client
    from makespan.redis_conn import connect as redis_connect
    from makespan.settings import Settings

    url = f"redis://127.0.0.1:{_closed_port()}/0"
    client = Client(redis_connect(url), Settings(redis_url=url, key_prefix=prefix))
    with pytest.raises(makespan.RedisUnreachable, match="MAKESPAN_REDIS_URL") as err:
        client.submit("add", 1, 2)
    assert url in str(err.value)


def test_jobs_prints_a_header_and_lists_finished_jobs(r, keys, settings, redis_url, prefix):
    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    queued = prod.submit({"endpoint": "chat", "service_s": 5})
    gone = prod.submit({"endpoint": "chat", "service_s": 5})
    assert prod.cancel(gone.id) == "cancelled"
    env = _env(redis_url, prefix)
    res = CliRunner().invoke(cli_app, ["jobs"], env=env)
    lines = res.output.splitlines()
    assert res.exit_code == 0 and lines[0].split() == ["ID", "PRIORITY", "ENDPOINT", "STATE", "REASON", "ETA/OUTCOME"]
    assert [line.split()[0] for line in lines[1:]] == [queued.id]
    res = CliRunner().invoke(cli_app, ["jobs", "--state", "cancelled", "--state", "completed"], env=env)
    assert res.exit_code == 0 and [line.split()[:5] for line in res.output.splitlines()[1:]] == \
        [[gone.id, "NORMAL", "chat", "cancelled", "-"]]
    # an ended job's row says how it ended (the record's reason, as ``why`` prints it), not a bare '-',
    # after when it ended
    outcome = r.hget(keys.job(gone.id), "reason")
    cell = res.output.splitlines()[1].split(None, 5)[5]
    assert outcome and cell.startswith("ended ") and cell.endswith(f": {outcome}"), cell
    res = CliRunner().invoke(cli_app, ["jobs", "--state", "completed"], env=env)
    assert res.exit_code == 0 and "no job completed" in res.output
    # cut at --limit: how many are queued in all, per level (a large-queue user had no total anywhere)
    prod.submit({"endpoint": "chat", "service_s": 5, "priority": "HIGH"})
    res = CliRunner().invoke(cli_app, ["jobs", "--limit", "1"], env=env)
    assert "queued now: CRITICAL 0, HIGH 1, NORMAL 1, LOW 0 (2 in all)" in res.output, res.output


def test_result_of_a_job_not_finished_yet_has_its_own_exit_code(r, keys, settings, redis_url, prefix):
    """``makespan result ID --no-wait`` on a job still running printed ``error: job ... still
    running after 0.0 s`` and exited 2, as for an unknown job or Redis down (found by a
    new-user trial): now exit 4, and no "after 0" for a look that did not wait."""
    from makespan.cli_support import EXIT_NOT_FINISHED

    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    job = prod.submit({"endpoint": "chat", "service_s": 5})
    r.hset(keys.job(job.id), "state", "running")
    env = _env(redis_url, prefix)
    res = CliRunner().invoke(cli_app, ["result", job.id, "--no-wait"], env=env)
    assert EXIT_NOT_FINISHED == 4 and res.exit_code == EXIT_NOT_FINISHED, res.output
    assert f"job {job.id} is running: not finished yet" in res.output and "after 0" not in res.output, res.output
    assert "error:" not in res.output and "exit code 4" in res.output
    res = CliRunner().invoke(cli_app, ["result", job.id, "--timeout-s", "0.2"], env=env)
    assert res.exit_code == EXIT_NOT_FINISHED and f"job {job.id} still running after 0.2 s" in res.output, res.output
    res = CliRunner().invoke(cli_app, ["result", "no-such-job", "--no-wait"], env=env)
    assert res.exit_code == 2 and "error:" in res.output, res.output  # unknown: not "not finished yet"
    help_text = CliRunner().invoke(cli_app, ["result", "--help"], env=env).output
    assert "4 not finished yet" in " ".join(help_text.replace("│", " ").split()), help_text


def test_status_counts_the_attempts_made(r, keys, settings):
    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    job = prod.submit({"endpoint": "chat", "service_s": 5})
    st = prod.status(job.id)
    assert (st["attempts"], st["reclaimed_attempts"]) == (0, 0)
    # what the GPU worker's fenced commit leaves for a function job that completed on its first try
    r.hset(keys.job(job.id), mapping={"state": "completed", "result_attempt": 1})
    st = prod.status(job.id)
    assert (st["attempts"], st["result_attempt"], st["reclaimed_attempts"]) == (1, 1, 0)
    # one lease reclaimed, the second attempt running
    r.hset(keys.job(job.id), mapping={"state": "running", "attempts": 1})
    r.hdel(keys.job(job.id), "result_attempt")
    assert (prod.status(job.id)["attempts"], prod.status(job.id)["reclaimed_attempts"]) == (2, 1)
    # cancelled while queued (no lease on its record): no attempt made
    queued = prod.submit({"endpoint": "chat", "service_s": 5}).id
    assert prod.cancel(queued) == "cancelled" and prod.status(queued)["attempts"] == 0
    # the reclaim of a lease whose phase had started cancels the job: that attempt is a reclaimed one, counted once
    r.hset(keys.job(job.id), mapping={"state": "cancelled", "attempts": 2, "lease": "L2",
                                      "reason": "cancelled; lease reclaimed"})
    assert (prod.status(job.id)["attempts"], prod.status(job.id)["reclaimed_attempts"]) == (2, 2)


def test_jobs_lists_finished_jobs_after_the_retention_sweep_compacted_them(r, keys, settings, redis_url, prefix):
    """`makespan jobs --state cancelled` after the planner's retention sweep moved the job
    from P:finished to P:retained (within MAKESPAN_RETENTION_SWEEP_S): still listed, the
    latest finished first, beside one not compacted yet."""
    from makespan.workers.retention import Retention

    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    older, newer = prod.submit({"endpoint": "chat", "service_s": 5}), prod.submit({"endpoint": "chat", "service_s": 5})
    assert prod.cancel(older.id) == "cancelled"
    assert Retention(r, settings).sweep().compacted == 1
    assert r.zscore(keys.retained, older.id) is not None and r.zscore(keys.finished, older.id) is None
    assert prod.cancel(newer.id) == "cancelled"  # not compacted yet: on P:finished
    r.zadd(keys.finished, {newer.id: float(r.zscore(keys.retained, older.id)) + 1.0})  # finished later, whatever the clock
    env = _env(redis_url, prefix)
    res = CliRunner().invoke(cli_app, ["jobs", "--state", "cancelled", "--state", "completed"], env=env)
    assert res.exit_code == 0, res.output
    assert [line.split()[:4] for line in res.output.splitlines()[1:]] == \
        [[newer.id, "NORMAL", "chat", "cancelled"], [older.id, "NORMAL", "chat", "cancelled"]]
    res = CliRunner().invoke(cli_app, ["jobs", "--state", "cancelled", "--limit", "1"], env=env)
    assert [line.split()[0] for line in res.stdout.splitlines()[1:]] == [newer.id]
    assert "listed the first 1 (--limit 1); more may match" in res.stderr  # it stopped there silently


@pytest.mark.parametrize("argv", [
    ["status", "abc"], ["why", "abc"], ["jobs"], ["cancel", "abc"], ["result", "abc", "--no-wait"],
    ["result", "abc"],  # a wait: it said "Redis connection lost ... retrying for up to 30 s" first (a new user)
    ["transitions", "--fleet", str(FLEET_TOML)], ["submit", "--endpoint", "chat", "--service-s", "3"],
    ["uncordon", "a"], ["hosts"],  # they wrapped the redis-py error: "error: uncordoning host a: Error 111 …"
    ["incidents", "--redis-url", "URL"],  # the option's URL is named, not MAKESPAN_REDIS_URL's
], ids=lambda argv: argv[0])
def test_every_redis_command_says_redis_is_unreachable(argv, prefix):
    """With no Redis at MAKESPAN_REDIS_URL every command that talks to Redis prints
    RedisUnreachable's message (the URL, password redacted, and the variable) and exits
    69: no traceback, no bare redis-py 'Error 111'. The real entry point, in a subprocess."""
    url = f"redis://:s3cret@127.0.0.1:{_closed_port()}/0"
    env_url = f"redis://127.0.0.1:{_closed_port()}/1" if "URL" in argv else url
    argv = [url if arg == "URL" else arg for arg in argv]
    cli = subprocess.run([sys.executable, "-m", "makespan.cli", *argv], env={**os.environ, **_env(env_url, prefix)},
                         capture_output=True, text=True, timeout=60)
    # its own exit code, 69 (EX_UNAVAILABLE): a script retries it, and not a bad input's 2 (an automation
    # engineer's retry loop on exit 2 would have looped for ever on a typo)
    assert cli.returncode == 69 and "Traceback" not in cli.stderr, cli.stderr
    assert "error: cannot reach Redis at " + url.replace(":s3cret@", ":***@") in cli.stderr, cli.stderr
    assert "MAKESPAN_REDIS_URL" in cli.stderr and "s3cret" not in cli.stderr + cli.stdout
    assert cli.stderr.count("error: ") == 1, cli.stderr  # one message, not the command's and then ours
    assert "retrying" not in cli.stderr, cli.stderr


@pytest.fixture
def password_redis():
    """A private redis-server that asks for the password ``right-one`` (its own, torn down after)."""
    from makespan.redis_conn import connect as redis_connect
    from makespan.redis_conn import start_embedded

    server = start_embedded()
    redis_connect(server.url).config_set("requirepass", "right-one")
    yield server.url
    server.stop()


@pytest.mark.parametrize("password", ["wrong-one", None], ids=["wrong", "missing"])
def test_refused_credentials_name_the_url_and_where_the_password_goes(password_redis, password, prefix):
    """A wrong or missing password is not 'unreachable' and not a traceback: connect()
    raises RedisAuthFailed naming the URL (password redacted) and MAKESPAN_REDIS_URL; the
    CLI prints that message once and exits 2. The real entry point, in a subprocess."""
    url = password_redis.replace("redis://", f"redis://:{password}@") if password else password_redis
    with pytest.raises(makespan.RedisAuthFailed) as err:
        makespan.connect(url, key_prefix=prefix)
    message = str(err.value)
    assert "refused the credentials" in message and "MAKESPAN_REDIS_URL" in message, message
    assert "cannot reach" not in message and (password is None or password not in message), message
    for argv in (["jobs"], ["status", "abc"], ["submit", "--endpoint", "chat", "--service-s", "3"],
                 ["ready", "some.fn", "--timeout-s", "50"]):  # ready must not wait out its timeout (timeout=40 below)
        cli = subprocess.run([sys.executable, "-m", "makespan.cli", *argv], env={**os.environ, **_env(url, prefix)},
                             capture_output=True, text=True, timeout=40)
        assert cli.returncode == 2 and "Traceback" not in cli.stderr, cli.stderr  # refused credentials: permanent
        assert cli.stderr.count("error: ") == 1 and "refused the credentials" in cli.stderr, cli.stderr
        assert password is None or password not in cli.stderr + cli.stdout


def test_the_dashboard_does_not_print_the_redis_password(password_redis, prefix):
    """`makespan dashboard` announces its Redis URL at start with the password hidden."""
    url = password_redis.replace("redis://", "redis://:right-one@")
    proc = subprocess.Popen([sys.executable, "-m", "makespan.cli", "dashboard", "--port", str(_closed_port())],
                            env={**os.environ, **_env(url, prefix)}, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
    finally:
        proc.kill()
        proc.wait(10)
    assert "makespan dashboard on" in line and ":***@" in line and "right-one" not in line, line


def test_an_unreachable_sentinel_set_fails_within_the_socket_timeout(prefix):
    """Three Sentinels, none listening: connect() raises RedisUnreachable within
    MAKESPAN_REDIS_SOCKET_TIMEOUT_S (the bound docs/configuration.md gives every wait), not
    after redis-py's retries with backoff on each Sentinel (9-12 s before)."""
    import time

    from makespan.settings import Settings

    hosts = ",".join(f"127.0.0.1:{_closed_port()}" for _ in range(3))
    started = time.monotonic()
    with pytest.raises(makespan.RedisUnreachable, match="no Sentinel answered at 127.0.0.1:"):
        makespan.connect(f"redis+sentinel://{hosts}/mymaster/0", key_prefix=prefix)
    assert time.monotonic() - started < Settings().redis_socket_timeout_s


def test_gpu_worker_says_what_it_starts_and_warns_of_a_second_consumer(r, keys, redis_url, prefix, monkeypatch,
                                                                         capsys):
    """gpu-worker prints one line before Celery's banner (host, simulated GPUs, the workload
    functions it loaded) and warns when another GPU worker already consumes the host's queue
    (found by a new-user trial: a second worker with other --workloads started silently, and
    a retry landing on it failed with UnknownWorkload)."""
    from makespan.cli import _say_what_starts
    from makespan.models import load_fleet

    monkeypatch.setenv("MAKESPAN_REDIS_URL", redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", prefix)
    host = load_fleet(FLEET_TOML).hosts[0]
    _say_what_starts(host, "tests.workloads.fns", ["add", "boom"])
    err = capsys.readouterr().err
    assert f"gpu-worker {host.name}: {len(host.gpus)} GPUs" in err and "add, boom" in err
    assert "warning" not in err
    r.set(keys.host_live(host.name), "other-machine:4242:abcd", px=60_000)
    _say_what_starts(host, "", [])
    err = capsys.readouterr().err
    assert "no workload functions" in err
    assert f"warning: another GPU worker (other-machine:4242:abcd) already consumes host {host.name!r}" in err
    # the last worker of this machine, killed and started again: it is gone, its mark not yet
    # (the warning sent the operator hunting for a process that does not exist; new user)
    import socket
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    r.set(keys.host_live(host.name), f"{socket.gethostname()}:{gone.pid}:abcd", px=60_000)
    _say_what_starts(host, "", [])
    err = capsys.readouterr().err
    assert "warning: another GPU worker" not in err
    assert "ran on this machine and is no longer running; its liveness mark runs out within" in err
    alive = f"{socket.gethostname()}:{os.getpid()}:abcd"  # a live process of this machine: still a warning
    r.set(keys.host_live(host.name), alive, px=60_000)
    _say_what_starts(host, "", [])
    assert f"warning: another GPU worker ({alive}) already consumes" in capsys.readouterr().err


def test_gpu_worker_warns_when_its_fleet_file_differs_from_the_published_one(r, keys, redis_url, prefix,
                                                                                monkeypatch, capsys):
    """A GPU worker started with an older fleet file than the planner's is told at start, with
    the endpoints it lacks (found by a review: a job of an endpoint the worker's file lacks
    failed there with a KeyError and held its lease until it expired)."""
    from makespan.cli import _say_what_starts
    from makespan.models import fleet_version, load_fleet

    monkeypatch.setenv("MAKESPAN_REDIS_URL", redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", prefix)
    planners = load_fleet(FLEET_TOML)
    mine = planners.model_copy(update={"endpoints": {k: v for k, v in planners.endpoints.items() if k != "chat"}})
    r.mset({keys.fleet: planners.model_dump_json(), keys.fleet_version: fleet_version(planners)})
    _say_what_starts(planners.hosts[0], "", [], planners)
    assert "differs from the fleet" not in capsys.readouterr().err  # the same file: no warning
    _say_what_starts(mine.hosts[0], "", [], mine)
    err = capsys.readouterr().err
    assert f"differs from the fleet the planner published (version {fleet_version(planners)})" in err
    assert "it lacks endpoints chat" in err and "no job will be planned here" not in err
    # a worker for a host the planner's fleet does not have gets no job: it says so (an SRE's report)
    extra = mine.hosts[0].model_copy(update={"name": "host-new"})
    _say_what_starts(extra, "", [], mine.model_copy(update={"hosts": (*mine.hosts, extra)}))
    assert "the planner's fleet has no host 'host-new': no job will be planned here" in capsys.readouterr().err


def test_gpu_worker_says_its_simulated_slowdown_and_warns_of_a_host_the_fleet_lacks(r, keys, redis_url, prefix,
                                                                                    monkeypatch, capsys):
    """A misspelt host in MAKESPAN_SIMULATED_SLOWDOWN slowed nothing, silently (on-call new user)."""
    from makespan.cli import _say_what_starts
    from makespan.models import load_fleet

    monkeypatch.setenv("MAKESPAN_REDIS_URL", redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", prefix)
    fleet = load_fleet(FLEET_TOML)
    host = fleet.hosts[0]
    monkeypatch.setenv("MAKESPAN_SIMULATED_SLOWDOWN", f"{host.name}=3,hots-b=2")
    _say_what_starts(host, "", [], fleet)
    err = capsys.readouterr().err
    assert f"gpu-worker {host.name}: simulated transitions slowed 3x" in err
    assert "warning: MAKESPAN_SIMULATED_SLOWDOWN names hots-b, no host of the fleet" in err


def test_submit_with_an_object_as_args_says_to_pass_it_as_kwargs(redis_url, prefix, monkeypatch):
    """``--args '{"a": 1}'`` said "--args must be a JSON list and --kwargs a JSON object"
    without naming the fix (workload-author new user)."""
    from typer.testing import CliRunner

    from makespan.cli import app as cli_app

    monkeypatch.setenv("MAKESPAN_REDIS_URL", redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", prefix)
    res = CliRunner().invoke(cli_app, ["submit", "add", "--args", '{"a": 1, "b": 2}'])
    assert res.exit_code == 2, res.output
    assert """pass keyword arguments as --kwargs '{"a": 1, "b": 2}'""" in res.output


def test_gpu_worker_start_line_does_not_list_a_refused_function_as_loaded(capsys):
    """A function naming an endpoint the fleet lacks is not published (refused), yet the start
    line listed it among the loaded ones (workload-author new user)."""
    from makespan.cli import _say_what_starts
    from makespan.models import load_fleet
    from makespan.registry import load_modules

    fleet = load_fleet(FLEET_TOML)
    names = [name for name in load_modules("tests.workloads.fns_badep") if name == "badep"]
    _say_what_starts(fleet.hosts[0], "tests.workloads.fns_badep", names, fleet)
    err = capsys.readouterr().err
    assert "workload functions: none usable" in err
    assert "not published (each names an endpoint the fleet does not have): badep ('nope')" in err


def test_nothing_registered_names_the_key_prefix_it_looked_under(r, keys, redis_url, prefix, monkeypatch):
    """A client on another key prefix than the workers' read "no GPU worker has registered any
    workload function" and `ready` "no fleet published", naming neither the prefix nor the URL
    (workload-author new user)."""
    from typer.testing import CliRunner

    from makespan.cli import app as cli_app
    from makespan.errors import ValidationError
    from makespan.registry import live_definition

    monkeypatch.setenv("MAKESPAN_REDIS_URL", redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", prefix)
    res = CliRunner().invoke(cli_app, ["ready", "add", "--timeout-s", "0.3"])
    assert res.exit_code == 1
    assert f"no fleet published under key prefix {prefix!r} at redis://" in res.output, res.output
    assert f"no GPU worker has registered any workload function under key prefix {prefix!r}" in res.output
    with pytest.raises(ValidationError, match=f"under key prefix {prefix!r}"):
        live_definition(r, keys, "add")


def test_functions_whose_workers_stopped_are_not_blamed_on_the_key_prefix(r, keys, redis_url, prefix, monkeypatch):
    """Every worker that registered functions stopped (a rolling restart): `ready` and a
    non-accepting lookup said "no GPU worker has registered any workload function under key
    prefix ..." and sent the user looking for a prefix mismatch (Celery user's check). They
    name the hosts that had it, and `ready` says the workers stopped."""
    import json

    from makespan.errors import ValidationError
    from makespan.registry import live_definition, submit_definition

    monkeypatch.setenv("MAKESPAN_REDIS_URL", redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", prefix)
    r.set(keys.fn("gpu_jobs.score"), json.dumps({"name": "gpu_jobs.score", "endpoint": "renderer", "parameters": []}))
    r.sadd(keys.fns, "gpu_jobs.score")
    seconds, micros = r.time()
    r.zadd(keys.fn_hosts("gpu_jobs.score"), {"host-a": seconds * 1000 + micros // 1000 - 1})  # its mark ran out
    with pytest.raises(ValidationError, match="the GPU workers of host-a registered it last"):
        live_definition(r, keys, "gpu_jobs.score")
    assert submit_definition(r, keys, "gpu_jobs.score")[2] == ("host-a",)  # a submit is accepted: it waits
    res = CliRunner().invoke(cli_app, ["ready", "gpu_jobs.score", "--timeout-s", "0.3"])
    assert res.exit_code == 1
    assert "no GPU worker is live now" in res.output and "gpu_jobs.score among them" in res.output, res.output
    assert "under key prefix" in res.output and "has registered any" not in res.output, res.output


def test_ready_is_not_fooled_by_the_mark_of_a_worker_killed_on_this_machine(r, keys, redis_url, prefix, monkeypatch):
    """A GPU worker SIGKILLed here leaves its function's 30 s mark: ``ready`` said ready while
    ``makespan hosts`` already showed the host down (Celery user's check)."""
    import json
    import socket

    monkeypatch.setenv("MAKESPAN_REDIS_URL", redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", prefix)
    fleet = load_fleet(FLEET_TOML)
    r.set(keys.fleet, fleet.model_dump_json())
    r.set(keys.fn("gpu_jobs.score"), json.dumps({"name": "gpu_jobs.score", "endpoint": "renderer", "parameters": []}))
    gone = subprocess.Popen(["true"])
    gone.wait()
    seconds, micros = r.time()
    r.set(keys.fn_live("gpu_jobs.score"), "1", px=30_000)
    r.zadd(keys.fn_holders("gpu_jobs.score"),
           {f"{socket.gethostname()}:{gone.pid}:abcd1234": seconds * 1000 + micros // 1000 + 30_000})
    r.set(keys.planner_leader, "a-planner", px=30_000)  # everything else is ready
    res = CliRunner().invoke(cli_app, ["ready", "gpu_jobs.score", "--timeout-s", "0.3"])
    assert res.exit_code == 1 and "waiting for workload 'gpu_jobs.score'" in res.output, res.output
    r.zadd(keys.fn_holders("gpu_jobs.score"), {"another-machine:1:abcd": seconds * 1000 + micros // 1000 + 30_000})
    res = CliRunner().invoke(cli_app, ["ready", "gpu_jobs.score", "--timeout-s", "0.3"])
    assert res.exit_code == 0 and res.output.strip() == "ready", res.output  # a worker elsewhere holds it


def test_jobs_json_keeps_when_a_finished_job_was_leased_and_started(r, keys, settings, redis_url, prefix):
    """`jobs --state completed --json` and `why --json` of a finished job give when its last
    lease was granted and its execute phase began (they were None once it ended: a notebook
    user could not see how long it had waited or run), also after the retention sweep
    compacted its record to a summary."""
    from makespan.workers.retention import Retention

    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    job = prod.submit({"endpoint": "chat", "service_s": 5})
    # what the GPU worker's fenced commit leaves of a completed job's run
    now_s = float(r.time()[0])  # recent: the retained summary lives as long as the retention age
    leased_s, started_s, finished_s = now_s - 9.5, now_s - 7.75, now_s
    r.hset(keys.job(job.id), mapping={"state": "completed", "leased_at": repr(leased_s), "started_at": repr(started_s),
                                      "finished_at": repr(finished_s)})
    r.zadd(keys.finished, {job.id: finished_s})
    env = _env(redis_url, prefix)
    for compacted in (False, True):
        if compacted:
            assert Retention(r, settings).sweep().compacted == 1
        res = CliRunner().invoke(cli_app, ["jobs", "--state", "completed", "--json"], env=env)
        assert res.exit_code == 0, res.output
        (row,) = [json.loads(text) for text in res.stdout.splitlines()]  # JSON lines
        assert (row["leased_at"], row["started_at"], row["finished_at"]) == (leased_s, started_s, finished_s), row
        res = CliRunner().invoke(cli_app, ["why", job.id, "--json"], env=env)
        assert json.loads(res.stdout)["started_at"] == started_s, res.output


def test_a_waits_lost_redis_warning_gives_the_waits_own_limit(caplog):
    """`result ID --timeout-s 3` with Redis gone said "retrying for up to 30 s" and gave up at
    3.4 s (an automation engineer's script): the warning gives the limit the wait really has."""
    import logging

    import redis

    from makespan.client import WAIT_RECONNECT_S, _Outage
    from makespan.errors import StoreError

    error = StoreError("job j: gone")
    error.__cause__ = redis.ConnectionError("Connection refused")
    with caplog.at_level(logging.WARNING, logger="makespan.client"):
        _Outage("redis://127.0.0.1:1/0").failed(error, now=100.0, deadline=103.0)
        _Outage("redis://127.0.0.1:1/0").failed(error, now=100.0, deadline=None)
    assert "retrying for up to 3.0 s" in caplog.text
    assert f"retrying for up to {WAIT_RECONNECT_S:.1f} s" in caplog.text


def test_a_plain_submit_with_another_fleet_file_than_the_planners_is_refused(r, keys, redis_url, prefix, tmp_path):
    """A new user pasted the quickstart's ``submit --fleet examples/render-pipeline.toml``
    beside a planner of their own fleet: exit 0 with a warning about the workers' fleet,
    then the planner cancelled the job as "changed after the job was submitted". The fleet
    given must be the one the planner published (as the client's calls already required)."""
    from makespan.models import fleet_version, parse_fleet

    own = parse_fleet({"name": "mine", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 40000}],
                       "endpoints": {"echo": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 1}}})
    r.mset({keys.fleet: own.model_dump_json(), keys.fleet_version: fleet_version(own)})
    res = CliRunner().invoke(cli_app, ["submit", "--fleet", FLEET_TOML, "--endpoint", "renderer", "--service-s", "30",
                                       "-q"], env=_env(redis_url, prefix))
    assert res.exit_code == 2, res.output
    assert "differs from the fleet the planner published" in res.output and "omit --fleet" in res.output
    assert r.zcard(keys.queue("NORMAL")) == 0  # nothing written
    same = CliRunner().invoke(cli_app, ["submit", "--endpoint", "echo", "--service-s", "3", "-q"],
                              env=_env(redis_url, prefix))
    assert same.exit_code == 0, same.output


def test_jobs_filters_by_function_and_an_ended_job_says_where_it_ran(r, keys, settings, redis_url, prefix):
    """A new user: "which of my thumbs.* jobs failed, and where?" had no answer from the CLI:
    `jobs` had no function column or filter, and an ended job's host was gone."""
    import uuid

    from tests.workloads import fns  # noqa: F401 - registers 'add', 'boom', ...
    from makespan.client import Client
    from makespan.models import fleet_version
    from makespan.store.leases import finish_job_op
    from makespan.workers.leases import LeaseStore

    fleet = load_fleet(FLEET_TOML)
    r.mset({keys.fleet: fleet.model_dump_json(), keys.fleet_version: fleet_version(fleet)})
    publish(r, keys, [REGISTRY["add"], REGISTRY["boom"]], ttl_s=30, holder="test")
    client = Client(r, settings)
    boom, add = client.submit("boom", "x", endpoint="chat"), client.submit("add", 1, 2, endpoint="chat")
    gpu = fleet.hosts[0].gpus[0].uuid
    lease = LeaseStore(r, keys).acquire(uuid.uuid4().hex, (gpu,), 30.0, job_id=boom.id, kind="job",
                                        holder=fleet.hosts[0].name, queue=keys.queue("NORMAL"))
    assert lease is not None
    assert LeaseStore(r, keys).fenced(lease, [finish_job_op(keys, boom.id, "failed", 1.0, "execute: x"),
                                              ("DEL", keys.lease(lease.lease_id))])
    env = _env(redis_url, prefix)
    res = CliRunner().invoke(cli_app, ["jobs", "--state", "failed", "--state", "queued", "--fn", "boom", "--json"],
                             env=env)
    assert res.exit_code == 0, res.output
    [row] = [json.loads(line) for line in res.output.splitlines()]
    assert (row["id"], row["fn"], row["state"], row["host"]) == (boom.id, "boom", "failed", fleet.hosts[0].name)
    res = CliRunner().invoke(cli_app, ["jobs", "--fn", "add", "--json"], env=env)
    assert [json.loads(line)["id"] for line in res.output.splitlines()] == [add.id]
    # a name no worker registered is refused, as an unknown --endpoint is (it said "no job", exit 0)
    res = CliRunner().invoke(cli_app, ["jobs", "--fn", "ad"], env=env)
    assert res.exit_code == 2 and "did you mean 'add'?" in res.output, res.output


def test_a_listing_whose_reader_goes_away_ends_quietly_with_141(r, keys, settings, redis_url, prefix):
    """A large-queue check: `makespan jobs | head -2` exited 1 (click's handling of a closed
    pipe), the code the docs give an unexpected error; it ends quietly with 128 + SIGPIPE."""
    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    for _ in range(1200):  # more than a pipe's 64 KiB buffer of rows
        prod.submit({"endpoint": "chat", "service_s": 5})
    cli = subprocess.Popen([sys.executable, "-m", "makespan.cli", "jobs", "--limit", "1200"],
                           env={**os.environ, **_env(redis_url, prefix)}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert cli.stdout.readline().split()[0] == "ID"
    cli.stdout.close()
    code = cli.wait(timeout=60)
    err = cli.stderr.read()
    assert code == 141 and "Traceback" not in err and "Exception ignored" not in err, (code, err)


def test_jobs_fn_refuses_an_empty_name_and_suggests_across_case(r, keys, redis_url, prefix):
    """A verifier: `jobs --fn ""` listed every job, and `--fn ADD` offered no suggestion."""
    from tests.workloads import fns  # noqa: F401 - registers 'add', 'boom', ...

    publish(r, keys, [REGISTRY["add"], REGISTRY["boom"]], ttl_s=30, holder="test")
    env = _env(redis_url, prefix)
    empty = CliRunner().invoke(cli_app, ["jobs", "--fn", ""], env=env)
    assert empty.exit_code == 2, empty.output
    upper = CliRunner().invoke(cli_app, ["jobs", "--fn", "ADD"], env=env)
    assert upper.exit_code == 2 and "did you mean 'add'?" in upper.output and "; known: add, boom" in upper.output


def test_functions_lists_what_the_gpu_workers_registered(r, keys, redis_url, prefix):
    """No command listed the workload functions (a stop-53 new user: "which names can I
    submit?"). ``makespan functions`` lists each with whether a live GPU worker has it, its
    hosts, endpoint, parameters, and the execute time the planner plans with."""
    from tests.workloads import fns  # noqa: F401 - registers 'add', 'boom', ...

    from makespan.estimates import record_ops

    env = _env(redis_url, prefix)
    empty = CliRunner().invoke(cli_app, ["functions"], env=env)
    assert empty.exit_code == 0 and "no GPU worker has registered a workload function" in empty.output
    publish(r, keys, [REGISTRY["add"]], ttl_s=30, holder="w1", host="host-a")
    publish(r, keys, [REGISTRY["boom"]], ttl_s=30, holder="w2", host="host-b")
    withdraw(r, keys, ["boom"], holder="w2", host="host-b")  # its only GPU worker stopped
    endpoint = REGISTRY["add"].endpoint
    pipe = r.pipeline()
    for actual_s in (2.0, 4.0, 3.0):
        for op, *args in record_ops(keys, "add", endpoint, actual_s):
            pipe.execute_command(op, *args)
    pipe.execute()
    res = CliRunner().invoke(cli_app, ["functions"], env=env)
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].startswith("add(") and ": live, endpoint " in lines[0] and "host-a" in lines[0], lines
    assert "planned execute 3 s (median of 3 runs)" in lines[0], lines
    assert lines[1].startswith("boom(") and ": not live" in lines[1] and "host-b" in lines[1], lines
    rows = json.loads(CliRunner().invoke(cli_app, ["functions", "--json"], env=env).output)
    assert [row["name"] for row in rows] == ["add", "boom"] and rows[0]["measured_runs"] == 3
    assert rows[0]["hosts"] == ["host-a"] and rows[0]["live"] and not rows[1]["live"]


def test_functions_lists_refused_functions_and_endpoints_the_fleet_lacks(r, keys, redis_url, prefix):
    """A function its worker refuses to publish (an endpoint the worker's fleet lacks) was
    missing from ``makespan functions``, and one whose endpoint the planner's fleet lacks read
    as healthy while ``ready`` and submits refused it (a verifier)."""
    from tests.workloads import fns  # noqa: F401 - registers 'add', 'boom', ...

    from makespan.models import parse_fleet

    env = _env(redis_url, prefix)
    publish(r, keys, [REGISTRY["add"]], ttl_s=30, holder="w1", host="host-a",
            refused={"ghost": "it names endpoint 'nosuch', which the worker's fleet lacks"})
    fleet = parse_fleet({"name": "one", "hosts": [{"name": "host-a", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"other": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 1}}})
    r.set(keys.fleet, fleet.model_dump_json())  # the planner's fleet: no endpoint of 'add'
    res = CliRunner().invoke(cli_app, ["functions"], env=env)
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].startswith("add(") and "the planner's fleet has no endpoint sim: a submit that does not name another" in lines[0]
    assert lines[1] == "ghost: refused: it names endpoint 'nosuch', which the worker's fleet lacks", lines
