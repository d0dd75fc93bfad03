"""Every planner path that places a job honours the hosts its workload function runs on
(``PlanJob.hosts``, from ``P:fn:hosts:{name}``): the kept plan's follower, which moved a job
onto another host's warm GPU, and the tick's rule preemption, which preempted a job on a host
without the function and sent the preemptor there (found by a review; such a job fails there
for good with ``makespan.UnknownWorkload``). In-process planner ticks on a real Redis."""

from __future__ import annotations

import dataclasses
import time

import pytest
from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.host_liveness import announce
from makespan.workers.phases import PhaseRunner
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick.clock import ManualClock


def _fleet(*hosts: str):
    return parse_fleet({"name": "two-hosts", "hosts": [{"name": h, "gpu_count": 1, "memory_mib": 81920} for h in hosts],
                        "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})


def _mark(r, keys, fn: str, host: str) -> None:
    seconds, micros = r.time()
    r.zadd(keys.fn_hosts(fn), {host: seconds * 1000 + micros // 1000 + 600_000})


@pytest.fixture
def env(monkeypatch, settings):
    monkeypatch.setenv("MAKESPAN_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", settings.key_prefix)


def _planner(r, settings, fleet):
    """An in-process planner on ``fleet`` with a held clock: (worker, producer, the phase chains it sent)."""
    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    sent: list = []
    w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: sent.append(ctx), clock=ManualClock(time.time()))
    return w, Producer(r, w.keys, fleet, s), sent


def test_the_follower_keeps_a_function_job_on_its_hosts(r, settings):
    fleet = _fleet("h", "g")
    s = dataclasses.replace(settings, batch_size=256, lease_ttl_s=60.0, policy="portfolio")
    sent: list = []
    clock = ManualClock(time.time())
    w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: sent.append(ctx), clock=clock)
    prod = Producer(r, w.keys, fleet, w.settings)
    for host in ("h", "g"):
        announce(r, w.keys, host, f"worker-{host}", 60.0)
    _mark(r, w.keys, "only_g", "g")
    prod.submit({"endpoint": "e", "service_s": 10, "priority": "NORMAL"})
    fn_jobs = []
    for _ in range(3):
        job_id = prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id
        r.hset(w.keys.job(job_id), "fn", "only_g")
        fn_jobs.append(job_id)
    w.tick()
    assert w.kept.followed is not None
    # host h's GPU frees and is warm: the follower may move the next job of endpoint e there,
    # but not one whose function only g's worker registers
    r.set(w.keys.resident("GPU-h-0"), "e@GPU-h-0")
    first_on_h = next(ctx for ctx in sent if ctx.gpus == ["GPU-h-0"])
    PhaseRunner(r, w.settings, fleet)._finish(first_on_h, "completed", "")
    clock.advance(0.1)
    w.tick()
    assert [(ctx.job_id, ctx.gpus) for ctx in sent if ctx.job_id in fn_jobs and ctx.gpus != ["GPU-g-0"]] == []


@pytest.mark.parametrize(("mode", "policy", "level"), [("rule", "portfolio", "CRITICAL"), ("plan", "fifo", "HIGH"),
                                                       ("plan", "portfolio", "CRITICAL"), ("plan", "portfolio", "HIGH")])
def test_a_preemption_for_a_function_job_is_on_its_hosts(r, settings, mode, policy, level):
    fleet = _fleet("h1", "h2")
    s = dataclasses.replace(settings, lease_ttl_s=60.0, preemption=mode, critical_lane=False, policy=policy)
    sent: list = []
    w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: sent.append(ctx), clock=ManualClock(time.time()))
    w.token = ""
    prod = Producer(r, w.keys, fleet, s)
    for n, gpu in enumerate(("GPU-h1-0", "GPU-h2-0")):  # a LOW job holds each GPU
        low = prod.submit({"endpoint": "e", "service_s": 3600, "priority": "LOW"}).id
        assert w.leases.acquire(f"low-{n}", (gpu,), 60.0, job_id=low, kind="job", holder=w.fleet.host_of(gpu),
                                queue=w.keys.queue("LOW"),
                                info={"planned_end_s": repr(w.now_s() + 3600), "endpoint": "e",
                                      "priority": "LOW"}) is not None
    _mark(r, w.keys, "only_h2", "h2")
    job = prod.submit({"endpoint": "e", "service_s": 5, "priority": level}).id
    r.hset(w.keys.job(job), "fn", "only_h2")
    w.tick()
    assert [(ctx.job_id, ctx.host) for ctx in sent] == [(job, "h2")]


@pytest.mark.parametrize("h2_live", [False, True], ids=["h2-down", "h2-restarted-without-it"])
def test_while_no_worker_registers_a_function_its_jobs_wait_for_one(r, settings, env, h2_live):
    """The only host registering the function restarts (its mark expired): its jobs went to
    the other host and failed there for good (found by a review). They wait now, unplanned,
    with reason ``waiting_for_function`` naming the function and h2 (h2 down; or h2's worker
    back without the function, where they were planned on h2 and failed there), and they are
    leased once a worker registers it again: on h2, or on h1 when h1's worker does (a deploy
    that moved the function, in either order)."""
    from makespan.registry import function_hosts

    w, prod, sent = _planner(r, settings, _fleet("h1", "h2"))
    seconds, micros = r.time()
    r.zadd(w.keys.fn_hosts("only_h2"), {"h2": seconds * 1000 + micros // 1000 - 1})  # expired: h2's worker is gone
    assert function_hosts(r, w.keys, "only_h2") == ("h2",)  # the host that had it last
    announce(r, w.keys, "h1", "worker-h1", 60.0)
    if h2_live:
        announce(r, w.keys, "h2", "worker-h2b", 60.0)  # back, without the function
    else:
        r.hset(w.keys.hosts_seen, "h2", "worker-h2")  # h2 had a worker: it is down now
    job = prod.submit({"endpoint": "e", "service_s": 5, "priority": "NORMAL"}).id
    r.hset(w.keys.job(job), "fn", "only_h2")
    w.tick()
    assert sent == []
    res = CliRunner().invoke(cli_app, ["why", job])
    # h2 down: the host is the cause (the reason used to switch from host_down to
    # waiting_for_function once the function's mark ran out: llama-swap user's check)
    reason = "waiting_for_function" if h2_live else "host_down"
    assert res.exit_code == 0 and f", {reason}, no ETA" in res.output, res.output
    assert "'only_h2'" in res.output and "h2" in res.output, res.output
    back = "h1" if h2_live else "h2"
    announce(r, w.keys, back, f"worker-{back}-new", 60.0)
    _mark(r, w.keys, "only_h2", back)  # its worker registers the function
    w.tick()
    assert [(ctx.job_id, ctx.host) for ctx in sent] == [(job, back)]


def test_a_host_that_dropped_the_function_long_ago_is_not_among_the_last_holders(r, settings):
    """h1's worker was redeployed without the function three days ago (its old mark stays);
    h2, the only host that has it, restarts: the job went to h1 and failed there for good
    (found by a second review); it waits for h2."""
    from makespan.registry import function_hosts

    w, prod, sent = _planner(r, settings, _fleet("h1", "h2"))
    seconds, micros = r.time()
    now_ms = seconds * 1000 + micros // 1000
    r.zadd(w.keys.fn_hosts("fn"), {"h1": now_ms - 3 * 86_400_000, "h2": now_ms - 1})
    assert function_hosts(r, w.keys, "fn") == ("h2",)
    announce(r, w.keys, "h1", "worker-h1", 60.0)
    r.hset(w.keys.hosts_seen, "h2", "worker-h2")  # h2 restarts: no live worker now
    job = prod.submit({"endpoint": "e", "service_s": 5, "priority": "NORMAL"}).id
    r.hset(w.keys.job(job), "fn", "fn")
    w.tick()
    assert sent == []


def test_a_host_mark_older_than_the_kept_time_is_pruned(r, keys):
    from makespan.registry import HOST_MARKS_KEPT_S, WorkloadDef, publish

    seconds, micros = r.time()
    now_ms = seconds * 1000 + micros // 1000
    r.zadd(keys.fn_hosts("fn"), {"gone": now_ms - int(HOST_MARKS_KEPT_S * 1000) - 120_000})
    publish(r, keys, [WorkloadDef("fn", lambda ctx: None, endpoint="e")], holder="w1", host="h1")
    assert r.zrange(keys.fn_hosts("fn"), 0, -1) == ["h1"]


def _expired_mark(r, keys, fn: str, host: str) -> None:
    seconds, micros = r.time()
    r.zadd(keys.fn_hosts(fn), {host: seconds * 1000 + micros // 1000 - 1})


@pytest.mark.parametrize("waiting", [8, 24])
def test_jobs_waiting_for_their_function_do_not_hide_the_jobs_behind_them(r, settings, waiting):
    """SCAN_FACTOR × batch_size (and more) jobs of a function no live worker registers head the
    NORMAL queue: the scan's allowance ran out on them and a plain job behind them was never
    read, so never planned, with both GPUs free (review). They no longer count against it, up to
    FUNCTION_WAIT_SCAN_FACTOR × batch_size entries."""
    from makespan.workers.batch import FUNCTION_WAIT_SCAN_FACTOR, SCAN_FACTOR

    assert SCAN_FACTOR * 2 <= waiting < FUNCTION_WAIT_SCAN_FACTOR * 2
    fleet = _fleet("h1", "h2")
    s = dataclasses.replace(settings, lease_ttl_s=60.0, batch_size=2)
    sent: list = []
    w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: sent.append(ctx), clock=ManualClock(time.time()))
    prod = Producer(r, w.keys, fleet, s)
    for host in ("h1", "h2"):
        announce(r, w.keys, host, f"worker-{host}", 60.0)
    _expired_mark(r, w.keys, "gone_fn", "h2")
    held = []
    for _ in range(waiting):
        job = prod.submit({"endpoint": "e", "service_s": 5, "priority": "NORMAL"}).id
        r.hset(w.keys.job(job), "fn", "gone_fn")
        held.append(job)
    plain = prod.submit({"endpoint": "e", "service_s": 5, "priority": "NORMAL"}).id
    try:
        w.tick()
    finally:
        w.close()
    assert [c.job_id for c in sent] == [plain]
    assert {r.hget(w.keys.job(job), "wait_reason") for job in held} == {"waiting_for_function"}


def test_a_function_back_while_every_gpu_is_held_gets_its_jobs_planned_again(r, settings, env):
    """Both GPUs held by hour-long LOW jobs; a job of a function no live worker registers
    waits with ``waiting_for_function``. h1's worker registers it again: with every GPU held no
    batch read the job again before a GPU freed, so it kept saying that no worker has its
    function, with no ETA (review). A batch is formed within REASON_REFRESH_S."""
    import uuid

    from makespan.workers.batch import REASON_REFRESH_S
    from makespan.workers.leases import LeaseStore

    w, prod, sent = _planner(r, settings, _fleet("h1", "h2"))
    for host in ("h1", "h2"):
        announce(r, w.keys, host, f"worker-{host}", 60.0)
        low = prod.submit({"endpoint": "e", "service_s": 3600, "priority": "LOW"}).id
        assert LeaseStore(r, w.keys).acquire(uuid.uuid4().hex, (f"GPU-{host}-0",), 60.0, job_id=low, kind="job",
                                             holder=host, queue=w.keys.queue("LOW"),
                                             info={"planned_end_s": repr(w.now_s() + 3600), "endpoint": "e",
                                                   "priority": "LOW"}) is not None
    _expired_mark(r, w.keys, "f", "h2")
    job = prod.submit({"endpoint": "e", "service_s": 5, "priority": "NORMAL"}).id
    r.hset(w.keys.job(job), "fn", "f")
    try:
        w.tick()
        assert r.hget(w.keys.job(job), "wait_reason") == "waiting_for_function"
        _mark(r, w.keys, "f", "h1")  # h1's worker registers f
        w.clock.advance(REASON_REFRESH_S)
        w.tick()
    finally:
        w.close()
    reason, eta = r.hmget(w.keys.job(job), "wait_reason", "wait_eta")
    assert reason == "waiting_for_gpus" and eta, (reason, eta)


SET_POINT = parse_fleet({"name": "sp", "hosts": [{"name": "h1", "gpu_count": 1, "memory_mib": 81920}],
                         "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1,
                                             "set_point": [{"host": "h1", "gpus": [0]}]}}})


@pytest.mark.parametrize("function_waits", [False, True])
def test_jobs_waiting_for_their_function_do_not_keep_the_fleet_off_its_set_point(r, settings, function_waits):
    """An idle fleet restores its set point; a queued job that only waits for a worker with
    its function (maybe for days) held that back, and the drain check (review)."""
    w, prod, sent = _planner(r, settings, SET_POINT)
    announce(r, w.keys, "h1", "worker-h1", 60.0)
    if function_waits:
        _expired_mark(r, w.keys, "f", "h1")
        job = prod.submit({"endpoint": "e", "service_s": 5, "priority": "NORMAL"}).id
        r.hset(w.keys.job(job), "fn", "f")
    try:
        for _ in range(3):
            w.tick()
            w.clock.advance(1.0)
    finally:
        w.close()
    assert [c.kind for c in sent] == ["restore"]
