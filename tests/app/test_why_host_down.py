"""``makespan why`` on a job running on a host whose GPU worker died said "running since …,
phase execute, progress 10/25" with its progress frozen, until the lease ran out and the job
was queued again (operator new user). It now names the host and, when no GPU worker of that
host is live, that the lease runs out in N s and the planner then reclaims it (requeued, or
failed after its last attempt: not always "queued again", a review found)."""

from __future__ import annotations

from makespan.cli_why import explain, line


def _running_job(r, keys, host: str, expires_in_s: float) -> None:
    sec, usec = r.time()
    now_ms = sec * 1000 + usec // 1000
    r.hset(keys.job("j1"), mapping={"id": "j1", "state": "running", "priority": "NORMAL", "endpoint": "sim",
                                     "lease": "L1", "leased_at": repr(now_ms / 1000 - 20),
                                     "started_at": repr(now_ms / 1000 - 18)})
    r.hset(keys.lease("L1"), mapping={"job": "j1", "holder": host, "expires_ms": str(int(now_ms + expires_in_s * 1000))})


def test_a_job_on_a_host_without_a_live_worker_says_its_lease_runs_out(r, keys, settings):
    _running_job(r, keys, "gpu-a", 6.0)
    out = explain(r, keys, settings, "j1")
    assert (out["host"], out["host_live"]) == ("gpu-a", False)
    assert 4.0 <= out["lease_expires_in_s"] <= 6.0
    text = line(out)
    assert "on gpu-a (no live GPU worker there: its lease runs out in" in text and "then the planner reclaims it), " in text


def test_a_job_on_a_live_host_names_the_host_only(r, keys, settings):
    _running_job(r, keys, "gpu-b", 6.0)
    r.set(keys.host_live("gpu-b"), "worker-1", px=10_000)
    out = explain(r, keys, settings, "j1")
    assert (out["host"], out["host_live"], out["lease_expires_in_s"]) == ("gpu-b", True, None)
    assert line(out).startswith("j1: running since") and line(out).endswith("s ago) on gpu-b, between phases")


def test_a_job_whose_worker_is_shutting_down_says_it_hands_the_lease_back(r, keys, settings):
    """A GPU worker in its shutdown grace (SIGTERM) withdrew its live key, and `why` said "no
    live GPU worker there … then the planner reclaims it" while that worker still ran the job
    and handed it back itself seconds later (reliability check)."""
    from makespan.workers.host_liveness import announce, withdraw

    _running_job(r, keys, "gpu-c", 6.0)
    announce(r, keys, "gpu-c", "worker-9", 10.0)
    assert withdraw(r, keys, "gpu-c", "worker-9")  # its clean stop began
    out = explain(r, keys, settings, "j1")
    assert (out["host_live"], out["host_stopping"]) == (False, True)
    assert "(its GPU worker is shutting down: it hands the lease back when the job's phase stops, else the lease " \
           "runs out in" in line(out)


def test_a_record_without_a_state_says_so_not_none(r, keys, settings):
    """A damaged record (no ``state`` field) printed ``j2: None`` (a stop-53 helper)."""
    r.hset(keys.job("j2"), mapping={"id": "j2", "priority": "NORMAL", "endpoint": "sim"})
    text = line(explain(r, keys, settings, "j2"))
    assert text.startswith("j2: no state (its record has none") and "None" not in text, text
