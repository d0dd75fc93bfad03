"""review5: a running job that a queued step waits on is never a victim, also when the
batch fills before the step's queue is read (the step is outside the batch either way)."""

import dataclasses

import pytest

from makespan.models import Priority
from tests.faults.test_preemption_cases import _preempted, _running, _setup


@pytest.mark.parametrize("mode", ["plan", "rule"])
def test_a_job_a_step_waits_on_is_spared_when_the_batch_is_full_before_its_queue(r, keys, settings, mode):
    """Every GPU runs a LOW job; six of them are dependencies of queued LOW steps; the
    batch (size 2) holds only the two CRITICAL jobs, so the LOW queue is not read for the
    batch this tick: the CRITICAL jobs must still preempt only the other two."""
    w, prod, sent = _setup(r, keys, dataclasses.replace(settings, preemption=mode, batch_size=2))
    lows = [_running(r, keys, w, prod, "chat", "LOW", [f"GPU-host-{h}-{i}"]) for h in ("a", "b") for i in range(4)]
    r.zrem(keys.queue(Priority.LOW), *lows)  # leased: out of the queue, as a dispatch leaves them
    free = {lows[2], lows[5]}
    steps = [prod.submit({"endpoint": "chat", "service_s": 10, "priority": "LOW", "depends_on": [j]}).id
             for j in lows if j not in free]
    crit = [prod.submit({"endpoint": "chat", "service_s": 10, "priority": "CRITICAL"}).id for _ in range(2)]
    w.tick()
    cut = {e["job"] for e in _preempted(r, keys)}
    assert cut and cut <= free
    assert all(r.hget(keys.job(j), "state") == "leased" for j in lows if j not in free)
    assert all(r.hget(keys.job(j), "state") == "queued" for j in steps)
    assert {c.job_id for c in sent} <= set(crit)
