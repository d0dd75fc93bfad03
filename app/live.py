"""Start and stop the live system's processes on one machine (demo, replay, tests).

:class:`LiveSystem` starts planner workers and one GPU worker per host as real child
processes (``python -m makespan.cli ...``), waits until the GPU workers consume their
queues, and stops everything it started (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis

from makespan.errors import MakespanError
from makespan.keys import Keys
from makespan.models import FleetSpec
from makespan.settings import Settings


SYSTEM_ID_ENV = "MAKESPAN_LIVE_SYSTEM_ID"
"""The environment variable that marks the processes of one :class:`LiveSystem`."""


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class LiveSystem:
    """The planner(s) and GPU workers of ``fleet`` as child processes.

    Attributes:
        fleet_path: TOML fleet file the processes read.
        settings: passed to every child through ``MAKESPAN_*`` variables.
        log_dir: each child's stdout/stderr goes to ``log_dir/{name}.log``.
        planners: planner processes to start (one leads; the rest stand by); per pool for
            a fleet with pools (``planner-{pool}-{i}``, each run with ``--pool``).
        pool: Celery pool of the GPU workers (threads, prefork or solo).
        observer: also start the health observer.
        metrics_base_port: when set, each process serves /metrics on its own port from
            this one up, skipping ports already bound on this host (``metrics_ports`` maps
            process name -> port). A port below the ephemeral range (32768 on Linux) is
            safest: outgoing connections take ephemeral ports between the check and the
            child's bind.
    """

    fleet_path: Path
    fleet: FleetSpec
    settings: Settings
    log_dir: Path
    planners: int = 1
    pool: str = "threads"
    observer: bool = True
    metrics_base_port: int = 0
    metrics_ports: dict[str, int] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    # marks every process this system starts, and what they start in turn (endpoint servers and
    # their children inherit it): stop() kills what is left of them (:meth:`kill_leftovers`)
    system_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def _env(self) -> dict[str, str]:
        env = {**os.environ, **self.settings.to_env(), **self.extra_env, SYSTEM_ID_ENV: self.system_id}
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("MAKESPAN_LOG_LEVEL", "WARNING")
        return env

    def _spawn(self, name: str, args: list[str], env_extra: dict[str, str] | None = None) -> Proc:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        f = open(log_path, "ab")
        env = {**self._env(), **(env_extra or {})}
        if self.metrics_base_port:
            port = self.metrics_ports.get(name) or _bindable_from(self.metrics_base_port + len(self.metrics_ports),
                                                                  set(self.metrics_ports.values()))
            self.metrics_ports[name] = port
            env["MAKESPAN_METRICS_PORT"] = str(port)
        p = subprocess.Popen([sys.executable, "-m", "makespan.cli", *args], stdout=f, stderr=subprocess.STDOUT,
                             env=env, start_new_session=True)
        f.close()
        proc = Proc(name, p, log_path)
        self.procs.append(proc)
        return proc

    def start_planner(self, i: int = 0, pool: str | None = None) -> Proc:
        """Start planner ``planner-{i}``, or ``planner-{pool}-{i}`` for pool ``pool``."""
        if pool is None:
            return self._spawn(f"planner-{i}", ["planner", "--fleet", str(self.fleet_path)])
        return self._spawn(f"planner-{pool}-{i}", ["planner", "--fleet", str(self.fleet_path), "--pool", pool])

    def start_gpu_worker(self, host: str, n: int = 0, env_extra: dict[str, str] | None = None) -> Proc:
        """Start the GPU worker ``gpu-{host}-{n}``; ``env_extra``: variables for this
        process only (over :attr:`extra_env`)."""
        return self._spawn(f"gpu-{host}-{n}", ["gpu-worker", "--fleet", str(self.fleet_path), "--host", host,
                                              "--pool", self.pool], env_extra)

    def start_observer(self, probe_interval_s: float = 0.5) -> Proc:
        return self._spawn("observer", ["observer", "--fleet", str(self.fleet_path),
                                        "--probe-interval-s", repr(probe_interval_s)])

    def start(self, wait_s: float = 60.0) -> LiveSystem:
        for h in self.fleet.hosts:
            self.start_gpu_worker(h.name)
        for pool in self.fleet.pool_names() or [None]:
            for i in range(self.planners):
                self.start_planner(i, pool)
        if self.observer:
            self.start_observer()
        self.wait_workers(wait_s)
        return self

    def check_alive(self) -> None:
        """Raise :class:`MakespanError` naming the first child that has exited, with the
        last line of its log (a planner that rejected its settings, a worker that
        crashed): a run that waits on it would never finish."""
        for p in self.procs:
            if not p.alive():
                try:
                    lines = [x for x in p.log_path.read_text(errors="replace").splitlines() if x.strip()]
                except OSError:
                    lines = []
                last = lines[-1].strip() if lines else "(empty log)"
                raise MakespanError(f"{p.name} exited with code {p.popen.returncode}: {last} (log: {p.log_path})")

    def wait_workers(self, timeout_s: float = 60.0, hosts: list[str] | None = None) -> None:
        """Wait until a GPU worker consumes each host's queue (Celery's worker ping).

        Raises:
            MakespanError: a worker died or did not answer within ``timeout_s``.
        """
        from makespan.celery_app import create_celery

        want = {f"gpu-{h}" for h in (hosts or [h.name for h in self.fleet.hosts])}
        app = create_celery(self.settings)
        deadline = time.monotonic() + timeout_s
        seen: set[str] = set()
        try:
            while time.monotonic() < deadline:
                for p in self.procs:
                    if p.name.startswith("gpu-") and not p.alive():
                        raise MakespanError(f"{p.name} exited with {p.popen.returncode}; see {p.log_path}")
                replies = app.control.ping(timeout=0.5) or []
                seen = {name.split("@")[0] for r in replies for name in r}
                if want <= seen:
                    return
            raise MakespanError(f"GPU workers not ready within {timeout_s} s (seen: {sorted(seen)})")
        finally:
            app.close()

    def kill(self, name_prefix: str, sig: int = signal.SIGKILL) -> list[Proc]:
        """Send ``sig`` to every child whose name starts with ``name_prefix`` (its whole
        process group, so prefork children die too)."""
        hit = []
        for p in self.procs:
            if p.name.startswith(name_prefix) and p.alive():
                try:
                    os.killpg(p.popen.pid, sig)
                except ProcessLookupError:
                    pass
                hit.append(p)
        return hit

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop every process started here, then every endpoint instance they started."""
        for p in self.procs:
            if p.alive():
                try:
                    os.killpg(p.popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait()
        self.stop_instances()
        self.kill_leftovers()

    def kill_leftovers(self) -> list[int]:
        """SIGKILL every process still running with this system's mark in its environment
        (:data:`SYSTEM_ID_ENV`): what outlived the stops above, such as the child of an
        endpoint server that ignores SIGTERM when the GPU worker that was stopping it (it had
        already forgotten the instance) was killed before its SIGKILL. Linux ``/proc`` only
        (elsewhere nothing is done). Returns the pids it killed."""
        proc = Path("/proc")
        if not proc.is_dir():
            return []
        mark = f"{SYSTEM_ID_ENV}={self.system_id}".encode()
        killed = []
        for entry in proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if mark not in (entry / "environ").read_bytes().split(b"\0"):
                    continue
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except (OSError, ProcessLookupError):
                continue
        return killed

    def stop_instances(self) -> int:
        """Stop the endpoint processes the GPU workers started (they run in their own
        sessions, so stopping a worker leaves them running)."""
        from makespan.redis_conn import connect
        from makespan.workers.drivers import get_driver
        from makespan.workers.drivers.registry import list_instances, unregister_instance

        keys = Keys(self.settings.key_prefix)
        try:
            r = connect(self.settings.redis_url)
            insts = list_instances(r, keys)
        except (redis.RedisError, MakespanError):
            return 0
        for inst in insts:
            try:
                get_driver(inst.driver).stop(inst)
            except MakespanError:
                pass
            unregister_instance(r, keys, inst.id, gpus=inst.gpus)
        r.close()
        return len(insts)

    def __enter__(self) -> LiveSystem:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_for(cond, timeout_s: float, what: str, poll_s: float = 0.1):
    """Poll ``cond()`` every ``poll_s`` until it returns something truthy (returned);
    raise :class:`TimeoutError` naming ``what`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = cond()
        if out:
            return out
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


def delete_prefix(r: redis.Redis, keys: Keys) -> int:
    """Delete every key of one prefix (a run's own keys, Celery's included)."""
    n = 0
    batch: list[str] = []
    for k in r.scan_iter(keys.all_pattern, count=1000):
        batch.append(k)
        if len(batch) >= 500:
            n += r.delete(*batch)
            batch.clear()
    if batch:
        n += r.delete(*batch)
    return n


def _bindable_from(start: int, taken: set[int]) -> int:
    """The first port from ``start`` not in ``taken`` that nothing on this host has bound
    (a process whose metrics port is taken would exit at start). Raises RuntimeError
    when none is left below 65536."""
    for port in range(start, 65536):
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free TCP port from {start} up for a metrics server")
