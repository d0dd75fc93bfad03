"""The contract of the store's seams (JobStore, LeaseStore, EventLog) on the real Redis.

One suite for the three classes the live code calls: what each operation writes, what it
answers, and what it refuses. The live paths (tests/workers, tests/faults) exercise them
through the planner and GPU workers; this suite pins the seam itself.
"""

from __future__ import annotations

import json

import pytest

from makespan.errors import LeaseError, StaleFencingToken, ValidationError
from makespan.store import EventLog, JobState, JobStore, LeaseStore
from makespan.store.leases import delay_job_op, finish_job_op, start_job_op


@pytest.fixture
def jobs(r, keys) -> JobStore:
    return JobStore(r, keys)


@pytest.fixture
def leases(r, keys) -> LeaseStore:
    return LeaseStore(r, keys)


def submit(jobs: JobStore, keys, job_id: str, priority: str = "NORMAL", **extra) -> tuple[bool, str]:
    fields = {"id": job_id, "state": JobState.QUEUED.value, "priority": priority, "attempts": 0, **extra}
    return jobs.submit(job_id, fields, json.dumps({"kind": "submitted", "job": job_id}), keys.queue(priority))


def events(r, keys) -> list[dict]:
    return [body for _, body in EventLog(r, keys).read()]


# -- JobStore -----------------------------------------------------------------------------------
def test_submit_writes_the_record_queue_entry_and_event(jobs, r, keys):
    assert submit(jobs, keys, "j1") == (True, "j1")
    assert submit(jobs, keys, "j2") == (True, "j2")
    assert r.hget(keys.job("j1"), "state") == "queued"
    assert r.zrange(keys.queue("NORMAL"), 0, -1, withscores=True) == [("j1", 1.0), ("j2", 2.0)]  # FIFO by seq
    assert [e["job"] for e in events(r, keys)] == ["j1", "j2"]
    assert r.llen(keys.planner_wake) == 2


def test_a_repeated_idempotency_key_returns_the_first_job(jobs, r, keys):
    fields = {"id": "j1", "state": "queued", "priority": "NORMAL"}
    assert jobs.submit("j1", fields, "{}", keys.queue("NORMAL"), idempotency_key="k") == (True, "j1")
    assert jobs.submit("j2", {**fields, "id": "j2"}, "{}", keys.queue("NORMAL"), idempotency_key="k") == (False, "j1")
    assert not r.exists(keys.job("j2"))


def test_a_delayed_submit_waits_on_the_server_clock_then_promotes(jobs, r, keys):
    jobs.submit("j1", {"id": "j1", "state": "queued", "priority": "HIGH"}, '{"kind": "submitted"}',
                keys.queue("HIGH"), delay_s=60.0)
    assert r.hget(keys.job("j1"), "state") == "delayed" and r.zcard(keys.queue("HIGH")) == 0
    queued, next_due, server_now = jobs.promote_delayed(1.0, 10)
    assert queued == 0 and float(next_due) - float(server_now) == pytest.approx(60.0, abs=1.0)
    queued, next_due, _ = jobs.promote_delayed(1.0, 10, ahead_s=61.0)
    assert (queued, next_due) == (1, "")
    assert r.hget(keys.job("j1"), "state") == "queued" and r.zrange(keys.queue("HIGH"), 0, -1) == ["j1"]
    assert events(r, keys)[-1] == {"ts": 1.0, "kind": "promoted", "job": "j1", "priority": "HIGH"}


def test_promote_is_fenced_by_the_planner_token(jobs, r, keys):
    r.set(keys.planner_fence, "5")
    assert jobs.promote_delayed(1.0, 10, planner_token="4")[0] == -1


