"""The endpoint instance registry in Redis: what the health observer probes.

Keys (see :mod:`makespan.keys`): ``P:instance:{id}`` (hash: the fields of
:class:`makespan.workers.drivers.base.Instance`, ``gpus`` as JSON, plus ``state``),
``P:instances`` (set of live ids) and ``P:gpu_instances:{uuid}`` (the ids on one GPU: the
index :func:`instances_on` reads, so a phase looks at the instances on its own GPUs in two
round trips, not at every instance of the fleet; written in the same transaction as the
hash, rebuilt by :func:`reindex_instances` when a GPU worker starts). The GPU worker registers an instance the moment its
process is spawned, as ``starting`` (so no stop, kill or crash of the worker can leave an
untracked process on a GPU), as ``running`` once its health check passes, as ``asleep``
while it sleeps (sleep mode: registered, not serving, not probed, not in
``P:resident:{uuid}``; ``sleep_level`` says how), and retires it (:func:`retire_instance`):
``stopping`` while its processes are stopped, unregistered only once none is left, so an
instance whose stop fails or is cut short (its GPU worker killed mid-stop) stays recorded
for the next start phase on its GPUs or the orphan sweep (:mod:`makespan.workers.orphans`)
to finish; the observer probes only ``running`` ones and replaces a failed one.
Every write accepts an optional pipeline, so a phase change and its bookkeeping can
commit together.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import redis

from makespan.errors import StoreError, ValidationError
from makespan.keys import Keys
from makespan.store.scripts import script as store_script
from makespan.workers.drivers.base import Instance, StopReport


# waking: a GPU worker wakes it for a lease (a start phase); another lease's start treats it
# as a leftover (stops it), not as a sleeper to keep. stopping: its processes are being
# stopped (retire_instance); a stop that failed or was cut short leaves it so, for a later
# stop to finish (a start phase's leftovers, the orphan sweep)
INSTANCE_STATES = ("starting", "running", "asleep", "waking", "failed", "stopping")


def _encode(instance: Instance, state: str) -> dict[str, str]:
    out = {}
    for k, v in instance.to_dict().items():
        if v is None:
            continue
        out[k] = json.dumps(v) if k == "gpus" else (str(int(v)) if isinstance(v, bool) else str(v))
    out["state"] = state
    return out


def register_instance(r: redis.Redis, keys: Keys, instance: Instance, state: str = "running",
                      pipe: Any = None) -> None:
    """Record ``instance`` as live (``state``: ``starting``, ``running``, ``asleep`` or ``failed``)."""
    p = pipe if pipe is not None else r.pipeline()
    p.delete(keys.instance(instance.id))
    p.hset(keys.instance(instance.id), mapping=_encode(instance, state))
    p.sadd(keys.instances, instance.id)
    for gpu in instance.gpus:
        p.sadd(keys.gpu_instances(gpu), instance.id)
    if pipe is None:
        try:
            p.execute()
        except redis.RedisError as e:
            raise StoreError(f"register instance {instance.id}: {e}") from e


def set_instance_state(r: redis.Redis, keys: Keys, instance_id: str, state: str, pipe: Any = None,
                       **fields: Any) -> None:
    """Set a registered instance's ``state`` (one of :data:`INSTANCE_STATES`) and
    ``fields`` (e.g. ``sleep_level``); nothing when the instance is not registered.

    Raises:
        ValidationError: an unknown state. StoreError: Redis failed."""
    if state not in INSTANCE_STATES:
        raise ValidationError("state", state, f"instance state must be one of {', '.join(INSTANCE_STATES)}")
    mapping = {"state": state, **{k: str(v) for k, v in fields.items()}}
    args = [x for kv in mapping.items() for x in kv]
    script = store_script(r, "instance_set_if_exists")  # HSET only while the hash exists
    if pipe is not None:  # redis-py loads the script when the pipeline runs
        script(keys=[keys.instance(instance_id)], args=args, client=pipe)
        return
    try:
        script(keys=[keys.instance(instance_id)], args=args)
    except redis.RedisError as e:
        raise StoreError(f"set state of instance {instance_id}: {e}") from e


def retire_instance(r: redis.Redis, keys: Keys, instance: Instance,
                    stop: Callable[[Instance], StopReport | None]) -> StopReport | None:
    """Stop ``instance`` with ``stop`` (its driver's ``stop``) and forget it only once
    nothing of it runs: it is first marked ``stopping`` with this process as its
    ``owner_pid`` (the observer probes only ``running`` ones, so the stop is no failure to
    it; if this process dies mid-stop, the orphan sweep of the host's next GPU worker sees
    its owner gone and finishes the stop), then stopped, then unregistered when ``stop``
    returned and its report left no process alive (:attr:`StopReport.left` empty). A
    ``stop`` that raises, or leaves a process, keeps the record ``stopping``: the next start
    phase on its GPUs stops it again as a leftover, the sweep when its owner is gone.
    Returns ``stop``'s report.

    Raises:
        whatever ``stop`` raises (the record kept ``stopping``). StoreError: Redis failed
            (before the stop: nothing stopped; after it: the record kept ``stopping``)."""
    set_instance_state(r, keys, instance.id, "stopping", owner_pid=os.getpid())
    report = stop(instance)
    if report is not None and report.left:
        return report  # a process outlived SIGKILL (uninterruptible sleep): kept for a later stop
    unregister_instance(r, keys, instance.id, gpus=instance.gpus)
    return report


def unregister_instance(r: redis.Redis, keys: Keys, instance_id: str, pipe: Any = None,
                        gpus: Sequence[str] | None = None) -> None:
    """Forget an instance (idempotent). ``gpus``: its GPUs (UUIDs), to drop it from their
    index sets; None: read from its hash first (one more round trip).

    Raises:
        StoreError: Redis failed."""
    if gpus is None:
        try:
            raw = r.hget(keys.instance(instance_id), "gpus")
        except redis.RedisError as e:
            raise StoreError(f"unregister instance {instance_id}: {e}") from e
        gpus = json.loads(raw) if raw else []
    p = pipe if pipe is not None else r.pipeline()
    p.srem(keys.instances, instance_id)
    p.delete(keys.instance(instance_id))
    for gpu in gpus:
        p.srem(keys.gpu_instances(gpu), instance_id)
    if pipe is None:
        try:
            p.execute()
        except redis.RedisError as e:
            raise StoreError(f"unregister instance {instance_id}: {e}") from e


def _decode(h: dict[str, str]) -> tuple[Instance, str]:
    d: dict[str, Any] = dict(h)
    state = d.pop("state", "running")
    d["gpus"] = json.loads(d.get("gpus", "[]"))
    for k in ("pid", "port", "owner_pid"):
        if k in d:
            d[k] = int(d[k])
    for k in ("time_scale", "started_at"):
        if k in d:
            d[k] = float(d[k])
    d["stopped"] = d.get("stopped") in ("1", "True")
    level = d.pop("sleep_level", None)  # kept in the hash after a wake: only a sleeper's counts
    d["sleep_level"] = int(level) if state in ("asleep", "waking") and level in ("1", "2") else None
    return Instance.from_dict(d), state


def _rows(r: redis.Redis, keys: Keys, what: str, gpus: Sequence[str] | None = None) -> list[dict[str, str]]:
    """The hashes of every registered instance, or (``gpus``) of those on any of ``gpus``
    through the per-GPU index: one round trip after the id set."""
    try:
        ids = sorted(r.smembers(keys.instances) if gpus is None else r.sunion([keys.gpu_instances(g) for g in gpus]))
        pipe = r.pipeline(transaction=False)
        for i in ids:
            pipe.hgetall(keys.instance(i))
        return [h for h in pipe.execute() if h] if ids else []
    except redis.RedisError as e:
        raise StoreError(f"{what}: {e}") from e


def _pairs(rows: list[dict[str, str]], with_state: bool) -> list:
    """``rows`` decoded, sorted by endpoint, then id: instances, or (``with_state``)
    ``(Instance, state)`` pairs."""
    pairs = sorted((_decode(h) for h in rows), key=lambda p: (p[0].endpoint, p[0].id))
    return pairs if with_state else [p[0] for p in pairs]


def decode_instances(rows: Sequence[dict[str, str]], with_state: bool = False) -> list:
    """Registry hashes (field -> value, as Redis holds them; e.g. those
    :meth:`makespan.store.JobStore.begin_warm` read) decoded as :func:`instances_on`
    returns them: instances sorted by endpoint, then id, or (``with_state``)
    ``(Instance, state)`` pairs."""
    return _pairs(list(rows), with_state)


def instances_on(r: redis.Redis, keys: Keys, gpus: Sequence[str], with_state: bool = False) -> list:
    """The live instances on any of ``gpus`` (UUIDs), as :func:`list_instances` returns
    them (sorted by endpoint, then id; ``with_state``: ``(Instance, state)`` pairs), read
    through the per-GPU index: two round trips whatever the fleet's size.

    Raises:
        StoreError: Redis failed."""
    if not gpus:
        return []
    return _pairs(_rows(r, keys, f"list instances on {', '.join(gpus)}", gpus), with_state)


def reindex_instances(r: redis.Redis, keys: Keys) -> int:
    """Add every registered instance to the index sets of its GPUs (idempotent; instances
    registered by a version without the index). Returns how many instances it indexed.

    Raises:
        StoreError: Redis failed."""
    return index_instances(r, keys, [_decode(h)[0] for h in _rows(r, keys, "reindex instances")])


def index_instances(r: redis.Redis, keys: Keys, instances: Sequence[Instance]) -> int:
    """Add ``instances`` (as a registry read returned them) to the index sets of their
    GPUs, each only while it is still registered (``index_if_exists.lua``: one unregistered
    since the read leaves no id behind); one round trip. Called by every GPU worker at start
    (:func:`reindex_instances`) and by the observer every probe cycle, so instances that a
    GPU worker of a version without the index registers (a rolling upgrade) are found by
    the phases within a cycle. Returns how many were still registered.

    Raises:
        StoreError: Redis failed."""
    if not instances:
        return 0
    script = store_script(r, "index_if_exists")
    pipe = r.pipeline(transaction=False)
    for inst in instances:
        script(keys=[keys.instance(inst.id), *(keys.gpu_instances(g) for g in inst.gpus)], args=[inst.id], client=pipe)
    try:
        return sum(int(x) for x in pipe.execute())
    except redis.RedisError as e:
        raise StoreError(f"index instances: {e}") from e


def list_instances(r: redis.Redis, keys: Keys, with_state: bool = False) -> list:
    """Live instances (sorted by endpoint, then id); with ``with_state`` a list of
    ``(Instance, state)`` pairs."""
    return _pairs(_rows(r, keys, "list instances"), with_state)


def list_sleepers(r: redis.Redis, keys: Keys) -> list[tuple[Instance, int | None]]:
    """The instances ``asleep`` now (sorted by endpoint, then id), each with the sleep level
    (1 or 2) the GPU worker put it to sleep at (its ``sleep_level`` field, written by
    :func:`set_instance_state` when it slept); None where none was recorded.

    Raises:
        StoreError: Redis failed."""
    return _sleepers(_rows(r, keys, "list sleepers"))


def sleepers_on(r: redis.Redis, keys: Keys, gpus: Sequence[str]) -> list[tuple[Instance, int | None]]:
    """:func:`list_sleepers` of the instances on any of ``gpus`` (UUIDs), read through the
    per-GPU index (:func:`instances_on`).

    Raises:
        StoreError: Redis failed."""
    if not gpus:
        return []
    return _sleepers(_rows(r, keys, f"list sleepers on {', '.join(gpus)}", gpus))


def _sleepers(rows: list[dict[str, str]]) -> list[tuple[Instance, int | None]]:
    out = []
    for h in rows:
        if h.get("state") != "asleep":
            continue
        inst = _decode(h)[0]
        out.append((inst, inst.sleep_level))
    return sorted(out, key=lambda p: (p[0].endpoint, p[0].id))
