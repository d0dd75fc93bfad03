"""The planner's policies as objects, in one registry (:data:`POLICY_REGISTRY`).

A :class:`Policy` carries every fact the rest of makespan needs about it: its name, the
objective its ``Plan.objective`` measures, its floor (the policy whose plan it must not
be worse than; that floor also scores plan-level preemption candidates and re-plans around
the fast lane), whether the live planner runs it through the background improver
(workers/improver.py: the floor on every tick, the policy itself off the tick), a one-line
description (CLI help and docs/planner.md are checked against it), and
``solve(batch, state, options)`` with a typed :class:`SolveOptions`.

:func:`makespan.planner.api.plan` looks a policy up here; so do the simulator, the live
planner worker, settings (``MAKESPAN_POLICY``) and the CLI help. The registry is
read-only: a benchmark that needs variants builds its own with
:meth:`PolicyRegistry.with_policies` (e.g. ``cpsat`` at 0.1 s) and passes the
:class:`Policy` objects to ``plan()`` / ``simulate()``.

The CP-SAT policies import ortools on their first solve, so reading the registry (settings,
CLI help) costs no solver import.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from makespan.errors import PlannerError
from makespan.planner import greedy
from makespan.planner.evaluator import OBJECTIVES
from makespan.planner.model import FleetState, Plan, PlanJob

DEFAULT_POLICY = "default"


@dataclass(frozen=True)
class SolveOptions:
    """What :meth:`Policy.solve` may be told besides the batch and the fleet state.

    A greedy policy ignores every field (it takes milliseconds and has no search to
    bound or seed).

    Attributes:
        time_limit_s: wall-time budget of a time-limited policy (its improver after the
            greedy floor), s; None: the policy's own :attr:`Policy.time_limit_s`.
        num_workers: CP-SAT search workers (≥ 1); None: the solver's default (1,
            deterministic).
        previous: the plan of the last planning point; a solver policy repairs it to the
            batch and starts from it when it scores better than its floor.
        preemptors: ids of the jobs whose CP-SAT windows may decide preemptions of
            ``state.running`` (only for a policy with :attr:`Policy.window_preemption`);
            None: the windows decide none.
        first_window_share: share of ``time_limit_s`` the first CP-SAT window (the one
            deciding preemptions) may use; None: the solver's default (0.25).
    """

    time_limit_s: float | None = None
    num_workers: int | None = None
    previous: Plan | None = None
    preemptors: frozenset[str] | None = None
    first_window_share: float | None = None

    def solver_arguments(self) -> dict[str, Any]:
        """The keyword arguments of a CP-SAT policy function (makespan.planner.cpsat.cpsat_policy,
        makespan.planner.tardiness_policy.tardiness_policy): the fields that are set, with
        ``preemptors`` passed as ``preemption``."""
        arguments: dict[str, Any] = {}
        if self.time_limit_s is not None:
            arguments["time_limit_s"] = self.time_limit_s
        if self.num_workers is not None:
            arguments["num_workers"] = self.num_workers
        if self.previous is not None:
            arguments["previous"] = self.previous
        if self.preemptors is not None:
            arguments["preemption"] = self.preemptors
        if self.first_window_share is not None:
            arguments["first_window_share"] = self.first_window_share
        return arguments


Solver = Callable[[Sequence[PlanJob], FleetState, SolveOptions], Plan]
"""``(batch, state, options) -> Plan``: what a :class:`Policy` runs."""


@dataclass(frozen=True)
class Policy:
    """One planner policy and the facts its callers need.

    Attributes:
        name: the name users give (``MAKESPAN_POLICY``, ``--policy``).
        objective: what its ``Plan.objective`` measures, one of
            :data:`makespan.planner.evaluator.OBJECTIVES`.
        floor: name of the policy whose plan it is never worse than; that floor scores
            plan-level preemption candidates and re-plans the other jobs around the fast
            lane. None: a fixed baseline, no plan-level preemption (the fixed rule; the
            fast lane re-plans with the policy itself).
        improver: the live planner runs it split: the floor on every tick, the policy
            itself in the background improver (workers/improver.py).
        description: one line for help texts and docs/planner.md.
        solver: ``(batch, state, options) -> Plan``.
        time_limit_s: its default wall-time budget, s, when time-limited; None: a greedy
            policy (milliseconds, no budget).
        window_preemption: its CP-SAT windows may decide preemptions themselves, and a
            plan-level preemption also solves the batch without the floor's preemptions
            (makespan.planner.api module doc).

    Raises:
        PlannerError: an objective not in :data:`makespan.planner.evaluator.OBJECTIVES`,
            ``improver`` without a floor, or a negative ``time_limit_s``.
    """

    name: str
    objective: str
    floor: str | None
    improver: bool
    description: str
    solver: Solver = field(repr=False, compare=False)
    time_limit_s: float | None = None
    window_preemption: bool = False

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise PlannerError(f"policy {self.name!r}: unknown objective {self.objective!r}; "
                               f"known: {', '.join(OBJECTIVES)}")
        if self.improver and self.floor is None:
            raise PlannerError(f"policy {self.name!r}: the live improver needs a floor to plan each tick")
        if self.time_limit_s is not None and self.time_limit_s < 0:
            raise PlannerError(f"policy {self.name!r}: time_limit_s must be >= 0, got {self.time_limit_s}")

    def solve(self, batch: Sequence[PlanJob], state: FleetState, options: SolveOptions = SolveOptions()) -> Plan:
        """The policy's plan of ``batch`` (non-empty) on ``state``, evaluated by
        :func:`makespan.planner.evaluator.evaluate` (``Plan.objective`` in :attr:`objective`).
        ``options.time_limit_s`` None: :attr:`time_limit_s`."""
        if options.time_limit_s is None and self.time_limit_s is not None:
            options = replace(options, time_limit_s=self.time_limit_s)
        return self.solver(batch, state, options)


class PolicyRegistry(Mapping[str, Policy]):
    """Policies by name, read-only, in the order they were given.

    Raises:
        PlannerError: a duplicate name, or a floor that is not in the registry."""

    def __init__(self, policies: Iterable[Policy]):
        by_name: dict[str, Policy] = {}
        for policy in policies:
            if policy.name in by_name:
                raise PlannerError(f"policy {policy.name!r} registered twice")
            by_name[policy.name] = policy
        for policy in by_name.values():
            if policy.floor is not None and policy.floor not in by_name:
                raise PlannerError(f"policy {policy.name!r}: floor {policy.floor!r} is not registered")
        self._by_name = by_name

    def __getitem__(self, name: str) -> Policy:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def names(self) -> tuple[str, ...]:
        """Every policy name, in registration order."""
        return tuple(self._by_name)

    def lookup(self, policy: str | Policy) -> Policy:
        """The policy named ``policy`` (a :class:`Policy` is returned as it is).

        Raises:
            PlannerError: an unknown name; the message lists the known ones."""
        if isinstance(policy, Policy):
            return policy
        try:
            return self._by_name[policy]
        except KeyError:
            raise PlannerError(f"unknown policy {policy!r}; known: {', '.join(self._by_name)}") from None

    def floor_of(self, policy: Policy) -> Policy | None:
        """``policy``'s floor (:attr:`Policy.floor`) from this registry; None: it has none."""
        return None if policy.floor is None else self._by_name[policy.floor]

    def with_policies(self, *policies: Policy) -> PolicyRegistry:
        """A copy of this registry with ``policies`` added (a name already present is
        replaced in place); this registry is unchanged."""
        replaced = {policy.name: policy for policy in policies}
        kept = [replaced.pop(name, policy) for name, policy in self._by_name.items()]
        return PolicyRegistry([*kept, *replaced.values()])

    def help_text(self) -> str:
        """``name (description); ...`` for every policy: the CLI's ``--policy`` help."""
        return "; ".join(f"{policy.name} ({policy.description})" for policy in self._by_name.values())


