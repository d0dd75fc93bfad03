"""AgendaTracker against the real Redis.

Issue 7's case ("5 s TTL through an 8 s phase") is run with the same ratio scaled down
to keep the suite fast: a 1 s TTL through a 2 s phase without extension, and a
heartbeat-extended 0.5 s TTL lock kept through a 3 s phase (6 TTLs).
"""

from __future__ import annotations

import time

import pytest

from makespan.errors import LeaseError, ValidationError
from makespan.workers.agenda import AgendaTracker


def test_register_complete_and_queries(r, keys):
    t = AgendaTracker(r, keys)
    with t.register("op-1", "POSITIVE", ["coder"], ["GPU-a-0", "GPU-a-1"], 30.0) as e:
        assert t.count() == 1
        assert t.is_endpoint_in_scheduled_transition("coder")
        assert t.is_endpoint_in_scheduled_transition("coder", ["GPU-a-1"])
        assert not t.is_endpoint_in_scheduled_transition("coder", ["GPU-b-0"])
        assert not t.is_endpoint_in_scheduled_transition("embed")
        [row] = t.open_entries()
        assert row["op_id"] == "op-1" and row["gpus"] == ["GPU-a-0", "GPU-a-1"]
        assert row["expected_end"] - row["planned_start"] == pytest.approx(30.0)
        e.check()
    assert t.count() == 0
    assert not t.is_endpoint_in_scheduled_transition("coder")
    assert not r.exists(keys.agenda("op-1"))


def test_failure_mode_entry_does_not_count_as_scheduled(r, keys):
    t = AgendaTracker(r, keys)
    with t.register("op-f", "RESTART_RECOVERY", ["coder"], [], 5.0):
        assert not t.is_endpoint_in_scheduled_transition("coder")
        assert t.covering("coder")


def test_bad_mode_and_live_holder_rejected(r, keys):
    t = AgendaTracker(r, keys)
    with pytest.raises(ValidationError, match="agenda.mode"):
        t.register("op-x", "PLANNED", ["coder"], [], 1.0)
    with t.register("op-y", "POSITIVE", ["coder"], [], 1.0):
        with pytest.raises(LeaseError):
            t.register("op-y", "POSITIVE", ["coder"], [], 1.0)


def test_expired_holder_does_not_delete_new_holders_entry(r, keys):
    """1 s TTL held through a 2 s phase without extension (issue 7's 5 s / 8 s, scaled)."""
    t = AgendaTracker(r, keys)
    first = t.register("op-2", "POSITIVE", ["coder"], ["GPU-a-0"], 2.0, lock_ttl_s=1.0, heartbeat=False)
    time.sleep(1.3)  # the lock expires mid-phase
    second = t.register("op-2", "POSITIVE", ["coder"], ["GPU-a-0"], 2.0, lock_ttl_s=5.0)
    time.sleep(0.7)  # the first holder's 2 s phase ends
    with pytest.raises(LeaseError):
        first.check()
    assert first.lost
    assert t.complete(first) is False
    row = r.hgetall(keys.agenda("op-2"))
    assert row["holder"] == second.token != first.token
    assert t.count() == 1
    assert t.complete(second) is True
    assert t.count() == 0


def test_heartbeat_keeps_entry_through_long_phase(r, keys):
    """A phase of 2.5 lock TTLs: the heartbeat (every third of the TTL) keeps the entry.
    The TTL is 1.5 s, not less: a loaded host delays the heartbeat thread by up to a
    second, and a 0.5 s lock expired under it."""
    t = AgendaTracker(r, keys)
    with t.register("op-3", "POSITIVE", ["coder"], [], 4.0, lock_ttl_s=1.5) as e:
        time.sleep(3.75)
        e.check()
        assert not e.lost
        assert t.reap() == 0
        assert t.count() == 1
    assert t.count() == 0


def test_reap_removes_dead_holders_only(r, keys):
    t = AgendaTracker(r, keys)
    dead = t.register("op-dead", "POSITIVE", ["coder"], [], 1.0, lock_ttl_s=0.3, heartbeat=False)
    live = t.register("op-live", "POSITIVE", ["embed"], [], 1.0, lock_ttl_s=5.0)
    time.sleep(0.5)
    assert t.reap() == 1
    assert [e["op_id"] for e in t.open_entries()] == ["op-live"]
    assert t.complete(dead) is True  # nothing left to delete; idempotent, no newer holder
    t.complete(live)
    assert t.count() == 0
