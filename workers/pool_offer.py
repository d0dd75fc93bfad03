"""The tick's last step in a pool's planner: publish the pool's offer for routing.

A planner started with ``--pool NAME`` (a fleet with ``[[pools]]``) runs this step after the
steps of :data:`makespan.workers.tick.steps.TICK_STEPS`: it reads its own hosts' GPU holders
and residents once more (the tick's starts have taken GPUs since the snapshot) and writes the
pool's :class:`makespan.pools.PoolOffer` (free GPUs, idle warm endpoints) under
``P:pool:{name}:offer`` with a TTL of ``Settings.pool_offer_ttl_s``. The producer reads it to
route a job whose endpoint several pools serve (:func:`makespan.pools.route`). A planner of a
fleet without pools does not run it.
"""

from __future__ import annotations

from makespan.pools import offer_from_snapshot, publish_offer
from makespan.workers.fleet_view import read_fleet_gpus
from makespan.workers.tick.context import TickContext


class PublishPoolOffer:
    """Step: write this pool's offer (:mod:`makespan.workers.pool_offer`)."""

    name = "publish the pool's offer"
    when_followed = True  # also after a tick that followed the kept plan (makespan.workers.follow)

    def __init__(self, pool: str):
        self.pool = pool

    def run(self, ctx: TickContext) -> None:
        env = ctx.env
        held, residents = read_fleet_gpus(env)
        down = ctx.snapshot.gated_gpus if ctx.snapshot is not None else frozenset()
        offer = offer_from_snapshot(self.pool, env.fleet, held, residents, down, env.clock.now())
        publish_offer(env.r, env.keys, offer, env.settings.pool_offer_ttl_s)
