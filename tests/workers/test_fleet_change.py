"""The fleet changing under a running system (found by a review): a planner restarted with a
fleet file that no longer has an endpoint (or a helper endpoint) that queued jobs need, or
whose endpoint's tensor-parallel size changed so that no aligned GPU group holds it, and a
job that fits only a GPU group the planner never forms.

Real planner ticks (``PlannerWorker.tick``, dispatch captured) on the real Redis, and the
GPU worker's phase code (``run_phases``) for the job that runs. Before the fix, the tick
raised (``KeyError: 'b'`` in the demand share, ``ValueError: no GPU group fits`` in the
portfolio): the planner's run loop catches only Redis errors, so the planner process, and
every standby that took over after it, ended at its first tick, and no job of the fleet was
planned any more. The job now gets cancelled with the reason (the same rule as a submit's,
:meth:`makespan.models.FleetSpec.placement_problem`), and the rest is planned.
"""

from __future__ import annotations

import tomllib

import pytest

from makespan.client import Client
from makespan.errors import JobCancelled, ValidationError
from makespan.models import fleet_version, parse_fleet
from makespan.producer import Producer
from makespan.workers.phases import PhaseRunner
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.warm import run_phases
from tests.live import all_events

OLD = """
name = "before"
[[hosts]]
name = "h1"
gpus = [{ uuid = "GPU-h1-0", memory_mib = 80000, index = 0 }, { uuid = "GPU-h1-1", memory_mib = 40000, index = 1 }]
[endpoints.a]
model = "a"
memory_mib_per_gpu = 10000
cold_start_s = 5
evict_s = 1
[endpoints.b]
model = "b"
memory_mib_per_gpu = 60000
cold_start_s = 5
evict_s = 1
[endpoints.c]
model = "c"
memory_mib_per_gpu = 10000
cold_start_s = 5
evict_s = 1
"""


def _fleet(text: str, **endpoint_changes):
    data = tomllib.loads(text)
    if endpoint_changes:
        data["name"] = "after"
    for name, change in endpoint_changes.items():
        if change is None:
            del data["endpoints"][name]
        else:
            data["endpoints"][name].update(change)
    return parse_fleet(data)


def _publish(r, keys, fleet) -> None:
    """What a planner leading with ``fleet`` writes for producers (P:fleet, its version)."""
    r.mset({keys.fleet: fleet.model_dump_json(), keys.fleet_version: fleet_version(fleet)})


