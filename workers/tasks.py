"""Celery phase tasks. One task per phase so Flower and traces show each phase; a
job's phases travel as a chain on its host's queue ``gpu.{host}``.

The app here (``celery``) is the GPU worker's, built from the environment
(``Settings.from_env()``); producers publish through the app of their own settings instead
(:mod:`makespan.workers.publish`, which names these tasks).

Start a GPU worker with ``makespan gpu-worker --fleet FLEET --host HOST``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from functools import lru_cache

from celery import signals

from makespan import metrics, telemetry
from makespan.celery_app import create_celery
from makespan.keys import Keys
from makespan.models import FleetSpec, load_fleet, parse_fleet
from makespan.redis_conn import connect
from makespan.settings import Settings
from makespan.errors import StoreError
from makespan.registry import LIVE_TTL_S, REGISTRY, end_host_marks_except, holder_id, load_modules, publish, withdraw
from makespan.workers.phases import STOPS_CHAIN, PhaseContext, PhaseRunner
from makespan.workers.publish import PHASE_TASK_NAMES, PHASES, WARM_JOB_TASK

log = logging.getLogger("makespan.tasks")

settings = Settings.from_env()
celery = create_celery(settings)
telemetry.instrument_celery(celery, "makespan-gpu-worker")
# User modules with @makespan.workload functions (``--workloads``, MAKESPAN_WORKLOADS), imported
# here so that the worker and every pool child hold the same registry, as ``celery -A`` does.
WORKLOADS = load_modules(settings.workload_modules) if settings.workload_modules else []


@lru_cache(maxsize=1)
def _fleet() -> FleetSpec:
    path = os.environ.get("MAKESPAN_FLEET")
    if path:
        return load_fleet(path)
    import json

    raw = connect(settings.redis_url).get(Keys(settings.key_prefix).fleet)
    if not raw:
        raise RuntimeError("no fleet: set MAKESPAN_FLEET or start the planner first")
    return parse_fleet(json.loads(raw))


_runner: PhaseRunner | None = None


def runner() -> PhaseRunner:
    global _runner
    if _runner is None:
        _runner = PhaseRunner(connect(settings.redis_url), settings, _fleet())
    return _runner


@signals.worker_process_init.connect
def _reset_after_fork(**_kw) -> None:
    global _runner
    _runner = None  # a forked child opens its own Redis connections


_in_pool_child = False  # this process is a prefork pool child that watches its parent's shutdown


@signals.worker_init.connect
def _dump_tracebacks_on_a_crash(**_kw) -> None:
    """A fatal signal (a segmentation fault in a workload function's native code, SIGABRT,
    SIGBUS) writes every thread's Python traceback to the worker's stderr before the process
    dies (:func:`faulthandler.enable`; forked pool children keep it): the stack names the
    function that crashed it. It printed nothing at all (a hostile-code check). An
    ``os._exit`` or a SIGKILL (the OOM killer) still leaves no trace."""
    import faulthandler

    try:
        faulthandler.enable(file=sys.__stderr__, all_threads=True)  # Celery's sys.stderr proxy has no fd
    except (AttributeError, OSError, RuntimeError, ValueError) as e:
        log.warning("faulthandler not enabled (no usable stderr): %s", e)


@signals.worker_init.connect
def _open_children_notice(**_kw) -> None:
    """Before a prefork pool forks its children: the pipe through which they learn that
    this worker's shutdown began (:func:`makespan.shutdown.open_children_notice`; two file
    descriptors, unused by the threads and solo pools)."""
    from makespan import shutdown

    shutdown.open_children_notice()


@signals.worker_process_init.connect
def _watch_parent_shutdown(**_kw) -> None:
    """In each prefork pool child: set this child's ``SHUTTING_DOWN`` when the worker's
    shutdown begins (:func:`makespan.shutdown.watch_parent_notice`), so that its running
    phase stops early and hands its lease back as in the threads pool."""
    global _in_pool_child
    from makespan import shutdown

    _in_pool_child = shutdown.watch_parent_notice(settings.shutdown_grace_s)


@signals.task_prerun.connect
def _hold_sigterm_in_pool_child(**_kw) -> None:
    """In a prefork pool child: a SIGTERM sent to the whole process group during a task
    stops the task as the worker's shutdown does, instead of ending the child mid-phase
    (:func:`makespan.shutdown.hold_sigterm_during_task`)."""
    if _in_pool_child:
        from makespan import shutdown

        shutdown.hold_sigterm_during_task(settings.shutdown_grace_s)


@signals.task_postrun.connect
def _task_done_in_pool_child(**_kw) -> None:
    if _in_pool_child:
        from makespan import shutdown

        shutdown.task_done()


def _make_phase_task(phase: str):
    @celery.task(name=PHASE_TASK_NAMES[phase], bind=True, acks_late=True, ignore_result=True, shared=False)
    def _task(self, ctx: dict) -> str:
        c = PhaseContext.from_dict(ctx)
        out = runner().run(c, phase)
        if out in STOPS_CHAIN:
            self.request.chain = None  # stop the chain: later phases of this lease must not run
        return out

    return _task


PHASE_TASKS = {p: _make_phase_task(p) for p in PHASES}


@signals.task_failure.connect
def _pool_process_lost(sender=None, exception=None, args=None, **_kw) -> None:
    """Prefork: Celery's main process reports a pool process that died while it ran one of
    our phase tasks (``WorkerLostError``: a workload function's segmentation fault, an
    ``os._exit``, the OOM killer): give that job's lease back now, counting an attempt
    (:meth:`makespan.workers.phases.PhaseRunner.pool_process_lost`), instead of leaving it to
    its TTL. A restore's lease is left to its TTL. Best effort: a Redis error leaves the
    lease to expire as before."""
    from billiard.exceptions import WorkerLostError

    if not isinstance(exception, WorkerLostError) or not args or not isinstance(args[0], dict):
        return
    if getattr(sender, "name", None) not in (WARM_JOB_TASK, *PHASE_TASK_NAMES.values()):
        return
    try:
        ctx = PhaseContext.from_dict(args[0])
        if ctx.kind == "job":
            runner().pool_process_lost(ctx, " ".join(str(exception).split())[:500])
    except Exception as e:  # noqa: BLE001 - never break Celery's failure handling
        log.warning("a lost pool process's lease was not handed back (it expires with its TTL): %s: %s",
                    type(e).__name__, e)


@celery.task(name=WARM_JOB_TASK, bind=True, acks_late=True, ignore_result=True, shared=False)
def warm_job(self, ctx: dict) -> str:
    """Fast path for a warm job: its endpoint instance is already resident on exactly its
    leased GPUs, so evict and start_endpoint have nothing to do. Runs all four phases in
    one task (one broker round trip instead of four) and two fenced Redis scripts
    (:mod:`makespan.workers.warm`); a redelivery, a cancel or a changed GPU falls back to the
    phase-by-phase path, where each phase stays idempotent and fenced."""
    from makespan.workers.warm import run_warm

    return run_warm(runner(), PhaseContext.from_dict(ctx))


class RegistryPublisher:
    """Publishes this worker's workload functions (:func:`makespan.registry.publish`) at
    start and every ``LIVE_TTL_S / 3`` from a daemon thread, so producers can tell which
    names a live worker runs. After a failed publish (Redis away: the names expire) it
    tries again every ``retry_s`` (default: the host re-announce cadence,
    ``worker_liveness_ttl_s × RENEW_FRACTION``, 1.75 s by default), so submits are accepted again
    within that of Redis coming back. :meth:`stop` (a clean shutdown) withdraws them
    (:func:`makespan.registry.withdraw`): a name no other live worker holds is refused at
    once, and the host's marks of its names end (the planner places their jobs on the hosts
    whose workers hold them); after a crash the names expire with their TTL. A name in ``refused`` (name ->
    why: it names an endpoint the fleet lacks) is not published live; its reason is, with
    the same TTL, for ``makespan ready`` and a submit to name."""

    def __init__(self, retry_s: float | None = None, refused: dict[str, str] | None = None) -> None:
        from makespan.workers.host_liveness import RENEW_FRACTION

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="makespan-registry", daemon=True)
        self.holder = holder_id()
        self.retry_s = retry_s if retry_s is not None else settings.worker_liveness_ttl_s * RENEW_FRACTION
        self._failing = False
        self.refused = dict(refused or {})

    def start(self) -> None:
        metrics.declare_workloads(name for name in REGISTRY if name not in self.refused)  # their counters at 0
        self._publish()  # before the first task: a submit right after start must pass
        self._thread.start()

    def _publish(self) -> bool:
        """One publish; False (logged once per outage) when Redis did not take it."""
        try:
            publish(connect(settings.redis_url), Keys(settings.key_prefix),
                    [d for d in REGISTRY.values() if d.name not in self.refused], holder=self.holder,
                    refused=self.refused, host=os.environ.get("MAKESPAN_HOST", ""))
        except StoreError as e:  # Redis away: the names expire, submits are refused until it is back
            if not self._failing:
                log.warning("publishing workload functions failed (retrying every %.1f s): %s", self.retry_s, e)
            self._failing = True
            return False
        if self._failing:
            log.warning("workload functions published again")
        self._failing = False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.retry_s if self._failing else LIVE_TTL_S / 3):
            self._publish()

    def stop(self) -> None:
        """Stop renewing and withdraw this worker's names (best effort: Redis may be gone)."""
        self._stop.set()
        self._thread.join(timeout=5.0)  # a publish in flight must not renew after the withdraw
        try:
            ended = withdraw(connect(settings.redis_url), Keys(settings.key_prefix), list(REGISTRY), self.holder,
                             host=os.environ.get("MAKESPAN_HOST", ""))
        except StoreError as e:
            log.warning("withdrawing workload functions failed (they expire in %.0f s): %s", LIVE_TTL_S, e)
            return
        if ended:
            log.info("workload functions no longer live (no other GPU worker holds them): %s", ", ".join(ended))


