"""Producer API on a real Redis: atomic submit, idempotency, cancel, strict priority."""

import json
import pytest

from makespan.errors import NotFoundError, ValidationError
from makespan.models import Priority, load_fleet
from makespan.producer import Producer
from makespan.workers.planner_worker import PlannerWorker


@pytest.fixture
def fleet():
    return load_fleet("examples/render-pipeline.toml")


@pytest.fixture
def prod(r, keys, fleet, settings):
    return Producer(r, keys, fleet, settings)


def _own_keys(r, prefix):
    return sorted(r.scan_iter(f"{prefix}:*"))


def test_submit_writes_record_queue_and_event(prod, r, keys):
    h = prod.submit({"endpoint": "coder", "service_s": 30, "priority": "HIGH"})
    assert h.created and h.priority is Priority.HIGH
    st = prod.status(h.id)
    assert st["state"] == "queued" and st["endpoint"] == "coder" and float(st["service_s"]) == 30
    # the documented fields are there before anything set them (a new user's status["tries"] raised KeyError)
    assert (st["tries"], st["preemptions"], st["cancel_requested"], st["deps"], st["helpers"],
            st["service_estimated"]) == (0, 0, False, [], [], False)
    assert r.zscore(keys.queue(Priority.HIGH), h.id) is not None
    assert r.xlen(keys.events) == 1


def test_a_delay_of_zero_queues_the_job_at_once(prod, r, keys):
    """A computed max(0, due - now) was refused ("must be a positive number"), unlike
    Celery's countdown=0 (task-queue new user)."""
    h = prod.submit({"endpoint": "coder", "service_s": 30, "delay_s": 0})
    assert prod.status(h.id)["state"] == "queued" and r.zscore(keys.queue(Priority.NORMAL), h.id) is not None


def test_same_idempotency_key_returns_existing_job(prod, r, keys):
    a = prod.submit({"endpoint": "embed", "service_s": 5, "idempotency_key": "batch-7"})
    b = prod.submit({"endpoint": "embed", "service_s": 5, "idempotency_key": "batch-7"})
    assert a.created and not b.created and a.id == b.id and b.ignored == ()  # the same request: nothing ignored
    assert r.zcard(keys.queue(Priority.NORMAL)) == 1


def test_a_repeated_key_says_what_of_the_new_submit_it_did_not_use(prod, r, keys):
    """A new user resubmitted a key with other args and priority and got the first job with
    no word that the new ones were dropped."""
    a = prod.submit({"endpoint": "embed", "service_s": 5, "payload": {"n": 1}, "idempotency_key": "k"})
    b = prod.submit({"endpoint": "embed", "service_s": 7, "payload": {"n": 2}, "priority": "HIGH",
                     "idempotency_key": "k", "depends_on": [a.id]})
    assert not b.created and b.id == a.id and b.priority is Priority.NORMAL  # the first job, as submitted
    assert b.ignored == ("priority", "service_s", "depends_on", "payload")
    assert r.hget(keys.job(a.id), "priority") == "NORMAL" and r.zcard(keys.queue(Priority.HIGH)) == 0
    assert prod.submit({"endpoint": "embed", "service_s": 5, "payload": {"n": 1}, "idempotency_key": "k"}).ignored == ()


@pytest.mark.parametrize("bad", [
    {"endpoint": "nope", "service_s": 1},
    {"endpoint": "coder", "service_s": -1},
    {"endpoint": "coder", "service_s": 1, "priority": "SOON"},
    {"endpoint": "coder", "service_s": 1, "extra": True},
    {"endpoint": "coder", "service_s": 1, "payload": {"blob": "x" * 100_000}},
    {"endpoint": "coder", "service_s": 1, "deadline_s": 0},
    {"endpoint": "coder", "service_s": 1, "deadline_s": -5},
    {"endpoint": "coder", "service_s": 1, "deadline_s": True},
])
def test_rejected_job_writes_nothing(prod, r, prefix, bad):
    with pytest.raises(ValidationError):
        prod.submit(bad)
    assert _own_keys(r, prefix) == []


