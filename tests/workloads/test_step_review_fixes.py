"""Multi-step workloads and function DAGs (found by a review, 2026-12-04): each test fails
on the code before its fix. In-process on the real Redis."""

from __future__ import annotations

import json

from makespan.models import Priority, load_fleet
from makespan.workloads import advance_workloads, submit_workload, workload_status
from tests.conftest import FLEET_TOML


def _fail(r, keys, job_id: str) -> None:
    r.zrem(keys.queue(Priority.LOW), job_id)
    r.hset(keys.job(job_id), "state", "failed")


def test_a_step_whose_two_parents_fail_before_one_pass_waits_on_both_retries(r, keys, settings):
    """Each retry of a pass wrote its dependants' deps from the step map read at the start:
    the second overwrote the first's, and ``c`` waited on a failed attempt for good (its
    workload never ended, its records kept for ever)."""
    spec = {"name": "wl", "priority": "LOW", "retry_budget": 1,
            "steps": [{"name": "a", "endpoint": "embed", "service_s": 10},
                      {"name": "b", "endpoint": "embed", "service_s": 10},
                      {"name": "c", "endpoint": "embed", "service_s": 10, "depends_on": ["a", "b"]}]}
    wid = submit_workload(r, keys, load_fleet(FLEET_TOML), spec, settings)
    first = json.loads(r.hget(keys.workload(wid), "steps"))
    _fail(r, keys, first["a"])
    _fail(r, keys, first["b"])
    assert advance_workloads(r, keys)["retried"] == 2
    now = json.loads(r.hget(keys.workload(wid), "steps"))
    assert now["a"] != first["a"] and now["b"] != first["b"]
    assert sorted(json.loads(r.hget(keys.job(first["c"]), "deps"))) == sorted([now["a"], now["b"]])
    for step in ("a", "b", "c"):
        r.zrem(keys.queue(Priority.LOW), now[step])
        r.hset(keys.job(now[step]), "state", "completed")
    advance_workloads(r, keys)
    assert workload_status(r, keys, wid)["state"] == "completed"


def test_a_compacted_dependency_keeps_its_record_while_a_new_dependant_waits(r, keys, settings):
    """Compaction put the retention TTL on a finished job's record when nothing waited on it;
    a dependant submitted later (``client.submit(fn, finished_job)``) did not lift it, Redis
    deleted the record while the dependant waited, and the planner cancelled the dependant
    ("dependency … did not complete"). The TTL is lifted while a job waits on it; the sweep
    deletes the record once nothing does."""
    import dataclasses
    import time

    from makespan.producer import Producer
    from makespan.workers.retention import Retention, mark_finished

    fleet = load_fleet(FLEET_TOML)
    s = dataclasses.replace(settings, retention_age_s=3600.0)
    producer = Producer(r, keys, fleet, s)
    parent = producer.submit({"endpoint": "embed", "service_s": 10, "priority": "LOW"}).id
    r.zrem(keys.queue(Priority.LOW), parent)
    now = time.time()
    r.hset(keys.job(parent), mapping={"state": "completed", "finished_at": repr(now)})
    r.rpush(keys.requests(parent), "{}")
    mark_finished(r, keys, parent, now)
    Retention(r, s).sweep(now)
    assert r.ttl(keys.job(parent)) > 0 and r.ttl(keys.requests(parent)) > 0  # compacted, nothing waits
    child = producer.submit({"endpoint": "embed", "service_s": 10, "priority": "LOW", "depends_on": [parent]}).id
    assert r.ttl(keys.job(parent)) == -1 and r.ttl(keys.requests(parent)) == -1  # kept while the child waits
    Retention(r, s).sweep(now + 2 * 3600)
    assert r.exists(keys.job(parent))
    r.zrem(keys.queue(Priority.LOW), child)
    r.hset(keys.job(child), "state", "cancelled")
    Retention(r, s).sweep(now + 3 * 3600)
    assert not r.exists(keys.job(parent))  # nothing waits: the sweep deletes it


def _three_steps(r, keys, settings, retry_budget: int, second_depends: bool) -> tuple[str, dict[str, str]]:
    steps = [{"name": "a", "endpoint": "embed", "service_s": 10},
             {"name": "x", "endpoint": "embed", "service_s": 10, **({"depends_on": ["a"]} if second_depends else {})},
             {"name": "y", "endpoint": "embed", "service_s": 10, "depends_on": ["x"]}]
    wid = submit_workload(r, keys, load_fleet(FLEET_TOML), {"name": "wl", "priority": "LOW",
                                                            "retry_budget": retry_budget, "steps": steps}, settings)
    return wid, json.loads(r.hget(keys.workload(wid), "steps"))


