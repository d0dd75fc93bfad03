"""The live report's ``transitions`` count every executed transition of the run (issue 20
point 1): every attempt of a job and restore leases too, as ``transition_error`` and the
summary of ``makespan report`` do."""

from makespan.gantt import summarize, summary_stats
from makespan.models import parse_fleet
from makespan.run_report import live_report

FLEET = parse_fleet({
    "name": "t",
    "hosts": [{"name": "a", "gpu_count": 2, "memory_mib": 81920}],
    "endpoints": {
        "m1": {"model": "x", "memory_mib_per_gpu": 1000, "cold_start_s": 45, "wake_s": 8,
               "set_point": [{"host": "a", "gpus": [0]}]},
        "m3": {"model": "z", "memory_mib_per_gpu": 1000, "cold_start_s": 20, "wake_s": 8},
    },
})
G0, G1 = FLEET.gpu_uuids()


def _t(kind: str, endpoint: str, planned_s: float, actual_s: float) -> dict:
    return {"kind": kind, "endpoint": endpoint, "planned_s": planned_s, "actual_s": actual_s}


def _events(t0: float = 1000.0) -> list[dict]:
    """j1's first attempt (L1) wakes m3 on GPU 1 and is preempted while executing; its
    second (L2) cold-starts m3 on GPU 0 (m1 was stopped by no one: GPU 0 was free). The
    restore lease R1 puts m3 to sleep (level 1) on GPU 1 and cold-starts (restores) m1."""
    j1 = {"job": "j1", "endpoint": "m3", "priority": "NORMAL"}
    return [
        {"ts": t0, "kind": "submitted", **j1},
        {"ts": t0 + 1, "kind": "leased", "lease": "L1", "gpus": [G1], **j1},
        {"ts": t0 + 1, "kind": "phase_start", "lease": "L1", "phase": "start_endpoint", "gpus": [G1], **j1},
        {"ts": t0 + 9, "kind": "phase_end", "lease": "L1", "phase": "start_endpoint", "gpus": [G1],
         "planned_s": 8, "transition": "wake", "transitions": [_t("wake", "m3", 8, 8)], **j1},
        {"ts": t0 + 9, "kind": "phase_start", "lease": "L1", "phase": "execute", "gpus": [G1], **j1},
        {"ts": t0 + 12, "kind": "preempted", "lease": "L1", "gpus": [G1], **j1},
        {"ts": t0 + 13, "kind": "leased", "lease": "L2", "gpus": [G0], **j1},
        {"ts": t0 + 13, "kind": "phase_start", "lease": "L2", "phase": "start_endpoint", "gpus": [G0], **j1},
        {"ts": t0 + 33, "kind": "phase_end", "lease": "L2", "phase": "start_endpoint", "gpus": [G0],
         "planned_s": 20, "transition": "cold_start", "transitions": [_t("cold_start", "m3", 20, 20)], **j1},
        {"ts": t0 + 33, "kind": "phase_start", "lease": "L2", "phase": "execute", "gpus": [G0], **j1},
        {"ts": t0 + 53, "kind": "phase_end", "lease": "L2", "phase": "execute", "gpus": [G0], **j1},
        {"ts": t0 + 53, "kind": "completed", "lease": "L2", "gpus": [G0], **j1},
        {"ts": t0 + 60, "kind": "restore_start", "lease": "R1", "gpus": [G1], "endpoint": "m1"},
        {"ts": t0 + 60, "kind": "phase_start", "lease": "R1", "phase": "evict", "gpus": [G1], "endpoint": "m1"},
        {"ts": t0 + 62, "kind": "phase_end", "lease": "R1", "phase": "evict", "gpus": [G1], "endpoint": "m1",
         "evicted": ["m3"], "slept": ["m3"], "slept_levels": {"m3": 1}, "transition": "sleep", "planned_s": 2,
         "transitions": [_t("sleep", "m3", 2, 2)]},
        {"ts": t0 + 62, "kind": "phase_start", "lease": "R1", "phase": "start_endpoint", "gpus": [G1],
         "endpoint": "m1"},
        {"ts": t0 + 107, "kind": "phase_end", "lease": "R1", "phase": "start_endpoint", "gpus": [G1],
         "endpoint": "m1", "planned_s": 45, "transition": "cold_start",
         "transitions": [_t("restore", "m1", 45, 45)]},
        {"ts": t0 + 107, "kind": "restore_end", "lease": "R1", "gpus": [G1], "endpoint": "m1"},
    ]


