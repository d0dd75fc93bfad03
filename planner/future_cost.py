"""The future-cost term of a plan's score (:mod:`makespan.planner.evaluator` documents it).

Its own module so that :mod:`makespan.planner.restore` (which weighs a restore by it) and
the evaluator (which imports restore) do not import each other.
"""

from __future__ import annotations

from makespan.planner.model import FleetState
from makespan.planner.replay import Replay


def future_cost(rep: Replay, state: FleetState) -> float:
    """Future-cost term of the score (:mod:`makespan.planner.evaluator`), weight·s."""
    if state.demand_share:
        return sum(share_shortfall_cost(state, e, rep.whole_gpus(e)) for e in state.demand_share)
    if not state.demand:
        return 0.0
    had = {e for e in state.resident.values() if e is not None}
    return sum(d * state.endpoints[e].cold_start_s for e, d in state.demand.items()
               if d > 0 and e in had and e in state.endpoints and rep.whole_gpus(e) == 0)


def share_shortfall_cost(state: FleetState, endpoint: str, gpus_holding: int) -> float:
    """d_e × cold_start_s(e) × max(0, share_e·G − n_e) / tp_e (:mod:`makespan.planner.evaluator`), weight·s."""
    ep = state.endpoints.get(endpoint)
    share = state.demand_share.get(endpoint, 0.0)
    if ep is None or share <= 0:
        return 0.0
    short = share * len(state.gpus) - gpus_holding
    return state.demand.get(endpoint, 1.0) * ep.cold_start_s * short / ep.tp if short > 0 else 0.0
