"""The transitions of a job's phases (:mod:`makespan.workers.phases`): evict (sleep,
stop), start endpoint and restore (wake, cold start), helper endpoints, and the memory
rules of sleepers (issue 20). :class:`TransitionPhases` is a part of
:class:`makespan.workers.phases.PhaseRunner` (its attributes and commit path are the
runner's)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import redis

from makespan import metrics, shutdown, telemetry
from makespan.errors import PhaseCancelled, PhaseError, StaleFencingToken, StoreError
from makespan.driver_registry import DRIVERS, DriverCapabilities, DriverContext, no_wait
from makespan.planner.helpers import stacked_mib
from makespan.planner.sleepers import may_sleep, sleepers_kept
from makespan.workers.drivers.base import EndpointDriver, Instance
from makespan.workers.drivers.registry import (instances_on, list_sleepers, register_instance,
                                               retire_instance, set_instance_state, sleepers_on)
from makespan.estimates import prior_s, read_transition_windows, transition_estimate, transition_record_ops, wake_kind
from makespan.registry import REGISTRY
from makespan.workers.heartbeat import DeferredWaits, LeaseHeartbeat
from makespan.workers.incident_records import record_death_found_by_a_phase, record_recovery_by_a_phase
from makespan.workers.phase_context import PhaseContext, Registered, instance_value, parse_instance

log = logging.getLogger("makespan.phases")


class TransitionPhases:
    """Evict, start endpoint, restore and helpers: the transition part of
    :class:`makespan.workers.phases.PhaseRunner`."""

    # -- transitions: sleep, wake, stop, cold start (issue 20) ---------------------------
    def _sleep_capable(self, endpoint: str) -> bool:
        """The planner's rule (:mod:`makespan.planner.replay`): an endpoint with a ``wake_s``
        has a sleep mode; its evicted instances sleep and its loads there are wakes."""
        spec = self.fleet.endpoints.get(endpoint)
        return spec is not None and spec.wake_s is not None

    def _driver(self, name: str, wait: Callable[[float], None] = no_wait,
                pause: Callable[[float], None] | None = None) -> EndpointDriver:
        """Driver ``name`` for one transition, its modelled waits (a driver whose
        transitions are waits, e.g. ``simulated``: the fleet file's figure × the host's
        ``Settings.simulated_slowdown`` × the time scale) spent by ``wait``: a
        lease-aware wait (:meth:`_paced`), a :class:`DeferredWaits` ``add``, or
        :func:`no_wait` (a stop no transition is priced for: a leftover, a sleeper that
        no longer fits). A driver that does real work ignores it, and spends the sleeps
        between its polls by ``pause`` (None: :func:`time.sleep`; see
        :class:`makespan.driver_registry.DriverContext`)."""
        return DRIVERS.create(name, context=DriverContext(self.fleet.endpoints, self._slowdown, wait, pause))

    def _paced(self, hb: LeaseHeartbeat) -> Callable[[float], None]:
        """A driver's ``wait`` that stops with StaleFencingToken when the lease is lost."""
        return lambda wall_s: self._wait_wall(wall_s, hb)

    def _paced_cancellable(self, ctx: PhaseContext, hb: LeaseHeartbeat, what: str = "its start_endpoint",
                           cancellable: bool = True) -> Callable[[float], None]:
        """:meth:`_paced` for a job's lease (a driver's modelled wait or its pauses between
        polls; execute's wait of ``service_s``) that also stops, waking every 50 ms:

        * with PhaseCancelled when the job's cancel is requested (the signal execute
          watches, :meth:`_stopper`; not with ``cancellable`` False: a wake);
        * with StaleFencingToken when the GPU worker shuts down
          (:data:`makespan.shutdown.SHUTTING_DOWN`; logged as ``what`` stopped): the
          caller stops what it spawned and the phase hands the lease back
          (:meth:`guarded`, :meth:`hand_back`) well before the shutdown's watchdog.

        A restore lease has no job to cancel nor to hand back: :meth:`_paced` (its
        transition runs on at a shutdown, as before)."""
        if ctx.kind != "job":
            return self._paced(hb)
        cancelled = self._stopper(ctx, hb) if cancellable else None

        def wait(wall_s: float) -> None:
            try:
                self._wait_wall(wall_s, hb,
                                lambda: shutdown.SHUTTING_DOWN.is_set() or (cancelled is not None and cancelled()))
            except PhaseCancelled as e:
                self._given_up_at_shutdown(ctx, f"{what} stopped: {e}")
                raise
        return wait

    @staticmethod
    def _capabilities(driver: str) -> DriverCapabilities:
        return DRIVERS.capabilities(driver)

    def _planned_s(self, endpoint: str, kind: str, host: str) -> float:
        """The planned duration (workload s) of ``kind`` for ``endpoint`` on ``host``: the
        learned estimate (:func:`makespan.estimates.transition_estimate`), the fleet
        file's figure until enough were measured (or when Redis fails)."""
        spec = self.fleet.endpoints.get(endpoint)
        if spec is None:
            return 0.0
        prior = prior_s(spec, kind)
        try:
            windows = read_transition_windows(self.r, self.keys, [endpoint], [h.name for h in self.fleet.hosts])
        except StoreError as e:
            log.warning("learned durations of %s not read, planning with the fleet file's: %s", endpoint, e)
            return prior
        return transition_estimate(windows, endpoint, host, kind, prior, self.settings.transition_min_observations,
                                   self.settings.transition_quantile).seconds

    def _timed(self, ctx: PhaseContext, extra: dict, kind: str, endpoint: str, planned_s: float,
               wall_s: float) -> None:
        """Note one executed transition: its measured duration (workload s) goes into the
        phase's fenced commit (``extra["_ops"]``, learned durations) and its event
        (``extra["transitions"]``); the transition metrics are observed."""
        actual_s = wall_s / self.settings.time_scale if self.settings.time_scale > 0 else wall_s
        extra.setdefault("_ops", []).extend(transition_record_ops(self.keys, endpoint, ctx.host, kind, actual_s))
        extra.setdefault("transitions", []).append({"kind": kind, "endpoint": endpoint,
                                                    "planned_s": round(planned_s, 6), "actual_s": round(actual_s, 6)})
        metrics.transition(kind, wall_s, planned_s, actual_s)

    def _gpu_mib(self, uuid: str) -> int:
        return self._gpu_memory.get(uuid, 0)

    def _need_mib(self, ctx: PhaseContext, endpoint: str, helpers: tuple[str, ...] = ()) -> dict[str, int]:
        """MiB ``endpoint`` (with the job's ``helpers``) holds on each of the lease's GPUs
        while the job runs (:func:`makespan.planner.helpers.stacked_mib`, as the plan counts it)."""
        eps = self.fleet.endpoints
        if endpoint not in eps:
            return {}
        main = eps[endpoint]
        per_gpu = stacked_mib(main.memory_mib_per_gpu, len(ctx.gpus),
                              [(eps[h].memory_mib_per_gpu, eps[h].tensor_parallel) for h in helpers if h in eps])
        return dict(zip(ctx.gpus, per_gpu))

    def _sleeper_room(self, gpus: list[str], ctx: PhaseContext, sleepers: list[Instance]) -> dict[str, float]:
        """GPU MiB left for more sleepers on each of ``gpus`` once the lease's endpoint and
        the job's helper endpoints (on the lease's GPUs) and the ``sleepers`` kept beside
        them (:func:`sleepers_kept`) are counted."""
        eps = self.fleet.endpoints
        room = {}
        held_by_job = self._need_mib(ctx, ctx.endpoint, self._helpers(ctx))
        for u in gpus:
            need = held_by_job.get(u, 0)
            held = {i.endpoint: eps[i.endpoint].asleep_gpu_mib for i in sleepers if u in i.gpus and i.endpoint in eps}
            kept = sleepers_kept(self._gpu_mib(u) - need, held)
            room[u] = self._gpu_mib(u) - need - sum(held[e] for e in kept)
        return room

    def _planned_level(self, ctx: PhaseContext, endpoint: str) -> int:
        """The sleep level the plan chose for the evicted ``endpoint`` (0: stop it); the
        fleet file's ``sleep_level`` when the plan did not choose."""
        planned = (ctx.sleep_levels or {}).get(endpoint)
        return int(planned) if planned is not None else self.fleet.endpoints[endpoint].sleep_level

    def _may_sleep(self, inst: Instance, ctx: PhaseContext, level: int | None = None) -> str | None:
        """None if ``inst`` may sleep at ``level`` (default: the plan's, :meth:`_planned_level`)
        by the planner's rule (:mod:`makespan.planner.sleepers`): its host RAM fits the
        host's ``host_memory_mib`` beside the sleepers registered there and its GPU memory
        fits beside what loads in its place; else why not."""
        eps = self.fleet.endpoints
        spec = eps[inst.endpoint]
        level = self._planned_level(ctx, inst.endpoint) if level is None else level
        # a level-2 sleeper holds no host RAM (the plan may choose level 2 for a level-1 endpoint)
        ram_mib = spec.asleep_ram_mib if level == spec.sleep_level else 0
        # a sleeper of the endpoint this lease loads, on its GPUs, is woken (or stopped) by the
        # load: it holds neither RAM nor GPU memory beside the evicted instance (the replay drops
        # it first too, Replay._drop_asleep)
        sleepers = [(i, level) for i, level in list_sleepers(self.r, self.keys)
                    if not (i.endpoint == ctx.endpoint and set(i.gpus) & set(ctx.gpus))]
        asleep = [i for i, _level in sleepers]
        # what each sleeper holds at the level it really sleeps at (a level-2 sleeper: no RAM)
        used = sum(eps[i.endpoint].asleep_ram_mib for i, level in sleepers
                   if i.host == ctx.host and i.endpoint in eps and level in (None, eps[i.endpoint].sleep_level))
        budget = self.fleet.host_ram_budgets().get(ctx.host)
        room = self._sleeper_room(list(inst.gpus), ctx, [i for i in asleep if set(i.gpus) & set(inst.gpus)])
        if may_sleep(used, budget, ram_mib, min(room.values(), default=0.0), spec.asleep_gpu_mib):
            return None
        if budget is not None and used + ram_mib > budget:
            return f"host RAM for sleepers: {used} + {ram_mib} MiB over {ctx.host}'s {budget} MiB"
        return f"GPU memory: {spec.asleep_gpu_mib} MiB asleep does not fit beside {ctx.endpoint}"

    def _sleep_level(self, inst: Instance, ctx: PhaseContext, extra: dict) -> tuple[int, str | None]:
        """(the level ``inst`` sleeps at, None) or (its level, why it may not sleep): the
        plan's level (:meth:`_planned_level`); level 2 instead of a refused level 1 where its
        endpoint has a level-2 mode (``wake_level2_s``), its driver has level 2 and a level-2
        sleeper (no host RAM) fits. The plan prices a group's sleeper per GPU, so it chooses
        level 1 for an instance it displaces only in part whose whole RAM does not fit: a wake
        from level 2 beats the cold start a stop would cost (noted in
        ``extra["sleep_level_lowered"]``)."""
        level = self._planned_level(ctx, inst.endpoint)
        why = self._may_sleep(inst, ctx, level)
        spec = self.fleet.endpoints[inst.endpoint]
        if (why is not None and level == 1 and spec.sleep_level == 1 and spec.wake_level2_s is not None
                and 2 in self._capabilities(inst.driver).sleep_levels and self._may_sleep(inst, ctx, 2) is None):
            log.info("%s on %s sleeps at level 2, not 1: %s", inst.endpoint, ",".join(inst.gpus), why)
            extra.setdefault("sleep_level_lowered", []).append(f"{inst.endpoint}: {why}")
            return 2, None
        return level, why

    def _stop_unfitting_sleepers(self, ctx: PhaseContext, endpoint: str, extra: dict,
                                 helpers: tuple[str, ...] = ()) -> None:
        """Stop the sleepers on the lease's GPUs that no longer fit beside ``endpoint`` and
        the job's ``helpers`` (the planner's rule, largest first); their names go into
        ``extra["sleepers_stopped"]``. Raises PhaseError: a stop left processes alive
        (:meth:`_clear_for_start`)."""
        sleepers = [i for i in self._sleepers_on(ctx.gpus) if i.endpoint != endpoint]
        if not sleepers:
            return
        eps, need = self.fleet.endpoints, self._need_mib(ctx, endpoint, helpers)
        gone: set[str] = set()
        for u in ctx.gpus:
            held = {i.endpoint: eps[i.endpoint].asleep_gpu_mib for i in sleepers if u in i.gpus and i.endpoint in eps}
            gone |= set(held) - sleepers_kept(self._gpu_mib(u) - need.get(u, 0), held)
        if gone:
            extra["sleepers_stopped"] = sorted(gone)
        self._clear_for_start([inst for inst in sleepers if inst.endpoint in gone], ", ".join((endpoint, *helpers)))

    def _put_to_sleep(self, inst: Instance, wait: Callable[[float], None], level: int | None = None) -> str | None:
        """Sleep ``inst`` at ``level`` (the plan's choice; None: its endpoint's
        ``sleep_level``; modelled waits spent by ``wait``) and mark it ``asleep`` in the
        registry; None, or why it could not (the caller stops it instead)."""
        level = level if level is not None else self.fleet.endpoints[inst.endpoint].sleep_level
        if level not in self._capabilities(inst.driver).sleep_levels:
            return f"driver {inst.driver!r} has no sleep level {level}"
        try:
            with telemetry.child_span("endpoint_sleep", {"endpoint": inst.endpoint, "instance": inst.id,
                                                         "level": level}):
                self._driver(inst.driver, wait).sleep(inst, level)
        except PhaseError as e:
            return str(e)
        set_instance_state(self.r, self.keys, inst.id, "asleep", sleep_level=level)
        return None

    def _wake_up(self, ctx: PhaseContext, inst: Instance, hb: LeaseHeartbeat) -> str | None:
        """Wake the sleeping ``inst`` for ``ctx``'s lease and mark it ``running``; None, or
        why it could not. Both marks are fenced by the lease: it is ``waking`` while the
        wake runs, so a start phase of a lease that took the GPUs meanwhile (a preemption)
        stops it as a leftover instead of keeping it as a sleeper, and a wake that ends
        after the lease was lost stops the instance: nothing would track it awake. The
        wake's waits (a modelled one; a real one's wait for its answer) stop when the lease
        is lost or, for a job, when the GPU worker shuts down (:meth:`_paced_cancellable`):
        the half-woken instance is stopped too.

        Raises:
            StaleFencingToken: the lease was lost before or during the wake, or the GPU
                worker shuts down during a job's wake (the caller hands the lease back)."""
        key = self.keys.instance(inst.id)
        if not self.leases.fenced(ctx.lease, [("HSETX", key, "state", "waking")]):
            raise StaleFencingToken("lease lost before the endpoint woke")
        paced = self._paced_cancellable(ctx, hb, "its wake", cancellable=False)  # a modelled wake, a real one's answer
        with telemetry.child_span("endpoint_wake", {"endpoint": inst.endpoint, "instance": inst.id}) as span:
            try:
                self._driver(inst.driver, paced, pause=paced).wake(inst)
            except PhaseError as e:
                span.set_attribute("makespan.outcome", "failed")
                return str(e)
            except StaleFencingToken:  # lost lease or shutdown mid-wake: half awake, nothing would track it
                span.set_attribute("makespan.outcome", "abandoned")
                self._stop_instance(inst)
                raise
            span.set_attribute("makespan.outcome", "woken")
        if not self.leases.fenced(ctx.lease, [("HSETX", key, "state", "running")]):
            self._stop_instance(inst)
            raise StaleFencingToken("lease lost while the endpoint woke")
        return None

    # -- phases ------------------------------------------------------------------------
    def _phase_evict(self, ctx: PhaseContext, hb: LeaseHeartbeat, extra: dict) -> float:
        """Evict every other instance resident on the lease's GPUs (whole, on every GPU of
        its group): an endpoint with a sleep mode is put to sleep (it stays registered,
        ``asleep``, and wakes cheaply later), any other is stopped; a sleep that fails
        falls back to a stop (``sleep_failed`` in the event). Event fields: ``evicted``
        (every endpoint displaced), ``slept`` (those asleep now), ``slept_levels``
        (endpoint -> the sleep level 1 or 2 it sleeps at, when any slept), ``transition``
        (``sleep`` when all slept, else ``evict``), ``transitions`` (each one's kind,
        planned and measured workload s)."""
        residents = self._residents(ctx.gpus)
        target = ctx.endpoint
        victims: dict[str, list[str]] = {}
        for v in residents.values():
            inst = parse_instance(v)
            if inst is None:
                continue
            ep, inst_gpus = inst
            if ep == target and sorted(inst_gpus) == sorted(ctx.gpus):
                continue  # the right instance is already here: nothing to evict
            victims.setdefault(v, inst_gpus)
        if not victims:
            return 0.0
        eps = sorted({parse_instance(v)[0] for v in victims})
        # the sleep-capable endpoints the plan did not choose to stop (Assignment.sleep_levels)
        sleepy = {e for e in eps if self._sleep_capable(e) and self._planned_level(ctx, e) > 0}
        extra["evicted"] = eps
        kind_of = {e: "sleep" if e in sleepy else "evict" for e in eps}
        planned = {e: self._planned_s(e, kind_of[e], ctx.host) for e in eps}
        evict_s = max(planned.values())
        victim_gpus = sorted({g for inst_gpus in victims.values() for g in inst_gpus})
        slept: set[str] = set()
        failed: list[str] = []
        with self._transition("sleep" if sleepy == set(eps) else "evict", ctx, eps, evict_s):
            pairs = instances_on(self.r, self.keys, victim_gpus, with_state=True)
            running = [i for i in self._instances_on(victim_gpus, pairs) if i.endpoint in eps]
            for inst in (i for i, state in pairs if state == "running" and i.endpoint in eps):
                if self._process_gone(inst):  # died before the evict: on record (no observer may have seen it)
                    self._record_death([inst], ctx, reloaded=False)
            modelled = DeferredWaits()  # the victims' modelled transitions run as one: the longest
            t0 = time.monotonic()
            took: dict[str, float] = {}
            levels: dict[str, int] = {}
            for inst in running:
                t1 = time.monotonic()
                level, why = self._sleep_level(inst, ctx, extra) if inst.endpoint in sleepy else (0, None)
                if why is not None:
                    log.info("%s on %s not put to sleep: %s", inst.endpoint, ",".join(inst.gpus), why)
                    sleepy_stopped = extra.setdefault("sleep_skipped", [])
                    sleepy_stopped.append(f"{inst.endpoint}: {why}")
                    kind_of[inst.endpoint] = "evict"
                    self._stop_instance(inst, modelled.adder(inst.endpoint))
                    took[inst.endpoint] = max(took.get(inst.endpoint, 0.0), time.monotonic() - t1)
                    continue
                why = self._put_to_sleep(inst, modelled.adder(inst.endpoint), level) if inst.endpoint in sleepy else None
                if inst.endpoint not in sleepy or why is not None:
                    if why is not None:
                        failed.append(f"{inst.endpoint}: {why}")
                        kind_of[inst.endpoint] = "evict"
                    # unregister first: the observer must not see a failure
                    self._stop_instance(inst, modelled.adder(inst.endpoint))
                else:
                    slept.add(inst.endpoint)
                    levels[inst.endpoint] = level
                took[inst.endpoint] = max(took.get(inst.endpoint, 0.0), time.monotonic() - t1)
            if not any(self._capabilities(i.driver).spawns_process for i in running):
                # all modelled: the evict takes the longest (a real stop's own time stands otherwise);
                # each endpoint's sample is its own modelled time, not the longest of them all
                self._wait_wall(modelled.longest_s, hb)
                took = {e: took.get(e, 0.0) + modelled.longest_by_key.get(e, 0.0) for e in eps}
        stopped_here = {inst.endpoint for inst in running}
        for e in eps:  # an instance another lease was already stopping (its marker still here) took no time here:
            if e in stopped_here:  # not a transition of this phase, nor a sample of its duration
                self._timed(ctx, extra, kind_of[e], e, planned[e], took.get(e, time.monotonic() - t0))
        extra["slept"] = sorted(slept)
        if slept:  # the level each sleeps at (the report counts sleeps per level)
            extra["slept_levels"] = {e: levels[e] for e in sorted(slept)}
        extra["transition"] = "sleep" if slept == set(eps) else "evict"
        if failed:
            extra["sleep_failed"] = "; ".join(failed)[:1000]
        ops: list[tuple] = []
        for v, inst_gpus in victims.items():
            for g in inst_gpus:  # an instance is evicted whole, on every GPU of its group;
                # on a GPU outside this lease only while it still names that instance
                ops.append(("DELIFEQ", self.keys.resident(g), v))
        for key in ("sleep_skipped", "sleep_level_lowered"):
            if key in extra:
                extra[key] = "; ".join(extra[key])[:1000]
        if not self.leases.fenced(ctx.lease, ops):
            raise StaleFencingToken("lease lost before evict committed")
        return evict_s

    def _load(self, ctx: PhaseContext, hb: LeaseHeartbeat, endpoint: str, extra: dict | None = None) -> float:
        """Make ``endpoint`` ready on exactly the lease's GPUs: nothing when it is resident;
        a wake when an instance of it sleeps on exactly these GPUs (``transition`` =
        ``wake``; timed and learned as ``wake_level2`` from level 2 of a level-1 endpoint,
        :func:`makespan.estimates.wake_kind`); else a cold start (``cold_start``), also when the wake fails (the
        sleeper is stopped first; ``wake_failed`` in the event says why). Running
        leftovers on these GPUs are stopped, and so are sleepers of ``endpoint`` on an
        overlapping group (the planner forgets them there too); other sleepers stay. A stop
        of these that leaves a process alive fails the phase instead of starting beside it
        (:meth:`_clear_for_start`)."""
        extra = extra if extra is not None else {}
        want = instance_value(endpoint, ctx.gpus)
        residents = self._residents(ctx.gpus)
        ep = self.fleet.endpoints[endpoint]
        death: tuple[str, float] | None = None  # (incident id, when) of a dead resident found here
        if all(v == want for v in residents.values()):
            dead = self._dead_resident(ep, list(ctx.gpus))
            if dead is None:
                return 0.0
            # its process died or was killed (nothing restarted it yet): loaded again here, as
            # llama-swap reloads a crashed server, instead of failing the job in execute; the
            # crash is recorded as an incident (no observer may ever have seen it)
            why, gone = dead
            log.warning("endpoint %s is resident on %s but its process is gone (%s): cold start", endpoint,
                        ",".join(ctx.gpus), why)
            extra["dead_resident"] = why[:500]
            death = self._record_death(gone, ctx)
        restore = ctx.kind == "restore"
        levels = [(i, level) for i, level in sleepers_on(self.r, self.keys, ctx.gpus) if i.endpoint == endpoint]
        sleepers = [i for i, _level in levels]
        exact, exact_level = next(((i, level) for i, level in levels if sorted(i.gpus) == sorted(ctx.gpus)),
                                  (None, None))
        inst: Instance | None = None
        if exact is not None:
            # a level-2 sleeper of a level-1 endpoint wakes at wake_level2_s: its own window
            wake = wake_kind(ep, exact_level)
            planned = self._planned_s(endpoint, wake, ctx.host)
            with self._transition("wake", ctx, [endpoint], planned):
                self._clear_for_start(self._leftovers_on(ctx.gpus), endpoint)  # leftovers of a reclaimed lease
                self._stop_unfitting_sleepers(ctx, endpoint, extra)
                t0 = time.monotonic()
                why = self._wake_up(ctx, exact, hb)
                if why is None:
                    inst = exact
                    self._timed(ctx, extra, wake, endpoint, planned, time.monotonic() - t0)
                    extra["transition"] = "wake"
                else:
                    log.warning("wake of %s on %s failed, cold start instead: %s", endpoint, ",".join(ctx.gpus), why)
                    extra["wake_failed"] = why[:1000]
                    self._stop_instance(exact)
                if hb.lost.is_set():
                    raise StaleFencingToken("lease lost while the endpoint woke")
        if inst is None:
            kind = "restore" if restore else "cold_start"
            planned = self._planned_s(endpoint, kind, ctx.host)
            with self._transition("start", ctx, [endpoint], planned):
                # leftovers of a reclaimed lease; a sleeper cut in two
                self._clear_for_start([*self._leftovers_on(ctx.gpus), *(i for i in sleepers if i is not exact)],
                                      endpoint)
                self._stop_unfitting_sleepers(ctx, endpoint, extra)
                t0 = time.monotonic()
                # a real process: spawn, then wait on its HTTP health check (child spans);
                # a modelled one: the driver's wait of its cold start, scaled
                inst = self._start_instance(ep, list(ctx.gpus), ctx, hb)
                if hb.lost.is_set():
                    self._stop_instance(inst)
                    raise StaleFencingToken("lease lost while the endpoint started")
                register_instance(self.r, self.keys, inst)
                self._timed(ctx, extra, kind, endpoint, planned, time.monotonic() - t0)
                extra["transition"] = "cold_start"
                if death is not None:
                    self._record_reload(death, endpoint, inst)
        ops = [("SET", self.keys.resident(g), want) for g in ctx.gpus]
        if not self.leases.fenced(ctx.lease, ops):
            self._stop_instance(inst)
            raise StaleFencingToken("lease lost before start committed")
        return planned

    def _record_death(self, gone: list[Instance], ctx: PhaseContext,
                      reloaded: bool = True) -> tuple[str, float] | None:
        """The incident of the first of ``gone`` (:func:`makespan.workers.incident_records.record_death_found_by_a_phase`;
        ``reloaded``: this phase loads the endpoint again, else its evict stops it): (its id,
        when), or None (none to record, or Redis failed: logged, the phase goes on)."""
        if not gone:
            return None
        phase = "start phase" if reloaded else "evict"
        found_by = f"job {ctx.job_id}'s {phase}" if ctx.kind == "job" else f"a set-point restore's {phase}"
        try:
            return (record_death_found_by_a_phase(self.r, self.keys, gone[0], found_by, reloaded), time.time())
        except redis.RedisError as e:
            log.warning("the incident of %s's dead process was not recorded: %s", gone[0].endpoint, e)
            return None

    def _record_reload(self, death: tuple[str, float], endpoint: str, inst: Instance) -> None:
        """Close the incident :meth:`_record_death` wrote: the endpoint runs again as ``inst``."""
        try:
            record_recovery_by_a_phase(self.r, self.keys, death[0], endpoint, inst.id, death[1])
        except redis.RedisError as e:
            log.warning("the recovery of incident %s was not recorded: %s", death[0], e)

    def _dead_resident(self, spec, gpus: list[str]) -> tuple[str, list[Instance]] | None:
        """(why, the dead instances) when the resident instance of endpoint ``spec`` on
        exactly ``gpus`` cannot serve (no running instance of it registered there, or its
        driver knows its process ended), or None when one can (or its driver spawns no
        process: nothing to die). One Redis read, only for process endpoints."""
        if not self._capabilities(spec.launch.driver).spawns_process:
            return None
        running = [i for i, state in instances_on(self.r, self.keys, gpus, with_state=True)
                   if state == "running" and i.endpoint == spec.name and sorted(i.gpus) == sorted(gpus)]
        if not running:
            return "no running instance registered on its GPUs", []
        if not all(self._process_gone(inst) for inst in running):
            return None
        return "process " + ", ".join(str(i.pid) for i in running) + " ended", running

    def _process_gone(self, inst: Instance) -> bool:
        """Whether ``inst``'s driver spawns a process and knows it ended (False when its
        driver cannot tell: not known dead, execute meets it)."""
        try:
            return self._capabilities(inst.driver).spawns_process and not self._driver(inst.driver).is_alive(inst)
        except Exception:  # noqa: BLE001 - a driver's own error
            log.warning("driver %s could not tell whether instance %s is alive", inst.driver, inst.id, exc_info=True)
            return False

    def _start_instance(self, spec, gpus: list[str], ctx: PhaseContext, hb: LeaseHeartbeat) -> Instance:
        """Start an instance of endpoint ``spec`` with its driver (modelled waits spent
        lease-aware). A spawned process is registered as ``starting`` from the moment it
        exists (:mod:`makespan.workers.drivers.registry`): a worker killed or stopped
        during its health check leaves a tracked process, which the next worker's start
        sweep (:mod:`makespan.workers.orphans`) stops. The caller registers it ``running``.
        A modelled start (the ``simulated`` driver: a wait of the cold start, scaled) stops
        within 50 ms of a cancel of the job, as execute does, and a real one (a process
        still failing its health check) at its next probe pause: the phase ends
        ``cancelled`` and releases the lease instead of holding the GPUs to the end of the
        cold start; a spawned process is stopped first. The GPU worker's shutdown stops a
        job's start the same way (:meth:`_paced_cancellable`), with StaleFencingToken: the
        phase hands the lease back instead of holding it to the watchdog.
        Raises PhaseError (a spawned process is stopped and forgotten first),
        PhaseCancelled (the job's cancel was requested during the start) or
        StaleFencingToken (the lease was lost during the start, or the GPU worker shuts
        down during a job's; a spawned process is stopped and forgotten first)."""
        spawned: list[Instance] = []

        def track(inst: Instance) -> None:  # again for the same instance when its start moves to another port
            if all(other is not inst for other in spawned):
                spawned.append(inst)
            register_instance(self.r, self.keys, inst, state="starting")

        paced = self._paced_cancellable(ctx, hb)  # a modelled cold start's wait, a real one's probe pauses
        try:
            return self._driver(spec.launch.driver, paced, pause=paced).start(
                spec, gpus, self.settings.time_scale, ctx.host, on_spawn=track)
        except Exception:  # a driver's own error, a cancel or a lost lease: a process it spawned must not outlive the phase
            for inst in spawned:
                self._stop_instance(inst)
            raise

    def _stop_instance(self, inst: Instance, wait: Callable[[float], None] = no_wait) -> tuple[int, ...]:
        """Stop ``inst`` (its modelled waits spent by ``wait``) and forget it once nothing
        of it runs (:func:`makespan.workers.drivers.registry.retire_instance`: ``stopping``
        meanwhile, so the observer sees no failure; a stop that fails or is cut short
        leaves it recorded ``stopping`` for a later stop to finish). Returns the pids the
        stop reported alive after SIGKILL (:attr:`StopReport.left`: the record is kept
        ``stopping``); empty otherwise (a stop that raised PhaseError is logged)."""
        try:
            with telemetry.child_span("endpoint_stop", {"endpoint": inst.endpoint, "instance": inst.id}):
                report = retire_instance(self.r, self.keys, inst, self._driver(inst.driver, wait).stop)
        except PhaseError as e:  # the driver could not stop it: recorded as stopping, for a later stop
            log.warning("stopping %s (instance %s): %s; kept registered as stopping", inst.endpoint, inst.id, e)
            return ()
        return report.left if report is not None else ()

    def _clear_for_start(self, olds: list[Instance], starting: str) -> None:
        """Stop ``olds`` (leftovers, sleepers that no longer fit) before ``starting`` is
        started or woken on the lease's GPUs. A process of one that outlived SIGKILL (its
        stop's report: :meth:`_stop_instance`) still holds GPU memory: nothing is started
        beside it, the phase fails (the job then fails or is retried the normal way) and
        the old record stays ``stopping``, for the next start phase on its GPUs or the
        host's orphan sweep to stop again (as the observer's recovery does).

        Raises:
            PhaseError: a stop left processes alive (every one of ``olds`` is stopped first)."""
        left = [(inst, pids) for inst in olds if (pids := self._stop_instance(inst))]
        if left:
            what = "; ".join(f"{inst.endpoint} (instance {inst.id}): pids {', '.join(map(str, pids))}"
                             for inst, pids in left)
            raise PhaseError(f"processes of an instance stopped on these GPUs outlived SIGKILL ({what}); not "
                             f"starting {starting} beside them (kept registered 'stopping' for a later stop)")

    def _instances_on(self, gpus: list[str], registered: Registered = None) -> list[Instance]:
        """Registered instances on any of ``gpus`` that are not asleep nor being stopped
        (starting, running, waking or failed). ``registered``: the instances on ``gpus``
        with their states, as the caller read them (None: read here)."""
        pairs = registered if registered is not None else instances_on(self.r, self.keys, gpus, with_state=True)
        return [i for i, st in pairs if st not in ("asleep", "stopping")]

    def _leftovers_on(self, gpus: list[str]) -> list[Instance]:
        """Registered instances on any of ``gpus`` that are not asleep, those whose stop
        failed or was cut short (``stopping``) included: what a start phase stops."""
        return [i for i, st in instances_on(self.r, self.keys, gpus, with_state=True) if st != "asleep"]

    def _sleepers_on(self, gpus: list[str]) -> list[Instance]:
        """Registered instances asleep on any of ``gpus``."""
        return [i for i, st in instances_on(self.r, self.keys, gpus, with_state=True) if st == "asleep"]

    def _phase_start_endpoint(self, ctx: PhaseContext, hb: LeaseHeartbeat, extra: dict) -> float:
        planned = self._load(ctx, hb, ctx.endpoint, extra)
        helpers = self._helpers(ctx)
        if helpers:
            planned += self._start_helpers(ctx, hb, helpers, extra)
        return planned

    def _helpers(self, ctx: PhaseContext, record: tuple[str | None, str | None] | None = None) -> tuple[str, ...]:
        """The helper endpoints of the job: those it was submitted (and planned) with, else
        its workload function's (:class:`makespan.registry.WorkloadDef`). ``record``: its
        record's ``fn`` and ``helpers`` when the caller read them (None: read here)."""
        if ctx.kind != "job":
            return ()
        name, planned = record if record is not None else self.r.hmget(self.keys.job(ctx.job_id), "fn", "helpers")
        if planned:
            return tuple(json.loads(planned))
        definition = REGISTRY.get(name) if name else None
        return definition.helpers if definition is not None else ()

    def _start_helpers(self, ctx: PhaseContext, hb: LeaseHeartbeat, helpers: tuple[str, ...], extra: dict) -> float:
        """Start each helper endpoint on the first GPUs of the lease (its own tensor-parallel
        size), beside the main instance, under one POSITIVE agenda entry; the instance ids
        go into the lease's phase hash so the clear phase stops exactly these. A helper
        already running there (a replayed phase) is kept. When a helper cannot start (its
        start fails, the job's cancel cuts it short, the lease is lost), the helpers this
        call started or kept are stopped before the error goes on: the job ends without a
        clear phase, and nothing else stops a helper that no resident marker names. The GPU
        worker's shutdown cuts a helper's start short as the main instance's
        (:meth:`_start_instance`): its lease is handed back."""
        started: list[str] = []
        planned = sum(self.fleet.endpoints[h].cold_start_s for h in helpers)  # one after the other, as planned
        try:
            with self._transition("start_helpers", ctx, list(helpers), planned):
                self._stop_unfitting_sleepers(ctx, ctx.endpoint, extra, helpers)  # as the plan: beside main + helpers
                for name in helpers:
                    spec = self.fleet.endpoints[name]
                    gpus = list(ctx.gpus[:spec.tensor_parallel])
                    running = [i for i in self._instances_on(gpus)
                               if i.endpoint == name and sorted(i.gpus) == sorted(gpus)]
                    if running:
                        started.append(running[0].id)
                        continue
                    inst = self._start_instance(spec, gpus, ctx, hb)
                    register_instance(self.r, self.keys, inst)
                    started.append(inst.id)
                    if hb.lost.is_set():
                        raise StaleFencingToken("lease lost while a helper endpoint started")
            if not self.leases.fenced(ctx.lease, [("HSET", self.keys.phase(ctx.lease_id), "helpers",
                                                   json.dumps(started))]):
                raise StaleFencingToken("lease lost before the helpers were recorded")
        except Exception:  # noqa: BLE001 - stops what it started, then re-raises whatever it was
            ids = set(started)
            for inst in [i for i in self._leftovers_on(list(ctx.gpus)) if i.id in ids]:
                self._stop_instance(inst)
            raise
        extra["helpers"] = list(helpers)
        return planned

    def _phase_restore(self, ctx: PhaseContext, hb: LeaseHeartbeat, extra: dict) -> float:
        return self._load(ctx, hb, ctx.endpoint, extra)
