"""Every store script against the JobState transitions table.

Two checks: statically, each script's header declares its transitions, every one of them is in
:data:`makespan.store.states.TRANSITIONS`, and the states the script's text writes (directly or
through lib.lua's helpers) are exactly the declared targets; dynamically, each script that
changes job state is run on a real Redis from every state and the change it makes is allowed.
"""

from __future__ import annotations

import json
import re

import pytest

from makespan.models import FINAL_STATES
from makespan.store import TRANSITIONS, JobState, JobStore
from makespan.store import scripts as store_scripts
from makespan.store.leases import LeaseStore, delay_job_op, finish_job_op, start_job_op
from makespan.store.states import allowed
from tests.store.test_scripts import literal_job_state_writes

STATE_VALUES = {s.value for s in JobState}
# lib.lua helpers (and fenced.lua op names) and the state each one writes
HELPER_WRITES = {"requeue_job(": "queued", "delay_job(": "delayed", "'START_JOB'": "running",
                 "'DELAY_JOB'": "delayed"}


def source_state(name: str) -> JobState | None:
    return None if name == "new" else JobState(name)


def written_states(name: str) -> tuple[set[str], bool]:
    """The job states the script's text writes, and whether it also writes a whole record
    from the caller's fields (a submit: its state is checked at run time below)."""
    body = store_scripts.source(name)
    body = "\n".join(body.splitlines()[len(store_scripts.header_lines(name)):])
    out = literal_job_state_writes(name)  # less a workload record's state (not a job's)
    out |= set(re.findall(r"finish_job\([^,]+,[^,]+,\s*'(\w+)'", body))
    out |= set(re.findall(r"table\.insert\(flat, 'state'\); table\.insert\(flat, '(\w+)'\)", body))
    out |= {state for call, state in HELPER_WRITES.items() if call in body}
    if "finish_job(ARGV[5], args[1], args[2]" in body:  # fenced.lua FINISH_JOB: finish_job_op allows finals only
        out |= set(FINAL_STATES)
    from_fields = bool(re.search(r"redis\.call\('HSET', KEYS\[[^]]+\], unpack\((flat|f)\)\)"
                                 r"|hset_table\(KEYS\[[^]]+\], ", body))  # lib's chunked HSET of a table
    return out & STATE_VALUES, from_fields


def test_final_states_come_from_the_enum():
    assert FINAL_STATES == ("completed", "failed", "cancelled")
    assert all(TRANSITIONS[JobState(s)] == frozenset() for s in FINAL_STATES)
    assert [s.value for s in JobState] == ["queued", "delayed", "leased", "running", "completed", "failed",
                                           "cancelled"]
    assert JobState.QUEUED == "queued" and f"{JobState.LEASED}" == "leased"


@pytest.mark.parametrize("name", store_scripts.script_names())
def test_declared_transitions_are_in_the_table_and_match_what_the_script_writes(name):
    declared = store_scripts.header(name).transitions
    for source, target in declared:
        assert allowed(source_state(source), JobState(target)), f"{name}.lua: {source} -> {target} not allowed"
    written, from_fields = written_states(name)
    targets = {target for _, target in declared}
    assert written <= targets, f"{name}.lua writes {written - targets} without declaring it"
    assert targets - written <= ({"queued"} if from_fields else set()), f"{name}.lua declares {targets - written}"


# -- at run time, from every state ------------------------------------------------------------
ALL_STATES = list(JobState)


def job_in(r, keys, state: JobState, job_id: str = "j1") -> None:
    r.hset(keys.job(job_id), mapping={"id": job_id, "state": state.value, "priority": "NORMAL", "seq": "7",
                                      "attempts": "0"})


def leased_job(r, keys, state: JobState, *, phases: dict[str, str] | None = None) -> tuple:
    """A job whose lease L1 holds GPU g0, its record then set to ``state``."""
    leases = LeaseStore(r, keys)
    job_in(r, keys, JobState.QUEUED)
    r.zadd(keys.queue("NORMAL"), {"j1": 7})
    lease = leases.acquire("L1", ("g0",), 30.0, job_id="j1", queue=keys.queue("NORMAL"))
    assert lease is not None
    r.hset(keys.job("j1"), "state", state.value)
    if phases:
        r.hset(keys.phase("L1"), mapping=phases)
    return leases, lease


def state_of(r, keys, job_id: str = "j1") -> JobState:
    return JobState(r.hget(keys.job(job_id), "state"))


def assert_allowed(before: JobState, after: JobState) -> None:
    assert after == before or allowed(before, after), f"{before.value} -> {after.value}"


