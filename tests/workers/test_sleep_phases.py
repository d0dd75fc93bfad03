"""The GPU worker's phases sleep and wake (issue 20 point 1): an evicted instance of an
endpoint with a sleep mode sleeps (registered ``asleep``, no longer in
``P:resident``), a job that needs it on exactly those GPUs wakes it (the same process),
a failing wake falls back to stop + cold start (recorded), the live planner's fleet
state sees the sleeper, and the health observer raises no incident for any of it.
Real Redis, the bundled endpoint server as a real process, real HTTP."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from makespan.models import FleetSpec
from makespan.producer import Producer
from makespan.workers.drivers.base import Instance
from makespan.workers.drivers import process_alive
from makespan.workers.drivers.registry import list_instances, register_instance
from makespan.workers.leases import LeaseStore
from makespan.workers.observer import Observer, list_incidents
from makespan.workers.phases import PhaseContext, PhaseRunner, instance_value
from makespan.workers.warm import run_phases

GPU = "GPU-host-a-0"
SERVER = [sys.executable, "-m", "makespan.workers.endpoint_server", "--port", "{port}", "--model", "{model}",
          "--sleep-s", "{sleep_s}", "--wake-s", "{wake_s}"]


def _fleet(chat_command=SERVER, chat_driver="process") -> FleetSpec:
    return FleetSpec.model_validate({
        "name": "sleepy",
        "hosts": [{"name": "host-a", "gpu_count": 2, "memory_mib": 81920}],
        "endpoints": {
            "chat": {"model": "meta-llama/Llama-3.1-8B-Instruct", "memory_mib_per_gpu": 24000, "cold_start_s": 60,
                     "evict_s": 5, "wake_s": 8, "slots": 4,
                     "launch": {"driver": chat_driver, "command": chat_command if chat_driver != "simulated" else [],
                                "health_timeout_s": 60}},
            "embed": {"model": "BAAI/bge-large-en-v1.5", "memory_mib_per_gpu": 6000, "cold_start_s": 30,
                      "evict_s": 3},
        }})


class Jobs:
    """Submit a job, lease it on GPU and run all its phases, as a GPU worker would."""

    def __init__(self, r, keys, settings, fleet):
        self.r, self.keys, self.fleet = r, keys, fleet
        self.prod = Producer(r, keys, fleet, settings)
        self.runner = PhaseRunner(r, settings, fleet)
        self.n = 0
        self.gpu = GPU

    def run(self, endpoint: str, sleep_levels: dict[str, int] | None = None, helpers: tuple[str, ...] = (),
            gpus: tuple[str, ...] | None = None) -> PhaseContext:
        self.n += 1
        spec = {"endpoint": endpoint, "service_s": 1, "priority": "HIGH", **({"helpers": list(helpers)} if helpers else {})}
        jid = self.prod.submit(spec).id
        lid = f"L{self.n}"
        gpus = gpus or (self.gpu,)
        lease = LeaseStore(self.r, self.keys).acquire(lid, gpus, 30.0, job_id=jid, kind="job",
                                                      holder="host-a", queue=self.keys.queue("HIGH"))
        assert lease is not None
        ctx = PhaseContext(lid, lease.token, list(gpus), "host-a", "job", endpoint, jid, "HIGH", 1.0,
                           sleep_levels=sleep_levels)
        assert run_phases(self.runner, ctx) == "completed"
        return ctx

    def phase_end(self, ctx: PhaseContext, phase: str) -> dict:
        for _i, f in self.r.xrange(self.keys.events):
            e = json.loads(f["e"])
            if e["kind"] == "phase_end" and e.get("lease") == ctx.lease_id and e.get("phase") == phase:
                return e
        raise AssertionError(f"no phase_end of {phase} for {ctx.lease_id}")

    def instances(self) -> list[tuple[Instance, str]]:
        return list_instances(self.r, self.keys, with_state=True)


@pytest.fixture
def cleanup(r, keys):
    yield
    from makespan.workers.drivers import get_driver

    for inst in list_instances(r, keys):
        if inst.driver != "simulated":
            get_driver(inst.driver).stop(inst)


def test_evicted_sleeper_sleeps_and_is_woken_in_place(r, keys, settings, cleanup):
    fleet = _fleet()
    jobs = Jobs(r, keys, settings, fleet)
    obs = Observer(r, keys, fleet, probe_interval_s=0.05)
    stop = threading.Event()
    probes = threading.Thread(target=lambda: [obs.probe_once() or stop.wait(0.05) for _ in iter(stop.is_set, True)],
                              daemon=True)
    probes.start()
    try:
        first = jobs.run("chat")
        assert jobs.phase_end(first, "start_endpoint")["transition"] == "cold_start"
        (chat, state), = jobs.instances()
        assert state == "running" and process_alive(chat.pid)

        second = jobs.run("embed")  # evicts chat: it sleeps
        ev = jobs.phase_end(second, "evict")
        assert ev["evicted"] == ["chat"] and ev["slept"] == ["chat"] and ev["transition"] == "sleep"
        assert [t["kind"] for t in ev["transitions"]] == ["sleep"]
        states = {i.endpoint: (s, i.pid) for i, s in jobs.instances()}
        assert states["chat"] == ("asleep", chat.pid)
        assert r.hget(keys.instance(chat.id), "sleep_level") == "1"
        assert r.get(keys.resident(GPU)) == instance_value("embed", [GPU])  # P:resident: the ready instance only

        # the live planner's fleet state plans the wake it will get
        from makespan.workers.planner_worker import PlannerWorker

        state_, _busy = PlannerWorker(r, settings, fleet).fleet_state()
        assert state_.asleep.get(GPU) == frozenset({"chat"})

        third = jobs.run("chat")  # embed is stopped, chat woken: the same process
        ev = jobs.phase_end(third, "start_endpoint")
        assert ev["transition"] == "wake" and "wake_failed" not in ev
        assert [t["kind"] for t in ev["transitions"]] == ["wake"]
        assert jobs.phase_end(third, "evict")["transition"] == "evict"
        (woken, state), = jobs.instances()
        assert (woken.id, woken.pid, state) == (chat.id, chat.pid, "running")
        assert r.get(keys.resident(GPU)) == instance_value("chat", [GPU])
    finally:
        stop.set()
        probes.join(5)
        obs.close()
    incidents = [i for i in list_incidents(r, keys) if i.get("kind") == "incident"]
    assert incidents == []


def test_failing_wake_falls_back_to_a_cold_start(r, keys, settings, cleanup):
    jobs = Jobs(r, keys, settings, _fleet(chat_command=[*SERVER, "--fail-wake"]))
    jobs.run("chat")
    (chat, _), = jobs.instances()
    jobs.run("embed")
    third = jobs.run("chat")
    ev = jobs.phase_end(third, "start_endpoint")
    assert ev["transition"] == "cold_start"
    assert "wake_up answered HTTP 500" in ev["wake_failed"]
    (fresh, state), = jobs.instances()
    assert state == "running" and fresh.id != chat.id and fresh.pid != chat.pid
    assert not process_alive(chat.pid)  # the sleeper that would not wake was stopped
    assert r.get(keys.resident(GPU)) == instance_value("chat", [GPU])


def test_simulated_sleeper_wakes_and_records_its_durations(r, keys, settings):
    jobs = Jobs(r, keys, settings, _fleet(chat_driver="simulated"))
    jobs.run("chat")
    jobs.run("embed")
    (sleeper, state), = [(i, s) for i, s in jobs.instances() if i.endpoint == "chat"]
    assert state == "asleep"
    ctx = jobs.run("chat")
    ev = jobs.phase_end(ctx, "start_endpoint")
    assert ev["transition"] == "wake"
    (t,) = ev["transitions"]
    assert t["planned_s"] == 8.0 and t["actual_s"] >= 8.0  # wake_s, scaled, measured in workload s
    assert [i.id for i, s in jobs.instances() if s == "running"] == [sleeper.id]
    for kind, n in (("cold_start", 2), ("sleep", 1), ("evict", 1), ("wake", 1)):
        got = sum(r.llen(keys.transition_times(e, "host-a", kind)) for e in ("chat", "embed"))
        assert got == n, kind


def test_sleeper_of_another_endpoint_is_kept_by_a_cold_start(r, keys, settings):
    """A cold start on GPUs where another endpoint sleeps leaves the sleeper alone (the
    planner keeps it asleep there); a non-sleep-capable leftover is stopped."""
    jobs = Jobs(r, keys, settings, _fleet(chat_driver="simulated"))
    jobs.run("chat")
    jobs.run("embed")
    register_instance(r, keys, Instance("embed", [GPU], "simulated", host="host-a"))  # a stray leftover
    r.delete(keys.resident(GPU))
    jobs.run("embed")
    got = sorted((i.endpoint, s) for i, s in jobs.instances())
    assert got == [("chat", "asleep"), ("embed", "running")]


def test_gantt_and_report_tell_sleep_wake_and_cold_start_apart(r, keys, settings, tmp_path):
    from makespan.gantt import TRANSITION_COLOURS, intervals, render_gantt, summary_stats
    from makespan.run_report import live_report
    from tests.live import all_events

    fleet = _fleet(chat_driver="simulated")
    jobs = Jobs(r, keys, settings, fleet)
    ctxs = [jobs.run(ep) for ep in ("chat", "embed", "chat")]
    events = all_events(r, keys)
    assert summary_stats(events)["transition_count"] == {"sleep": 1, "wake": 1, "cold_start": 2}
    by_phase = {(iv.phase, iv.transition) for iv in intervals(events)}
    assert {("evict", "sleep"), ("evict", "evict"), ("start_endpoint", "wake"),
            ("start_endpoint", "cold_start")} <= by_phase
    assert set(TRANSITION_COLOURS) == {"sleep", "wake", "cold_start"}
    assert Path(render_gantt(events, str(tmp_path / "g.png"))).stat().st_size > 0
    rep = live_report(r, keys, fleet, events, [c.job_id for c in ctxs], settings.time_scale, settings.policy)
    assert {k: rep["transitions"][k] for k in ("evict", "sleep", "cold_start", "wake")} == \
        {"evict": 2, "sleep": 1, "cold_start": 2, "wake": 1}
    assert rep["transition_error"]["wake"]["n"] == 1


def _ram_fleet(host_memory_mib: int) -> FleetSpec:
    sim = {"memory_mib_per_gpu": 24000, "cold_start_s": 60, "evict_s": 5, "wake_s": 8}
    return FleetSpec.model_validate({
        "name": "ram",
        "hosts": [{"name": "host-a", "gpu_count": 2, "memory_mib": 81920, "host_memory_mib": host_memory_mib}],
        "endpoints": {"chat": {"model": "m/chat", **sim}, "chat2": {"model": "m/chat2", **sim},
                      "embed": {"model": "m/embed", "memory_mib_per_gpu": 6000, "cold_start_s": 30, "evict_s": 3},
                      "big": {"model": "m/big", "memory_mib_per_gpu": 81800, "cold_start_s": 30, "evict_s": 3}}})


def test_worker_keeps_sleepers_within_the_host_ram_budget(r, keys, settings):
    """Issue 20 point 2, live side: one level-1 sleeper's RAM (24000 MiB) fits host-a's
    budget of 30000 MiB, a second does not: it is stopped (``sleep_skipped``), as the
    planner's replay decides."""
    jobs = Jobs(r, keys, settings, _ram_fleet(30000))
    g1 = "GPU-host-a-1"
    jobs.run("chat")
    jobs.gpu = g1
    jobs.run("chat2")
    jobs.gpu = GPU
    jobs.run("embed")  # chat sleeps on GPU 0
    jobs.gpu = g1
    ctx = jobs.run("embed")  # chat2 would take the sleepers to 48000 MiB: stopped
    ev = jobs.phase_end(ctx, "evict")
    assert ev["slept"] == [] and ev["transition"] == "evict"
    assert "host RAM for sleepers" in ev["sleep_skipped"]
    assert sorted((i.endpoint, s) for i, s in jobs.instances()) == [("chat", "asleep"), ("embed", "running"),
                                                                    ("embed", "running")]