def test_deadline_reaches_the_planner_as_release_plus_deadline(prod, fleet, r, settings):
    h = prod.submit({"endpoint": "coder", "service_s": 30, "deadline_s": 90})
    none = prod.submit({"endpoint": "coder", "service_s": 30})
    st = prod.status(h.id)
    assert st["deadline_s"] == 90.0
    batch = {j.id: j for j in PlannerWorker(r, settings, fleet, dispatch=lambda *a: None).form_batch()}
    assert batch[h.id].deadline_s == pytest.approx(batch[h.id].release_s + 90.0)
    assert batch[none.id].deadline_s is None


def test_helpers_reach_the_planner_with_the_job(prod, fleet, r, settings):
    """A job's helpers are written with it and the planner's batch carries them (it then
    prices their start and checks their memory, tests/planner/test_helpers.py)."""
    h = prod.submit({"endpoint": "renderer", "service_s": 30, "workload": "render_cards", "helpers": ["embed"]})
    plain = prod.submit({"endpoint": "renderer", "service_s": 30})
    batch = {j.id: j for j in PlannerWorker(r, settings, fleet, dispatch=lambda *a: None).form_batch()}
    assert batch[h.id].helpers == ("embed",) and batch[plain.id].helpers == ()


@pytest.mark.parametrize("helpers,says", [
    (["renderer"], "needs 82000, 62000 MiB"),  # 82,000 MiB on an 81,920 MiB GPU: nowhere
    (["nope"], "unknown endpoint"),
    (["coder"], "must not repeat a name nor name the main endpoint"),
    (["embed", "embed"], "must not repeat a name"),
])
def test_a_job_whose_helpers_fit_nowhere_is_refused_and_nothing_written(prod, r, prefix, helpers, says):
    with pytest.raises(ValidationError) as err:
        prod.submit({"endpoint": "coder", "service_s": 1, "workload": "w", "helpers": helpers})
    assert err.value.field == "job.helpers" and says in str(err.value)
    assert _own_keys(r, prefix) == []
    assert prod.submit({"endpoint": "coder", "service_s": 1, "workload": "w", "helpers": ["embed"]}).created


def test_cancel_queued_and_unknown(prod, r, keys):
    h = prod.submit({"endpoint": "chat", "service_s": 9})
    assert prod.cancel(h.id) == "cancelled"
    assert r.zcard(keys.queue(Priority.NORMAL)) == 0
    assert prod.status(h.id)["state"] == "cancelled"
    with pytest.raises(NotFoundError):
        prod.cancel("no-such-job")
    with pytest.raises(NotFoundError):
        prod.status("no-such-job")


def test_critical_behind_1000_low_is_in_next_batch(prod, r, keys, fleet, settings):
    low = [{"endpoint": "embed", "service_s": 1, "priority": "LOW"} for _ in range(1000)]
    for j in low:
        prod.submit(j)
    crit = prod.submit({"endpoint": "embed", "service_s": 1, "priority": "CRITICAL"})
    w = PlannerWorker(r, settings, fleet, dispatch=lambda *a: None)
    batch = w.form_batch()
    assert len(batch) == settings.batch_size
    assert batch[0].id == crit.id
    assert prod.queue_depths() == {"CRITICAL": 1, "HIGH": 0, "NORMAL": 0, "LOW": 1000}


