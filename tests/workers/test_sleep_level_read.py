"""The live planner and the GPU worker read the level a sleeper really sleeps at (issue 20):
the instance registry's ``sleep_level`` (written when the worker slept it), not the fleet
file's configured level. A level-2 sleeper wakes at ``wake_level2_s`` in the plan and holds
no host RAM, for the planner's fleet state and the worker's RAM rule alike. Real Redis, the
GPU worker's phases with the simulated driver."""

from __future__ import annotations

from makespan.models import FleetSpec
from makespan.planner.replay import Replay
from makespan.workers.drivers.registry import list_sleepers
from makespan.workers.planner_worker import PlannerWorker
from tests.workers.test_sleep_phases import GPU, Jobs

GPU1 = "GPU-host-a-1"


def _fleet(host_memory_mib: int = 10**6) -> FleetSpec:
    sleepy = {"memory_mib_per_gpu": 24000, "cold_start_s": 60, "evict_s": 5, "wake_s": 4, "wake_level2_s": 12,
              "slots": 4}
    return FleetSpec.model_validate({
        "name": "levels",
        "hosts": [{"name": "host-a", "gpu_count": 2, "memory_mib": 81920, "host_memory_mib": host_memory_mib}],
        "endpoints": {
            "chat": {"model": "m/chat", **sleepy},
            "code": {"model": "m/code", **sleepy},
            "embed": {"model": "m/embed", "memory_mib_per_gpu": 6000, "cold_start_s": 30, "evict_s": 3},
        }})


def test_the_planner_plans_the_wake_at_the_level_the_worker_slept(r, keys, settings):
    fleet = _fleet()
    jobs = Jobs(r, keys, settings, fleet)
    jobs.run("chat")
    jobs.run("embed", sleep_levels={"chat": 2})  # the plan chose level 2 for chat
    [(chat, level)] = list_sleepers(r, keys)
    assert (chat.endpoint, level) == ("chat", 2)

    state, _busy = PlannerWorker(r, settings, fleet).fleet_state()
    assert state.asleep.get(GPU) == frozenset({"chat"})
    assert state.asleep_level == {(GPU, "chat"): 2}
    load_s, _evicted, load, _ = Replay(state).transition((GPU,), state.endpoints["chat"])
    assert load == "wake"
    # evict embed (3 s) then a level-2 wake (12 s), not the configured level 1's 4 s
    assert load_s == state.endpoints["embed"].evict_s + 12

    jobs.run("chat")  # woken: no sleeper left, no level left over in the plan's view
    state, _busy = PlannerWorker(r, settings, fleet).fleet_state()
    assert state.asleep_level == {} and list_sleepers(r, keys) == []


def test_a_level_2_sleeper_holds_no_host_ram_for_the_next_sleeper(r, keys, settings):
    """Budget 30000 MiB: chat sleeps at level 2 (no RAM), so code's level-1 sleep
    (24000 MiB) fits beside it; counting chat at its configured level 1 would make it
    48000 MiB and stop code."""
    jobs = Jobs(r, keys, settings, _fleet(host_memory_mib=30000))
    jobs.run("chat")
    jobs.gpu = GPU1
    jobs.run("code")
    jobs.gpu = GPU
    jobs.run("embed", sleep_levels={"chat": 2})
    jobs.gpu = GPU1
    ctx = jobs.run("embed", sleep_levels={"code": 1})
    ev = jobs.phase_end(ctx, "evict")
    assert ev["slept"] == ["code"] and "sleep_skipped" not in ev
    assert sorted((i.endpoint, level) for i, level in list_sleepers(r, keys)) == [("chat", 2), ("code", 1)]
    state, _busy = PlannerWorker(r, settings, jobs.fleet).fleet_state()
    replay = Replay(state)
    assert replay.ram_used == {"host-a": 24000.0}  # code's weights only


def test_the_live_report_and_the_summary_count_sleeps_per_level(r, keys, settings):
    from makespan.gantt import summarize, summary_stats
    from makespan.run_report import live_report
    from tests.live import all_events

    fleet = _fleet()
    jobs = Jobs(r, keys, settings, fleet)
    ctxs = [jobs.run("chat"), jobs.run("embed", sleep_levels={"chat": 2}), jobs.run("chat"),
            jobs.run("embed", sleep_levels={"chat": 1})]
    events = all_events(r, keys)
    assert [e.get("slept_levels") for e in events if e["kind"] == "phase_end" and e.get("phase") == "evict"
            and e.get("slept")] == [{"chat": 2}, {"chat": 1}]
    rep = live_report(r, keys, fleet, events, [c.job_id for c in ctxs], settings.time_scale, settings.policy)
    tr = rep["transitions"]
    assert (tr["sleep"], tr["sleep_level1"], tr["sleep_level2"], tr["wake"]) == (2, 1, 1, 1)
    assert summary_stats(events)["sleep_level_count"] == {"level1": 1, "level2": 1}
    assert "sleeps by level: level1 1x, level2 1x" in summarize(events)


