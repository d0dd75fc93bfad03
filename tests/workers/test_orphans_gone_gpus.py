"""After a host's GPUs got new UUIDs in the fleet file, `makespan hosts --instances` listed
instances on the old UUIDs for good (6 GPUs' worth on a 4-GPU host), through worker
restarts, and their resident markers and GPU instance sets stayed in Redis (a fleet-change
operator helper): the GPU worker's start sweep skipped simulated instances and kept any a
resident marker named. It now forgets an instance on GPUs its fleet file does not give the
host, simulated or not, with its markers; the others are kept as before. Real Redis."""

from __future__ import annotations

from makespan.workers.drivers.base import Instance
from makespan.workers.drivers.registry import list_instances, register_instance
from makespan.workers.orphans import GONE_GPUS, sweep
from makespan.workers.phases import instance_value


def test_the_start_sweep_forgets_instances_on_gpus_the_fleet_no_longer_gives_the_host(r, keys):
    old = Instance(endpoint="chat", gpus=["GPU-old-0", "GPU-old-1"], driver="simulated", host="host-b")
    kept = Instance(endpoint="embed", gpus=["GPU-new-0"], driver="simulated", host="host-b")
    elsewhere = Instance(endpoint="chat", gpus=["GPU-a-0"], driver="simulated", host="host-a")
    for inst in (old, kept, elsewhere):
        register_instance(r, keys, inst)
        for gpu in inst.gpus:
            r.set(keys.resident(gpu), instance_value(inst.endpoint, inst.gpus))
    handled = sweep(r, keys, "host-b", ["GPU-new-0", "GPU-new-1"])
    assert [(e["instance"], e["reason"], e["action"]) for e in handled] == [(old.id, GONE_GPUS, "forgotten")]
    assert sorted(inst.id for inst in list_instances(r, keys)) == sorted([kept.id, elsewhere.id])
    assert not r.exists(keys.resident("GPU-old-0"), keys.resident("GPU-old-1"), keys.gpu_instances("GPU-old-0"))
    assert r.get(keys.resident("GPU-new-0")) == instance_value("embed", ["GPU-new-0"])
    assert sweep(r, keys, "host-b") == []  # without the fleet's GPUs: simulated instances are not looked at
