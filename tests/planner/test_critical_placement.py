"""The critical lane's choice, pure (makespan.planner.critical_placement): a warm idle group,
else a free group (not the plan's starts, fewest residents), else a preemption by the
fixed rule, else None."""

from __future__ import annotations

from makespan.planner.critical_placement import CriticalPlacement, place_critical
from makespan.planner.preemption import Holder

GROUPS = [("g0",), ("g1",), ("g2",), ("g3",)]


def _place(unavailable=(), warm=(), residents=None, planned=(), free_at=None, holders=None, cold_start_s=10.0):
    return place_critical(GROUPS, set(unavailable), lambda group: group in warm, residents or {}, set(planned),
                          free_at or {}, 100.0, cold_start_s, holders)


def test_a_warm_idle_group_comes_first_even_after_free_ones():
    assert _place(warm=[("g2",)]) == CriticalPlacement(("g2",), "warm")


def test_a_held_warm_group_is_not_taken_a_free_one_is():
    assert _place(unavailable=["g2"], warm=[("g2",)]) == CriticalPlacement(("g0",), "cold_start")


def test_a_cold_group_avoids_the_plans_starts_then_residents():
    assert _place(planned=["g0"], residents={"g1": "other@g1"}) == CriticalPlacement(("g2",), "cold_start")
    assert _place(planned=["g0", "g1", "g2", "g3"], residents={"g0": "x@g0"}).gpus == ("g1",)


def test_nothing_free_and_no_holders_read_leaves_it_to_the_tick():
    assert _place(unavailable=["g0", "g1", "g2", "g3"]) is None


def test_nothing_free_preempts_the_cheapest_lower_priority_holder():
    holders = {"g0": Holder("L0", 0, True), "g1": Holder("L1", 1, True), "g2": Holder("L2", 3, True),
               "g3": Holder("L3", 3, False)}
    free_at = {gpu: 1000.0 for (gpu,) in GROUPS}
    out = _place(unavailable=["g0", "g1", "g2", "g3"], holders=holders, free_at=free_at)
    assert out == CriticalPlacement(("g2",), "cold_start", ("L2",))  # LOW and preemptable; CRITICAL never


def test_no_preemption_when_a_group_frees_within_the_cold_start():
    holders = {gpu: Holder(f"L{gpu}", 3, True) for (gpu,) in GROUPS}
    free_at = {"g0": 105.0, "g1": 1000.0, "g2": 1000.0, "g3": 1000.0}
    assert _place(unavailable=["g0", "g1", "g2", "g3"], holders=holders, free_at=free_at) is None
