"""Workloads on the live system: real planner and GPU worker processes, real endpoint
processes over HTTP. Precedence from recorded events, retry budget and cancellation
of dependants, cancelling a workload, caps and request-lease drain."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.workload_report import workload_report
from makespan.workloads import Workload, cancel_workload, chain, group, submit_workload, workload_status
from tests.live import all_events, overlaps, stop_checked, wait_for

FLEET = Path(__file__).with_name("fleet.toml").resolve()


@pytest.fixture
def fleet():
    return load_fleet(FLEET)


@pytest.fixture
def system(settings, fleet, tmp_path):
    s = LiveSystem(FLEET, fleet, settings, tmp_path / "logs")
    s.start()
    yield s
    stop_checked(s)


def _wait_final(r, keys, wid, timeout_s=60):
    return wait_for(lambda: (st := workload_status(r, keys, wid))["state"] != "running" and
                    all(x["state"] in ("completed", "failed", "cancelled") for x in st["steps"].values()) and st,
                    timeout_s, "the workload to finish", 0.1)


def _requests(r, keys, job):
    return [json.loads(x) for x in r.lrange(keys.requests(job), 0, -1)]


def _max_overlap(recs):
    pts = sorted([(x["t0"], 1) for x in recs] + [(x["t1"], -1) for x in recs], key=lambda p: (p[0], p[1]))
    cur = best = 0
    for _, d in pts:
        cur += d
        best = max(best, cur)
    return best


def _request_drain(r, keys):
    leases = sum(r.zcard(k) for k in r.scan_iter(f"{keys.prefix}:reqlease:*"))
    from makespan.workers.requests import request_drain

    instances = [k.rsplit(":", 1)[1] for k in r.scan_iter(f"{keys.prefix}:reqwaiters:*")]
    return leases, request_drain(r, keys, instances)["waiters"]


def test_diamond_precedence_caps_and_drain(r, keys, settings, fleet, system):
    wl = Workload("diamond", priority="HIGH")
    a = wl.step("gen", "gen", requests=12, prompt="item {i}", request_s=0.5)
    b = wl.step("judge", "judge", requests=6, route="/v1/chat/completions", request_s=8)
    c = wl.step("embed", "embed", requests=16, route="/v1/embeddings", request_s=0.5)
    d = wl.step("final", "sim", service_s=5)
    chain(a, group(b, c), d)
    wid = submit_workload(r, keys, fleet, wl, settings)
    st = _wait_final(r, keys, wid)
    assert st["state"] == "completed", st
    ids = {n: s["job"] for n, s in st["steps"].items()}
    evs = all_events(r, keys)
    leased = {e["job"]: e["ts"] for e in evs if e["kind"] == "leased"}
    done = {e["job"]: e["ts"] for e in evs if e["kind"] == "completed"}
    deps = st["deps"]
    for step, ds in deps.items():
        for dep in ds:  # no step starts (is leased GPUs) before each dependency completed
            assert leased[ids[step]] >= done[ids[dep]], (step, dep)
    # request level: every request of a step after every request of its dependencies
    recs = {n: _requests(r, keys, ids[n]) for n in ("gen", "judge", "embed")}
    assert [len(recs[n]) for n in ("gen", "judge", "embed")] == [12, 6, 16]
    for n in ("judge", "embed"):
        assert min(x["t0"] for x in recs[n]) >= max(x["t1"] for x in recs["gen"])
    by_inst = defaultdict(list)
    for n, rs in recs.items():
        for x in rs:
            by_inst[(n, x["instance"])].append(x)
    for (n, inst), rs in by_inst.items():
        assert _max_overlap(rs) <= fleet.endpoints[n].slots
        assert int(r.get(keys.req_peak(inst))) <= fleet.endpoints[n].slots
    assert all(x["ok"] for rs in recs.values() for x in rs)
    ends = {e["job"]: e for e in evs if e["kind"] == "phase_end" and e.get("phase") == "execute"}
    assert ends[ids["judge"]]["requests"] == 6 and ends[ids["judge"]]["latency_ms_p50"] >= 80
    assert _request_drain(r, keys) == (0, 0)
    assert overlaps(evs) == []
    assert any(e["kind"] == "workload_completed" and e["workload"] == wid for e in evs)
    rep = workload_report(r, keys, wid, evs)
    later = max(("judge", "embed"), key=lambda n: done[ids[n]])
    assert rep["critical_path"] == ["gen", later, "final"]
    assert rep["makespan_s"] == pytest.approx(max(done.values()) - float(st["submitted_at"]), abs=1e-3)
    cp = rep["critical_path_s"]
    assert cp["executing"] > 0 and cp["transition"] > 0
    assert sum(cp.values()) <= rep["makespan_s"] + 1e-3
    assert rep["steps"]["judge"]["ready_s"] == pytest.approx(done[ids["gen"]] - float(st["submitted_at"]), abs=1e-3)


def test_failed_step_retries_then_fails_workload_and_cancels_dependants(r, keys, settings, fleet, system):
    wl = Workload("fails", retry_budget=2)
    a = wl.step("a", "gen", requests=4)
    b = wl.step("b", "judge", requests=2, request_timeout_s=0.01, after=[a])  # 80 ms > 10 ms timeout
    wl.step("c", "gen", requests=2, after=[b])
    wl.step("d", "embed", requests=4)  # independent of the failure
    wid = submit_workload(r, keys, fleet, wl, settings)
    st = _wait_final(r, keys, wid)
    s = st["steps"]
    assert st["state"] == "failed" and "step b failed" in st["reason"]
    assert (s["a"]["state"], s["b"]["state"], s["c"]["state"], s["d"]["state"]) == \
        ("completed", "failed", "cancelled", "completed")
    assert s["b"]["retries"] == 2
    evs = all_events(r, keys)
    attempts = s["b"]["attempts"]
    assert len(attempts) == 3 and attempts[-1] == s["b"]["job"]
    assert len([e for e in evs if e["kind"] == "retried" and e.get("workload") == wid and e["step"] == "b"]) == 2
    assert sorted(e["job"] for e in evs if e["kind"] == "failed" and e.get("job") in attempts) == sorted(attempts)
    assert not [e for e in evs if e["kind"] == "leased" and e["job"] == s["c"]["job"]]
    assert len(_requests(r, keys, s["a"]["job"])) == 4  # results of finished steps are kept
    assert _request_drain(r, keys) == (0, 0)
    wait_for(lambda: not r.zcard(keys.leases), 10, "leases released")


def test_cancel_workload_cancels_queued_and_releases_gpus(r, keys, settings, fleet, system):
    wl = Workload("long")
    a = wl.step("long", "judge", requests=200)  # 200 × 80 ms / 2 slots ≈ 8 s
    wl.step("after1", "gen", requests=2, after=[a])
    wl.step("after2", "embed", requests=2, after=[a])
    wid = submit_workload(r, keys, fleet, wl, settings)
    job = workload_status(r, keys, wid)["steps"]["long"]["job"]
    wait_for(lambda: r.hget(keys.job(job), "state") == "running" and
             sum(r.zcard(k) for k in r.scan_iter(f"{keys.prefix}:reqlease:*")) > 0, 30,
             "the long step to hold request leases")
    out = cancel_workload(r, keys, wid)
    assert out == {"cancelled": 2, "cancel_requested": 1}
    st = _wait_final(r, keys, wid, 30)
    assert st["state"] == "cancelled", json.dumps(st["steps"])  # a step that failed says why (its reason)
    assert st["steps"]["after1"]["state"] == st["steps"]["after2"]["state"] == "cancelled"
    assert "cancelled while running" in st["steps"]["long"]["reason"]
    assert st["steps"]["long"]["state"] == "cancelled"  # a cancel, not a failure
    assert r.llen(keys.requests(job)) < 200  # it stopped sending
    wait_for(lambda: not r.zcard(keys.leases) and not any(r.get(keys.gpu(g)) for g in fleet.gpu_uuids()), 10,
             "GPUs released")
    assert _request_drain(r, keys) == (0, 0)


def test_sigterm_stops_idle_endpoint_processes_before_the_warm_shutdown_ends(r, keys, settings, fleet, system):
    # A supervisor (honcho: 5 s) may SIGKILL a GPU worker still in Celery's warm shutdown;
    # idle endpoint processes must be stopped when the shutdown begins, or they are orphaned.
    import signal

    from makespan.producer import Producer
    from makespan.workers.drivers.registry import list_instances

    prod = Producer(r, keys, fleet, settings)
    a = prod.submit({"endpoint": "gen", "service_s": 1, "payload": {"requests": 2}}).id
    wait_for(lambda: r.hget(keys.job(a), "state") == "completed", 60, "the gen job")
    [gen] = [i for i in list_instances(r, keys) if i.endpoint == "gen"]
    long = prod.submit({"endpoint": "sim", "service_s": 6000}).id  # 60 s of wall time
    wait_for(lambda: r.hget(keys.job(long), "state") == "running", 60, "the long job to run")
    system.kill("gpu-", signal.SIGTERM)

    from makespan.workers.drivers import process_alive  # a zombie counts as gone

    wait_for(lambda: not process_alive(gen.pid) and not any(i.id == gen.id for i in list_instances(r, keys)), 30,
             "the idle gen endpoint to stop")
    # the long job's execute stops at the shutdown and its lease is handed back (15404ec): it
    # no longer holds the warm shutdown for its 60 s, and it is queued again, not lost
    wait_for(lambda: r.hget(keys.job(long), "state") == "queued", 30, "the long job to be handed back")