def test_the_live_planner_prewarms_a_sleeper_when_prewarm_is_on(r, keys, settings):
    """``MAKESPAN_PREWARM``: on an idle GPU where chat (in more recent demand) sleeps under
    code, the planner tick leases a restore that wakes chat (the same instance) and puts
    code to sleep; off, the same tick does nothing."""
    import dataclasses

    from makespan.planner.model import PlanJob
    from makespan.run_report import live_report
    from makespan.workers.warm import run_phases
    from tests.live import all_events

    fleet = _fleet()
    jobs = Jobs(r, keys, settings, fleet)
    first = jobs.run("chat")
    second = jobs.run("code", sleep_levels={"chat": 1})  # chat sleeps under code on GPU 0
    [(chat, _level)] = list_sleepers(r, keys)
    recent = {f"j{i}": PlanJob(f"j{i}", e, 2.0, 0.0, 10.0, 2) for i, e in enumerate(["chat", "chat", "code"])}
    for prewarm, want in ((False, []), (True, [("restore", "chat", [GPU])])):
        sent: list = []
        worker = PlannerWorker(r, dataclasses.replace(settings, prewarm=prewarm), fleet,
                               dispatch=lambda ctx, queue, sent=sent: sent.append(ctx))
        worker.token = ""
        worker.kept.recent_jobs = dict(recent)
        worker.tick()
        assert [(c.kind, c.endpoint, c.gpus) for c in sent] == want
    assert run_phases(jobs.runner, sent[0]) == "completed"
    assert [(i.id, lvl) for i, lvl in list_sleepers(r, keys)] == [(i.id, 1) for i, _ in jobs.instances()
                                                                  if i.endpoint == "code"]
    assert [(i.id, s) for i, s in jobs.instances() if i.endpoint == "chat"] == [(chat.id, "running")]
    events = all_events(r, keys)
    [start] = [e for e in events if e["kind"] == "restore_start"]
    assert start["prewarm"] is True and start["planned_s"] == 4  # planned as a wake
    rep = live_report(r, keys, fleet, events, [first.job_id, second.job_id], settings.time_scale, settings.policy)
    assert (rep["transitions"]["prewarm"], rep["transitions"]["restore"]) == (1, 0)


def test_an_idle_set_points_restore_that_is_a_wake_is_planned_as_one(r, keys, settings):
    """A set point asleep under another endpoint is restored by a wake, but its restore lease
    was planned at ``cold_start_s`` (a driver author's report: ``planned_s`` 6 against a 1 s
    wake): the free times and ETAs of what waits for those GPUs read it. Planned at the wake
    of the level it sleeps at: ``wake_s`` from level 1, ``wake_level2_s`` from level 2."""
    import dataclasses

    from makespan.workers.warm import run_phases
    from tests.live import all_events

    base = _fleet().model_dump()
    base["endpoints"]["chat"]["set_point"] = [{"host": "host-a", "gpus": [0]}]
    fleet = FleetSpec.model_validate(base)
    for level, wake_s in ((2, 12), (1, 4)):
        jobs = Jobs(r, keys, settings, fleet)
        jobs.run("chat")
        jobs.run("embed", sleep_levels={"chat": level})  # chat sleeps at `level` under embed on its set point
        assert [(i.endpoint, lvl) for i, lvl in list_sleepers(r, keys)] == [("chat", level)]
        sent: list = []
        worker = PlannerWorker(r, dataclasses.replace(settings, prewarm=False), fleet,
                               dispatch=lambda ctx, queue, sent=sent: sent.append(ctx))
        worker.token = ""
        worker.tick()  # nothing queued: the idle tick restores the set point
        assert [(c.kind, c.endpoint, c.gpus) for c in sent] == [("restore", "chat", [GPU])]
        [start] = [e for e in all_events(r, keys) if e["kind"] == "restore_start" and e["lease"] == sent[0].lease_id]
        assert start["planned_s"] == wake_s, start
        assert float(r.hget(keys.lease(sent[0].lease_id), "planned_s")) == wake_s
        assert run_phases(jobs.runner, sent[0]) == "completed"  # chat woken on its set point
        for inst, _state in jobs.instances():  # start the next level from an empty GPU
            jobs.runner._stop_instance(inst)
        r.delete(keys.resident(GPU))
