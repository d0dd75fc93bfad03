"""Fault-injection runner: a mixed workload on the live system, faults at seeded random
moments, and the invariants checked after every run.

Each run starts its own planners (two: one leads, one stands by), one GPU worker per
host (Celery ``threads`` or ``prefork`` pool, drawn per run) and the health observer,
all as real processes against a private ``redis-server`` this runner starts with
append-only persistence and ``appendfsync always`` (never the shared Redis; see
:mod:`bench.chaos_redis` for why ``always``), under a fresh key prefix. It submits
a mixed workload (one job in five delayed by 0.2–2 s) and, at seeded random moments, injects faults:

* ``worker_kill``: SIGKILL a GPU worker's process group (a replacement starts at once,
  as a process supervisor would);
* ``worker_child_kill``: SIGKILL one prefork pool child (the main process forks another);
* ``planner_kill`` / ``planner_term``: SIGKILL or SIGTERM the leading planner (the
  standby takes over; a replacement standby starts);
* ``observer_kill``: SIGKILL the health observer (a replacement starts);
* ``redis_drop_clients``: ``CLIENT KILL TYPE normal`` on the run's own Redis;
* ``redis_restart``: SIGKILL redis-server and start it again on the same port and
  directory (the append-only file brings the data back);
* ``proxy_half_open``: in a run that draws a proxy fault, every process reaches Redis
  through a TCP proxy in a process of its own (:mod:`bench.fault_proxy`), and the run's
  time scale is at least 0.03 (the hop's own latency would otherwise make 0.05 s
  transitions overrun); this fault makes every connection open through it half-open
  (nothing forwarded, both sockets kept open), new ones work;
* ``proxy_latency``: the proxy delays every reply by 20–200 ms for 0.5–2 s;
* ``redis_role_change``: ``REPLICAOF`` a primary nobody answers on (a port the runner
  holds bound, so no other server can take it) for 0.5–2 s, then ``REPLICAOF NO ONE``
  (blocked reads end ``UNBLOCKED``, writes answer ``READONLY``);
* ``eviction_policy``: Redis's ``maxmemory-policy`` set to an evicting one while a new
  GPU worker starts: it must refuse (exit code 3; invariant ``eviction_refused``), then
  ``noeviction`` again;
* ``worker_clock_skew``: a GPU worker is replaced by one whose wall clock is 30–120 s
  ahead or behind (``time.time`` shifted by a ``sitecustomize`` on its ``PYTHONPATH``,
  :data:`SKEW_SITECUSTOMIZE`); it keeps running for the rest of the run;
* ``endpoint_stubborn``: a job for endpoint ``stubborn``, a real process (the process
  driver) whose child ignores SIGTERM: it must be stopped with its child (invariant
  ``orphan``).

* ``memory_pressure``: ``maxmemory`` set near what Redis uses (64 KiB below to 32 KiB
  above) under ``noeviction`` for 0.5–3 s: writes answer ``OOM``; then freed;
* ``sentinel_failover``: a run that draws it runs on a Sentinel set of its own
  (:class:`bench.chaos_redis.SentinelSet`: a primary, a replica, three Sentinels) on a
  ``redis+sentinel://`` URL, its submits waiting for the replica (``WAIT``); the fault
  SIGKILLs the primary, the Sentinels promote the replica, and the old primary comes back
  as its replica. The kinds in :data:`NOT_WITH_SENTINEL` are drawn again in such a run.

The supervisor (restart what exited) runs after every fault and all through the
liveness probes, as compose's ``restart:`` would.

Invariants checked from Redis and the recorded events (:func:`check_invariants`):
``lost`` (an accepted job neither completed nor failed with a reason), ``completed_twice``
(a job with more than one ``completed`` event or execute phase), ``gpu_overlap`` (a GPU
leased to two holders at once), ``drain`` (leases, agenda entries or busy slots left, or
no drain check after the last job), ``set_point`` (an endpoint not back at its set
point), ``incident`` (an incident with no injected fault in the window before it), and
after the faults end: ``wedged`` (a process that fails its liveness probe: a GPU worker
that does not answer Celery's ping, an observer whose probe cycle does not advance, a
probe job that does not complete, or a process still running ``shutdown_grace_s`` + 1 s
after SIGTERM), ``eviction_refused`` (a process that started on an evicting Redis) and
``orphan`` (an endpoint process of the run that no registered instance accounts for).
Event times are read from the stream ids (the Redis server's clock), so a skewed
worker's own clock does not move them.

Run: ``.venv/bin/python -m bench.chaos --runs 100 --seed 1`` (prints one line per run,
with the seconds each part took, then the totals: runs, faults injected per kind,
violations per invariant; also when stopped early by SIGTERM or Ctrl-C). ``--faults 6``
draws six faults per run. A ``lost`` violation names the job's events, when its submit
returned and the faults near it, which tells a lost write from a deleted record.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from bench.chaos_redis import RedisServer, RefusingPort, SentinelSet, sentinel_binary
from bench.fault_proxy import ProxyProcess
from makespan.errors import MakespanError, StoreError
from makespan.keys import Keys
from makespan.live import LiveSystem, Proc, delete_prefix
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect
from makespan.run_report import drain_counts
from makespan.settings import Settings, is_sentinel_url
from bench.chaos_invariants import INVARIANTS, TERMINAL, _events, check_invariants, lease_overlaps

__all__ = ["FAULTS", "INVARIANTS", "ChaosRun", "RedisServer", "check_invariants", "client", "lease_overlaps",
           "write_fleet"]

FAULTS = ("worker_kill", "worker_child_kill", "planner_kill", "planner_term", "observer_kill",
          "redis_drop_clients", "redis_restart", "proxy_half_open", "proxy_latency", "redis_role_change",
          "eviction_policy", "worker_clock_skew", "endpoint_stubborn", "memory_pressure", "sentinel_failover")
# a run that draws sentinel_failover runs on a Sentinel set; these act on the single server or its
# proxy, so they are drawn again there (from the rest)
NOT_WITH_SENTINEL = ("redis_restart", "redis_role_change", "proxy_half_open", "proxy_latency")
SHUTDOWN_GRACE_S = 5.0  # the processes' MAKESPAN_SHUTDOWN_GRACE_S in a run
PROBE_S = 30.0  # longest a liveness probe may take after the faults (a loaded 2-core machine)
PROBE_SLACK_S = 2.0  # added to the SIGTERM bound when judging a process wedged (a loaded machine)
PROXY_FAULTS = ("proxy_half_open", "proxy_latency")
PROXY_TIME_SCALE = 0.03  # the time scale of a run through the proxy (PROXY_FAULTS drawn)
STUBBORN = "stubborn"  # the endpoint of endpoint_stubborn (a process whose child ignores SIGTERM); no random job uses it
# put first on a skewed worker's PYTHONPATH: its wall clock (time.time, time.time_ns) is shifted
SKEW_SITECUSTOMIZE = """import os as _os, time as _time
_off = float(_os.environ.get("MAKESPAN_CHAOS_CLOCK_OFFSET_S") or 0.0)
if _off:
    _real, _real_ns = _time.time, _time.time_ns
    _time.time = lambda: _real() + _off
    _time.time_ns = lambda: _real_ns() + int(_off * 1e9)
