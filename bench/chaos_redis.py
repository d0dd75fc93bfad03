"""The chaos runner's own Redis deployments (bench/chaos.py): a private append-only
redis-server that can be SIGKILLed and started again, a Sentinel set (a primary, a
replica and three ``redis-sentinel`` processes) that can be failed over, and a port that
refuses every connection (the unreachable primary of a role change).

Durability: both use ``appendfsync always`` by default. With ``everysec`` Redis may hold
up to about 2 s of acknowledged writes in its own memory while a background fsync is
still running (``flushAppendOnlyFile`` postpones the write), so a SIGKILL can lose them
on a busy disk; the runner's ``lost`` invariant checks the guarantee
docs/durability.md states for ``always``.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import redis

from makespan.errors import StoreError
from makespan.redis_conn import free_port, ping, redis_server_binary

__all__ = ["RedisServer", "RefusingPort", "SentinelSet", "sentinel_binary", "sentinel_command"]

SENTINEL_SERVICE = "makespan-chaos"
SENTINEL_DOWN_AFTER_MS = 1000  # a primary silent this long is subjectively down
SENTINEL_FAILOVER_TIMEOUT_MS = 10000


def _server_args(port: int, directory: str, appendfsync: str, extra: list[str] | None = None) -> list[str]:
    return [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", "",
            "--appendonly", "yes", "--appendfsync", appendfsync, "--protected-mode", "yes", *(extra or [])]


def _wait_ping(proc: subprocess.Popen, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StoreError(f"redis-server exited with code {proc.returncode}")
        if ping(url, 0.2):
            return
        time.sleep(0.02)
    raise StoreError(f"redis-server did not answer on {url} within {timeout_s} s")


class RedisServer:
    """A private redis-server with append-only persistence that can be killed and
    started again on the same port and directory (so the AOF brings its data back).

    ``appendfsync``: ``always`` (default; nothing acknowledged is lost by a SIGKILL) or
    ``everysec`` (see the module doc)."""

    def __init__(self, appendfsync: str = "always"):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="makespan-chaos-redis-")
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.start()

    def start(self, timeout_s: float = 10.0) -> None:
        self.proc = subprocess.Popen(_server_args(self.port, self.dir, self.appendfsync), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        _wait_ping(self.proc, self.url, timeout_s)

    def kill(self) -> None:
        """SIGKILL the server (a crash: no shutdown, no final rewrite)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, down_s: float = 0.0) -> None:
        self.kill()
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class RefusingPort:
    """A loopback port bound but not listening for as long as it is open: every
    connection to it is refused, and no other process (another test's redis-server) can
    take it meanwhile, as a port from :func:`free_port` could be taken."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


def sentinel_command(conf: Path) -> list[str] | None:
    """The command that runs a Sentinel on ``conf``: ``redis-sentinel`` (Debian's
    package) where it is on PATH, else ``redis-server CONF --sentinel`` (the same
    program in Sentinel mode), or None without either."""
    if shutil.which("redis-sentinel"):
        return [shutil.which("redis-sentinel"), str(conf)]
    try:
        return [redis_server_binary(), str(conf), "--sentinel"]
    except StoreError:
        return None


def sentinel_binary() -> bool:
    """Whether a Sentinel can be started here (:func:`sentinel_command`)."""
    return sentinel_command(Path("sentinel.conf")) is not None


class SentinelSet:
    """One primary, one replica and three Sentinels on loopback ports, each server with
    append-only persistence; :attr:`url` is the ``redis+sentinel://`` URL of the set.

    :meth:`failover` SIGKILLs the current primary; a background thread waits until every
    Sentinel names the replica as the primary, then starts the killed server again on its
    own port and directory, which the Sentinels turn into the new primary's replica.

    Raises:
        StoreError: a server or Sentinel did not start, or the set did not form within
            ``timeout_s``.
    """

    def __init__(self, appendfsync: str = "always", timeout_s: float = 30.0):
        if not sentinel_binary():
            raise StoreError("neither redis-sentinel nor redis-server is on PATH")
        self.dir = Path(tempfile.mkdtemp(prefix="makespan-chaos-sentinel-"))
        self.appendfsync = appendfsync
        self.ports = {"a": free_port(), "b": free_port()}
        self.servers: dict[str, subprocess.Popen] = {}
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen] = []
        self.failovers = 0
        self.promoted_at: list[float] = []  # unix s, when the Sentinels named a new primary after each failover
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.url = ("redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
                    + f"/{SENTINEL_SERVICE}/0")
        try:
            self.start_server("a")
            self.start_server("b", ["--replicaof", "127.0.0.1", str(self.ports["a"])])
            for i, port in enumerate(self.sentinel_ports):
                conf = self.dir / f"sentinel-{i}.conf"
                conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                                f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {self.ports['a']} 2\n"
                                f"sentinel down-after-milliseconds {SENTINEL_SERVICE} {SENTINEL_DOWN_AFTER_MS}\n"
                                f"sentinel failover-timeout {SENTINEL_SERVICE} {SENTINEL_FAILOVER_TIMEOUT_MS}\n"
                                f"sentinel parallel-syncs {SENTINEL_SERVICE} 1\n")
                log = open(self.dir / f"sentinel-{i}.log", "ab")
                self.sentinels.append(subprocess.Popen(sentinel_command(conf), stdout=log,
                                                       stderr=subprocess.STDOUT, start_new_session=True))
                log.close()
            self._wait(self.ready, timeout_s, "the Sentinel set to form")
        except BaseException:
            self.stop()
            raise

    def start_server(self, name: str, extra: list[str] | None = None) -> None:
        """Start server ``name`` ("a" or "b") on its port and directory (again, after a
        SIGKILL: the Sentinels then make it a replica of the current primary)."""
        d = self.dir / name
        d.mkdir(exist_ok=True)
        log = open(self.dir / f"server-{name}.log", "ab")
        proc = subprocess.Popen(_server_args(self.ports[name], str(d), self.appendfsync, extra), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.servers[name] = proc
        _wait_ping(proc, f"redis://127.0.0.1:{self.ports[name]}/0", 10.0)

    @staticmethod
    def _wait(cond, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if cond():
                    return
            except (redis.RedisError, OSError, KeyError, TypeError, ValueError):
                pass
            time.sleep(0.1)
        raise StoreError(f"timed out after {timeout_s} s waiting for {what}")

    def primary(self) -> str | None:
        """The name ("a" or "b") of the server every Sentinel names as the primary, or None."""
        names = set()
        for port in self.sentinel_ports:
            with redis.Redis(port=port, socket_timeout=1.0) as s:
                addr = s.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)
            names.add(next((n for n, p in self.ports.items() if addr and int(addr[1]) == p), None))
        return names.pop() if len(names) == 1 else None

    def ready(self) -> bool:
        """Every Sentinel agrees on the primary, sees the two others and one replica, and
        that replica's link to the primary is up."""
        name = self.primary()
        if name is None or self.servers[name].poll() is not None:
            return False
        for port in self.sentinel_ports:
            with redis.Redis(port=port, socket_timeout=1.0, decode_responses=True) as s:
                m = s.sentinel_master(SENTINEL_SERVICE)
                if int(m["num-other-sentinels"]) != 2 or int(m["num-slaves"]) < 1:
                    return False
        other = "b" if name == "a" else "a"
        with redis.Redis(port=self.ports[other], socket_timeout=1.0, decode_responses=True) as rep:
            info = rep.info("replication")
        return info.get("role") == "slave" and info.get("master_link_status") == "up" \
            and int(info.get("master_port", 0)) == self.ports[name]

    def failover(self, timeout_s: float = 60.0) -> str:
        """SIGKILL the current primary (after waiting for the set to be whole again after a
        previous failover); returns what was killed. The killed server comes back as the
        new primary's replica in the background."""
        self.join(timeout_s)
        self._wait(self.ready, timeout_s, "the Sentinel set to be whole before a failover")
        name = self.primary()
        self.servers[name].send_signal(signal.SIGKILL)
        self.servers[name].wait()
        self.failovers += 1

        def come_back() -> None:
            try:
                self._wait(lambda: self._stopped or self.primary() not in (None, name), timeout_s,
                           "the Sentinels to fail over")
                self.promoted_at.append(time.time())
                if not self._stopped:
                    self.start_server(name)  # the Sentinels make it the new primary's replica
            except StoreError:
                pass  # join() and ready() report a set that did not heal

        self._thread = threading.Thread(target=come_back, name="sentinel-come-back", daemon=True)
        self._thread.start()
        return f"primary {name} (port {self.ports[name]})"

    def join(self, timeout_s: float = 60.0) -> None:
        """Wait for a failover's background restart to finish."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def stop(self) -> None:
        self._stopped = True
        self.join(15.0)
        for p in [*self.sentinels, *self.servers.values()]:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