def test_a_level_1_sleeper_over_the_ram_budget_sleeps_at_level_2_where_the_endpoint_has_it(r, keys, settings):
    """The plan prices a group's sleeper per GPU, so it chose level 1 for a TP-2 instance a
    TP-1 job displaced in part; the worker found its whole RAM over the budget and stopped
    it: a 120 s cold start to restore instead of a 40 s wake (a sleep-level operator). With
    a level-2 mode (``wake_level2_s``) the worker puts it to sleep at level 2 (no RAM)."""
    raw = _ram_fleet(30000).model_dump()
    raw["endpoints"]["chat2"]["wake_level2_s"] = 20
    jobs = Jobs(r, keys, settings, FleetSpec.model_validate(raw))
    g1 = "GPU-host-a-1"
    jobs.run("chat")
    jobs.gpu = g1
    jobs.run("chat2")
    jobs.gpu = GPU
    jobs.run("embed")  # chat sleeps on GPU 0: 24000 of the 30000 MiB
    jobs.gpu = g1
    ctx = jobs.run("embed", sleep_levels={"chat2": 1})  # level 1 would take the sleepers to 48000 MiB
    ev = jobs.phase_end(ctx, "evict")
    assert ev["slept"] == ["chat2"] and ev["slept_levels"] == {"chat2": 2}, ev
    assert "chat2: host RAM for sleepers: 24000 + 24000 MiB" in ev["sleep_level_lowered"], ev
    assert sorted((i.endpoint, s) for i, s in jobs.instances()) == [("chat", "asleep"), ("chat2", "asleep"),
                                                                    ("embed", "running"), ("embed", "running")]