def test_cancel_finishes_a_queued_job_and_asks_a_leased_one(jobs, leases, r, keys):
    submit(jobs, keys, "j1")
    assert jobs.cancel("j1", keys.queue("NORMAL"), "{}", 100.5) == "cancelled_now"
    rec = r.hgetall(keys.job("j1"))
    assert (rec["state"], rec["finished_at"], rec["reason"]) == ("cancelled", "100.5", "cancelled while queued")
    # the finished index is scored on the Redis server's clock (retention compares it there), not the caller's
    assert abs(r.zscore(keys.finished, "j1") - _server_now(r)) < 60 and r.zcard(keys.queue("NORMAL")) == 0
    assert jobs.cancel("j1", keys.queue("NORMAL"), "{}", 101.0) == "cancelled"  # its final state
    submit(jobs, keys, "j2")
    assert leases.acquire("L1", ("g0",), 30.0, job_id="j2", queue=keys.queue("NORMAL")) is not None
    assert jobs.cancel("j2", keys.queue("NORMAL"), "{}", 102.0) == "cancel_requested"
    assert r.hget(keys.job("j2"), "cancel_requested") == "1" and r.hget(keys.job("j2"), "state") == "leased"
    assert jobs.cancel("nope", keys.queue("NORMAL"), "{}", 1.0) == "missing"
    # its GPU worker lost the lease before the cancel reached it: the reclaim cancels the job, with
    # its `cancelled` event (it had none: a chaos tester; the report and Gantt saw no end)
    r.zadd(keys.leases, {"L1": 0})
    assert leases.reclaim("L1", max_attempts=3) == "cancelled"
    assert r.hget(keys.job("j2"), "state") == "cancelled"
    ended = [e for e in events(r, keys) if e.get("job") == "j2" and e["kind"] == "cancelled"]
    assert [e["reason"] for e in ended] == ["cancelled; lease reclaimed"], ended


def test_submit_of_a_job_whose_dependency_has_no_record_writes_nothing(jobs, r, keys):
    submit(jobs, keys, "d1")
    before = sorted(r.scan_iter(f"{keys.prefix}:*"))
    with pytest.raises(ValidationError) as e:
        submit(jobs, keys, "j1", deps=json.dumps(["d1", "d2"]))
    assert (e.value.field, e.value.value) == ("job.depends_on.1", "d2")
    assert sorted(r.scan_iter(f"{keys.prefix}:*")) == before


def test_drop_stale_and_cancel_dependant_need_the_planner_token(jobs, r, keys):
    submit(jobs, keys, "d1", "LOW")  # a dependency exists when its dependant is submitted
    submit(jobs, keys, "j1", deps=json.dumps(["d1"]))
    assert r.smembers(keys.awaited("d1")) == {"j1"}
    token = str(r.incr(keys.planner_fence))
    assert jobs.cancel_dependant("j1", keys.queue("NORMAL"), "stale", 5.0, "dep failed", "{}") == 0
    assert jobs.cancel_dependant("j1", keys.queue("NORMAL"), token, 5.0, "dep failed", "{}") == 1
    assert r.hget(keys.job("j1"), "state") == "cancelled" and not r.exists(keys.awaited("d1"))
    r.zadd(keys.queue("NORMAL"), {"j1": 1})  # a stale entry of a job no longer queued
    assert jobs.drop_stale(keys.queue("NORMAL"), "j1", "stale") == 0
    assert jobs.drop_stale(keys.queue("NORMAL"), "j1", token) == 1 and r.zcard(keys.queue("NORMAL")) == 0


def test_inherited_levels_walk_the_awaited_index(jobs, r, keys):
    submit(jobs, keys, "low", "LOW")
    submit(jobs, keys, "mid", "NORMAL", deps=json.dumps(["low"]))
    submit(jobs, keys, "top", "CRITICAL", deps=json.dumps(["mid"]))
    assert jobs.inherited_levels(["low", "mid", "top"], 100) == [0, 0, 4]


def test_write_wait_reasons_writes_queued_records_and_counts(jobs, r, keys):
    submit(jobs, keys, "j1")
    submit(jobs, keys, "j2")
    jobs.cancel("j2", keys.queue("NORMAL"), "{}", 1.0)
    assert jobs.write_wait_reasons("", ["j1", "waiting_for_gpus", "d", "", "j2", "waiting_for_gpus", "d", ""]) == 1
    assert r.hget(keys.job("j1"), "wait_reason") == "waiting_for_gpus" and not r.hget(keys.job("j2"), "wait_reason")
    assert r.hgetall(keys.wait_reason_counts) == {"waiting_for_gpus": "1"}
    assert jobs.write_wait_reasons("", []) == 0 and not r.exists(keys.wait_reason_counts)


