"""Preemption for the planner worker (design notes, "Preemption"): CRITICAL preempts
HIGH, NORMAL and LOW; HIGH preempts NORMAL and LOW; NORMAL and LOW never preempt.

Two deciders, one execution path (``preempt`` each victim lease, then ``_start`` the
preemptor on the cleared group in the same tick, so a victim is never re-leased the GPUs
it lost before its preemptor starts):

* scored (``Settings.preemption == "plan"`` and a policy with a floor,
  :attr:`makespan.planner.policies.Policy.floor`): the running holders are read from the leases
  and job records (``FleetState.running``) and :func:`makespan.planner.preemption_plan.decide`
  trades each candidate preemption against waiting with the policy's greedy floor, after
  the fast lane's rule preemptions for its start-bounded levels
  (:func:`makespan.planner.fast_lane.rule_preemptions`: the rule's preemption for a lane job
  that could not otherwise start by its allowed start);
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
(:func:`makespan.planner.preemption.victim_allowed`). The time since the lease began is
measured on the Redis server's clock (the lease record's ``granted_ms`` against ``TIME``:
:func:`makespan.workers.leases.held_s`), never on a planner's own: after a leader change
the new leader measures what the old one would.

The tick's step is :class:`Preempt`; it starts each preemptor with
:func:`makespan.workers.starts.start_job` and notes the victims in the tick's context
(``requeued_now``, ``victims``: their wait reason is ``preempted_requeued``; with the
scored decider also ``victim_starts``, each victim's start in the plan the preemptions
leave: its ETA until the next tick plans it; the rule's victims get no ETA this tick, so it
sets ``CrossTickState.victims_without_eta``: the next tick forms a batch for them).
"""

from __future__ import annotations

import logging

from makespan.models import Priority
from makespan.planner import fast_lane, preemption_plan
from makespan.planner.policies import POLICY_REGISTRY
from makespan.planner import helpers as job_helpers
from makespan.planner.preemption import Holder, choose_preemption
from makespan.planner.replay import state_after
from makespan.workers.leases import preempt
from makespan.workers.starts import note_preemption, start_job
from makespan.workers.running import lease_holders, running_jobs, within_bounds
from makespan.workers.tick.context import TickContext

log = logging.getLogger("makespan.planner")


class Preempt:
    """Step: preempt for the batch's CRITICAL/HIGH jobs that the plan's starts left
    waiting (module doc). Writes ``waiting``, ``requeued_now`` and ``victims``; extends
    ``taken`` and ``dispatched`` with the preemptors started."""

    name = "preempt"

    def run(self, ctx: TickContext) -> None:
        if not ctx.batch:
            return
        waiting = [job for job in ctx.batch if job.id not in ctx.dispatched and job.priority <= int(Priority.HIGH)]
        ctx.requeued_now, ctx.victims, ctx.victim_starts = 0, [], {}
        # the critical lane decides for the jobs it holds (makespan.workers.tick.claims)
        held = ctx.kept.claims.take_free(job.id for job in waiting)
        ctx.waiting = [job for job in waiting if job.id in held]
        try:
            if not ctx.waiting:
                return
            settings = ctx.env.settings
            if settings.preemption == "plan" and POLICY_REGISTRY.lookup(settings.policy).floor is not None:
                ctx.dispatched |= _preempt_scored(ctx)
            else:
                ctx.dispatched |= _preempt_by_rule(ctx)
        finally:
            ctx.kept.claims.release(held)


def _note_preempted(ctx: TickContext, outcome: str, victim_job: str | None) -> None:
    """Note a victim lease that ``preempt`` ended with ``outcome`` (preempted or cancelled)."""
    ctx.requeued_now += outcome == "preempted"
    if outcome == "preempted" and victim_job:
        ctx.victims = [*ctx.victims, victim_job]
    if victim_job:  # it holds its GPUs no more (the wait reasons name a GPU's holder from this)
        ctx.lease_job = {gpu: job_id for gpu, job_id in ctx.lease_job.items() if job_id != victim_job}
    # makespan_jobs_preempted_total is counted by preempt itself (LeaseStore.job_preempted), for
    # the critical lane's preemptions too, and only for a requeued victim


