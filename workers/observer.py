"""The health observer: tells planned transitions apart from failures.

Runs as its own process (``python -m makespan.workers.observer --fleet FILE`` or
``makespan observer``). Every ``probe_interval_s`` it probes each registered endpoint
instance (:mod:`makespan.workers.drivers.registry`) through its driver and reads the agenda
(:mod:`makespan.workers.agenda`):

* unhealthy while a ``POSITIVE`` entry covers it (same endpoint, a shared GPU): a
  planned eviction, **no incident**;
* unhealthy with no covering entry: an incident (``process_exited`` when its pid is
  gone, at once; else ``health_check_failed`` once it failed ``failure_threshold``
  probes in a row, default :data:`FAILURE_THRESHOLD`, each waiting ``probe_timeout_s``
  for the health route, default :data:`PROBE_TIMEOUT_S`: a loaded server answers late now
  and then, and one late probe must not restart a healthy model), then restarted;
* covered by a ``POSITIVE`` entry that *overruns*, i.e. ``now > expected_end +
  max((overrun_factor − 1) × (expected_end − planned_start), min_overrun_slack_s)``,
  every time on the Redis server's clock (``TIME``; the agenda writes its entries on
  it), so skew between the observer's and the holders' hosts changes nothing: an
  incident (``transition_overrun``, once per operation id: ``P:incidents:seen`` holds
  the ids reported while their entries are open), whatever the probe says.
  The slack has a floor in seconds (``min_overrun_slack_s``, default
  :data:`MIN_OVERRUN_SLACK_S`): a transition's holder is a process that the host
  schedules, and on a loaded host it runs late by the scheduling jitter (seconds at a
  load of 3 per core) whatever the transition's length, so a factor alone would call a
  short transition late for that jitter — a time-scaled 30 ms one had 15 ms of slack.
  A factor bounds long transitions, the floor short ones;
* covered by a ``RESTART_RECOVERY`` entry: a recovery is already in progress; skip;
* a ``POSITIVE`` entry that overruns with no registered instance under it (the
  endpoint is evicted): an incident with an empty instance id and no restart (its
  holder, still alive, restores the set point; a dead holder's entry is reaped and
  the next restore plans it).

**Hosts.** Each cycle also reads which hosts of its fleet file lost their GPU worker (a host
a worker announced once, ``P:hosts:seen``, whose live key is gone: at once after a clean
stop, within the liveness TTL after a crash or ``kill -9``;
:mod:`makespan.workers.host_liveness`). A host down for ``host_down_grace_s`` (default
:data:`HOST_DOWN_GRACE_S`, server clock: a rolling restart, or the gap when one of two
workers of a host stops, is no incident) gets one ``host_down`` incident (empty endpoint and
instance id, the host's GPUs, the effect: how many of them are leased, what waits, what to
start), counted in ``makespan_host_down_incidents_total{host}``; when a worker announces it
again, or the published fleet no longer has it, a ``kind=recovery`` record closes it. A
host an operator cordoned (``makespan cordon``) is out of service on purpose: its stopped
worker is no incident, and cordoning a host closes its open one. One
script per cycle (``hosts_down.lua``) decides from ``P:incidents:hosts_down`` (host ->
``since:<s>`` or ``open:<incident id>:<s>``), so observers running at once, or restarting,
raise and close each incident once; each handles the hosts of its own fleet file.

An incident is appended to the ``P:incidents`` stream (``kind=incident``: endpoint,
instance id, host, GPUs, failure mode, detection time, probe cycle and the cycle of
the last healthy probe, effect, agenda context as JSON). When the instance is
unhealthy the observer then drives it back to its set point: a ``RESTART_RECOVERY``
agenda entry, stop (idempotent), start the same endpoint on the same GPUs with the
fleet file's spec through its driver, swap the registry record, complete the entry,
and append a ``kind=recovery`` record (outcome, recovery_s, new instance id). A stop
that leaves a process of the old instance alive (its report's ``left``: one that
outlived SIGKILL, e.g. stuck in the GPU driver) starts nothing: a second copy would
share the GPUs with the first; the recovery fails and the old record is kept
(``failed``), for the next start phase on its GPUs or the orphan sweep to stop.
Each cycle also adds every registered instance to the per-GPU index the phases read
(:func:`makespan.workers.drivers.registry.index_instances`: an instance a GPU worker of an
older version registered, during a rolling upgrade, is found within a cycle), reaps agenda
entries of dead holders and refreshes ``P:observer``
(``cycle``, ``at``; expires after 5 probe intervals: a liveness key for health checks).
A recovery runs inside the probe loop, so other instances wait for it (one cold
start at most); a failed recovery marks the instance ``failed`` (no further probes).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis

from makespan.events import add_utc_times
from makespan.errors import MakespanError, RedisAuthFailed, RedisConfigError, StoreError, ValidationError
from makespan.keys import Keys
from makespan.models import FleetSpec
from makespan.redis_conn import EXIT_REFUSED, OutageLog, check_eviction_policy, connect, credentials_refused
from makespan.log_format import configure as configure_logging
from makespan.log_format import log_format_from_env
from makespan.settings import Settings, log_level_from_env, metrics_port_from_env
from makespan.store.scripts import script
from makespan.workers.agenda import AgendaTracker
from makespan.workers.drivers import capabilities, get_driver
from makespan.workers.drivers.base import Instance, machine_name
from makespan.workers.host_liveness import STOPPED, Cordon, down_hosts, queue_reads
from makespan.workers.incident_records import INCIDENTS_MAX_LEN
from makespan.workers.drivers.registry import (index_instances, list_instances, register_instance, retire_instance,
                                               unregister_instance)

log = logging.getLogger(__name__)

FAILURE_THRESHOLD = 3  # failed probes in a row before a live instance is an incident (module doc)
PROBE_TIMEOUT_S = 2.0  # how long the observer's probe waits for a process endpoint's health route, s
HOST_DOWN_GRACE_S = 30.0  # a host down this long (server clock) is an incident (module doc, "Hosts")
MIN_OVERRUN_SLACK_S = 2.0  # the least slack past a transition's expected end before it is late, s (module doc)

__all__ = ["Observer", "list_incidents", "register_instance", "run_observer", "unregister_instance"]


@dataclass
class Observer:
    """One observer's state. :meth:`probe_once` is one cycle (tests may call it
    directly); :func:`run_observer` loops it."""

    r: redis.Redis
    keys: Keys
    fleet: FleetSpec
    probe_interval_s: float = 1.0
    overrun_factor: float = 1.5
    lock_ttl_s: float = 10.0
    min_overrun_slack_s: float = MIN_OVERRUN_SLACK_S
    host_down_grace_s: float = HOST_DOWN_GRACE_S
    failure_threshold: int = FAILURE_THRESHOLD
    probe_timeout_s: float = PROBE_TIMEOUT_S
    cycle: int = 0
    last_ok_cycle: dict[str, int] = field(default_factory=dict)
    failed_probes: dict[str, int] = field(default_factory=dict)  # instance id -> failed probes in a row
    _drivers: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.agenda = AgendaTracker(self.r, self.keys)
        self._mark_overruns = script(self.r, "incidents_mark")
        self._hosts_down = script(self.r, "hosts_down")
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="probe")
        self.machine = machine_name()

    def here(self, inst: Instance) -> bool:
        """Whether this observer can probe and restart ``inst``: a process endpoint only on
        its own machine (its ``url`` is that machine's loopback, its ``pid`` in that
        machine's process table; :attr:`Instance.machine`, "" for a record written before
        the field: taken as here); an endpoint without a process anywhere."""
        try:
            spawns = capabilities(inst.driver).spawns_process
        except MakespanError:
            spawns = True
        return not spawns or not inst.machine or inst.machine == self.machine

    def driver(self, name: str) -> Any:
        if name not in self._drivers:
            from makespan.driver_registry import DRIVERS
            from makespan.workers.drivers.process import ProcessDriver

            # a process endpoint's probe waits probe_timeout_s for /health (a loaded server answers slowly)
            driver = None
            if issubclass(DRIVERS.driver_class(name), ProcessDriver):
                try:
                    driver = get_driver(name, probe_timeout_s=self.probe_timeout_s)
                except (MakespanError, TypeError):  # a subclass whose constructor does not take it: its own timeout
                    driver = None
            self._drivers[name] = driver if driver is not None else get_driver(name)
        return self._drivers[name]

    def probe_once(self) -> list[dict]:
        """Probe every instance once; returns the incidents raised this cycle."""
        self.cycle += 1
        self.agenda.reap()
        listed = list_instances(self.r, self.keys, with_state=True)
        index_instances(self.r, self.keys, [i for i, _ in listed])  # a rolling upgrade's unindexed instances
        # another machine's process endpoints are its own observer's (docs/operations.md)
        pairs = [(i, s) for i, s in listed if s == "running" and self.here(i)]
        health = list(self._pool.map(lambda p: self._healthy(p[0]), pairs))
        entries = self.agenda.open_entries()
        server_now = self.agenda.server_now_s()  # entries are on the Redis clock: compare on it
        # incident timestamps (reports), as events: when this cycle judges, after its probes
        # (seconds on a loaded host), not when it began
        now = time.time()
        overrun = {e["op_id"] for e in entries if e["mode"] == "POSITIVE" and server_now > self.late_after(e)}
        # once per operation: P:incidents:seen holds the op ids reported, and drops those whose
        # entry has closed (bounded by the open agenda entries)
        fresh_ops, closed = self._mark_overruns(keys=[self.keys.incidents_overruns, self.keys.agenda_index],
                                                args=sorted(overrun))
        fresh = set(fresh_ops)
        self._close_overruns(dict(zip(closed[::2], closed[1::2])))
        raised_for: dict[str, list[str]] = {}  # op id -> the overrun incidents raised for it this cycle
        reported: set[str] = set()
        raised = []
        probed = {inst.id for inst, _ in pairs}
        for gone_id in [i for i in self.failed_probes if i not in probed]:  # stopped, moved on: forgotten
            del self.failed_probes[gone_id]
        for (inst, _), ok in zip(pairs, health):
            if ok:
                self.last_ok_cycle[inst.id] = self.cycle
                self.failed_probes.pop(inst.id, None)
            else:
                failed = self.failed_probes[inst.id] = self.failed_probes.get(inst.id, 0) + 1
                # a live process that failed fewer than failure_threshold probes in a row is not judged yet
                # (a loaded server answers /health late now and then: one slow probe restarted a healthy
                # set point); one whose process is gone is judged at once
                if failed < self.failure_threshold and not self._exited(inst):
                    ok = True
            touching = [e for e in entries if inst.endpoint in e["endpoints"]
                        and (not e["gpus"] or set(e["gpus"]) & set(inst.gpus))]
            if any(e["mode"] == "RESTART_RECOVERY" for e in touching):
                continue
            positive = [e for e in touching if e["mode"] == "POSITIVE"]
            late = [e for e in positive if e["op_id"] in overrun]
            mode = None
            if late:
                if any(e["op_id"] in fresh for e in late) or not ok:
                    mode = "transition_overrun"
                reported.update(e["op_id"] for e in late)
            elif not ok and not positive:
                state, endpoint = self.r.hmget(self.keys.instance(inst.id), "state", "endpoint")
                if endpoint is None or (state or "running") != "running":
                    continue  # stopping or deregistered after the snapshot: stopped on purpose (evict, shutdown)
                gone = self._exited(inst)
                mode = "process_exited" if gone else "health_check_failed"
            if mode is None:
                continue
            inc = self._raise(inst.endpoint, inst, mode, ok, touching, now)
            raised.append(inc)
            if mode == "transition_overrun" and ok:  # an unhealthy one gets _recover's record
                for e in late:
                    if e["op_id"] in fresh:  # an op reported in an earlier cycle keeps that incident
                        raised_for.setdefault(e["op_id"], []).append(inc["incident_id"])
            if not ok:
                self.failed_probes.pop(inst.id, None)
                self._recover(inst, inc)
        for e in entries:  # overruns with no registered instance: report, the live holder restores
            if e["op_id"] in fresh and e["op_id"] not in reported:
                for ep in e["endpoints"]:
                    inc = self._raise(ep, None, "transition_overrun", True, [e], now)
                    raised.append(inc)
                    raised_for.setdefault(e["op_id"], []).append(inc["incident_id"])
        if raised_for:  # recorded once raised (fresh ops only): the entry's close writes their recovery
            self.r.hset(self.keys.incidents_overruns, mapping={op: ",".join(ids) for op, ids in raised_for.items()})
        raised += self.check_hosts()
        self._close_given_up()
        self.r.hset(self.keys.observer, mapping={"cycle": self.cycle, "at": repr(time.time())})
        self.r.expire(self.keys.observer, max(int(self.probe_interval_s * 5), 5))
        return raised

    def check_hosts(self) -> list[dict]:
        """The cycle's host check alone (:meth:`probe_once` runs it after the instances).
        Hosts whose GPU worker stopped consuming (module doc, "Hosts"): a ``host_down``
        incident once one has been down :attr:`host_down_grace_s`, a recovery record when a
        worker announces it again; returns the incidents raised. The decision is one script
        (``hosts_down.lua``) over the hosts this cycle read as down or holding an entry, so
        observers that run at once, or restart, raise and close each incident once; hosts
        outside this observer's fleet file are left to the observers whose file has them,
        except one the published fleet (``P:fleet``) no longer has, whose incident closes (a
        host of this observer's file that the published fleet dropped is closed, never raised). A
        cordoned host without leases is never down here: its incident (or its grace) ends when
        it is cordoned; one whose leases still run there is (its worker died under them)."""
        own = [host.name for host in self.fleet.hosts]
        mine = set(own)
        p = self.r.pipeline(transaction=False)
        p.hgetall(self.keys.incidents_hosts_down)
        queue_reads(p, self.keys, own)
        entries, seen, live, cordoned = p.execute()
        down = down_hosts(own, seen, live)
        # a cordoned host is out of service on purpose when its worker was stopped (its last
        # worker withdrew: P:hosts:seen says stopped), when it holds no lease as it is first
        # seen down, or when it was cordoned after it went down (the operator's word on a host
        # already down); one whose worker died under running leases is an incident all the
        # same, also once those leases expired (the entry keeps when it went down)
        down_cordoned = down & set(cordoned)
        idle_cordoned = {host for host in down_cordoned if str(seen.get(host, "")).startswith(STOPPED)} | \
            self._without_leases(down_cordoned - set(entries)) | {
                host for host in down_cordoned & set(entries)
                if Cordon.parse(cordoned[host]).since_s >= _went_down_s(entries[host])}
        down -= idle_cordoned
        candidates = [host for host in own if host in down or host in entries]
        others = [host for host in entries if host not in mine]
        # rare (a host down, or another observer's entry): read the published fleet only then
        published = self.r.get(self.keys.fleet) if others or candidates else None
        gone = [host for host in others if not _in_published(published, host)]
        # a host of this observer's file the planner's fleet dropped (this file is older):
        # only closed, never raised, or two observers' files would raise and close it in turn
        dropped = {host for host in candidates if not _in_published(published, host)}
        down -= dropped
        candidates = [host for host in candidates if host in down or host in entries]
        if not candidates and not gone:
            return []
        args: list[str] = []
        fields = {host: self._host_fields(host) for host in candidates if host in down}
        for host in candidates:
            flag = "c" if host in idle_cordoned else "0" if host in dropped else "1"
            args += [host, flag, json.dumps(fields[host]) if host in fields else "{}"]
        for host in gone:
            args += [host, "0", "{}"]
        raised_flat, recovered_flat = self._hosts_down(
            keys=[self.keys.incidents_hosts_down, self.keys.incidents, self.keys.hosts_seen,
                  *(self.keys.host_live(host) for host in [*candidates, *gone])],
            args=[repr(self.host_down_grace_s), INCIDENTS_MAX_LEN, *args])
        from makespan import metrics

        raised = []
        for host, incident_id, detected_at in zip(*[iter(raised_flat)] * 3):
            inc = {**fields[host], "kind": "incident", "incident_id": incident_id, "detected_at": detected_at}
            metrics.host_down(host)
            log.error("incident %s: host %s host_down (%s)", incident_id, host, inc["effect"])
            raised.append(inc)
        for host, incident_id, took in zip(*[iter(recovered_flat)] * 3):
            log.warning("host %s is back after %s (%s s)", host, incident_id, took)
        return raised

    def _without_leases(self, hosts: set[str]) -> set[str]:
        """The hosts of ``hosts`` (this observer's) none of whose GPUs a lease holds."""
        if not hosts:
            return set()
        gpus = {h.name: [g.uuid for g in h.gpus] for h in self.fleet.hosts if h.name in hosts}
        order = [(host, gpu) for host, uuids in gpus.items() for gpu in uuids]
        held = {host for (host, _), holder in zip(order, self.r.mget([self.keys.gpu(g) for _, g in order])) if holder}
        return set(gpus) - held

    def _host_fields(self, host: str) -> dict[str, str]:
        """The ``host_down`` incident of ``host`` as the stream holds it (module doc,
        "Hosts"), less ``kind`` and ``detected_at`` (the script adds them)."""
        spec = next(h for h in self.fleet.hosts if h.name == host)
        gpus = [gpu.uuid for gpu in spec.gpus]
        from makespan.workers.host_liveness import UNCONSUMED

        leased = sum(1 for holder in self.r.mget([self.keys.gpu(g) for g in gpus]) if holder)
        never = str(self.r.hget(self.keys.hosts_seen, host) or "").startswith(UNCONSUMED)  # no worker ever ran there
        effect = (f"no GPU worker consumes host {host}'s queue (gpu.{host})"
                  + (" and none ever has (a lease there expired unconsumed)" if never else "")
                  + f": its GPUs take no new lease, and jobs that fit only there wait with reason host_down; {leased} "
                  f"of its {len(gpus)} GPUs are leased (their leases expire unrenewed and their jobs are requeued); "
                  f"start `makespan gpu-worker --fleet FLEET --host {host} --workloads MODULES` there"
                  + ("" if never else ", as before it went down"))
        return {"endpoint": "", "instance_id": "", "host": host, "gpus": json.dumps(gpus),
                "failure_mode": "host_down", "cycle": str(self.cycle), "last_ok_cycle": "0", "effect": effect,
                "agenda_context": "[]"}

    def late_after(self, entry: dict) -> float:
        """When the ``POSITIVE`` agenda ``entry`` (``planned_start``, ``expected_end``: Redis
        server time, s) overruns: its expected end plus the slack of the module doc (the
        larger of ``(overrun_factor − 1) ×`` its planned length and ``min_overrun_slack_s``),
        Redis server time, s."""
        planned_s = entry["expected_end"] - entry["planned_start"]
        return entry["expected_end"] + max((self.overrun_factor - 1.0) * planned_s, self.min_overrun_slack_s)

    def _exited(self, inst: Instance) -> bool:
        """True when ``inst``'s driver can tell its process ended and it has (a failed
        probe is then ``process_exited``, not ``health_check_failed``)."""
        try:
            return capabilities(inst.driver).reports_alive and not self.driver(inst.driver).is_alive(inst)
        except MakespanError:
            return False

    def _healthy(self, inst: Instance) -> bool:
        try:
            return bool(self.driver(inst.driver).health(inst))
        except MakespanError:
            return False

    def _raise(self, endpoint: str, inst: Instance | None, mode: str, healthy: bool, touching: list[dict],
               now: float) -> dict:
        if inst is None:
            effect = (f"transition of endpoint {endpoint} running late: the phase that runs it goes on; a recovery "
                      "record closes this when it ends (or when its holder is found dead)")
        elif healthy:
            effect = f"endpoint {endpoint} still serving; transition late"
        else:
            effect = f"endpoint {endpoint} unavailable on {','.join(inst.gpus)}; {self._restart_effect(inst)}"
        context = [{k: e[k] for k in ("op_id", "mode", "planned_start", "expected_end", "lock_alive")}
                   for e in touching]
        gpus = inst.gpus if inst else sorted({g for e in touching for g in e["gpus"]})
        host = inst.host if inst else next((h.name for h in self.fleet.hosts if {g.uuid for g in h.gpus} & set(gpus)),
                                           "")
        rec = {"kind": "incident", "endpoint": endpoint, "instance_id": inst.id if inst else "",
               "host": host, "gpus": json.dumps(gpus), "failure_mode": mode,
               "detected_at": repr(now), "cycle": str(self.cycle),
               "last_ok_cycle": str(self.last_ok_cycle.get(inst.id, 0) if inst else 0),
               "effect": effect, "agenda_context": json.dumps(context)}
        rec["incident_id"] = self.r.xadd(self.keys.incidents, rec, maxlen=INCIDENTS_MAX_LEN, approximate=True)
        from makespan import metrics

        metrics.incident(endpoint)
        log.error("incident %s: %s %s (%s)", rec["incident_id"], endpoint, mode, effect)
        return rec

    def _close_overruns(self, closed: dict[str, str]) -> None:
        """A ``kind=recovery`` record for each overrun incident whose agenda entry has closed
        (``closed``: op id -> its incident ids, comma-separated, ``reaped:`` first when the
        agenda reaped the entry): the late transition ended, or its holder died.
        ``recovery_s``: from the incident's detection (its stream id, Redis server clock) to
        this cycle (the same clock)."""
        if not any(closed.values()):
            return
        seconds, micros = self.r.time()
        now = seconds + micros / 1e6
        for op_id, value in closed.items():
            reaped = value.startswith("reaped:")
            outcome = ("closed: the transition did not finish: its holder stopped renewing its lock (died, or was "
                       "paused or cut off past the lock's TTL; its agenda entry's lock expired and the entry was "
                       "reaped)" if reaped else
                       "recovered: the late transition ended (its agenda entry closed)")
            for incident_id in filter(None, value.removeprefix("reaped:").split(",")):
                took = max(0.0, now - int(incident_id.split("-")[0]) / 1000.0)
                self.r.xadd(self.keys.incidents, {
                    "kind": "recovery", "incident_id": incident_id, "endpoint": "", "agenda_op": op_id,
                    "outcome": outcome, "recovered_at": repr(now), "recovery_s": repr(round(took, 3))},
                    maxlen=INCIDENTS_MAX_LEN, approximate=True)
                log.warning("overrun %s closed (%s, %.1f s after it was reported): %s", incident_id, op_id, took,
                            outcome)

    def _restart_effect(self, inst: Instance) -> str:
        """What :meth:`_recover` will do with down ``inst``, in words: an endpoint the fleet
        lacks is marked failed; else it is restarted on the same GPUs, which are its set
        point only when the fleet places it there (an endpoint with no ``set_point`` has none)."""
        if inst.endpoint not in self.fleet.endpoints:
            return f"not in fleet {self.fleet.name!r}: marked failed, not restarted"
        leased = self._leased(inst)
        if leased:
            return (f"not restarted while its GPUs are leased ({leased}): a job running on it fails when it needs "
                    "it, and the next start phase or set-point restore there loads it again")
        by_gpu = self.fleet.set_point_by_gpu()
        if all(by_gpu.get(gpu) == inst.endpoint for gpu in inst.gpus):
            return "restarting it to its set point"
        return "restarting it on the same GPUs"

    def _recover(self, inst: Instance, inc: dict) -> None:
        t0 = time.time()
        spec = self.fleet.endpoints.get(inst.endpoint)
        out = {"kind": "recovery", "incident_id": inc["incident_id"], "endpoint": inst.endpoint,
               "old_instance_id": inst.id}
        leased = self._leased(inst)
        if spec is None:  # marked failed: not probed (nor reported) again at every cycle
            register_instance(self.r, self.keys, inst, state="failed")
            out["outcome"] = f"failed: endpoint {inst.endpoint!r} is not in fleet {self.fleet.name!r}"
        elif leased:
            self._give_up(inst)
            out["outcome"] = (f"not restarted: its GPUs are leased ({leased}); a job running on it fails when it "
                              "needs it, and the next start phase or set-point restore there loads it again")
        else:
            driver = self.driver(inst.driver)
            expected_s = (spec.evict_s + spec.cold_start_s) * inst.time_scale + self.probe_interval_s
            spawned: list[Instance] = []

            def track(instance: Instance) -> None:  # again for the same instance when its start moves to another port
                if all(other is not instance for other in spawned):
                    spawned.append(instance)
                register_instance(self.r, self.keys, instance, state="starting")
            try:
                with self.agenda.register(f"recovery-{inst.id}", "RESTART_RECOVERY", [inst.endpoint],
                                          inst.gpus, expected_s, lock_ttl_s=self.lock_ttl_s) as entry:
                    report = driver.stop(inst)
                    if report is not None and report.left:  # the old copy still holds its GPUs
                        raise MakespanError(
                            f"processes {', '.join(str(pid) for pid in report.left)} of the old instance outlived "
                            "SIGKILL; not starting a second copy on its GPUs (kept registered for a later stop)")
                    # tracked from its first moment: an observer killed during the health check
                    # leaves a `starting` record, which the host's GPU worker sweeps (orphans)
                    new = driver.start(spec, inst.gpus, inst.time_scale, inst.host, on_spawn=track)
                    entry.check()
                    leased = self._leased(inst)
                    if leased:  # a lease took the GPUs during the restart: its holder owns them now
                        raise MakespanError(f"its GPUs were leased during the restart ({leased})")
                    pipe = self.r.pipeline()
                    unregister_instance(self.r, self.keys, inst.id, pipe=pipe, gpus=inst.gpus)
                    register_instance(self.r, self.keys, new, pipe=pipe)
                    pipe.execute()
                out.update(outcome="recovered", new_instance_id=new.id)
            except (MakespanError, redis.RedisError) as e:
                for instance in spawned:  # spawned but not made the instance: stop and forget it
                    self._stop_quietly(instance)
                self._give_up(inst)
                out["outcome"] = f"failed: {e}"
        out["recovered_at"] = repr(time.time())
        out["recovery_s"] = repr(round(time.time() - t0, 3))
        self.r.xadd(self.keys.incidents, out, maxlen=INCIDENTS_MAX_LEN, approximate=True)
        if out["outcome"] != "recovered" and spec is not None:  # closed later, once the endpoint is back there
            self.r.hset(self.keys.incidents_given_up, inc["incident_id"],
                        json.dumps({"endpoint": inst.endpoint, "gpus": sorted(inst.gpus), "since": t0,
                                    "old_instance_id": inst.id}))
        log.warning("recovery of %s after %s: %s", inst.endpoint, inc["incident_id"], out["outcome"])

    def _close_given_up(self) -> None:
        """Close the incidents this observer did not recover (``P:incidents:given_up``) whose
        endpoint runs on the same GPUs again in another instance (loaded by a job's start
        phase or a set-point restore): a ``recovered`` record after the first (``makespan
        incidents`` shows the latest), naming the instance. Entries older than
        :data:`GIVEN_UP_KEPT_S` are dropped. The instances are read now (not the cycle's
        snapshot, taken before its recoveries)."""
        given_up = self.r.hgetall(self.keys.incidents_given_up)
        if not given_up:
            return
        old_ids = set()
        for raw in given_up.values():
            try:
                old_ids.add(json.loads(raw).get("old_instance_id"))
            except (ValueError, AttributeError):
                pass
        running = {(i.endpoint, tuple(sorted(i.gpus))): i
                   for i, state in list_instances(self.r, self.keys, with_state=True)
                   if state == "running" and i.id not in old_ids}
        now = time.time()
        for incident_id, raw in given_up.items():
            try:
                entry = json.loads(raw)
                back = running.get((entry["endpoint"], tuple(entry["gpus"])))
                since = float(entry["since"])
            except (ValueError, KeyError, TypeError):
                self.r.hdel(self.keys.incidents_given_up, incident_id)
                continue
            if back is None:
                if now - since > GIVEN_UP_KEPT_S:
                    self.r.hdel(self.keys.incidents_given_up, incident_id)
                continue
            self.r.xadd(self.keys.incidents, {
                "kind": "recovery", "incident_id": incident_id, "endpoint": entry["endpoint"],
                "outcome": "recovered", "new_instance_id": back.id,
                "detail": "the endpoint runs on its GPUs again (loaded by a job's start phase or a set-point restore)",
                "recovered_at": repr(now), "recovery_s": repr(round(now - since, 3))},
                maxlen=INCIDENTS_MAX_LEN, approximate=True)
            self.r.hdel(self.keys.incidents_given_up, incident_id)
            log.warning("recovery of %s after %s: recovered (instance %s runs on its GPUs again)", entry["endpoint"],
                        incident_id, back.id)

    def _leased(self, inst: Instance) -> str:
        """The lease holding any of ``inst``'s GPUs ("": none)."""
        return next((holder for holder in self.r.mget([self.keys.gpu(g) for g in inst.gpus]) if holder), "")

    def _give_up(self, inst: Instance) -> None:
        """``inst`` is down and not restarted here: marked ``failed`` (not probed again),
        and the GPUs' resident markers that name it are dropped, so no job is sent there
        as to a warm endpoint (its start phase loads the endpoint again) and the set-point
        restore brings a set point back."""
        from makespan.workers.phases import instance_value

        register_instance(self.r, self.keys, inst, state="failed")
        want = instance_value(inst.endpoint, inst.gpus)
        for gpu in inst.gpus:
            with self.r.pipeline() as pipe:
                try:
                    pipe.watch(self.keys.resident(gpu))
                    if pipe.get(self.keys.resident(gpu)) == want:
                        pipe.multi()
                        pipe.delete(self.keys.resident(gpu))
                        pipe.execute()
                except redis.WatchError:
                    pass  # a transition wrote it meanwhile: its own

    def _stop_quietly(self, inst: Instance) -> None:
        try:
            retire_instance(self.r, self.keys, inst, self.driver(inst.driver).stop)
        except (MakespanError, redis.RedisError) as e:
            log.warning("stopping %s after a failed recovery: %s", inst.id, e)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _went_down_s(entry: str) -> float:
    """When a host's ``P:incidents:hosts_down`` entry says it went down (``since:<s>`` or
    ``open:<incident id>:<s>``, Redis server clock); inf when it cannot be read."""
    try:
        return float(entry.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return float("inf")


def _in_published(published: str | None, host: str) -> bool:
    """Whether the published fleet (``P:fleet`` JSON, or None) has ``host``; True when none
    is published or it cannot be read (nothing to close against)."""
    if not published:
        return True
    try:
        return any(entry.get("name") == host for entry in json.loads(published).get("hosts", []))
    except (ValueError, TypeError, AttributeError):
        return True


def run_observer(settings: Settings, fleet: FleetSpec, probe_interval_s: float = 1.0,
                 overrun_factor: float = 1.5, stop: threading.Event | None = None,
                 max_cycles: int | None = None, min_overrun_slack_s: float = MIN_OVERRUN_SLACK_S,
                 host_down_grace_s: float = HOST_DOWN_GRACE_S, failure_threshold: int = 0,
                 probe_timeout_s: float = 0.0) -> int:
    """Probe until ``stop`` is set, SIGTERM/SIGINT arrives (main thread only) or
    ``max_cycles`` cycles ran; returns the number of incidents raised. Redis errors
    are logged and retried on the next cycle (the observer must outlive a Redis restart).
    ``overrun_factor`` and ``min_overrun_slack_s`` (s) say when a transition is late,
    ``host_down_grace_s`` (s) when a host without a live GPU worker is an incident (module doc),
    ``failure_threshold`` how many probes in a row a live instance must fail before it is an
    incident (and restarted) and ``probe_timeout_s`` (s) how long a probe waits for a process
    endpoint's health route (0: :data:`FAILURE_THRESHOLD`, :data:`PROBE_TIMEOUT_S`).

    Raises:
        RedisConfigError: Redis evicts keys (``maxmemory-policy``) and
            ``settings.allow_evicting_redis`` is not set (checked at start, or, when
            Redis did not answer then, at the first cycle it answers).
        RedisAuthFailed: Redis (or its Sentinels) refused the credentials before it ever
            accepted them (a refusal after is logged and retried, as an outage is)."""
    stop = stop or threading.Event()
    restore_signals = None
    if threading.current_thread() is threading.main_thread():
        from makespan import shutdown

        signal.signal(signal.SIGINT, lambda *_: stop.set())
        restore_signals = shutdown.on_sigterm(settings.shutdown_grace_s, "observer", stop.set)  # the SIGTERM bound
    r = connect(settings.redis_url, settings=settings)
    policy_checked = False
    try:
        try:
            check_eviction_policy(r, settings, process="observer")
            policy_checked = True
        except redis.RedisError as e:  # not reachable yet: each cycle below asks again until it answers
            refused = credentials_refused(settings.redis_url, e)
            if refused is not None:  # credentials never accepted: waiting cannot help
                raise refused from None
            log.warning("observer: maxmemory-policy not checked yet, Redis did not answer (asking again every "
                        "cycle): %s", e)
    except (RedisConfigError, RedisAuthFailed):
        r.close()
        if restore_signals is not None:
            restore_signals()
        raise
    obs = Observer(r, Keys(settings.key_prefix), fleet, probe_interval_s, overrun_factor,
                   min_overrun_slack_s=min_overrun_slack_s, host_down_grace_s=host_down_grace_s,
                   failure_threshold=failure_threshold or FAILURE_THRESHOLD,
                   probe_timeout_s=probe_timeout_s or PROBE_TIMEOUT_S)
    from makespan import metrics

    metrics.declare_hosts(host.name for host in fleet.hosts)  # host_down counters at 0 (a scrape shows them)
    log.info("observer: fleet %r, %d hosts, %d endpoints; probing every registered endpoint instance on this "
             "machine (%s) every %g s; transitions late past %g × their planned length (at least %g s); a host "
             "without a live GPU worker for %g s is an incident; an instance is restarted after %d failed probes in a "
             "row (each waits %g s)", fleet.name, len(fleet.hosts), len(fleet.endpoints),
             obs.machine, probe_interval_s, overrun_factor, min_overrun_slack_s, host_down_grace_s,
             obs.failure_threshold, obs.probe_timeout_s)
    warn_if_fleet_differs(r, Keys(settings.key_prefix), fleet)
    raised = 0
    outage = OutageLog(log, "observer")
    answered = policy_checked  # Redis accepted the credentials once: a later refusal is logged and retried
    try:
        while not stop.is_set() and (max_cycles is None or obs.cycle < max_cycles):
            t0 = time.monotonic()
            try:
                if not policy_checked:  # before the first probe on a Redis that answers
                    check_eviction_policy(r, settings, process="observer")
                    policy_checked = True
                    log.info("observer: Redis answers now; maxmemory-policy checked")
                raised += len(obs.probe_once())
                outage.ok()
                answered = True
            except RedisConfigError:  # a StoreError too, but a refusal, not an outage
                raise
            except (redis.RedisError, StoreError) as e:
                refused = credentials_refused(settings.redis_url, e)
                if refused is not None and not answered:  # never accepted: waiting cannot help
                    raise refused from None
                outage.failed(refused or e)
            stop.wait(max(0.0, probe_interval_s - (time.monotonic() - t0)))
    finally:
        obs.close()
        r.close()
        if restore_signals is not None:
            restore_signals()
    return raised


GIVEN_UP_KEPT_S = 7 * 24 * 3600.0  # an incident not recovered is closed when its endpoint is back within this


def list_incidents(r: redis.Redis, keys: Keys, count: int | None = None) -> list[dict]:
    """Incidents, oldest first, each with its recovery merged in (``recovery``: the
    recovery record or None). Fields as in the module doc, one JSON type per kind of
    value: ``gpus`` and ``agenda_context`` decoded from JSON, ``cycle`` and
    ``last_ok_cycle`` ints, times (``detected_at``; the recovery's ``recovered_at``) unix s
    floats, each with its ISO-8601 UTC twin (``detected_at_utc``, as a job's status), the
    recovery's ``recovery_s`` a float."""
    try:
        rows = r.xrange(keys.incidents, count=count)
    except redis.RedisError as e:
        raise StoreError(f"list incidents: {e}") from e
    incidents, by_id = [], {}
    for sid, rec in rows:
        if rec.get("kind") == "recovery":
            if rec.get("incident_id") in by_id:
                recovery: dict[str, Any] = dict(rec)
                for time_field in ("recovered_at", "recovery_s"):
                    if recovery.get(time_field):
                        recovery[time_field] = float(recovery[time_field])
                by_id[rec["incident_id"]]["recovery"] = add_utc_times(recovery, ("recovered_at",))
            continue
        inc = {**rec, "incident_id": sid, "gpus": json.loads(rec.get("gpus", "[]")),
               "agenda_context": json.loads(rec.get("agenda_context", "[]")),
               "detected_at": float(rec.get("detected_at", 0)), "recovery": None}
        for cycle_field in ("cycle", "last_ok_cycle"):
            if rec.get(cycle_field):
                inc[cycle_field] = int(rec[cycle_field])
        add_utc_times(inc, ("detected_at",))
        by_id[sid] = inc
        incidents.append(inc)
    return incidents


EXIT_BAD_SETTING = 2  # a MAKESPAN_* variable refused, as the CLI's (makespan.cli_support.fail)


def warn_if_fleet_differs(r: redis.Redis, keys: Keys, fleet: FleetSpec) -> str | None:
    """Log a warning (and return it) when ``fleet`` (this observer's file) differs from the
    fleet the planner published, naming the published hosts it does not watch (no
    ``host_down`` incident for them: an SRE's report); None when they agree, none is
    published yet or Redis does not answer (the loop reports that)."""
    from makespan.models import fleet_version, parse_fleet

    try:
        published_version, published = r.mget(keys.fleet_version, keys.fleet)
        if not published_version or published_version == fleet_version(fleet):
            return None
        unwatched = sorted({h.name for h in parse_fleet(json.loads(published)).hosts} - {h.name for h in fleet.hosts})
    except (redis.RedisError, MakespanError, ValueError) as e:
        log.debug("observer: fleet not compared with the published one: %s", e)
        return None
    message = (f"observer: its fleet file (version {fleet_version(fleet)}) differs from the fleet the planner "
               f"published (version {published_version})"
               + (f"; it does not watch host{'s' if len(unwatched) > 1 else ''} {', '.join(unwatched)} (no "
                  f"host_down incident for {'them' if len(unwatched) > 1 else 'it'})" if unwatched else "") + ": restart the observer with the planner's fleet file")
    log.warning(message)
    return message


def main(argv: list[str] | None = None) -> int:
    import argparse

    from makespan.models import load_fleet

    p = argparse.ArgumentParser(prog="observer", description="makespan health observer")
    p.add_argument("--fleet", required=True)
    p.add_argument("--probe-interval-s", type=float, default=1.0, help="seconds between probes of each instance (> 0)")
    p.add_argument("--overrun-factor", type=float, default=1.5,
                   help="a transition is late past this multiple of its planned length (>= 1)")
    p.add_argument("--min-overrun-slack-s", type=float, default=MIN_OVERRUN_SLACK_S,
                   help="least slack past a transition's expected end before it is late, s")
    p.add_argument("--host-down-grace-s", type=float, default=HOST_DOWN_GRACE_S,
                   help="how long a host has no live GPU worker before its host_down incident, s (>= 0)")
    p.add_argument("--failure-threshold", type=int, default=FAILURE_THRESHOLD,
                   help="failed probes in a row before a live instance is an incident and restarted (>= 1)")
    p.add_argument("--probe-timeout-s", type=float, default=PROBE_TIMEOUT_S,
                   help="how long one probe waits for a process endpoint's health route, s (> 0)")
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus port (default: MAKESPAN_METRICS_PORT; 0: none)")
    a = p.parse_args(argv)
    from makespan import shutdown

    shutdown.ignore_sighup("observer")  # the observer process's entry: a log rotator's HUP killed it
    # each bound as the CLI's other checks say it (one line, exit 2): an interval of 0 spun a CPU
    for option, value, low, low_ok in (("--probe-interval-s", a.probe_interval_s, 0.0, False),
                                       ("--overrun-factor", a.overrun_factor, 1.0, True),
                                       ("--min-overrun-slack-s", a.min_overrun_slack_s, 0.0, True),
                                       ("--host-down-grace-s", a.host_down_grace_s, 0.0, True),
                                       ("--failure-threshold", a.failure_threshold, 1.0, True),
                                       ("--probe-timeout-s", a.probe_timeout_s, 0.0, False)):
        if not ((low <= value if low_ok else low < value) and value < float("inf")):
            print(f"error: {option} must be a finite number {'>=' if low_ok else '>'} {low:g}, got {value!r}",
                  file=sys.stderr, flush=True)
            return EXIT_BAD_SETTING
    try:
        level = log_level_from_env("INFO")
        log_kind = log_format_from_env()
        if a.metrics_port is None:
            a.metrics_port = metrics_port_from_env()
    except ValidationError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_SETTING
    configure_logging(level, log_kind)  # MAKESPAN_LOG_FORMAT, as every process (httpx at WARNING)
    fleet = load_fleet(a.fleet)
    if a.metrics_port:
        from makespan import metrics

        # the fleet's endpoints at 0 in makespan_incidents_total from the start (this process
        # is the one that counts them: a first incident is then an increase, not a new series)
        try:
            metrics.start_metrics_server(a.metrics_port, redis_state=False, endpoints=sorted(fleet.endpoints))
        except ValidationError as e:  # its port in use, its directory not writable: one line
            print(f"error: {e}", file=sys.stderr, flush=True)
            return EXIT_BAD_SETTING
    try:
        run_observer(Settings.from_env(), fleet, a.probe_interval_s, a.overrun_factor,
                     min_overrun_slack_s=a.min_overrun_slack_s, host_down_grace_s=a.host_down_grace_s,
                     failure_threshold=a.failure_threshold, probe_timeout_s=a.probe_timeout_s)
    except (RedisConfigError, RedisAuthFailed) as e:  # printed once (not also logged)
        print(f"makespan observer: {e}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
