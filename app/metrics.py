"""Prometheus metrics: event counters and histograms, plus state read from Redis at scrape.

Two kinds of metric (full reference: docs/metrics.md):

- **Events**, recorded where they happen by calling this module's functions
  (:func:`job_completed`, :func:`observe_wait`, :func:`observe_solve`, :func:`phase`,
  :func:`transition`, :func:`incident`, ...). Counters and histograms only, so they sum
  correctly across prefork children (prometheus-client multiprocess mode).
- **State**, read from Redis by :class:`RedisStateCollector` when Prometheus scrapes:
  queue depth per priority (``ZCARD P:queue:{level}``), Celery messages per GPU
  queue (``LLEN`` of every kombu priority-step list, as Flower counts them), active
  leases, active agenda entries, the last drain check's leftovers, incident stream
  length. Any process may serve them; every server reports the same values, so
  dashboards aggregate them with ``max``.

Labels are low-cardinality: ``priority`` (4 levels), ``phase`` (5), ``kind``
(transition kinds), ``state`` (busy/transition/idle), ``endpoint`` (fleet
endpoints), ``queue`` (one per GPU host), ``item`` (5 drain items), ``reason``
(wait-reason codes), ``host``, ``pool``, ``cause``, ``outcome``, ``workload``.

:func:`start_metrics_server` serves ``/metrics``. By default it switches the process
to multiprocess mode first (a private ``PROMETHEUS_MULTIPROC_DIR`` below the one
configured, or below the temp dir), so that Celery prefork children forked afterwards
report through the parent's server; call it before the worker forks.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import threading
from typing import Any
from collections.abc import Iterable, Mapping

from makespan.keys import Keys
from makespan.models import Priority

log = logging.getLogger(__name__)

PRIORITIES = tuple(p.name for p in Priority)
PHASES = ("evict", "start_endpoint", "execute", "clear", "restore")
GPU_STATES = ("busy", "transition", "idle")
IMPROVER_OUTCOMES = ("solved", "failed", "adopted", "hung")  # makespan_planner_improver_total{outcome}
TRANSITION_KINDS = ("evict", "sleep", "cold_start", "wake", "wake_level2", "restore", "clear")  # makespan_transition_seconds{kind}
KOMBU_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)
WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)
SOLVE_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
ESTIMATE_ERROR_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10)
WORKLOAD_OUTCOMES = ("ok", "error", "retried", "cancelled", "interrupted")
RECLAIM_CAUSES = ("lease_expired", "worker_shutdown", "function_missing", "start_failed", "worker_lost")  # makespan_leases_reclaimed_total{cause}
PHASE_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800)  # to 8 h: a real execute runs hours (it fell in +Inf past 30 min)

_lock = threading.Lock()
_metrics: Metrics | None = None
_mp_dir: str | None = None


class Metrics:
    """The event metrics of one process, registered on ``registry`` (a private
    ``CollectorRegistry`` when None)."""

    def __init__(self, registry: Any = None):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry if registry is not None else CollectorRegistry()
        reg = {"registry": self.registry}
        self.completed = Counter("makespan_jobs_completed_total", "Jobs whose phases all finished.", ["priority"],
                                 **reg)
        self.failed = Counter("makespan_jobs_failed_total", "Jobs that failed for good.", ["priority"], **reg)
        self.preempted = Counter("makespan_jobs_preempted_total", "Jobs preempted and requeued.", ["priority"], **reg)
        self.wait = Histogram("makespan_job_wait_seconds", "Start minus submission, wall seconds.", ["priority"],
                              buckets=WAIT_BUCKETS_S, **reg)
        self.solve = Histogram("makespan_planner_solve_seconds", "Planner time per batch, wall seconds.", [],
                               buckets=SOLVE_BUCKETS_S, **reg)
        self.batch = Histogram("makespan_planner_batch_size_jobs", "Jobs per planner batch.", [],
                               buckets=BATCH_BUCKETS, **reg)
        self.phase = Histogram("makespan_phase_seconds", "Phase duration on a GPU worker, wall seconds.", ["phase"],
                               buckets=PHASE_BUCKETS_S, **reg)
        self.transition = Histogram("makespan_transition_seconds",
                                    "Transition duration by kind (evict, sleep, cold_start, wake, wake_level2, restore, clear), wall s.",
                                    ["kind"], buckets=PHASE_BUCKETS_S, **reg)
        self.gpu_seconds = Counter("makespan_gpu_seconds_total",
                                   "GPU-seconds by state: busy (execute), transition, idle.", ["state"], **reg)
        self.incidents = Counter("makespan_incidents_total", "Endpoint failures no planned transition explains.",
                                 ["endpoint"], **reg)
        self.hosts_down = Counter("makespan_host_down_incidents_total",
                                  "Hosts whose GPU worker stopped consuming (health observer's host_down incidents).",
                                  ["host"], **reg)
        self.state_lost = Counter("makespan_redis_state_lost_total",
                                  "Times the planner found its fencing counter gone back: Redis lost makespan's "
                                  "state (restarted without its data).", [], **reg)
        self.leading = Gauge("makespan_planner_leading",
                             "1 while this planner process holds its pool's leader lock (it plans), 0 while it "
                             "stands by; pool '' for the whole fleet's planner.", ["pool"],
                             multiprocess_mode="livemax", **reg)
        self.reclaimed = Counter("makespan_leases_reclaimed_total",
                                 "Job leases reclaimed, by cause: lease_expired (the planner's reclaim), or handed "
                                 "back by a GPU worker: worker_shutdown, function_missing, start_failed (the job's "
                                 "start phase failed), worker_lost (the pool process running it died).", ["cause"],
                                 **reg)
        self.improver = Counter("makespan_planner_improver_total",
                                "Background CP-SAT improver: batches solved, solves failed (raised, or its child "
                                "process died), plans adopted by a tick, hung children killed.", ["outcome"],
                                **reg)
        self.improver_solve = Histogram("makespan_planner_improver_seconds",
                                        "Background improver time per batch, wall seconds.", [],
                                        buckets=SOLVE_BUCKETS_S, **reg)
        # workload functions (makespan.registry): runs by outcome, progress, estimate error
        self.workload_runs = Counter("makespan_workload_runs_total",
                                     "Workload function runs by outcome: ok, error (raised, timed out, result "
                                     "refused), retried (an error with retries left), cancelled, interrupted (its "
                                     "lease was lost, it was preempted or its GPU worker shut down).",
                                     ["workload", "outcome"], **reg)
        self.workload_progress = Counter("makespan_workload_progress_units_total",
                                         "Units of work reported done through ctx.progress.", ["workload"], **reg)
        self.estimate_error = Histogram("makespan_estimate_error_ratio",
                                        "|actual − planned| ÷ actual execute time of workload function runs "
                                        "(planned: the job's service_s, learned or given).", ["workload"],
                                        buckets=ESTIMATE_ERROR_BUCKETS, **reg)
        self.transition_error = Histogram("makespan_transition_error_ratio",
                                          "|actual − planned| ÷ actual duration of executed transitions by kind "
                                          "(evict, sleep, wake, wake_level2, cold_start, restore; planned: the learned "
                                          "figure, or the fleet file's until learned).", ["kind"],
                                          buckets=ESTIMATE_ERROR_BUCKETS, **reg)
        self._declare_known_labels()

    def _declare_known_labels(self) -> None:
        """Create every series whose label values are known in advance, so that a quiet
        fleet exports 0 (a labelled series otherwise appears only at its first increment,
        and a dashboard shows 'No data'). Endpoints come from the fleet:
        :meth:`declare_endpoints`."""
        for prio in PRIORITIES:
            for family in (self.completed, self.failed, self.preempted, self.wait):
                family.labels(prio)
        for name in PHASES:
            self.phase.labels(name)
        for kind in TRANSITION_KINDS:
            self.transition.labels(kind)
            if kind != "clear":
                self.transition_error.labels(kind)
        for state in GPU_STATES:
            self.gpu_seconds.labels(state)
        for outcome in IMPROVER_OUTCOMES:
            self.improver.labels(outcome)
        for cause in RECLAIM_CAUSES:
            self.reclaimed.labels(cause)

    def declare_hosts(self, hosts: Iterable[str]) -> None:
        """Export ``makespan_host_down_incidents_total{host}`` at 0 for each host name."""
        for name in hosts:
            self.hosts_down.labels(str(name))

    def declare_endpoints(self, endpoints: Iterable[str]) -> None:
        """Export ``makespan_incidents_total{endpoint}`` at 0 for each endpoint name."""
        for name in endpoints:
            self.incidents.labels(str(name))

    def declare_workloads(self, workloads: Iterable[str]) -> None:
        """Export ``makespan_workload_runs_total{workload, outcome}`` (every outcome) and
        ``makespan_workload_progress_units_total{workload}`` at 0 for each workload name."""
        for name in workloads:
            for outcome in WORKLOAD_OUTCOMES:
                self.workload_runs.labels(str(name), outcome)
            self.workload_progress.labels(str(name))


def _m() -> Metrics:
    global _metrics
    if _metrics is None:
        with _lock:
            if _metrics is None:
                _metrics = Metrics()
    return _metrics


def _prio(priority: Any) -> str:
    name = priority.name if isinstance(priority, Priority) else str(priority).upper()
    return name if name in PRIORITIES else "NORMAL"


# -- event functions (call from the code; each is cheap and never raises) ---------------------

def job_completed(priority: Any) -> None:
    """A job's last phase finished (GPU worker or planner)."""
    _m().completed.labels(_prio(priority)).inc()


