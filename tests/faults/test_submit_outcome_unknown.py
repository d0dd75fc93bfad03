"""A submit whose script reached Redis but whose reply never came (Redis stalled past the
socket timeout) was reported as "cannot reach Redis … start Redis there, or set
MAKESPAN_REDIS_URL": the job was written all the same, and a caller retrying without an
idempotency key ran it twice (found by a reliability check). It raises
``SubmitOutcomeUnknown`` now, naming the job id to look up; a Redis that refuses the
connection is still ``RedisUnreachable``. A private redis-server, stopped with SIGSTOP."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading

import pytest

import makespan
from makespan.errors import RedisUnreachable, SubmitOutcomeUnknown
from makespan.keys import Keys
from makespan.producer import Producer
from makespan.redis_conn import connect
from makespan.settings import Settings
from makespan.store import JobStore

FLEET = {"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}}


def test_a_submit_without_a_reply_names_the_job_and_it_may_be_written(private_redis, monkeypatch):
    settings = dataclasses.replace(Settings(), redis_url=private_redis.url, key_prefix="sou",
                                   redis_socket_timeout_s=1.0)
    r = connect(settings.redis_url, settings=settings)
    prod = Producer(r, Keys("sou"), makespan.models.parse_fleet(FLEET), settings)
    prod.submit({"endpoint": "e", "service_s": 1})  # a connection and the loaded script: the next call sends it
    submit = JobStore.submit
    resumed = threading.Event()

    def stalled(self, *args, **kwargs):  # Redis stops right before the script is sent: it runs it on SIGCONT
        os.kill(private_redis.process.pid, signal.SIGSTOP)
        threading.Timer(2.5, lambda: (os.kill(private_redis.process.pid, signal.SIGCONT), resumed.set())).start()
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(JobStore, "submit", stalled)
    with pytest.raises(SubmitOutcomeUnknown, match="may or may not be written; look it up") as err:
        prod.submit({"endpoint": "e", "service_s": 1})
    assert "without an idempotency_key a second submit can run the job twice" in str(err.value)
    assert not isinstance(err.value, RedisUnreachable)
    resumed.wait(10)
    assert r.hget(Keys("sou").job(err.value.job_id), "state") == "queued"  # written after all
    r.close()


def test_a_retried_submit_without_a_reply_names_the_job_its_key_names(private_redis, monkeypatch):
    """A retry with the same idempotency key whose reply was lost too printed the retry's
    fresh id, which names no job (``makespan status`` then said "no job"): it names the job
    the key already names (reliability check)."""
    settings = dataclasses.replace(Settings(), redis_url=private_redis.url, key_prefix="sou3",
                                   redis_socket_timeout_s=1.0)
    r = connect(settings.redis_url, settings=settings)
    prod = Producer(r, Keys("sou3"), makespan.models.parse_fleet(FLEET), settings)
    first = prod.submit({"endpoint": "e", "service_s": 1, "idempotency_key": "k2"}).id
    submit = JobStore.submit

    def stalled(self, *args, **kwargs):  # Redis stops right before the script is sent, resumes after the timeout
        os.kill(private_redis.process.pid, signal.SIGSTOP)
        threading.Timer(1.5, lambda: os.kill(private_redis.process.pid, signal.SIGCONT)).start()
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(JobStore, "submit", stalled)
    with pytest.raises(SubmitOutcomeUnknown, match="idempotency key 'k2' names job") as err:
        prod.submit({"endpoint": "e", "service_s": 1, "idempotency_key": "k2"})
    assert err.value.job_id == first
    r.close()


def test_a_refused_connection_is_still_unreachable(private_redis):
    url = private_redis.url
    private_redis.stop()
    settings = dataclasses.replace(Settings(), redis_url=url, key_prefix="sou2", redis_socket_timeout_s=1.0)
    prod = Producer(connect(url, settings=settings), Keys("sou2"), makespan.models.parse_fleet(FLEET), settings)
    with pytest.raises(Exception) as err:
        prod.submit({"endpoint": "e", "service_s": 1})
    assert not isinstance(err.value, SubmitOutcomeUnknown)


def test_the_client_and_the_cli_pass_it_on_as_it_is(private_redis):
    """``makespan.connect().submit`` and ``makespan submit`` turned every Redis timeout into
    RedisUnreachable ("start Redis there"); an unknown outcome keeps its own message."""
    import redis

    from makespan.cli_support import unreachable_redis
    from makespan.client import Client

    settings = dataclasses.replace(Settings(), redis_url=private_redis.url, key_prefix="sou3")
    client = Client(connect(private_redis.url), settings)
    unknown = SubmitOutcomeUnknown("j1", "submit of job j1: Redis did not answer")
    unknown.__cause__ = redis.TimeoutError("Timeout reading from 127.0.0.1:1")

    def fail():
        raise unknown

    with pytest.raises(SubmitOutcomeUnknown):
        client._redis_call(fail)
    assert unreachable_redis(unknown) is None
    client.close()


def test_a_workload_submit_without_a_reply_names_the_workload(private_redis, monkeypatch):
    """The same for a workload: it was written, and reported as "cannot reach Redis" (second
    review); a resubmit runs every step twice."""
    from makespan.workloads import submit_workload

    settings = dataclasses.replace(Settings(), redis_url=private_redis.url, key_prefix="souw",
                                   redis_socket_timeout_s=1.0)
    r = connect(settings.redis_url, settings=settings)
    fleet, keys = makespan.models.parse_fleet(FLEET), Keys("souw")
    spec = {"name": "wl", "steps": [{"name": "a", "endpoint": "e", "service_s": 1}]}
    submit_workload(r, keys, fleet, spec, settings)  # a connection and the loaded script
    store_submit = JobStore.submit_workload
    resumed = threading.Event()

    def stalled(self, *args, **kwargs):
        os.kill(private_redis.process.pid, signal.SIGSTOP)
        threading.Timer(2.5, lambda: (os.kill(private_redis.process.pid, signal.SIGCONT), resumed.set())).start()
        return store_submit(self, *args, **kwargs)

    monkeypatch.setattr(JobStore, "submit_workload", stalled)
    with pytest.raises(SubmitOutcomeUnknown, match="makespan workload-status") as err:
        submit_workload(r, keys, fleet, spec, settings)
    resumed.wait(10)
    assert r.exists(keys.workload(err.value.job_id))
    r.close()


def test_makespan_submit_prints_the_id_and_exits_75(private_redis, monkeypatch, tmp_path):
    """``ID=$(makespan submit -q ...)`` got nothing to look up, and exit 2 read as a refusal
    (second review): the id goes to stdout, exit 75 (EX_TEMPFAIL)."""
    from typer.testing import CliRunner

    from makespan.cli import app as cli_app
    fleet_path = tmp_path / "fleet.toml"
    fleet_path.write_text('name = "one"\n[[hosts]]\nname = "h"\ngpu_count = 1\nmemory_mib = 81920\n'
                          '[endpoints.e]\nmodel = "m"\nmemory_mib_per_gpu = 10000\ncold_start_s = 1\n')
    monkeypatch.setenv("MAKESPAN_REDIS_URL", private_redis.url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", "souc")

    def unknown(self, *args, **kwargs):
        raise SubmitOutcomeUnknown("abc123", "submit of job abc123: Redis did not answer (Timeout reading)")

    monkeypatch.setattr(Producer, "submit", unknown)
    res = CliRunner().invoke(cli_app, ["submit", "--endpoint", "e", "--service-s", "1", "-q", "--fleet",
                                       str(fleet_path)])
    assert res.exit_code == 75, res.output
    assert res.stdout.strip() == "abc123" and "Redis did not answer" in res.stderr


def test_a_redis_that_never_answers_is_unreachable_before_the_submit():
    """A port that accepts TCP and never answers: `makespan submit --fleet F` sent its script
    and exited 75 ("may or may not be written") though Redis had never answered; it now asks
    first and says Redis is unreachable (exit 69), as `status` does (a CLI review, 2026-12-07)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(5)
        env = {**os.environ, "MAKESPAN_REDIS_URL": f"redis://127.0.0.1:{silent.getsockname()[1]}/0",
               "MAKESPAN_REDIS_SOCKET_TIMEOUT_S": "1"}
        out = subprocess.run([sys.executable, "-m", "makespan.cli", "submit", "--endpoint", "embed", "--service-s", "1",
                              "--fleet", str(root / "examples" / "render-pipeline.toml")], env=env, cwd=root,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 69, out.stdout + out.stderr  # unreachable: EX_UNAVAILABLE
    assert "cannot reach Redis" in out.stderr, out.stderr