def test_write_drain_is_fenced_by_the_planner_token(jobs, r, keys):
    """A planner paused inside its drain check and deposed meanwhile overwrote the new
    leader's clean check with its stale counts (a fencing tester): the write is fenced."""
    r.set(keys.planner_fence, "tok-2")
    assert jobs.write_drain("tok-2", {"leases": 0, "busy_slots": 0})
    assert not jobs.write_drain("tok-1", {"leases": 2, "busy_slots": 1})  # the deposed leader's
    assert r.hgetall(keys.drain) == {"leases": "0", "busy_slots": "0", "checks": "1"}
    assert jobs.write_drain("", {"leases": 1})  # unchecked (tests)
    assert r.hget(keys.drain, "checks") == "2"


def test_compact_and_expire_a_finished_job(jobs, r, keys):
    submit(jobs, keys, "j1", spec=json.dumps({"idempotency_key": "k1"}))
    r.set(keys.idem("k1"), "j1")
    assert jobs.compact_finished("j1", 5.0, 60, ["id", "state"]) == -1  # not final yet
    jobs.cancel("j1", keys.queue("NORMAL"), "{}", 5.0)
    assert jobs.compact_finished("j1", 5.0, 60, ["id", "state"]) == 1
    assert set(r.hgetall(keys.job("j1"))) == {"id", "state", "idem"} and 0 < r.ttl(keys.job("j1")) <= 60
    assert r.zscore(keys.retained, "j1") == 5.0 and r.hget(keys.retention_tally, "cancelled") == "1"
    assert jobs.expire_retained("j1", 10.0) == 1
    assert not r.exists(keys.job("j1")) and not r.exists(keys.idem("k1"))


# -- LeaseStore ---------------------------------------------------------------------------------
@pytest.mark.parametrize("current", ["running", "cancelled", "failed", "completed"])
def test_fail_workload_fails_only_a_running_workload(jobs, r, keys, current):
    r.hset(keys.workload("w1"), mapping={"state": current, "steps": "{}"})
    event = json.dumps({"ts": 5.0, "kind": "workload_failed", "workload": "w1"})
    assert jobs.fail_workload("w1", "step a failed", 5.0, event) == (current == "running")
    record = r.hgetall(keys.workload("w1"))
    if current == "running":
        assert (record["state"], record["reason"], float(record["failed_at"])) == ("failed", "step a failed", 5.0)
        assert [e["kind"] for e in events(r, keys)] == ["workload_failed"]
    else:
        assert record == {"state": current, "steps": "{}"} and events(r, keys) == []


@pytest.mark.parametrize(("current", "all_completed", "final"), [
    ("running", True, "completed"), ("running", False, "failed"),
    ("failed", True, "failed"), ("cancelled", True, "cancelled"), ("cancelled", False, "cancelled")])
def test_finish_workload_closes_it_as_it_is_now(jobs, r, keys, current, all_completed, final):
    r.hset(keys.workload("w1"), mapping={"state": current, "steps": "{}"})
    r.sadd(keys.workloads_active, "w1", "w2")
    assert jobs.finish_workload("w1", all_completed, 1764691200.123456) == final
    assert r.hget(keys.workload("w1"), "state") == final
    assert r.hget(keys.workload("w1"), "finished_at") == "1764691200.123456"
    assert r.smembers(keys.workloads_active) == {"w2"}
    assert r.zscore(keys.workloads_done, "w1") == pytest.approx(1764691200.123456)
    expected = [{"ts": 1764691200.123456, "kind": f"workload_{final}", "workload": "w1"}] if current == "running" else []
    assert events(r, keys) == expected  # an event only when the pass ended it (a cancel recorded its own)


def test_finish_workload_whose_record_is_gone_only_leaves_the_active_set(jobs, r, keys):
    r.sadd(keys.workloads_active, "w1")
    assert jobs.finish_workload("w1", True, 5.0) == ""
    assert not r.exists(keys.workload("w1")) and r.scard(keys.workloads_active) == 0
    assert r.zscore(keys.workloads_done, "w1") is None


