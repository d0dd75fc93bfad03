"""Issue 18, failure 4: clock skew between hosts changes nothing in the agenda.

The process registering an agenda entry (a GPU worker) gets a clock 120 s off: the
agenda module's ``time`` is replaced by one whose ``time()`` is offset (the observer
keeps the real one, as on another host; the agenda reads no process clock today, so the
stand-in is set even where the module has no ``time`` and catches a clock read added later). Entries are written on the Redis server's
clock, so a worker behind raises no false ``transition_overrun`` and a worker ahead
does not hide a real one.
"""

from __future__ import annotations

import time
import types

import pytest

from makespan.models import load_fleet
from makespan.workers import agenda as agenda_module
from makespan.workers import observer as observer_module
from makespan.workers.agenda import AgendaTracker, server_now_s
from makespan.workers.observer import Observer

from tests.conftest import FLEET_TOML

SKEW_S = 120.0


def _skewed_time(offset_s: float) -> types.SimpleNamespace:
    """A stand-in for the ``time`` module whose wall clock is ``offset_s`` off."""
    return types.SimpleNamespace(time=lambda: time.time() + offset_s, monotonic=time.monotonic,
                                 sleep=time.sleep, perf_counter=time.perf_counter)


@pytest.fixture
def observer(r, keys):
    obs = Observer(r, keys, load_fleet(FLEET_TOML), probe_interval_s=0.1, overrun_factor=1.5,
                   min_overrun_slack_s=0.0)  # the factor rule alone: these entries are sub-second
    yield obs
    obs.close()


def test_entry_times_are_the_redis_clock(r, keys, monkeypatch):
    monkeypatch.setattr(agenda_module, "time", _skewed_time(-SKEW_S), raising=False)
    before = server_now_s(r)
    with AgendaTracker(r, keys).register("op-clock", "POSITIVE", ["coder"], ["GPU-x"], 10.0) as e:
        after = server_now_s(r)
        [stored] = AgendaTracker(r, keys).open_entries()
    assert before <= e.planned_start <= after
    assert stored["planned_start"] == pytest.approx(e.planned_start, abs=1e-5)
    assert stored["expected_end"] == pytest.approx(e.planned_start + 10.0, abs=1e-5)


def test_worker_behind_raises_no_false_overrun(r, keys, observer, monkeypatch):
    monkeypatch.setattr(agenda_module, "time", _skewed_time(-SKEW_S), raising=False)
    with AgendaTracker(r, keys).register("op-behind", "POSITIVE", ["coder"], ["GPU-x"], 10.0):
        assert [i for i in observer.probe_once() if i["failure_mode"] == "transition_overrun"] == []


def test_worker_ahead_does_not_hide_a_real_overrun(r, keys, observer, monkeypatch):
    monkeypatch.setattr(agenda_module, "time", _skewed_time(+SKEW_S), raising=False)
    # 1 s, not 0.1 s: the first probe must come before the overrun point (1.5 s after the
    # register), which a loaded machine's pause between two calls could pass at 0.15 s
    with AgendaTracker(r, keys).register("op-ahead", "POSITIVE", ["coder"], ["GPU-x"], 1.0):
        assert observer.probe_once() == []
        deadline = server_now_s(r) + 1.0 * 1.5
        while server_now_s(r) <= deadline:  # past the overrun point on the Redis clock
            time.sleep(0.05)
        [inc] = observer.probe_once()
    assert inc["failure_mode"] == "transition_overrun" and inc["endpoint"] == "coder"


def test_observer_skew_changes_nothing(r, keys, observer, monkeypatch):
    """The observer's own clock 120 s ahead: no false overrun either."""
    monkeypatch.setattr(observer_module, "time", _skewed_time(+SKEW_S), raising=False)
    with AgendaTracker(r, keys).register("op-obs", "POSITIVE", ["coder"], ["GPU-x"], 10.0):
        assert [i for i in observer.probe_once() if i["failure_mode"] == "transition_overrun"] == []
