"""The live system sleeps and wakes (issue 20 point 1): real planner, GPU worker and
observer processes on real Redis, a sleep-capable endpoint run by the bundled endpoint
server (a real process over real HTTP) swapping with a simulated one on one GPU. The
report shows the wakes the plan counted on, and the observer raises no incident."""

from __future__ import annotations

import sys

import pytest

from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.run_report import live_report
from makespan.workers.observer import list_incidents
from tests.live import all_events, stop_checked, wait_for

FLEET_TOML = f"""
name = "sleepy"

[[hosts]]
name = "host-a"
gpu_count = 1
memory_mib = 81920

[endpoints.chat]
model = "meta-llama/Llama-3.1-8B-Instruct"
memory_mib_per_gpu = 24000
cold_start_s = 60
evict_s = 5
wake_s = 8
slots = 4
launch = {{ driver = "process", health_timeout_s = 60, command = ["{sys.executable}", "-m", "makespan.workers.endpoint_server", "--port", "{{port}}", "--model", "{{model}}", "--load-time-s", "{{load_time_s}}", "--sleep-s", "{{sleep_s}}", "--wake-s", "{{wake_s}}", "--sleep-ram-mib", "16"] }}

[endpoints.embed]
model = "BAAI/bge-large-en-v1.5"
memory_mib_per_gpu = 6000
cold_start_s = 30
evict_s = 3
"""


@pytest.fixture
def system(settings, tmp_path):
    path = tmp_path / "sleepy.toml"
    path.write_text(FLEET_TOML)
    fleet = load_fleet(path)
    sys_ = LiveSystem(path, fleet, settings, tmp_path / "logs",
                      extra_env={"OTEL_TRACES_EXPORTER": "file", "MAKESPAN_TRACE_FILE": str(tmp_path / "spans.jsonl")})
    yield sys_
    stop_checked(sys_)


def test_live_run_wakes_what_it_put_to_sleep(r, keys, settings, system, tmp_path):
    system.start()
    fleet = system.fleet
    prod = Producer(r, keys, fleet, settings)
    ids = []
    for i, ep in enumerate(["chat", "embed", "chat", "embed", "chat"]):  # one at a time: every one swaps
        ids.append(prod.submit({"endpoint": ep, "service_s": 20, "priority": "HIGH",
                                "idempotency_key": f"swap-{i}"}).id)
        wait_for(lambda: r.hget(keys.job(ids[-1]), "state") in ("completed", "failed"), 120, f"job {i} to finish",
                 0.1)
    assert [r.hget(keys.job(j), "state") for j in ids] == ["completed"] * 5
    events = all_events(r, keys)
    rep = live_report(r, keys, fleet, events, ids, settings.time_scale, settings.policy)
    t = rep["transitions"]
    # chat: one cold start, then asleep each time embed displaced it and woken each time it came
    # back; embed (no sleep mode): stopped, so cold-started both times
    assert t["wake"] == 2 and t["sleep"] == 2 and t["cold_start"] == 3 and t["evict"] == 4, t
    assert t["wake_failed"] == 0 and t["sleep_failed"] == 0, t
    # the planner planned those wakes (its fleet state has the sleepers from the registry)
    planned = [e.get("load") for e in events if e["kind"] == "leased" and e.get("job") in ids]
    assert planned == ["cold_start", "cold_start", "wake", "cold_start", "wake"], planned
    assert set(rep["transition_error"]) >= {"wake", "sleep", "cold_start", "evict"}
    incidents = [i for i in list_incidents(r, keys) if i.get("kind") == "incident"]
    assert incidents == [], [(i["endpoint"], i["failure_mode"], i["effect"]) for i in incidents]
    from makespan.telemetry import read_span_file

    spans = [x["name"] for x in read_span_file(tmp_path / "spans.jsonl")]
    assert spans.count("endpoint_sleep") == 2 and spans.count("endpoint_wake") == 2, sorted(set(spans))


SET_POINT_FLEET_TOML = FLEET_TOML.replace('wake_s = 8\nslots = 4\n', 'wake_s = 8\nslots = 4\nset_point = [{ host = "host-a", gpus = [0] }]\n')


def test_a_displaced_set_point_sleeps_and_its_restore_wakes_it(r, keys, settings, tmp_path):
    """``chat`` is GPU 0's set point and sleep-capable; one ``embed`` job displaces it with no
    job of ``chat`` queued or forecast. The plan puts ``chat`` to sleep (its restore is
    certain need, makespan.planner.sleepers.SET_POINT_NEED_WEIGHT) and the set-point
    restore wakes the same process. Before, the evict stopped it and the restore cold-started
    it (found by a llama-swap user: 3.4 s instead of 0.7 s in the demo fleet)."""
    assert "set_point" in SET_POINT_FLEET_TOML
    path = tmp_path / "set-point.toml"
    path.write_text(SET_POINT_FLEET_TOML)
    fleet = load_fleet(path)
    system = LiveSystem(path, fleet, settings, tmp_path / "logs")
    try:
        system.start()
        wait_for(lambda: any(e["kind"] == "restore_end" and e.get("endpoint") == "chat"
                             for e in all_events(r, keys)), 120, "chat at its set point", 0.1)
        before = {e.get("lease") for e in all_events(r, keys) if e["kind"] == "restore_end"}
        job = Producer(r, keys, fleet, settings).submit({"endpoint": "embed", "service_s": 10, "priority": "HIGH"}).id
        wait_for(lambda: r.hget(keys.job(job), "state") in ("completed", "failed"), 120, "the embed job", 0.1)
        assert r.hget(keys.job(job), "state") == "completed"
        wait_for(lambda: any(e["kind"] == "restore_end" and e.get("endpoint") == "chat" and e.get("lease") not in before
                             for e in all_events(r, keys)), 120, "chat restored", 0.1)
        events = all_events(r, keys)
        evict = next(e for e in events if e["kind"] == "phase_end" and e.get("job") == job and e.get("phase") == "evict")
        assert evict.get("slept") == ["chat"], evict
        restore = next(e for e in events if e["kind"] == "restore_end" and e.get("lease") not in before)
        start = next(e for e in events if e["kind"] == "phase_end" and e.get("lease") == restore["lease"]
                     and e.get("phase") == "restore")
        assert start.get("transition") == "wake", start
    finally:
        stop_checked(system)
