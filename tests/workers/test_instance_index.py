"""The per-GPU instance index (workers/drivers/registry.py, ``instances_on``): a phase reads
the endpoint instances on its own GPUs in two round trips instead of every instance of the
fleet (a function job read them all twice, 2 × (1 + N) commands with N instances). Real
Redis; the index must always list what a full scan of the registry lists."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from makespan.keys import Keys
from makespan.workers.drivers.base import Instance
from makespan.models import load_fleet
from makespan.workers.drivers.registry import (index_instances, instances_on, list_instances, register_instance,
                                               reindex_instances, set_instance_state, unregister_instance)
from makespan.workers.observer import Observer
from tests.conftest import FLEET_TOML

GPUS = [f"GPU-{i}" for i in range(6)]


def _inst(iid: str, endpoint: str, gpus: list[str]) -> Instance:
    return Instance(endpoint=endpoint, gpus=gpus, driver="sim", host="h", id=iid)


def _scan(r, keys: Keys, gpus: list[str]) -> list[tuple[str, str]]:
    """What the old code did: every instance, filtered by GPU overlap."""
    return [(i.id, state) for i, state in list_instances(r, keys, with_state=True) if set(i.gpus) & set(gpus)]


def test_instances_on_reads_only_the_instances_on_those_gpus(r, keys):
    register_instance(r, keys, _inst("a", "chat", ["GPU-0"]))
    register_instance(r, keys, _inst("b", "big", ["GPU-1", "GPU-2"]), state="starting")
    register_instance(r, keys, _inst("c", "chat", ["GPU-3"]), state="asleep")
    assert [i.id for i in instances_on(r, keys, ["GPU-2"])] == ["b"]
    assert [(i.id, s) for i, s in instances_on(r, keys, ["GPU-0", "GPU-1", "GPU-3"], with_state=True)] == [
        ("b", "starting"), ("a", "running"), ("c", "asleep")]  # sorted by endpoint, then id
    assert instances_on(r, keys, ["GPU-5"]) == [] and instances_on(r, keys, []) == []
    unregister_instance(r, keys, "b")  # gpus read from its hash
    assert instances_on(r, keys, ["GPU-1", "GPU-2"]) == []
    assert not r.exists(keys.gpu_instances("GPU-1")) and not r.exists(keys.gpu_instances("GPU-2"))


def test_a_gpu_worker_start_indexes_instances_registered_without_the_index(r, keys):
    """An instance an older version registered (hash and id set only) is invisible to the
    index until :func:`reindex_instances` (run by every GPU worker before it consumes)."""
    old = _inst("old", "chat", ["GPU-4"])
    r.hset(keys.instance(old.id), mapping={"endpoint": "chat", "gpus": json.dumps(old.gpus), "driver": "sim",
                                           "host": "h", "id": old.id, "state": "running"})
    r.sadd(keys.instances, old.id)
    assert instances_on(r, keys, ["GPU-4"]) == []
    assert reindex_instances(r, keys) == 1
    assert [i.id for i in instances_on(r, keys, ["GPU-4"])] == ["old"]
    assert reindex_instances(r, keys) == 1 and r.smembers(keys.gpu_instances("GPU-4")) == {"old"}  # idempotent


def _old_version_instance(r, keys: Keys, iid: str, gpu: str, state: str = "running") -> Instance:
    """An instance registered as a version without the index does (hash and id set only)."""
    inst = _inst(iid, "chat", [gpu])
    r.hset(keys.instance(inst.id), mapping={"endpoint": "chat", "gpus": json.dumps(inst.gpus), "driver": "sim",
                                            "host": "h", "id": inst.id, "state": state})
    r.sadd(keys.instances, inst.id)
    return inst


def test_an_instance_unregistered_after_the_read_is_not_indexed(r, keys):
    """The read and the index write are apart: one unregistered in between leaves no id
    behind (index_if_exists.lua), where a plain SADD would leave a stale one."""
    read = [_old_version_instance(r, keys, "gone", "GPU-5"), _old_version_instance(r, keys, "kept", "GPU-5")]
    unregister_instance(r, keys, "gone")
    assert index_instances(r, keys, read) == 1
    assert r.smembers(keys.gpu_instances("GPU-5")) == {"kept"}


def test_the_observer_indexes_a_rolling_upgrade_s_instances_every_cycle(r, keys):
    """A GPU worker of the previous version registers an instance after the new GPU workers
    started (their start-time reindex missed it): the observer's next probe cycle indexes it."""
    obs = Observer(r, keys, load_fleet(FLEET_TOML), probe_interval_s=0.05)
    try:
        _old_version_instance(r, keys, "late", "GPU-3", state="asleep")  # asleep: not probed, only indexed
        assert instances_on(r, keys, ["GPU-3"]) == []
        obs.probe_once()
        assert [i.id for i in instances_on(r, keys, ["GPU-3"])] == ["late"]
    finally:
        obs.close()


OPS = st.lists(st.tuples(st.sampled_from(["register", "unregister", "unregister_read", "state"]),
                         st.integers(0, 5), st.lists(st.sampled_from(GPUS), min_size=1, max_size=3, unique=True),
                         st.sampled_from(["starting", "running", "asleep", "failed"])),
               max_size=25)


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, probe=st.lists(st.sampled_from(GPUS), max_size=4, unique=True))
def test_the_index_lists_what_a_full_scan_lists(r, keys, ops, probe):
    """Random registers (a re-register may move an instance to other GPUs, as the
    observer's replacement does: unregister, then register), unregisters (with and without
    the GPUs given) and state changes: on every GPU set the index equals the full scan."""
    for k in r.scan_iter(f"{keys.prefix}:*"):
        r.delete(k)
    live: dict[str, list[str]] = {}
    for op, n, gpus, state in ops:
        iid = f"i{n}"
        if op == "register":
            if iid in live:
                unregister_instance(r, keys, iid, gpus=live[iid])
            register_instance(r, keys, _inst(iid, f"ep{n % 2}", gpus), state=state)
            live[iid] = gpus
        elif op == "unregister":
            unregister_instance(r, keys, iid, gpus=live.pop(iid, []))
        elif op == "unregister_read":
            live.pop(iid, None)
            unregister_instance(r, keys, iid)
        else:
            set_instance_state(r, keys, iid, state if state != "starting" else "running")
    for gpus in [probe, *([g] for g in GPUS)]:
        assert [(i.id, s) for i, s in instances_on(r, keys, gpus, with_state=True)] == _scan(r, keys, gpus)
    indexed = {k for g in GPUS for k in r.smembers(keys.gpu_instances(g))}
    assert indexed == set(live)  # no id left behind in an index set
