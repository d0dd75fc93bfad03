"""The live planner builds its FleetState with MAKESPAN_SET_POINT_WEIGHT (Settings.set_point_weight)."""

import dataclasses

from tests.faults.test_priority_cases import ONE_GPU
from makespan.workers.planner_worker import PlannerWorker


def test_fleet_state_carries_the_set_point_weight(r, settings):
    for w in (0.0, 3.0):
        worker = PlannerWorker(r, dataclasses.replace(settings, policy="portfolio", set_point_weight=w), ONE_GPU,
                               dispatch=lambda *a: None)
        state, _busy = worker.fleet_state()
        assert state.set_point_weight == w
        worker.close()