def job_failed(priority: Any) -> None:
    """A job failed for good (no further attempt)."""
    _m().failed.labels(_prio(priority)).inc()


def redis_state_lost() -> None:
    """The planner found its fencing counter gone back: Redis lost makespan's state (planner)."""
    _m().state_lost.inc()


def planner_leading(pool: str, leading: bool) -> None:
    """This planner process came to lead ``pool`` ('' for the whole fleet) or stopped leading
    it (stepped down, deposed, stopping); 0 from its start while it stands by (planner)."""
    _m().leading.labels(pool).set(1 if leading else 0)


def job_preempted(priority: Any) -> None:
    """A job (of ``priority``, the victim's) was preempted and requeued (planner)."""
    _m().preempted.labels(_prio(priority)).inc()


def observe_wait(priority: Any, wait_s: float) -> None:
    """Start (lease) minus submission of one job, wall seconds (planner)."""
    _m().wait.labels(_prio(priority)).observe(max(0.0, float(wait_s)))


def observe_solve(solve_s: float, batch_size: int) -> None:
    """One planner batch: wall seconds spent planning and the number of jobs in it."""
    m = _m()
    m.solve.observe(max(0.0, float(solve_s)))
    m.batch.observe(int(batch_size))


def improver(outcome: str, solve_s: float | None = None) -> None:
    """The background improver (workers/improver.py) ``solved`` a batch (in ``solve_s``
    wall seconds), ``failed`` one (it raised, or its child process died), a tick
    ``adopted`` its plan over the greedy one, or a ``hung`` child was killed."""
    m = _m()
    m.improver.labels(outcome if outcome in IMPROVER_OUTCOMES else "other").inc()
    if solve_s is not None:
        m.improver_solve.observe(max(0.0, float(solve_s)))