def test_live_report_counts_every_attempt_and_restore_leases(r, keys):
    r.hset(keys.job("j1"), mapping={"id": "j1", "endpoint": "m3", "priority": "NORMAL", "state": "completed",
                                    "submitted_at": 1000.0, "finished_at": 1053.0, "service_s": 20.0,
                                    "lease": "L2"})
    events = _events()
    rep = live_report(r, keys, FLEET, events, ["j1"], time_scale=1.0, policy="default")
    counts = {k: rep["transitions"][k] for k in ("evict", "sleep", "sleep_level1", "sleep_level2", "wake",
                                                  "cold_start", "restore")}
    # the preempted attempt's wake and the restore lease's sleep count (the old rule: 0 and 0)
    assert counts == {"evict": 1, "sleep": 1, "sleep_level1": 1, "sleep_level2": 0, "wake": 1,
                      "cold_start": 1, "restore": 1}
    errors = rep["transition_error"]
    for kind in ("sleep", "wake", "cold_start", "restore"):
        assert errors[kind]["n"] == counts[kind], kind
    summary = summary_stats(events)
    assert summary["transition_count"]["sleep"] == counts["sleep"]
    assert summary["transition_count"]["wake"] == counts["wake"]
    assert summary["sleep_level_count"] == {"level1": 1, "level2": 0}
    # the summary names a restore lease's load by what it did (a cold start); the report
    # counts it in ``restore``, as ``transition_error`` does
    assert summary["transition_count"]["cold_start"] == counts["cold_start"] + counts["restore"]
    # and says how many of them are restores, so the two reports reconcile (a new user could not)
    assert summary["restore_cold_starts"] == counts["restore"]
    assert "(1 of the cold starts are restores or prewarms)" in summarize(events)


def test_an_evict_that_put_two_endpoints_to_sleep_is_two_sleeps_in_both_reports():
    """`makespan report` said "sleep 3x" beside "level1 4x" for one run (the demo: 4 sleeps):
    it counted phases, the demo endpoints (a docs auditor's report)."""
    from makespan.run_report import executed_transition_counts

    j = {"job": "j9", "priority": "NORMAL", "endpoint": "m3"}
    events = [
        {"ts": 1.0, "kind": "phase_start", "lease": "L9", "phase": "evict", "gpus": [G0, G1], **j},
        {"ts": 3.0, "kind": "phase_end", "lease": "L9", "phase": "evict", "gpus": [G0, G1], **j,
         "transition": "sleep", "slept_levels": {"m1": 1, "m2": 1},
         "transitions": [_t("sleep", "m1", 1, 1), _t("sleep", "m2", 1, 1)]},
        {"ts": 3.0, "kind": "phase_start", "lease": "L9", "phase": "start_endpoint", "gpus": [G0, G1], **j},
        {"ts": 5.0, "kind": "phase_end", "lease": "L9", "phase": "start_endpoint", "gpus": [G0, G1], **j,
         "transition": "wake", "transitions": [_t("wake_level2", "m3", 2, 2)]},
    ]
    summary, executed = summary_stats(events), executed_transition_counts(events)
    assert summary["transition_count"] == {"sleep": 2, "wake": 1, "cold_start": 0}, summary["transition_count"]
    assert (executed["sleep"], executed["wake"]) == (2, 1) and summary["sleep_level_count"]["level1"] == 2