def test_workload_reads(jobs, r, keys):
    r.hset(keys.workload("w1"), mapping={"state": "running", "retries:a": "1"})
    r.hset(keys.job("j1"), mapping={"state": "failed", "reason": "boom"})
    r.sadd(keys.workloads_active, "w1")
    assert jobs.active_workloads() == {"w1"}
    assert jobs.workload_fields("w1", ("state", "steps")) == ["running", None]
    rows, record = jobs.workload_steps("w1", ["j1", "j2"])
    assert rows == [("failed", "boom"), (None, None)] and record["retries:a"] == "1"
    jobs.drop_active_workload("w1")
    assert jobs.active_workloads() == set()


def test_a_lease_acknowledges_its_job_and_fences_its_holder(jobs, leases, r, keys):
    submit(jobs, keys, "j1")
    lease = leases.acquire("L1", ("g0", "g1"), 30.0, job_id="j1", queue=keys.queue("NORMAL"))
    assert lease is not None and lease.gpus == ("g0", "g1")
    assert r.hget(keys.job("j1"), "state") == "leased" and r.zcard(keys.queue("NORMAL")) == 0
    assert leases.acquire("L2", ("g1",), 30.0, kind="restore") is None  # g1 is held
    assert leases.renew(lease, 30.0)
    leases.check(lease)
    assert leases.fenced(lease, [start_job_op(keys, "j1", 7.0)])
    assert r.hget(keys.job("j1"), "state") == "running" and r.hget(keys.job("j1"), "started_at") == "7.0"
    r.set(keys.gpu("g0"), "L9:99")  # another holder now
    assert not leases.fenced(lease, [finish_job_op(keys, "j1", JobState.COMPLETED, 8.0, "")])
    assert r.hget(keys.job("j1"), "state") == "running"
    with pytest.raises(StaleFencingToken):
        leases.check(lease)


def test_finish_op_finishes_the_job_in_one_place(jobs, leases, r, keys):
    submit(jobs, keys, "j1")
    lease = leases.acquire("L1", ("g0",), 30.0, job_id="j1", queue=keys.queue("NORMAL"))
    assert leases.fenced(lease, [finish_job_op(keys, "j1", "failed", 9.25, "boom")])
    rec = r.hgetall(keys.job("j1"))
    assert (rec["state"], rec["finished_at"], rec["reason"]) == ("failed", "9.25", "boom")
    assert abs(r.zscore(keys.finished, "j1") - _server_now(r)) < 60 and r.zscore(keys.running, "j1") is None


def test_delay_op_puts_the_job_on_the_delayed_set(jobs, leases, r, keys):
    submit(jobs, keys, "j1")
    lease = leases.acquire("L1", ("g0",), 30.0, job_id="j1", queue=keys.queue("NORMAL"))
    assert leases.fenced(lease, [delay_job_op(keys, "j1", 50.5, "retry 1", "ValueError")])
    rec = r.hgetall(keys.job("j1"))
    assert (rec["state"], rec["not_before"], rec["reason"], rec["last_error"]) == ("delayed", "50.5", "retry 1",
                                                                                  "ValueError")
    assert r.zscore(keys.delayed, "j1") == 50.5