"""
EXIT_REFUSED = 3  # makespan.redis_conn.EXIT_REFUSED: a process that refused an evicting Redis

# A small fleet (2 hosts × 2 GPUs) with set points on both hosts, so restores happen.
CHAOS_FLEET = """
name = "chaos"
[[hosts]]
name = "host-a"
gpu_count = 2
memory_mib = 81920
[[hosts]]
name = "host-b"
gpu_count = 2
memory_mib = 81920
[endpoints.coder]
model = "coder"
tensor_parallel = 2
memory_mib_per_gpu = 62000
cold_start_s = 40
evict_s = 10
set_point = [{ host = "host-a", gpus = [0, 1] }]
[endpoints.embed]
model = "embed"
memory_mib_per_gpu = 6000
cold_start_s = 20
evict_s = 3
set_point = [{ host = "host-b", gpus = [0] }]
[endpoints.chat]
model = "chat"
memory_mib_per_gpu = 24000
cold_start_s = 30
evict_s = 5
[endpoints.summarizer]
model = "summarizer"
tensor_parallel = 2
memory_mib_per_gpu = 40000
cold_start_s = 40
evict_s = 8
[endpoints.stubborn]
model = "stubborn"
memory_mib_per_gpu = 6000
cold_start_s = 20
# its child ignores SIGTERM, so every stop waits the process driver's 5 s grace before
# SIGKILL: 600 s (6 s wall at time scale 0.01) is what an operator who knows it would set;
# with 3 s, its evictions after the faults' window were reported as incidents
evict_s = 600
[endpoints.stubborn.launch]
driver = "process"
command = ["{python}", "-m", "makespan.workers.endpoint_server", "--port", "{port}", "--model", "stubborn",
           "--spawn-child-ignoring-sigterm", "1"]
"""


def children(pid: int) -> list[int]:
    """Pids of the direct children of ``pid`` (from /proc; Linux)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(d.name))
    return sorted(out)


def client(url: str) -> redis.Redis:
    """A decoded client that rides out a dropped connection or a Redis restart."""
    from makespan.redis_conn import client_options

    retry = {"retry": Retry(ExponentialBackoff(cap=0.5, base=0.02), 40),
             "retry_on_error": [redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError]}
    if is_sentinel_url(url):  # follows the primary through a failover
        return connect(url, **retry)
    return redis.Redis.from_url(url, decode_responses=True, **client_options(), **retry)


def draw_kinds(rng: random.Random, faults: int) -> list[str]:
    """``faults`` fault kinds drawn from :data:`FAULTS` (without ``sentinel_failover``
    where ``redis-sentinel`` is not installed); once ``sentinel_failover`` is drawn, the
    kinds in :data:`NOT_WITH_SENTINEL` drawn before or after it are drawn again."""
    kinds = [k for k in FAULTS if k != "sentinel_failover" or sentinel_binary()]
    out = [rng.choice(kinds) for _ in range(faults)]
    if "sentinel_failover" in out:
        rest = [k for k in kinds if k not in NOT_WITH_SENTINEL]
        out = [rng.choice(rest) if k in NOT_WITH_SENTINEL else k for k in out]
    return out


