"""Set-point term of the CP-SAT window model (:mod:`makespan.planner.window_model`), when
``FleetState.set_point_weight`` w_sp > 0.

An estimate, linear in the model's variables, of the set-point absence
(:func:`makespan.planner.restore.planned_absence`) that the window's placements cause by
displacing a set-point instance that is resident when the window starts (after the
plan's prefix): every residency interval R[g,m] of the model (:mod:`makespan.planner.window_model`)
with m not the instance's endpoint on a group g sharing GPUs with the instance costs,
when present,

    c × (d + ρ),  d ≥ end(R) − start(R) (0 when absent),  c = round(10 × w_sp × GPUs of the instance),

with ρ the restore after it (evict of m, then wake or cold start of the set point, s,
rounded up) — the absence from the start of its transition to the end of a restore right
after its last window job. The model's objective is in tenths of weight·s (its weights
are ``round(10·w_j)``), so c is on that scale (at least 1 when w_sp > 0).

What the estimate leaves out (the evaluator's exact score decides acceptance of every
decoded window, :mod:`makespan.planner.cpsat`): two residencies displacing the same instance in a
window are both charged (the absence counts once); jobs after the window on those GPUs
lengthen the absence; displacing an instance that is already absent (delaying its
restore) and reloading its endpoint there (ending an absence early) are not modelled.
"""

from __future__ import annotations

import math

from ortools.sat.python import cp_model

from makespan.planner.model import FleetState
from makespan.planner.replay import Group, Replay
from makespan.planner.restore import set_point_groups


class SetPointTerm:
    """The term's variables in model ``m`` over the residencies ``res``
    ({(group, endpoint): (presence, start, end, interval, σ, warm)}); nothing when
    ``state.set_point_weight`` is 0. ``rep``: the replay after the prefix."""

    def __init__(self, m: cp_model.CpModel, res: dict[tuple[Group, str], tuple], rep: Replay, state: FleetState,
                 horizon: int):
        self.items: list[tuple[object, object, object, object, int, int]] = []  # (p, s, e, d, c, ρ)
        w = state.set_point_weight
        if w <= 0:
            return
        eps = state.endpoints
        resident = [(e, g) for e, g in set_point_groups(state) if all(rep.resident[u] == e for u in g)]
        for (g, name), (p, s, e, _iv, _sigma, _warm) in res.items():
            for sp, grp in resident:
                if (sp == name and grp == g) or not set(grp) & set(g):
                    continue
                ep = eps[sp]
                rho = int(math.ceil(eps[name].evict_s + (ep.wake_s if ep.wake_s is not None else ep.cold_start_s)))
                c = max(1, int(round(10 * w * len(grp))))
                d = m.NewIntVar(0, horizon, "")
                m.Add(d >= e - s).OnlyEnforceIf(p)
                self.items.append((p, s, e, d, c, rho))

    def objective(self) -> list:
        """The term's objective summands (model units)."""
        return [c * d + c * rho * p for p, _s, _e, d, c, rho in self.items]

    def hint(self, hv: dict) -> list[tuple[object, int]]:
        """Hint values of the term's variables given the hint ``hv`` of the others."""
        return [(d, hv[e] - hv[s] if hv[p] else 0) for p, s, e, d, _c, _rho in self.items]

    def value(self, hv: dict) -> int:
        """The term's value at the (complete) hint ``hv``."""
        return sum(c * (hv[d] + rho) for p, _s, _e, d, c, rho in self.items if hv[p])
