"""Preemption for the planner worker (design notes, "Preemption"): CRITICAL preempts
HIGH, NORMAL and LOW; HIGH preempts NORMAL and LOW; NORMAL and LOW never preempt.

Two deciders, one execution path (``preempt`` each victim lease, then ``_start`` the
preemptor on the cleared group in the same tick, so a victim is never re-leased the GPUs
it lost before its preemptor starts):

* scored (``Settings.preemption == "plan"`` and a policy with a floor,
  :attr:`makespan.planner.policies.Policy.floor`): the running holders are read from the leases
  and job records (``FleetState.running``) and :func:`makespan.planner.preemption_plan.decide`
  trades each candidate preemption against waiting with the policy's greedy floor;
* the fixed rule (:func:`makespan.planner.preemption.choose_preemption`) otherwise.

Neither decider cuts a job that a waiting job waits on (a workload step, or a job
submitted with ``depends_on``, whose dependency is still running: ``awaited``): the
dependents are outside the batch, so no score would count their delay. ``awaited`` is
read from the reverse-dependency index (:mod:`makespan.awaited`: ``P:awaited:{job}``, kept in
the same script as every enqueue, lease and cancel of a waiting step) for the jobs
holding a lease, in the same round trip as the lease records, so a step at any depth
of any queue (or delayed) protects its dependency; the deps of the unready steps that
``form_batch`` read this tick are added to it (no extra reads).

Both deciders take every group partly free and partly held by lower-priority work as a
candidate, and both are bounded (docs/planner.md, "Guarantees"): a job preempted
``Settings.preemption_budget`` times (the record's ``preemptions`` count) or leased less
than ``Settings.preemption_min_runtime_s`` ago is not preemptable
(:func:`makespan.planner.preemption.victim_allowed`).

Mixed into :class:`makespan.workers.planner_worker.PlannerWorker`; uses its Redis client,
keys, endpoints, fencing token and ``_start``.
"""

from __future__ import annotations

import logging

from makespan import metrics
from makespan.awaited import queue_awaited_running
from makespan.models import Priority
from makespan.planner import preemption_plan
from makespan.planner.model import FleetState, Plan, PlanJob, RunningJob
from makespan.planner.policies import POLICY_REGISTRY
from makespan.planner.preemption import Holder, choose_preemption, victim_allowed
from makespan.planner.replay import state_after
from makespan.workers.leases import preempt

log = logging.getLogger("makespan.planner")


