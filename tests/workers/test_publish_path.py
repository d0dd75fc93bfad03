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


# -- the planner's cheaper warm send (publish.send_in_batch) ----------------------------------

def _payload(ctx: PhaseContext) -> dict:
    return ctx.__dict__.copy()


def _normalized_message(raw: str) -> dict:
    """A task message as read from its queue, with what differs from one send to the next
    (task id, delivery tag) replaced by placeholders."""
    message = json.loads(raw)
    task_id = message["headers"]["id"]
    message["body"] = json.loads(__import__("base64").b64decode(message["body"]))
    text = json.dumps(message, sort_keys=True).replace(task_id, "<task id>")
    out = json.loads(text)
    out["properties"]["delivery_tag"] = "<tag>"
    return out


def _normalized_event(raw: str) -> dict:
    event = json.loads(raw)
    body = json.loads(__import__("base64").b64decode(event["body"]))
    task_id = body["uuid"]
    for name in ("timestamp", "clock", "utcoffset"):
        body.pop(name)
    event["body"] = body
    out = json.loads(json.dumps(event, sort_keys=True).replace(task_id, "<task id>"))
    out["properties"]["delivery_tag"] = "<tag>"
    return out


def test_a_batched_warm_job_is_sent_as_apply_async_sends_it_message_and_event(r, settings, prefix):
    from makespan.workers.publish import ARGS_SHOWN, WARM_JOB_TASK

    app = publisher(settings)
    queue = f"{prefix}.gpu.h0"
    key = Keys(settings.key_prefix).celery_prefix + queue
    events = r.pubsub()
    events.psubscribe(f"{Keys(settings.key_prefix).celery_prefix}*celeryev*")
    events.get_message(timeout=1.0)  # the subscription's confirmation
    (ctx,) = _contexts(1)
    payload = _payload(ctx)
    shown = {"argsrepr": repr(({name: payload[name] for name in ARGS_SHOWN},)), "kwargsrepr": "{}"}
    try:
        for _ in range(2):  # the second time the queue is declared on the connection already
            with publish_batch(app) as producer:
                app.tasks[WARM_JOB_TASK].apply_async(args=(payload,), queue=queue, producer=producer, **shown)
                dispatch(app, ctx, queue, warm=True, producer=producer)
        raw = list(reversed(r.lrange(key, 0, -1)))  # oldest first: Celery's, ours, Celery's, ours
        assert len(raw) == 4
        messages = [_normalized_message(m) for m in raw]
        assert messages[1] == messages[0] and messages[3] == messages[2] == messages[0]
        sent = []
        while len(sent) < 4:
            got = events.get_message(timeout=2.0)
            assert got is not None, f"only {len(sent)} task-sent events arrived"
            if got["type"] == "pmessage":
                sent.append(_normalized_event(got["data"]))
        assert sent[0]["body"]["type"] == "task-sent" and sent[0]["body"]["queue"] == queue
        assert sent[1] == sent[0] and sent[3] == sent[2] == sent[0]
    finally:
        events.close()
        r.delete(key)


def test_a_batched_warm_job_skips_celerys_apply_async(r, settings, prefix, monkeypatch):
    from makespan.workers.publish import WARM_JOB_TASK

    app = publisher(settings)
    queue = f"{prefix}.gpu.h0"
    key = Keys(settings.key_prefix).celery_prefix + queue
    task = app.tasks[WARM_JOB_TASK]
    through_apply_async = []
    real = task.apply_async
    monkeypatch.setattr(task, "apply_async", lambda *a, **k: through_apply_async.append(1) or real(*a, **k))
    try:
        with publish_batch(app) as producer:
            for ctx in _contexts(3):
                dispatch(app, ctx, queue, warm=True, producer=producer)
        assert r.llen(key) == 3 and through_apply_async == []
        dispatch(app, _contexts(1)[0], queue, warm=True)  # unbatched: Celery's own path
        assert r.llen(key) == 4 and through_apply_async == [1]
    finally:
        r.delete(key)


def test_a_tick_that_starts_one_job_sends_it_in_one_publish_batch(r, keys, settings, prefix, monkeypatch):
    """A followed tick often starts a single job: its lease and its message go the batched
    way too (one acquire round trip, one write of the message and its event), not one
    acquire and an unbatched publish from the producer pool."""
    import dataclasses

    from makespan.models import parse_fleet
    from makespan.producer import Producer
    from makespan.workers import publish
    from makespan.workers.planner_worker import PlannerWorker

    host = f"{prefix}-h"
    fleet = parse_fleet({"name": "one", "hosts": [{"name": host, "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0)
    worker = PlannerWorker(r, s, fleet)  # no dispatch injected: the planner's own publish path
    worker.token = ""
    batches = []
    real_batch = publish.publish_batch

    def counting_batch(app):
        batches.append(app)
        return real_batch(app)

    monkeypatch.setattr(publish, "publish_batch", counting_batch)
    acquired_one_by_one = []
    real_acquire = worker.env.leases.acquire
    monkeypatch.setattr(worker.env.leases, "acquire", lambda *a, **k: acquired_one_by_one.append(1) or real_acquire(*a, **k))
    job = Producer(r, keys, fleet, s).submit({"endpoint": "e", "service_s": 1, "priority": "NORMAL"}).id
    queue_key = f"{keys.celery_prefix}{keys.host_queue(host)}"
    try:
        assert worker.tick()
        sent = [json.loads(raw) for raw in r.lrange(queue_key, 0, -1)]
        assert [m["headers"]["task"] for m in sent] == ["makespan.evict"]  # a cold chain's head
        assert json.loads(__import__("base64").b64decode(sent[0]["body"]))[0][0]["job_id"] == job
        assert len(batches) == 1 and acquired_one_by_one == []
    finally:
        worker.close()
        r.delete(queue_key)
