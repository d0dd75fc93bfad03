"""The warm-job fast path (workers/warm.py) leaves the same state and records the same
events as the phase-by-phase path, and falls back to it whenever a check fails."""

from __future__ import annotations

import json

from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner, instance_value
from makespan.workers.warm import run_phases, run_warm
from tests.conftest import FLEET_TOML

GPU = "GPU-host-a-3"


def _warm_leased_job(r, keys, settings, lid="L1"):
    fleet = load_fleet(FLEET_TOML)
    jid = Producer(r, keys, fleet, settings).submit({"endpoint": "embed", "service_s": 1, "priority": "HIGH"}).id
    r.set(keys.resident(GPU), instance_value("embed", [GPU]))
    lease = LeaseStore(r, keys).acquire(lid, (GPU,), 30.0, job_id=jid, kind="job", holder="host-a",
                                        queue=keys.queue("HIGH"))
    assert lease is not None
    ctx = PhaseContext(lid, lease.token, [GPU], "host-a", "job", "embed", jid, "HIGH", 1.0)
    return ctx, PhaseRunner(r, settings, fleet)


def _job_events(r, keys, jid):
    out = []
    for _i, f in r.xrange(keys.events):
        e = json.loads(f["e"])
        if e.get("job") == jid and e["kind"] not in ("submitted", "leased"):
            out.append((e["kind"], e.get("phase")))
    return out


def _after(r, keys, ctx):
    rec = r.hgetall(keys.job(ctx.job_id))
    return {"state": rec["state"], "started": "started_at" in rec, "finished": "finished_at" in rec,
            "gpu": r.get(keys.gpu(GPU)), "lease": r.exists(keys.lease(ctx.lease_id)),
            "phase": r.exists(keys.phase(ctx.lease_id)), "busy": r.exists(keys.busy(ctx.lease_id)),
            "running": r.zscore(keys.running, ctx.job_id), "resident": r.get(keys.resident(GPU)),
            "finished_index": r.zscore(f"{keys.prefix}:finished", ctx.job_id) is not None}


def test_fast_path_matches_the_phase_by_phase_path(r, keys, settings):
    fast, runner = _warm_leased_job(r, keys, settings, "L1")
    assert run_warm(runner, fast) == "completed"
    slow, _ = _warm_leased_job(r, keys, settings, "L2")
    assert run_phases(runner, slow) == "completed"
    assert _job_events(r, keys, fast.job_id) == _job_events(r, keys, slow.job_id)
    assert _job_events(r, keys, fast.job_id)[-1] == ("completed", None)
    assert _after(r, keys, fast) == _after(r, keys, slow)
    assert _after(r, keys, fast)["state"] == "completed" and _after(r, keys, fast)["gpu"] is None


def test_stale_token_writes_nothing(r, keys, settings):
    ctx, runner = _warm_leased_job(r, keys, settings)
    ctx.token += 1
    assert run_warm(runner, ctx) == "stale"
    assert r.hget(keys.job(ctx.job_id), "state") == "leased"
    assert not r.exists(keys.phase(ctx.lease_id)) and not r.exists(keys.busy(ctx.lease_id))


def test_cancel_requested_falls_back_and_cancels(r, keys, settings):
    ctx, runner = _warm_leased_job(r, keys, settings)
    r.hset(keys.job(ctx.job_id), "cancel_requested", "1")
    assert run_warm(runner, ctx) == "cancelled"
    assert r.hget(keys.job(ctx.job_id), "state") == "cancelled"
    assert r.get(keys.gpu(GPU)) is None


def test_redelivery_replays_only_what_is_not_done(r, keys, settings):
    """A second delivery after execute finished (its worker died before clear) only clears."""
    ctx, runner = _warm_leased_job(r, keys, settings)
    for p in ("evict", "start_endpoint", "execute"):
        assert runner.run(ctx, p) == "done"
    assert run_warm(runner, ctx) == "completed"
    kinds = _job_events(r, keys, ctx.job_id)
    assert kinds.count(("phase_end", "execute")) == 1 and kinds[-1] == ("completed", None)


def test_instance_gone_falls_back_and_loads_it(r, keys, settings):
    ctx, runner = _warm_leased_job(r, keys, settings)
    r.delete(keys.resident(GPU))  # no longer warm when the task runs
    assert run_warm(runner, ctx) == "completed"
    assert r.get(keys.resident(GPU)) == instance_value("embed", [GPU])
    assert ("phase_end", "start_endpoint") in _job_events(r, keys, ctx.job_id)