_publisher: RegistryPublisher | None = None


@signals.worker_ready.connect
def _publish_registry(**_kw) -> None:
    global _publisher
    if _publisher is not None:
        return
    refused = _check_helpers() if REGISTRY else {}
    _end_marks_of_missing(set(REGISTRY) - set(refused))
    if REGISTRY:
        _publisher = RegistryPublisher(refused=refused)
        _publisher.start()


def _end_marks_of_missing(held: set[str]) -> None:
    """This host's marks of the workload functions published before (``P:fns``) that this
    worker does not hold end (:func:`makespan.registry.end_host_marks_except`): after a
    crash and a restart with other ``--workloads`` the planner would otherwise place their
    jobs here until the marks expire, and each would fail (best effort: Redis may be away)."""
    host = os.environ.get("MAKESPAN_HOST", "")
    try:
        ended = end_host_marks_except(connect(settings.redis_url), Keys(settings.key_prefix), host, held)
    except StoreError as e:
        log.warning("ending host %s's marks of workload functions it does not register failed: %s", host, e)
        return
    if ended:
        log.info("host %s: %d workload function(s) registered here before are not in this worker's --workloads: "
                 "their jobs go to the hosts that register them", host, ended)


def _check_helpers() -> dict[str, str]:
    """Every endpoint a registered workload names must be in the fleet (a typo would
    otherwise fail each job at run time). Returns name -> why for each workload that
    names one the fleet does not have: it is not published live (a submit is refused,
    ``makespan ready`` says why)."""
    endpoints = set(_fleet().endpoints)
    refused: dict[str, str] = {}
    for d in REGISTRY.values():
        for name in (d.endpoint, *d.helpers):
            if name is not None and name not in endpoints and d.name not in refused:
                refused[d.name] = (f"it names endpoint {name!r}, which the fleet does not have "
                                   f"({', '.join(sorted(endpoints))})")
                log.error("workload %s names endpoint %r, which the fleet does not have (%s); not published",
                          d.name, name, ", ".join(sorted(endpoints)))
    return refused


