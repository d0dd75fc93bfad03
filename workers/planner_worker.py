"""The planner worker: one active at a time (Redis lock + fencing token), the rest
stand by and take over within the lock's TTL.

Each tick the leader: reclaims expired leases; forms a batch (strict priority:
CRITICAL jobs first, then HIGH, NORMAL, LOW; at most ``batch_size``; a job that a
higher-level job waits on is planned at that level); reads the fleet state; calls the
pure ``makespan.planner.api.plan``, then honours the aged job's reservation
(``MAKESPAN_RESERVATION_AFTER_S``, :func:`makespan.planner.reservation.enforce`: only jobs that
end before it backfill its group); publishes a lease for every job the plan
starts now (one Lua script per gang: leased whole or not at all, the job acknowledged
in the same step) and sends its phase chain to the host's queue. Jobs planned for
later stay queued and are planned again next tick (rolling horizon). It starts the
plan's set-point restores that start now (a set-point group the plan leaves idle); when
nothing is queued or running it restores every set point and checks the drain.

While it leads, a CRITICAL job submitted meanwhile does not wait for the tick: the
critical lane (:mod:`makespan.workers.critical_lane`, a thread of this process, under the
same fencing token) places it at once and the next tick reconciles.

This module holds :class:`PlannerWorker`: leadership (lock, fencing token, standby), its
run loop and the step list. A tick is the steps of
:data:`makespan.workers.tick.steps.TICK_STEPS`, run in that order over one fresh
:class:`makespan.workers.tick.context.TickContext` (the worker's fixed parts, its
:class:`~makespan.workers.tick.context.CrossTickState`, the fencing token); the table in
:mod:`makespan.workers.tick.steps` names each step and its module. The worker's clock is
injected (``clock=``, a :class:`makespan.workers.tick.clock.Clock`; default the system clock).

A leader starts no tick step once its lock may have expired: when no acquire or extend
sent within the lock's TTL (``Settings.planner_lock_ttl_s``, on the clock's monotonic time)
succeeded, it steps down (gives the lock back if still its own) and stands by, even while
an extend is still blocked; :func:`makespan.settings.planner_lock_warning` says, as it starts,
when one extend blocked for the socket timeout would make it step down.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import LockError, LockNotOwnedError

from makespan import events, metrics, telemetry
from makespan.errors import LeaseError, PlannerError, RedisConfigError, StoreError, ValidationError
from makespan.keys import WAKE_RELEASE, Keys
from makespan.models import FleetSpec, Priority, fleet_version
from makespan.planner.model import FleetState, PlanJob
from makespan.redis_conn import (OutageLog, answer_refused, check_eviction_policy, check_failover_writes, check_persistence,
                                  credentials_refused, with_socket_timeout)
from makespan.settings import Settings, liveness_warning, planner_lock_warning, retention_warning
from makespan.workers.batch import form_batch
from makespan.workers.critical_lane import CriticalLane
from makespan.workers.drain import check_drain
from makespan.workers.fleet_view import (endpoint_models, fleet_gpus, queue_solve_stats, read_fleet_gpus,
                                         read_fleet_state, set_point_instances)
from makespan.workers import host_liveness
from makespan.workers.improver import BackgroundImprover
from makespan.workers.leases import LeaseStore
from makespan.workers.pool_offer import PublishPoolOffer
from makespan.workers.pool_rehome import note_pools_seen
from makespan.workers.tick.clock import Clock, SystemClock
from makespan.workers.tick.context import CrossTickState, Dispatch, TickContext, TickEnv
from makespan.planner.policies import POLICY_REGISTRY
from makespan.workers.tick.steps import TICK_STEPS, Step

if TYPE_CHECKING:  # pragma: no cover - types only
    from makespan.workers.agenda import AgendaTracker

log = logging.getLogger("makespan.planner")
STANDBY_WAIT_S = 1.0  # longest single wait of a standby for the leader lock (it polls it every 0.1 s meanwhile), s

__all__ = ["PlannerWorker"]


class PlannerWorker:
    """One planner process. ``run()`` loops until ``stop()``; ``tick()`` is one cycle.

    Args:
        r: the Redis client (``decode_responses=True``).
        settings: the planner's settings.
        fleet: the fleet file.
        dispatch: sends a phase chain to a host queue (tests capture it); default
            :func:`makespan.workers.publish.dispatch` through the Celery app of ``settings``
            (``TickEnv.celery``: their Redis and key prefix, not the environment's).
        name: this planner's name in events and logs (default ``planner-{pid}-{hex}``).
        clock: the planner's clock (:class:`makespan.workers.tick.clock.Clock`; tests pass a
            ``ManualClock``); default :class:`~makespan.workers.tick.clock.SystemClock`.
        pool: the pool this planner plans (a fleet with ``[[pools]]``: required): it plans
            and leases only that pool's hosts (``fleet.pool_fleet(pool)``), with that pool's
            queues, lock and fencing token (``Keys.for_pool``), and publishes the pool's offer
            each tick (:mod:`makespan.workers.pool_offer`). None: the fleet has no pools.

    Raises:
        ValidationError: ``pool`` is not one of the fleet's pools, or the fleet declares
            pools and ``pool`` is None.
    """

    steps: tuple[Step, ...] = TICK_STEPS  # the tick, in order (makespan.workers.tick.steps)

    def __init__(self, r: redis.Redis, settings: Settings, fleet: FleetSpec, dispatch: Dispatch | None = None,
                 name: str | None = None, clock: Clock | None = None, pool: str | None = None):
        self.pool, self.whole_fleet = pool, fleet  # the whole fleet is what producers read (P:fleet)
        if pool is None and fleet.pools:
            raise ValidationError("pool", None, f"the fleet declares pools ({', '.join(fleet.pool_names())}): "
                                                "run one planner per pool with --pool NAME", show_value=False)
        fleet = fleet.pool_fleet(pool) if pool is not None else fleet
        self.r, self.settings, self.fleet = r, settings, fleet
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.keys = Keys(settings.key_prefix).for_pool(pool)
        if pool is not None:
            self.steps = (*self.steps, PublishPoolOffer(pool))
        self.leases = LeaseStore(r, self.keys)
        self.name = name or f"planner-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._stop = threading.Event()
        self.token = ""  # the fencing token while leading ('' = unchecked: tests tick by hand)
        self._fence_seen = 0  # the highest fencing token this process held or saw standing by (_state_lost)
        self.lost = threading.Event()
        # Redis accepted this planner's credentials once: a refusal before is fatal (run raises
        # RedisAuthFailed), one after (a password rotated under it) is logged and retried
        self.redis_answered = False
        self._warned_config: tuple[Any, ...] = ()  # the leader config difference last warned of (standby)
        self.tick_again = False  # the last tick may be followed at once by another (tick doc)
        self.ticking = threading.Event()  # set while a tick runs (the critical lane's events say so)
        self.lane: CriticalLane | None = None  # the critical lane while leading (Settings.critical_lane)
        self.lock_ttl_s = settings.planner_lock_ttl_s
        # the lock's commands on a client of their own whose replies wait at most what the lock
        # allows: an extend blocked on a half-open connection fails before the lock can expire
        self.lock_client = with_socket_timeout(r, settings.planner_lock_socket_timeout_s)
        # while leading: the clock's monotonic time until which the leader lock is surely held
        # (the last acquire or extend sent + its TTL); None: no lock (tests tick by hand)
        self.lock_held_until_s: float | None = None
        from makespan.workers.retention import Retention

        self.retention = Retention(r, settings)  # bounded state: at most one sweep per tick
        from makespan.workers.delayed import DelayedJobs

        self.delayed = DelayedJobs(r, self.keys)
        self.agenda: AgendaTracker | None = None
        try:
            from makespan.workers.agenda import AgendaTracker

            self.agenda = AgendaTracker(r, self.keys)
        except ImportError:  # pragma: no cover
            pass
        self.env = TickEnv(r, settings, fleet, self.keys, self.leases, self.delayed, self.retention, self.agenda,
                           tuple(fleet_gpus(fleet)),
                           tuple((endpoint, tuple(gpus)) for endpoint, gpus in set_point_instances(fleet)),
                           self.clock, dispatch, whole_fleet=self.whole_fleet)
        improver = (BackgroundImprover(settings.policy, settings.solve_time_limit_s,
                                       executor=settings.improver_executor, child_nice=settings.improver_nice)
                    if POLICY_REGISTRY.lookup(settings.policy).improver else None)
        self.kept = CrossTickState(endpoints=endpoint_models(fleet), improver=improver)

    @property
    def improver(self) -> BackgroundImprover | None:
        """The background improver of a solver policy (None for the others)."""
        return self.kept.improver

    # -- leadership ----------------------------------------------------------------------
    def _lead(self):
        lock = self.lock_client.lock(self.keys.planner_leader, timeout=self.lock_ttl_s, thread_local=False)
        outage = OutageLog(log, f"{self.name} standing by")
        said_standing_by = False
        while not self._stop.is_set():
            try:  # a standby must outlive a Redis restart or a dropped connection
                asked_s = self.clock.monotonic()  # the lock's TTL runs from a moment after this
                # each wait is short whatever the TTL: a stop is seen between two (SIGTERM's bound)
                got = lock.acquire(blocking=True, blocking_timeout=min(self.lock_ttl_s / 4, STANDBY_WAIT_S))
                outage.ok()
                self.redis_answered = True
                if not got:
                    if not said_standing_by:  # once per wait: the log says the standby is up
                        said_standing_by = True
                        self._say_standing_by()
                    self._compare_with_leader()
                    continue
                self._take_office(lock)
                self.lock_held_until_s = asked_s + self.lock_ttl_s
                return lock
            except redis.RedisError as e:
                refused = credentials_refused(self.settings.redis_url, e)
                if refused is not None and not self.redis_answered:
                    raise refused from None  # credentials never accepted: waiting cannot help
                outage.failed(refused or e)
                self._stop.wait(0.2)
        return None

    def _take_office(self, lock) -> None:
        """With ``lock`` just taken: Redis's eviction policy checked
        (:meth:`_check_redis_config`), a fresh fencing token, the fleet and this planner's
        config published, the ``planner_lead`` event. A Redis error (or a Ctrl-C) gives the
        lock back (best effort) before it goes on: a retry could not take the lock this attempt
        holds under its own token, and no planner would lead until the TTL ran out.

        Raises:
            RedisConfigError: an evicting policy (the lock is given back).
            redis.RedisError: Redis failed (the standby loop retries)."""
        try:
            self._check_redis_config(lock)
            previous = max(int(self.token or 0), self._fence_seen)  # held, or seen while standing by
            self.token = str(self.r.incr(self.keys.planner_fence))
            self._fence_seen = max(self._fence_seen, int(self.token))
            if previous and int(self.token) <= previous:
                self._state_lost(previous)
            version = fleet_version(self.whole_fleet)
            p = self.r.pipeline(transaction=True)  # a reader sees the fleet and its version change together
            p.get(self.keys.fleet_version)
            p.get(self.keys.fleet)
            p.get(self.keys.planner_config)  # the last leader's name: this one takes over from it
            p.mset({self.keys.fleet: self.whole_fleet.model_dump_json(), self.keys.fleet_version: version,
                    self.keys.planner_config: json.dumps(self._config())})
            replaced, replaced_fleet, last_config, _ok = p.execute()
            try:
                last_leader = json.loads(last_config or "{}").get("planner")
            except (ValueError, AttributeError):
                last_leader = None
            # the pools whose queues may hold jobs (its own, the replaced fleet's): makespan.workers.pool_rehome
            note_pools_seen(self.r, self.keys, self.pool, replaced_fleet)
            events.record(self.r, self.keys.events, "planner_lead", planner=self.name, pid=os.getpid(),
                          token=int(self.token), policy=self.settings.policy, fleet_version=version,
                          replaced_fleet_version=replaced if replaced != version else None,
                          **({"pool": self.pool} if self.pool else {}))
        except BaseException:  # a Redis error (StoreError derives from the class it wraps), a Ctrl-C
            try:
                lock.release()
            except (LockError, redis.RedisError):
                pass
            raise
        self.kept.idle_gpus_at = None  # another leader counted the idle GPU-seconds while this one stood by
        metrics.planner_leading(self.pool or "", True)
        # a failover reads as one (an SRE: a takeover looked like a first start)
        log.info("%s leads %s(planner fencing token %s)%s", self.name, f"pool {self.pool} " if self.pool else "",
                 self.token, f", taking over from {last_leader}" if last_leader and last_leader != self.name else "")
        if replaced is not None and replaced != version:
            log.warning("%s replaces the published fleet (version %s) with its own (version %s, policy %s): "
                        "queued jobs this fleet cannot run are cancelled at its first tick", self.name,
                        replaced, version, self.settings.policy)

    def _state_lost(self, previous: int) -> None:
        """The fencing counter went back (this planner held, or saw while standing by, token
        ``previous``; ``INCR`` gave :attr:`token`, no more): Redis lost makespan's state,
        restarted without its data (no
        ``appendonly``/``save``, a wiped directory, a redis-server binary that does not read
        it) or the keys were deleted. The jobs accepted before may be gone, silently: logged
        CRITICAL, counted (``makespan_redis_state_lost_total``) and recorded (``redis_state_lost``
        event, in the new stream)."""
        log.critical("%s: the planner fencing counter was reset (INCR gave %s, not more than token %s already seen "
                     "here): Redis lost makespan's state (it "
                     "restarted without its data, or the keys were deleted); jobs accepted before may be gone. Check "
                     "Redis persistence (appendonly), its data directory and that the same redis-server binary reads "
                     "it (docs/durability.md)", self.name, self.token, previous)
        metrics.redis_state_lost()
        events.record(self.r, self.keys.events, "redis_state_lost", planner=self.name, previous_token=previous,
                      token=int(self.token))

    def _config(self) -> dict[str, Any]:
        """What this planner plans with, as it publishes it when it leads (``Keys.planner_config``):
        its name, policy, fleet version and preemption budget (``makespan why`` says how much of it a
        job used), its leader lock's TTL and renewal interval (``why`` tells a silent leader by them)."""
        return {"planner": self.name, "policy": self.settings.policy, "fleet_version": fleet_version(self.whole_fleet),
                "preemption_budget": self.settings.preemption_budget, "lock_ttl_s": self.lock_ttl_s,
                "lock_renewal_s": self.settings.planner_lock_renewal_s}

    def _say_standing_by(self) -> None:
        """Log, once per wait for the lock, that this planner is up and stands by, and for
        whom (an operator read an empty standby log as a planner that never started)."""
        try:
            leader = json.loads(self.r.get(self.keys.planner_config) or "{}").get("planner")
        except (ValueError, AttributeError):
            leader = None
        log.info("%s stands by%s: %s leads; it takes over when the leader lock is free (within %.1f s of a leader "
                 "that dies, at once after one that stops)", self.name, f" for pool {self.pool}" if self.pool else "",
                 leader or "another planner", self.lock_ttl_s)

    def _compare_with_leader(self) -> None:
        """While standing by: warn, once per leader and difference, when the leading planner
        plans with another fleet (version) or policy than this one would after taking over.

        Raises:
            redis.RedisError: Redis failed (the standby loop retries)."""
        raw, fence = self.r.mget(self.keys.planner_config, self.keys.planner_fence)
        if fence and fence.isdigit():  # the highest fencing token seen: a counter gone back below it lost state
            self._fence_seen = max(self._fence_seen, int(fence))
        try:
            theirs = json.loads(raw) if raw else None
        except ValueError:
            theirs = None
        if not isinstance(theirs, dict):
            return  # no leader yet, or one of a version that does not publish it
        mine = self._config()
        differ = [field for field in ("fleet_version", "policy") if theirs.get(field) != mine[field]]
        seen = (theirs.get("planner"), *(theirs.get(field) for field in differ))
        if not differ or seen == self._warned_config:
            return
        self._warned_config = seen
        what = " and ".join(f"{field.replace('_', ' ')} {mine[field]}" for field in differ)
        leader_has = " and ".join(f"{field.replace('_', ' ')} {theirs.get(field)}" for field in differ)
        log.warning("%s stands by with %s, but the leading planner %s runs %s: if it takes over, it plans with "
                    "its own%s; start every planner with the same --fleet file and MAKESPAN_POLICY",
                    self.name, what, theirs.get("planner"), leader_has,
                    " fleet (queued jobs that fleet cannot run are cancelled)" if "fleet_version" in differ else "")

    def _check_redis_config(self, lock) -> None:
        """Checked each time this planner comes to lead (a failover may have promoted a
        Redis configured differently): an evicting ``maxmemory-policy`` makes it give the
        lock back and raise; a Redis that persists nothing is logged as a warning
        (:func:`makespan.redis_conn.check_persistence`).

        Raises:
            RedisConfigError: an evicting policy and no ``allow_evicting_redis``."""
        try:
            check_eviction_policy(self.r, self.settings, process=f"planner {self.name}")
            check_persistence(self.r, process=f"planner {self.name}")
            check_failover_writes(self.r, self.settings.redis_url, process=f"planner {self.name}")
        except RedisConfigError:
            try:
                lock.release()
            except (LockError, redis.RedisError):
                pass
            raise

    def _keep_lock(self, lock, done: threading.Event) -> None:
        """Extend ``lock`` every third of its TTL until deposed or ``done`` (this leadership
        ended: the lock is being released, an extend now would read as a lost lock)."""
        while not self.lost.is_set():
            if done.wait(self.settings.planner_lock_renewal_s):
                return
            self._extend_lock(lock, done)

    def _extend_lock(self, lock, done: threading.Event | None = None) -> None:
        """One extend of ``lock`` to its full TTL: on success :attr:`lock_held_until_s` moves to
        the moment it was sent + the TTL; a lock no longer ours sets :attr:`lost`; a Redis
        error is logged (the tick loop steps down if no extend succeeds before the TTL).
        ``done``: the leadership this extend was sent for; once it ended (``done`` set while
        the extend was in flight) its answer is ignored, so a late one can neither depose nor
        extend a later leadership of this planner (:attr:`lost` and
        :attr:`lock_held_until_s` are that one's)."""
        sent_s = self.clock.monotonic()
        try:
            lock.extend(self.lock_ttl_s, replace_ttl=True)
            if done is None or not done.is_set():
                self.lock_held_until_s = sent_s + self.lock_ttl_s
        except (LockNotOwnedError, LockError):
            if done is not None and done.is_set():
                return
            log.error("%s lost the planner lock; standing by", self.name)
            self.lost.set()
        except redis.RedisError as e:
            log.warning("planner lock extend failed: %s", e)

    def _check_lock_held(self) -> None:
        """Before each tick step: the leader lock is surely still held (its last acquire or
        extend was sent less than its TTL ago on :attr:`clock`'s monotonic time), or the lock
        may have expired and a standby may lead: this planner steps down rather than plan or
        dispatch. No check without a lock (a tick by hand).

        Raises:
            LeaseError: the lock may have expired (the tick loop stands by, giving the lock back
                if it is still ours)."""
        held_until_s = self.lock_held_until_s
        if held_until_s is None:
            return
        late_s = self.clock.monotonic() - held_until_s
        if late_s >= 0:
            raise LeaseError(f"planner lock may have expired: no extend succeeded for {self.lock_ttl_s + late_s:.1f} s "
                             f"(its TTL is {self.lock_ttl_s:g} s); stepping down")

    def stop(self) -> None:
        """Ask :meth:`run` to return (safe from a signal handler: it only sets an event);
        ``run`` then ends the improver's child process (:meth:`close`)."""
        self._stop.set()

    def close(self) -> None:
        """End the background improver and its child process (idempotent). :meth:`run`
        does it on its way out; a caller that ticks by hand calls it when done. Also
        closes the leader lock's own client (the caller's client stays open)."""
        if self.improver is not None:
            self.improver.close()
        if self.lock_client is not self.r:
            self.lock_client.close()

    def _wait_for_work(self) -> None:
        """Sleep until a submission or a lease release wakes us, or one tick passes (less
        when a delayed job falls due sooner). A batch waits at most ``batch_wait_s`` for
        more arrivals before it is planned, but only while the queues hold fewer than
        ``batch_size`` jobs (a full batch cannot grow, and waiting would leave free GPU
        slots idle) and no wake-up since the last tick was a lease release
        (:data:`makespan.keys.WAKE_RELEASE`: GPUs were just given back; waiting would leave
        them idle)."""
        try:
            # a blocking read must end before the socket timeout, which would raise
            wait_s = min(self.delayed.wait_s(self.settings.planner_tick_s), self.settings.redis_socket_timeout_s / 2)
            got = self.r.blpop([self.keys.planner_wake], timeout=wait_s)
            if got and got[1] == WAKE_RELEASE:  # GPUs were given back: no batch wait, no need to count the queues
                self.r.delete(self.keys.planner_wake)  # the coming tick covers every wake-up so far
            elif got:
                p = self.r.pipeline(transaction=False)
                for q in self.keys.queues():
                    p.zcard(q)
                p.lrange(self.keys.planner_wake, 0, -1)
                p.delete(self.keys.planner_wake)  # the coming tick covers every wake-up so far
                *queued, rest, _deleted = p.execute()
                if WAKE_RELEASE not in rest and sum(queued) < self.settings.batch_size:
                    self._batch_wait(self.settings.batch_wait_s)
        except redis.RedisError:
            self._stop.wait(self.settings.planner_tick_s)

    def _batch_wait(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for more arrivals, ending early when a lease release
        (:data:`WAKE_RELEASE`, pushed at the head of the wake list, so no burst of submits
        trims it) or a stop comes; the wake-ups read meanwhile are covered by the coming
        tick."""
        deadline = time.monotonic() + wait_s
        while not self._stop.is_set():
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                break
            # a blocking read must end before the socket timeout, which would raise
            got = self.r.blpop([self.keys.planner_wake], timeout=min(left_s, self.settings.redis_socket_timeout_s / 2))
            if got and got[1] == WAKE_RELEASE:
                break
        self.r.delete(self.keys.planner_wake)

    def run(self) -> None:
        """Stand by until leader, then tick until stopped or deposed (then stand by again).
        On the way out (stopped, or an exception such as KeyboardInterrupt) it ends the
        improver's child process."""
        telemetry.instrument_producer("makespan-planner")
        lock_timing = planner_lock_warning(
            self.settings, self.lock_client.connection_pool.connection_kwargs.get("socket_timeout") or float("inf"))
        if lock_timing is not None:
            log.warning("%s: %s", self.name, lock_timing)
        for timing in (liveness_warning(self.settings), retention_warning(self.settings)):
            if timing is not None:
                log.warning("%s: %s", self.name, timing)
        try:
            try:  # a server that answers the connection with an error (a database number out of range,
                # not Redis): refused now, as waiting for the lock would never fix it
                answer_refused(self.r, process=f"planner {self.name}")
            except redis.RedisError:
                pass  # not answering yet: the stand-by waits for it
            metrics.planner_leading(self.pool or "", False)  # the series exists while it stands by
            while not self._stop.is_set():
                lock = self._lead()
                if lock is None:
                    return
                self._lead_until_stopped(lock)
        finally:
            self.close()
            log.info("%s: stopped", self.name)

    def _lead_until_stopped(self, lock) -> None:
        """Tick while leading, until stopped or deposed; then release the lock, also when
        the tick loop ends by an exception (``KeyboardInterrupt`` from a Ctrl-C, a bug): a
        standby takes over at once instead of after the lock's TTL."""
        self.lost.clear()
        done = threading.Event()
        keeper = threading.Thread(target=self._keep_lock, args=(lock, done), daemon=True)
        keeper.start()
        try:
            self.lane = self._start_lane()
            self._tick_until_deposed()
        finally:
            done.set()  # the keeper extends no more
            self.lock_held_until_s = None
            metrics.planner_leading(self.pool or "", False)
            try:
                if self.lane is not None:
                    self.lane.stop(timeout_s=self.settings.redis_socket_timeout_s)
                    self.lane = None
            finally:
                self._release(lock)

    def _release(self, lock) -> None:
        """Write the queued solve stats, withdraw the pool's offer (:mod:`makespan.pools`: a
        submit in the offer's TTL went to this stopped pool) and give ``lock`` back (best effort: a lock already
        lost, or a Redis that did not answer the stats' write, is left to the TTL; a second
        command to a Redis that does not answer would hold the shutdown another socket
        timeout)."""
        try:
            p = self.r.pipeline(transaction=False)
            queue_solve_stats(p, self.keys, self.kept)
            if self.pool:  # routing skips a pool without an offer: not its stopped planner's for the TTL
                p.delete(self.keys.pool_offer)
            p.execute()
            lock.release()
            log.info("%s: released the leader lock (a standby takes over at once)", self.name)
        except (LockError, redis.RedisError):
            log.info("%s: the leader lock was not released: another planner holds it now, or Redis did not "
                     "answer (then it runs out within its TTL)", self.name)

    def _start_lane(self) -> CriticalLane | None:
        """The critical lane of this leadership (:mod:`makespan.workers.critical_lane`), started;
        None when ``Settings.critical_lane`` is off."""
        if not self.settings.critical_lane:
            return None
        lane = CriticalLane(self.env, self.kept, self.token, self.ticking.is_set)
        lane.start()
        return lane

    def _tick_until_deposed(self) -> None:
        outage = OutageLog(log, f"{self.name} tick")
        while not self._stop.is_set() and not self.lost.is_set():
            try:
                busy = self.tick()
                outage.ok()
            except LeaseError as e:
                log.error("%s: %s", self.name, e)
                self.lost.set()
                break
            except (redis.RedisError, StoreError) as e:  # StoreError: a wrapped Redis error
                outage.failed(credentials_refused(self.settings.redis_url, e) or e)
                busy = False
                time.sleep(0.5)
            except PlannerError as e:  # a plan the evaluator refused (a bug, or a batch read as it changed):
                # this tick leases nothing and the next plans afresh; it ended the planner process, and with
                # no standby every job waited for ever (a full-suite run under worker churn)
                log.error("%s: planning failed, nothing leased this tick; planning again: %s", self.name, e,
                          exc_info=True)
                busy = False
                time.sleep(0.5)
            if not (busy and self.tick_again):
                self._wait_for_work()

    # -- one cycle -----------------------------------------------------------------------
    def now_s(self) -> float:
        """The workload clock, s (the clock's unix time ÷ ``time_scale``)."""
        return self.env.now_s()

    def tick(self) -> bool:
        """One planning cycle: the steps of :attr:`steps` over a fresh context. Returns True
        if it dispatched anything. ``tick_again`` says whether another tick may start more
        at once (it dispatched, and a GPU is still free or a CRITICAL/HIGH job waits); else
        the loop sleeps until woken.

        Raises:
            LeaseError: the planner was fenced off (another planner leads), or its leader lock
                may have expired before a step (:meth:`_check_lock_held`).
            redis.RedisError, StoreError: Redis failed."""
        self.tick_again = False
        ctx = TickContext(self.env, self.kept, self.token)
        self.ticking.set()
        try:
            for step in self.steps:
                if ctx.followed and not getattr(step, "when_followed", False):
                    continue  # a tick that followed the kept plan ends (makespan.workers.follow)
                self._check_lock_held()
                step.run(ctx)
        finally:
            self.ticking.clear()
        self.tick_again = ctx.tick_again()
        return bool(ctx.dispatched)

    # -- one part of a tick, by hand (tools and tests) ----------------------------------
    def form_batch(self, heads: dict[Priority, list[str]] | None = None) -> list[PlanJob]:
        """The batch a tick would form now (:func:`makespan.workers.batch.form_batch`), with
        this planner's token (its fenced drops and cancels apply)."""
        return form_batch(self.env, self.token, heads).jobs

    def fleet_state(self) -> tuple[FleetState, set[str]]:
        """The planner's view of the fleet read now, and the busy GPUs
        (:func:`makespan.workers.fleet_view.read_fleet_state`)."""
        held, res = read_fleet_gpus(self.env)
        gated = host_liveness.read_availability(self.r, self.keys, [host.name for host in self.fleet.hosts]).unavailable
        view = read_fleet_state(self.env, self.kept, held, res, host_liveness.gpus_of(self.fleet, set(gated)))
        return view.state, view.busy

    def check_drain(self) -> dict[str, Any]:
        """Count what a drained fleet must not hold (:func:`makespan.workers.drain.check_drain`)."""
        return check_drain(self.env)
