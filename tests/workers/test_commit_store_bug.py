"""A phase's commit (:meth:`PhaseRunner.commit`) raises a Redis error that is a bug at once.

Before, every Redis error of the commit was retried with backoff until the lease TTL ran
out, a bug too (:func:`makespan.redis_conn.is_store_bug`: a script that raised,
``WRONGTYPE``): each try failed the same way, the job's GPUs stayed held for the TTL, and
only then did the error reach :meth:`PhaseRunner.guarded`, which fails the job. Now the bug
is raised on the first try; an outage (a connection error) is still retried.

Real Redis; the fenced script is the real one (its calls are counted, not replaced).
"""

from __future__ import annotations

import pytest

from makespan.errors import StoreError
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import is_store_bug
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner
from tests.conftest import FLEET_TOML

GPU = "GPU-host-a-3"


def test_a_commit_that_hits_a_store_bug_raises_on_its_first_try(r, keys, settings):
    fleet = load_fleet(FLEET_TOML)
    job_id = Producer(r, keys, fleet, settings).submit({"endpoint": "embed", "service_s": 10}).id
    priority = r.hget(keys.job(job_id), "priority")
    lease = LeaseStore(r, keys).acquire("L1", (GPU,), settings.lease_ttl_s, job_id=job_id, kind="job",
                                        holder="host-a", queue=keys.queue(priority))
    assert lease is not None
    ctx = PhaseContext("L1", lease.token, [GPU], "host-a", "job", "embed", job_id, priority, 10.0)
    runner = PhaseRunner(r, settings, fleet)
    real_fenced = runner.leases.fenced
    tries: list[int] = []
    asked: list[int] = []

    def counted(lease_arg, ops):
        tries.append(1)
        return real_fenced(lease_arg, ops)

    runner.leases.fenced = counted  # type: ignore[method-assign]
    r.set(keys.busy("L1"), "a string")  # an HSET on it is WRONGTYPE inside the fenced script: a bug
    with pytest.raises(StoreError) as raised:
        runner.commit(ctx, [("HSET", keys.busy("L1"), "field", "value")], applied=lambda: bool(asked.append(1)))
    assert is_store_bug(raised.value), raised.value
    assert len(tries) == 1, f"a store bug was retried {len(tries) - 1} times (until the lease TTL)"
    assert asked == []
    assert r.hget(keys.job(job_id), "state") == "leased"  # nothing applied: the script is atomic