@pytest.mark.parametrize("before", ALL_STATES)
def test_cancel_from_every_state(r, keys, before):
    job_in(r, keys, before)
    JobStore(r, keys).cancel("j1", keys.queue("NORMAL"), "{}", 100.0)
    assert_allowed(before, state_of(r, keys))


@pytest.mark.parametrize("before", ALL_STATES)
def test_promote_from_every_state(r, keys, before):
    job_in(r, keys, before)
    r.zadd(keys.delayed, {"j1": 0})
    JobStore(r, keys).promote_delayed(100.0, 10)
    after = state_of(r, keys)
    assert_allowed(before, after)
    assert (after == JobState.QUEUED) == (before in (JobState.DELAYED, JobState.QUEUED))


@pytest.mark.parametrize("before", ALL_STATES)
def test_cancel_dependant_from_every_state(r, keys, before):
    job_in(r, keys, before)
    token = str(r.incr(keys.planner_fence))
    JobStore(r, keys).cancel_dependant("j1", keys.queue("NORMAL"), token, 100.0, "dependency failed", "{}")
    assert_allowed(before, state_of(r, keys))


@pytest.mark.parametrize("before", ALL_STATES)
@pytest.mark.parametrize("phases", [None, {"evict": "done"}, {"execute": "done"}])
def test_reclaim_from_every_state(r, keys, before, phases):
    leases, _ = leased_job(r, keys, before, phases=phases)
    r.zadd(keys.leases, {"L1": 0})  # expired on any clock
    leases.reclaim("L1", max_attempts=1)
    assert_allowed(before, state_of(r, keys))


@pytest.mark.parametrize("before", ALL_STATES)
def test_preempt_from_every_state(r, keys, before):
    """preempt.lua moves a leased or running job back to its queue; from any other state
    (no TRANSITIONS entry leads from it to queued) it refuses and changes nothing."""
    leases, _ = leased_job(r, keys, before)
    events_before = r.xlen(keys.events)
    outcome = leases.preempt("L1", "j2")
    after = state_of(r, keys)
    assert_allowed(before, after)
    if before in (JobState.LEASED, JobState.RUNNING):
        assert (outcome, after) == ("preempted", JobState.QUEUED)
        assert not r.exists(keys.lease("L1"))
    else:
        assert (outcome, after) == ("not_leased", before)
        assert r.hget(keys.lease("L1"), "job") == "j1"  # the lease and its GPU stay with their holder
        assert r.zscore(keys.leases, "L1") is not None
        assert r.get(keys.gpu("g0")) is not None
        assert r.zscore(keys.queue("NORMAL"), "j1") is None
        assert r.xlen(keys.events) == events_before
        assert r.hget(keys.job("j1"), "preemptions") is None


@pytest.mark.parametrize("before", [JobState.LEASED, JobState.RUNNING])  # the states a lease holds its job in
@pytest.mark.parametrize("op", ["start", "delay", "completed", "failed", "cancelled"])
def test_fenced_state_ops_from_the_leased_states(r, keys, before, op):
    leases, lease = leased_job(r, keys, before)
    built = {"start": lambda: start_job_op(keys, "j1", 5.0), "delay": lambda: delay_job_op(keys, "j1", 9.0, "r", "e")}
    assert leases.fenced(lease, [built.get(op, lambda: finish_job_op(keys, "j1", op, 6.0, "r"))()])
    assert_allowed(before, state_of(r, keys))


def test_finish_job_op_refuses_a_state_that_is_not_final(keys):
    with pytest.raises(ValueError):
        finish_job_op(keys, "j1", JobState.QUEUED, 1.0, "")
    with pytest.raises(ValueError):
        finish_job_op(keys, "j1", "bogus", 1.0, "")