def phase(name: str, duration_s: float, gpus: int = 1) -> None:
    """A phase finished on ``gpus`` GPUs (GPU worker). Adds ``duration_s × gpus`` to
    ``makespan_gpu_seconds_total{state="busy"}`` for ``execute``, ``"transition"`` otherwise."""
    m = _m()
    d = max(0.0, float(duration_s))
    m.phase.labels(name if name in PHASES else "other").observe(d)
    m.gpu_seconds.labels("busy" if name == "execute" else "transition").inc(d * max(1, int(gpus)))


def phase_cut_short(name: str, duration_s: float, gpus: int = 1) -> None:
    """A phase ended early on ``gpus`` GPUs (preempted, its lease lost or handed back at
    shutdown, cancelled, failed): its ``duration_s × gpus`` GPU-seconds still go to
    ``makespan_gpu_seconds_total`` (``busy`` for ``execute``, ``transition`` otherwise; the
    GPUs were held all along), but not to the ``makespan_phase_seconds`` histogram, which
    describes phases that ran to their end."""
    _m().gpu_seconds.labels("busy" if name == "execute" else "transition").inc(
        max(0.0, float(duration_s)) * max(1, int(gpus)))


def transition(kind: str, duration_s: float, planned_s: float | None = None, actual_s: float | None = None) -> None:
    """A transition of ``kind`` (evict, sleep, cold_start, wake, wake_level2: a wake from
    level 2 of a level-1 endpoint, restore, clear) took
    ``duration_s`` wall seconds; with ``planned_s``/``actual_s`` (workload seconds) its
    planned-vs-actual error ratio is observed too."""
    m = _m()
    m.transition.labels(kind).observe(max(0.0, float(duration_s)))
    if planned_s is not None and actual_s is not None and actual_s > 0:
        m.transition_error.labels(kind).observe(abs(actual_s - planned_s) / actual_s)


