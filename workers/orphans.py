"""The GPU worker's start sweep: endpoint processes an earlier worker left on this host.

Every endpoint process is registered from the moment it is spawned (state ``starting``,
then ``running``; :mod:`makespan.workers.drivers.registry`) with ``owner_pid``, the GPU
worker process that spawned it. A worker that was SIGKILLed, or whose whole process group
was signalled during a start phase, leaves such records behind. As a GPU worker starts,
before it consumes, :func:`sweep` looks at every registered process instance of its host
whose owner is gone (not alive, and not this process):

* nothing of its process group runs (neither its leader nor a child that outlived it):
  the record (and any resident marker naming it on a GPU no lease holds) is forgotten —
  ``reason`` ``process gone``;
* it is still ``starting``: nobody will finish its start (a redelivered start phase finds
  the phase claimed and stops): its process group is stopped and the record forgotten —
  ``reason`` ``starting, its worker is gone``;
* it is ``stopping``: the worker that was stopping it died mid-stop (e.g. cut off by the
  SIGTERM bound's watchdog while a child ignored SIGTERM): its process group is stopped and
  the record forgotten — ``reason`` ``stopping, its worker is gone``;
* it is ``running`` but neither a live lease holds its GPUs nor a resident marker names it:
  nothing will use or stop it — stopped and forgotten, ``reason`` ``untracked``;
* it is ``asleep`` (sleep mode, issue 20): kept — the planner counts on waking it, and
  any worker of the host wakes it over HTTP.

Whatever its owner and driver (a simulated one too), an instance on a GPU that this
worker's fleet file does not give the host (the GPUs were swapped, or given other UUIDs,
since it started) is stopped if it runs a process and forgotten, with the resident markers
that name it — ``reason`` ``on GPUs the fleet file no longer gives the host``: nothing
plans on those GPUs, and ``makespan hosts --instances`` listed such records for good.

A running instance that a live lease still needs (its job's execute runs on this worker
next), or that its GPUs' resident markers name (a warm endpoint the planner plans on), is
kept. Each instance handled is logged as a warning and recorded as one ``endpoint_orphan``
event (``instance``, ``endpoint``, ``gpus``, ``host``, ``pid``, ``reason``, ``action``
``stopped``, ``forgotten`` or ``stop_failed``, ``killed``: pids SIGKILLed after the grace
period). An instance is forgotten only once nothing of its process group runs
(:func:`makespan.workers.drivers.registry.retire_instance`); one whose stop fails stays
recorded ``stopping``, owned by this worker (``stop_failed``), for a later stop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

import redis

from makespan import events
from makespan.errors import MakespanError
from makespan.keys import Keys
from makespan.driver_registry import DRIVERS
from makespan.workers.drivers import get_driver, process_alive
from makespan.workers.drivers.base import Instance
from makespan.workers.drivers.pids import instance_members, of_another_user
from makespan.workers.drivers.registry import list_instances, retire_instance, unregister_instance

log = logging.getLogger("makespan.orphans")


def _resident_value(inst: Instance) -> str:
    from makespan.workers.phases import instance_value

    return instance_value(inst.endpoint, inst.gpus)


def spawns_process(driver: str) -> bool:
    """True unless ``driver`` is known not to spawn processes (an unknown one, e.g. a
    plugin since uninstalled, is handled as a process: its stop fails and is logged)."""
    cls = DRIVERS.get(driver)
    return cls is None or cls.capabilities.spawns_process


def _verdict(r: redis.Redis, keys: Keys, inst: Instance, state: str) -> str | None:
    """Why ``inst`` is an orphan to handle, or None to keep it."""
    if inst.owner_pid and (inst.owner_pid == os.getpid() or process_alive(inst.owner_pid)):
        return None  # its worker runs (this one, or another on this host)
    if inst.pid and process_alive(inst.pid) and of_another_user(inst.pid):
        # another Unix user's process: neither signalled nor taken for gone (forgetting it let the next
        # job start a second copy on its GPUs); kept, and said
        log.warning("endpoint %s (instance %s, pid %s, GPUs %s): its process belongs to another Unix user; kept, "
                    "not stopped: run the GPU worker as the user that started it", inst.endpoint, inst.id,
                    inst.pid, ",".join(inst.gpus))
        return None
    if not inst.pid or not instance_members(inst.pid, inst.id, inst.gpus):  # (none alive: gone too)
        return "process gone"  # (its pid now another program's: after a reboot, or a record naming any pid)
    if state == "starting":
        return "starting, its worker is gone"
    if state == "stopping":
        return "stopping, its worker is gone"
    if state == "asleep":
        return None  # a sleeper (sleep mode) is woken over HTTP by whichever worker needs it
    leased = any(r.mget([keys.gpu(g) for g in inst.gpus]))
    resident = all(v == _resident_value(inst) for v in r.mget([keys.resident(g) for g in inst.gpus]))
    if leased or resident:
        return None
    return "untracked"


GONE_GPUS = "on GPUs the fleet file no longer gives the host"


def sweep(r: redis.Redis, keys: Keys, host: str, host_gpus: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Find, stop and forget the orphaned endpoint processes of ``host`` (module doc), and
    with ``host_gpus`` (the GPU UUIDs this worker's fleet file gives ``host``) the instances
    on other GPUs. Returns the ``endpoint_orphan`` events recorded, one per instance handled.

    Raises:
        redis.RedisError / StoreError: Redis did not answer (the caller logs it).
    """
    out = []
    known = set(host_gpus) if host_gpus is not None else None
    for inst, state in list_instances(r, keys, with_state=True):
        if inst.host != host:
            continue
        spawns = spawns_process(inst.driver)
        if known is not None and not set(inst.gpus) <= known:
            reason: str | None = GONE_GPUS
        elif not spawns:
            continue
        else:
            reason = _verdict(r, keys, inst, state)
        if reason is None:
            continue
        killed: list[int] = []
        action = "forgotten"
        if reason == "process gone" or not spawns or (reason == GONE_GPUS and not (
                inst.pid and instance_members(inst.pid, inst.id, inst.gpus))):
            unregister_instance(r, keys, inst.id, gpus=inst.gpus)
        else:
            try:
                report = retire_instance(r, keys, inst, get_driver(inst.driver).stop)
                killed = [pid for pid, _cmd in getattr(report, "killed", ())]
                action = "stop_failed" if report is not None and report.left else "stopped"
            except MakespanError as e:  # kept as stopping, this worker its owner: a later stop finishes it
                log.warning("orphan %s of %s: stop failed: %s", inst.id, inst.endpoint, e)
                action = "stop_failed"
        want = _resident_value(inst)
        for g in inst.gpus:  # a marker on a leased GPU is its holder's to change
            if r.get(keys.resident(g)) == want and not r.exists(keys.gpu(g)):
                r.delete(keys.resident(g))
        fields = {"instance": inst.id, "endpoint": inst.endpoint, "gpus": list(inst.gpus), "host": host,
                  "pid": inst.pid, "reason": reason, "action": action, "killed": killed}
        events.record(r, keys.events, "endpoint_orphan", **fields)
        log.warning("GPU worker on %s found endpoint %s (instance %s%s, GPUs %s) %s: %s; %s%s", host, inst.endpoint,
                    inst.id, f", pid {inst.pid}" if inst.pid else "", ",".join(inst.gpus),
                    "it cannot run" if reason == GONE_GPUS else "left by a worker that is gone", reason, action,
                    f" (SIGKILLed {killed})" if killed else "")
        out.append({"kind": "endpoint_orphan", **fields})
    return out
