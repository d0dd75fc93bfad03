"""The Celery application: JSON only, late acks, prefetch 1, strict queue order.

Celery's keys live under ``{key_prefix}:celery:`` (kombu ``global_keyprefix``), so
several makespan deployments (or tests) share one Redis without seeing each other.
Each GPU host has its own queue ``gpu.{host}``; its worker consumes only that queue.

A GPU worker process serves the app :mod:`makespan.workers.tasks` builds from its
environment (``Settings.from_env()``); the planner publishes through an app of its own
settings (:func:`makespan.workers.publish.publisher`), so an in-process planner built for
another Redis or key prefix never writes to the environment's.
"""

from __future__ import annotations

from celery import Celery

from makespan.keys import Keys
from makespan.settings import Settings, is_sentinel_url, parse_sentinel_url

# An acks_late task still running past the visibility timeout is delivered again.
# Phase tasks are idempotent and fenced, and a lost worker is recovered through lease
# expiry (not redelivery), so a long timeout (settings.broker_visibility_timeout_s,
# default 6 h) only bounds how long a stale message lingers. makespan sends no
# countdown/eta messages: delayed jobs and retry backoffs wait in Redis (makespan.workers.delayed).
# There is no result backend (task_ignore_result, result_backend None): results live in
# makespan's own keys, written through makespan.redis_conn.connect clients.


def create_celery(settings: Settings) -> Celery:
    """A Celery app bound to ``settings.redis_url`` and ``settings.key_prefix``."""
    from makespan.workers import startup_checks  # noqa: F401 - its worker_init check (evicting Redis)

    from makespan.broker import broker_url

    keys = Keys(settings.key_prefix)
    url, transport = broker_url(settings.redis_url)  # role changes reconnect (makespan.broker)
    app = Celery("makespan", broker=url, include=["makespan.workers.tasks"])
    if transport:
        # kombu takes the transport from the URL's scheme, the part before a '+' for
        # redis+socket:// (a Unix socket)
        scheme = url.split(";")[0].split("://")[0].split("+")[0]
        if scheme in ("redis", "rediss", "sentinel"):
            # kombu's own alias for the scheme now names makespan's transport: the broker URL
            # keeps its scheme, so Flower (which picks its broker client by scheme) and
            # `celery -A` tools still read the queues
            from kombu.transport import TRANSPORT_ALIASES

            TRANSPORT_ALIASES[scheme] = transport
        else:
            app.conf.broker_transport = transport
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_accept_content=["json"],
        event_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=settings.redis_connect_timeout_s,
        broker_transport_options=broker_transport_options(settings),
        task_default_queue="gpu.default",
        worker_send_task_events=True,
        worker_consumer="makespan.celery_consumer:Consumer",  # task events published off the event loop
        task_send_sent_event=True,
    )
    tls = broker_use_ssl(settings)
    if tls:  # rediss+sentinel://: the primary's connections (the Sentinels' are in the transport options)
        app.conf.broker_use_ssl = tls
    hosts = _fleet_hosts()
    if hosts:  # declare every host queue, so that Flower lists them before any worker runs
        from kombu import Queue

        app.conf.task_queues = [Queue("gpu.default")] + [Queue(keys.host_queue(h)) for h in hosts]
    return app


def broker_transport_options(settings: Settings) -> dict:
    """kombu Redis transport options: makespan's key prefix, visibility timeout and strict
    queue order, and the same connection bounds as every makespan Redis client
    (:func:`makespan.redis_conn.client_options`): a publish or a consume on a half-open
    connection raises after ``settings.redis_socket_timeout_s`` (kombu then reconnects)
    instead of blocking forever. ``retry_on_timeout`` stays off: a publish retried after a
    timeout could be delivered twice (phase tasks are fenced, but a retry is kombu's job,
    through its reconnect)."""
    from makespan.broker import sentinel_master
    from makespan.redis_conn import client_options, sentinel_auth, sentinel_tls_options

    keys = Keys(settings.key_prefix)
    opts = {
        "global_keyprefix": keys.celery_prefix,
        "visibility_timeout": settings.broker_visibility_timeout_s,
        "queue_order_strategy": "priority",
        **client_options(settings),
        "retry_on_timeout": False,
    }
    master = sentinel_master(settings.redis_url)
    if master:  # kombu's Sentinel transport: the service name; towards each Sentinel the same bounds,
        # the Sentinels' own AUTH (kombu gives them none of the URL's) and TLS
        parsed = parse_sentinel_url(settings.redis_url)
        opts["master_name"] = master
        opts["sentinel_kwargs"] = {**{k: v for k, v in client_options(settings).items() if k != "health_check_interval"},
                                   **sentinel_auth(parsed), **sentinel_tls_options(parsed)}
    return opts


def broker_use_ssl(settings: Settings) -> dict | None:
    """Celery's ``broker_use_ssl`` for a ``rediss+sentinel://`` URL: the ``ssl_*`` options
    of the primary's connections (kombu's Sentinel transport then uses
    :class:`makespan.broker.RoleAwareSentinelSSLConnection`); None for any other URL
    (``rediss://`` carries its options in the broker URL)."""
    from makespan.redis_conn import sentinel_tls_options

    if not is_sentinel_url(settings.redis_url):
        return None
    tls = sentinel_tls_options(parse_sentinel_url(settings.redis_url))
    return {k: v for k, v in tls.items() if k != "ssl"} or None


def _fleet_hosts() -> list[str]:
    """Host names of the fleet file named by ``MAKESPAN_FLEET`` (none when unset or unreadable)."""
    import os

    path = os.environ.get("MAKESPAN_FLEET")
    if not path:
        return []
    from makespan.errors import ValidationError
    from makespan.models import load_fleet

    try:
        return [h.name for h in load_fleet(path).hosts]
    except ValidationError:
        return []
