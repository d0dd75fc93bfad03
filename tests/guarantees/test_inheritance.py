"""Priority through dependencies (issue 19 point 3): a job that a higher-weight job waits
on is planned with the highest weight waiting on it, for as long as that dependant waits.

One GPU, the planner worker in-process on a real Redis (dispatch captured, phases
finished by the phase runner's own completion step)."""

from __future__ import annotations

import dataclasses

import pytest

from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.phases import PhaseRunner
from makespan.workers.planner_worker import PlannerWorker

ONE_GPU = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                       "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 20000, "cold_start_s": 1}}})


def _setup(r, settings, **kw):
    s = dataclasses.replace(settings, lease_ttl_s=60.0, **kw)
    sent = []
    w = PlannerWorker(r, s, ONE_GPU, dispatch=lambda ctx, q: sent.append(ctx))
    return w, Producer(r, w.keys, ONE_GPU, s), PhaseRunner(r, s, ONE_GPU), sent


def _run_all(w, runner, sent, n):
    """Tick, finish what was dispatched, until ``n`` jobs were dispatched (bounded)."""
    for _ in range(4 * n):
        w.tick()
        if len(sent) >= n:
            break
        if sent and runner.r.hget(w.keys.job(sent[-1].job_id), "state") == "leased":
            assert runner._finish(sent[-1], "completed", "") == "completed"
    return [c.job_id for c in sent]


@pytest.mark.parametrize("policy", ["portfolio", "default"])
def test_critical_behind_a_low_dependency_starts_right_after_it(r, settings, policy):
    """LOW ``L``, 10 NORMAL, then CRITICAL ``C`` depends_on=[L]: L inherits C's weight and
    runs first, C second (before the fix: the 10 NORMAL, then L, then C twelfth)."""
    w, prod, runner, sent = _setup(r, settings, policy=policy)
    try:
        low = prod.submit({"endpoint": "e", "service_s": 5, "priority": "LOW"}).id
        normal = [prod.submit({"endpoint": "e", "service_s": 5, "priority": "NORMAL"}).id for _ in range(10)]
        crit = prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL", "depends_on": [low]}).id
        order = _run_all(w, runner, sent, 12)
    finally:
        w.close()
    assert order[:2] == [low, crit], order
    assert set(order[2:]) == set(normal)


def test_cancelling_the_dependant_drops_the_inheritance(r, settings):
    """The same queue, C cancelled before the first tick: L is planned as LOW again (the
    10 NORMAL first, L last)."""
    w, prod, runner, sent = _setup(r, settings, policy="portfolio")
    low = prod.submit({"endpoint": "e", "service_s": 5, "priority": "LOW"}).id
    normal = [prod.submit({"endpoint": "e", "service_s": 5, "priority": "NORMAL"}).id for _ in range(10)]
    crit = prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL", "depends_on": [low]}).id
    batch = {j.id: j for j in w.form_batch()}
    assert batch[low].weight == 8.0 and batch[low].priority == 0  # inherited from C
    prod.cancel(crit)
    batch = {j.id: j for j in w.form_batch()}
    assert batch[low].weight == 1.0 and batch[low].priority == 3
    order = _run_all(w, runner, sent, 11)
    assert order[-1] == low and set(order[:10]) == set(normal)


def test_inheritance_passes_down_a_chain(r, settings):
    """C (CRITICAL) waits on B (NORMAL) which waits on L (LOW): L is planned as CRITICAL."""
    w, prod, runner, sent = _setup(r, settings, policy="portfolio")
    low = prod.submit({"endpoint": "e", "service_s": 5, "priority": "LOW"}).id
    mid = prod.submit({"endpoint": "e", "service_s": 5, "priority": "NORMAL", "depends_on": [low]}).id
    prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL", "depends_on": [mid]})
    batch = {j.id: j for j in w.form_batch()}
    assert batch[low].weight == 8.0 and mid not in batch