def test_one_evict_of_several_modelled_sleepers_records_each_ones_own_duration(r, keys, settings):
    """A TP-2 job put a 5 s and a 1 s sleeper to sleep in one evict: both were timed at the
    longest (5 s), and the learned sleep times drifted up to it (a sleep-level operator)."""
    raw = _ram_fleet(10**6).model_dump()
    raw["endpoints"]["chat2"]["evict_s"] = 1
    raw["endpoints"]["pair"] = {"model": "m/pair", "memory_mib_per_gpu": 24000, "cold_start_s": 30, "evict_s": 3,
                                "tensor_parallel": 2}
    jobs = Jobs(r, keys, settings, FleetSpec.model_validate(raw))
    jobs.run("chat")
    jobs.gpu = "GPU-host-a-1"
    jobs.run("chat2")
    ctx = jobs.run("pair", gpus=(GPU, "GPU-host-a-1"))
    ev = jobs.phase_end(ctx, "evict")
    assert sorted(ev["slept"]) == ["chat", "chat2"], ev
    took = {t["endpoint"]: t["actual_s"] for t in ev["transitions"]}
    assert took["chat"] >= 5.0 and 1.0 <= took["chat2"] < 2.5, took  # workload s: its own, not the longest
    sample = float(r.lindex(keys.transition_times("chat2", "host-a", "sleep"), 0))
    assert sample < 2.5, sample


