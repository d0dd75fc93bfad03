"""The planner tick's prewarm step (issue 20 point 5; ``Settings.prewarm``, off by default).

:class:`PrewarmSleepers`: when ``MAKESPAN_PREWARM`` is on, wake the sleepers that
:func:`makespan.planner.prewarm.prewarm_wakes` picks on GPU groups idle now (not held,
not taken this tick, no job or restore of this tick's plan on them): endpoints in recent
demand (the arrivals the planner remembers, :func:`makespan.workers.fleet_view.note_demand`)
with no queued job in the batch and no ready instance. Each wake is a restore lease
(:func:`makespan.workers.drain.start_restore` with ``prewarm``): the restore phase wakes
the sleeper, and the evict before it puts the resident it displaces to sleep.
"""

from __future__ import annotations

from dataclasses import replace

from makespan.planner.prewarm import prewarm_wakes
from makespan.planner.simulator import recent_share
from makespan.workers import host_liveness
from makespan.workers.drain import start_restore
from makespan.workers.tick.clock import NOW_TOL_S
from makespan.workers.fleet_view import read_fleet_gpus, read_fleet_state
from makespan.workers.tick.context import TickContext


class PrewarmSleepers:
    """Step: the prewarms that start now (module doc); their GPUs join ``taken``."""

    name = "prewarm sleepers"

    def run(self, ctx: TickContext) -> None:
        env = ctx.env
        if not env.settings.prewarm or not ctx.kept.recent_jobs or len(ctx.taken | ctx.held_gpus) >= len(env.gpus):
            return
        # as RestorePlanned: a full batch may leave out a queued job whose endpoint a prewarm would
        # displace, and victims requeued this tick are not in the batch either
        if ctx.requeued_now or (ctx.batch_formed and len(ctx.batch) >= env.settings.batch_size):
            return
        state = ctx.fleet_state
        if state is None:
            held, residents = read_fleet_gpus(env)
            gated = host_liveness.read_availability(env.r, env.keys, [host.name for host in env.fleet.hosts]).unavailable
            state = read_fleet_state(env, ctx.kept, held, residents, host_liveness.gpus_of(env.fleet, set(gated))).state
        state = replace(state, demand_share=recent_share(list(ctx.kept.recent_jobs.values()), state))
        planned = {u for a in ([*ctx.plan.assignments, *ctx.plan.restores] if ctx.plan else ()) for u in a.gpus}
        busy = planned | ctx.taken | ctx.held_gpus
        queued = {job.endpoint for job in ctx.batch}
        for wake in prewarm_wakes(state, busy, queued, state.now_s + NOW_TOL_S):
            start_restore(ctx, wake.endpoint, wake.gpus, ctx.taken, prewarm=True)