def test_cancel_of_a_failed_workload_cancels_its_independent_steps(r, keys, settings):
    """A failed workload's independent steps go on; cancel-workload returned at once for a
    failed workload, so nothing could stop them."""
    from makespan.workloads import cancel_workload

    wid, ids = _three_steps(r, keys, settings, retry_budget=0, second_depends=False)
    _fail(r, keys, ids["a"])
    assert advance_workloads(r, keys)["failed"] == 1
    assert r.hget(keys.job(ids["x"]), "state") == "queued"
    assert cancel_workload(r, keys, wid) == {"cancelled": 2, "cancel_requested": 0}
    assert [r.hget(keys.job(ids[s]), "state") for s in ("x", "y")] == ["cancelled", "cancelled"]
    assert workload_status(r, keys, wid)["state"] == "failed"


class _RetryAfterRead:
    """The planner's client, with the planner's workload pass (a step retry) landing right
    after cancel_workload read the step map."""

    def __init__(self, r, keys):
        self._r, self._keys, self.reads = r, keys, 0

    def hget(self, *args, **kwargs):
        out = self._r.hget(*args, **kwargs)
        self.reads += 1
        if self.reads == 1:
            advance_workloads(self._r, self._keys)
        return out

    def __getattr__(self, name):
        return getattr(self._r, name)


def test_a_retry_made_while_the_workload_is_cancelled_is_cancelled_too(r, keys, settings):
    from makespan.workloads import cancel_workload

    wid, ids = _three_steps(r, keys, settings, retry_budget=1, second_depends=True)
    _fail(r, keys, ids["a"])
    cancel_workload(_RetryAfterRead(r, keys), keys, wid)
    status = workload_status(r, keys, wid)
    assert status["state"] == "cancelled"
    assert status["steps"]["a"]["job"] != ids["a"]  # the retry happened
    assert status["steps"]["a"]["state"] == "cancelled", status["steps"]


def test_a_prompt_template_that_does_not_format_is_refused_at_submit(r, keys, settings):
    import pytest

    from makespan.errors import ValidationError

    fleet = load_fleet(FLEET_TOML)
    for prompt in ("{i:{zzz}}", "{i:zz}", "{step:d}", "{i!x}"):
        spec = {"name": "wl", "steps": [{"name": "a", "endpoint": "embed", "requests": 2, "prompt": prompt}]}
        with pytest.raises(ValidationError, match="does not format"):
            submit_workload(r, keys, fleet, spec, settings)
    assert not r.exists(keys.workloads)


def test_an_unreadable_workload_file_is_a_validation_error(tmp_path):
    import pytest

    from makespan.errors import ValidationError
    from makespan.workload_spec import load_workload

    fleet = load_fleet(FLEET_TOML)
    latin1 = tmp_path / "wl.yaml"
    latin1.write_bytes(b"name: caf\xe9\nsteps: []\n")
    for path in (latin1, tmp_path):
        with pytest.raises(ValidationError, match="cannot read"):
            load_workload(path, fleet)


def test_a_dependant_preempted_after_its_dependency_aged_out_runs_again(r, keys, settings):
    """A leased dependant used to leave the reverse-dependency index, so retention deleted
    its dependency (record and result) once it was older than the retention age while the
    dependant ran; a preemption (or a reclaim, or a function retry) then put the dependant
    back, the planner found the dependency gone and cancelled it ("dependency … did not
    complete"). The dependant stays in the index until it ends."""
    import dataclasses
    import time
    import uuid

    from makespan.producer import Producer
    from makespan.workers.leases import LeaseStore
    from makespan.workers.planner_worker import PlannerWorker
    from makespan.workers.retention import Retention, mark_finished

    fleet = load_fleet(FLEET_TOML)
    gpu = fleet.hosts[0].gpus[0].uuid
    s = dataclasses.replace(settings, lease_ttl_s=60.0, retention_age_s=2.0)
    planner = PlannerWorker(r, s, fleet, dispatch=lambda ctx, queue: None)
    planner.token = str(r.incr(keys.planner_fence))
    producer = Producer(r, keys, fleet, s)
    parent = producer.submit({"endpoint": "embed", "service_s": 10, "priority": "LOW"}).id
    child = producer.submit({"endpoint": "embed", "service_s": 10, "priority": "LOW", "depends_on": [parent]}).id
    r.zrem(keys.queue(Priority.LOW), parent)
    now = time.time()
    r.hset(keys.job(parent), mapping={"state": "completed", "finished_at": repr(now)})
    r.set(keys.result(parent), '{"ok":true,"attempt":1,"execute_s":0.1,"value":42}', ex=3600)
    mark_finished(r, keys, parent, now)
    lease = LeaseStore(r, keys).acquire(uuid.uuid4().hex, (gpu,), 60.0, job_id=child, kind="job",
                                        holder=fleet.hosts[0].name, queue=keys.queue(Priority.LOW),
                                        info={"planned_end_s": repr(planner.now_s() + 1e6), "endpoint": "embed",
                                              "priority": "LOW"})
    assert lease is not None
    Retention(r, s).sweep(now + 10)  # the child has run longer than the retention age
    assert r.exists(keys.job(parent)) and r.exists(keys.result(parent))
    assert LeaseStore(r, keys).preempt(lease.lease_id, "a-critical-job", planner.token) == "preempted"
    planner.tick()
    assert r.hget(keys.job(child), "state") != "cancelled", r.hget(keys.job(child), "reason")
