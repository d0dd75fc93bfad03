"""What the planner intends: its last plan, published for the dashboard.

The planner keeps the plan of a tick only in memory (jobs planned for later stay queued
and are planned again next tick). :func:`publish_plan` writes the plan of the tick to
``P:plan`` (:attr:`makespan.keys.Keys.plan`) as one JSON string, so that a reader
(``makespan dashboard``, :mod:`makespan.dashboard.state`) can draw the plan ahead and
give each waiting job an ETA. Called by the tick's ``PublishPlan`` step
(:mod:`makespan.workers.tick.steps`), once the plan's starts are leased and sent. Shape (times unix wall seconds, converted from the plan's
workload seconds with ``time_scale``)::

    {"at": 1718000000.1, "policy": "portfolio", "time_scale": 0.01, "batch": 12,
     "assignments": [{"job": "ab12", "endpoint": "chat", "priority": "HIGH",
                      "gpus": ["GPU-host-a-2"], "start": ..., "service_start": ..., "end": ...,
                      "load": "cold_start", "evicts": ["embed"]}, ...],
     "restores": [{"endpoint": "embed", "gpus": [...], "start": ..., "end": ...}, ...]}

The key expires after ``ttl_s`` (a planner that stopped leaves no stale plan). A failed
write is logged and ignored: the plan view is for people, never for the planner.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any
from collections.abc import Iterable

import redis

from makespan.keys import Keys
from makespan.models import Priority

log = logging.getLogger("makespan.planner")

PLAN_TTL_S = 30  # seconds P:plan outlives the tick that wrote it
MAX_ASSIGNMENTS = 2000  # most assignments published (the earliest starts)


def plan_document(plan: Any, jobs: dict[str, Any], now_s: float, time_scale: float,
                  wall_now: float | None = None) -> dict[str, Any]:
    """The JSON-ready document of ``plan`` (a :class:`makespan.planner.model.Plan`) for the
    batch ``jobs`` (id -> :class:`makespan.planner.model.PlanJob`); ``now_s`` is the plan's
    now in workload seconds, ``time_scale`` wall seconds per workload second."""
    wall_now = time.time() if wall_now is None else wall_now

    def wall(t_s: float) -> float:
        return round(wall_now + (t_s - now_s) * time_scale, 4)

    out = []
    for a in sorted(plan.assignments, key=lambda a: (a.start_s, a.end_s))[:MAX_ASSIGNMENTS]:
        j = jobs.get(a.job_id)
        out.append({"job": a.job_id, "endpoint": getattr(j, "endpoint", None),
                    "priority": Priority(j.priority).name if j is not None else None, "gpus": list(a.gpus),
                    "start": wall(a.start_s), "service_start": wall(a.service_start_s), "end": wall(a.end_s),
                    "load": a.load, "evicts": list(a.evicts)})
    restores = [{"endpoint": a.job_id.split(":")[1] if a.job_id.count(":") >= 2 else a.job_id,
                 "gpus": list(a.gpus), "start": wall(a.start_s), "end": wall(a.end_s)}
                for a in getattr(plan, "restores", [])]
    return {"at": round(wall_now, 4), "policy": plan.policy, "time_scale": time_scale, "batch": len(jobs),
            "assignments": out, "restores": restores}


def publish_plan(r: redis.Redis, keys: Keys, plan: Any, batch: Iterable[Any], now_s: float, time_scale: float,
                 ttl_s: int = PLAN_TTL_S) -> None:
    """Write :func:`plan_document` of ``plan`` to ``P:plan`` (EX ``ttl_s``). Never raises
    for Redis errors (logged)."""
    try:
        doc = plan_document(plan, {j.id: j for j in batch}, now_s, time_scale)
        r.set(keys.plan, json.dumps(doc, separators=(",", ":")), ex=max(1, int(ttl_s)))
    except (redis.RedisError, TypeError, ValueError) as e:
        log.warning("publishing the plan view failed: %s", e)