def _fifo(batch: Sequence[PlanJob], state: FleetState, options: SolveOptions) -> Plan:
    return greedy.fifo(batch, state)


def _min_evict(batch: Sequence[PlanJob], state: FleetState, options: SolveOptions) -> Plan:
    return greedy.min_evict(batch, state)


def _wspt(batch: Sequence[PlanJob], state: FleetState, options: SolveOptions) -> Plan:
    return greedy.wspt(batch, state)


def _portfolio(batch: Sequence[PlanJob], state: FleetState, options: SolveOptions) -> Plan:
    return greedy.portfolio(batch, state)


def _cpsat(batch: Sequence[PlanJob], state: FleetState, options: SolveOptions) -> Plan:
    from makespan.planner.cpsat import cpsat_policy  # ortools on the first solve (module doc)

    return cpsat_policy(batch, state, **options.solver_arguments())


def _tardiness_portfolio(batch: Sequence[PlanJob], state: FleetState, options: SolveOptions) -> Plan:
    from makespan.planner.tardiness_policy import tardiness_portfolio  # ortools on the first solve

    return tardiness_portfolio(batch, state)


def _tardiness(batch: Sequence[PlanJob], state: FleetState, options: SolveOptions) -> Plan:
    from makespan.planner.tardiness_policy import tardiness_policy  # ortools on the first solve

    return tardiness_policy(batch, state, **options.solver_arguments())