_heartbeat = None  # makespan.workers.host_liveness.HostHeartbeat of this worker's host


@signals.worker_ready.connect
def _announce_host(**_kw) -> None:
    """Once consuming: announce this host's queue as consumed (the dead-host gate,
    :mod:`makespan.workers.host_liveness`) until shutdown."""
    global _heartbeat
    host = os.environ.get("MAKESPAN_HOST")
    if not host or _heartbeat is not None:
        return
    from makespan.workers.host_liveness import HostHeartbeat

    try:
        fleet: FleetSpec | None = _fleet()  # published with the liveness mark (makespan.workers.worker_fleets)
    except Exception as e:  # no file and none published: the first phase says so; the host is live meanwhile
        log.warning("the fleet this GPU worker runs is not published with host %s's liveness: %s", host, e)
        fleet = None
    _heartbeat = HostHeartbeat(connect(settings.redis_url, settings=settings), Keys(settings.key_prefix), host,
                               settings.worker_liveness_ttl_s, fleet=fleet)
    _heartbeat.start()


@signals.worker_ready.connect
def _ignore_sighup(**_kw) -> None:
    """Replace Celery's SIGHUP handler (it re-executes a detached worker at once, bypassing
    makespan's shutdown: the host stayed live while taking no job, and a SIGTERM then
    started a new worker) with one that ignores the signal and says so
    (:func:`makespan.shutdown.sighup_handler`). Celery installs its own as the worker
    starts, so this replaces it once the worker is ready."""
    import signal

    from celery import platforms

    from makespan import shutdown

    if hasattr(signal, "SIGHUP"):
        platforms.signals["SIGHUP"] = shutdown.sighup_handler("gpu-worker")