def test_cancel_during_warm_requests_ends_cancelled_not_failed(r, keys, settings):
    """A request-level job on the warm path stopped by a cancel ends ``cancelled`` (as on
    the phase-by-phase path, PhaseCancelled), not ``failed``."""
    import threading
    from pathlib import Path

    from tests.live import wait_for
    from makespan.workers.drivers import get_driver
    from makespan.workers.drivers.registry import register_instance, unregister_instance

    fleet = load_fleet(Path(__file__).parents[1] / "workloads" / "fleet.toml")
    gpu = fleet.gpu_uuids()[0]
    ep = fleet.endpoints["judge"]  # 80 ms per request, 2 slots: 400 requests take 16 s
    inst = get_driver(ep.launch.driver).start(ep, [gpu], settings.time_scale, "host-w")
    try:
        register_instance(r, keys, inst)
        r.set(keys.resident(gpu), instance_value("judge", [gpu]))
        payload = {"requests": 400, "prompt": "r {i}", "route": "/v1/completions", "max_tokens": 1,
                   "request_timeout_s": 5.0, "step": "s"}
        jid = Producer(r, keys, fleet, settings).submit({"endpoint": "judge", "service_s": 16, "payload": payload}).id
        lease = LeaseStore(r, keys).acquire("LC", (gpu,), 30.0, job_id=jid, kind="job", holder="host-w",
                                            queue=keys.queue("NORMAL"), instance=instance_value("judge", [gpu]))
        assert lease is not None and lease.warm
        ctx = PhaseContext("LC", lease.token, [gpu], "host-w", "job", "judge", jid, "NORMAL", 16.0)
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(run_warm(PhaseRunner(r, settings, fleet), ctx)))
        t.start()
        wait_for(lambda: r.hget(keys.job(jid), "state") == "running", 10, "the warm job to run", 0.02)
        r.hset(keys.job(jid), "cancel_requested", "1")
        t.join(30)
        assert out == ["cancelled"]
        rec = r.hgetall(keys.job(jid))
        assert rec["state"] == "cancelled" and "cancelled while running" in rec["reason"]
        assert r.get(keys.gpu(gpu)) is None
    finally:
        unregister_instance(r, keys, inst.id)
        get_driver(inst.driver).stop(inst)


def test_a_function_job_gets_the_urls_of_the_instances_registered_as_it_begins(r, keys, settings):
    """The warm path hands a workload function the URLs of the instances registered on its
    GPUs as its begin step read them (not asleep nor being stopped): after the endpoint's
    instance was replaced by a new one (a restart: a new id and URL, the resident marker
    unchanged), the next job gets the new URL, never the old one."""
    import uuid

    import makespan
    from makespan.registry import REGISTRY
    from makespan.workers.drivers.base import Instance
    from makespan.workers.drivers.registry import register_instance, unregister_instance

    seen: list[tuple] = []
    name = f"t.urls_{uuid.uuid4().hex[:8]}"
    makespan.workload(endpoint="embed", name=name)(lambda ctx: seen.append((ctx.endpoint_url, ctx.endpoint_urls)))
    fleet = load_fleet(FLEET_TOML)

    def run_one(lid: str) -> str:
        jid = Producer(r, keys, fleet, settings).submit({"endpoint": "embed", "service_s": 1, "workload": name}).id
        lease = LeaseStore(r, keys).acquire(lid, (GPU,), 30.0, job_id=jid, kind="job", holder="host-a",
                                            queue=keys.queue("NORMAL"))
        assert lease is not None
        ctx = PhaseContext(lid, lease.token, [GPU], "host-a", "job", "embed", jid, "NORMAL", 1.0)
        return run_warm(PhaseRunner(r, settings, fleet), ctx)

    first = Instance("embed", [GPU], "simulated", id="first", url="http://127.0.0.1:1")
    try:
        r.set(keys.resident(GPU), instance_value("embed", [GPU]))
        register_instance(r, keys, first)
        register_instance(r, keys, Instance("render", [GPU], "simulated", id="dozing", url="http://127.0.0.1:7"),
                          state="asleep")
        register_instance(r, keys, Instance("render", [GPU], "simulated", id="going", url="http://127.0.0.1:8"),
                          state="stopping")
        assert run_one("L1") == "completed"
        unregister_instance(r, keys, first.id, gpus=first.gpus)  # restarted: a new instance, a new URL
        register_instance(r, keys, Instance("embed", [GPU], "simulated", id="second", url="http://127.0.0.1:2"))
        assert run_one("L2") == "completed"
        assert seen == [("http://127.0.0.1:1", {"embed": "http://127.0.0.1:1"}),
                        ("http://127.0.0.1:2", {"embed": "http://127.0.0.1:2"})]
        for lid in ("L1", "L2"):  # both went the warm way (its events name no transition)
            assert not any(json.loads(f["e"]).get("transition") for _i, f in r.xrange(keys.events)
                           if json.loads(f["e"]).get("lease") == lid)
    finally:
        REGISTRY.pop(name, None)


def test_a_job_whose_function_has_helpers_goes_phase_by_phase(r, keys, settings, monkeypatch):
    """A job of a function whose definition here names helper endpoints (its record names
    none) is not started by the warm path's begin step: it goes phase by phase, where its
    helpers start and stop (PhaseRunner._helpers)."""
    import makespan.workers.warm as warm

    ctx, runner = _warm_leased_job(r, keys, settings)
    r.hset(keys.job(ctx.job_id), "fn", "t.with_helpers")
    taken: list[str] = []
    monkeypatch.setattr(warm, "run_phases", lambda runner, ctx: taken.append(ctx.job_id) or "completed")
    monkeypatch.setitem(warm.REGISTRY, "t.with_helpers",
                        _workload_def("t.with_helpers", helpers=("embed",)))
    assert run_warm(runner, ctx) == "completed" and taken == [ctx.job_id]
    assert r.hget(keys.job(ctx.job_id), "state") == "leased" and not r.exists(keys.phase(ctx.lease_id))


def _workload_def(name: str, helpers: tuple[str, ...]):
    from makespan.registry import WorkloadDef

    return WorkloadDef(name, lambda ctx: None, endpoint="embed", helpers=helpers)
