"""The planner tick as steps over an explicit context, on an injected clock: real Redis,
the real steps, dispatch captured, a ``ManualClock`` instead of patched ``time.time``."""

from __future__ import annotations

import dataclasses
import time

import pytest

from makespan.producer import Producer
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick.clock import ManualClock
from makespan.workers.tick.context import TickContext
from makespan.workers.tick.steps import TICK_STEPS
from tests.faults.test_priority_cases import ONE_GPU

AHEAD_S = 3600.0  # the planner's clock runs an hour ahead of this host's: every job is released


class _Recorder:
    """A last step that keeps the context it was given."""

    name = "record"

    def __init__(self) -> None:
        self.seen: list[TickContext] = []

    def run(self, ctx: TickContext) -> None:
        self.seen.append(ctx)


def _planner(r, settings, planner_clock):
    sent = []
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0)
    w = PlannerWorker(r, s, ONE_GPU, dispatch=lambda ctx, q: sent.append(ctx), clock=planner_clock)
    w.token = ""
    return w, Producer(r, w.keys, ONE_GPU, s), sent


def test_a_lease_is_planned_on_the_injected_clock(r, settings):
    planner_clock = ManualClock(time.time() + AHEAD_S)
    w, prod, sent = _planner(r, settings, planner_clock)
    jid = prod.submit({"endpoint": "e", "service_s": 5}).id
    assert w.tick() and [c.job_id for c in sent] == [jid]
    planned_end_s = float(r.hget(w.keys.lease(sent[0].lease_id), "planned_end_s"))
    cold_start_s = ONE_GPU.endpoints["e"].cold_start_s
    # workload s: the clock's unix time ÷ time_scale, then a cold start and the service
    assert planned_end_s == pytest.approx(planner_clock.now() / w.settings.time_scale + cold_start_s + 5, abs=1e-3)


def test_each_step_writes_the_context_the_next_ones_read(r, settings):
    w, prod, sent = _planner(r, settings, ManualClock(time.time() + AHEAD_S))
    recorder = _Recorder()
    w.steps = (*TICK_STEPS, recorder)
    first, second = (prod.submit({"endpoint": "e", "service_s": 5}).id for _ in range(2))
    w.tick()
    (ctx,) = recorder.seen
    assert ctx.snapshot is not None and ctx.snapshot.queue_heads  # read once, frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.snapshot.agenda_entries = 1  # type: ignore[misc]
    assert [j.id for j in ctx.batch] == [first, second]
    assert ctx.plan is not None and {a.job_id for a in ctx.plan.assignments} == {first, second}
    assert ctx.started == ctx.dispatched == {first} and [c.job_id for c in sent] == [first]
    assert ctx.taken == {g.uuid for g in w.env.gpus}  # the one GPU: no tick again at once
    assert not ctx.tick_again() and not w.tick_again
    assert ctx.kept is w.kept and w.kept.solve_stats  # the solve time waits for the next snapshot
    w.tick()  # the second job waits: its reason is written, the solve time with the snapshot
    assert r.hget(w.keys.job(second), "wait_reason") == "waiting_for_gpus"
    assert len(recorder.seen) == 2 and recorder.seen[1] is not ctx  # a fresh context per tick


def test_the_drain_is_checked_once_per_idle_period_at_the_clock_s_time(r, settings):
    planner_clock = ManualClock(time.time() + AHEAD_S)
    w, _prod, _sent = _planner(r, settings, planner_clock)
    assert not w.tick()
    checked_at = repr(planner_clock.now())
    planner_clock.advance(10.0)
    assert not w.tick()  # still the same idle period: no second check
    assert r.hget(w.keys.drain, "checked_at") == checked_at and r.hget(w.keys.drain, "checks") == "1"


def test_learned_durations_are_read_again_every_refresh_interval_of_the_clock(r, settings):
    from makespan.workers.fleet_view import LEARNED_REFRESH_S

    planner_clock = ManualClock(time.time(), monotonic_s=100.0)
    w, _prod, _sent = _planner(r, settings, planner_clock)
    w.fleet_state()
    assert w.kept.learned_at_s == 100.0
    planner_clock.advance(LEARNED_REFRESH_S / 2)
    w.fleet_state()
    assert w.kept.learned_at_s == 100.0  # within the interval: kept as read
    planner_clock.advance(LEARNED_REFRESH_S)
    w.fleet_state()
    assert w.kept.learned_at_s == 100.0 + 1.5 * LEARNED_REFRESH_S


def test_a_manual_clock_never_goes_back():
    planner_clock = ManualClock(10.0, monotonic_s=1.0)
    planner_clock.advance(2.5)
    assert (planner_clock.now(), planner_clock.monotonic()) == (12.5, 3.5)
    with pytest.raises(ValueError):
        planner_clock.advance(-1.0)


def test_the_planner_counts_idle_gpu_seconds_between_snapshots(r, settings, monkeypatch):
    """makespan_gpu_seconds_total{state="idle"} stayed 0 for ever (nothing called it; an
    operator's utilization panel, busy ÷ all states, read 75–100 % on an idle fleet). Each
    snapshot adds the time since the last one times the GPUs that held no lease then."""
    from makespan import metrics
    from makespan.workers.fleet_view import IDLE_ACCRUAL_MAX_S

    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())

    def idle_s() -> float:
        return metrics._m().gpu_seconds.labels("idle")._value.get()

    clock = ManualClock(time.time() + AHEAD_S)
    w, prod, sent = _planner(r, settings, clock)
    w.tick()  # the first snapshot: nothing to count yet
    assert idle_s() == 0.0
    clock.advance(4.0)
    prod.submit({"endpoint": "e", "service_s": 500})
    w.tick()  # its one GPU sat idle for 4 s; this tick leases it
    assert idle_s() == pytest.approx(4.0) and len(sent) == 1
    clock.advance(3.0)
    w.tick()  # leased meanwhile: nothing idle
    assert idle_s() == pytest.approx(4.0)
    r.delete(w.keys.gpu("GPU-h-0"))  # its lease ends (what a release does to the GPU key)
    clock.advance(2.0)
    w.tick()  # freed just before this snapshot: not counted idle for the 2 s before it
    assert idle_s() == pytest.approx(4.0)
    clock.advance(3600.0)
    w.tick()  # a gap longer than any tick interval (a planner that stood by): at most IDLE_ACCRUAL_MAX_S
    assert idle_s() == pytest.approx(4.0 + IDLE_ACCRUAL_MAX_S)
