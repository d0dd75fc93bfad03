"""Set-point restores inside a plan's horizon (issue 3), and set-point absence.

A *set-point instance* is an aligned GPU group whose every GPU has the same endpoint in
``FleetState.set_point`` (:func:`set_point_groups`). After a batch is planned, every
set-point instance that is not resident when its GPUs' planned work ends gets a restore
(:func:`plan_restores`): evict whatever the plan left there, then cold start or wake the
set-point endpoint (the one transition rule, :meth:`makespan.planner.replay.Replay.restore`).

Where a restore goes (``at``, one of :data:`RESTORE_AT`):
    * ``"group"``: when the last planned job on the group's GPUs ends (or when the GPUs
      free, if the plan puts nothing there): the group is idle until the horizon end,
      so the restore starts in the middle of the plan while other GPUs keep working;
    * ``"horizon"``: when the plan's last job ends (the horizon end), on every group.
Either way a restore is the last thing planned on its GPUs, so it never delays a batch
job of the plan; restores are never placed between two jobs of a group (a later job on
those GPUs: no restore there). A restore is an :class:`Assignment` with ``job_id``
``"restore:<endpoint>:<first gpu>"``, ``end_s`` = ``service_start_s`` (no service),
reported in ``Plan.restores`` and replayed by :func:`makespan.planner.evaluator.evaluate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from makespan.errors import PlannerError
from makespan.planner.future_cost import future_cost
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.replay import Group, Replay

RESTORE_AT = ("group", "horizon", "group-demand")
RESTORE_PREFIX = "restore:"


def is_restore(a: Assignment) -> bool:
    """True when ``a`` is a set-point restore, not a job."""
    return a.job_id.startswith(RESTORE_PREFIX)


def set_point_groups(state: FleetState) -> list[tuple[str, Group]]:
    """(endpoint, GPU uuids) of every set-point instance of ``state``: its aligned groups
    of the endpoint's TP size whose every GPU's set point is that endpoint."""
    if not state.set_point:
        return []
    return [(e, g) for e, ep in state.endpoints.items() for g in state.groups(ep.tp, ep.memory_mib)
            if all(state.set_point.get(u) == e for u in g)]


def plan_restores(assignments: Sequence[Assignment], batch: Sequence[PlanJob], state: FleetState,
                  at: str = "group") -> list[Assignment]:
    """The restores of a plan (module doc), in start order.

    Args:
        assignments: the plan's job assignments (an evaluated plan: replayed at their
            ``start_s`` on their ``gpus``).
        batch: the plan's jobs.
        state: the fleet at planning time (its ``set_point`` names the instances).
        at: one of :data:`RESTORE_AT`.

    Returns:
        one restore per set-point instance not resident when the plan leaves its GPUs
        (empty when ``state.set_point`` is empty).

    Raises:
        PlannerError: unknown ``at``.
    """
    return _restores(assignments, batch, state, at)[0]


def _restores(assignments: Sequence[Assignment], batch: Sequence[PlanJob], state: FleetState,
              at: str) -> tuple[list[Assignment], Replay | None]:
    """:func:`plan_restores` and the replay it left (restores placed; None: no set point)."""
    if at not in RESTORE_AT:
        raise PlannerError(f"unknown restore placement {at!r}; known: {', '.join(RESTORE_AT)}")
    groups = set_point_groups(state)
    if not groups:
        return [], None
    jobs = {j.id: j for j in batch}
    rep = Replay(state)
    for a in sorted(assignments, key=lambda a: a.start_s):
        rep.place(jobs[a.job_id], tuple(a.gpus), a.start_s)
    horizon_s = max([state.now_s, *(a.end_s for a in assignments)])
    return _place(rep, state, groups, at, horizon_s), rep


def _place(rep: Replay, state: FleetState, groups: Sequence[tuple[str, Group]], at: str,
           horizon_s: float) -> list[Assignment]:
    """Place the restores of ``groups`` (set-point instances) on ``rep`` (the replay after
    a plan's jobs; changed in place), ``at`` as :func:`plan_restores` says; returns them
    in start order."""
    out = []
    for ep, g in groups:
        if all(rep.resident[u] == ep for u in g):
            continue
        free_s = rep.group_free(g)
        if at == "group-demand":
            trial = rep.copy()
            trial.restore(g, ep, free_s)
            if future_cost(trial, state) > future_cost(rep, state) + 1e-9:
                continue  # it would evict what recent demand needs more than the set point
        out.append(rep.restore(g, ep, max(free_s, horizon_s) if at == "horizon" else free_s))
    return sorted(out, key=lambda a: (a.start_s, a.gpus))


def planned_absence(assigns: Sequence[Assignment], endpoint_of: Mapping[str, PlanJob], rep: Replay,
                    state: FleetState) -> float:
    """Set-point absence a plan causes within its horizon, GPU-s (``FleetState.set_point_weight``).

    Each set-point instance counts its GPUs from when it stops being resident (``now_s``
    when ``state.resident`` does not hold it, else the start of the first transition on
    its GPUs that evicts it) until it is resident again: a later load of its endpoint
    there (service start), else the end of its restore as :func:`plan_restores` places it
    with ``at="group"`` (when the plan's last job on its GPUs ends); an instance never
    displaced counts 0. Measured by :func:`set_point_absence` over [now, the plan's last
    end], the measure the simulator reports for a whole run.

    Args:
        assigns: the plan's job assignments, in start order, as ``rep`` placed them
            (the plan's own ``Plan.restores`` are not read: the restores are always the
            ``"group"`` ones, so the absence does not depend on where a plan puts them).
        endpoint_of: job id -> the job (for its endpoint).
        rep: the replay after ``assigns`` (not changed: restores go on a copy).
        state: the fleet at planning time.

    Returns:
        absent GPU-seconds (0 without set points).
    """
    groups = set_point_groups(state)
    if not groups:
        return 0.0
    sp = {u for _, g in groups for u in g}
    events: dict[str, list[tuple[float, str | None]]] = {}
    end_s = state.now_s

    def note(a: Assignment, endpoint: str) -> None:
        if a.load == "warm":
            return  # nothing is evicted nor loaded
        for u in a.gpus:
            if u in sp:
                events.setdefault(u, []).extend(((a.start_s, None), (a.service_start_s, endpoint)))

    for a in assigns:
        note(a, endpoint_of[a.job_id].endpoint)
        end_s = max(end_s, a.end_s)
    for r in _place(rep.copy(), state, groups, "group", end_s):
        note(r, state.set_point[r.gpus[0]])
        end_s = max(end_s, r.end_s)
    return set_point_absence(events, groups, state.resident, state.now_s, end_s)


def with_restores(plan: Plan, batch: Sequence[PlanJob], state: FleetState, at: str = "group") -> Plan:
    """``plan`` (an evaluated plan) with its restores (:func:`plan_restores`) in
    ``Plan.restores``. They are placed by the replay the evaluator uses, so
    :func:`makespan.planner.evaluator.evaluate` accepts the result (the tests check it; it is not
    re-run here: the simulator calls this at every planning point). Returns a new plan;
    ``assignments``, ``objective`` and the policy's ``stats`` are kept, ``stats`` gains
    ``restores`` (count) and ``future_cost_restored`` (the future cost on the fleet the
    plan and its restores leave, weight·s).

    Raises:
        PlannerError: unknown ``at``.
    """
    restores, rep = _restores(plan.assignments, batch, state, at)
    if not restores or rep is None:
        return plan
    stats = dict(plan.stats, restores=float(len(restores)), future_cost_restored=future_cost(rep, state))
    return Plan(plan.policy, list(plan.assignments), plan.objective, stats, restores=restores,
                preemptions=list(plan.preemptions))


def set_point_absence(events: Mapping[str, Sequence[tuple[float, str | None]]],
                      set_points: Sequence[tuple[str, Group]], initial: Mapping[str, str | None],
                      start_s: float, end_s: float) -> float:
    """Set-point absence: GPU-seconds in [start_s, end_s] during which a set-point
    instance was not resident (an instance of TP k counts k GPUs while any of its GPUs
    does not hold its endpoint ready to serve).

    Args:
        events: GPU uuid -> residency changes ``(time_s, endpoint or None)`` in time
            order: ``None`` when a transition begins (evict, load), the endpoint when it
            is loaded (service start of a job, end of a restore).
        set_points: (endpoint, GPU group) of every set-point instance.
        initial: GPU uuid -> endpoint resident at ``start_s``.
        start_s, end_s: the measured span, s.

    Returns:
        absent GPU-seconds (0 when ``end_s <= start_s``).
    """
    total = 0.0
    for ep, g in set_points:
        off: list[tuple[float, float]] = []
        for u in g:
            cur, since = initial.get(u), start_s
            for t, e in sorted(events.get(u, ()), key=lambda x: x[0]):
                if (cur == ep) != (e == ep):
                    if cur != ep:
                        off.append((since, t))
                    since = t
                cur = e
            if cur != ep:
                off.append((since, end_s))
        total += len(g) * _covered(off, start_s, end_s)
    return total


def _covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` clipped to [lo, hi]."""
    length, reach = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            length += b - a
            reach = b
    return length
