"""``plan(batch, fleet_state, policy) -> Plan``: the one entry point of the planner.

Policies are registered by name in :data:`POLICIES`; the live planner worker and the
simulator call :func:`plan` and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.errors import PlannerError
from planner.list_schedule import fifo_order, list_schedule, wspt_order
from planner.model import FleetState, Plan, PlanJob

Policy = Callable[[Sequence[PlanJob], FleetState], Plan]


def _wspt(batch: Sequence[PlanJob], state: FleetState) -> Plan:
    return list_schedule("wspt", wspt_order(batch, state.endpoints), state)


def _fifo(batch: Sequence[PlanJob], state: FleetState) -> Plan:
    return list_schedule("fifo", fifo_order(batch), state)


POLICIES: dict[str, Policy] = {"wspt": _wspt, "fifo": _fifo}


def plan(batch: Sequence[PlanJob], state: FleetState, policy: str = "wspt") -> Plan:
    """Plan ``batch`` on ``state`` with the named policy.

    Raises:
        PlannerError: unknown policy name.
    """
    try:
        fn = POLICIES[policy]
    except KeyError:
        raise PlannerError(f"unknown policy {policy!r}; known: {', '.join(sorted(POLICIES))}") from None
    return fn(batch, state)