def test_the_inherited_level_is_shown_in_the_wait_detail(r, settings):
    """`makespan why L` said only ``waiting_for_gpus`` with L's own level, LOW, while L was
    planned at CRITICAL for C (new-user check: nothing showed the inheritance). Its detail
    now says the level it is planned at and why."""
    w, prod, runner, sent = _setup(r, settings, policy="portfolio")
    try:
        busy = prod.submit({"endpoint": "e", "service_s": 500, "priority": "CRITICAL"}).id  # not preempted for L
        w.tick()
        assert [c.job_id for c in sent] == [busy]
        low = prod.submit({"endpoint": "e", "service_s": 5, "priority": "LOW"}).id
        prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL", "depends_on": [low]})
        w.tick()
        assert r.hget(w.keys.job(low), "wait_reason") == "waiting_for_gpus"
        assert "planned at CRITICAL, not its own LOW: a CRITICAL job waits on it" in r.hget(w.keys.job(low), "wait_detail")
    finally:
        w.close()


def test_the_inherited_level_is_a_field_of_why_jobs_and_status_and_goes_with_the_cancel(r, settings, monkeypatch):
    """The inherited level was only in the detail's words (an SLA user: tools had to parse
    English). ``planned_priority`` now carries it in ``why --json``, ``jobs --json`` and
    ``status``; cancelling the dependant puts it back to the job's own level at the next
    tick that plans."""
    import json
    import time

    from typer.testing import CliRunner

    from makespan.cli import app as cli_app
    from makespan.workers.batch import REASON_REFRESH_S
    from makespan.workers.tick.clock import ManualClock

    monkeypatch.setenv("MAKESPAN_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", settings.key_prefix)
    clock = ManualClock(time.time())
    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio")
    sent = []
    w = PlannerWorker(r, s, ONE_GPU, dispatch=lambda ctx, q: sent.append(ctx), clock=clock)
    prod = Producer(r, w.keys, ONE_GPU, s)
    r.set(w.keys.planner_leader, w.name)
    try:
        busy = prod.submit({"endpoint": "e", "service_s": 500, "priority": "CRITICAL"}).id
        w.tick()
        assert [c.job_id for c in sent] == [busy]
        low = prod.submit({"endpoint": "e", "service_s": 5, "priority": "LOW"}).id
        crit = prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL", "depends_on": [low]}).id
        clock.advance(REASON_REFRESH_S)
        w.tick()

        def views() -> tuple[str, str, str]:
            why = json.loads(CliRunner().invoke(cli_app, ["why", low, "--json"]).output)
            listed = [json.loads(line) for line in CliRunner().invoke(cli_app, ["jobs", "--json"]).output.splitlines()]
            return (why["planned_priority"], next(x for x in listed if x["id"] == low)["planned_priority"],
                    prod.status(low)["planned_priority"])

        assert views() == ("CRITICAL", "CRITICAL", "CRITICAL")
        table = CliRunner().invoke(cli_app, ["jobs"]).output  # the table says it too (an issue-19 check)
        lines = table.splitlines()
        assert any(line.startswith(low) and " LOW>CRITICAL " in line for line in lines), table
        columns = {line.index(" e ") for line in lines[1:] if " e " in line}  # ENDPOINT aligned in every row
        assert len(columns) == 1 and lines[0].index("ENDPOINT") == columns.pop() + 1, table
        prod.cancel(crit)
        clock.advance(REASON_REFRESH_S)
        w.tick()
        assert views() == ("LOW", "LOW", "LOW")
        assert r.hget(w.keys.job(low), "planned_priority") is None
    finally:
        w.close()


def test_a_planned_priority_an_older_planner_left_behind_is_not_shown():
    """An upgrade tester rolled back to a planner that rewrites a queued job's wait detail but
    not ``planned_priority``: `why` kept saying HIGH for a job planned at its own LOW level.
    The field counts only while the detail still says "planned at LEVEL"."""
    from makespan.wait_reasons import planned_priority

    current = {"priority": "LOW", "planned_priority": "HIGH",
               "wait_detail": "planned on GPUs a; planned at HIGH, not its own LOW: a HIGH job waits on it"}
    assert planned_priority(current) == "HIGH"
    rewritten = {**current, "wait_detail": "planned on GPUs a, held by job x"}
    assert planned_priority(rewritten) is None
    assert planned_priority({"priority": "LOW", "wait_detail": "planned on GPUs a"}) is None
