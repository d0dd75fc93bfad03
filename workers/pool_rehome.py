"""Queued jobs that no planner of their pool will plan go to a pool that will.

A job is routed to a pool once, at submit (:func:`makespan.pools.route`), and its record keeps
it (``pool``; a requeue puts it back in that pool's queue). Three things leave a queued job
where no planner plans it:

* the fleet file changed its pools: the pool is gone (renamed, removed, or pools were added
  to a fleet that had none, whose jobs wait in the implicit pool's ``P:queue:*``, or removed
  from one that had them);
* the fleet file moved its endpoint out of its pool (the pool's planner cannot run it);
* its pool's planner is down (no planner holds that pool's leader lock) while this pool
  serves its endpoint too.

Each planner, as it comes to lead, adds its own pool and the pools of the fleet it replaces
to ``P:pools:seen`` (:func:`note_pools_seen`); the tick step :class:`RehomeQueued` (at most
once per :data:`REHOME_EVERY_S` of the planner's clock) moves, with ``reroute.lua`` (fenced
by the planner's token; a job leased meanwhile stays where it is). Each look reads at most
``batch_size`` entries of each such queue (pool and level), on from where the last look
left the entries it could not move (jobs of endpoints its pool does not serve, jobs waiting
until a pool's leader runs its fleet file), from the head again once a read reaches the end:
a queue's head never hides the jobs behind it. It moves:

* the jobs queued in a seen pool that the planner's fleet does not declare, each to the pool
  :func:`makespan.pools.route` picks by the planner's whole fleet (or to the planner's own
  pool when no pool of that fleet can run it: its batch then cancels it with the reason, as
  for any job queued before its fleet changed);
* the jobs queued in a pool of its fleet that no planner leads, whose endpoint its own pool
  serves, to its own pool.

A job in the planner's own queue whose endpoint its pool no longer serves is moved by the
batch as it reads it (:meth:`makespan.workers.batch._BatchScan.runnable`, with
:func:`reroute_elsewhere`). Each move records a ``rerouted`` event (``job``, ``from``,
``to``: pool names, ``''`` for the implicit pool; ``reason``).

A planner moves a job only into a pool that no planner leads or whose leader runs the same
fleet file (``fleet_version`` of its ``planner_config``): two planners of different files
(one restarted with the new file, the other not yet) would otherwise pass a job back and
forth, each move waking the other. A move never loses a job or runs it twice: it is one
fenced script, and a job leased meanwhile is no longer in its source queue.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

import redis

from makespan import pools
from makespan.errors import StoreError
from makespan.keys import Keys
from makespan.models import FleetSpec, Priority, fleet_version
from makespan.store import JobStore
from makespan.workers.tick.context import TickContext, TickEnv

log = logging.getLogger("makespan.planner")

REHOME_EVERY_S = 1.0  # a planner looks for jobs to move at most this often (its clock's monotonic s)


def note_pools_seen(r: redis.Redis, keys: Keys, own_pool: str | None, replaced_fleet_json: str | None) -> None:
    """Add to ``P:pools:seen`` this planner's pool, the implicit pool ('') and the pools of
    the fleet it replaces (``replaced_fleet_json``: ``P:fleet`` as it was before; '' when that
    one declared none).

    Raises:
        redis.RedisError: Redis failed."""
    names = {own_pool or "", ""}  # the implicit pool always: jobs submitted before pools were declared
    if replaced_fleet_json:
        try:
            declared = [str(pool["name"]) for pool in json.loads(replaced_fleet_json).get("pools", [])]
        except (ValueError, TypeError, KeyError, AttributeError):
            declared = []
        names.update(declared or [""])
    r.sadd(keys.pools_seen, *sorted(names))


def _move(env: TickEnv, token: str, job_id: str, source_queue: str, from_pool: str | None, to_pool: str | None,
          priority: str, reason: str) -> int:
    event = json.dumps({"ts": env.clock.now(), "kind": "rerouted", "job": job_id, "priority": priority,
                        "from": from_pool or "", "to": to_pool or "", "reason": reason})
    moved = JobStore(env.r, env.keys).reroute(job_id, source_queue, to_pool, token, event)
    if moved:
        log.warning("job %s moved from pool %r to pool %r: %s", job_id, from_pool or "", to_pool or "", reason)
    return moved


def _route(r: redis.Redis, keys: Keys, whole: FleetSpec, endpoint: str, priority: Priority,
           serving: list[str]) -> str:
    """The pool among ``serving`` (pools of ``whole``, non-empty) a job of ``endpoint`` at
    ``priority`` goes to: the only one, or the one that can start it first
    (:func:`makespan.pools.route`'s rule over those pools).

    Pools a planner leads come first: a job moved into a pool no planner leads yet waited
    there, and the next tick moved it on again (an SRE added pools with jobs queued: they
    all went to the pool started first, the other one's GPUs idle).

    Raises:
        StoreError: Redis failed."""
    if len(serving) > 1:
        try:
            leaders = r.mget([keys.for_pool(pool).planner_leader for pool in serving])
        except redis.RedisError as e:
            raise StoreError(f"reading the leaders of pools {serving}: {e}") from e
        serving = [pool for pool, leader in zip(serving, leaders) if leader] or serving
    if len(serving) == 1:
        return serving[0]
    return pools.route(r, keys, whole, endpoint, priority, among=serving) or serving[0]


def _runs_same_fleet(env: TickEnv, whole: FleetSpec, pool: str | None) -> bool:
    """Whether no planner leads ``pool`` or its leader runs the same fleet file as this one
    (its published ``planner_config``'s ``fleet_version``): a planner moves a job only into
    such a pool, so that two planners of different fleet files (one restarted, the other
    not yet) never pass a job back and forth (each move wakes the other)."""
    scoped = env.keys.for_pool(pool)
    pipe = env.r.pipeline(transaction=False)
    pipe.exists(scoped.planner_leader)
    pipe.get(scoped.planner_config)
    leads, raw = pipe.execute()
    if not leads:
        return True
    try:
        theirs = json.loads(raw).get("fleet_version") if raw else None
    except (ValueError, AttributeError):
        theirs = None
    return theirs == fleet_version(whole)


def reroute_elsewhere(env: TickEnv, token: str, job_id: str, level: Priority, endpoint: str,
                      helpers: Iterable[str]) -> bool | None:
    """A job of ``endpoint`` read from this planner's own ``level`` queue that its pool does
    not serve: moved to a pool of the planner's whole fleet that does (True when moved, False
    when not: fenced off or no longer queued); None when no other pool can run it either, or
    the fleet has no pools (the caller cancels it).

    Raises:
        StoreError: Redis failed."""
    whole = env.whole_fleet
    if whole is None or not whole.pools:
        return None
    own = env.keys.pool
    serving = [p for p in whole.pools_serving(endpoint) if p != own]
    if not serving or whole.placement_problem(endpoint, tuple(helpers)) is not None:
        return None
    to = _route(env.r, env.keys, whole, endpoint, level, serving)
    if not _runs_same_fleet(env, whole, to):
        return False  # its leader runs another fleet file: the job waits here until both run the same one
    return bool(_move(env, token, job_id, env.keys.queue(level), own, to, level.name,
                      f"pool {own!r} does not serve endpoint {endpoint!r} any more (the fleet file changed)"))


class RehomeQueued:
    """Step: move the jobs queued where no planner plans them (module doc)."""

    name = "rehome queued jobs"

    def run(self, ctx: TickContext) -> None:
        env, kept = ctx.env, ctx.kept
        whole = env.whole_fleet or env.fleet
        now = env.clock.monotonic()
        if now - kept.rehomed_at_s < REHOME_EVERY_S:
            return
        kept.rehomed_at_s = now
        own = env.keys.pool
        declared = whole.pool_names()
        mine = set(env.fleet.endpoints)
        sharing = [p for p in declared if p != own and mine & set(whole.pool_endpoints(p))]
        pipe = env.r.pipeline(transaction=False)  # one round trip while every pool has its planner
        pipe.smembers(env.keys.pools_seen)
        for pool in sharing:
            pipe.exists(env.keys.for_pool(pool).planner_leader)
        seen, *leads = pipe.execute()
        gone = sorted(p for p in seen if (p or None) not in (declared or [None]))
        idle = [pool for pool, lead in zip(sharing, leads) if not lead]
        if not gone and not idle:
            return
        limit = env.settings.batch_size
        windows = [(pool, level) for pool in [*gone, *idle] for level in Priority]
        starts = {window: kept.rehome_cursor.get(window, 0) for window in windows}
        pipe = env.r.pipeline(transaction=False)
        for pool, level in windows:
            start = starts[(pool, level)]
            pipe.zrange(env.keys.for_pool(pool).queue(level), start, start + limit - 1)
        read = dict(zip(windows, pipe.execute()))
        found = [(pool or None, level, job) for pool, level in windows for job in read[(pool, level)]]
        left = {window: len(read[window]) for window in windows}  # entries of each window still in place
        if found:
            self._move_found(ctx, whole, declared, mine, idle, found, left)
        # the next look reads on past what stays in place (jobs of endpoints this pool does not
        # serve, jobs waiting until a pool's leader runs this fleet file), from the head again
        # once a read reached the end of its queue
        kept.rehome_cursor = {window: starts[window] + left[window] if len(read[window]) == limit else 0
                              for window in windows}

    @staticmethod
    def _move_found(ctx: TickContext, whole: FleetSpec, declared: list[str], mine: set[str], idle: list[str],
                    found: list[tuple[str | None, Priority, str]], left: dict[tuple[str, Priority], int]) -> None:
        """Move each of ``found`` ((pool, level, job id) read from a queue of a pool gone
        from the fleet file or of a pool of ``idle``) where it can go; ``left`` counts down
        the entries taken out of each (pool or '', level) window read."""
        env = ctx.env
        own = env.keys.pool
        pipe = env.r.pipeline(transaction=False)
        for _pool, _level, job in found:
            pipe.hmget(env.keys.job(job), "endpoint", "state", "helpers")
        for (pool, level, job), (endpoint, state, helpers) in zip(found, pipe.execute()):
            source = env.keys.for_pool(pool).queue(level)
            window = (pool or "", level)
            if endpoint is None or state != "queued":
                if pool not in idle:  # a stale entry no planner's batch will drop (fenced; still not queued)
                    left[window] -= JobStore(env.r, env.keys).drop_stale(source, job, ctx.token)
                continue
            try:
                names = tuple(json.loads(helpers)) if helpers else ()
            except ValueError:
                names = ()
            if pool in idle:
                if endpoint in mine and env.fleet.placement_problem(endpoint, names) is None:
                    left[window] -= _move(env, ctx.token, job, source, pool, own, level.name,
                                          f"no planner leads pool {pool!r}; pool {own!r} serves endpoint {endpoint!r}")
                continue
            serving = whole.pools_serving(endpoint) if declared else []
            if declared and serving and whole.placement_problem(endpoint, names) is None:
                to = _route(env.r, env.keys, whole, endpoint, level, serving)
            else:
                to = own  # no pool of the fleet runs it (or the fleet has none): this planner's batch decides
            if to != own and not _runs_same_fleet(env, whole, to):
                continue
            why = (f"pool {pool!r} is not in the fleet file any more" if pool else
                   "the fleet file declares pools now: the implicit pool's queues have no planner")
            left[window] -= _move(env, ctx.token, job, source, pool, to, level.name, why)