def test_the_live_report_gives_weighted_tardiness_for_jobs_with_deadlines(r, keys):
    """docs/planner.md said demo and replay print the weighted tardiness with deadlines; the
    live report had none, and a missed deadline was reported nowhere (an SLA user). j1
    (NORMAL, weight 2) completed 53 s after its submission with a 40 s deadline: 13 s late."""
    r.hset(keys.job("j1"), mapping={"id": "j1", "endpoint": "m3", "priority": "NORMAL", "state": "completed",
                                    "submitted_at": 1000.0, "finished_at": 1053.0, "service_s": 20.0,
                                    "lease": "L2", "deadline_s": 40.0})
    rep = live_report(r, keys, FLEET, _events(), ["j1"], time_scale=1.0, policy="default")
    assert (rep["weighted_tardiness_s"], rep["tardy_jobs"], rep["jobs_with_deadline"]) == (26.0, 1, 1)
    r.hset(keys.job("j1"), "deadline_s", 60.0)  # met
    rep = live_report(r, keys, FLEET, _events(), ["j1"], time_scale=1.0, policy="default")
    assert (rep["weighted_tardiness_s"], rep["tardy_jobs"], rep["jobs_with_deadline"]) == (0, 0, 1)


def test_a_deadline_shorter_than_the_service_time_is_warned_about_at_submit(r, keys, settings, caplog):
    """`deadline_s < service_s` can never be met and was accepted silently (an SLA user)."""
    import logging

    from makespan.models import load_fleet
    from makespan.producer import Producer
    from tests.conftest import FLEET_TOML

    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    with caplog.at_level(logging.WARNING, logger="makespan.producer"):
        prod.submit({"endpoint": "chat", "service_s": 100, "deadline_s": 10})
        prod.submit({"endpoint": "chat", "service_s": 10, "deadline_s": 100})
    said = [rec.getMessage() for rec in caplog.records if "cannot be met" in rec.getMessage()]
    assert len(said) == 1 and "deadline_s 10 is shorter than its service_s 100" in said[0], said


def test_makespan_report_of_a_record_gives_weighted_tardiness_from_the_submitted_events(r, keys, settings):
    """`makespan report DIR` (and --from-redis) summarise events, and the `submitted` event had
    no `deadline_s`: a record's report had no deadline figures (a verifier). The producer now
    writes it; the summary counts d = submission + deadline_s × the record's time scale."""
    import pytest

    from makespan.events import read_all
    from makespan.gantt import summarize
    from makespan.models import load_fleet
    from makespan.producer import Producer
    from tests.conftest import FLEET_TOML

    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    late, on_time, none = (prod.submit({"endpoint": "chat", "service_s": 10, "deadline_s": d, "priority": "HIGH"}).id
                           for d in (20, 200, None))
    submitted = {e["job"]: e for e in read_all(r, keys.events) if e["kind"] == "submitted"}
    assert submitted[late]["deadline_s"] == 20 and "deadline_s" not in submitted[none]
    t0 = submitted[late]["ts"]
    events = [*submitted.values(), {"ts": t0 + 0.5, "kind": "time_scale_probe", "time_scale": 0.1},
              *({"ts": t0 + 3.0, "kind": "completed", "job": j, "priority": "HIGH"} for j in (late, on_time, none))]
    stats = summary_stats(events)
    # late: due at t0 + 20 × 0.1 = t0 + 2 s, completed at t0 + 3 s (HIGH, weight 4): 4 weight·s
    assert (stats["tardy_jobs"], stats["jobs_with_deadline"]) == (1, 2)
    assert stats["weighted_tardiness_s"] == pytest.approx(4 * (3.0 - 2.0))
    assert "deadlines: 1 of 2 completed jobs with a deadline_s were late" in summarize(events)
    assert "deadlines:" not in summarize([submitted[none]])
