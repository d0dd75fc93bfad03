"""Regression case of issue 7 on the live system (real Redis, planner and GPU worker
processes): delayed jobs and retry backoffs never become Celery countdown/eta messages.

- a job retried with a delay longer than the broker's visibility timeout runs once more;
- 5,000 jobs delayed 10 minutes leave the GPU worker's memory bounded and hold no Celery
  message, and a new CRITICAL job still starts and completes first.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

from makespan.live import LiveSystem, delete_prefix
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.run_report import drain_counts
from tests.live import all_events, wait_for, wait_worker_consuming

FLEET = """name = "one"
[[hosts]]
name = "h"
gpu_count = 1
memory_mib = 81920

[endpoints.e]
model = "m"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 2
"""


def _system(tmp_path: Path, settings) -> LiveSystem:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    return LiveSystem(path, load_fleet(path), settings, tmp_path / "logs", observer=False)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _celery_messages(r, keys) -> int:
    """Messages held by the broker for this prefix: queued (lists) and unacknowledged."""
    n = 0
    for k in r.scan_iter(f"{keys.celery_prefix}*", count=1000):
        t = r.type(k)
        n += r.llen(k) if t == "list" else r.hlen(k) if t == "hash" and k.endswith("unacked") else 0
    return n


def _kinds(evs, job, kind, phase=None):
    return [e for e in evs if e.get("job") == job and e["kind"] == kind and (phase is None or e.get("phase") == phase)]


def test_retry_delay_longer_than_visibility_timeout_runs_once_more(r, keys, settings, tmp_path):
    """The GPU worker is SIGKILLed during the job's execute phase; its lease expires and the
    reaper retries the job after a 10 s backoff — five times the broker's 2 s visibility
    timeout (kombu redelivers any unacknowledged message older than that). The execute
    phase starts exactly twice (the killed attempt and the retry), ends once, and the job
    completes once with one reclaimed attempt.

    The test owns the retry's clock: once the job is delayed the planner is stopped
    (SIGSTOP), so the delay cannot end before the new GPU worker consumes — a worker start
    takes seconds alone and tens on a loaded host, and a retry leased to a host with no
    worker yet had its lease expire too (a second reclaim). While the planner is stopped
    the new worker runs through the visibility timeout: the killed attempt's message is
    redelivered to it and refused (stale token), and nothing else is in the broker. The
    lease lives 6 s (12 heartbeats), so a loaded host's late heartbeat does not lose it."""
    s = dataclasses.replace(settings, broker_visibility_timeout_s=2.0, retry_backoff_s=10.0, lease_ttl_s=6.0,
                            max_attempts=3)
    system = _system(tmp_path, s)
    prod = Producer(r, keys, system.fleet, s)
    planner = None
    try:
        system.start()
        planner = next(p for p in system.procs if p.name.startswith("planner-"))
        jid = prod.submit({"endpoint": "e", "service_s": 300}).id  # execute: 3 s of wall time
        wait_for(lambda: _kinds(all_events(r, keys), jid, "phase_start", "execute"), 60, "the first execute")
        system.kill("gpu-h-0")
        wait_for(lambda: prod.status(jid)["state"] == "delayed", 60, "the retry to be delayed", 0.02)
        os.kill(planner.popen.pid, signal.SIGSTOP)  # the retry's delay cannot end until SIGCONT
        assert prod.status(jid)["state"] == "delayed", "promoted before the planner stopped"
        assert r.zcard(keys.delayed) == 1 and _celery_messages(r, keys) <= 1  # at most the killed one's unacked
        worker = system.start_gpu_worker("h", 1)
        wait_worker_consuming(s, worker.popen.pid)
        wait_for(lambda: _celery_messages(r, keys) == 0, 60, "the killed attempt's message to be redelivered")
        assert prod.status(jid)["state"] == "delayed" and r.zcard(keys.delayed) == 1
        os.kill(planner.popen.pid, signal.SIGCONT)
        wait_for(lambda: prod.status(jid)["state"] in ("completed", "failed"), 120, "the retry to finish")
        wait_for(lambda: _celery_messages(r, keys) == 0, 30, "the broker to hold nothing")  # redeliveries done
    finally:
        if planner is not None and planner.alive():
            os.kill(planner.popen.pid, signal.SIGCONT)
        system.stop()
    evs = all_events(r, keys)
    rec = prod.status(jid)
    assert rec["state"] == "completed" and rec["reclaimed_attempts"] == 1 and rec["attempts"] == 2, rec
    assert len(_kinds(evs, jid, "phase_start", "execute")) == 2
    assert len(_kinds(evs, jid, "phase_end", "execute")) == 1
    assert len(_kinds(evs, jid, "completed")) == 1 and len(_kinds(evs, jid, "promoted")) == 1
    assert [e["outcome"] for e in _kinds(evs, jid, "reclaimed")] == ["requeued"]


def test_5000_delayed_jobs_bound_worker_memory_and_a_critical_job_still_runs(r, keys, settings, tmp_path):
    system = _system(tmp_path, settings)
    prod = Producer(r, keys, system.fleet, settings)
    try:
        system.start()
        worker = next(p for p in system.procs if p.name == "gpu-h-0")
        warm = prod.submit({"endpoint": "e", "service_s": 1}).id  # imports and first task done
        wait_for(lambda: prod.status(warm)["state"] == "completed", 60, "the warm-up job")
        before_kib = _rss_kib(worker.popen.pid)
        delayed = [prod.submit({"endpoint": "e", "service_s": 1, "priority": "LOW", "delay_s": 600}).id
                   for _ in range(5000)]
        assert r.zcard(keys.delayed) == 5000 and sum(r.zcard(q) for q in keys.queues()) == 0
        assert _celery_messages(r, keys) == 0  # nothing for them in the broker
        crit = prod.submit({"endpoint": "e", "service_s": 1, "priority": "CRITICAL"}).id
        wait_for(lambda: prod.status(crit)["state"] in ("completed", "failed"), 60, "the CRITICAL job")
        assert prod.status(crit)["state"] == "completed"
        growth_kib = _rss_kib(worker.popen.pid) - before_kib
        print(f"GPU worker RSS growth with 5,000 delayed jobs: {growth_kib} KiB (before {before_kib} KiB)")
        assert growth_kib < 50 * 1024, f"GPU worker RSS grew {growth_kib} KiB"
        assert r.zcard(keys.delayed) == 5000 and _celery_messages(r, keys) == 0
        leased = {e.get("job") for e in all_events(r, keys) if e["kind"] == "leased"}
        assert leased == {warm, crit}  # no delayed job started, before or after it
        assert {prod.cancel(j) for j in delayed} == {"cancelled"}
        assert r.zcard(keys.delayed) == 0 and sum(r.zcard(q) for q in keys.queues()) == 0
        counts = drain_counts(r, keys, system.fleet)
        assert (counts["leases"], counts["agenda_entries"], counts["busy_slots"]) == (0, 0, 0), counts
    finally:
        system.stop()
    delete_prefix(r, keys)
    assert list(r.scan_iter(f"{keys.prefix}:*")) == []