@dataclass
class RunResult:
    seed: int
    pool: str
    accepted: int
    states: Counter
    faults: list[tuple[float, str]]
    violations: dict[str, list[str]]
    wall_s: float
    crashed: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per part: start, faults, probe, settle, stop
    oom_rejected: int = 0  # commands Redis refused with OOM during memory_pressure


class ChaosRun:
    """One run: processes, workload, faults, invariants."""

    def __init__(self, srv: RedisServer, fleet_path: Path, seed: int, workdir: Path, jobs: int = 16,
                 faults: int = 3, duration_s: float = 4.0, time_scale: float = 0.01, timeout_s: float = 60.0,
                 fault_plan: list[str] | None = None):
        self.srv, self.seed, self.rng = srv, seed, random.Random(seed)
        self.fleet_path, self.fleet = fleet_path, load_fleet(fleet_path)
        self.n_jobs, self.n_faults, self.duration_s, self.timeout_s = jobs, faults, duration_s, timeout_s
        self.fault_plan = fault_plan  # these kinds in this order (else drawn from FAULTS)
        self.pool = self.rng.choice(["threads", "prefork"])
        self.kinds = list(fault_plan) if fault_plan is not None else draw_kinds(self.rng, faults)
        # a run that draws sentinel_failover runs on a Sentinel set of its own (a primary, a replica, three
        # Sentinels) on a redis+sentinel:// URL, and a submit waits for the replica's acknowledgement
        # (submit_wait_replicas=1), so an acknowledged job survives the failover (docs/durability.md)
        self.sentinels = SentinelSet() if "sentinel_failover" in self.kinds else None
        direct_url = self.sentinels.url if self.sentinels else srv.url
        # a run that draws a proxy fault sends every process through the proxy (the runner itself connects
        # directly), at a time scale of at least PROXY_TIME_SCALE: the proxy's own hop adds a few ms to each
        # Redis round trip, enough to make a 0.05 s transition "overrun" long after the fault
        self.proxy = ProxyProcess(srv.port) if any(k in PROXY_FAULTS for k in self.kinds) else None
        if self.proxy is not None:
            time_scale = max(time_scale, PROXY_TIME_SCALE)
        self.direct_url = direct_url  # what the runner itself connects to (never through the proxy)
        self.settings = Settings(redis_url=self.proxy.url() if self.proxy else direct_url,
                                 key_prefix=f"chaos-{seed}-{os.getpid()}", time_scale=time_scale, lease_ttl_s=2.0,
                                 heartbeat_s=0.4, batch_wait_s=0.02,
                                 planner_tick_s=0.05, max_attempts=5, redis_socket_timeout_s=2.0,
                                 redis_connect_timeout_s=1.0, shutdown_grace_s=SHUTDOWN_GRACE_S,
                                 # a half-open pub/sub (remote control) connection is dropped after 2 unanswered
                                 # health checks: within ~6 s here, not the ~75 s of the 25 s default
                                 redis_health_check_interval_s=2.0,
                                 submit_wait_replicas=1 if self.sentinels else 0, submit_wait_timeout_s=1.0)
        self.keys = Keys(self.settings.key_prefix)
        self.workdir = workdir
        self.system = LiveSystem(fleet_path, self.fleet, self.settings, workdir / f"run-{seed}", planners=2,
                                 pool=self.pool)
        self.r = client(direct_url)
        self.faults: list[tuple[float, str]] = []
        self.accepted_at: dict[str, float] = {}  # job id -> when its submit returned (unix s, this host)
        self._memory_timer: threading.Timer | None = None
        self._oom_before = 0
        self.oom_rejected = 0  # commands refused with OOM during memory_pressure
        self.restarts = Counter()
        self.extra: dict[str, list[str]] = {"wedged": [], "eviction_refused": [], "orphan": []}
        self._timers: list[threading.Timer] = []
        # endpoint_stubborn's effect comes later than its injection: when its instance is next
        # stopped (an evict, or a leftover stopped by a later start), the child that ignores
        # SIGTERM holds the stop for the driver's grace, and the transition doing it runs late
        # (a true transition_overrun). The watcher samples when such a child outlives its server.
        self.stubborn_stopping: list[float] = []  # unix s, when a SIGTERM-ignoring child outlived its server
        self._watching = threading.Event()

    # -- processes -------------------------------------------------------------------
    def _start_observer(self) -> Proc:
        self.system.log_dir.mkdir(parents=True, exist_ok=True)
        n = self.restarts["observer"]
        log_path = self.system.log_dir / f"observer-{n}.log"
        with open(log_path, "ab") as f:
            p = subprocess.Popen([sys.executable, "-m", "makespan.workers.observer", "--fleet", str(self.fleet_path),
                                  "--probe-interval-s", "0.25"], stdout=f, stderr=subprocess.STDOUT,
                                 env=self.system._env(), start_new_session=True)
        proc = Proc(f"observer-{n}", p, log_path)
        self.system.procs.append(proc)
        return proc

    def _alive(self, prefix: str) -> list[Proc]:
        return [p for p in self.system.procs if p.name.startswith(prefix) and p.alive()]

    def _leader(self) -> Proc | None:
        leads = [e for e in _events(self.r, self.keys) if e["kind"] == "planner_lead"]
        pids = {p.popen.pid: p for p in self._alive("planner-")}
        for e in reversed(leads):
            if e.get("pid") in pids:
                return pids[e["pid"]]
        return None

    def _supervise(self) -> None:
        """Restart what died (what compose's ``restart: unless-stopped`` does)."""
        for h in self.fleet.hosts:
            if not self._alive(f"gpu-{h.name}-"):
                self.restarts[f"gpu-{h.name}"] += 1
                self.system.start_gpu_worker(h.name, n=self.restarts[f"gpu-{h.name}"])
        while len(self._alive("planner-")) < 2:
            self.restarts["planner"] += 1
            self.system.start_planner(10 + self.restarts["planner"])
        if not self._alive("observer-"):
            self.restarts["observer"] += 1
            self._start_observer()

    # -- faults ------------------------------------------------------------------------
    def inject(self, kind: str) -> str:
        """Inject one fault; returns what was hit."""
        if kind in ("worker_kill", "worker_child_kill"):
            w = self.rng.choice(self._alive("gpu-") or [None])
            if w is None:
                return "no worker"
            if kind == "worker_child_kill":
                kids = children(w.popen.pid) if self.pool == "prefork" else []
                if kids:
                    k = self.rng.choice(kids)
                    os.kill(k, signal.SIGKILL)
                    return f"{w.name} child {k}"
            os.killpg(w.popen.pid, signal.SIGKILL)
            w.popen.wait()
            return w.name
        if kind in ("planner_kill", "planner_term"):
            lead = self._leader() or self.rng.choice(self._alive("planner-") or [None])
            if lead is None:
                return "no planner"
            os.killpg(lead.popen.pid, signal.SIGKILL if kind == "planner_kill" else signal.SIGTERM)
            return lead.name
        if kind == "observer_kill":
            for o in self._alive("observer-"):
                os.killpg(o.popen.pid, signal.SIGKILL)
                o.popen.wait()
                return o.name
            return "no observer"
        if kind == "redis_drop_clients":
            n = self.r.execute_command("CLIENT", "KILL", "TYPE", "normal")
            return f"{n} clients"
        if kind == "redis_restart":
            self.srv.restart(down_s=self.rng.uniform(0.0, 0.5))
            return "redis-server"
        if kind == "proxy_half_open":
            return f"{self.proxy.silence_open()} connections"
        if kind == "proxy_latency":
            latency_s, for_s = self.rng.uniform(0.02, 0.2), self.rng.uniform(0.5, 2.0)
            self.proxy.set_latency(latency_s)
            t = threading.Timer(for_s, lambda: self.proxy.set_latency(0.0))
            t.daemon = True
            t.start()
            self._timers.append(t)
            return f"{latency_s * 1000:.0f} ms for {for_s:.1f} s"
        if kind == "redis_role_change":
            down_s = self.rng.uniform(0.5, 2.0)
            # a primary nobody answers on, held so that no other redis-server can take the port meanwhile
            # (a full sync from one would replace this Redis's data)
            refusing = RefusingPort()
            try:
                self.r.execute_command("REPLICAOF", "127.0.0.1", str(refusing.port))
                time.sleep(down_s)
                self.r.execute_command("REPLICAOF", "NO", "ONE")
            finally:
                refusing.close()
            return f"replica for {down_s:.1f} s"
        if kind == "memory_pressure":
            return self._memory_pressure()
        if kind == "sentinel_failover":
            return self.sentinels.failover()
        if kind == "eviction_policy":
            return self._evicting_policy_probe()
        if kind == "worker_clock_skew":
            return self._skewed_worker()
        if kind == "endpoint_stubborn":
            prod = Producer(self.r, self.keys, self.fleet, self.settings)
            jid = self._submit(prod, {"endpoint": STUBBORN, "service_s": self.rng.uniform(5, 30),
                                      "priority": self.rng.choice(["HIGH", "NORMAL"]),
                                      "idempotency_key": f"chaos-{self.seed}-stubborn-{len(self.faults)}"})
            if jid:
                self.accepted.append(jid)
            return f"job {jid}"
        raise MakespanError(f"unknown fault {kind!r}")

    def _memory_pressure(self) -> str:
        """Set ``maxmemory`` to what Redis uses now, from 64 KiB below to 32 KiB above it
        (``noeviction`` stays): every write that may grow memory fails with ``OOM`` (at
        once, or once the headroom is filled), for 0.5–3 s, then ``maxmemory 0`` (memory
        freed)."""
        headroom = self.rng.randint(-64, 32) * 1024
        hold_s = self.rng.uniform(0.5, 3.0)
        used = int(self.r.info("memory")["used_memory"])
        self._oom_before = self._oom_count()
        self.r.config_set("maxmemory", max(1 << 20, used + headroom))  # 0 would mean no limit
        self._memory_timer = threading.Timer(hold_s, self._memory_freed)
        self._memory_timer.daemon = True
        self._memory_timer.start()
        self._timers.append(self._memory_timer)
        return f"maxmemory {used + headroom} ({headroom // 1024:+d} KiB) for {hold_s:.1f} s"

    def _memory_freed(self) -> None:
        try:
            self.r.config_set("maxmemory", 0)
            self.oom_rejected += self._oom_count() - self._oom_before
        except redis.RedisError:  # the run's cleanup sets it again
            pass

    def _oom_count(self) -> int:
        """Commands Redis refused with ``OOM`` so far (``INFO errorstats``)."""
        return int(self.r.info("errorstats").get("errorstat_OOM", {}).get("count", 0))

    def _evicting_policy_probe(self) -> str:
        """Set an evicting ``maxmemory-policy``, start a GPU worker (it must refuse: exit
        code 3 within PROBE_S), then ``noeviction`` again. Memory pressure still on is
        ended first (an evicting policy over a full ``maxmemory`` would really evict)."""
        if self._memory_timer is not None:
            self._memory_timer.cancel()
            self._memory_freed()
        policy = self.rng.choice(["volatile-ttl", "allkeys-lru", "volatile-lru"])
        host = self.rng.choice(self.fleet.hosts).name
        self.r.config_set("maxmemory-policy", policy)
        try:
            probe = self.system._spawn(f"probe-evict-{len(self.faults)}", [
                "gpu-worker", "--fleet", str(self.fleet_path), "--host", host, "--pool", "solo"])
            try:
                code = probe.popen.wait(timeout=PROBE_S)
            except subprocess.TimeoutExpired:
                os.killpg(probe.popen.pid, signal.SIGKILL)
                probe.popen.wait()
                code = None
        finally:
            self.r.config_set("maxmemory-policy", "noeviction")
        if code != EXIT_REFUSED:
            self.extra["eviction_refused"].append(f"a GPU worker on {policy} ended with {code}, not {EXIT_REFUSED}")
        return f"{policy}: worker exit {code}"

    def _skewed_worker(self) -> str:
        """Replace one host's GPU worker by one whose clock is 30–120 s off."""
        host = self.rng.choice(self.fleet.hosts).name
        offset_s = self.rng.choice([-1, 1]) * self.rng.uniform(30.0, 120.0)
        for w in self._alive(f"gpu-{host}-"):
            os.killpg(w.popen.pid, signal.SIGKILL)
            w.popen.wait()
        site = self.workdir / "skew-site"
        site.mkdir(parents=True, exist_ok=True)
        (site / "sitecustomize.py").write_text(SKEW_SITECUSTOMIZE)
        path = os.pathsep.join(x for x in (str(site), os.environ.get("PYTHONPATH", "")) if x)
        self.restarts[f"gpu-{host}"] += 1
        self.system.start_gpu_worker(host, n=self.restarts[f"gpu-{host}"],
                                     env_extra={"PYTHONPATH": path, "MAKESPAN_CHAOS_CLOCK_OFFSET_S": repr(offset_s)})
        return f"gpu-{host} clock {offset_s:+.0f} s"

    # -- after the faults: no process wedged, no orphan ----------------------------------
    def _faults_over(self) -> None:
        """Wait for the faults' own timers (latency, memory pressure) and a Sentinel
        failover's restart to end."""
        for t in self._timers:
            t.join(10.0)
        if self.sentinels is not None:
            self.sentinels.join()

    def _probe_liveness(self, prod: Producer) -> None:
        """Every process answers within its bound once the faults are over (module doc).

        The supervisor keeps running meanwhile, as a real one does: a process that exited
        (a GPU worker started while an evicting policy was set refuses and exits 3, possibly
        after the supervisor last looked) is replaced, not reported wedged; wedged is one
        that runs and does not answer."""
        from makespan.celery_app import create_celery

        app = create_celery(replace(self.settings, redis_url=self.direct_url))
        try:
            want = {f"gpu-{h.name}" for h in self.fleet.hosts}
            seen: set[str] = set()
            last_error: Exception | None = None
            deadline = time.monotonic() + PROBE_S
            while time.monotonic() < deadline and not want <= seen:
                self._supervise()
                try:
                    replies = app.control.ping(timeout=1.0, limit=len(want - seen)) or []  # back at the last reply
                    seen |= {n.split("@")[0] for rep in replies for n in rep}
                except (redis.RedisError, OSError) as e:  # the probe's own connection died in the faults: a new one
                    app.close()
                    app = create_celery(replace(self.settings, redis_url=self.direct_url))
                    time.sleep(0.2)
                    last_error = e
            if not want <= seen:
                self.extra["wedged"].append(f"GPU workers not answering ping: {sorted(want - seen)} "
                                            f"(last probe error: {last_error})")
        finally:
            app.close()
        cycle0 = self.r.hget(self.keys.observer, "cycle")
        deadline = time.monotonic() + PROBE_S
        while time.monotonic() < deadline and self.r.hget(self.keys.observer, "cycle") == cycle0:
            self._supervise()
            time.sleep(0.1)
        if self.r.hget(self.keys.observer, "cycle") == cycle0:
            self.extra["wedged"].append(f"observer's probe cycle stuck at {cycle0}")
        jid = self._submit(prod, {"endpoint": "embed", "service_s": 1.0, "priority": "CRITICAL",
                                  "idempotency_key": f"chaos-{self.seed}-probe"})
        deadline = time.monotonic() + PROBE_S
        while time.monotonic() < deadline and self.r.hget(self.keys.job(jid), "state") not in TERMINAL:
            self._supervise()
            time.sleep(0.1)
        if jid is None or self.r.hget(self.keys.job(jid), "state") != "completed":
            self.extra["wedged"].append(f"probe job {jid}: {self.r.hgetall(self.keys.job(jid)) if jid else 'refused'}")
        if jid:
            self.accepted.append(jid)

    def _orphans(self) -> list[str]:
        """Endpoint processes of this run (its key prefix in their environment) outside the
        process group of every registered instance."""
        from makespan.workers.drivers.registry import list_instances

        groups = {inst.pid for inst in list_instances(self.r, self.keys) if inst.pid}
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if "makespan.workers.endpoint_server" not in cmd:
                    continue
                env = (d / "environ").read_bytes().split(b"\0")
                pgid = os.getpgid(int(d.name))
            except (OSError, ProcessLookupError):
                continue
            if f"MAKESPAN_KEY_PREFIX={self.keys.prefix}".encode() in env and pgid not in groups:
                out.append(f"pid {d.name} (group {pgid}): {cmd[:120]}")
        return out

    def _watch_stubborn(self) -> None:
        """Until the run's checks, every 0.2 s: note the time when a child of the ``stubborn``
        endpoint (:data:`makespan.workers.endpoint_server._STUBBORN_CHILD`, this run's key
        prefix in its environment) is alive while its parent is no longer an endpoint server
        (the server was stopped and the driver waits out its grace before SIGKILL)."""
        marker = b"signal.SIG_IGN"
        prefix = f"MAKESPAN_KEY_PREFIX={self.keys.prefix}".encode()
        while not self._watching.wait(0.2):
            for d in Path("/proc").iterdir():
                if not d.name.isdigit():
                    continue
                try:
                    if marker not in (d / "cmdline").read_bytes() or prefix not in (d / "environ").read_bytes():
                        continue
                    ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    parent_cmd = Path(f"/proc/{ppid}/cmdline").read_bytes()
                except (OSError, ValueError, IndexError):
                    continue
                if b"makespan.workers.endpoint_server" not in parent_cmd:
                    now = time.time()
                    if not self.stubborn_stopping or now - self.stubborn_stopping[-1] > 0.5:
                        self.stubborn_stopping.append(now)

    def _stop_timed(self) -> None:
        """SIGTERM every process still running; one still running ``shutdown_grace_s`` + 1 s
        (+ PROBE_SLACK_S for a loaded machine) later is wedged (then SIGKILLed)."""
        alive = [p for p in self.system.procs if p.alive()]
        for p in alive:
            try:
                os.killpg(p.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + SHUTDOWN_GRACE_S + 1.0 + PROBE_SLACK_S
        for p in alive:
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.extra["wedged"].append(f"{p.name} still running {SHUTDOWN_GRACE_S + 1.0 + PROBE_SLACK_S} s "
                                            f"after SIGTERM")
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait()

    # -- the run -----------------------------------------------------------------------
    def _job(self, i: int) -> dict:
        eps = sorted(e for e in self.fleet.endpoints if e != STUBBORN)
        job = {"endpoint": self.rng.choice(eps), "service_s": self.rng.uniform(10, 80),
               "priority": self.rng.choice(["CRITICAL", "HIGH", "NORMAL", "LOW"]),
               "idempotency_key": f"chaos-{self.seed}-{i}"}
        if self.rng.random() < 0.2:  # a delayed job: waits in P:delayed through the faults
            job["delay_s"] = round(self.rng.uniform(0.2, 2.0), 3)
        return job

    def _submit(self, prod: Producer, job: dict) -> str | None:
        for _ in range(50):  # a submit that failed may have been applied: the key makes it safe to repeat
            try:
                jid = prod.submit(job).id
                self.accepted_at.setdefault(jid, time.time())
                return jid
            except StoreError:
                time.sleep(0.1)
        return None

    def run(self) -> RunResult:
        t_start = time.time()
        crashed: list[str] = []
        self.accepted: list[str] = []
        phases: dict[str, float] = {}
        mark = [time.monotonic()]

        def lap(name: str) -> None:
            now = time.monotonic()
            phases[name] = round(now - mark[0], 1)
            mark[0] = now

        if "endpoint_stubborn" in self.kinds:
            threading.Thread(target=self._watch_stubborn, daemon=True, name="stubborn-watch").start()
        try:
            self._start_observer()  # boots while the GPU workers are waited for
            self.system.start(wait_s=60)
            lap("start")
            prod = Producer(self.r, self.keys, self.fleet, self.settings)
            plan_t = sorted(self.rng.uniform(0.0, self.duration_s) for _ in range(self.n_jobs))
            fault_t = sorted(self.rng.uniform(0.3, self.duration_s) for _ in self.kinds)
            kinds = self.kinds
            jobs = [self._job(i) for i in range(self.n_jobs)]
            timeline = sorted([(t, "job", i) for i, t in enumerate(plan_t)] + [(t, "fault", k) for t, k in
                                                                                zip(fault_t, kinds)])
            accepted = self.accepted
            t0 = time.monotonic()
            for t, what, arg in timeline:
                time.sleep(max(0.0, t0 + t - time.monotonic()))
                if what == "job":
                    jid = self._submit(prod, jobs[arg])
                    if jid:
                        accepted.append(jid)
                else:
                    hit = self.inject(arg)
                    self.faults.append((time.time(), f"{arg}:{hit}"))
                    time.sleep(0.05)
                    self._supervise()
            self._faults_over()
            lap("faults")
            self._probe_liveness(prod)  # the faults are over: every process must answer within its bound
            lap("probe")
            deadline = time.monotonic() + self.timeout_s
            settled = False
            while time.monotonic() < deadline:
                self._supervise()
                states = [self.r.hget(self.keys.job(j), "state") for j in accepted]
                if all(s in TERMINAL for s in states):
                    d = drain_counts(self.r, self.keys, self.fleet)
                    if not any(d[k] for k in ("leases", "agenda_entries", "busy_slots")) and self._set_points_ok():
                        settled = self._drain_checked()
                        if settled:
                            break
                time.sleep(0.1)
            lap("settle")
            self.extra["orphan"] += self._orphans()
            window_s = self.settings.lease_ttl_s * 3 + 5.0
            self._watching.set()
            # an incident while (or just after) a stubborn endpoint's stop was held is that fault's effect
            causes = self.faults + [(t, "endpoint_stubborn:stop held by its child") for t in self.stubborn_stopping]
            # a failover lasts until the Sentinels name a new primary (15 s under load): an incident the
            # outage caused is detected once Redis answers again, after the kill's window may have ended
            if self.sentinels is not None:
                causes += [(t, "sentinel_failover:new primary") for t in self.sentinels.promoted_at]
            viol = check_invariants(self.r, self.keys, self.fleet, accepted, causes, window_s)
            viol["lost"] = [self._lost_evidence(x) for x in viol["lost"]]
            self._stop_timed()
            lap("stop")
            for k, xs in self.extra.items():
                viol[k] = viol.get(k, []) + xs
            if any(viol.values()):  # keep the evidence next to the process logs
                self.system.log_dir.mkdir(parents=True, exist_ok=True)
                (self.system.log_dir / "events.json").write_text(json.dumps(_events(self.r, self.keys), indent=0))
            states = Counter(self.r.hget(self.keys.job(j), "state") for j in accepted)
            # a process that refused an evicting policy (exit 3) did what it must
            ok_codes = (0, -9, -15) + ((EXIT_REFUSED,) if "eviction_policy" in self.kinds else ())
            crashed = [p.name for p in self.system.procs if not p.alive() and p.popen.returncode not in ok_codes
                       and not p.name.startswith("probe-") and not any(p.name in f for _, f in self.faults)]
            result = RunResult(self.seed, self.pool, len(accepted), states, self.faults, viol,
                               time.time() - t_start, crashed, phases, self.oom_rejected)
        finally:
            self._watching.set()
            for t in self._timers:
                t.cancel()
            self.system.stop(grace_s=5)
            if self.proxy is not None:
                self.proxy.close()
            try:
                self.r.config_set("maxmemory-policy", "noeviction")
                self.r.config_set("maxmemory", 0)
                delete_prefix(self.r, self.keys)
            except redis.RedisError:
                pass
            self.r.close()
            if self.sentinels is not None:
                self.sentinels.stop()
            lap("cleanup")
        result.wall_s = time.time() - t_start
        return result

    def _lost_evidence(self, violation: str) -> str:
        """A ``lost`` violation with what tells its causes apart: whether the job's
        ``submitted`` event and idempotency record exist (written by the same script as
        the record: all gone means the write itself was lost, a deleted record leaves
        them), when its submit returned, and the faults within 5 s of that."""
        jid = violation.split(":")[0]
        evs = [e for e in _events(self.r, self.keys) if e.get("job") == jid]
        at = self.accepted_at.get(jid)
        near = [f"{f} at {t - at:+.2f} s" for t, f in self.faults if at is not None and abs(t - at) <= 5.0]
        return (f"{violation}; events {[e['kind'] for e in evs]}; accepted at {at}; faults near it {near}; "
                f"aof {self._aof_info()}")

    def _aof_info(self) -> str:
        try:
            info = self.r.info("persistence")
            return f"fsync {self.r.config_get('appendfsync').get('appendfsync')}, delayed {info.get('aof_delayed_fsync')}"
        except redis.RedisError as e:
            return f"unknown ({e})"

    def _set_points_ok(self) -> bool:
        from makespan.workers.phases import instance_value
        from makespan.workers.fleet_view import set_point_instances

        return all(self.r.mget([self.keys.resident(g) for g in gpus]) == [instance_value(ep, gpus)] * len(gpus)
                   for ep, gpus in set_point_instances(self.fleet))

    def _drain_checked(self) -> bool:
        evs = _events(self.r, self.keys)
        last_end = max((e["ts"] for e in evs if e["kind"] in TERMINAL + ("restore_end",)), default=0.0)
        return any(e["kind"] == "drain" and e["ts"] >= last_end for e in evs)


def write_fleet(workdir: Path) -> Path:
    p = workdir / "chaos-fleet.toml"
    p.write_text(CHAOS_FLEET)
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.chaos", description=__doc__.split("\n\n")[0],
                                 epilog=f"fault kinds (each fault drawn uniformly; sentinel_failover only where redis-sentinel is "
                                        f"installed): {', '.join(FAULTS)}; a run that draws sentinel_failover runs "
                                        f"on a Sentinel set and draws again instead of "
                                        f"{', '.join(NOT_WITH_SENTINEL)}. Invariants checked after every run: "
                                        f"{', '.join(INVARIANTS)}.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--runs", type=int, default=100, help="runs, one after the other")
    ap.add_argument("--seed", type=int, default=1, help="seed of the first run (run i uses seed + i)")
    ap.add_argument("--jobs", type=int, default=16, help="jobs per run")
    ap.add_argument("--faults", type=int, default=3, help="faults per run")
    ap.add_argument("--duration-s", type=float, default=4.0, help="window in which jobs arrive and faults strike")
    ap.add_argument("--keep-logs", type=Path, default=None,
                    help="keep the process logs of the runs with a violation or a crashed process under this folder")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop what we started on the way out
    workdir = Path(a.keep_logs or tempfile.mkdtemp(prefix="makespan-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    fleet_path = write_fleet(workdir)
    srv = RedisServer()
    totals, faults, jobs, states, crashes, done = Counter(), Counter(), 0, Counter(), 0, 0
    errors, oom, part_s = 0, 0, Counter()
    t0 = time.time()
    try:
        for i in range(a.runs):
            try:
                res = ChaosRun(srv, fleet_path, a.seed + i, workdir, a.jobs, a.faults, a.duration_s).run()
            except Exception as e:  # noqa: BLE001 - a run that could not be made is reported; the series goes on
                errors += 1
                print(f"run {i + 1:3d} seed {a.seed + i} ERROR (not a violation; the run could not be made): "
                      f"{type(e).__name__}: {e}", flush=True)
                continue
            jobs += res.accepted
            states.update(res.states)
            for _, f in res.faults:
                faults[f.split(":")[0]] += 1
            bad = {k: len(x) for k, x in res.violations.items() if x}
            totals.update(bad)
            crashes += len(res.crashed)
            oom += res.oom_rejected
            part_s.update(res.phases)
            done += 1
            print(f"run {i + 1:3d} seed {res.seed} pool {res.pool:8s} jobs {res.accepted} {dict(res.states)} "
                  f"faults {[f for _, f in res.faults]} {res.wall_s:.1f} s {res.phases} "
                  f"{'oom ' + str(res.oom_rejected) + ' ' if 'memory_pressure' in str(res.faults) else ''}"
                  f"{'OK' if not bad else 'VIOLATIONS ' + json.dumps(res.violations)}"
                  f"{' crashed ' + str(res.crashed) if res.crashed else ''}", flush=True)
            if not bad and not res.crashed:  # keep the logs of the runs that need reading only
                shutil.rmtree(workdir / f"run-{res.seed}", ignore_errors=True)
    finally:
        srv.stop()
        if a.keep_logs is None:
            shutil.rmtree(workdir, ignore_errors=True)
        # the totals of the runs done, also when stopped early (SIGTERM, Ctrl-C)
        print(f"\nruns {done}/{a.runs}  jobs {jobs} {dict(states)}  wall {time.time() - t0:.0f} s"
              f"  runs that could not be made {errors}")
        print("faults injected: " + ", ".join(f"{k} {faults[k]}" for k in FAULTS) + f" (total {sum(faults.values())})")
        print(f"commands Redis refused with OOM under memory_pressure: {oom}")
        print("mean seconds per run by part: " + ", ".join(f"{k} {v / max(done, 1):.1f}" for k, v in part_s.items()))
        print(f"processes that exited on their own (restarted by the runner's supervisor): {crashes}")
        print("violations: " + ", ".join(f"{k} {totals[k]}" for k in INVARIANTS) + f" (total {sum(totals.values())})",
              flush=True)
    return 1 if sum(totals.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
