"""A set-point restore that fails is not retried at every idle tick (found by a review,
2026-12-04): before, an endpoint that never passed its health check was restored again
at each idle moment, each try holding the GPU for its health timeout (jobs cannot preempt
a restore). In-process planner ticks on the real Redis, dispatch captured; the restore
chain runs in-process with the process driver."""

from __future__ import annotations

import dataclasses
import json
import sys

from makespan.models import parse_fleet
from makespan.workers.phases import RESTORE_BACKOFF_S, PhaseRunner, restore_failure
from makespan.workers.planner_worker import PlannerWorker


def _fleet():
    return parse_fleet({"name": "broken-set-point",
                        "hosts": [{"name": "a", "gpu_count": 1, "memory_mib": 40000}],
                        "endpoints": {"base": {"model": "b", "memory_mib_per_gpu": 20000, "cold_start_s": 2,
                                               "set_point": [{"host": "a", "gpus": [0]}],
                                               "launch": {"driver": "process", "health_timeout_s": 1.0,
                                                          "command": [sys.executable, "-c",
                                                                      "import time; time.sleep(120)"]}}}})


def _restore_ends(r, keys) -> list[dict]:
    events = [json.loads(fields["e"]) for _, fields in r.xrange(keys.events)]
    return [event for event in events if event["kind"] == "restore_end"]


def test_a_failed_restore_backs_off_and_a_completed_one_clears_it(r, keys, settings, tmp_path, monkeypatch):
    monkeypatch.setenv("MAKESPAN_LOG_DIR", str(tmp_path))
    fleet = _fleet()
    gpu = fleet.hosts[0].gpus[0].uuid
    s = dataclasses.replace(settings, policy="portfolio", lease_ttl_s=60.0)
    sent = []
    planner = PlannerWorker(r, s, fleet, dispatch=lambda ctx, queue: sent.append(ctx))
    planner.token = ""
    planner.tick()  # idle, the set point not resident: a restore
    assert [(c.kind, c.endpoint, c.gpus) for c in sent] == [("restore", "base", [gpu])]
    runner = PhaseRunner(r, s, fleet)
    assert runner.run(sent[0], "evict") == "done"
    assert runner.run(sent[0], "restore") == "failed"  # never healthy within its 1 s health timeout
    ends = _restore_ends(r, keys)
    assert ends and ends[-1].get("outcome") == "failed" and "health" in ends[-1].get("reason", "")
    key, count_key = keys.restore_failed(gpu), keys.restore_failures(gpu)
    failure = restore_failure(r.get(count_key))
    assert failure["failures"] == 1 and failure["endpoint"] == "base" and "health" in failure["reason"]
    assert 0 < r.pttl(key) <= RESTORE_BACKOFF_S * 1000
    assert not r.get(keys.gpu(gpu))  # the failed restore released the GPU
    for _ in range(3):  # idle ticks within the backoff start no restore
        planner.tick()
    assert len(sent) == 1
    # the idle fleet's drain check runs meanwhile and reports the set point (it waited for
    # the restore before and never ran: llama-swap user's check)
    drain = r.hgetall(keys.drain)
    assert drain.get("set_points_failed") == "1" and drain.get("checks") == "1", drain
    [check] = [json.loads(f["e"]) for _, f in r.xrange(keys.events) if json.loads(f["e"])["kind"] == "drain"]
    assert check["set_points_failed_detail"].startswith(f"base@{gpu}: 1 failed restore(s), last: "), check
    r.pexpire(key, 1)  # the backoff ends (the key's own expiry, shortened)
    r.delete(key)
    planner.tick()
    assert len(sent) == 2 and sent[1].kind == "restore"
    assert runner.run(sent[1], "evict") == "done"
    assert runner.run(sent[1], "restore") == "failed"
    # the count outlived the backoff: the second failure doubles it (every retry waited the
    # first backoff before: a verifier saw a broken set point retried every 60 s)
    assert restore_failure(r.get(count_key))["failures"] == 2 and r.get(key) == "2"
    assert RESTORE_BACKOFF_S * 1000 < r.pttl(key) <= 2 * RESTORE_BACKOFF_S * 1000
    r.set(count_key, "3", px=60_000)  # a count written before the reason was kept
    [(op, at, count, px, backoff_ms), (_, at_count, value, _, _)] = runner._restore_backoff_ops(sent[1], "failed", "why")
    assert (op, at, count, px, backoff_ms) == ("SET", key, "4", "PX", str(int(RESTORE_BACKOFF_S * 8 * 1000)))
    assert at_count == count_key and json.loads(value) == {"failures": 4, "endpoint": "base", "reason": "why"}
    assert runner._restore_backoff_ops(sent[1], "completed") == [("DEL", key), ("DEL", count_key)]
    assert runner._restore_backoff_ops(sent[1], "cancelled") == []
