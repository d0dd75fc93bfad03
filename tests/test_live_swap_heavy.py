"""The swap-heavy scenario live (issue 20 point 6): five models over three GPU slots,
requests in llama-swap#612's interleaved queue (A B A A C A B C, the rare D and E, then
the queue again),
real planner, GPU worker and observer processes on real Redis; A, C and E are run by the
bundled endpoint server (real processes, CPU-only emulation of sleep levels 1 and 2), B
and D by the simulated driver. Every request completes, the plan's sleepers are woken
(the report's ``wake`` > 0), no wake fails, and the observer raises no incident."""

from __future__ import annotations

import sys

import pytest

from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.planner.synthetic import SWAP_PATTERN
from makespan.producer import Producer
from makespan.run_report import live_report
from makespan.workers.observer import list_incidents
from tests.live import all_events, stop_checked, wait_for

SERVER = (f'["{sys.executable}", "-m", "makespan.workers.endpoint_server", "--port", "{{port}}", "--model", '
          f'"{{model}}", "--load-time-s", "{{load_time_s}}", "--sleep-s", "{{sleep_s}}", "--wake-s", "{{wake_s}}", '
          f'"--sleep-ram-mib", "16"]')


def _endpoint(name: str, index: int, sleepy: bool) -> str:
    lines = [f"[endpoints.{name}]", f'model = "swap/{name}"', f"memory_mib_per_gpu = {44000 + 2000 * index}",
             f"cold_start_s = {35 + 10 * index}", "evict_s = 3"]
    if sleepy:
        lines += [f"wake_s = {2 + 0.5 * index}", f"wake_level2_s = {6 + index}",
                  f'launch = {{ driver = "process", health_timeout_s = 60, command = {SERVER} }}']
    else:
        lines += ['launch = { driver = "simulated" }']
    return "\n".join(lines)


FLEET_TOML = "\n\n".join([
    'name = "swap-heavy"',
    '[[hosts]]\nname = "host-a"\ngpu_count = 3\nmemory_mib = 81920\nhost_memory_mib = 65536',
    *(_endpoint(n, i, n in "ACE") for i, n in enumerate("ABCDE"))]) + "\n"


@pytest.fixture
def system(settings, tmp_path):
    path = tmp_path / "swap.toml"
    path.write_text(FLEET_TOML)
    sys_ = LiveSystem(path, load_fleet(path), settings, tmp_path / "logs")
    yield sys_
    stop_checked(sys_)


def test_live_swap_heavy_wakes_the_sleepers_it_planned(r, keys, settings, system):
    system.start()
    fleet = system.fleet
    prod = Producer(r, keys, fleet, settings)
    # the interleaved queue in three waves, each submitted once the one before has finished:
    # A B A A C A B C (loads A, B, C), then the rare D and E (they displace two of them), then
    # A B A A C A B C again (the sleepers among the displaced are woken)
    ids: list[str] = []
    for wave in (SWAP_PATTERN, "DE", SWAP_PATTERN):
        first = len(ids)
        ids += [prod.submit({"endpoint": name, "service_s": 10, "priority": "NORMAL" if name == "A" else "LOW",
                             "idempotency_key": f"swap-{first + i}"}).id for i, name in enumerate(wave)]
        wait_for(lambda ids=ids: all(r.hget(keys.job(j), "state") in ("completed", "failed") for j in ids), 240,
                 f"wave {wave} to finish", 0.2)
    assert [r.hget(keys.job(j), "state") for j in ids] == ["completed"] * len(ids)
    events = all_events(r, keys)
    rep = live_report(r, keys, fleet, events, ids, settings.time_scale, settings.policy)
    t = rep["transitions"]
    assert t["sleep"] > 0 and t["wake"] > 0, t
    assert t["wake_failed"] == 0 and t["sleep_failed"] == 0, t
    incidents = [i for i in list_incidents(r, keys) if i.get("kind") == "incident"]
    assert incidents == [], [(i["endpoint"], i["failure_mode"], i["effect"]) for i in incidents]
