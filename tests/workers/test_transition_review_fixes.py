"""Set-point restores and prewarm beside sleepers (found by a review, 2026-12-04): each test
fails on the code before its fix. In-process phases (simulated driver) and planner ticks on
the real Redis."""

from __future__ import annotations

import dataclasses
import json

from makespan.models import parse_fleet
from makespan.planner.model import PlanJob
from makespan.planner.replay import Replay
from makespan.producer import Producer
from makespan.workers.drivers.registry import list_instances
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner, instance_value
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.warm import run_phases

class _Jobs:
    """Run whole jobs of an endpoint on given GPUs, phase by phase."""

    def __init__(self, r, keys, settings, fleet, host):
        self.r, self.keys, self.fleet, self.host = r, keys, fleet, host
        self.prod = Producer(r, keys, fleet, settings)
        self.runner = PhaseRunner(r, settings, fleet)
        self.n = 0

    def ctx(self, endpoint, gpus, sleep_levels=None, helpers=()):
        self.n += 1
        spec = {"endpoint": endpoint, "service_s": 1, "priority": "HIGH", **({"helpers": list(helpers)} if helpers else {})}
        jid = self.prod.submit(spec).id
        lid = f"LJ{self.n}"
        lease = LeaseStore(self.r, self.keys).acquire(lid, tuple(gpus), 30.0, job_id=jid, kind="job",
                                                      holder=self.host, queue=self.keys.queue("HIGH"))
        assert lease is not None
        return PhaseContext(lid, lease.token, list(gpus), self.host, "job", endpoint, jid, "HIGH", 1.0,
                            sleep_levels=sleep_levels)

    def run(self, endpoint, gpus, sleep_levels=None, helpers=()):
        ctx = self.ctx(endpoint, gpus, sleep_levels, helpers)
        out = run_phases(self.runner, ctx)
        assert out == "completed", out
        return ctx

    def phase_end(self, ctx, phase):
        for _i, f in self.r.xrange(self.keys.events):
            e = json.loads(f["e"])
            if e["kind"] == "phase_end" and e.get("lease") == ctx.lease_id and e.get("phase") == phase:
                return e
        raise AssertionError(f"no phase_end of {phase} for {ctx.lease_id}")


TWO = parse_fleet({"name": "two",
                     "hosts": [{"name": "a", "gpu_count": 1, "memory_mib": 40000},
                               {"name": "b", "gpu_count": 1, "memory_mib": 81920}],
                     "endpoints": {"base": {"model": "b", "memory_mib_per_gpu": 20000, "cold_start_s": 2,
                                            "set_point": [{"host": "a", "gpus": [0]}]},
                                   "sleepy": {"model": "s", "memory_mib_per_gpu": 20000, "cold_start_s": 60,
                                              "evict_s": 1, "wake_s": 2, "wake_level2_s": 4},
                                   "other": {"model": "o", "memory_mib_per_gpu": 60000, "cold_start_s": 60}}})
R0, R1 = TWO.hosts[0].gpus[0].uuid, TWO.hosts[1].gpus[0].uuid


