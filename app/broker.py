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
import os
import threading
from queue import Empty
from time import monotonic, time

import redis
from redis import sentinel as redis_sentinel
from kombu.asynchronous import get_event_loop
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

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
    """kombu's Redis QoS with three changes.

    **An ack (or reject) whose Redis write fails on a lost connection** (a role change, an
    outage) still frees its prefetch slot. kombu's own QoS skips the local bookkeeping
    when the write raises: with ``worker_prefetch_multiplier=1`` the consumer then never
    fetched again, alive but idle. The message stays in kombu's unacked index in Redis
    and comes back after the visibility timeout; every phase task is idempotent and
    fenced, so its replay is a no-op.

    **Acks on the event loop's thread are written by another thread.** Celery's worker
    acks on its event loop (the consumer's thread); kombu writes each ack as its own
    ``MULTI`` (``ZREM`` + ``HDEL`` of the unacked index), a round trip during which the
    loop neither reads nor dispatches the next message. Such an ack frees its prefetch slot
    at once and hands its tag to the channel's :class:`_AckWriter`, which writes every tag
    handed to it since its last write in one ``MULTI``; the channel's close writes what is
    left. A worker killed in between leaves the tag in the index: the message comes back
    after the visibility timeout, as after a failed ack write above. An ack from any other
    thread is written at once, as kombu does.

    **Unacked records of a multi-message pop are written together**
    (:meth:`record_unacked`, called by :class:`_ManyPerPop` before it delivers the
    messages), so :meth:`append` keeps only the local bookkeeping for those tags.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ack_writer: _AckWriter | None = None
        self._recorded: set[str] = set()

    def append(self, message, delivery_tag):
        if delivery_tag in self._recorded:  # its unacked record is written (record_unacked)
            self._recorded.discard(delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)
            return
        super().append(message, delivery_tag)

    def record_unacked(self, payloads: list[dict], give_back: tuple[str, list[bytes]] | None = None) -> None:
        """Write the unacked records (index score and message, as kombu's ``append``
        writes them) of ``payloads`` (raw messages, already popped) in one ``MULTI``;
        their :meth:`append` then writes nothing. ``give_back`` (a list key and raw
        messages popped from it, in the order popped) are pushed back to that list's right
        end in the same ``MULTI``, the first of them rightmost: popped next, as before.

        Raises:
            redis.ConnectionError: the write failed (the caller's read fails as a
                ``BRPOP`` read does, and the consumer reconnects).
        """
        now = time()
        index: dict[str, float] = {}
        records: dict[str, str] = {}
        for payload in payloads:
            properties = payload["properties"]
            tag = properties["delivery_tag"]
            info = properties.get("delivery_info") or {}
            index[tag] = now
            records[tag] = dumps([payload, info.get("exchange"), info.get("routing_key")])
        with self.pipe_or_acquire() as pipe:
            if index:
                pipe.zadd(self.unacked_index_key, index).hset(self.unacked_key, mapping=records)
            if give_back and give_back[1]:
                pipe.rpush(give_back[0], *reversed(give_back[1]))
            pipe.execute()
        self._recorded.update(index)

    def ack(self, delivery_tag):
        if _on_event_loop_thread():
            writer = self._ack_writer
            if writer is None or writer.pid != os.getpid():  # none yet, or inherited through a fork
                writer = self._ack_writer = _AckWriter(self.write_acks)
            if writer.add(delivery_tag):
                virtual.QoS.ack(self, delivery_tag)
                return
            # the channel closed (its writer stopped): written at once, as below
        try:
            self._remove_from_indices(delivery_tag).execute()
        except redis.ConnectionError as e:
            log.warning("ack of %s not written to Redis (%s): it is redelivered after the visibility timeout",
                        delivery_tag, e)
        virtual.QoS.ack(self, delivery_tag)

    def write_acks(self, tags: list[str]) -> None:
        """Remove ``tags`` from the unacked index in one ``MULTI``; a connection error is
        tried once more: a connection closed under the write (the channel closing at a
        worker's shutdown while its last acks are written: "Bad file descriptor") is a new
        one the second time, and removing a tag twice is harmless. A Redis error that stays
        is logged: those messages come back after the visibility timeout, and their replay
        is a no-op."""
        for tries_left in (1, 0):
            try:
                with self.pipe_or_acquire() as pipe:
                    pipe.zrem(self.unacked_index_key, *tags).hdel(self.unacked_key, *tags).execute()
                return
            except redis.ConnectionError as e:
                if tries_left:
                    continue
                error: redis.RedisError = e
            except redis.RedisError as e:
                error = e
            log.warning("%d acks not written to Redis (%s): those messages are redelivered after the visibility "
                        "timeout", len(tags), error)
            return

    def reject(self, delivery_tag, requeue=False):
        try:
            super().reject(delivery_tag, requeue=requeue)
        except redis.ConnectionError as e:
            log.warning("reject of %s not written to Redis (%s)", delivery_tag, e)
            virtual.QoS.ack(self, delivery_tag)

    def restore_unacked_once(self, stderr=None):
        writer = self._ack_writer
        if writer is not None:
            writer.stop()  # writes what it holds
        return super().restore_unacked_once(stderr)


def _on_event_loop_thread() -> bool:
    """Whether this thread runs kombu's event loop (the hub of Celery's consumer)."""
    hub = get_event_loop()
    return hub is not None and getattr(hub, "_loop_thread", None) == threading.get_ident()


class _AckWriter:
    """A daemon thread that writes the acks handed to it (:meth:`add`) with ``write`` (a
    list of delivery tags per call): all tags handed over since its last write, in one
    call. :meth:`stop` writes what is left and ends the thread."""

    def __init__(self, write) -> None:
        self._write = write
        self.pid = os.getpid()  # a forked child has no such thread: its QoS starts its own
        self._lock = threading.Lock()
        self._tags: list[str] = []
        self._wanted = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="makespan-ack-writer", daemon=True)
        self._thread.start()

    def add(self, tag: str) -> bool:
        """Hand ``tag`` over; False once :meth:`stop` was called (the caller writes it)."""
        with self._lock:
            if self._stopping:
                return False
            self._tags.append(tag)
        self._wanted.set()
        return True

    def _take(self) -> list[str]:
        with self._lock:
            tags, self._tags = self._tags, []
        return tags

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._stopping = True
        self._wanted.set()
        self._thread.join(timeout_s)
        tags = self._take()  # a thread that did not end in time, or tags added after its last turn
        if tags:
            self._write(tags)

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            tags = self._take()
            if tags:
                try:
                    self._write(tags)
                except Exception as e:  # noqa: BLE001 - the thread must outlive one bad write
                    log.error("writing %d acks failed: %r; those messages are redelivered after the visibility "
                              "timeout", len(tags), e)
            if self._stopping:
                return


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


class _ManyPerPop:
    """Channel mixin: the consumer pops as many messages as its prefetch credit allows in
    one round trip (``BLMPOP … RIGHT COUNT credit``, Redis ≥ 7.0), not one per ``BRPOP``.

    A GPU worker's messages come in bursts (a planner tick leases several GPUs of a host
    at once); popped one by one, each costs the event loop a round trip and, on a busy
    host, a wait for the GIL, and the last one of a burst waited for all the others
    (``bench/RESULTS.md``, "The consumer pops a burst"). The same queues (priority steps
    included) in the same order, from the right end as ``BRPOP``; the unacked records of
    the popped messages are written in one ``MULTI`` (:meth:`QoS.record_unacked`) before
    they are delivered, so a message is in the unacked index before its task runs, as
    with kombu. With a credit of 1 (``prefetch 1``, concurrency 1), no prefetch limit,
    a queue consumed without acks, or a server older than 7.0, it is kombu's ``BRPOP``.

    A pop takes several messages where ``BRPOP`` took one, so its read keeps kombu's
    limits message by message: what is over the credit when the reply is read (Celery
    lowered its prefetch meanwhile) goes back to the head of its list in the records'
    ``MULTI``; an undecodable message raises as from ``BRPOP``, after the others are
    delivered; and when a delivery raises, the messages behind it go back to the head of
    their queue (:meth:`_give_back`) instead of waiting in the unacked index for the
    visibility timeout. Still wider than ``BRPOP``: a refused records write (``OOM``, a
    lost connection) loses every message of the pop, not one. Each such message is a
    phase chain of a leased job, so the job itself is not lost: its lease is never
    renewed, expires (``lease_ttl_s``) and the reaper requeues the job, as after any
    message lost with a worker.
    """

    _pops_many: bool | None = None  # the server has BLMPOP (checked once per channel)
    _popping_many = False  # the command in flight is a BLMPOP

    def basic_consume(self, queue, no_ack, *args, **kwargs):
        tag = super().basic_consume(queue, no_ack, *args, **kwargs)
        if no_ack:
            self._no_ack_queues = {*getattr(self, "_no_ack_queues", ()), queue}
        return tag

    def _credit(self) -> int:
        qos = self.qos
        if not qos.prefetch_count or any(q in getattr(self, "_no_ack_queues", ()) for q in self.active_queues):
            return 1
        return qos.prefetch_count - (len(qos._delivered) - len(qos._dirty))

    def _server_pops_many(self) -> bool:
        if self._pops_many is None:
            try:
                version = self._create_client().info("server").get("redis_version", "0")
            except redis.ConnectionError:
                return False  # asked again at the next pop
            except redis.RedisError:  # INFO refused (an ACL without it): BRPOP from now on
                version = "0"
            self._pops_many = int(str(version).split(".", 1)[0]) >= 7
        return self._pops_many

    def _brpop_start(self, timeout=None):
        credit = self._credit()
        self._popping_many = credit > 1 and self._server_pops_many()
        if not self._popping_many:
            return super()._brpop_start(timeout)
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        keys = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()
        if self.global_keyprefix:  # kombu's prefixing client does not know BLMPOP's arguments
            keys = [self.global_keyprefix + key for key in keys]
        self.client.connection.send_command("BLMPOP", timeout or 0, len(keys), *keys, "RIGHT", "COUNT", credit)

    def _brpop_read(self, **options):
        if not self._popping_many:
            return super()._brpop_read(**options)
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "BLMPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # reconnects at the next pop, as kombu's BRPOP read does
                raise
            if not reply:
                raise Empty()
            key, items = reply
            key = bytes_to_str(key)
            if self.global_keyprefix and key.startswith(self.global_keyprefix):
                key = key[len(self.global_keyprefix):]
            queue = key.rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(queue)
            popped: list[tuple[bytes, dict]] = []
            error: Exception | None = None
            for item in items:
                try:
                    payload = loads(bytes_to_str(item))
                    payload["properties"]["delivery_tag"]
                except Exception as e:  # noqa: BLE001 - raised below, as kombu's BRPOP read raises it
                    error = error or e
                    continue
                popped.append((item, payload))
            # a credit lowered while the pop waited (Celery's basic_qos): the rest goes back, next in line
            credit = max(self._credit(), 0) if self.qos.prefetch_count else len(popped)
            payloads = [payload for _, payload in popped[:credit]]
            self.qos.record_unacked(payloads, (key, [item for item, _ in popped[credit:]]))
            for i, payload in enumerate(payloads):
                try:
                    self.connection._deliver(payload, queue)
                except BaseException:
                    self._give_back(payloads[i:])
                    raise
            if error is not None:
                raise error
            if not payloads:
                raise Empty()
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    def _give_back(self, payloads: list[dict]) -> None:
        """Put back at the head of their queue, in order, the messages of ``payloads`` whose
        unacked record is written but that the consumer never got (a delivery before them
        raised): kombu restores only what it delivered, and these would wait for the
        visibility timeout. A failed write leaves them to that timeout."""
        qos = self.qos
        for payload in reversed(payloads):
            tag = payload["properties"]["delivery_tag"]
            if tag in qos._delivered:
                continue  # delivered: the channel's close restores it, as kombu does
            qos._recorded.discard(tag)
            try:
                # kombu's leftmost=False is an RPUSH: the right end, which the pops read first
                # (leftmost=True would put it behind the whole queue); last to first keeps the order
                qos.restore_by_tag(tag, leftmost=False)
            except redis.RedisError as e:
                log.warning("message %s not given back to its queue (%s): it comes back after the visibility "
                            "timeout", tag, e)


class Channel(_ManyPerPop, _ReusedClient, _ClosedTransportGuard, kombu_redis.Channel):
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


class SentinelChannel(_ManyPerPop, _ReusedClient, _ClosedTransportGuard, kombu_redis.SentinelChannel):
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