def _preempt_scored(ctx: TickContext) -> set[str]:
    """Scored preemption (:func:`makespan.planner.preemption_plan.decide`) of the batch jobs not
    started, on the fleet as this tick's starts leave them (replayed; the jobs just
    leased are never victims); each decision is executed like the rule's."""
    env, state, plan, started = ctx.env, ctx.fleet_state, ctx.plan, ctx.started
    assert state is not None and plan is not None, "PlanBatch runs before Preempt"
    lease_of, info, executed, awaited, _server_now_ms = lease_holders(ctx)
    running, lease_by_job = running_jobs(ctx, state, lease_of, info, executed, awaited)
    running = {gpu: job for gpu, job in running.items() if job.id not in started}
    if not running:
        return set()
    jobs = {job.id: job for job in ctx.batch}
    rest = [job for job in ctx.batch if job.id not in started]
    after = state_after(state, jobs, plan.assignments, started, running=running)
    policy = POLICY_REGISTRY.lookup(env.settings.policy)
    floor = POLICY_REGISTRY.floor_of(policy)
    assert floor is not None  # preempt scores only for a policy with a floor
    settings = env.settings  # the fast lane's rule preemptions first (planner/fast_lane.py, "Preemption")
    forced = fast_lane.rule_preemptions(preemption_plan.Branch(after, rest, None, [], [], []),
                                        settings.fast_lane_levels, settings.fast_lane_start_grace)
    branch = preemption_plan.decide(forced.batch, forced.state, floor.solve, policy.objective)
    after_plan, after = branch.plan, branch  # the floor's plan of the batch with the victims, on the state they leave
    if forced.taken:
        branch = preemption_plan.chain(forced, branch)
    out: set[str] = set()
    held = {job.id for job in ctx.waiting}  # not those the critical lane holds or leased
    for decision, start in zip(branch.taken, branch.starts):
        if decision.job_id not in held:
            continue
        job = jobs[decision.job_id]
        for victim in decision.victims:
            lease_id = lease_by_job[victim]
            outcome = preempt(env.r, env.keys, lease_id, job.id, planner_token=ctx.token)
            if outcome in ("preempted", "cancelled"):
                _note_preempted(ctx, outcome, victim)
                note_preemption(ctx, decision.gpus)
                how = "the fast lane's rule" if decision.rule else f"scored, gain {decision.gain:.3g} weight·s"
                log.info("preempted job %s (lease %s, %s) for %s job %s (%s): %s", victim, lease_id,
                         info[lease_id].get("priority"), Priority(job.priority).name, job.id, how, outcome)
        # a victim not preempted (it finished executing meanwhile, or its lease ended): the
        # lease is refused while a GPU of the group is still held, else the job starts there
        if start_job(ctx, job, tuple(decision.gpus), start.end_s, start.load):
            out.add(job.id)
            ctx.taken.update(decision.gpus)
    if ctx.victims:  # their ETA: the planned start in the plan the preemptions leave (wait_reasons)
        if after_plan is None:
            after_plan = floor.solve(after.batch, after.state)
        victims = set(ctx.victims)
        ctx.victim_starts = {a.job_id: a.start_s for a in after_plan.assignments if a.job_id in victims}
    return out


def _preempt_by_rule(ctx: TickContext) -> set[str]:
    """For each waiting CRITICAL/HIGH job that no free GPU group can take now, evict
    the cheapest set of strictly lower-priority job leases covering one of its
    groups, and lease that group to it in the same tick (so a victim is never
    re-leased the GPUs it lost before its preemptor starts). The decision is
    :func:`makespan.planner.preemption.choose_preemption` (shared with the simulator): no
    preemption for a job that could start on a free group anyway, for one whose
    earliest group frees within its endpoint's cold start (preempting would not start
    it sooner), or whose groups hold no victim set. A job this tick leased (the plan's
    starts, ``ctx.dispatched``) is no victim: the holders are read after those leases."""
    env, state = ctx.env, ctx.fleet_state
    assert state is not None, "ReadFleet runs before Preempt"
    lease_of, info, executed, awaited, _server_now_ms = lease_holders(ctx)
    bounded = within_bounds(ctx, info)
    holder: dict[str, Holder | None] = {}
    down = ctx.snapshot.gated_gpus if ctx.snapshot is not None else frozenset()
    for gpu, lease_id in lease_of.items():
        if gpu in down:  # no GPU worker to run the preemptor there: its holder is no victim
            holder[gpu] = None
            continue
        rec = info.get(lease_id) or {}
        prio = Priority.__members__.get(rec.get("priority", "LOW"), Priority.LOW)
        # a job this tick leased (its phase chain is sent) is never a victim in the same tick
        holder[gpu] = Holder(lease_id, int(prio), rec.get("kind") == "job" and not executed.get(lease_id)
                             and rec.get("job") not in awaited and rec.get("job") not in ctx.dispatched
                             and bounded.get(lease_id, False))
    started: set[str] = set()
    memory_of = {gpu.uuid: gpu.memory_mib for gpu in env.gpus}  # GPU uuid -> memory, MiB (helpers' fit)
    host_of = {gpu.uuid: gpu.host for gpu in env.gpus}
    for job in sorted(ctx.waiting, key=lambda waiting: (waiting.priority, waiting.seq)):
        model = ctx.kept.endpoints[job.endpoint]
        groups = state.groups(model.tp, model.memory_mib)
        if job.helpers:  # only groups where its helpers fit beside it, as the plan and the critical lane place it
            groups = job_helpers.fitting_groups(groups, model, job.helpers, ctx.kept.endpoints, memory_of)
        if job.hosts:  # only on the hosts whose GPU worker registers its function (PlanJob.hosts)
            groups = [group for group in groups if host_of[group[0]] in job.hosts]
        best = choose_preemption(job.priority, groups, ctx.taken, state.free_at, state.now_s, model.cold_start_s,
                                 holder)
        if best is None:
            continue
        group, victims = best.group, best.victims
        for victim in victims:
            outcome = preempt(env.r, env.keys, victim, job.id, planner_token=ctx.token)
            if outcome in ("preempted", "cancelled"):
                _note_preempted(ctx, outcome, info[victim].get("job"))
                note_preemption(ctx, group)
                log.info("preempted job %s (lease %s, %s) for %s job %s: %s", info[victim].get("job"), victim,
                         info[victim].get("priority"), Priority(job.priority).name, job.id, outcome)
                for gpu, held_by in list(holder.items()):
                    if held_by is not None and held_by.id == victim:
                        holder.pop(gpu)
        # a victim not preempted (it finished executing meanwhile, or its lease ended): the
        # lease below is refused while a GPU of the group is still held, else it starts
        end_s = env.now_s() + model.cold_start_s + job_helpers.held_s(job, ctx.kept.endpoints)  # with its helpers
        if start_job(ctx, job, group, end_s, "cold_start"):
            started.add(job.id)
            ctx.taken.update(group)
            for gpu in group:
                holder[gpu] = Holder("__new__", job.priority, False)
    if ctx.victims:  # written without an ETA (no plan after the rule's preemptions): the next tick plans them
        ctx.kept.victims_without_eta = True
    return started
