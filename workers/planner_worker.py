"""The planner worker: one active at a time (Redis lock + fencing token), the rest
stand by and take over within the lock's TTL.

Each tick the leader: reclaims expired leases; forms a batch (strict priority:
CRITICAL jobs first, then HIGH, NORMAL, LOW; at most ``batch_size``); reads the fleet
state; calls the pure ``planner.api.plan``; publishes a lease for every job the plan
starts now (one Lua script per gang: leased whole or not at all, the job acknowledged
in the same step) and sends its phase chain to the host's queue. Jobs planned for
later stay queued and are planned again next tick (rolling horizon). It starts the
plan's set-point restores that start now (a set-point group the plan leaves idle); when
nothing is queued or running it restores every set point and checks the drain.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid

import redis
from redis.exceptions import LockError, LockNotOwnedError

from app import events, metrics, telemetry
from app.awaited import DROP_LUA
from app.errors import LeaseError, StoreError
from app.keys import Keys
from app.models import FleetSpec, Priority
from app.settings import Settings
from planner.api import plan
from planner.simulator import _demand, _share
from planner.model import EndpointModel, FleetState, Gpu, PlanJob
from planner.replay import state_after
from workers.drain import SetPointMixin
from workers.improver import BackgroundImprover
from workers.leases import LeaseStore
from workers.preemption import PreemptionMixin
from workers.phases import PhaseContext, instance_value, parse_instance

log = logging.getLogger("makespan.planner")

STATS_KEEP = 10_000
SCAN_FACTOR = 4  # queue entries read per level per tick: at most SCAN_FACTOR × batch_size

# Remove a stale queue entry. KEYS: queue, job, planner_fence ; ARGV: job id, planner token
_DROP_STALE = """
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
if redis.call('HGET', KEYS[2], 'state') == 'queued' then return 0 end
return redis.call('ZREM', KEYS[1], ARGV[1])
"""

# Cancel a queued job whose dependency failed (it leaves the reverse-dependency index,
# app.awaited). KEYS: queue, job, planner_fence, events, finished ; ARGV: job id, planner
# token, now (s), reason, event JSON, key prefix
_CANCEL_DEPENDANT = DROP_LUA + """
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
if redis.call('HGET', KEYS[2], 'state') ~= 'queued' then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
awaited_drop(ARGV[6], ARGV[1], redis.call('HGET', KEYS[2], 'deps'))
redis.call('HSET', KEYS[2], 'state', 'cancelled', 'finished_at', ARGV[3], 'reason', ARGV[4])
redis.call('ZADD', KEYS[5], tonumber(ARGV[3]), ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000000', '*', 'e', ARGV[5])
return 1
"""
DEMAND_WINDOW_S = 1800.0  # workload seconds of arrivals that define recent demand
DEMAND_KEEP = 5_000  # most recent arrivals remembered for it
SOLVER_POLICIES = ("default", "cpsat", "tardiness")  # run as a greedy floor per tick + the improver off the tick
FLOOR_POLICY = {"tardiness": "tardiness-portfolio"}  # the per-tick floor of a solver policy (else portfolio)


def endpoint_models(fleet: FleetSpec) -> dict[str, EndpointModel]:
    return {n: EndpointModel(n, e.tensor_parallel, e.memory_mib_per_gpu, e.cold_start_s, e.evict_s, e.wake_s, e.slots)
            for n, e in fleet.endpoints.items()}


def fleet_gpus(fleet: FleetSpec) -> list[Gpu]:
    return [Gpu(g.uuid, h.name, g.index, g.memory_mib) for h in fleet.hosts for g in h.gpus]


def set_point_instances(fleet: FleetSpec) -> list[tuple[str, list[str]]]:
    """(endpoint, GPU UUIDs) of every set-point instance."""
    hosts = {h.name: h for h in fleet.hosts}
    out = []
    for e in fleet.endpoints.values():
        for sp in e.set_point:
            by_index = {g.index: g.uuid for g in hosts[sp.host].gpus}
            out.append((e.name, [by_index[i] for i in sp.gpus]))
    return out


class PlannerWorker(PreemptionMixin, SetPointMixin):
    """One planner process. ``run()`` loops until ``stop()``; ``tick()`` is one cycle."""

    _removed = 0  # queue entries removed (stale, cancelled) while form_batch read the current chunk

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
        from workers.retention import Retention

        self.retention = Retention(r, settings)  # bounded state: at most one sweep per tick
        from workers.delayed import DelayedJobs

        self.delayed = DelayedJobs(r, self.keys)
        try:
            from workers.agenda import AgendaTracker

            self.agenda = AgendaTracker(r, self.keys)
        except ImportError:  # pragma: no cover
            self.agenda = None

    # -- leadership ----------------------------------------------------------------------
    def _lead(self):
        lock = self.r.lock(self.keys.planner_leader, timeout=self.lock_ttl_s, thread_local=False)
        while not self._stop.is_set():
            try:  # a standby must outlive a Redis restart or a dropped connection
                if lock.acquire(blocking=True, blocking_timeout=self.lock_ttl_s / 4):
                    self.token = str(self.r.incr(self.keys.planner_fence))
                    self.r.set(self.keys.fleet, self.fleet.model_dump_json())
                    log.info("%s leads (planner fencing token %s)", self.name, self.token)
                    events.record(self.r, self.keys.events, "planner_lead", planner=self.name, pid=os.getpid(),
                                  token=int(self.token))
                    return lock
            except redis.RedisError as e:
                log.warning("%s: Redis unavailable while standing by: %s", self.name, e)
                self._stop.wait(0.2)
        return None

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
            if self.r.blpop([self.keys.planner_wake], timeout=self.delayed.wait_s(self.settings.planner_tick_s)):
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

    def snapshot(self) -> dict:
        """What every tick reads, in one round trip: expired lease ids (on the Redis
        server's clock), the number of open agenda entries, GPU holders and residents
        (MGET, fleet order), whether a workload is active, and the first ``batch_size``
        ids of every queue (CRITICAL first)."""
        uuids = [g.uuid for g in self.gpus]
        p = self.r.pipeline(transaction=False)
        self._write_solve_stats(p)
        self.leases.expired(pipe=p)  # on the Redis server's clock
        p.zcard(self.keys.agenda_index)
        p.mget([self.keys.gpu(u) for u in uuids])
        p.mget([self.keys.resident(u) for u in uuids])
        p.scard(self.keys.workloads_active)
        for q in self.keys.queues():
            p.zrange(q, 0, self.settings.batch_size - 1)
        expired, agenda, held, res, workloads, *heads = p.execute()[-(5 + len(Priority)):]
        return {"expired": expired, "agenda": agenda, "held": held, "resident": res, "workloads": workloads,
                "heads": dict(zip(Priority, heads))}

    def _write_solve_stats(self, p) -> None:
        """Queue the solve times noted since the last call on pipeline ``p`` (the list
        ``P:planner:solve_s``, ``seconds:batch size``, capped at STATS_KEEP)."""
        if self._solve_stats:
            p.rpush(f"{self.keys.prefix}:planner:solve_s", *self._solve_stats)
            p.ltrim(f"{self.keys.prefix}:planner:solve_s", -STATS_KEEP, -1)
            self._solve_stats = []

    def fleet_state(self, snap: dict | None = None) -> tuple[FleetState, set[str]]:
        """The planner's view of the fleet (free times, residents, set point) and the busy
        GPUs, from ``snap`` (:meth:`snapshot`) or read now."""
        uuids = [g.uuid for g in self.gpus]
        if snap is None:
            p = self.r.pipeline(transaction=False)
            p.mget([self.keys.gpu(u) for u in uuids])
            p.mget([self.keys.resident(u) for u in uuids])
            held, res = p.execute()
        else:
            held, res = snap["held"], snap["resident"]
        now = self.now_s()
        free_at: dict[str, float] = {}
        busy: set[str] = set()
        lease_ids = sorted({v.split(":")[0] for v in held if v})
        ends: dict[str, float] = {}
        if lease_ids:
            p = self.r.pipeline(transaction=False)
            for lid in lease_ids:
                p.hget(self.keys.lease(lid), "planned_end_s")
            ends = {lid: float(pe) if pe else now for lid, pe in zip(lease_ids, p.execute())}
        # a held GPU whose holder overran its planned end is not free now: it frees at a
        # release the planner cannot date, so it counts as busy for at least one more tick
        # (else a plan would start a job "now" on it, the tick would skip that job, and
        # lower-priority jobs would take the GPUs that are really free)
        held_min_s = now + self.settings.planner_tick_s / self.settings.time_scale
        for u, v in zip(uuids, held):
            if v:
                busy.add(u)
                free_at[u] = max(held_min_s, ends.get(v.split(":")[0], now))
            else:
                free_at[u] = now
        resident = {}
        for u, v in zip(uuids, res):
            inst = parse_instance(v)
            resident[u] = inst[0] if inst else None
        sp = self.fleet.set_point_by_gpu()
        return FleetState(now, self.gpus, self.endpoints, free_at, resident, sp,
                          set_point_weight=self.settings.set_point_weight), busy

    def form_batch(self, heads: dict[Priority, list[str]] | None = None) -> list[PlanJob]:
        """Up to ``batch_size`` queued jobs, CRITICAL first (strict priority), FIFO within a
        level. ``heads``: the first ``batch_size`` ids of each queue, already read (they
        are read again here when a workload pass may have changed the queues)."""
        out: list[PlanJob] = []
        self._meta: dict[str, tuple[str, float]] = {}
        self.awaited: set[str] = set()  # deps of the unready steps read here (never victims; plus the index)
        room = self.settings.batch_size
        if heads is None and self.r.scard(self.keys.workloads_active):
            from app.workloads import advance_workloads  # workload steps: retries, failure, completion

            advance_workloads(self.r, self.keys)
        for lvl in Priority:
            offset = 0
            # read on past steps whose dependencies are not done, so that they never hide
            # startable jobs behind them (bounded: SCAN_FACTOR batches per level per tick);
            # what a step waits on is known at any depth from the index (app.awaited)
            while room > 0 and offset < SCAN_FACTOR * self.settings.batch_size:
                if offset == 0 and heads is not None:
                    ids = heads[lvl]
                else:
                    ids = self.r.zrange(self.keys.queue(lvl), offset, offset + self.settings.batch_size - 1)
                if not ids:
                    break
                self._removed = 0
                room = self._take(lvl, ids, out, room)
                offset += len(ids) - self._removed  # entries removed meanwhile: the rest moved up
        return out

    def _take(self, lvl: Priority, ids: list[str], out: list[PlanJob], room: int) -> int:
        p = self.r.pipeline(transaction=False)
        for jid in ids:
            p.hmget(self.keys.job(jid), "endpoint", "service_s", "submitted_at", "seq", "deps", "state",
                    "traceparent", "deadline_s")
        for jid, (ep, svc, sub, seq, deps, state, tp, due) in zip(ids, p.execute()):
            if ep is None or state != "queued":
                self._drop_stale(self.keys.queue(lvl), jid)  # cancelled or lost record
                continue
            dl = tuple(json.loads(deps)) if deps else ()
            if room <= 0:  # not in the batch (what it waits on is in the index)
                continue
            if dl and not self._deps_ready(jid, dl):
                self.awaited.update(dl)
                continue
            r_s = float(sub) / self.settings.time_scale  # workload clock; service and deadline are workload s
            out.append(PlanJob(jid, ep, float(lvl.weight), r_s, float(svc),
                               int(lvl), (), r_s + float(due) if due else None, int(seq)))
            self._meta[jid] = (tp or "", float(sub))
            room -= 1
        return room

    def _drop_stale(self, queue: str, jid: str) -> None:
        """Remove a queue entry whose job is no longer queued — only while this planner
        still leads and the job is still not queued (a reaper may have requeued it since)."""
        self._removed += int(self.r.eval(_DROP_STALE, 3, queue, self.keys.job(jid), self.keys.planner_fence, jid,
                                         self.token) or 0)

    def _deps_ready(self, jid: str, deps: tuple[str, ...]) -> bool:
        states = [self.r.hget(self.keys.job(d), "state") for d in deps]
        if all(s == "completed" for s in states):
            return True
        bad = [d for d, s in zip(deps, states) if s in ("failed", "cancelled") or s is None]
        if bad and "failed" in states:
            from app.workloads import retry_pending  # a workload step that will be retried: wait

            bad = [d for d in bad if not retry_pending(self.r, self.keys, d)]
        if bad:
            prio = self.r.hget(self.keys.job(jid), "priority") or "NORMAL"
            reason = f"dependency {bad[0]} did not complete"
            ev = json.dumps({"ts": time.time(), "kind": "cancelled", "job": jid, "priority": prio, "reason": reason})
            self._removed += int(self.r.eval(
                _CANCEL_DEPENDANT, 5, self.keys.queue(prio), self.keys.job(jid), self.keys.planner_fence,
                self.keys.events, f"{self.keys.prefix}:finished", jid, self.token, repr(time.time()), reason, ev,
                self.keys.prefix) or 0)
        return False

    def tick(self) -> bool:
        """One planning cycle. Returns True if it dispatched anything. ``tick_again``
        says whether another tick may start more at once (it dispatched, and a GPU is
        still free or a CRITICAL/HIGH job waits); else the loop sleeps until woken."""
        self.tick_again = False
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
        batch = self.form_batch(heads) if len(busy) < len(self.gpus) or may_preempt else []
        if not batch:
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
        solve_s = time.perf_counter() - t0
        metrics.observe_solve(solve_s, len(batch))
        self._solve_stats.append(f"{solve_s:.6f}:{len(batch)}")  # written with the next snapshot
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
        # everything here starts now: lease in priority order (a CRITICAL job's lease is never
        # issued after a LOW job's of the same tick), then submission order
        starts.sort(key=lambda s: (s[0].priority, s[0].seq))
        started = self._start_many(starts)
        dispatched |= started
        waiting = [j for j in batch if j.id not in dispatched and j.priority <= int(Priority.HIGH)]
        self.requeued_now = 0
        if waiting:  # scored or by the rule (workers/preemption.py)
            dispatched |= self._preempt(waiting, state, taken, batch, p, started)
        if not self.requeued_now:  # victims back in the queue are not in the batch: p may not leave GPUs idle
            self._restore_planned(batch, state, p, taken)
        if self.improver is not None:
            self._offer_rest(batch, state, p, started, dispatched)
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

    def _note_demand(self, batch: list[PlanJob], state: FleetState) -> None:
        """Fill the planner's future-cost inputs from arrivals of the last DEMAND_WINDOW_S
        workload seconds (as the simulator does): demand weight and work share per endpoint."""
        for j in batch:
            self._recent.setdefault(j.id, j)
        horizon = state.now_s - DEMAND_WINDOW_S
        if len(self._recent) > DEMAND_KEEP or any(j.release_s < horizon for j in self._recent.values()):
            keep = sorted((j for j in self._recent.values() if j.release_s >= horizon), key=lambda j: j.release_s)
            self._recent = {j.id: j for j in keep[-DEMAND_KEEP:]}
        recent = list(self._recent.values())
        state.demand = _demand(recent)
        state.demand_share = _share(recent, state)

    def _start_many(self, starts: list[tuple[PlanJob, tuple[str, ...], float, str]]) -> set[str]:
        """Lease and send every (job, gpus, planned end, load) of ``starts``, in order;
        the leases in one round trip (each its own atomic script) unless tracing is on
        (then one ``allocate_gpus`` span per lease). Returns the ids of the jobs started.

        Raises:
            LeaseError: the planner was fenced off (after sending what it leased before).
        """
        if len(starts) <= 1 or telemetry.tracing_enabled():
            return {s[0].id for s in starts if self._start(*s)}
        reqs = [self._lease_request(*s) for s in starts]
        leases, fenced = self.leases.acquire_many(reqs)
        started = {s[0].id for s, q, lease in zip(starts, reqs, leases) if lease is not None and self._started(
            s[0], s[1], q["holder"], lease)}
        if fenced:
            raise LeaseError("planner fencing token is stale: another planner leads")
        return started

    def _lease_request(self, j: PlanJob, gpus: tuple[str, ...], end_s: float, load: str) -> dict:
        """The :meth:`LeaseStore.acquire` arguments of a job lease."""
        prio = Priority(j.priority)
        host = self.fleet.host_of(gpus[0])
        return dict(lease_id=uuid.uuid4().hex, gpus=gpus, ttl_s=self.settings.lease_ttl_s, job_id=j.id, kind="job",
                    holder=host, queue=self.keys.queue(prio), planner_token=self.token,
                    info={"planned_end_s": repr(end_s), "endpoint": j.endpoint, "priority": prio.name},
                    event={"endpoint": j.endpoint, "priority": prio.name, "host": host, "load": load,
                           "planned_s": end_s - self.now_s()}, instance=instance_value(j.endpoint, gpus))

    def _start(self, j: PlanJob, gpus: tuple[str, ...], end_s: float, load: str) -> bool:
        """Lease ``gpus`` for job ``j`` and send its phase chain. False if the lease failed."""
        q = self._lease_request(j, gpus, end_s, load)
        tp = self._meta.get(j.id, ("", 0.0))[0]
        attrs = {"job_id": j.id, "priority": Priority(j.priority).name, "endpoint": j.endpoint, "gpus": list(gpus),
                 "host": q["holder"], "lease_id": q["lease_id"], "planned_s": end_s - self.now_s()}
        with telemetry.phase_span("allocate_gpus", tp, attrs):
            lease = self.leases.acquire(**q)
        return lease is not None and self._started(j, gpus, q["holder"], lease)

    def _started(self, j: PlanJob, gpus: tuple[str, ...], host: str, lease) -> bool:
        """After ``lease`` was published for ``j``: metrics, and send its phase chain."""
        prio = Priority(j.priority)
        lid = lease.lease_id
        tp, sub = self._meta.get(j.id, ("", 0.0))
        if sub:
            metrics.observe_wait(prio, max(0.0, time.time() - sub))
        ctx = PhaseContext(lid, lease.token, list(gpus), host, "job", j.endpoint, j.id, prio.name, j.service_s,
                           traceparent=tp, submitted_at=sub)
        for g in gpus:
            self._last_tp[g] = tp
        with telemetry.use_traceparent(tp):
            self._send(ctx, host, lease.warm)
        return True

    def _send(self, ctx: PhaseContext, host: str, warm: bool = False) -> None:
        """Send the phase chain. A publish that fails (broker connection lost mid-send;
        kombu may raise more than redis errors then) must not kill the planner: the
        lease is never renewed, so it expires and the reaper requeues the job."""
        try:
            if self._dispatch is not None:
                self._dispatch(ctx, self.keys.host_queue(host))
            else:
                from workers.tasks import dispatch

                dispatch(ctx, self.keys.host_queue(host), warm)
        except Exception as e:  # noqa: BLE001 - recovered through lease expiry, see above
            log.error("dispatch of lease %s (job %s) failed: %r; it will expire and be reclaimed",
                      ctx.lease_id, ctx.job_id or ctx.kind, e)
