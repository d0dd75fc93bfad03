"""Flower against the same Redis and key prefix: its queue lengths equal our
``makespan_celery_queue_messages`` (every kombu priority-step list), and its API lists
a running worker. Real Flower, real worker, real HTTP (basic auth)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry

from makespan.metrics import RedisStateCollector
from makespan.redis_conn import free_port

from .deploy_checks import ROOT

AUTH = ("ops", "pw-test")


def _wait_json(url: str, timeout_s: float = 90.0, ok=lambda j: True):
    """Poll ``url`` until it answers JSON that ``ok`` accepts; ``timeout_s`` bounds a hang only
    (Flower's and a Celery worker's start take tens of seconds on a loaded 2-core host)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            resp = httpx.get(url, auth=AUTH, timeout=3.0)
            if resp.status_code == 200:
                last = resp.json()
                if ok(last):
                    return last
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.25)
    raise AssertionError(f"{url}: no satisfying answer (last {last})")


@pytest.fixture
def env(redis_url, prefix):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROMETHEUS_"))}
    e.update(MAKESPAN_REDIS_URL=redis_url, MAKESPAN_KEY_PREFIX=prefix, PYTHONPATH=str(ROOT))
    return e


def _stop(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def test_flower_queue_lengths_equal_our_gauge_and_list_workers(env, r, keys):
    # 5 messages on gpu.default over three priority steps (0, 3 -> "\x06\x163", 9 -> "\x06\x169")
    send = ("from makespan.workers.tasks import celery\n"
            "for p in (0, 0, 3, 9, 9):\n"
            "    celery.send_task('makespan.noop', queue='gpu.default', priority=p)\n")
    subprocess.run([sys.executable, "-c", send], cwd=ROOT, env=env, check=True, timeout=60)
    lists = [k for k in r.scan_iter(f"{keys.celery_prefix}gpu.default*", _type="list")]
    assert len(lists) == 3, lists
    reg = CollectorRegistry()
    reg.register(RedisStateCollector(r, keys))
    ours = reg.get_sample_value("makespan_celery_queue_messages", {"queue": "gpu.default"})
    assert ours == 5

    port = free_port()
    flower = subprocess.Popen([sys.executable, "-m", "celery", "-A", "makespan.workers.tasks:celery", "flower",
                               f"--port={port}", "--address=127.0.0.1", f"--basic-auth={AUTH[0]}:{AUTH[1]}",
                               "--persistent=False", "--inspect_timeout=2000"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        base = f"http://127.0.0.1:{port}"
        lengths = _wait_json(f"{base}/api/queues/length")
        theirs = {q["name"]: q["messages"] for q in lengths["active_queues"]}
        assert theirs["gpu.default"] == ours
        assert httpx.get(f"{base}/api/workers", timeout=3.0).status_code == 401, "basic auth enforced"
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "makespan.workers.tasks:celery", "worker", "-P", "solo",
                                   "-Q", "gpu.flower-test", "-n", "flower-test@%h", "--without-mingle",
                                   "--without-gossip", "-E", "-l", "WARNING"],
                                  cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        workers = _wait_json(f"{base}/api/workers?refresh=1", timeout_s=120,
                             ok=lambda j: any(n.startswith("flower-test@") for n in j))
        name = next(n for n in workers if n.startswith("flower-test@"))
        assert any(q["name"] == "gpu.flower-test" for q in workers[name].get("active_queues", []))
    finally:
        if worker is not None:
            _stop(worker)
        _stop(flower)
