"""One exception root for makespan, translated at the boundaries.

Every error raised on purpose by makespan derives from :class:`MakespanError`.
redis-py errors are wrapped (``raise StoreError(...) from e``) at the store layer so
that callers never need to import redis to handle a failure.
"""

from __future__ import annotations

from typing import Any


class MakespanError(Exception):
    """Root of every makespan error."""


class ValidationError(MakespanError):
    """Input (a job, a fleet file, a CLI argument) is invalid; nothing was changed.

    Attributes:
        field: dotted path of the offending field, e.g. ``"endpoints.coder.tensor_parallel"``.
        value: the offending value (already redacted when it may hold a secret).
    """

    def __init__(self, field: str, value: Any, reason: str):
        self.field = field
        self.value = value
        self.reason = reason
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        super().__init__(f"{field}: {reason} (got {shown})")


class NotFoundError(MakespanError):
    """A job, lease or workload id is unknown."""


class PlannerError(MakespanError):
    """The planner could not produce a plan (never raised for a merely infeasible job:
    those are rejected at submit time)."""


class LeaseError(MakespanError):
    """A lease could not be acquired, renewed or released as asked."""


class StaleFencingToken(LeaseError):
    """The caller's fencing token is older than the GPU's current lease: stop acting."""


class PhaseError(MakespanError):
    """A phase (evict, start endpoint, execute, clear, restore) failed."""


class PhaseCancelled(PhaseError):
    """A phase stopped early because its job's cancel was requested (the job ends
    ``cancelled``, not ``failed``)."""


class StoreError(MakespanError):
    """Redis could not be reached or answered an error; wraps the redis-py exception."""