def test_begin_warm_from_the_leased_state(r, keys):
    _, lease = leased_job(r, keys, JobState.LEASED)
    r.set(keys.resident("g0"), "inst")
    got = JobStore(r, keys).begin_warm("L1", lease.token, ("g0",), "j1", "inst", 5.0, ["{}"] * 5, 600.0)
    assert got.outcome == "ok" and got.instances is None  # no workload function: nothing read
    assert_allowed(JobState.LEASED, state_of(r, keys))
    # the lease is renewed in the same step (the warm path's renew as the job starts)
    sec, usec = r.time()
    expires_ms = int(r.hget(keys.lease("L1"), "expires_ms"))
    assert 590_000 < expires_ms - (sec * 1000 + usec // 1000) <= 600_000
    assert r.zscore(keys.leases, "L1") == expires_ms and r.pttl(keys.gpu("g0")) > 590_000


@pytest.mark.parametrize("record, listed, outcome", [
    ({"helpers": '["embedder"]'}, [], "helpers"),           # planned with helpers
    ({"fn": "f"}, ["f"], "helpers"),                        # none planned: its function's in the registry
    ({"fn": "f", "helpers": "[]"}, ["f"], "ok"),            # the record's word wins (PhaseRunner._helpers)
    ({"fn": "f"}, ["g"], "ok"),
    ({}, ["f"], "ok"),
])
def test_begin_warm_leaves_a_job_with_helper_endpoints_untouched(r, keys, record, listed, outcome):
    """The warm path's begin step says 'helpers' for a job whose helper endpoints must start
    in their phases (as PhaseRunner._helpers finds them: the record's, else its function's
    in the caller's registry), before any write."""
    _, lease = leased_job(r, keys, JobState.LEASED)
    if record:
        r.hset(keys.job("j1"), mapping=record)
    r.set(keys.resident("g0"), "inst")
    got = JobStore(r, keys).begin_warm("L1", lease.token, ("g0",), "j1", "inst", 5.0, ["{}"] * 5, 600.0, listed)
    assert got.outcome == outcome
    if outcome == "helpers":
        assert state_of(r, keys) == JobState.LEASED and not r.exists(keys.phase("L1")) and not r.exists(keys.busy("L1"))
    else:
        assert state_of(r, keys) == JobState.RUNNING


def test_begin_warm_reads_the_instances_registered_on_the_lease_gpus(r, keys):
    """For a job of a workload function it answers the registry hashes of the instances
    indexed on any of the lease's GPUs (by id), as the registry's own read finds them
    (instances_on), with a stale index entry (no hash) left out; for any other job none."""
    from makespan.workers.drivers.base import Instance
    from makespan.workers.drivers.registry import decode_instances, instances_on, register_instance

    _, lease = leased_job(r, keys, JobState.LEASED)
    r.set(keys.resident("g0"), "inst")
    register_instance(r, keys, Instance("embed", ["g0"], "simulated", id="b", url="http://127.0.0.1:2"))
    register_instance(r, keys, Instance("render", ["g0", "g1"], "simulated", id="a"), state="asleep")
    register_instance(r, keys, Instance("embed", ["g1"], "simulated", id="c"))  # another GPU
    r.sadd(keys.gpu_instances("g0"), "gone")  # an index entry whose instance was unregistered
    r.hset(keys.job("j1"), "fn", "f")
    got = JobStore(r, keys).begin_warm("L1", lease.token, ("g0",), "j1", "inst", 5.0, ["{}"] * 5, 600.0)
    assert got.outcome == "ok" and got.instances is not None
    assert [h["id"] for h in got.instances] == ["a", "b"]
    assert decode_instances(got.instances, with_state=True) == instances_on(r, keys, ["g0"], with_state=True)


def test_submits_write_queued_or_delayed_from_no_record(r, keys):
    jobs = JobStore(r, keys)
    jobs.submit("j1", {"id": "j1", "state": "queued", "priority": "NORMAL"}, "{}", keys.queue("NORMAL"))
    jobs.submit("j2", {"id": "j2", "state": "queued", "priority": "NORMAL"}, json.dumps({"kind": "submitted"}),
                keys.queue("NORMAL"), delay_s=60.0)
    assert allowed(None, state_of(r, keys, "j1")) and state_of(r, keys, "j2") == JobState.DELAYED


@pytest.mark.parametrize("preemptor", ["leased", "cancelled", "queued", None])
def test_preempt_is_refused_for_a_preemptor_no_longer_queued(r, keys, preemptor):
    """The critical lane read its CRITICAL job queued, then a tick leased it elsewhere: the
    victim must not lose its run for a job that no longer needs the GPUs (a review's find)."""
    leases, _ = leased_job(r, keys, JobState.RUNNING)
    if preemptor is not None:
        r.hset(keys.job("j2"), mapping={"state": preemptor, "priority": "CRITICAL"})
    outcome = leases.preempt("L1", "j2")
    if preemptor in ("leased", "cancelled"):
        assert outcome == "preemptor_not_queued"
        assert state_of(r, keys) == JobState.RUNNING and r.hget(keys.lease("L1"), "job") == "j1"
        assert r.hget(keys.job("j1"), "preemptions") is None
    else:  # queued, or no record (a caller that names no job): as before
        assert outcome == "preempted" and state_of(r, keys) == JobState.QUEUED