CPSAT_TIME_LIMIT_S = 1.0  # the CP-SAT policies' default budget after the greedy floor, s

_GREEDY = [
    Policy("fifo", "weighted_completion", None, False,
           "baseline: strict priority, then submission order, on the earliest-free group", _fifo),
    Policy("min-evict", "weighted_completion", None, False,
           "baseline: fifo order, on a free group that holds the model, else the cheapest to evict", _min_evict),
    Policy("wspt", "weighted_completion", None, False,
           "baseline: weighted shortest GPU time first, on the group that completes it earliest", _wspt),
    Policy("portfolio", "weighted_completion", "portfolio", False,
           "best of the transition-aware greedy members, milliseconds per plan", _portfolio),
]
_CPSAT = [
    Policy("cpsat", "weighted_completion", "portfolio", True,
           "portfolio, then CP-SAT / exact search within the time limit", _cpsat,
           time_limit_s=CPSAT_TIME_LIMIT_S, window_preemption=True),
    Policy("default", "weighted_completion", "portfolio", True,
           "= cpsat; live: portfolio per tick and CP-SAT off the tick", _cpsat,
           time_limit_s=CPSAT_TIME_LIMIT_S, window_preemption=True),
    Policy("tardiness-portfolio", "weighted_tardiness", "tardiness-portfolio", False,
           "best greedy plan for weighted tardiness, for jobs with deadlines", _tardiness_portfolio),
    Policy("tardiness", "weighted_tardiness", "tardiness-portfolio", True,
           "tardiness-portfolio, then order search and CP-SAT within the time limit", _tardiness,
           time_limit_s=CPSAT_TIME_LIMIT_S, window_preemption=True),
]

if importlib.util.find_spec("ortools") is not None:
    POLICY_REGISTRY = PolicyRegistry([*_GREEDY, *_CPSAT])
else:  # pragma: no cover - ortools is a dependency; the greedy policies stay usable without it
    POLICY_REGISTRY = PolicyRegistry([*_GREEDY, Policy(DEFAULT_POLICY, "weighted_completion", "portfolio", False,
                                                "= portfolio (ortools is not installed)", _portfolio)])
"""Every shipped policy. Read-only; build variants with :meth:`PolicyRegistry.with_policies`."""
