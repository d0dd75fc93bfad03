"""The planner's publish path to the GPU workers, on a real Redis: kombu channels of
:mod:`makespan.broker` reuse one Redis client per connection pool, and a tick's phase
chains go out in one write (:func:`makespan.workers.publish.publish_batch`).

Why (bench/RESULTS.md, "live path throughput"): kombu 5.7 built a new ``redis.Redis`` for
every publish, ack and event; with the task messages sent one by one that was about a
third of the planner's and GPU worker's CPU per no-op job.
"""

from __future__ import annotations

import json

from kombu import Connection

from makespan.broker import broker_url
from makespan.celery_app import broker_transport_options
from makespan.keys import Keys
from makespan.workers.phases import PhaseContext
from makespan.workers.publish import dispatch, publish_batch, publisher


def _channel(settings):
    url, transport = broker_url(settings.redis_url)
    conn = Connection(url, transport=transport, transport_options=broker_transport_options(settings))
    return conn, conn.default_channel


def test_a_channel_reuses_one_redis_client_per_pool(settings):
    conn, channel = _channel(settings)
    try:
        first = channel._create_client()
        assert channel._create_client() is first  # kombu's own Channel builds a new client here
        assert first.connection_pool is channel.pool
        with channel.conn_or_acquire() as client:
            assert client is first
        assert channel._create_client(asynchronous=True) is not first  # the consumer's stays kombu's
        channel._pool = None  # a new pool (as after a reconnect): a client on the new pool
        again = channel._create_client()
        assert again is not first and again.connection_pool is channel.pool
    finally:
        conn.release()


def test_the_reused_client_still_writes(settings, r):
    conn, channel = _channel(settings)
    key = Keys(settings.key_prefix).celery_prefix + "probe"
    try:
        for n in range(3):
            with channel.conn_or_acquire() as client:
                client.lpush("probe", str(n))  # the client adds kombu's global key prefix
        assert r.lrange(key, 0, -1) == ["2", "1", "0"]
    finally:
        r.delete(key)
        conn.release()


def _contexts(n: int) -> list[PhaseContext]:
    return [PhaseContext(f"lease-{i}", 7, [f"GPU-{i}"], "h0", "job", "noop", f"job-{i}", "NORMAL", 1.0)
            for i in range(n)]


def test_a_publish_batch_writes_every_message_when_the_block_ends(r, settings, prefix):
    app = publisher(settings)  # the planner's: its settings' Redis and key prefix
    queue = f"{prefix}.gpu.h0"
    key = Keys(settings.key_prefix).celery_prefix + queue
    try:
        with publish_batch(app) as producer:
            for ctx in _contexts(3):
                dispatch(app, ctx, queue, warm=True, producer=producer)
            assert r.llen(key) == 0  # buffered: nothing written before the block ends
        messages = [json.loads(raw) for raw in r.lrange(key, 0, -1)]
        assert len(messages) == 3
        assert {m["headers"]["task"] for m in messages} == {"makespan.warm_job"}
        sent = sorted(json.loads(__import__("base64").b64decode(m["body"]))[0][0]["lease_id"] for m in messages)
        assert sent == ["lease-0", "lease-1", "lease-2"]
        # what Flower shows as the arguments: the fields that name the job, not the whole context
        shown = sorted(m["headers"]["argsrepr"] for m in messages)
        assert shown[0] == repr(({"job_id": "job-0", "lease_id": "lease-0", "token": 7, "kind": "job",
                                  "endpoint": "noop", "gpus": ["GPU-0"], "priority": "NORMAL"},))
    finally:
        r.delete(key)


def test_a_publish_batch_sends_cold_chains_too(r, settings, prefix):
    app = publisher(settings)  # the planner's: its settings' Redis and key prefix
    queue = f"{prefix}.gpu.h0"
    key = Keys(settings.key_prefix).celery_prefix + queue
    try:
        with publish_batch(app) as producer:
            for ctx in _contexts(2):
                dispatch(app, ctx, queue, warm=False, producer=producer)
        messages = [json.loads(raw) for raw in r.lrange(key, 0, -1)]
        assert [m["headers"]["task"] for m in messages] == ["makespan.evict", "makespan.evict"]  # chain heads
        assert all(m["headers"]["argsrepr"].startswith("({'job_id': 'job-") for m in messages)
        chained = json.loads(__import__("base64").b64decode(messages[0]["body"]))[2]["chain"]
        assert chained and all(sig["options"]["argsrepr"].startswith("({'job_id': 'job-") for sig in chained)
    finally:
        r.delete(key)
