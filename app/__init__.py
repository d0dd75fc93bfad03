"""makespan: schedules multi-step GPU workloads on a fleet of GPU hosts.

The public API, in one import::

    import makespan

    @makespan.workload(endpoint="judge")          # in a module GPU workers load
    def judge(ctx, prompts):
        return ctx.requests(prompts)

    client = makespan.connect()                   # MAKESPAN_REDIS_URL by default
    job = client.submit("judge", ["Is 7 prime?"])
    job.result(timeout_s=600)

Names: :func:`connect`, :class:`Client`, :class:`Job` (:mod:`makespan.client`);
:func:`workload`, :class:`WorkloadDef` (:mod:`makespan.registry`);
:class:`WorkloadContext` (:mod:`makespan.workers.functions`); the errors
:class:`MakespanError`, :class:`ValidationError`, :class:`WorkloadError`,
:class:`JobCancelled`, :class:`JobFailed`, :class:`ResultTimeout`, :class:`NotFoundError`, :class:`ResultExpired`,
:class:`StoreError`, :class:`SubmitOutcomeUnknown`, :class:`RedisUnreachable`, :class:`RedisAuthFailed` (:mod:`makespan.errors`); :class:`Priority`. They are imported on
first use, so ``import makespan.planner`` stays free of Redis and Celery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "connect": "makespan.client", "Client": "makespan.client", "Job": "makespan.client",
    "workload": "makespan.registry", "WorkloadDef": "makespan.registry",
    "WorkloadContext": "makespan.workers.functions",
    "Priority": "makespan.models",
    "MakespanError": "makespan.errors", "ValidationError": "makespan.errors", "WorkloadError": "makespan.errors",
    "JobCancelled": "makespan.errors", "JobFailed": "makespan.errors", "ResultTimeout": "makespan.errors",
    "NotFoundError": "makespan.errors", "ResultExpired": "makespan.errors",
    "SubmitOutcomeUnknown": "makespan.errors", "StoreError": "makespan.errors",
    "RedisUnreachable": "makespan.errors", "RedisAuthFailed": "makespan.errors",
}
# a literal list, so type checkers see these names as exported (mypy --strict refused
# ``makespan.connect`` with ``sorted(_EXPORTS)``); tests/app/test_public_api.py checks it
# lists _EXPORTS
__all__ = [
    "Client", "Job", "JobCancelled", "JobFailed", "MakespanError", "NotFoundError", "Priority", "RedisAuthFailed",
    "RedisUnreachable", "ResultExpired", "ResultTimeout", "StoreError", "SubmitOutcomeUnknown", "ValidationError",
    "WorkloadContext", "WorkloadDef", "WorkloadError", "connect", "workload",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and editors
    from makespan.client import Client as Client, Job as Job, connect as connect
    from makespan.errors import (JobCancelled as JobCancelled, JobFailed as JobFailed, MakespanError as MakespanError,
                                 NotFoundError as NotFoundError, RedisAuthFailed as RedisAuthFailed,
                                 RedisUnreachable as RedisUnreachable, ResultExpired as ResultExpired,
                                 ResultTimeout as ResultTimeout, StoreError as StoreError,
                                 SubmitOutcomeUnknown as SubmitOutcomeUnknown, ValidationError as ValidationError,
                                 WorkloadError as WorkloadError)
    from makespan.models import Priority as Priority
    from makespan.registry import WorkloadDef as WorkloadDef, workload as workload
    from makespan.workers.functions import WorkloadContext as WorkloadContext


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'makespan' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
