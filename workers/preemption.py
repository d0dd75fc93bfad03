"""Preemption for the planner worker (design notes, "Preemption"): CRITICAL preempts
HIGH, NORMAL and LOW; HIGH preempts NORMAL and LOW; NORMAL and LOW never preempt.

Mixed into :class:`workers.planner_worker.PlannerWorker`; uses its Redis client,
keys, endpoints, fencing token and ``_start``.
"""

from __future__ import annotations

import logging

from app import metrics
from app.models import Priority
from planner.model import FleetState, PlanJob
from planner.preemption import Holder, choose_preemption
from workers.leases import preempt

log = logging.getLogger("makespan.planner")


class PreemptionMixin:
    def _preempt_for(self, waiting: list[PlanJob], state: FleetState, taken: set[str]) -> set[str]:
        """For each waiting CRITICAL/HIGH job that no free GPU group can take now, evict
        the cheapest set of strictly lower-priority job leases covering one of its
        groups, and lease that group to it in the same tick (so a victim is never
        re-leased the GPUs it lost before its preemptor starts). The decision is
        :func:`planner.preemption.choose_preemption` (shared with the simulator): no
        preemption for a job that could start on a free group anyway, for one whose
        earliest group frees within its endpoint's cold start (preempting would not start
        it sooner), or whose groups hold no victim set."""
        holders = self.leases.gpu_holders([g.uuid for g in self.gpus])
        lease_of = {u: v.split(":")[0] for u, v in holders.items() if v}
        info: dict[str, dict[str, str]] = {}
        lids = sorted(set(lease_of.values()))
        p = self.r.pipeline(transaction=False)
        for lid in lids:
            p.hgetall(self.keys.lease(lid))
            p.hget(self.keys.phase(lid), "execute")
        got = p.execute()
        info.update({lid: got[2 * i] for i, lid in enumerate(lids)})
        executed = {lid: got[2 * i + 1] == "done" for i, lid in enumerate(lids)}
        holder: dict[str, Holder | None] = {}
        for u, lid in lease_of.items():
            rec = info.get(lid) or {}
            prio = Priority.__members__.get(rec.get("priority", "LOW"), Priority.LOW)
            holder[u] = Holder(lid, int(prio), rec.get("kind") == "job" and not executed.get(lid))
        started: set[str] = set()
        for j in sorted(waiting, key=lambda j: (j.priority, j.seq)):
            ep = self.endpoints[j.endpoint]
            best = choose_preemption(j.priority, state.groups(ep.tp, ep.memory_mib), taken, state.free_at,
                                     state.now_s, ep.cold_start_s, holder)
            if best is None:
                continue
            g, victims = best.group, best.victims
            freed = True
            for v in victims:
                outcome = preempt(self.r, self.keys, v, j.id, planner_token=self.token)
                if outcome in ("preempted", "cancelled"):
                    metrics.job_preempted(info[v].get("priority", "LOW"))
                    log.info("preempted lease %s (%s) for %s job %s: %s", v, info[v].get("priority"),
                             Priority(j.priority).name, j.id, outcome)
                    for u, h in list(holder.items()):
                        if h is not None and h.id == v:
                            holder.pop(u)
                else:
                    freed = False  # e.g. it finished executing meanwhile: it only has to clear
            if not freed:
                continue
            ep_end = self.now_s() + ep.cold_start_s + j.service_s
            if self._start(j, g, ep_end, "cold_start"):
                started.add(j.id)
                taken.update(g)
                for u in g:
                    holder[u] = Holder("__new__", j.priority, False)
        return started