def gpu_seconds(state: str, gpu_s: float) -> None:
    """Add GPU-seconds in ``state`` (busy, transition or idle). The planner adds idle
    time; :func:`phase` adds busy and transition time."""
    if state not in GPU_STATES:
        state = "idle"
    _m().gpu_seconds.labels(state).inc(max(0.0, float(gpu_s)))


def incident(endpoint: str) -> None:
    """An endpoint failure no POSITIVE agenda entry explains (health observer)."""
    _m().incidents.labels(endpoint).inc()


def host_down(host: str) -> None:
    """A host whose GPU worker stopped consuming its queue (health observer, ``host_down``)."""
    _m().hosts_down.labels(host).inc()


def declare_hosts(hosts: Iterable[str]) -> None:
    """Export the per-host incident counter at 0 for every host of the fleet (names): a
    fleet with no host down yet shows 0 rather than no series. Idempotent."""
    _m().declare_hosts(hosts)


def declare_endpoints(endpoints: Iterable[str]) -> None:
    """Export the per-endpoint counters at 0 for every endpoint of the fleet (names), so
    a fleet with no incident yet shows 0 rather than no series. Idempotent."""
    _m().declare_endpoints(endpoints)


def declare_workloads(workloads: Iterable[str]) -> None:
    """Export the per-workload counters at 0 for every workload function a GPU worker
    registers (names; at its start): a series born at its first run made Prometheus's
    ``increase()`` miss that run (the first error of a function went unseen by an alert on
    ``increase(makespan_workload_runs_total{outcome="error"}[10m]) > 0``). Idempotent."""
    _m().declare_workloads(workloads)


def fleet_endpoints_from_env() -> list[str]:
    """Endpoint names of the fleet file at ``$MAKESPAN_FLEET`` (set by ``makespan
    gpu-worker`` and the Procfile's Flower); empty when it is unset or unreadable."""
    path = os.environ.get("MAKESPAN_FLEET")
    if not path:
        return []
    from makespan.errors import MakespanError
    from makespan.models import load_fleet

    try:
        return sorted(load_fleet(path).endpoints)
    except (MakespanError, OSError) as e:
        log.warning("metrics: cannot read the fleet at MAKESPAN_FLEET=%s: %s", path, e)
        return []


def lease_reclaimed(cause: str = "lease_expired") -> None:
    """A lease was reclaimed: ``cause`` ``lease_expired`` (the planner reclaimed an expired
    lease), ``worker_shutdown`` (a GPU worker that shuts down handed its job's lease back,
    :meth:`makespan.workers.phases.PhaseRunner.hand_back`) or ``function_missing`` (a GPU
    worker handed back the lease of a job whose workload function it does not register while
    a worker of another host does) or ``start_failed`` (a job's start phase failed: its lease
    was handed back and its job requeued or failed, :meth:`makespan.workers.phases.PhaseRunner._start_failed`) or
    ``worker_lost`` (a prefork GPU worker's pool process died while it ran a job's phase:
    :meth:`makespan.workers.phases.PhaseRunner.pool_process_lost`); another value counts as
    ``lease_expired`` (the label stays bounded)."""
    _m().reclaimed.labels(cause if cause in RECLAIM_CAUSES else "lease_expired").inc()


def workload_run(workload: str, outcome: str, planned_s: float | None = None, actual_s: float | None = None) -> None:
    """A workload function's run ended with ``outcome`` (ok, error, retried, cancelled,
    interrupted: its lease was lost, it was preempted or its GPU worker shut down);
    with ``planned_s``/``actual_s`` (workload seconds) its estimate error is observed."""
    m = _m()
    m.workload_runs.labels(workload, outcome if outcome in WORKLOAD_OUTCOMES else "error").inc()
    if planned_s is not None and actual_s is not None and actual_s > 0:
        m.estimate_error.labels(workload).observe(abs(actual_s - planned_s) / actual_s)


def workload_progress(workload: str, units_done: float, _total: float) -> None:
    """``units_done`` more units of ``workload`` reported done (``ctx.progress``)."""
    if units_done > 0:
        _m().workload_progress.labels(workload).inc(units_done)


# -- state read from Redis --------------------------------------------------------------------

