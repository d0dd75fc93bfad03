"""Job states and the transitions the store's scripts may make between them.

:class:`JobState` is a ``str`` enum whose values are the strings stored in ``P:job:{id}``'s
``state`` field (and shown in reports), so stored data stays byte-identical to the bare
strings used before. :data:`TRANSITIONS` is the table every Lua script of
:mod:`makespan.store` is checked against (``tests/store/test_transitions.py``): each script
names its transitions in its header (``-- Transitions: queued -> leased``) and may write
only those.

Part of the core (with :mod:`makespan.priorities` and :mod:`makespan.errors`): it imports
nothing from makespan, and every layer may import it. :mod:`makespan.store.states` and
:mod:`makespan.store` re-export its names; :mod:`makespan.models` re-exports
``FINAL_STATES``.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    """The state of a job record (``P:job:{id}`` field ``state``)."""

    QUEUED = "queued"        # in its priority queue (P:queue:{level}), waiting for a lease
    DELAYED = "delayed"      # on P:delayed until its due time (delay_s or a retry backoff)
    LEASED = "leased"        # holds a GPU lease; its phases run on a GPU worker
    RUNNING = "running"      # leased and in its execute phase
    COMPLETED = "completed"  # final
    FAILED = "failed"        # final
    CANCELLED = "cancelled"  # final

    def __str__(self) -> str:
        return self.value

    @property
    def final(self) -> bool:
        """A job in a final state never changes again."""
        return self in _FINAL


_FINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})

#: The states a job in each state may move to (``None``: no record yet, i.e. a submit).
#: A final state has no way out.
TRANSITIONS: dict[JobState | None, frozenset[JobState]] = {
    None: frozenset({JobState.QUEUED, JobState.DELAYED}),
    JobState.QUEUED: frozenset({JobState.LEASED, JobState.CANCELLED}),
    JobState.DELAYED: frozenset({JobState.QUEUED, JobState.CANCELLED}),
    JobState.LEASED: frozenset({JobState.RUNNING, JobState.QUEUED, JobState.DELAYED, JobState.COMPLETED,
                                JobState.FAILED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.QUEUED, JobState.DELAYED, JobState.COMPLETED, JobState.FAILED,
                                 JobState.CANCELLED}),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}

#: The final states' values, in the order reports list them.
FINAL_STATES: tuple[str, ...] = tuple(state.value for state in JobState if state.final)


def allowed(source: JobState | None, target: JobState) -> bool:
    """Whether a job in ``source`` (``None``: not written yet) may move to ``target``."""
    return target in TRANSITIONS[source]
