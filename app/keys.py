"""Every Redis key makespan uses, in one place, under one prefix.

Schema (``P`` is :attr:`makespan.settings.Settings.key_prefix`, default ``makespan``):

=====================================  ======  ==============================================
key                                    type    contents
=====================================  ======  ==============================================
``P:queue:{level}``                    zset    queued job ids, score = submission seq (FIFO)
``P:job:{id}``                         hash    job record (spec JSON, state, times, reason)
``P:idem:{key}``                       string  job id for an idempotency key
``P:seq``                              string  monotonic submission counter
``P:delayed``                          zset    delayed job ids, score = due time (unix s)
``P:fence``                            string  monotonic fencing-token counter
``P:gpu:{uuid}``                       string  ``{lease_id}:{token}`` of the GPU's lease (PX ttl)
``P:gpu_owner``                        hash    ``P:gpu:{uuid}`` -> lease id that last took it (no TTL: a
                                               GPU whose ``P:gpu`` key is lost stays refused
                                               while that lease is live in ``P:leases``)
``P:lease:{lease_id}``                 hash    lease record: job, gpus, token, holder, expiry
``P:leases``                           zset    live lease ids, score = expiry (unix ms)
``P:resident:{uuid}``                  string  endpoint loaded on this GPU (absent: empty)
``P:running``                          zset    job ids holding a lease, score = lease time
``P:phase:{lease_id}``                 hash    phase -> ``done`` (idempotency of phase tasks)
``P:busy:{lease_id}``                  string  a busy endpoint slot (execute phase in progress)
``P:agenda:{op_id}``                   hash    agenda entry (see makespan.workers.agenda)
``P:agenda:index``                     zset    open agenda op ids, score = expected end
``P:agenda:{op_id}:lock``              string  the agenda entry's lock (redis-py Lock)
``P:finished``                         zset    finished job ids not compacted yet, score =
                                               finish time (makespan.workers.retention)
``P:retained``                         zset    compacted job summaries, score = finish time
``P:retention``                        hash    finished jobs by final state, last_finished_s
``P:planner:leader``                   string  planner leader lock (redis-py Lock)
``P:planner:fence``                    string  planner fencing counter
``P:planner:config``                   string  the leading planner's name, policy, fleet version, preemption budget, lock timing,
                                               JSON, written as it comes to lead: a standby with
                                               another one says so (makespan.workers.planner_worker)
``P:planner:solve_s``                  list    the planner's latest solve times (fleet_view)
``P:planner:wake``                     list    wake-ups for the planner (first 16 kept): ``1`` a job
                                               queued (a submit, a workload's step, a requeue, a
                                               retry, a move from another pool) or a job one of its
                                               queued jobs waits on ended (at the tail), ``release``
                                               a lease gave its GPUs back (WAKE_RELEASE, at the head)
``P:planner:critical``                 list    ids of CRITICAL jobs just queued (submitted, a workload
                                               step or retry, or released by their last dependency's
                                               completion), for the leader's critical lane
                                               (makespan.workers.critical_lane)
``P:planner:reasons``                  hash    wait reason code -> queued jobs the planner's last
                                               reason write gave it (see makespan.wait_reasons)
``P:planner:reasons:at``               string  when that write was made (unix s, Redis server clock):
                                               a job's reason older than it was not in it
``P:stats:submits``                    hash    priority name -> jobs accepted at submit (a repeated
                                               idempotency key not counted; the metrics'
                                               makespan_jobs_submitted_total, every producer)
``P:events``                           stream  recorded events (submit, lease, phase, ...)
``P:drain``                            hash    the last drain check's counts
``P:plan``                             string  the leading planner's last plan, JSON (see
                                               makespan.workers.plan_view; EX ttl)
``P:incidents``                        stream  incidents raised by the health observer
``P:incidents:overruns``               hash    agenda op id already reported as overrunning -> its
                                               incident ids ('reaped:' first when the agenda reaped
                                               the entry: its holder died); an id is dropped once
                                               its entry has closed, and its incidents get their
                                               recovery (the observer's incidents_mark script)
``P:incidents:seen``                   set     what observers before 2026-12-06 kept instead (op ids
                                               only); no longer written, dropped by those observers
``P:incidents:hosts_down``             hash    host -> ``since:<s>`` (no live GPU worker since, not
                                               reported yet) or ``open:<incident id>:<s>`` (its
                                               host_down incident); dropped when a worker is back
                                               (the observer's hosts_down script)
``P:instance:{id}``                    hash    live endpoint instance (see makespan.workers.observer)
``P:instances``                        set     live endpoint instance ids
``P:gpu_instances:{uuid}``             set     ids of the live instances on one GPU (an index of
                                               ``P:instance:{id}``'s ``gpus``; see
                                               makespan.workers.drivers.registry)
``P:observer``                         hash    observer liveness: probe cycle, time (EX ttl)
``P:host:live:{host}``                 string  consumer id of a live GPU worker of ``host`` (PX ttl,
                                               renewed by it; see makespan.workers.host_liveness)
``P:hosts:seen``                       hash    host -> consumer id of the last GPU worker that
                                               announced itself there, ``stopped:{id}`` once it
                                               withdrew cleanly (no TTL: a host seen once and
                                               without a live key now has lost its consumer)
``P:hosts:cordoned``                   hash    host -> its cordon (JSON: reason, since, by): no new
                                               lease there until uncordoned (``makespan cordon``;
                                               see makespan.workers.host_liveness)
``P:fleet``                            string  the fleet spec JSON the planner runs with
``P:workload:{id}``                    hash    workload record (see makespan.workloads)
``P:workloads``                        zset    workload ids, score = submission time
``P:workloads:active``                 set     workloads the planner still advances
``P:workloads:done``                   zset    finished workload ids, score = finish time (retention's index)
``P:reqlease:{instance}``              zset    request leases held on an endpoint instance,
                                               score = expiry (unix ms); ZCARD <= slots
``P:reqwaiters:{instance}``            zset    requests waiting for a request lease, score =
                                               deadline (unix ms; a lost removal stops counting)
``P:reqpeak:{instance}``               string  most request leases ever held at once
``P:requests:{job}``                   list    per-request records of a step (JSON: t0, t1, ms, ok)
``P:awaited:{job}``                    set     ids of the jobs not ended whose deps name ``job``
                                               (reverse-dependency index, see makespan.awaited)
``P:fleet:version``                    string  sha256 (16 hex) of the published ``P:fleet`` JSON
``P:result:{job}``                     string  a job's result or error JSON (EX result TTL;
                                               see makespan.results)
``P:fn:{name}``                        string  a workload function's definition JSON (endpoint,
                                               helpers, retries, ...; see makespan.registry)
``P:fn:live:{name}``                   string  a live GPU worker registered ``name`` (EX ttl)
``P:fns``                              set     workload function names ever registered
``P:fn:hosts:{name}``                  zset    fleet hosts whose GPU worker registers ``name``, score =
                                               the mark's expiry (server clock ms): where the planner
                                               places its jobs (the live marks, else the last ones)
``P:exec:{workload}:{endpoint}``       list    latest execute times, workload s (learned
                                               service time, see makespan.estimates)
``P:restore:failed:{uuid}``            string  consecutive failed set-point restores of the group
                                               whose first GPU is ``uuid`` (PX: the backoff before
                                               the next try; see makespan.workers.phases)
``P:transition:{ep}:{host}:{kind}``    list    latest measured durations, workload s, of one
                                               transition kind (evict, sleep, wake, cold_start,
                                               restore) of an endpoint on a host, newest first
                                               (learned durations, see makespan.estimates)
=====================================  ======  ==============================================

Pools (design notes, "pool"; ``[[pools]]`` in the fleet file): the keys of one pool's
planner and queues are built by ``Keys(prefix, pool=NAME)`` (:meth:`Keys.for_pool`) and
live under ``P:pool:{name}:`` instead of ``P:`` — ``queue:{level}``, ``planner:leader``,
``planner:fence``, ``planner:config``, ``planner:wake``, ``planner:critical``, ``planner:solve_s``,
``planner:reasons``, ``planner:reasons:at``, ``drain``, ``plan`` and ``offer`` (below). Everything else (jobs, leases, GPUs, events, the delayed
set, ...) is shared by every pool. A fleet without pools has one implicit pool whose keys
are the ``P:`` ones above, unchanged. A job record in a named pool carries ``pool``.

=====================================  ======  ==============================================
``P:pool:{name}:offer``                string  JSON the pool's leading planner writes each tick
                                               (PX ttl): free GPUs, idle warm endpoints, GPU
                                               count, time; read by the producer to route a job
                                               whose endpoint several pools serve
                                               (:mod:`makespan.pools`)
``P:pools:seen``                       set     every pool whose queues may hold jobs ('' for
                                               the implicit pool): planners add theirs and
                                               those of the fleet they replace as they come to
                                               lead, and move the jobs queued in a pool their
                                               fleet no longer declares
                                               (:mod:`makespan.workers.pool_rehome`)
=====================================  ======  ==============================================

Lua scripts (:mod:`makespan.store`) that must build per-id keys from ids they read
(a lease's GPUs, a job's queue) build them from ONE prefix argument,
:attr:`Keys.script_prefix`, with the builders of ``makespan/store/lua/lib.lua``, which
mirror the methods here (a test compares them).

Celery's own keys are prefixed with ``P:celery:`` through kombu's ``global_keyprefix``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from makespan.models import Priority

# the value a GPU worker pushes onto ``P:planner:wake`` when a lease gives its GPUs back (a
# submit or requeue pushes ``1``): the planner plans at once then, without waiting
# ``batch_wait_s`` for more arrivals (makespan.workers.planner_worker)
WAKE_RELEASE = "release"


@dataclass(frozen=True)
class Keys:
    """Key builder for one key prefix (one makespan deployment or one test) and, for the
    pool-scoped keys, one pool (None: the implicit pool of a fleet without pools)."""

    prefix: str = "makespan"
    pool: str | None = None

    def for_pool(self, pool: str | None) -> Keys:
        """These keys for pool ``pool`` (None or '': the implicit pool)."""
        return Keys(self.prefix, pool or None)

    @property
    def _glob(self) -> str:
        """The prefix as a literal in a SCAN/KEYS pattern: Redis glob characters (``* ? [ ] \\``)
        escaped, so a prefix such as ``team*`` never matches another deployment's keys (the
        retention sweep and :func:`makespan.live.delete_prefix` delete what they match)."""
        return re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix)

    @property
    def _scoped(self) -> str:
        """Where the pool-scoped keys live: ``P`` for the implicit pool, else ``P:pool:{name}``."""
        return self.prefix if self.pool is None else f"{self.prefix}:pool:{self.pool}"

    @property
    def pool_offer(self) -> str:
        """What this pool's leading planner offers now (JSON, PX ttl; :mod:`makespan.pools`)."""
        return f"{self._scoped}:offer"

    @property
    def script_prefix(self) -> str:
        """The prefix a Lua script builds per-id keys from (``lib.lua``'s ``key_*`` builders)."""
        return self.prefix

    def queue(self, level: Priority | str) -> str:
        name = level.name if isinstance(level, Priority) else str(level).upper()
        return f"{self._scoped}:queue:{name.lower()}"

    def queues(self) -> list[str]:
        """The four queues in strict priority order (CRITICAL first)."""
        return [self.queue(p) for p in Priority]

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def idem(self, key: str) -> str:
        return f"{self.prefix}:idem:{key}"

    @property
    def delayed(self) -> str:
        """Jobs not due yet (delay_s or a retry backoff), score = due time, unix s."""
        return f"{self.prefix}:delayed"

    @property
    def seq(self) -> str:
        return f"{self.prefix}:seq"

    @property
    def fence(self) -> str:
        return f"{self.prefix}:fence"

    def gpu(self, uuid: str) -> str:
        return f"{self.prefix}:gpu:{uuid}"

    @property
    def gpu_owner(self) -> str:
        return f"{self.prefix}:gpu_owner"

    def lease(self, lease_id: str) -> str:
        return f"{self.prefix}:lease:{lease_id}"

    @property
    def leases(self) -> str:
        return f"{self.prefix}:leases"

    def resident(self, uuid: str) -> str:
        return f"{self.prefix}:resident:{uuid}"

    def restore_failed(self, uuid: str) -> str:
        """Present while the set-point restore of the group whose first GPU is ``uuid``
        backs off after a failure (PX: the backoff before its next restore; the value: the
        consecutive failures)."""
        return f"{self.prefix}:restore:failed:{uuid}"

    def restore_failures(self, uuid: str) -> str:
        """JSON ``{"failures", "endpoint", "reason"}``: the consecutive failed restores of
        the group whose first GPU is ``uuid`` and the last one's reason; outlives the
        backoff (:meth:`restore_failed`) by an hour, so the next failure doubles it."""
        return f"{self.prefix}:restore:failures:{uuid}"

    @property
    def running(self) -> str:
        return f"{self.prefix}:running"

    def phase(self, lease_id: str) -> str:
        return f"{self.prefix}:phase:{lease_id}"

    @property
    def phase_pattern(self) -> str:
        """SCAN pattern of every :meth:`phase` hash."""
        return f"{self._glob}:phase:*"

    def busy(self, lease_id: str) -> str:
        return f"{self.prefix}:busy:{lease_id}"

    @property
    def busy_pattern(self) -> str:
        return f"{self._glob}:busy:*"

    def agenda(self, op_id: str) -> str:
        return f"{self.prefix}:agenda:{op_id}"

    @property
    def agenda_pattern(self) -> str:
        """SCAN pattern of every agenda key (entries, locks, the index)."""
        return f"{self._glob}:agenda:*"

    def agenda_lock(self, op_id: str) -> str:
        """The lock of agenda entry ``op_id`` (redis-py Lock)."""
        return f"{self.prefix}:agenda:{op_id}:lock"

    @property
    def finished(self) -> str:
        """zset of finished job ids waiting for compaction, score = finish time (unix s)."""
        return f"{self.prefix}:finished"

    @property
    def retained(self) -> str:
        """zset of compacted job summaries, score = finish time (unix s)."""
        return f"{self.prefix}:retained"

    @property
    def retention_tally(self) -> str:
        """hash of finished jobs by final state, and ``last_finished_s``."""
        return f"{self.prefix}:retention"

    @property
    def agenda_index(self) -> str:
        return f"{self.prefix}:agenda:index"

    @property
    def planner_leader(self) -> str:
        return f"{self._scoped}:planner:leader"

    @property
    def planner_wake(self) -> str:
        """List pushed to when a job is queued (``1``) or a lease released
        (:data:`WAKE_RELEASE`): wakes the planner."""
        return f"{self._scoped}:planner:wake"

    @property
    def planner_critical(self) -> str:
        """List of CRITICAL job ids just queued (RPUSH, at most the last 256, by submit, a
        workload's submit and a step retry, and by a job's completion for its dependants it
        leaves ready: ``lib.lua``'s ``key_planner_critical`` builds the same key): the
        leading planner's critical lane pops them (:mod:`makespan.workers.critical_lane`)."""
        return f"{self._scoped}:planner:critical"

    @property
    def planner_solve_times(self) -> str:
        """list of the planner's latest solve times (``"{seconds}:{batch size}"`` entries)."""
        return f"{self._scoped}:planner:solve_s"

    @property
    def planner_fence(self) -> str:
        return f"{self._scoped}:planner:fence"

    @property
    def planner_config(self) -> str:
        """String: the leading planner's ``{"planner", "policy", "fleet_version",
        "preemption_budget", "lock_ttl_s", "lock_renewal_s"}`` JSON, written as it comes to lead (:mod:`makespan.workers.planner_worker`)."""
        return f"{self._scoped}:planner:config"

    @property
    def submit_counts(self) -> str:
        """Hash: priority name -> jobs accepted at submit; fleet-wide (every pool's producers),
        read by the metrics' Redis-state collector."""
        return f"{self.prefix}:stats:submits"

    @property
    def wait_reason_counts(self) -> str:
        """Hash: wait reason code -> queued jobs with it as of the planner's last write."""
        return f"{self._scoped}:planner:reasons"

    @property
    def wait_reasons_at(self) -> str:
        """String: when the planner's last wait-reason write was made (unix s, server clock)."""
        return f"{self._scoped}:planner:reasons:at"

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"

    @property
    def drain(self) -> str:
        return f"{self._scoped}:drain"

    @property
    def plan(self) -> str:
        """The leading planner's last plan as JSON (:mod:`makespan.workers.plan_view`)."""
        return f"{self._scoped}:plan"

    @property
    def incidents(self) -> str:
        return f"{self.prefix}:incidents"

    @property
    def incidents_overruns(self) -> str:
        """Hash: agenda op id reported as overrunning -> its incident ids, comma-separated
        (``reaped:`` first once the agenda reaped the entry; :mod:`makespan.workers.observer`)."""
        return f"{self.prefix}:incidents:overruns"

    @property
    def incidents_hosts_down(self) -> str:
        """Hash: host -> id of its open ``host_down`` incident (:mod:`makespan.workers.observer`)."""
        return f"{self.prefix}:incidents:hosts_down"

    @property
    def incidents_given_up(self) -> str:
        """Hash: id of an endpoint incident the observer did not recover (its GPUs were
        leased, or its restart failed) -> JSON ``{"endpoint", "gpus", "since"}``, until the
        endpoint runs on those GPUs again and a later ``recovered`` record closes it
        (:mod:`makespan.workers.observer`)."""
        return f"{self.prefix}:incidents:given_up"

    def instance(self, instance_id: str) -> str:
        return f"{self.prefix}:instance:{instance_id}"

    @property
    def instances(self) -> str:
        return f"{self.prefix}:instances"

    def gpu_instances(self, gpu_uuid: str) -> str:
        return f"{self.prefix}:gpu_instances:{gpu_uuid}"

    @property
    def observer(self) -> str:
        return f"{self.prefix}:observer"

    def host_live(self, host: str) -> str:
        """Present (PX ttl, the Redis server's clock) while a GPU worker consumes ``host``'s
        queue; the value is that worker's consumer id."""
        return f"{self.prefix}:host:live:{host}"

    def host_fleet(self, host: str) -> str:
        """Present (PX ttl, renewed with :meth:`host_live`) while a GPU worker consumes
        ``host``'s queue; the value is the ``fleet_version`` of that worker's fleet file
        (:mod:`makespan.workers.worker_fleets`)."""
        return f"{self.prefix}:host:fleet:{host}"

    def fleet_endpoints(self, version: str) -> str:
        """JSON ``{endpoint: tensor_parallel}`` of the fleet file whose ``fleet_version`` is
        ``version``, written by the GPU workers that run it (expires a week after the last
        renewal; :mod:`makespan.workers.worker_fleets`)."""
        return f"{self.prefix}:fleet:endpoints:{version}"

    def fleet_gpus(self, version: str) -> str:
        """JSON ``{host: [GPU UUID, ...]}`` of the fleet file whose ``fleet_version`` is
        ``version``, written with :meth:`fleet_endpoints` by the GPU workers that run it."""
        return f"{self.prefix}:fleet:gpus:{version}"

    @property
    def hosts_seen(self) -> str:
        """Hash: host -> consumer id of the last GPU worker that announced itself there
        (``stopped:{id}`` once it withdrew on a clean stop)."""
        return f"{self.prefix}:hosts:seen"

    @property
    def hosts_cordoned(self) -> str:
        """Hash: host -> its cordon (JSON: ``reason``, ``since`` unix s on the Redis server's
        clock, ``by``), written by ``makespan cordon`` (:mod:`makespan.workers.host_liveness`):
        no new lease on its GPUs until ``makespan uncordon``."""
        return f"{self.prefix}:hosts:cordoned"

    @property
    def fleet(self) -> str:
        return f"{self.prefix}:fleet"

    def workload(self, workload_id: str) -> str:
        return f"{self.prefix}:workload:{workload_id}"

    @property
    def workloads(self) -> str:
        return f"{self.prefix}:workloads"

    @property
    def workloads_active(self) -> str:
        return f"{self.prefix}:workloads:active"

    @property
    def workloads_done(self) -> str:
        """zset of finished workload ids, score = finish time (unix s): retention's index."""
        return f"{self.prefix}:workloads:done"

    def req_leases(self, instance_id: str) -> str:
        return f"{self.prefix}:reqlease:{instance_id}"

    def req_waiters(self, instance_id: str) -> str:
        """zset of the requests waiting for a request lease on the instance, score = the
        deadline they count until (unix ms, server clock; see makespan.workers.requests)."""
        return f"{self.prefix}:reqwaiters:{instance_id}"

    def req_peak(self, instance_id: str) -> str:
        return f"{self.prefix}:reqpeak:{instance_id}"

    def requests(self, job_id: str) -> str:
        return f"{self.prefix}:requests:{job_id}"

    @property
    def pools_seen(self) -> str:
        """Set: every pool whose queues may hold jobs ('' for the implicit pool), added to by
        each planner as it comes to lead (its own pool and those of the fleet it replaces);
        a planner moves the jobs queued in one its fleet no longer declares
        (:mod:`makespan.workers.pool_rehome`). Shared by every pool."""
        return f"{self.prefix}:pools:seen"

    @property
    def fleet_version(self) -> str:
        """sha256 prefix of the fleet JSON in :attr:`fleet` (written with it by the planner)."""
        return f"{self.prefix}:fleet:version"

    def result(self, job_id: str) -> str:
        """A job's result (or error) JSON, written once with its last phase's commit."""
        return f"{self.prefix}:result:{job_id}"

    def fn(self, name: str) -> str:
        """A workload function's published definition (JSON, no TTL)."""
        return f"{self.prefix}:fn:{name}"

    def fn_live(self, name: str) -> str:
        """Present (EX ttl) while at least one live GPU worker registers workload ``name``."""
        return f"{self.prefix}:fn:live:{name}"

    def fn_refused(self, name: str) -> str:
        """Why a GPU worker does not publish workload ``name`` (text, PX ttl, renewed with
        its publish): it names an endpoint the worker's fleet does not have."""
        return f"{self.prefix}:fn:refused:{name}"

    def fn_hosts(self, name: str) -> str:
        """Zset of the fleet hosts whose GPU worker registers workload ``name`` (host -> its
        mark's expiry, server clock ms): the planner places the function's jobs there
        (``PlanJob.hosts``, :func:`makespan.registry.function_hosts`: the live marks, else the
        last ones). A clean stop does not remove a mark (another worker of the same host may
        hold it); the key outlives its last renewal by 7 days."""
        return f"{self.prefix}:fn:hosts:{name}"

    def fn_holders(self, name: str) -> str:
        """Zset of the GPU workers holding workload ``name`` (holder id -> its mark's expiry,
        server clock ms); a worker that stops cleanly leaves it, and the last one deletes
        :meth:`fn_live`."""
        return f"{self.prefix}:fn:holders:{name}"

    @property
    def fns(self) -> str:
        """Set of every workload function name a GPU worker has registered."""
        return f"{self.prefix}:fns"

    def exec_times(self, workload: str, endpoint: str) -> str:
        """List of the latest execute times (workload s) of ``workload`` on ``endpoint``."""
        return f"{self.prefix}:exec:{workload}:{endpoint}"

    def transition_times(self, endpoint: str, host: str, kind: str) -> str:
        """List of the latest measured durations (workload s) of ``kind`` transitions of
        ``endpoint`` on ``host``, newest first."""
        return f"{self.prefix}:transition:{endpoint}:{host}:{kind}"

    def transition_pattern(self) -> str:
        """SCAN pattern of every :meth:`transition_times` list."""
        return f"{self._glob}:transition:*"

    def awaited(self, job_id: str) -> str:
        """Set of the ids of the jobs not ended that wait on ``job_id`` (makespan.awaited)."""
        return f"{self.prefix}:awaited:{job_id}"

    @property
    def awaited_pattern(self) -> str:
        return f"{self._glob}:awaited:*"

    @property
    def celery_prefix(self) -> str:
        return f"{self.prefix}:celery:"

    def host_queue(self, host: str) -> str:
        """Celery queue consumed by the GPU worker of ``host``."""
        return f"gpu.{host}"

    @property
    def all_pattern(self) -> str:
        return f"{self._glob}:*"
