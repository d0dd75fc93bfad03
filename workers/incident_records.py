"""Incident records a GPU worker's phase writes, in the health observer's format
(:mod:`makespan.workers.observer` owns the stream ``P:incidents`` and raises the rest).

A phase that finds an endpoint's process gone (a job's start phase that loads it again, or
the evict of the next job on its GPUs) records the ``process_exited`` incident an observer
would have raised: failing fast or reloading at once can remove the dead instance before
any observer probes it, and the crash must stay on record. Kept apart from the observer
module so that the phases need not import it.
"""

from __future__ import annotations

import json
import logging
import time

import redis

from makespan.keys import Keys
from makespan.workers.drivers.base import Instance

log = logging.getLogger("makespan.workers.observer")

INCIDENTS_MAX_LEN = 10_000  # P:incidents keeps about this many entries (incidents and recoveries; XADD MAXLEN ~)


def record_death_found_by_a_phase(r: redis.Redis, keys: Keys, inst: Instance, found_by: str,
                                  reloaded: bool = True) -> str:
    """Record a ``process_exited`` incident for ``inst``, whose process a GPU worker's phase
    found gone before an observer reported it (``found_by``: e.g. ``job ID's start phase``),
    in the incident format of :meth:`makespan.workers.observer.Observer._raise` (``detected_by``: ``gpu-worker``), so
    the crash stays on record although nothing may be left for an observer to see.
    ``reloaded``: the phase loads the endpoint again
    (:meth:`makespan.workers.phases.PhaseRunner._load`;
    :func:`record_recovery_by_a_phase` closes the incident); else (an evict stops what is
    left of it) the incident waits in ``P:incidents:given_up`` for the endpoint to run on
    those GPUs again (:meth:`makespan.workers.observer.Observer._close_given_up`). Returns the incident id.

    Raises:
        redis.RedisError: Redis failed."""
    from makespan import metrics

    then = "loaded again there" if reloaded else "its GPUs went to the next job (evicted)"
    now = time.time()
    rec = {"kind": "incident", "endpoint": inst.endpoint, "instance_id": inst.id, "host": inst.host,
           "gpus": json.dumps(sorted(inst.gpus)), "failure_mode": "process_exited", "detected_at": repr(now),
           "cycle": "0", "last_ok_cycle": "0", "detected_by": "gpu-worker",
           "effect": (f"endpoint {inst.endpoint} unavailable on {','.join(sorted(inst.gpus))}: its process "
                      f"(pid {inst.pid}) was gone when {found_by} needed it; {then}"),
           "agenda_context": "[]"}
    incident_id = r.xadd(keys.incidents, rec, maxlen=INCIDENTS_MAX_LEN, approximate=True)
    if not reloaded:
        r.hset(keys.incidents_given_up, incident_id,
               json.dumps({"endpoint": inst.endpoint, "gpus": sorted(inst.gpus), "since": now,
                           "old_instance_id": inst.id}))
    metrics.incident(inst.endpoint)
    log.error("incident %s: %s process_exited (%s)", incident_id, inst.endpoint, rec["effect"])
    return incident_id


def record_recovery_by_a_phase(r: redis.Redis, keys: Keys, incident_id: str, endpoint: str, new_instance_id: str,
                               since: float) -> None:
    """The ``recovered`` record of an incident :func:`record_death_found_by_a_phase` wrote,
    once the phase loaded the endpoint again (``since``: unix s the incident was written).

    Raises:
        redis.RedisError: Redis failed."""
    now = time.time()
    r.xadd(keys.incidents, {"kind": "recovery", "incident_id": incident_id, "endpoint": endpoint,
                            "outcome": "recovered", "new_instance_id": new_instance_id,
                            "detail": "loaded again by the phase that found it gone",
                            "recovered_at": repr(now), "recovery_s": repr(round(now - since, 3))},
           maxlen=INCIDENTS_MAX_LEN, approximate=True)
