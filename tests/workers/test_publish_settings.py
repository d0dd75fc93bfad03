"""A planner publishes through the Celery app of its own settings (workers/publish.py
``publisher``), never through the environment's (``makespan.workers.tasks``, built from
``MAKESPAN_REDIS_URL`` and the default key prefix ``makespan``).

Why: in-process planners built for a test's private prefix sent their restore chains to
the environment's app, and a CI run left ``makespan:celery:gpu.host-a`` / ``gpu.host-b``
messages on the shared Redis that nothing consumed. Real Redis, a real planner tick, no
GPU worker: the messages are read where they were written.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid

from makespan.keys import Keys
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect
from makespan.settings import Settings
from makespan.workers.phases import instance_value
from makespan.workers.planner_worker import PlannerWorker


def _fleet(host_a: str, host_b: str):
    """Host a's GPU has the set point ``base`` (not resident: the tick restores it); ``other``
    fits only host b (its job starts there)."""
    return parse_fleet({"name": "publish",
                        "hosts": [{"name": host_a, "gpu_count": 1, "memory_mib": 40000},
                                  {"name": host_b, "gpu_count": 1, "memory_mib": 81920}],
                        "endpoints": {"base": {"model": "b", "memory_mib_per_gpu": 20000, "cold_start_s": 2,
                                               "set_point": [{"host": host_a, "gpus": [0]}]},
                                      "other": {"model": "o", "memory_mib_per_gpu": 60000, "cold_start_s": 60}}})


def _messages(r, key: str) -> list[tuple[str, dict]]:
    """(task name, phase context) of each Celery message in the list ``key``, oldest first."""
    out = []
    for raw in reversed(r.lrange(key, 0, -1)):
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        out.append((message["headers"]["task"], args[0]))
    return out


def test_a_planner_tick_publishes_under_its_own_key_prefix_only(r, keys, settings):
    environment = Settings.from_env()
    assert environment.key_prefix != settings.key_prefix  # the test's private prefix
    tag = uuid.uuid4().hex[:10]  # in the host names: this test's queues, whatever else shares the Redis
    host_a, host_b = f"pub-{tag}-a", f"pub-{tag}-b"
    fleet = _fleet(host_a, host_b)
    environment_redis = connect(environment.redis_url)
    environment_keys = f"{Keys(environment.key_prefix).celery_prefix}*{tag}*"
    assert not list(environment_redis.scan_iter(environment_keys))
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0)
    worker = PlannerWorker(r, s, fleet)  # no dispatch injected: the planner's own publish path
    worker.token = ""
    gpu_b = fleet.hosts[1].gpus[0].uuid
    r.set(keys.resident(gpu_b), instance_value("other", [gpu_b]))
    job = Producer(r, keys, fleet, s).submit({"endpoint": "other", "service_s": 1, "priority": "NORMAL"}).id
    try:
        worker.tick()
        left_on_environment = sorted(environment_redis.scan_iter(environment_keys))
    finally:
        for key in environment_redis.scan_iter(environment_keys):  # only this test's queues (the old code's)
            environment_redis.delete(key)
        environment_redis.close()
    assert left_on_environment == []
    restores = _messages(r, f"{keys.celery_prefix}{keys.host_queue(host_a)}")
    assert [(task, ctx["kind"], ctx["endpoint"]) for task, ctx in restores] == [("makespan.evict", "restore", "base")]
    jobs = _messages(r, f"{keys.celery_prefix}{keys.host_queue(host_b)}")
    assert [(task, ctx["job_id"]) for task, ctx in jobs] == [("makespan.warm_job", job)]  # resident: the warm path


def test_equal_settings_share_one_publishing_app_and_others_get_their_own(settings):
    from makespan.workers.publish import publisher

    app = publisher(settings)
    assert publisher(dataclasses.replace(settings)) is app
    other = publisher(dataclasses.replace(settings, key_prefix=settings.key_prefix + "-other"))
    assert other is not app
    assert other.conf.broker_transport_options["global_keyprefix"] == f"{settings.key_prefix}-other:celery:"
    assert app.conf.broker_transport_options["global_keyprefix"] == f"{settings.key_prefix}:celery:"

