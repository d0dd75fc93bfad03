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
from makespan.redis_conn import PORT_TRIES, PortTaken, free_port, redis_server_binary, wait_server_started

__all__ = ["RedisServer", "RefusingPort", "SentinelSet", "sentinel_binary", "sentinel_command"]

SENTINEL_SERVICE = "makespan-chaos"
SENTINEL_DOWN_AFTER_MS = 1000  # a primary silent this long is subjectively down
SENTINEL_FAILOVER_TIMEOUT_MS = 10000


def _server_args(port: int, directory: str, appendfsync: str, extra: list[str] | None = None) -> list[str]:
    return [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", "",
            "--appendonly", "yes", "--appendfsync", appendfsync, "--protected-mode", "yes", *(extra or [])]


class RedisServer:
    """A private redis-server with append-only persistence that can be killed and
    started again on the same port and directory (so the AOF brings its data back).

    ``appendfsync``: ``always`` (default; nothing acknowledged is lost by a SIGKILL) or
    ``everysec`` (see the module doc)."""

    def __init__(self, appendfsync: str = "always"):
        self.dir = tempfile.mkdtemp(prefix="makespan-chaos-redis-")
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen | None = None
        for attempt in range(1, PORT_TRIES + 1):  # a free port can be taken before the server binds it
            self.port = free_port()
            self.url = f"redis://127.0.0.1:{self.port}/0"
            try:
                self.start()
                break
            except PortTaken:
                self.kill()
                if attempt == PORT_TRIES:
                    self.stop()
                    raise

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server on its port and directory; wait until it answers there
        (:func:`makespan.redis_conn.wait_server_started`).

        Raises:
            PortTaken: another process holds the port (a restart after it was let go).
            StoreError: it did not answer within ``timeout_s``."""
        self.proc = subprocess.Popen(_server_args(self.port, self.dir, self.appendfsync), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        wait_server_started(self.proc, self.url, timeout_s)

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

    def __init__(self, appendfsync: str = "always", timeout_s: float = 30.0, *, password: str | None = None,
                 username: str | None = None, sentinel_password: str | None = None,
                 tls: dict[str, str] | None = None):
        if not sentinel_binary():
            raise StoreError("neither redis-sentinel nor redis-server is on PATH")
        self.dir = Path(tempfile.mkdtemp(prefix="makespan-chaos-sentinel-"))
        self.appendfsync = appendfsync
        # a secured set: the data nodes' AUTH (``username`` an ACL user, the default user then
        # off), the Sentinels' own ``requirepass``, TLS everywhere (``tls``: the files "ca",
        # "cert" and "key"; the Sentinels and the data nodes listen on TLS ports only)
        self.password, self.username, self.sentinel_password, self.tls = password, username, sentinel_password, tls
        self.ports = {"a": free_port(), "b": free_port()}
        self.servers: dict[str, subprocess.Popen] = {}
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen] = []
        self.failovers = 0
        self.promoted_at: list[float] = []  # unix s, when the Sentinels named a new primary after each failover
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.url = self.url_with()
        try:
            self.start_server("a")
            self.start_server("b", ["--replicaof", "127.0.0.1", str(self.ports["a"])])
            for i, port in enumerate(self.sentinel_ports):
                conf = self.dir / f"sentinel-{i}.conf"
                conf.write_text(self._sentinel_conf(port))
                log = open(self.dir / f"sentinel-{i}.log", "ab")
                self.sentinels.append(subprocess.Popen(sentinel_command(conf), stdout=log,
                                                       stderr=subprocess.STDOUT, start_new_session=True))
                log.close()
            self._wait(self.ready, timeout_s, "the Sentinel set to form")
        except BaseException:
            self.stop()
            raise

    def url_with(self, userinfo: str | None = None, query: str = "") -> str:
        """The set's ``redis+sentinel://`` URL (``rediss+sentinel://`` with TLS), with
        ``userinfo`` (default: the data nodes' credentials) and ``query`` (without its ``?``;
        with TLS the CA is added)."""
        if userinfo is None:
            userinfo = f"{self.username or ''}:{self.password}" if self.password else ""
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        options = [q for q in (query, f"ssl_cert_reqs=required&ssl_ca_certs={self.tls['ca']}" if self.tls else "") if q]
        return (f"{scheme}://{userinfo + '@' if userinfo else ''}" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
                + f"/{SENTINEL_SERVICE}/0" + (f"?{'&'.join(options)}" if options else ""))

    def _tls_conf(self) -> list[str]:
        t = self.tls or {}
        return [f"tls-cert-file {t['cert']}", f"tls-key-file {t['key']}", f"tls-ca-cert-file {t['ca']}",
                "tls-auth-clients no", "tls-replication yes"] if self.tls else []

    def _sentinel_conf(self, port: int) -> str:
        svc = SENTINEL_SERVICE
        lines = [f"port {0 if self.tls else port}", *([f"tls-port {port}"] if self.tls else []), *self._tls_conf(),
                 "bind 127.0.0.1", f"dir {self.dir}",
                 f"sentinel monitor {svc} 127.0.0.1 {self.ports['a']} 2",
                 f"sentinel down-after-milliseconds {svc} {SENTINEL_DOWN_AFTER_MS}",
                 f"sentinel failover-timeout {svc} {SENTINEL_FAILOVER_TIMEOUT_MS}",
                 f"sentinel parallel-syncs {svc} 1"]
        if self.password:
            lines.append(f"sentinel auth-pass {svc} {self.password}")
        if self.username:
            lines.append(f"sentinel auth-user {svc} {self.username}")
        if self.sentinel_password:
            lines.append(f"requirepass {self.sentinel_password}")
        return "\n".join(lines) + "\n"

    def _server_extra(self) -> list[str]:
        """redis-server arguments of a data node of a secured set."""
        args: list[str] = []
        if self.password and self.username:
            args += ["--user", "default", "off", "--user", self.username, "on", f">{self.password}", "~*", "&*",
                     "+@all", "--masteruser", self.username, "--masterauth", self.password]
        elif self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        for line in self._tls_conf():
            key, value = line.split(" ", 1)
            args += [f"--{key}", value]
        return args

    def client(self, port: int, sentinel: bool = False, **kw) -> redis.Redis:
        """A plain redis-py client of one data node (or, with ``sentinel``, one Sentinel)
        of this set, with its credentials and TLS."""
        auth = ({"password": self.sentinel_password} if sentinel else
                {"username": self.username, "password": self.password})
        tls = {"ssl": True, "ssl_ca_certs": self.tls["ca"], "ssl_cert_reqs": "required"} if self.tls else {}
        return redis.Redis(host="127.0.0.1", port=port, **auth, **tls, **kw)

    def start_server(self, name: str, extra: list[str] | None = None) -> None:
        """Start server ``name`` ("a" or "b") on its port and directory (again, after a
        SIGKILL: the Sentinels then make it a replica of the current primary)."""
        d = self.dir / name
        d.mkdir(exist_ok=True)
        log = open(self.dir / f"server-{name}.log", "ab")
        port = self.ports[name]
        args = _server_args(port, str(d), self.appendfsync, [*self._server_extra(), *(extra or [])])
        if self.tls:  # the TLS port only
            args[args.index("--port") + 1] = "0"
            args += ["--tls-port", str(port)]
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.servers[name] = proc
        deadline = time.monotonic() + 10.0
        while True:
            if proc.poll() is not None:
                raise PortTaken(f"redis-server {name} exited at start with code {proc.returncode} "
                                f"(its port {port} taken by another process?)")
            try:
                with self.client(port, socket_timeout=0.2, socket_connect_timeout=0.2) as c:
                    if c.ping():  # ours, not another test's server that took the port first
                        pid = int(c.info("server")["process_id"])
                        if pid != proc.pid:
                            raise PortTaken(f"another redis-server (pid {pid}) answers on port {port}")
                        return
            except (redis.RedisError, OSError):
                if time.monotonic() > deadline:
                    raise StoreError(f"redis-server did not answer on port {port} within 10 s") from None
            time.sleep(0.02)

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
            with self.client(port, sentinel=True, socket_timeout=1.0) as s:
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
            with self.client(port, sentinel=True, socket_timeout=1.0, decode_responses=True) as s:
                m = s.sentinel_master(SENTINEL_SERVICE)
                if int(m["num-other-sentinels"]) != 2 or int(m["num-slaves"]) < 1:
                    return False
        other = "b" if name == "a" else "a"
        with self.client(self.ports[other], socket_timeout=1.0, decode_responses=True) as rep:
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
