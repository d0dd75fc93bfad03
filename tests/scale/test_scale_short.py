"""The short scale run: 1k no-op jobs through the live planner and GPU worker (real
processes, real Redis). Checks drain and boundedness, not speed (speed: bench/scale.py)."""

from __future__ import annotations

from dataclasses import replace

from makespan.keys import Keys
from bench.scale import run_makespan
from makespan.workers.retention import retained_key


def test_1k_jobs_drain_and_state_stays_bounded(r, settings, tmp_path):
    s = replace(settings, time_scale=1e-4, batch_size=16, planner_tick_s=0.02, retention_sweep_s=0.1,
                retention_jobs=200, events_max_len=2_000, lease_ttl_s=10.0, heartbeat_s=2.0)
    out = run_makespan(s, gpus=4, n_jobs=1000, workdir=tmp_path, timeout_s=45)
    keys = Keys(s.key_prefix)
    assert out["completed"] == 1000 and out["failed"] == 0
    assert out["drain"] == {"leases": 0, "agenda_entries": 0, "busy_slots": 0}
    st = out["state"]
    assert st["finished"] == 0 and st["running"] == 0 and st["leases"] == 0
    assert st["retained"] <= s.retention_jobs  # summaries bounded by the count limit, not by 1k
    assert st["events"] <= 2 * s.events_max_len  # trimmed to about events_max_len (whole nodes); ~7 per job untrimmed
    # nothing per job survives beyond the retained summaries and their idempotency keys
    job_keys = sum(1 for _ in r.scan_iter(keys.job("*"), count=1000))
    assert job_keys <= s.retention_jobs
    assert not any(True for _ in r.scan_iter(f"{keys.prefix}:phase:*", count=1000))
    assert not any(True for _ in r.scan_iter(f"{keys.prefix}:lease:*", count=1000))
    assert r.zcard(retained_key(keys)) == st["retained"]