def celery_queue_lists(celery_prefix: str, queue: str,
                       priority_steps: Iterable[int] = KOMBU_PRIORITY_STEPS) -> list[str]:
    """Redis list keys behind one kombu queue: ``{prefix}{queue}`` and
    ``{prefix}{queue}\\x06\\x16{step}`` for each non-zero priority step (kombu's
    Redis transport; Flower counts the same lists)."""
    return [f"{celery_prefix}{queue}{KOMBU_SEP}{s}" if s else f"{celery_prefix}{queue}" for s in priority_steps]


def queued_by_reason(written: Mapping[str, Any], queued_total: int, no_planner: bool) -> dict[str, float]:
    """``makespan_queued_jobs_by_reason``'s value per code of
    :data:`makespan.wait_reasons.QUEUED_REASONS`: every queued job ``no_planner`` while no
    planner leads (and its last write is stale), else the counts of the planner's last reason
    write (``written``, ``P:planner:reasons``) and, as ``behind_batch``, the queued jobs it
    did not count (``queued_total`` minus them: the jobs past its batch's scan, as ``makespan
    why`` calls them; a job queued since the write counts there too until the next one)."""
    from makespan.wait_reasons import QUEUED_REASONS

    if no_planner:
        return {code: float(queued_total) if code == "no_planner" else 0.0 for code in QUEUED_REASONS}
    out = {code: float(written.get(code, 0) or 0) for code in QUEUED_REASONS}
    out["behind_batch"] += max(0.0, queued_total - sum(out.values()))
    return out


