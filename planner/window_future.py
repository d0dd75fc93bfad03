"""The future-cost term of the CP-SAT window model (:mod:`makespan.planner.window_model`).

The evaluator's score (:mod:`makespan.planner.evaluator`) charges a plan for the endpoints in recent
demand that it leaves without instances when it ends: ``demand[e] × cold_start_s(e)`` for
an endpoint that was resident at the start and holds no whole instance at the end, or,
with ``FleetState.demand_share``, ``d_e × cold_start_s(e) × max(0, share_e·G − n_e) / tp_e``
(n_e: GPUs in whole instances of e at the end, G: the fleet's GPUs). This module gives the
window model the same term, so that a window values keeping popular models loaded and
does not rely on the acceptance test alone to find that out.

What the window decides. The plan's end state on a GPU is set by the last job placed on
it. GPUs that a job after the window uses (the suffix keeps its groups when a window is
decoded, :func:`makespan.planner.local.decode_window`) and GPUs outside the window end as the
incumbent plan leaves them: a constant. On the rest (``W``: window GPUs no later job
uses) the window's residencies decide. For each endpoint e in demand and each group g ⊆ W
of e's size that holds e after the window's prefix, or on which the window may load e, a
literal ``alive[g, e]`` may be 1 only if no residency of another model on g's GPUs is
present (and, for a load, only if e's residency on g is present). Then
    * simple form: ``lost_e + Σ_g alive[g, e] ≥ 1``, term ``demand[e]·cold_start_s(e)·lost_e``
      (only for e resident at the start and with no whole instance in the constant part);
    * share form: ``short_e ≥ share_e·G − n_e^const − Σ_g tp_e·alive[g, e]``, ``short_e ≥ 0``,
      term ``d_e·cold_start_s(e)/tp_e · short_e``.

It is an estimate, on the safe side: a load of e that comes after another model's
residency on the same GPUs is alive at the end, but counts as evicted here. The
evaluator's exact score still decides whether a window's solution is accepted.
Coefficients are in the window model's units (10 × weight·s, integers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from makespan.planner.model import Assignment, FleetState, PlanJob
from makespan.planner.replay import Group, Replay

SCALE = 10  # the window model's objective unit: weights × 10 (makespan.planner.window_model)
SHARE_SCALE = 10  # GPU counts of the share form in tenths


class FutureTerm:
    """The term's variables and constraints on CP-SAT model ``m`` (module doc).

    Args:
        m: the window's ``cp_model.CpModel``.
        after: the assignments after the window (the suffix; their GPUs end as it leaves them).
        jobs: job id -> job, for the suffix's jobs.
        state: the fleet at planning time (``demand``, ``demand_share``, ``resident``).
        rep: the replay after the window's prefix.
        res: the window's residencies, (group, endpoint) -> (presence, start, end,
            interval, σ, warm) as :func:`makespan.planner.window_model.solve_window` builds them.
        gpus: the window's GPUs.

    ``terms`` are (coefficient, variable) pairs for the objective; empty when the state
    has no demand or nothing in the window can change the term.
    """

    def __init__(self, m, after: Sequence[Assignment], jobs: dict[str, PlanJob], state: FleetState,
                 rep: Replay, res: dict, gpus: set[str]):
        self.terms: list[tuple[int, object]] = []
        self._alive: dict[tuple[Group, str], tuple[object, object | None, list]] = {}
        self._lost: dict[str, object] = {}
        self._short: dict[str, tuple[object, int, int]] = {}  # e -> (var, target − const, tp)
        share = state.demand_share
        demand = {e: d for e, d in state.demand.items() if d > 0} if not share else {
            e: state.demand.get(e, 1.0) for e, s in share.items() if s > 0}
        demand = {e: d for e, d in demand.items() if e in state.endpoints}
        if not demand:
            return
        end = rep.copy()  # the incumbent's end state: window and suffix as they are
        suffix_gpus = {u for a in after for u in a.gpus}
        free = gpus - suffix_gpus
        if not free:
            return
        for a in after:
            end.place(jobs[a.job_id], tuple(a.gpus), a.start_s)
        had = {e for e in state.resident.values() if e is not None}
        for e, d in demand.items():
            ep = state.endpoints[e]
            inside = [g for g in rep.groups(ep) if set(g) <= free]
            const = ep.tp * sum(1 for g in rep.groups(ep) if not set(g) <= free
                                and all(end.resident[u] == e for u in g))
            alive = []
            for g in inside:
                held = all(rep.resident[u] == e for u in g)
                own = res.get((g, e))
                if not held and own is None:
                    continue
                others = [v[0] for (g2, n2), v in res.items() if n2 != e and set(g2) & set(g)]
                a = m.NewBoolVar("")
                if not held:
                    m.AddImplication(a, own[0])
                for p in others:
                    m.AddImplication(a, p.Not())
                self._alive[(g, e)] = (a, None if held else own[0], others)
                alive.append(a)
            if not alive:
                continue
            if not share:
                if e not in had or const > 0:
                    continue
                lost = m.NewBoolVar("")
                m.Add(lost + sum(alive) >= 1)
                self._lost[e] = lost
                self.terms.append((int(round(SCALE * d * ep.cold_start_s)), lost))
            else:
                target = int(math.ceil(SHARE_SCALE * share[e] * len(state.gpus))) - SHARE_SCALE * const
                if target <= 0:
                    continue
                short = m.NewIntVar(0, target, "")
                m.Add(short >= target - sum(SHARE_SCALE * ep.tp * a for a in alive))
                self._short[e] = (short, target, ep.tp)
                self.terms.append((int(round(SCALE * d * ep.cold_start_s / ep.tp / SHARE_SCALE)), short))
        self._members = {e: [k for k in self._alive if k[1] == e] for e in demand}

    def hint(self, hv: dict) -> tuple[list[tuple[object, int]], int]:
        """Hint values of the term's variables given the hinted residency presences
        ``hv`` (variable -> value), and the term's value there (model units)."""
        out: list[tuple[object, int]] = []
        alive_of: dict[tuple[Group, str], int] = {}
        for k, (a, own, others) in self._alive.items():
            val = int((own is None or hv.get(own, 0) == 1) and not any(hv.get(p, 0) for p in others))
            alive_of[k] = val
            out.append((a, val))
        total = 0
        coef = {id(v): c for c, v in self.terms}
        for e, lost in self._lost.items():
            val = int(not any(alive_of[k] for k in self._members[e]))
            out.append((lost, val))
            total += coef[id(lost)] * val
        for e, (short, target, tp) in self._short.items():
            val = max(0, target - sum(SHARE_SCALE * tp * alive_of[k] for k in self._members[e]))
            out.append((short, val))
            total += coef[id(short)] * val
        return out, total
