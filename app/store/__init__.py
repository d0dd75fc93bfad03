"""The store: the job and lease lifecycle in Redis, in one place.

* every Lua script as a file of ``makespan/store/lua`` (its header names its KEYS and ARGV),
  loaded and registered once per client (:mod:`makespan.store.scripts`), with one shared
  library ``lib.lua`` (finish / requeue / delay a job, free a lease's GPUs, append an event);
* :class:`JobState` and the transitions table (re-exported from the core module
  :mod:`makespan.job_states`; also importable as :mod:`makespan.store.states`);
* the seams the live code calls: :class:`JobStore`, :class:`LeaseStore`, :class:`EventLog`;
  redis-py errors leave them as :class:`makespan.errors.StoreError`.

Layering: the store imports the core (``errors``, ``job_states``) and ``makespan.keys``,
``models``, ``settings``, ``redis_conn`` (redis errors to ``StoreError``) and ``events``
(the stream's entry format) only,
never the workers, the CLI or the client. The seams are imported lazily (PEP 562), so importing
the package for its states costs no Redis import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from makespan.job_states import FINAL_STATES, TRANSITIONS, JobState

if TYPE_CHECKING:
    from makespan.store.events import EventLog
    from makespan.store.jobs import JobStore
    from makespan.store.leases import Lease, LeaseStore

__all__ = ["FINAL_STATES", "TRANSITIONS", "EventLog", "JobState", "JobStore", "Lease", "LeaseStore"]

_LAZY = {"EventLog": "makespan.store.events", "JobStore": "makespan.store.jobs",
         "Lease": "makespan.store.leases", "LeaseStore": "makespan.store.leases"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'makespan.store' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