class RedisStateCollector:
    """A prometheus-client collector reading makespan's state from Redis at scrape time.

    ``client`` is a decoded redis-py client; ``keys`` names the deployment's keys.
    GPU queues are those of the fleet stored at ``P:fleet`` (``gpu.{host}``) plus any
    ``gpu.*`` list found under the Celery prefix. A failed read yields
    ``makespan_redis_up 0`` instead of failing the scrape.
    """

    def __init__(self, client: Any, keys: Keys, priority_steps: Iterable[int] = KOMBU_PRIORITY_STEPS,
                 stale_after_s: float = 5.0):
        # stale_after_s: a planner's reason write older than this while none leads counts as no_planner
        # (makespan.wait_reasons.stale_after_s of the lease TTL)
        self.r, self.keys, self.steps = client, keys, tuple(priority_steps)
        self.stale_after_s = stale_after_s

    def gpu_queues(self) -> list[str]:
        names: set[str] = set()
        raw = self.r.get(self.keys.fleet)
        if raw:
            try:
                spec = json.loads(raw)
                names |= {self.keys.host_queue(h["name"]) for h in spec.get("hosts", [])}
                declare_endpoints(spec.get("endpoints", {}))  # the next scrape shows them at 0
            except (ValueError, TypeError, KeyError, AttributeError):
                pass
        pre = self.keys.celery_prefix
        for k in self.r.scan_iter(match=f"{pre}gpu.*", count=1000, _type="list"):
            names.add(k[len(pre):].split(KOMBU_SEP)[0])
        return sorted(names)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        up = GaugeMetricFamily("makespan_redis_up", "1 if the last scrape could read Redis.")
        try:
            fams = self._read(GaugeMetricFamily, CounterMetricFamily)
        except Exception as e:  # noqa: BLE001 - a scrape must answer even when Redis does not
            log.warning("metrics: cannot read Redis state: %s", e)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from fams

    def _stale(self, written_at: str | None, server_now_s: float) -> bool:
        """Whether a planner's last reason write (``P:planner:reasons:at``, server unix s;
        None: none) is older than ``stale_after_s``: no planner serves those queues now."""
        return not written_at or server_now_s - float(written_at) > self.stale_after_s

    def _leaderless_pools(self, pools: list[str], server_now_s: float, depth: Any, by_reason: Any,
                          led: Any) -> None:
        """Add to ``depth`` and ``by_reason`` the queues of each pool of ``pools`` that no
        planner leads (and whose last reason write is stale): its depths, and every queued
        job ``no_planner``; and to ``led`` whether a planner holds each one's leader lock.
        Each pool's planner exports them, so a pool whose planners all stopped still has its
        series (the same values from every planner: ``max`` per pool)."""
        if not pools:
            return
        p = self.r.pipeline(transaction=False)
        for name in pools:
            pool_keys = self.keys.for_pool(name)
            p.exists(pool_keys.planner_leader)
            p.get(pool_keys.wait_reasons_at)
            for level in PRIORITIES:
                p.zcard(pool_keys.queue(level))
        res = iter(p.execute())
        for name in pools:
            leads, written_at = next(res), next(res)
            depths = [int(next(res) or 0) for _ in PRIORITIES]
            led.add_metric([name], 1.0 if leads else 0.0)
            if leads or not self._stale(written_at, server_now_s):
                continue  # its own planner exports it
            for level, level_depth in zip(PRIORITIES, depths):
                depth.add_metric([level, name], level_depth)
            for code, value in queued_by_reason({}, sum(depths), no_planner=True).items():
                by_reason.add_metric([code, name], value)

    def _read(self, Gauge, Counter) -> list[Any]:
        k = self.keys
        queues = self.gpu_queues()
        p = self.r.pipeline(transaction=False)
        for level in PRIORITIES:
            p.zcard(k.queue(level))
        for q in queues:
            for key in celery_queue_lists(k.celery_prefix, q, self.steps):
                p.llen(key)
        p.zcard(k.leases)
        p.zcard(k.agenda_index)
        p.hgetall(k.drain)
        p.xlen(k.incidents)
        p.hgetall(k.wait_reason_counts)
        p.hkeys(k.hosts_cordoned)
        p.get(k.fleet)
        p.hgetall(k.submit_counts)
        p.exists(k.planner_leader)
        p.get(k.wait_reasons_at)
        p.zcard(k.delayed)
        p.time()
        res = iter(p.execute())
        # a pool's planner (Keys.for_pool) labels what is its pool's own with `pool`
        pool = [k.pool] if k.pool else []
        pool_label = ["pool"] if k.pool else []
        depth = Gauge("makespan_queue_depth_jobs", "Jobs waiting in each priority queue.",
                      labels=["priority", *pool_label])
        queued_total = 0
        for level in PRIORITIES:
            level_depth = next(res)
            queued_total += int(level_depth or 0)
            depth.add_metric([level, *pool], level_depth)
        msgs = Gauge("makespan_celery_queue_messages", "Celery messages waiting per GPU queue (all priority-step "
                     "lists).", labels=["queue"])
        for q in queues:
            msgs.add_metric([q], sum(next(res) for _ in self.steps))
        leases = Gauge("makespan_active_leases", "Live GPU leases.")
        leases.add_metric([], next(res))
        agenda = Gauge("makespan_active_agenda_entries", "Open agenda entries (planned transitions).")
        agenda.add_metric([], next(res))
        drain_raw = next(res) or {}
        drain = Gauge("makespan_drain_leftovers", "What the last drain check found left behind.",
                      labels=["item", *pool_label])
        for item in ("leases", "agenda_entries", "busy_slots", "awaited_entries", "set_points_failed"):
            drain.add_metric([item, *pool], float(drain_raw.get(item, 0) or 0))
        checks = Counter("makespan_drain_checks", "Drain checks run.", labels=pool_label)
        checks.add_metric(pool, float(drain_raw.get("checks", 0) or 0))
        inc = Gauge("makespan_incident_stream_entries", "Entries in the incidents stream (capped).")
        inc.add_metric([], next(res))
        by_reason_raw = next(res) or {}
        by_reason = Gauge("makespan_queued_jobs_by_reason", "Queued jobs per wait reason: as the planner's last "
                          "reason write found them, behind_batch those it did not read, no_planner every queued "
                          "job while no planner leads (the fixed codes of makespan.wait_reasons.QUEUED_REASONS).",
                          labels=["reason", *pool_label])
        cordoned = Gauge("makespan_host_cordoned", "1 while an operator has the host cordoned (makespan cordon: no "
                         "new lease there until uncordoned), else 0; every host of the published fleet.",
                         labels=["host"])
        cordoned_hosts = set(next(res) or ())
        try:
            fleet_doc = json.loads(next(res) or "{}")
            fleet_hosts = [str(h["name"]) for h in fleet_doc.get("hosts", [])]
            fleet_pools = [str(pool_doc["name"]) for pool_doc in fleet_doc.get("pools", []) or []]
        except (ValueError, TypeError, KeyError, AttributeError):
            fleet_hosts, fleet_pools = [], []
        for host in fleet_hosts:  # a cordon of a host the fleet dropped is not exported (nothing to alert on)
            cordoned.add_metric([host], 1.0 if host in cordoned_hosts else 0.0)
        # counted in Redis by the submit scripts (every producer: a CLI, a client, a workload's
        # steps), so the servers report them; fleet-wide, the same value from every server
        counts = next(res) or {}
        leads, written_at, delayed_count, (seconds, micros) = next(res), next(res), next(res), next(res)
        led = Gauge("makespan_pool_led", "1 while a planner holds the pool's leader lock, 0 while none does (read "
                    "from Redis at the scrape, so a pool whose planners all died still reports 0); pool '' for a "
                    "fleet without pools.", labels=["pool"])
        led.add_metric([k.pool or ""], 1.0 if leads else 0.0)
        reasons_stale = self._stale(written_at, seconds + micros / 1e6)
        for code, value in queued_by_reason(by_reason_raw, queued_total, no_planner=not leads and reasons_stale).items():
            by_reason.add_metric([code, *pool], value)
        if k.pool:  # the pools no planner leads: nothing else exports their queues (an alert on them must fire)
            self._leaderless_pools([name for name in fleet_pools if name != k.pool], seconds + micros / 1e6,
                                   depth, by_reason, led)
        delayed = Gauge("makespan_delayed_jobs", "Jobs not due yet (delay_s or a retry backoff: wait reasons "
                        "delayed_until and retry_backoff), fleet-wide.")
        delayed.add_metric([], float(delayed_count or 0))
        submitted = Counter("makespan_jobs_submitted", "Jobs accepted at submit (a repeated idempotency key not "
                            "counted), by every producer.", labels=["priority"])
        for level in PRIORITIES:
            submitted.add_metric([level], float(counts.get(level, 0) or 0))
        return [depth, msgs, leases, agenda, drain, checks, inc, by_reason, delayed, cordoned, submitted, led]


