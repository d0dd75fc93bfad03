"""A service's waits on jobs (a service developer's findings): the asyncio waiters of a
client share a bounded set of connections (one each opened 1,002 connections for 1,000
waiters, and ran Redis out of ``maxclients``), and a wait rides out a Redis restart instead
of failing at its first poll with a bare StoreError."""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import replace

import pytest

from makespan.client import ASYNC_MAX_CONNECTIONS, Client, Job
from makespan.errors import RedisUnreachable
from makespan.keys import Keys
from makespan.live import delete_prefix
from makespan.redis_conn import connect
from makespan.settings import Settings


def _queued(r, keys: Keys, n: int) -> list[str]:
    ids = [uuid.uuid4().hex for _ in range(n)]
    with r.pipeline() as pipe:
        for job_id in ids:
            pipe.hset(keys.job(job_id), mapping={"id": job_id, "state": "queued"})
        pipe.execute()
    return ids


@pytest.fixture
def own_redis_client(aof_redis):
    settings = Settings(redis_url=aof_redis.url, key_prefix=f"waits-{uuid.uuid4().hex[:8]}",
                        redis_socket_timeout_s=2.0, redis_connect_timeout_s=1.0)
    client = Client(connect(aof_redis.url), settings)
    yield aof_redis, client
    client.close()


def test_asyncio_waiters_share_a_bounded_pool(own_redis_client):
    _server, client = own_redis_client
    r = client.r
    ids = _queued(r, client.keys, 200)

    async def scenario() -> tuple[list[str], int]:
        waits = [asyncio.create_task(Job(client, job_id).wait_async(timeout_s=60)) for job_id in ids]
        await asyncio.sleep(0.3)  # every waiter has polled at least once
        connected = int(r.info("clients")["connected_clients"])  # this Redis is the test's own
        for job_id in ids:
            r.hset(client.keys.job(job_id), "state", "completed")
        states = await asyncio.gather(*waits)
        return states, connected

    states, connected = asyncio.run(scenario())
    assert states == ["completed"] * 200
    assert connected <= ASYNC_MAX_CONNECTIONS + 1  # + the blocking client reading it
    assert int(r.info("clients")["connected_clients"]) == 1  # closed with their last waiter


def test_asyncio_run_again_and_again_leaves_no_connection_open(own_redis_client):
    """A sync program that calls asyncio.run for each wait (a verifier: 200 runs kept 202
    connections and every loop, when the client was kept per loop)."""
    _server, client = own_redis_client
    r = client.r
    ids = _queued(r, client.keys, 3)
    for job_id in ids:
        r.hset(client.keys.job(job_id), "state", "completed")

    async def handler(job_id: str) -> list[str]:
        return await asyncio.gather(*(Job(client, job_id).wait_async(timeout_s=10) for _ in range(5)))

    for round_ in range(30):
        assert asyncio.run(handler(ids[round_ % 3])) == ["completed"] * 5
    assert int(r.info("clients")["connected_clients"]) == 1 and client._async == {}


def test_waits_ride_out_a_redis_restart(own_redis_client):
    server, client = own_redis_client
    r = client.r
    sync_id, *async_ids = _queued(r, client.keys, 21)
    outcome: dict[str, object] = {}

    def sync_wait() -> None:
        try:
            outcome["sync"] = Job(client, sync_id).wait(timeout_s=60)
        except Exception as e:  # noqa: BLE001 - reported below
            outcome["sync"] = e

    async def scenario() -> list[str]:
        waits = [asyncio.create_task(Job(client, job_id).wait_async(timeout_s=60)) for job_id in async_ids]
        await asyncio.sleep(0.3)
        await asyncio.to_thread(server.restart, 1.0)  # SIGKILL, down 1 s, then the same AOF again
        with r.pipeline() as pipe:
            for job_id in [sync_id, *async_ids]:
                pipe.hset(client.keys.job(job_id), "state", "completed")
            pipe.execute()
        return await asyncio.gather(*waits)

    waiter = threading.Thread(target=sync_wait)
    waiter.start()
    assert asyncio.run(scenario()) == ["completed"] * 20
    waiter.join(60)
    assert outcome["sync"] == "completed"
    delete_prefix(r, client.keys)


def test_a_wait_on_a_redis_that_stays_down_raises_redis_unreachable(own_redis_client):
    server, client = own_redis_client
    (job_id,) = _queued(client.r, client.keys, 1)
    server.kill()
    quick = Client(client.r, replace(client.settings))
    with pytest.raises(RedisUnreachable, match="cannot reach Redis"):
        Job(quick, job_id).wait(timeout_s=1.5)  # its timeout ends the retries before WAIT_RECONNECT_S

    async def scenario() -> None:
        await Job(quick, job_id).wait_async(timeout_s=1.5)

    with pytest.raises(RedisUnreachable, match="cannot reach Redis"):
        asyncio.run(scenario())
    # the job's other calls raise the same type (a client integrator: they raised a plain
    # StoreError, which `except makespan.RedisUnreachable` did not catch)
    for call in (lambda job: job.status(), lambda job: job.state, lambda job: job.cancel(),
                 lambda job: job.cancel_outcome()):
        with pytest.raises(RedisUnreachable, match="cannot reach Redis"):
            call(Job(quick, job_id))


def test_cancelled_waiters_end_every_time(own_redis_client):
    """A verifier: ``asyncio.wait_for(job.result_async(), 0.01)`` in a loop hung within ~60
    tries: redis-py returned a read whose task had been cancelled, and the poll went on."""
    _server, client = own_redis_client
    (job_id,) = _queued(client.r, client.keys, 1)

    async def scenario() -> int:
        timeouts = 0
        for i in range(300):
            try:
                await asyncio.wait_for(Job(client, job_id).result_async(), 0.01 + (i % 7) * 0.003)
            except TimeoutError:
                timeouts += 1
        return timeouts

    assert asyncio.run(asyncio.wait_for(scenario(), 120)) == 300


def test_a_wait_after_a_cancel_the_caller_caught_still_waits(own_redis_client):
    """A notebook user: Ctrl-C on an awaiting cell cancels its task; the cell catches
    CancelledError, cancels the job and waits for it to end. That wait raised
    CancelledError at its first poll (``task.cancelling()`` was still 1), while
    ``asyncio.sleep`` and the blocking ``wait`` worked."""
    _server, client = own_redis_client
    (job_id,) = _queued(client.r, client.keys, 1)

    async def cell() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # caught, not uncancelled
        client.r.hset(client.keys.job(job_id), "state", "cancelled")
        return await Job(client, job_id).wait_async(timeout_s=5)

    async def kernel() -> str:
        task = asyncio.create_task(cell())
        await asyncio.sleep(0.05)
        task.cancel()
        return await task

    assert asyncio.run(kernel()) == "cancelled"