def test_worker_stops_a_sleeper_that_no_longer_fits_beside_the_new_resident(r, keys, settings):
    jobs = Jobs(r, keys, settings, _ram_fleet(10**6))
    jobs.run("chat")
    jobs.run("embed")  # chat asleep beside embed (512 MiB)
    ctx = jobs.run("big")  # 81800 + 512 > 81920: chat is stopped
    assert jobs.phase_end(ctx, "start_endpoint")["sleepers_stopped"] == ["chat"]
    assert [(i.endpoint, s) for i, s in jobs.instances()] == [("big", "running")]


def test_worker_stops_a_sleeper_that_does_not_fit_beside_the_job_s_helpers(r, keys, settings):
    """A job's helper endpoints count as the plan counts them (planner/helpers.py
    ``need_mib``, ``Replay._fit_sleepers``): chat sleeps beside embed (6000 + 512 MiB); an
    embed job with a helper of 75500 MiB needs 81500 MiB on the GPU, so chat (512 asleep)
    no longer fits and is stopped before the helper starts."""
    fleet = _ram_fleet(10**6)
    fleet.endpoints["helper"] = fleet.endpoints["embed"].model_copy(
        update={"name": "helper", "model": "m/helper", "memory_mib_per_gpu": 75500})
    jobs = Jobs(r, keys, settings, fleet)
    jobs.run("chat")
    jobs.run("embed")  # chat asleep beside embed
    assert sorted((i.endpoint, s) for i, s in jobs.instances()) == [("chat", "asleep"), ("embed", "running")]
    alone = jobs.run("embed")  # warm, no helpers: chat stays asleep
    assert "sleepers_stopped" not in jobs.phase_end(alone, "start_endpoint")
    ctx = jobs.run("embed", helpers=("helper",))
    assert jobs.phase_end(ctx, "start_endpoint")["sleepers_stopped"] == ["chat"]
    assert [(i.endpoint, s) for i, s in jobs.instances()] == [("embed", "running")]  # the clear phase stopped the helper