def test_planned_restore_uses_the_plans_sleep_level(r, keys, settings, monkeypatch):
    """The plan chose to stop the set-point group's sleep-capable resident (nothing needs it
    again); the restore's context carried no sleep levels, so the worker put it to sleep."""
    import makespan.workers.drain as drain
    seen = []
    real = drain.plan_restores
    monkeypatch.setattr(drain, "plan_restores", lambda *a, **k: seen.extend(real(*a, **k)) or list(seen))
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0)
    runner = PhaseRunner(r, s, TWO)
    prod = Producer(r, keys, TWO, s)
    # sleepy is resident (simulated) on R0
    jid = prod.submit({"endpoint": "sleepy", "service_s": 1, "priority": "HIGH"}).id
    lease = LeaseStore(r, keys).acquire("L0", (R0,), 30.0, job_id=jid, kind="job", holder="a",
                                        queue=keys.queue("HIGH"))
    assert run_phases(runner, PhaseContext("L0", lease.token, [R0], "a", "job", "sleepy", jid, "HIGH", 1.0)) == "completed"
    assert r.get(keys.resident(R0)) == instance_value("sleepy", [R0])

    sent = []
    w = PlannerWorker(r, s, TWO, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = ""
    r.set(keys.resident(R1), instance_value("other", [R1]))
    for _ in range(2):
        prod.submit({"endpoint": "other", "service_s": 1, "priority": "NORMAL"})
    w.tick()
    restores = [c for c in sent if c.kind == "restore"]
    assert [(c.endpoint, c.gpus) for c in restores] == [("base", [R0])]
    # what the plan chose for the displaced sleepy instance
    (planned,) = seen
    assert dict(planned.sleep_levels) == {"sleepy": 0}
    ctx = restores[0]
    assert run_phases(runner, ctx) == "completed"
    states = {i.endpoint: st for i, st in list_instances(r, keys, with_state=True)}
    # the plan (no demand for sleepy) chose to stop it: it must not be left asleep
    assert "sleepy" not in states, states


SIM = {"cold_start_s": 60, "evict_s": 2, "wake_s": 3}
PW = parse_fleet({"name": "pw",
                     "hosts": [{"name": "a", "gpu_count": 2, "memory_mib": 81920}],
                     "endpoints": {"x": {"model": "x", "memory_mib_per_gpu": 20000, "cold_start_s": 60},
                                   "y": {"model": "y", "memory_mib_per_gpu": 20000, **SIM},
                                   "z": {"model": "z", "memory_mib_per_gpu": 20000, **SIM}}})
G0, G1 = PW.hosts[0].gpus[0].uuid, PW.hosts[0].gpus[1].uuid


def test_prewarm_does_not_displace_an_endpoint_whose_job_is_queued(r, keys, settings):
    """A full batch (batch_size 1) left a queued y job out; prewarm woke z on y's warm GPU."""
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0, prewarm=True, batch_size=1)
    jobs = _Jobs(r, keys, s, PW, "a")
    jobs.run("x", [G0])
    jobs.run("z", [G1])
    jobs.run("y", [G1])  # z sleeps on G1, y resident there
    sent = []
    w = PlannerWorker(r, s, PW, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = ""
    now = w.now_s()
    w.kept.recent_jobs = {f"old{i}": PlanJob(f"old{i}", "z", 2.0, now - 10, 100.0) for i in range(3)}
    jobs.prod.submit({"endpoint": "x", "service_s": 1, "priority": "HIGH"})
    jobs.prod.submit({"endpoint": "y", "service_s": 1, "priority": "NORMAL"})
    w.tick()
    # x's job starts on G0 (warm); y's job is queued and y is warm on G1: nothing may take G1 from it
    assert not any(c.kind == "restore" and G1 in c.gpus for c in sent), \
        [(c.kind, c.endpoint, c.gpus) for c in sent]


TIGHT = parse_fleet({"name": "tight",
                     "hosts": [{"name": "a", "gpu_count": 1, "memory_mib": 81920}],
                     "endpoints": {"big": {"model": "big", "memory_mib_per_gpu": 81000, "cold_start_s": 60,
                                           "evict_s": 2, "wake_s": 3},
                                   "small": {"model": "small", "memory_mib_per_gpu": 20000, "cold_start_s": 60,
                                             "evict_s": 2, "wake_s": 3}}})
T0 = TIGHT.hosts[0].gpus[0].uuid


def test_woken_endpoint_not_counted_twice_when_evicted_one_sleeps(r, keys, settings):
    """The endpoint being woken was counted twice in the room left for the evicted instance to
    sleep (its full memory as the new resident and its asleep memory as a sleeper beside it);
    the plan counts it once, so the plan's sleep became a stop on the worker."""
    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    jobs = _Jobs(r, keys, s, TIGHT, "a")
    jobs.run("big", [T0])
    jobs.run("small", [T0])  # big sleeps (512 MiB) beside small
    assert sorted((i.endpoint, st) for i, st in list_instances(r, keys, with_state=True)) == \
        [("big", "asleep"), ("small", "running")]
    # the plan: wake big on T0, small goes to sleep there (it is in demand)
    state, _ = PlannerWorker(r, s, TIGHT).fleet_state()
    state = dataclasses.replace(state, demand={"small": 10.0})
    rep = Replay(state)
    a = rep.place(PlanJob("j", "big", 2.0, state.now_s, 1.0), (T0,))
    assert a.load == "wake" and dict(a.sleep_levels) == {"small": 1}
    assert "small" in rep.asleep[T0]
    # the worker, with the plan's choice
    ctx = jobs.run("big", [T0], sleep_levels=dict(a.sleep_levels))
    ev = jobs.phase_end(ctx, "evict")
    assert ev.get("slept") == ["small"], ev.get("sleep_skipped")


RAM = parse_fleet({"name": "ram",
                   "hosts": [{"name": "a", "gpu_count": 1, "memory_mib": 81920, "host_memory_mib": 30000}],
                   "endpoints": {"chat": {"model": "c", "memory_mib_per_gpu": 24000, "cold_start_s": 60,
                                          "evict_s": 2, "wake_s": 3},
                                 "chat2": {"model": "c2", "memory_mib_per_gpu": 24000, "cold_start_s": 60,
                                           "evict_s": 2, "wake_s": 3}}})
R0 = RAM.hosts[0].gpus[0].uuid


def test_woken_sleepers_ram_not_counted_against_the_evicted_one(r, keys, settings):
    """chat sleeps (24000 MiB of host RAM, budget 30000); a chat job wakes it and evicts
    chat2: once chat is awake its RAM is free, so chat2 may sleep (the plan says so)."""
    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    jobs = _Jobs(r, keys, s, RAM, "a")
    jobs.run("chat", [R0])
    jobs.run("chat2", [R0])  # chat asleep, level 1
    state, _ = PlannerWorker(r, s, RAM).fleet_state()
    state = dataclasses.replace(state, demand={"chat2": 10.0})
    a = Replay(state).place(PlanJob("j", "chat", 2.0, state.now_s, 1.0), (R0,))
    assert a.load == "wake" and dict(a.sleep_levels) == {"chat2": 1}
    ctx = jobs.run("chat", [R0], sleep_levels=dict(a.sleep_levels))
    ev = jobs.phase_end(ctx, "evict")
    assert ev.get("slept") == ["chat2"], ev.get("sleep_skipped")


WIDE = parse_fleet({"name": "wide",
                    "hosts": [{"name": "a", "gpu_count": 2, "memory_mib": 81920}],
                    "endpoints": {"wide": {"model": "w", "tensor_parallel": 2, "memory_mib_per_gpu": 20000,
                                           "cold_start_s": 2, "evict_s": 1},
                                  "small": {"model": "s", "memory_mib_per_gpu": 20000, "cold_start_s": 2}}})


def test_an_instance_another_lease_is_stopping_is_no_evict_sample_here(r, keys, settings):
    """Two restores after a TP-2 job: the first one's evict stops the wide instance, the
    second one's found it already stopping (its marker still on its GPU) and recorded an
    evict of 0.003 s, learned as a sample of wide's evict time (operator check)."""
    from makespan.workers.drivers.registry import set_instance_state

    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    jobs = _Jobs(r, keys, s, WIDE, "a")
    g0, g1 = (g.uuid for g in WIDE.hosts[0].gpus)
    jobs.run("wide", [g0, g1])
    (wide,) = [i for i in list_instances(r, keys) if i.endpoint == "wide"]
    set_instance_state(r, keys, wide.id, "stopping")  # another lease's evict is stopping it
    ctx = jobs.run("small", [g1])
    ev = jobs.phase_end(ctx, "evict")
    assert ev.get("evicted") == ["wide"]  # displaced from these GPUs, as before
    assert not [t for t in ev.get("transitions", []) if t["endpoint"] == "wide"], ev