@signals.worker_shutting_down.connect
def _withdraw_host(sig: str | None = None, **_kw) -> None:
    """Shutdown begins (``sig``: Celery's name of the signal, ``"SIGTERM"`` or ``"SIGINT"``):
    the SIGTERM bound's watchdog starts (:mod:`makespan.shutdown`: a phase still running
    after ``shutdown_grace_s`` is cut off, its lease reclaimed), and this host gets no new
    leases from now on (not after the liveness TTL)."""
    from makespan import shutdown

    shutdown.arm(settings.shutdown_grace_s, "gpu-worker", sig or "SIGTERM")
    _end_announcements()


@signals.worker_shutdown.connect
def _withdraw_host_at_exit(**_kw) -> None:
    """A stop that sent no ``worker_shutting_down`` (a refusal after start,
    :mod:`makespan.workers.startup_checks`, ends through ``should_stop``): withdraw the host
    and the workload functions here (nothing left to do after :func:`_withdraw_host`)."""
    _end_announcements()


def _end_announcements() -> None:
    """Stop the host heartbeat and the registry publisher and withdraw both (once)."""
    global _heartbeat, _publisher
    heartbeat, publisher, _heartbeat, _publisher = _heartbeat, _publisher, None, None
    if heartbeat is not None:
        heartbeat.stop()
    if publisher is not None:  # submits of functions no other live worker runs are refused from now
        publisher.stop()


@signals.worker_shutting_down.connect
def _stop_idle_endpoints(**_kw) -> None:
    """As soon as shutdown begins (SIGTERM, Ctrl-C), stop the endpoint processes of this
    host that no lease holds: a supervisor's grace period (honcho: 5 s) may run out
    while Celery's warm shutdown waits, and SIGKILL would orphan them."""
    _stop_endpoints(idle_only=True)