# -- serving ----------------------------------------------------------------------------------

def _pid_namespace() -> str:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``), '0' where unknown:
    a pid means a process only within its namespace (containers sharing a volume)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def sweep_dead_multiprocess_dirs(base: str) -> list[str]:
    """Remove the ``makespan-prom-{pid}-ns{namespace}-*`` directories under ``base`` whose
    process is gone and that this user owns (a process killed with SIGKILL leaves its
    directory: its exit hook never ran). Returns the paths removed. Kept: a directory whose
    pid is alive (even a reused pid), one made in another PID namespace (another container
    on this host sharing the volume: its pid cannot be checked from here; ``ns0`` where the
    namespace cannot be read, as on macOS), and one named before namespaces were. Hosts
    sharing one directory over a network volume all see the root namespace's inode: give
    each host a directory of its own."""
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    namespace = _pid_namespace()
    for entry in entries:
        pid_text, _, rest = entry.name.removeprefix("makespan-prom-").partition("-")
        if not entry.name.startswith("makespan-prom-") or not rest.startswith(f"ns{namespace}-"):
            continue
        try:
            if not pid_text.isdigit() or not entry.is_dir(follow_symlinks=False) or \
                    entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            os.kill(int(pid_text), 0)
            continue  # alive (or a reused pid): kept
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        except OSError:  # PermissionError: a live process of another user; a vanished entry
            continue
    return removed


def enable_multiprocess(base_dir: str | None = None) -> str:
    """Switch this process (and children forked later) to multiprocess mode; return the dir.

    Creates a fresh private directory under ``base_dir``, ``$PROMETHEUS_MULTIPROC_DIR``
    or the temp dir, points ``PROMETHEUS_MULTIPROC_DIR`` at it and removes it at exit
    (first removing those that killed processes left: :func:`sweep_dead_multiprocess_dirs`).
    Idempotent. Event metrics created before the switch are recreated.
    """
    global _mp_dir, _metrics
    with _lock:
        if _mp_dir is not None:
            return _mp_dir
        base = base_dir or os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        sweep_dead_multiprocess_dirs(base)
        d = tempfile.mkdtemp(prefix=f"makespan-prom-{os.getpid()}-ns{_pid_namespace()}-", dir=base)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = d
        from prometheus_client import values

        values.ValueClass = values.get_value_class()
        _mp_dir, _metrics = d, None
        owner = os.getpid()
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(d, ignore_errors=True))
        return d


