"""makespan_gpu_seconds_total counts each phase's GPU-seconds once. (found by a review, 2026-12-04; fails on the code before its fix)"""
from __future__ import annotations

from makespan import metrics
from makespan.workers.phases import PhaseRunner


class _Ctx:
    gpus = ["g0", "g1"]


def _busy():
    m = metrics._m()
    return m.gpu_seconds.labels("busy")._value.get(), m.gpu_seconds.labels("transition")._value.get()


def test_execute_phase_gpu_seconds_counted_once(monkeypatch):
    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    b0, t0 = _busy()
    PhaseRunner._observe(None, _Ctx(), "execute", 10.0, 3.0)  # 3 wall s on 2 GPUs
    b1, t1 = _busy()
    assert b1 - b0 == 6.0, (b1 - b0)


def test_transition_phase_gpu_seconds_counted_once(monkeypatch):
    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    b0, t0 = _busy()
    PhaseRunner._observe(None, _Ctx(), "start_endpoint", 5.0, 1.5)
    b1, t1 = _busy()
    assert t1 - t0 == 3.0, (t1 - t0)


def _execute_cut_short_by_a_cancel(r, keys, settings, monkeypatch, warm: bool):
    """A warm job of 300 workload s (3 wall s at the test's time scale) whose cancel is
    requested 0.3 s into its execute; returns (busy GPU-s added, execute phases observed)."""
    import threading

    from makespan.models import load_fleet
    from makespan.producer import Producer
    from makespan.workers.leases import LeaseStore
    from makespan.workers.phases import PhaseContext, instance_value
    from makespan.workers.warm import run_warm
    from tests.conftest import FLEET_TOML

    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    fleet, gpu = load_fleet(FLEET_TOML), "GPU-host-a-3"
    jid = Producer(r, keys, fleet, settings).submit({"endpoint": "embed", "service_s": 300, "priority": "HIGH"}).id
    r.set(keys.resident(gpu), instance_value("embed", [gpu]))
    lease = LeaseStore(r, keys).acquire("L1", (gpu,), 30.0, job_id=jid, kind="job", holder="host-a",
                                        queue=keys.queue("HIGH"))
    ctx = PhaseContext("L1", lease.token, [gpu], "host-a", "job", "embed", jid, "HIGH", 300.0)
    runner = PhaseRunner(r, settings, fleet)
    timer = threading.Timer(0.3, lambda: r.hset(keys.job(jid), "cancel_requested", "1"))
    b0, _ = _busy()
    timer.start()
    try:
        if warm:
            assert run_warm(runner, ctx) == "cancelled"
        else:
            for phase in ("evict", "start_endpoint"):
                assert runner.run(ctx, phase) == "done"
            assert runner.run(ctx, "execute") == "cancelled"
    finally:
        timer.cancel()
    b1, _ = _busy()
    executes = metrics._m().phase.labels("execute")._sum.get()
    return b1 - b0, executes


def test_an_execute_cut_short_still_counts_its_gpu_seconds(r, keys, settings, monkeypatch):
    """A phase that ends early (here a cancel; a preemption, a lost lease or a shutdown take
    the same branch) held its GPUs: its GPU-seconds are busy time, not missing from all
    three states, and the phase-duration histogram (phases that ran to their end) does not
    take it (found by an observability review, 2026-12-07; fails on the code before)."""
    for warm in (True, False):
        busy_s, histogram_sum = _execute_cut_short_by_a_cancel(r, keys, settings, monkeypatch, warm)
        assert 0.25 <= busy_s < 3.0, (warm, busy_s)
        assert histogram_sum == 0.0, warm