@signals.worker_shutdown.connect
def _stop_own_endpoints(**_kw) -> None:
    """On shutdown the GPU worker stops the endpoint processes running on its host (they
    run in their own sessions and would outlive it) and forgets them, so the planner
    sees those GPUs empty and loads or restores what it needs next time — except those
    on GPUs a live lease holds: that lease's later phases (queued on this host, run by
    the next worker) need them. If no worker comes back, the lease expires, its reclaim
    forgets the resident markers and the next start phase or worker start sweep
    (:mod:`makespan.workers.orphans`) stops them."""
    _stop_endpoints(idle_only=True)


@signals.worker_init.connect
def _reindex_instances(**_kw) -> None:
    """Before consuming: put every registered endpoint instance into the per-GPU index
    its phases read (:func:`makespan.workers.drivers.registry.instances_on`), so that
    instances registered by a version without the index are found. Best effort: a Redis
    that does not answer yet is logged."""
    from makespan.workers.drivers.registry import reindex_instances

    try:
        reindex_instances(connect(settings.redis_url), Keys(settings.key_prefix))
    except Exception as e:  # noqa: BLE001 - a start must not fail on the reindex
        log.warning("instance reindex at start skipped: %s", e)


@signals.worker_init.connect
def _sweep_orphans(**_kw) -> None:
    """Before consuming: stop and report the endpoint processes an earlier worker of this
    host left behind (:func:`makespan.workers.orphans.sweep`). Best effort: a Redis that
    does not answer yet is logged."""
    host = os.environ.get("MAKESPAN_HOST")
    if not host:
        return
    from makespan.workers.orphans import sweep

    try:
        fleet_hosts = {spec.name: spec for spec in _fleet().hosts}
        host_gpus = [gpu.uuid for gpu in fleet_hosts[host].gpus] if host in fleet_hosts else None
        sweep(connect(settings.redis_url), Keys(settings.key_prefix), host, host_gpus)
    except Exception as e:  # noqa: BLE001 - a start must not fail on the sweep
        log.warning("orphan sweep at start skipped: %s", e)


def _stop_endpoints(idle_only: bool) -> None:
    """Stop and unregister this host's endpoint processes (``idle_only``: only those on
    GPUs no live lease holds: a GPU key exists while its lease is live), each unregistered
    only once its process group is gone (:func:`makespan.workers.drivers.registry.retire_instance`).
    Best effort: Redis may already be gone."""
    host = os.environ.get("MAKESPAN_HOST")
    if not host:
        return
    from makespan.workers.drivers import get_driver
    from makespan.workers.drivers.registry import list_instances, retire_instance
    from makespan.workers.orphans import spawns_process
    from makespan.workers.phases import instance_value

    try:
        r = connect(settings.redis_url)
        keys = Keys(settings.key_prefix)
        for inst in list_instances(r, keys):
            if inst.host != host or not spawns_process(inst.driver):
                continue
            if idle_only and any(r.mget([keys.gpu(g) for g in inst.gpus])):
                continue  # a lease holds its GPUs: a job may be using it
            want = instance_value(inst.endpoint, inst.gpus)
            for g in inst.gpus:
                if r.get(keys.resident(g)) == want:
                    r.delete(keys.resident(g))
            try:
                # stopping (the health observer must not see it die and restart it), then
                # forgotten once its process group is gone: cut off mid-stop (the SIGTERM
                # bound's watchdog), it stays recorded for the next worker's orphan sweep
                retire_instance(r, keys, inst, get_driver(inst.driver).stop)
                if inst.pid:
                    os.waitpid(inst.pid, os.WNOHANG)  # reap it if it was our child (no zombie)
            except ChildProcessError:
                pass  # started by an earlier worker process: not ours to reap
            except Exception as e:  # noqa: BLE001 - best effort at shutdown
                log.warning("stopping %s at shutdown: %s", inst.endpoint, e)
    except Exception as e:  # noqa: BLE001 - Redis may already be gone
        log.warning("endpoint cleanup at shutdown skipped: %s", e)