def test_reclaim_requeues_an_untried_job_and_fails_a_tried_one(jobs, leases, r, keys):
    submit(jobs, keys, "j1")
    r.set(keys.resident("g0"), "chat@g0")
    leases.acquire("L1", ("g0",), 30.0, job_id="j1", queue=keys.queue("NORMAL"))
    assert leases.reclaim("L1", max_attempts=1) == "live"
    r.zadd(keys.leases, {"L1": 0})  # expired
    assert leases.expired() == ["L1"]
    assert leases.reclaim("L1", max_attempts=1) == "requeued"  # no phase claimed: not an attempt
    assert r.hget(keys.job("j1"), "state") == "queued" and r.hget(keys.job("j1"), "attempts") == "0"
    assert r.get(keys.gpu("g0")) is None and not r.exists(keys.lease("L1"))
    # no phase ran, so nothing changed on the GPU: its warm endpoint stands (a planner paused
    # past the TTL between the lease and its phases threw it away for a cold start: a fencing
    # tester); once a phase ran, what is resident is unknown and the marker goes
    assert r.get(keys.resident("g0")) == "chat@g0"
    leases.acquire("L2", ("g0",), 30.0, job_id="j1", queue=keys.queue("NORMAL"))
    r.hset(keys.phase("L2"), "evict", "done")
    r.zadd(keys.leases, {"L2": 0})
    assert leases.reclaim_expired(max_attempts=1) == {"failed": 1}
    assert r.get(keys.resident("g0")) is None
    assert r.hget(keys.job("j1"), "state") == "failed" and r.zscore(keys.finished, "j1") is not None
    kinds = [e["kind"] for e in events(r, keys)]
    assert kinds.count("reclaimed") == 2 and kinds[-1] == "failed"


def test_a_reclaimed_restore_lease_counts_no_attempt(leases, r, keys):
    """A restore has no job: its reclaimed event said attempt_counted true (a fencing tester)."""
    leases.acquire("R1", ("g1",), 30.0, kind="restore", holder="h")
    r.hset(keys.phase("R1"), "restore", "claimed")
    r.zadd(keys.leases, {"R1": 0})
    assert leases.reclaim("R1", max_attempts=3) == "released"
    (reclaimed,) = [e for e in events(r, keys) if e["kind"] == "reclaimed"]
    assert reclaimed["attempt_counted"] is False and reclaimed["lease"] == "R1"


def test_preempt_requeues_and_a_stale_planner_is_refused(jobs, leases, r, keys):
    submit(jobs, keys, "j1")
    leases.acquire("L1", ("g0",), 30.0, job_id="j1", queue=keys.queue("NORMAL"))
    r.set(keys.planner_fence, "3")
    with pytest.raises(LeaseError):
        leases.preempt("L1", "j9", planner_token="2")
    assert leases.preempt("L1", "j9", planner_token="3") == "preempted"
    rec = r.hgetall(keys.job("j1"))
    assert (rec["state"], rec["reason"], rec["preemptions"]) == ("queued", "preempted by j9", "1")
    assert "lease" not in rec and r.zrange(keys.queue("NORMAL"), 0, -1) == ["j1"]
    assert leases.preempt("L1", "j9") == "gone"


def test_acquire_many_is_each_acquire_in_order(jobs, leases, r, keys):
    submit(jobs, keys, "j1")
    submit(jobs, keys, "j2")
    got, fenced = leases.acquire_many([
        {"lease_id": "L1", "gpus": ("g0",), "ttl_s": 30.0, "job_id": "j1", "queue": keys.queue("NORMAL")},
        {"lease_id": "L2", "gpus": ("g0",), "ttl_s": 30.0, "job_id": "j2", "queue": keys.queue("NORMAL")},
        {"lease_id": "L3", "gpus": ("g1",), "ttl_s": 30.0, "job_id": "j2", "queue": keys.queue("NORMAL")}])
    assert not fenced and got[0] is not None and got[1] is None and got[2] is not None
    assert {a["lease_id"] for a in leases.active()} == {"L1", "L3"}
    assert leases.gpu_holders(["g0", "g1", "g2"]) == {"g0": f"L1:{got[0].token}", "g1": f"L3:{got[2].token}",
                                                       "g2": None}


# -- EventLog -----------------------------------------------------------------------------------
def test_event_log_appends_and_reads_in_order(r, keys):
    log = EventLog(r, keys)
    log.record("a", job="j1", lease=None)
    pipe = r.pipeline()
    log.record("b", pipe=pipe, n=2)
    assert log.length() == 1
    pipe.execute()
    bodies = [body for _, body in log.read()]
    assert [(b["kind"], b.get("job"), b.get("n")) for b in bodies] == [("a", "j1", None), ("b", None, 2)]
    assert "lease" not in bodies[0]


def _server_now(r) -> float:
    seconds, micros = r.time()
    return seconds + micros / 1e6
