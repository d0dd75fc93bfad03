"""The workload benchmark's measures on hand-made request intervals."""

from bench.workloads_ab import idle_while_queued, ratio_ci, slot_util


def test_idle_while_queued_counts_free_slots_only_while_requests_wait():
    # 2 slots, 3 requests: two run [0, 1), the third starts late at 2 → one slot idle [1, 2)
    assert idle_while_queued([(0, 1), (0, 1), (2, 3)], 2) == 1.0
    # the third starts as soon as a slot frees: nothing idle while it waits
    assert idle_while_queued([(0, 1), (0, 2), (1, 2)], 2) == 0.0
    # a slot idle at the end, with nothing left to start, is not counted
    assert idle_while_queued([(0, 1), (0, 3)], 2) == 0.0
    assert idle_while_queued([], 4) == 0.0


def test_slot_util_and_ratio_ci():
    assert slot_util({"e": [(0, 1), (0, 1)]}, {"e": 4}) == {"e": 0.5}
    ci = ratio_ci([(1.0, 2.0), (1.0, 2.0)])
    assert round(ci["ratio"], 6) == 0.5 and ci["lo"] == ci["hi"] == ci["ratio"]
