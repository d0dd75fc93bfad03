"""The Celery broker: kombu's Redis transports, made to survive a Redis role change.

When a Redis primary becomes a replica (``REPLICAOF``, a Sentinel failover demoting it,
a managed service's maintenance) it ends every blocked ``BRPOP`` with the error
``UNBLOCKED force unblock from blocking operation, instance state changed``, and writes
answer ``READONLY``. kombu 5.7 takes both for channel errors (``redis.ResponseError``),
not connection errors: Celery's consumer does not reconnect, the worker logs
``Unrecoverable error: … UNBLOCKED`` and stops (kombu PR #2204 discusses the same
error). The transports here turn exactly those replies (and ``MASTERDOWN``, ``LOADING``) into
``redis.ConnectionError`` after dropping the socket (in the connection class, so every
command of the broker's clients is covered), so the consumer reconnects with
its usual backoff (to the same address, or, through Sentinel, to the new primary) and
resumes consuming. ``OOM`` (``maxmemory`` reached under ``noeviction``: every command
queued in a ``MULTI``, as kombu's ack is, and every write that may grow memory is
refused) is a transient refusal of the same kind: kombu 5.7 raised it from an ack inside
the event loop and the GPU worker stopped (``Unrecoverable error: OutOfMemoryError``;
found by the chaos runner's ``memory_pressure``); as a connection error the ack is
skipped (the message comes back after the visibility timeout, a no-op replay) and the
consumer reconnects until memory is freed. Any other ``ResponseError`` stays what it was.

:func:`broker_url` maps makespan's Redis URL to kombu's: ``redis://`` and ``rediss://``
(TLS: kombu reads the options from the URL and uses :class:`Channel`'s SSL connection
class) use :class:`Transport`, and so does ``unix:///path?db=N``, as kombu's
``redis+socket:///path?virtual_host=N``; ``redis+sentinel://[auth@]h1:p1,h2:p2/service/db`` becomes
``sentinel://[auth@]h1:p1/db;sentinel://[auth@]h2:p2/db`` with :class:`SentinelTransport` and the
service as kombu's ``master_name`` (:func:`sentinel_master`); the Sentinels' own AUTH
(``?sentinel_password=``) and, for ``rediss+sentinel://``, TLS go into kombu's transport
options and ``broker_use_ssl`` (:func:`makespan.celery_app.broker_transport_options`).
(``rediss://`` kept kombu's own transport once, so a TLS deployment had none of the fixes here.)
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlparse

import logging

import redis
from redis import sentinel as redis_sentinel
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from makespan.settings import is_sentinel_url, parse_sentinel_url

log = logging.getLogger("makespan.broker")

ROLE_CHANGE_REPLIES = ("UNBLOCKED", "READONLY", "MASTERDOWN")  # error prefixes redis-py keeps in the message


def out_of_memory(error: BaseException) -> bool:
    """True for Redis's ``OOM`` reply (``maxmemory`` reached under ``noeviction``): the
    write was refused, not applied, and may succeed once memory is freed."""
    return isinstance(error, redis.exceptions.OutOfMemoryError)


def role_change(error: BaseException) -> bool:
    """True for a Redis reply that means "this server is not (or no longer) a writable
    primary": the client should reconnect rather than give up. redis-py maps
    ``READONLY`` and ``MASTERDOWN`` to their own classes (and strips the prefix), and
    leaves ``UNBLOCKED`` a plain ``ResponseError`` with the prefix in its message."""
    if isinstance(error, (redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError)):
        return True
    return isinstance(error, redis.ResponseError) and str(error).split(" ", 1)[0] in ROLE_CHANGE_REPLIES


class _ReconnectOnRoleChange:
    """Connection mixin: a role-change reply (:func:`role_change`) or an ``OOM`` refusal
    (:func:`out_of_memory`) drops the socket and is raised as ``redis.ConnectionError``,
    on every command: a consumer's ``BRPOP``, the mutex of kombu's ``restore_visible``, an
    ack. A refused write was not applied, so kombu's reconnect and redis-py's retry may
    send it again."""

    def read_response(self, *args, **kwargs):
        try:
            return super().read_response(*args, **kwargs)
        except redis.ResponseError as e:
            if out_of_memory(e):
                self.disconnect()
                raise redis.ConnectionError(f"Redis refused a write, out of memory: {e}") from e
            if not role_change(e):
                raise
            self.disconnect()
            raise redis.ConnectionError(f"Redis role changed: {e}") from e


class RoleAwareConnection(_ReconnectOnRoleChange, redis.Connection):
    pass


class RoleAwareSSLConnection(_ReconnectOnRoleChange, redis.SSLConnection):
    pass


class RoleAwareSentinelConnection(_ReconnectOnRoleChange, redis_sentinel.SentinelManagedConnection):
    pass


class RoleAwareSentinelSSLConnection(_ReconnectOnRoleChange, redis_sentinel.SentinelManagedSSLConnection):
    pass


class QoS(kombu_redis.QoS):
    """An ack (or reject) whose Redis write fails on a lost connection (a role change, an
    outage) still frees its prefetch slot. kombu's own QoS skips the local bookkeeping
    when the write raises: with ``worker_prefetch_multiplier=1`` the consumer then never
    fetched again, alive but idle. The message stays in kombu's unacked index in Redis
    and comes back after the visibility timeout; every phase task is idempotent and
    fenced, so its replay is a no-op."""

    def ack(self, delivery_tag):
        try:
            self._remove_from_indices(delivery_tag).execute()
        except redis.ConnectionError as e:
            log.warning("ack of %s not written to Redis (%s): it is redelivered after the visibility timeout",
                        delivery_tag, e)
        virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag, requeue=False):
        try:
            super().reject(delivery_tag, requeue=requeue)
        except redis.ConnectionError as e:
            log.warning("reject of %s not written to Redis (%s)", delivery_tag, e)
            virtual.QoS.ack(self, delivery_tag)


class _ClosedTransportGuard:
    """Channel mixin: a channel whose transport was already closed (``client`` None) raises
    ``redis.ConnectionError`` when it needs a new Redis pool, not ``AttributeError``.

    In an outage Celery's consumer closes its broker connection
    (``on_connection_error_after_connected``); closing the channel restores its unacked
    messages (``restore_unacked_once``), which builds a client from the transport's
    ``client``: when that connection's transport had been closed already, kombu 5.7 raised
    ``AttributeError: 'NoneType' object has no attribute 'hostname'``, which is no
    connection error, so the worker stopped (``Unrecoverable error``; issue 18, failure 9,
    seen again in the chaos runner's ``redis_restart``). As a connection error it is
    ignored there and the consumer reconnects; the messages not restored now come back
    through kombu's visibility-timeout restore (every phase task is idempotent and fenced)."""

    def _connparams(self, asynchronous=False):
        if self.connection.client is None:
            raise redis.ConnectionError("the broker connection of this channel is closed")
        return super()._connparams(asynchronous=asynchronous)


class _ReusedClient:
    """Channel mixin: one Redis client object per connection pool, reused by every
    publish, ack and event of the channel (``conn_or_acquire``). kombu 5.7 builds a new
    ``redis.Redis`` (with its table of response callbacks) for each such command; on the
    shared pool that costs more CPU than the command (profiled in bench/RESULTS.md,
    "live path throughput"). Same pool, same connections: only the wrapper is kept. A
    client is thread-safe on its pool; the asynchronous (consumer) client is left to kombu."""

    def _create_client(self, asynchronous=False):
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        kept = getattr(self, "_reused_client", None)
        if kept is None or kept[0] is not pool:  # a new pool (reconnect): a client on it
            kept = (pool, super()._create_client())
            self._reused_client = kept
        return kept[1]


class Channel(_ReusedClient, _ClosedTransportGuard, kombu_redis.Channel):
    QoS = QoS
    connection_class = RoleAwareConnection
    connection_class_ssl = RoleAwareSSLConnection


def _supports_batch_publish(transport) -> bool:
    """kombu 5.7's ``Transport.supports_batch_publish``, reading ``transport.client`` once.

    kombu reads ``self.client`` twice; a connection closed by another thread in between
    (``Connection._do_close_transport`` sets ``client = None`` while a Redis outage makes
    Celery reset its connections) raised ``AttributeError: 'NoneType' object has no
    attribute 'hostname'`` from a publish, and a GPU worker died of it in a 60 s outage
    (issue 18, failure 9). A closed transport answers False: the publish goes out at
    once, fails as a connection error, and Celery's retry reconnects."""
    client = transport.client
    if client is None or not kombu_redis._batch_publish_retry_safe(client.transport_options):
        return False
    hostname = client.hostname or ""
    if "://" not in hostname:
        return True
    *_, query = kombu_redis._parse_url(hostname)
    return kombu_redis._batch_publish_retry_safe(query)


class Transport(kombu_redis.Transport):
    Channel = Channel

    @property
    def supports_batch_publish(self) -> bool:
        return _supports_batch_publish(self)


class SentinelChannel(_ReusedClient, _ClosedTransportGuard, kombu_redis.SentinelChannel):
    QoS = QoS
    connection_class = RoleAwareSentinelConnection
    connection_class_ssl = RoleAwareSentinelSSLConnection

    def _sentinel_managed_pool(self, asynchronous=False):
        """kombu's pool, its ``Sentinel`` made a :class:`makespan.redis_conn.ExplainedSentinel`
        (which only replaces ``discover_master``): "no master found" then says why in one
        line (no Sentinel answered, no such service, a refused AUTH) instead of the multi-KB
        repr of each Sentinel's client that Celery logged on every reconnect."""
        from makespan.redis_conn import ExplainedSentinel

        pool = super()._sentinel_managed_pool(asynchronous)
        manager = getattr(pool, "sentinel_manager", None)
        if type(manager) is redis_sentinel.Sentinel:
            manager.__class__ = ExplainedSentinel
        return pool


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel

    @property
    def supports_batch_publish(self) -> bool:
        return _supports_batch_publish(self)


def broker_url(redis_url: str) -> tuple[str, str | None]:
    """kombu's broker URL and transport (a class path, None for kombu's default) for
    makespan's ``redis_url`` (see the module doc)."""
    u = urlparse(redis_url)
    if u.scheme in ("redis", "rediss"):
        query = parse_qsl(u.query)
        db = [v for k, v in query if k == "db"]
        if db:  # redis-py's ?db=N (it wins over the path): kombu's database is the path
            rest = "&".join(f"{k}={v}" for k, v in query if k != "db")
            redis_url = u._replace(path=f"/{db[-1]}", query=rest).geturl()
        return redis_url, "makespan.broker:Transport"
    if u.scheme == "unix":  # kombu's name for a Unix socket, the database as its virtual host
        query = dict(parse_qsl(u.query))
        db = query.pop("db", "0")
        rest = "".join(f"&{k}={v}" for k, v in query.items())
        return f"redis+socket://{u.path}?virtual_host={db}{rest}", "makespan.broker:Transport"
    if is_sentinel_url(redis_url):
        parsed = parse_sentinel_url(redis_url, "redis_url")
        auth = f"{parsed.userinfo}@" if parsed.userinfo else ""  # the data nodes' AUTH (kombu's master_for)
        return (";".join(f"sentinel://{auth}{host}:{port}/{parsed.db}" for host, port in parsed.hosts),
                "makespan.broker:SentinelTransport")
    return redis_url, None


def sentinel_master(redis_url: str) -> str | None:
    """The Sentinel service name of a Sentinel URL (kombu's ``master_name``); None for
    another URL."""
    return parse_sentinel_url(redis_url, "redis_url").service_name if is_sentinel_url(redis_url) else None
