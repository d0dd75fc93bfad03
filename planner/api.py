"""``plan(batch, fleet_state, policy) -> Plan``: the one entry point of the planner.

Policies are registered by name in :data:`POLICIES`; the live planner worker and the
simulator call :func:`plan` and nothing else. Every policy returns a plan that went
through :func:`planner.evaluator.evaluate` (``objective`` = Σ w_j (C_j − r_j)).

Names: ``fifo``, ``min-evict``, ``wspt`` (fixed baselines, planner/greedy.py),
``portfolio`` (best of the greedy members), ``cpsat`` (portfolio + CP-SAT improver,
planner/cpsat.py) and ``default`` (= ``cpsat``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.errors import PlannerError
from planner import greedy
from planner.model import FleetState, Plan, PlanJob

Policy = Callable[[Sequence[PlanJob], FleetState], Plan]

POLICIES: dict[str, Policy] = {
    "fifo": greedy.fifo,
    "min-evict": greedy.min_evict,
    "wspt": greedy.wspt,
    "portfolio": greedy.portfolio,
}
try:  # CP-SAT is optional at import time (ortools is a dependency, but keep the greedy usable)
    from planner.cpsat import cpsat_policy

    POLICIES["cpsat"] = cpsat_policy
    POLICIES["default"] = cpsat_policy
except ImportError:  # pragma: no cover
    POLICIES["default"] = greedy.portfolio

DEFAULT_POLICY = "default"


def plan(batch: Sequence[PlanJob], state: FleetState, policy: str = DEFAULT_POLICY) -> Plan:
    """Plan ``batch`` on ``state`` with the named policy.

    Raises:
        PlannerError: unknown policy name.
    """
    try:
        fn = POLICIES[policy]
    except KeyError:
        raise PlannerError(f"unknown policy {policy!r}; known: {', '.join(sorted(POLICIES))}") from None
    if not batch:
        return Plan(policy=policy, assignments=[])
    return fn(batch, state)