def test_start_sweep_of_a_new_worker_keeps_a_sleeper(r, keys, settings, cleanup):
    """A GPU worker restarts: its start sweep (workers/orphans.py) stops processes nobody
    tracks, but keeps a sleeper, which the planner counts on waking."""
    import subprocess

    from makespan.workers.orphans import sweep

    jobs = Jobs(r, keys, settings, _fleet())
    jobs.run("chat")
    jobs.run("embed")
    (chat, state), = [(i, s) for i, s in jobs.instances() if i.endpoint == "chat"]
    assert state == "asleep"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    r.hset(keys.instance(chat.id), "owner_pid", str(gone.pid))  # its worker is gone
    assert [e for e in sweep(r, keys, "host-a") if e.get("instance") == chat.id] == []
    assert [(i.id, s) for i, s in jobs.instances() if i.endpoint == "chat"] == [(chat.id, "asleep")]
    assert process_alive(chat.pid)
    assert jobs.phase_end(jobs.run("chat"), "start_endpoint")["transition"] == "wake"


@pytest.mark.parametrize("planned_level", [2, 0])
def test_the_planned_transition_reaches_the_worker(r, keys, settings, cleanup, planned_level):
    """The plan's choice (Assignment.sleep_levels, issue 20 point 3) travels in the phase
    context: level 2 on an endpoint configured at level 1 sleeps it at level 2; 0 stops it."""
    jobs = Jobs(r, keys, settings, _fleet())
    jobs.run("chat")
    (chat, _state), = jobs.instances()
    ev = jobs.phase_end(jobs.run("embed", sleep_levels={"chat": planned_level}), "evict")
    states = {i.endpoint: s for i, s in jobs.instances()}
    if planned_level:
        assert ev["slept"] == ["chat"] and ev["transition"] == "sleep"
        assert states["chat"] == "asleep" and r.hget(keys.instance(chat.id), "sleep_level") == str(planned_level)
    else:
        assert ev["slept"] == [] and ev["transition"] == "evict" and [t["kind"] for t in ev["transitions"]] == ["evict"]
        assert "chat" not in states and not process_alive(chat.pid)
