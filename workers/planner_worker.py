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

This module holds :class:`PlannerWorker`'s leadership (lock, fencing token, standby),
its run loop and the tick itself; the tick's parts are mixins, one module each:

* :mod:`makespan.workers.batch` (``BatchMixin``): the batch, read from the queues;
* :mod:`makespan.workers.fleet_view` (``FleetViewMixin``): the tick's snapshot, the fleet state
  and demand inputs (and the fleet spec → planner model helpers);
* :mod:`makespan.workers.starts` (``StartMixin``): leasing planned jobs and sending their phases;
* :mod:`makespan.workers.preemption` (``PreemptionMixin``): preempting for CRITICAL/HIGH jobs;
* :mod:`makespan.workers.drain` (``SetPointMixin``): set-point restores and the drain check;
* :mod:`makespan.workers.wait_reasons` (``WaitReasonMixin``): each waiting job's reason and ETA.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

import redis
from redis.exceptions import LockError, LockNotOwnedError

from makespan import events, metrics, telemetry
from makespan.errors import LeaseError, RedisConfigError, StoreError
from makespan.keys import Keys
from makespan.models import FleetSpec, Priority, fleet_version
from makespan.redis_conn import check_eviction_policy
from makespan.settings import Settings
from makespan.planner.api import POLICY_OBJECTIVE, lane_replan, plan
from makespan.planner import fast_lane
from makespan.planner.reservation import enforce
from makespan.planner.model import FleetState, Plan, PlanJob
from makespan.planner.replay import state_after
from makespan.workers.batch import BatchMixin
from makespan.workers.drain import SetPointMixin
from makespan.workers.fleet_view import FleetViewMixin, endpoint_models, fleet_gpus, set_point_instances
from makespan.workers.improver import BackgroundImprover
from makespan.workers.leases import LeaseStore
from makespan.workers.plan_view import publish_plan
from makespan.workers.preemption import PreemptionMixin
from makespan.workers.starts import StartMixin
from makespan.workers.wait_reasons import WaitReasonMixin

log = logging.getLogger("makespan.planner")

SOLVER_POLICIES = ("default", "cpsat", "tardiness")  # run as a greedy floor per tick + the improver off the tick
FLOOR_POLICY = {"tardiness": "tardiness-portfolio"}  # the per-tick floor of a solver policy (else portfolio)