def build_registry(client: Any = None, keys: Keys | None = None, multiprocess: bool | None = None,
                   stale_after_s: float = 5.0) -> Any:
    """The registry a metrics server exposes: this process's event metrics (or, in
    multiprocess mode, every process's, through ``MultiProcessCollector``), the serving
    process's own ``process_*`` (CPU seconds, resident memory, open file descriptors,
    start time; Linux ``/proc``) and ``python_info`` series, as every Prometheus Python
    exporter has them, and, with ``client``, the Redis state (``stale_after_s``:
    :class:`RedisStateCollector`'s)."""
    from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
    from prometheus_client.multiprocess import MultiProcessCollector

    mp = _mp_dir is not None if multiprocess is None else multiprocess
    if mp:
        reg = CollectorRegistry()
        MultiProcessCollector(reg, path=os.environ["PROMETHEUS_MULTIPROC_DIR"])
        _m()  # create this process's series files so that zero counters appear
    else:
        reg = _m().registry
    try:
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
    except ValueError:  # this process's registry already has them (a second server)
        pass
    if client is not None:
        reg.register(RedisStateCollector(client, keys or Keys(), stale_after_s=stale_after_s))
    return reg


def start_metrics_server(port: int, settings: Any = None, redis_state: bool = True,
                         multiprocess: bool = True, addr: str | None = None,
                         endpoints: Iterable[str] | None = None, pool: str | None = None) -> Any:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread; return the WSGI server
    (``.server_port`` holds the port bound; ``port=0`` is refused: 0 means no server).
    ``addr``: the address to bind (default ``MAKESPAN_METRICS_ADDR``, else ``0.0.0.0``,
    every interface, as Prometheus exporters do; no authentication: bind ``127.0.0.1`` or
    a private interface where the network is not trusted).

    ``settings`` (default :meth:`makespan.settings.Settings.from_env`) gives the Redis URL
    and key prefix of the state collector (``redis_state=False`` leaves it out, e.g.
    on GPU workers). ``multiprocess`` (default on) calls :func:`enable_multiprocess`
    first: call this before a prefork worker forks. ``endpoints`` (default: those of the
    fleet at ``$MAKESPAN_FLEET``; the state collector adds those of ``P:fleet``) are
    exported at 0 in the per-endpoint counters (:func:`declare_endpoints`). ``pool``: the
    planner's pool (a fleet with pools): the state collector reads that pool's queues, drain
    check and wait reasons and labels them ``pool``.

    Raises:
        ValidationError: ``port`` outside 1..65535, or in use (each process that serves
            metrics needs its own), or the multiprocess directory cannot be written (one line
            for the command to print, not an OSError's traceback).
    """
    import errno

    from makespan.errors import ValidationError

    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValidationError("MAKESPAN_METRICS_PORT", port, "must be a TCP port 1..65535")
    try:
        return _serve(port, settings, redis_state, multiprocess, addr, endpoints, pool)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ValidationError("MAKESPAN_METRICS_PORT", port, "in use: each process that serves metrics needs "
                                  "its own port (0: none)") from None
        raise ValidationError("PROMETHEUS_MULTIPROC_DIR", getattr(e, "filename", None) or os.environ.get(
            "PROMETHEUS_MULTIPROC_DIR", ""), f"the metrics directory cannot be used: {e.strerror or e}; set "
            "PROMETHEUS_MULTIPROC_DIR to a directory this user can write") from None


def _serve(port: int, settings: Any, redis_state: bool, multiprocess: bool, addr: str | None,
           endpoints: Iterable[str] | None, pool: str | None) -> Any:
    """:func:`start_metrics_server` after its port check."""
    from prometheus_client import start_http_server

    if multiprocess:
        enable_multiprocess()
    declare_endpoints(fleet_endpoints_from_env() if endpoints is None else endpoints)
    client = keys = None
    stale_s = 5.0
    if redis_state:
        from makespan.redis_conn import connect
        from makespan.settings import Settings
        from makespan.wait_reasons import stale_after_s

        s = settings or Settings.from_env()
        client, keys = connect(s.redis_url, socket_timeout=2.0), Keys(s.key_prefix, pool)
        stale_s = stale_after_s(s.lease_ttl_s)
    addr = addr if addr is not None else (os.environ.get("MAKESPAN_METRICS_ADDR", "").strip() or "0.0.0.0")
    server, _thread = start_http_server(port, addr=addr, registry=build_registry(client, keys, multiprocess, stale_s))
    return server