class PreemptionMixin:
    requeued_now = 0  # victims put back in their queue this tick (the tick resets it)
    victims_now: list[str] = []  # job ids of those victims (their wait reason: preempted_requeued)
    awaited: set[str] = set()  # job ids a waiting job waits on (form_batch, then the index): never victims

    def _preempt(self, waiting: list[PlanJob], state: FleetState, taken: set[str], batch: list[PlanJob],
                 p: Plan, started: set[str]) -> set[str]:
        """Preempt for the ``waiting`` CRITICAL/HIGH jobs (module doc: scored or by the
        rule). ``batch``: this tick's batch; ``p``: its plan; ``started``: the jobs of
        ``p`` leased this tick. Returns the preemptors started."""
        if self.settings.preemption == "plan" and POLICY_REGISTRY.lookup(self.settings.policy).floor is not None:
            return self._preempt_scored(batch, state, taken, p, started)
        return self._preempt_for(waiting, state, taken)

    def _lease_holders(self) -> tuple[dict[str, str], dict[str, dict[str, str]], dict[str, bool]]:
        """(GPU -> lease id, lease id -> lease record, lease id -> its execute phase is done).
        Adds the leased jobs that a waiting job waits on (the index) to ``awaited``."""
        holders = self.leases.gpu_holders([g.uuid for g in self.gpus])
        lease_of = {u: v.split(":")[0] for u, v in holders.items() if v}
        lids = sorted(set(lease_of.values()))
        p = self.r.pipeline(transaction=False)
        for lid in lids:
            p.hgetall(self.keys.lease(lid))
            p.hget(self.keys.phase(lid), "execute")
        queue_awaited_running(p, self.keys)
        *got, awaited = p.execute()
        self.awaited = self.awaited | set(awaited)
        info = {lid: got[2 * i] for i, lid in enumerate(lids)}
        executed = {lid: got[2 * i + 1] == "done" for i, lid in enumerate(lids)}
        return lease_of, info, executed

    def _running(self, state: FleetState, lease_of: dict[str, str], info: dict[str, dict[str, str]],
                 executed: dict[str, bool]) -> tuple[dict[str, RunningJob], dict[str, str]]:
        """``FleetState.running`` from the job leases (a lease whose workload already ran,
        a restore or a record missing a field is left out: never a victim; a job that a
        queued step waits on, ``awaited``, is not preemptable), and job id -> lease id.
        Times on the workload clock (wall s ÷ ``time_scale``)."""
        jobs = {lid: rec["job"] for lid, rec in info.items()
                if rec.get("kind") == "job" and rec.get("job") and not executed.get(lid)}
        p = self.r.pipeline(transaction=False)
        for jid in jobs.values():
            p.hmget(self.keys.job(jid), "endpoint", "service_s", "submitted_at", "seq", "deadline_s", "leased_at",
                    "preemptions")
        got = dict(zip(jobs, p.execute()))
        ts = self.settings.time_scale
        gpus_of: dict[str, list[str]] = {}
        for u, lid in lease_of.items():
            gpus_of.setdefault(lid, []).append(u)
        order = {g.uuid: i for i, g in enumerate(self.gpus)}
        out: dict[str, RunningJob] = {}
        for lid, jid in jobs.items():
            ep, svc, sub, seq, due, leased, cuts = got[lid]
            prio = Priority.__members__.get(info[lid].get("priority", ""))
            if None in (ep, svc, sub, leased, prio) or ep not in state.endpoints:
                continue
            r_s, start_s = float(sub) / ts, float(leased) / ts
            end_s = float(info[lid].get("planned_end_s") or state.now_s)
            job = PlanJob(jid, ep, float(prio.weight), r_s, float(svc), int(prio), (),
                          r_s + float(due) if due else None, int(seq or 0))
            gs = tuple(sorted(gpus_of[lid], key=order.__getitem__))
            ok = jid not in self.awaited and self._bounded(cuts, state.now_s - start_s)
            rj = RunningJob(job, gs, start_s, max(start_s, end_s - float(svc)), end_s, ok)
            out.update({u: rj for u in gs})
        return out, {jid: lid for lid, jid in jobs.items()}

    def _bounded(self, cuts: str | None, ran_s: float) -> bool:
        """Whether a job preempted ``cuts`` times (its record's count) that has held its
        GPUs ``ran_s`` workload s is within the preemption bounds (module doc)."""
        return victim_allowed(int(cuts or 0), ran_s, self.settings.preemption_budget,
                              self.settings.preemption_min_runtime_s)

    def _holder_bounds(self, info: dict[str, dict[str, str]]) -> dict[str, bool]:
        """Lease id -> whether its job is within the preemption bounds (one round trip)."""
        lids = [lid for lid, rec in info.items() if rec.get("kind") == "job" and rec.get("job")]
        p = self.r.pipeline(transaction=False)
        for lid in lids:
            p.hmget(self.keys.job(info[lid]["job"]), "preemptions", "leased_at")
        now = self.now_s()
        return {lid: leased is not None and self._bounded(cuts, now - float(leased) / self.settings.time_scale)
                for lid, (cuts, leased) in zip(lids, p.execute() if lids else [])}

    def _preempt_scored(self, batch: list[PlanJob], state: FleetState, taken: set[str], p: Plan,
                        started: set[str]) -> set[str]:
        """Scored preemption (:func:`makespan.planner.preemption_plan.decide`) of the batch jobs not
        started, on the fleet as this tick's starts leave them (replayed; the jobs just
        leased are never victims); each decision is executed like the rule's."""
        lease_of, info, executed = self._lease_holders()
        running, lease_by_job = self._running(state, lease_of, info, executed)
        running = {u: rj for u, rj in running.items() if rj.id not in started}
        if not running:
            return set()
        jobs = {j.id: j for j in batch}
        rest = [j for j in batch if j.id not in started]
        after = state_after(state, jobs, p.assignments, started, running=running)
        policy = POLICY_REGISTRY.lookup(self.settings.policy)
        floor = POLICY_REGISTRY.floor_of(policy)
        assert floor is not None  # _preempt scores only for a policy with a floor
        branch = preemption_plan.decide(rest, after, floor.solve, policy.objective)
        out: set[str] = set()
        for pp, a in zip(branch.taken, branch.starts):
            j = jobs[pp.job_id]
            freed = True
            for v in pp.victims:
                lid = lease_by_job[v]
                outcome = preempt(self.r, self.keys, lid, j.id, planner_token=self.token)
                if outcome in ("preempted", "cancelled"):
                    self.requeued_now += outcome == "preempted"
                    if outcome == "preempted":
                        self.victims_now = [*self.victims_now, v]
                    metrics.job_preempted(info[lid].get("priority", "LOW"))
                    log.info("preempted lease %s (%s) for %s job %s (scored, gain %.3g): %s", lid,
                             info[lid].get("priority"), Priority(j.priority).name, j.id, pp.gain, outcome)
                else:
                    freed = False  # e.g. it finished executing meanwhile: it only has to clear
            if freed and self._start(j, tuple(pp.gpus), a.end_s, a.load):
                out.add(j.id)
                taken.update(pp.gpus)
        return out

    def _preempt_for(self, waiting: list[PlanJob], state: FleetState, taken: set[str]) -> set[str]:
        """For each waiting CRITICAL/HIGH job that no free GPU group can take now, evict
        the cheapest set of strictly lower-priority job leases covering one of its
        groups, and lease that group to it in the same tick (so a victim is never
        re-leased the GPUs it lost before its preemptor starts). The decision is
        :func:`makespan.planner.preemption.choose_preemption` (shared with the simulator): no
        preemption for a job that could start on a free group anyway, for one whose
        earliest group frees within its endpoint's cold start (preempting would not start
        it sooner), or whose groups hold no victim set."""
        lease_of, info, executed = self._lease_holders()
        bounded = self._holder_bounds(info)
        holder: dict[str, Holder | None] = {}
        for u, lid in lease_of.items():
            rec = info.get(lid) or {}
            prio = Priority.__members__.get(rec.get("priority", "LOW"), Priority.LOW)
            holder[u] = Holder(lid, int(prio), rec.get("kind") == "job" and not executed.get(lid)
                               and rec.get("job") not in self.awaited and bounded.get(lid, False))
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
                    self.requeued_now += outcome == "preempted"
                    if outcome == "preempted" and info[v].get("job"):
                        self.victims_now = [*self.victims_now, info[v]["job"]]
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
