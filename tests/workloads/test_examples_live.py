"""The two shipped example workloads, submitted and answered through the public API on a
live system (planner and GPU worker as real processes, the renderer and the judge real
endpoint processes: the bundled endpoint server, answering over HTTP), as a user copies
them: ``render_cards`` returns one summary per card, ``batch_judge`` one verdict per prompt;
an argument of the wrong shape is refused by the function before any request (found by a
review: ``render_cards("abc")`` rendered three cards "a", "b", "c")."""

from __future__ import annotations

import uuid

import pytest

import makespan
from makespan.keys import Keys
from makespan.live import LiveSystem, delete_prefix
from makespan.redis_conn import connect
from tests.faults.private_redis import write_fleet
from tests.live import stop_checked, wait_for

FLEET = """
name = "examples"
[[hosts]]
name = "host-a"
gpu_count = 2
memory_mib = 81920
[endpoints.renderer]
model = "render/cards-v2"
memory_mib_per_gpu = 20000
cold_start_s = 45
evict_s = 5
slots = 4
launch = { driver = "process", health_path = "/health", health_timeout_s = 60 }
[endpoints.embed]
model = "BAAI/bge-large-en-v1.5"
memory_mib_per_gpu = 6000
cold_start_s = 30
evict_s = 3
slots = 8
[endpoints.judge]
model = "judge/model"
memory_mib_per_gpu = 30000
cold_start_s = 60
evict_s = 5
slots = 8
launch = { driver = "process", health_path = "/health", health_timeout_s = 60 }
"""


@pytest.fixture(scope="module")
def client(redis_url, tmp_path_factory):
    prefix = f"mst-ex-{uuid.uuid4().hex[:8]}"
    tmp = tmp_path_factory.mktemp("examples")
    path, fleet = write_fleet(tmp, FLEET)
    settings = makespan.settings.Settings(
        redis_url=redis_url, key_prefix=prefix, time_scale=0.01, lease_ttl_s=3.0, heartbeat_s=0.5,
        batch_wait_s=0.02, planner_tick_s=0.05,
        workload_modules="makespan.examples.render_cards,makespan.examples.batch_judge")
    system = LiveSystem(path, fleet, settings, tmp / "logs", observer=False)
    system.start()
    c = makespan.connect(redis_url, key_prefix=prefix)
    wait_for(lambda: c.r.exists(c.keys.fn_live("batch_judge")), 30, "the worker to publish the examples")
    try:
        yield c
    finally:
        stop_checked(system)
        r = connect(redis_url)
        delete_prefix(r, Keys(prefix))
        r.close()


def test_render_cards_returns_a_summary_per_card(client):
    out = client.submit("render_cards", ["alpha", "beta", "gamma"]).result(timeout_s=120)
    assert [card["title"] for card in out["cards"]] == ["alpha", "beta", "gamma"], out


def test_batch_judge_returns_a_verdict_per_prompt(client):
    prompts = ["Is 7 prime?", "Is 9 prime?"]
    rows = client.submit("batch_judge", prompts).result(timeout_s=120)
    assert [row["prompt"] for row in rows] == prompts and all(row["verdict"] for row in rows), rows


@pytest.mark.parametrize("name, bad", [("render_cards", "abc"), ("render_cards", True), ("batch_judge", "Is 7 prime?")])
def test_an_argument_of_the_wrong_shape_fails_the_job_and_sends_nothing(client, name, bad):
    job = client.submit(name, bad)
    with pytest.raises(makespan.WorkloadError) as err:
        job.result(timeout_s=120)
    assert err.value.error_type == "TypeError" and "got" in err.value.message
    assert not client.r.exists(client.keys.requests(job.id))  # no request was sent for it