def _planner(r, settings, fleet, sent):
    w = PlannerWorker(r, settings, fleet, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = str(r.incr(w.keys.planner_fence))
    return w


def test_a_fleet_whose_endpoint_fits_no_host_is_refused_at_load():
    """b made TP-2 needs 60000 MiB on both GPUs of h1 (80000 and 40000): the planner took the
    file and cancelled every queued b job (an SRE's typo); a pool's endpoints were already
    checked so. The file is refused, naming the endpoint, before anything is cancelled."""
    with pytest.raises(ValidationError) as refused:
        _fleet(OLD, b={"tensor_parallel": 2}, c=None)
    assert refused.value.field == "endpoints.b.memory_mib_per_gpu" and "aligned group" in str(refused.value)


@pytest.mark.parametrize(("change", "gone"), [
    ({"b": None, "c": None}, "unknown endpoint"),         # endpoints removed from the fleet file
], ids=["endpoint_removed"])
def test_a_planner_restarted_on_a_changed_fleet_cancels_the_jobs_it_can_never_run(r, keys, settings, change,
                                                                                    gone):
    old = _fleet(OLD)
    _publish(r, keys, old)
    prod = Producer(r, keys, old, settings)
    stranded = prod.submit({"endpoint": "b", "service_s": 5}).id
    helped = prod.submit({"endpoint": "a", "service_s": 5, "helpers": ["c"]}).id  # its helper goes too
    fine = prod.submit({"endpoint": "a", "service_s": 5}).id

    new = _fleet(OLD, **change)
    sent: list = []
    planner = _planner(r, settings, new, sent)  # the planner restarted with the new file
    planner.tick()  # raised before: the planner process ended here, and so did every standby
    planner.tick()

    client = Client(r, settings)
    for job_id, name in ((stranded, "'b'"), (helped, "'c'")):
        status = client.job(job_id).status()
        assert status["state"] == "cancelled", status
        with pytest.raises(JobCancelled) as why:
            client.job(job_id).result(timeout_s=1)
        assert name in str(why.value), str(why.value)
        assert "fleet" in str(why.value) and "changed" in str(why.value), str(why.value)
    assert gone in client.job(stranded).status()["reason"]
    cancelled = [e for e in all_events(r, keys) if e.get("kind") == "cancelled"]
    assert sorted(e["job"] for e in cancelled) == sorted([stranded, helped])

    # the job the new fleet can run is planned and runs through the GPU worker's phases
    assert [c.job_id for c in sent] == [fine]
    assert run_phases(PhaseRunner(r, settings, new), sent[0]) == "completed"
    assert client.job(fine).status()["state"] == "completed"
    assert r.zcard(keys.queue("NORMAL")) == 0
    assert planner.check_drain()["leases"] == 0


MISALIGNED = """
name = "mixed"
[[hosts]]
name = "h1"
gpus = [{ uuid = "GPU-m-0", memory_mib = 40000, index = 0 }, { uuid = "GPU-m-1", memory_mib = 80000, index = 1 },
        { uuid = "GPU-m-2", memory_mib = 80000, index = 2 }, { uuid = "GPU-m-3", memory_mib = 40000, index = 3 }]
[endpoints.small]
model = "small"
memory_mib_per_gpu = 10000
cold_start_s = 5
evict_s = 1
[endpoints.wide]
model = "wide"
tensor_parallel = 2
memory_mib_per_gpu = 60000
cold_start_s = 5
evict_s = 1
"""


def test_an_endpoint_that_fits_only_a_group_the_planner_never_forms_is_refused(r, keys, settings):
    """GPUs 1 and 2 have the memory of the TP-2 endpoint, but the planner's groups are the
    aligned {0,1} and {2,3}, each with a 40000 MiB GPU. The submit counted any two GPUs of
    the host and took the job; the planner then raised at every tick. Such a fleet is now
    refused at load, naming the endpoint; the same endpoint narrower runs."""
    with pytest.raises(ValidationError) as refused:
        _fleet(MISALIGNED)
    assert refused.value.field == "endpoints.wide.memory_mib_per_gpu" and "aligned" in str(refused.value)
    fleet = _fleet(MISALIGNED, wide={"memory_mib_per_gpu": 30000})
    _publish(r, keys, fleet)
    prod = Producer(r, keys, fleet, settings)
    ok = prod.submit({"endpoint": "small", "service_s": 5}).id
    sent: list = []
    _planner(r, settings, fleet, sent).tick()
    assert [c.job_id for c in sent] == [ok]


def test_an_instance_of_the_old_width_is_not_warm_after_tensor_parallel_changes(r, keys, settings):
    """a made TP-2 while its TP-1 instances sat on GPUs 0 and 1: the planner leased a job
    there as "warm" (its ETA missed an evict and a cold start); the worker stopped them
    and cold-started, as it must (an SRE's report)."""
    from makespan.workers.fleet_view import read_fleet_state
    from makespan.workers.phases import instance_value

    wider = _fleet(OLD.replace('memory_mib = 40000', 'memory_mib = 80000'), a={"tensor_parallel": 2})
    planner = _planner(r, settings, wider, [])
    old_instances = (instance_value("a", ["GPU-h1-0"]), instance_value("a", ["GPU-h1-1"]))
    state = read_fleet_state(planner.env, planner.kept, (None, None), old_instances).state
    assert state.resident == {"GPU-h1-0": None, "GPU-h1-1": None}, state.resident
    same_width = (instance_value("a", ["GPU-h1-0", "GPU-h1-1"]),) * 2
    assert read_fleet_state(planner.env, planner.kept, (None, None), same_width).state.resident == \
        {"GPU-h1-0": "a", "GPU-h1-1": "a"}