def test_a_job_requeued_while_the_batch_is_read_is_taken_once(prod, r, keys, settings, fleet):
    """A full-suite run under GPU-worker churn: a job requeued at its submission's place (a
    hand-back) between the heads' read and the next page's shifted the queue by one; the next
    page began with a job already read, the batch held it twice, and the planner process died
    on the evaluator's "placed twice"."""
    from makespan.models import Priority
    from makespan.workers.planner_worker import PlannerWorker

    ids = [prod.submit({"endpoint": "embed", "service_s": 1}).id for _ in range(3)]
    w = PlannerWorker(r, settings, fleet, dispatch=lambda *a: None)
    heads = {level: list(r.zrange(keys.queue(level), 0, settings.batch_size - 1)) for level in Priority}
    assert heads[Priority.NORMAL] == ids
    early = prod.submit({"endpoint": "embed", "service_s": 1}).id
    r.zadd(keys.queue("NORMAL"), {early: -1})  # back at an earlier place: the queue moved up by one
    batch = [job.id for job in w.form_batch(heads)]
    assert sorted(batch) == sorted(ids) and len(batch) == len(set(batch)), batch


def test_cli_submit_status_cancel(redis_url, prefix, r):
    """The producer side from a shell: submit (with --fleet), then status and cancel
    without one; bad input exits 2 with the field named and writes nothing."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    def run(*cli_args):
        return subprocess.run([sys.executable, "-m", "makespan.cli", *cli_args], env=env, capture_output=True, text=True)

    out = run("submit", "--fleet", "examples/render-pipeline.toml", "--endpoint", "embed", "--service-s", "12",
              "--priority", "HIGH", "--idempotency-key", "k1", "--deadline-s", "60")
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["created"] and job["priority"] == "HIGH"
    st = run("status", job["id"])
    assert st.returncode == 0 and json.loads(st.stdout)["state"] == "queued"
    assert json.loads(st.stdout)["deadline_s"] == 60.0
    assert run("cancel", job["id"]).stdout.strip() == "cancelled"
    before = sorted(r.scan_iter(f"{prefix}:*"))
    bad = run("submit", "--fleet", "examples/render-pipeline.toml", "--endpoint", "embed", "--service-s", "-1")
    assert bad.returncode == 2 and "job.service_s" in bad.stderr
    assert sorted(r.scan_iter(f"{prefix}:*")) == before
    assert run("status", "nope").returncode == 2


def test_status_of_a_leased_job_before_its_first_phase(prod, r, keys):
    """A job leased whose first phase has not started: its GPUs, no phase running, none
    done (the running case: tests/workloads/test_functions.py)."""
    import uuid

    from makespan.workers.leases import LeaseStore

    jid = prod.submit({"endpoint": "coder", "service_s": 30}).id
    assert not {"gpus", "phase", "phases_done"} & set(prod.status(jid))  # queued
    lease = LeaseStore(r, keys).acquire(uuid.uuid4().hex, ("GPU-host-a-0", "GPU-host-a-1"), 30.0, job_id=jid,
                                        kind="job", holder="host-a", queue=keys.queue("NORMAL"))
    assert lease is not None
    st = prod.status(jid)
    assert st["state"] == "leased" and st["lease"] == lease.lease_id
    assert (st["gpus"], st["phase"], st["phases_done"]) == (["GPU-host-a-0", "GPU-host-a-1"], None, [])


def test_an_ended_job_keeps_where_it_ran_and_a_requeued_one_does_not(prod, r, keys, settings):
    """A new user: `status` of a completed job dropped the ``host`` and ``gpus`` it showed while
    the job was leased, so "where did my failed job run?" had no answer from the CLI."""
    import uuid

    from makespan.workers.leases import LeaseStore

    store = LeaseStore(r, keys)
    jid = prod.submit({"endpoint": "coder", "service_s": 30}).id
    first = store.acquire(uuid.uuid4().hex, ("GPU-host-a-0", "GPU-host-a-1"), 30.0, job_id=jid, kind="job",
                          holder="host-a", queue=keys.queue("NORMAL"))
    assert first is not None
    outcome, _job = store.hand_back(first, settings.max_attempts, cause="worker_shutdown")  # requeued
    assert outcome == "requeued"
    assert not {"gpus", "host"} & set(prod.status(jid))
    again = store.acquire(uuid.uuid4().hex, ("GPU-host-b-0", "GPU-host-b-1"), 30.0, job_id=jid, kind="job",
                          holder="host-b", queue=keys.queue("NORMAL"))
    assert again is not None
    assert store.fenced(again, [("HSET", keys.job(jid), "state", "failed", "reason", "execute: boom"),
                                ("DEL", keys.lease(again.lease_id))])
    st = prod.status(jid)
    assert st["state"] == "failed" and (st["gpus"], st["host"]) == (["GPU-host-b-0", "GPU-host-b-1"], "host-b")


def test_a_record_written_with_the_whole_spec_compares_as_a_new_one():
    """Records written before the spec left out its record fields and defaults held them
    all: repeating their key with the same request ignores nothing."""
    from makespan.producer import ignored_on_repeat

    whole = {"endpoint": "embed", "priority": "NORMAL", "service_s": 5, "payload": {"n": 1}, "workload": None,
             "args": [], "kwargs": {}, "idempotency_key": "k", "deadline_s": None, "delay_s": None,
             "depends_on": [], "helpers": [], "tp": 1}
    existing = {"spec": json.dumps(whole), "endpoint": "embed", "priority": "NORMAL", "service_s": "5.0"}
    same = {"spec": json.dumps({"payload": {"n": 1}, "idempotency_key": "k"}), "endpoint": "embed",
            "priority": "NORMAL", "service_s": "5.0"}
    assert ignored_on_repeat(existing, same) == ()
    other = {**same, "spec": json.dumps({"payload": {"n": 2}, "idempotency_key": "k"})}
    assert ignored_on_repeat(existing, other) == ("payload",)


def test_every_accepted_job_is_counted_in_redis_for_the_servers_metrics(prod, r, keys, fleet, settings):
    """makespan_jobs_submitted_total was counted in the submitting process (the CLI, a client),
    which serves no /metrics: the planner exported 0 for ever (operator new user). The submit
    scripts count in ``P:stats:submits``; a repeated idempotency key is no new job; a
    workload's steps count as jobs."""
    from makespan.metrics import RedisStateCollector
    from makespan.workloads import submit_workload

    prod.submit({"endpoint": "coder", "service_s": 30, "priority": "HIGH", "idempotency_key": "k1"})
    prod.submit({"endpoint": "coder", "service_s": 30, "priority": "HIGH", "idempotency_key": "k1"})
    prod.submit({"endpoint": "coder", "service_s": 30, "priority": "LOW", "delay_s": 60})
    with pytest.raises(ValidationError):
        prod.submit({"endpoint": "nope", "service_s": 1})
    submit_workload(r, keys, fleet, {"name": "wl", "priority": "NORMAL", "steps": [
        {"name": "a", "endpoint": "coder", "service_s": 5}, {"name": "b", "endpoint": "coder", "service_s": 5,
                                                             "depends_on": ["a"]}]}, settings)
    assert r.hgetall(keys.submit_counts) == {"HIGH": "1", "LOW": "1", "NORMAL": "2"}
    exported = {s.labels["priority"]: s.value for fam in RedisStateCollector(r, keys).collect()
                for s in fam.samples if s.name == "makespan_jobs_submitted_total"}
    assert exported == {"CRITICAL": 0.0, "HIGH": 1.0, "NORMAL": 2.0, "LOW": 1.0}


def test_a_tick_whose_plan_is_refused_does_not_end_the_planner(r, settings, fleet, caplog):
    """The same run: the evaluator's InfeasiblePlan escaped the tick loop and ended the
    planner process; with no standby every job then waited for ever. The loop logs it and
    plans again."""
    from makespan.planner.evaluator_core import InfeasiblePlan
    from makespan.workers.planner_worker import PlannerWorker

    w = PlannerWorker(r, settings, fleet, dispatch=lambda *a: None)
    calls = []

    def tick() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise InfeasiblePlan("j1", "placed twice")
        w._stop.set()
        return False

    w.tick = tick
    with caplog.at_level("ERROR"):
        w._tick_until_deposed()
    assert len(calls) == 2
    assert "planning failed, nothing leased this tick; planning again: job j1: placed twice" in caplog.text