class PlannerWorker(BatchMixin, FleetViewMixin, StartMixin, PreemptionMixin, SetPointMixin, WaitReasonMixin):
    """One planner process. ``run()`` loops until ``stop()``; ``tick()`` is one cycle."""

    def __init__(self, r: redis.Redis, settings: Settings, fleet: FleetSpec, dispatch=None, name: str | None = None):
        self.r, self.settings, self.fleet = r, settings, fleet
        self.keys = Keys(settings.key_prefix)
        self.leases = LeaseStore(r, self.keys)
        self.name = name or f"planner-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.endpoints = endpoint_models(fleet)
        self.gpus = fleet_gpus(fleet)
        self.set_points = set_point_instances(fleet)
        self._dispatch = dispatch
        self._solve_stats: list[str] = []
        self._stop = threading.Event()
        self.token = ""
        self.lost = threading.Event()
        self._idle_checked = False
        self.tick_again = False
        self._meta: dict[str, tuple[str, float]] = {}
        self._recent: dict[str, PlanJob] = {}
        self.improver = (BackgroundImprover(settings.policy, settings.solve_time_limit_s,
                                            executor=settings.improver_executor,
                                            child_nice=settings.improver_nice)
                         if settings.policy in SOLVER_POLICIES else None)
        self._last_tp: dict[str, str] = {}  # GPU -> traceparent of the last job leased on it
        self.lock_ttl_s = max(settings.lease_ttl_s / 2, 1.0)
        from makespan.workers.retention import Retention

        self.retention = Retention(r, settings)  # bounded state: at most one sweep per tick
        from makespan.workers.delayed import DelayedJobs

        self.delayed = DelayedJobs(r, self.keys)
        try:
            from makespan.workers.agenda import AgendaTracker

            self.agenda = AgendaTracker(r, self.keys)
        except ImportError:  # pragma: no cover
            self.agenda = None

    # -- leadership ----------------------------------------------------------------------
    def _lead(self):
        lock = self.r.lock(self.keys.planner_leader, timeout=self.lock_ttl_s, thread_local=False)
        while not self._stop.is_set():
            try:  # a standby must outlive a Redis restart or a dropped connection
                if lock.acquire(blocking=True, blocking_timeout=self.lock_ttl_s / 4):
                    self._check_redis_config(lock)
                    self.token = str(self.r.incr(self.keys.planner_fence))
                    self.r.mset({self.keys.fleet: self.fleet.model_dump_json(),
                                 self.keys.fleet_version: fleet_version(self.fleet)})
                    log.info("%s leads (planner fencing token %s)", self.name, self.token)
                    events.record(self.r, self.keys.events, "planner_lead", planner=self.name, pid=os.getpid(),
                                  token=int(self.token))
                    return lock
            except redis.RedisError as e:
                log.warning("%s: Redis unavailable while standing by: %s", self.name, e)
                self._stop.wait(0.2)
        return None

    def _check_redis_config(self, lock) -> None:
        """Checked each time this planner comes to lead (a failover may have promoted a
        Redis configured differently): an evicting ``maxmemory-policy`` makes it give the
        lock back and raise.

        Raises:
            RedisConfigError: an evicting policy and no ``allow_evicting_redis``."""
        try:
            check_eviction_policy(self.r, self.settings, process=f"planner {self.name}")
        except RedisConfigError:
            try:
                lock.release()
            except (LockError, redis.RedisError):
                pass
            raise

    def _keep_lock(self, lock) -> None:
        while not self._stop.is_set() and not self.lost.is_set():
            time.sleep(self.lock_ttl_s / 3)
            try:
                lock.extend(self.lock_ttl_s, replace_ttl=True)
            except (LockNotOwnedError, LockError):
                log.error("%s lost the planner lock; standing by", self.name)
                self.lost.set()
            except redis.RedisError as e:
                log.warning("planner lock extend failed: %s", e)

    def stop(self) -> None:
        """Ask :meth:`run` to return (safe from a signal handler: it only sets an event);
        ``run`` then ends the improver's child process (:meth:`close`)."""
        self._stop.set()

    def close(self) -> None:
        """End the background improver and its child process (idempotent). :meth:`run`
        does it on its way out; a caller that ticks by hand calls it when done."""
        if self.improver is not None:
            self.improver.close()

    def _wait_for_work(self) -> None:
        """Sleep until a submission or a lease release wakes us, or one tick passes (less
        when a delayed job falls due sooner). A batch waits at most ``batch_wait_s`` for
        more arrivals before it is planned, but only while the queues hold fewer than
        ``batch_size`` jobs: a full batch cannot grow, and waiting would leave free GPU
        slots idle."""
        try:
            # a blocking read must end before the socket timeout, which would raise
            wait_s = min(self.delayed.wait_s(self.settings.planner_tick_s), self.settings.redis_socket_timeout_s / 2)
            if self.r.blpop([self.keys.planner_wake], timeout=wait_s):
                p = self.r.pipeline(transaction=False)
                for q in self.keys.queues():
                    p.zcard(q)
                p.delete(self.keys.planner_wake)  # the coming tick covers every wake-up so far
                if sum(p.execute()[:-1]) < self.settings.batch_size:
                    self._stop.wait(self.settings.batch_wait_s)
                    self.r.delete(self.keys.planner_wake)
        except redis.RedisError:
            self._stop.wait(self.settings.planner_tick_s)

    def run(self) -> None:
        """Stand by until leader, then tick until stopped or deposed (then stand by again).
        On the way out (stopped, or an exception such as KeyboardInterrupt) it ends the
        improver's child process."""
        telemetry.instrument_producer("makespan-planner")
        try:
            while not self._stop.is_set():
                lock = self._lead()
                if lock is None:
                    return
                self._lead_until_stopped(lock)
        finally:
            self.close()

    def _lead_until_stopped(self, lock) -> None:
        """Tick while leading, until stopped or deposed; then release the lock."""
        self.lost.clear()
        keeper = threading.Thread(target=self._keep_lock, args=(lock,), daemon=True)
        keeper.start()
        while not self._stop.is_set() and not self.lost.is_set():
            try:
                busy = self.tick()
            except LeaseError as e:
                log.error("%s: %s", self.name, e)
                self.lost.set()
                break
            except (redis.RedisError, StoreError) as e:  # StoreError: a wrapped Redis error
                log.warning("planner tick failed (Redis): %s", e)
                busy = False
                time.sleep(0.5)
            if not (busy and self.tick_again):
                self._wait_for_work()
        try:
            p = self.r.pipeline(transaction=False)
            self._write_solve_stats(p)
            p.execute()
            lock.release()
        except (LockError, redis.RedisError):
            pass

    # -- one cycle -----------------------------------------------------------------------
    def now_s(self) -> float:
        return time.time() / self.settings.time_scale

    def tick(self) -> bool:
        """One planning cycle. Returns True if it dispatched anything. ``tick_again``
        says whether another tick may start more at once (it dispatched, and a GPU is
        still free or a CRITICAL/HIGH job waits); else the loop sleeps until woken."""
        self.tick_again = False
        self.victims_now = []
        self.retention.maybe_sweep()
        self.delayed.promote(self.token)  # due delayed jobs (delay_s, retry backoff) join their queue
        snap = self.snapshot()
        if snap["expired"]:
            reclaimed = self.leases.reclaim_expired(self.settings.max_attempts, self.settings.retry_backoff_s,
                                                    self.settings.retry_backoff_max_s, expired=snap["expired"])
            if reclaimed:
                log.warning("reclaimed expired leases: %s", reclaimed)
                for _ in range(sum(reclaimed.values())):
                    metrics.lease_reclaimed()
            if reclaimed.get("requeued") and self.settings.retry_backoff_s > 0:  # now in P:delayed: wake up
                first_wait_s = min(self.settings.retry_backoff_s, self.settings.retry_backoff_max_s)
                self.delayed.note_due(self.delayed.server_now_s() + first_wait_s)  # when the first is due
            snap = self.snapshot()  # reclaims freed GPUs and requeued jobs
        if self.agenda is not None and snap["agenda"]:
            self.agenda.reap()
        busy = {g.uuid for g, v in zip(self.gpus, snap["held"]) if v}
        heads = None if snap["workloads"] else snap["heads"]
        may_preempt = bool(snap["heads"][Priority.CRITICAL] or snap["heads"][Priority.HIGH])
        formed = len(busy) < len(self.gpus) or may_preempt
        batch = self.form_batch(heads) if formed else []
        if not batch:
            if formed and (self._unready or self._left_out):  # only unready steps read: say why they wait
                self._write_wait_reasons([], self.fleet_state(snap)[0], Plan(self.settings.policy, []), set())
            elif formed:  # nothing queued: no job waits for any reason
                self._clear_reason_counts()
            return self._idle(busy) if len(busy) < len(self.gpus) else False
        state, busy = self.fleet_state(snap)
        self._note_demand(batch, state)
        self._idle_checked = False
        t0 = time.perf_counter()
        if self.improver is not None:  # a solver policy: greedy floor now, CP-SAT off the tick
            floor = plan(batch, state, FLOOR_POLICY.get(self.settings.policy, "portfolio"))
            p = self.improver.best(floor, batch, state)
        else:
            p = plan(batch, state, self.settings.policy, time_limit_s=self.settings.solve_time_limit_s)
        # no starvation: the aged job's reservation, backfilled (makespan.planner.reservation)
        p, res = enforce(p, batch, state, self.settings.reservation_after_s,
                         POLICY_OBJECTIVE.get(self.settings.policy, "weighted_completion"))
        self.reservations = {x.job_id: x for x in res}
        # no class worse off than strict priority: the fast lane's levels (makespan.planner.fast_lane)
        p, _late = fast_lane.enforce(p, batch, state, self.settings.fast_lane_levels,
                                     objective=POLICY_OBJECTIVE.get(self.settings.policy, "weighted_completion"),
                                     replan=lane_replan(self.settings.policy))
        solve_s = time.perf_counter() - t0
        metrics.observe_solve(solve_s, len(batch))
        self._solve_stats.append(f"{solve_s:.6f}:{len(batch)}")  # written with the next snapshot
        publish_plan(self.r, self.keys, p, batch, state.now_s, self.settings.time_scale)  # P:plan, for the dashboard
        jobs = {j.id: j for j in batch}
        taken: set[str] = set(busy)
        dispatched: set[str] = set()
        eps = 1e-6 * max(1.0, abs(state.now_s))
        starts = []
        for a in sorted(p.assignments, key=lambda a: (a.start_s, a.end_s)):
            if a.start_s > state.now_s + eps or taken.intersection(a.gpus):
                continue
            taken.update(a.gpus)
            starts.append((jobs[a.job_id], a.gpus, a.end_s, a.load))
        # the plan's transition choice per start (issue 20 point 3), read by StartMixin._started
        self._planned_sleep = {a.job_id: dict(a.sleep_levels) for a in p.assignments if a.sleep_levels}
        # everything here starts now: lease in priority order (a CRITICAL job's lease is never
        # issued after a LOW job's of the same tick), then submission order
        starts.sort(key=lambda s: (s[0].priority, s[0].seq))
        started = self._start_many(starts)
        dispatched |= started
        waiting = [j for j in batch if j.id not in dispatched and j.priority <= int(Priority.HIGH)]
        self.requeued_now, self.victims_now = 0, []
        if waiting:  # scored or by the rule (workers/preemption.py)
            dispatched |= self._preempt(waiting, state, taken, batch, p, started)
        if not self.requeued_now:  # victims back in the queue are not in the batch: p may not leave GPUs idle
            self._restore_planned(batch, state, p, taken)
        if self.improver is not None:
            self._offer_rest(batch, state, p, started, dispatched)
        self._write_wait_reasons(batch, state, p, dispatched)  # one script: reason and ETA of each job left waiting
        # tick again at once only if another tick may start something: a GPU is still free
        # or a CRITICAL/HIGH job still waits; else sleep until a release or submission
        self.tick_again = bool(dispatched) and (len(taken) < len(self.gpus) or bool(waiting))
        return bool(dispatched)

    def _offer_rest(self, batch: list[PlanJob], state: FleetState, p, started: set[str],
                    dispatched: set[str]) -> None:
        """Hand the jobs this tick left queued to the background improver, on the fleet as
        the plan's starts of this tick (``started``) leave it, replayed (GPUs busy until
        their planned end, evicted endpoints asleep where they have a sleep mode). Jobs
        started by preemption keep the victims' GPUs busy as the state has them."""
        rest = [j for j in batch if j.id not in dispatched]
        horizon_s = (max((a.end_s for a in p.assignments), default=state.now_s) - state.now_s) * self.settings.time_scale
        if not rest or not self.improver.worth_solving(horizon_s):
            return
        jobs = {j.id: j for j in batch}
        self.improver.offer(rest, state_after(state, jobs, p.assignments, started))

