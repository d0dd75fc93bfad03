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
