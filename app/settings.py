"""Process settings, read once from the environment (``MAKESPAN_*``).

Every duration is in seconds and says so in its name. Defaults suit one machine;
docs/configuration.md lists every variable.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from makespan.errors import ValidationError
from makespan.planner.policies import DEFAULT_POLICY, POLICY_REGISTRY

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# The fast lane's defaults (Settings.fast_lane / fast_lane_start), as
# makespan.planner.fast_lane.DEFAULT_LANE_LEVELS / DEFAULT_START_GRACE hold them (a test checks both agree).
DEFAULT_FAST_LANE = "CRITICAL,HIGH:1.25"
DEFAULT_FAST_LANE_START = "CRITICAL:30,HIGH:30/x1.4"
IMPROVER_EXECUTORS = ("process", "thread")  # Settings.improver_executor; the first is the default
IMPROVER_NICE_MAX = 19  # the most niceness a process can add on Linux
MAX_PAYLOAD_BYTES_CAP = 64 * 1024 * 1024  # MAKESPAN_MAX_PAYLOAD_BYTES at most: the job record holds it, read whole
MAX_DEPENDS_ON_CAP = 1_000_000  # MAKESPAN_MAX_DEPENDS_ON at most: one submit script reads each dependency
COUNT_MAX = 10**9  # the largest count setting (batch size, attempts, retention, events) taken from the environment


def _env_int(name: str, default: int, lo: int, hi: int) -> int:
    """A ``MAKESPAN_*`` whole number in [``lo``, ``hi``] (unset or empty: ``default``).

    Raises:
        ValidationError: not a whole number, or out of range."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as e:
        raise ValidationError(name, raw, "must be a whole number") from e
    if not lo <= value <= hi:
        raise ValidationError(name, raw, f"must be between {lo} and {hi}")
    return value


def _env_choice(name: str, choices: tuple[str, ...]) -> str:
    """A ``MAKESPAN_*`` value among ``choices`` (unset or empty: the first).

    Raises:
        ValidationError: any other value."""
    raw = os.environ.get(name) or choices[0]
    if raw not in choices:
        raise ValidationError(name, raw, f"must be one of {', '.join(choices)}")
    return raw


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")  # MAKESPAN_LOG_LEVEL's values


def log_level_from_env(default: str) -> str:
    """``MAKESPAN_LOG_LEVEL`` in upper case, one of :data:`LOG_LEVELS` (any case is taken:
    Python's logging wants upper case, Celery's ``--loglevel`` either; unset or empty:
    ``default``). Read by every process's command (planner, GPU worker, observer).

    Raises:
        ValidationError: another value."""
    raw = os.environ.get("MAKESPAN_LOG_LEVEL", "").strip()
    level = raw.upper() or default
    if level not in LOG_LEVELS:
        raise ValidationError("MAKESPAN_LOG_LEVEL", raw, f"must be one of {', '.join(LOG_LEVELS)}")
    return level


EVENTS_WRITE_TRIM_FACTOR = 10  # a write trims the events stream only past this × its process's cap


def events_max_len_from_env() -> int:
    """``MAKESPAN_EVENTS_MAX_LEN`` as this process's environment sets it (the events stream's
    cap, :attr:`Settings.events_max_len`); its default, 50,000, when unset or not a whole
    number in range (the process's own :meth:`Settings.from_env` refuses such a value
    loudly).

    The cap is the planner's: its retention sweep trims the stream to it. Every other write
    trims only past :data:`EVENTS_WRITE_TRIM_FACTOR` × its own process's cap, a bound for
    when no planner runs: a writer with the built-in default (a submit script, a CLI without
    the variable) trimmed a deployment's 100,000 to 50,000 (an SRE's check, then a
    verifier's)."""
    try:
        return _env_int("MAKESPAN_EVENTS_MAX_LEN", 50_000, 1, COUNT_MAX)
    except ValidationError:
        return 50_000


def metrics_port_from_env() -> int:
    """``MAKESPAN_METRICS_PORT``: the TCP port of a process's ``/metrics`` server, 0 (the
    default, also when unset or empty) for none.

    Raises:
        ValidationError: not a whole number in 0..65535."""
    return _env_int("MAKESPAN_METRICS_PORT", 0, 0, 65535)


PREEMPTION_MODES = ("plan", "rule")  # Settings.preemption; the first is the default


def check_policy(name: str, field_name: str = "MAKESPAN_POLICY") -> str:
    """``name`` when it names a policy of :data:`makespan.planner.policies.POLICY_REGISTRY`.

    Raises:
        ValidationError: any other name (``field_name`` is the field; the reason lists
            the known names)."""
    if name not in POLICY_REGISTRY:
        raise ValidationError(field_name, name, f"unknown policy; known: {', '.join(POLICY_REGISTRY.names())}")
    return name

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")  # the second: TLS to the Sentinels and the data nodes
REDIS_URL_SCHEMES = ("redis", "rediss", "unix", *SENTINEL_SCHEMES)
SENTINEL_DEFAULT_PORT = 26379
SENTINEL_AUTH_OPTIONS = ("sentinel_username", "sentinel_password")  # a Sentinel URL's query: the Sentinels' own AUTH


@dataclass(frozen=True)
class SentinelURL:
    """A ``redis+sentinel://`` or ``rediss+sentinel://`` URL taken apart
    (:func:`parse_sentinel_url`). Credentials are percent-decoded.

    Attributes:
        hosts: the Sentinels, ``(host, port)``.
        service_name: the monitored primary's name (redis-py's ``service_name``, kombu's
            ``master_name``).
        db: the database number.
        username, password: the data nodes' (primary's, replicas') AUTH, from the URL's
            ``[user]:password@``; None where absent.
        sentinel_username, sentinel_password: the Sentinels' own AUTH (``requirepass`` or
            an ACL user in sentinel.conf), from ``?sentinel_username=``/``?sentinel_password=``;
            None where absent (the Sentinels are asked without AUTH).
        tls: ``rediss+sentinel://``: TLS to the Sentinels and to the data nodes.
        ssl_options: the ``ssl_*`` query options as written (strings), for both.
        userinfo: the URL's ``[user]:password`` as written (still percent-encoded), "" without.
    """

    hosts: tuple[tuple[str, int], ...]
    service_name: str
    db: int
    username: str | None
    password: str | None
    sentinel_username: str | None
    sentinel_password: str | None
    tls: bool
    ssl_options: tuple[tuple[str, str], ...]
    userinfo: str


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names a Sentinel set (``redis+sentinel://`` or ``rediss+sentinel://``)."""
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str, field_name: str = "MAKESPAN_REDIS_URL") -> SentinelURL:
    """Take apart ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db][?options]``
    (``rediss+sentinel://`` for TLS): the one parser of Sentinel URLs, read by makespan's
    clients (:func:`makespan.redis_conn.connect`) and the Celery broker
    (:mod:`makespan.broker`, :func:`makespan.celery_app.broker_transport_options`) alike.

    The userinfo authenticates to the primary and replicas, as in a ``redis://`` URL and
    in kombu's ``sentinel://:password@host``; the Sentinels get no AUTH unless the query
    names theirs: ``sentinel_password`` (and ``sentinel_username`` for an ACL user), what
    redis-py and kombu take as ``sentinel_kwargs``. Where both use one password, give it
    twice. The query may also hold ``db`` (wins over the path, as redis-py's does) and,
    for ``rediss+sentinel://``, the ``ssl_*`` options (``ssl_cert_reqs``, ``ssl_ca_certs``,
    ...), which apply to the Sentinels and the data nodes both.

    Raises:
        ValidationError: not a Sentinel scheme, a Sentinel without a host, a port that is
            not a number in 1..65535, no service name, a path longer than
            ``/service_name/db``, a database that is not a whole number, or another query
            option (the value shown has its passwords hidden)."""
    from urllib.parse import parse_qsl, unquote, urlparse

    shown = redacted_url(url)
    u = urlparse(url)
    if u.scheme not in SENTINEL_SCHEMES:
        raise ValidationError(field_name, shown, "a Sentinel URL starts redis+sentinel:// or rediss+sentinel://")
    userinfo, _, hostpart = u.netloc.rpartition("@")
    hosts = []
    for part in hostpart.split(","):
        host, _, port = part.partition(":")
        if not host.strip():
            raise ValidationError(field_name, shown, "every Sentinel needs a host (host[:port], comma-separated)")
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValidationError(field_name, shown, f"Sentinel port {port!r} must be a whole number 1..65535")
        hosts.append((host, int(port or SENTINEL_DEFAULT_PORT)))
    path = [p for p in u.path.split("/") if p]
    if not path:
        raise ValidationError(field_name, shown, "a Sentinel URL needs /service_name[/db]")
    if len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValidationError(field_name, shown, "a Sentinel URL's path is /service_name[/db], db a whole number")
    db = int(path[1]) if len(path) == 2 else 0
    tls = u.scheme == "rediss+sentinel"
    auth: dict[str, str] = {}
    ssl: list[tuple[str, str]] = []
    for key, value in parse_qsl(u.query, keep_blank_values=True):
        if key == "db":
            if not value.isdigit():
                raise ValidationError(field_name, shown, "db must be a whole number")
            db = int(value)
        elif key in SENTINEL_AUTH_OPTIONS:
            auth[key] = value
        elif key.startswith("ssl_") and tls:
            ssl.append((key, value))
        else:
            raise ValidationError(field_name, shown,
                                  f"option {key!r}: a Sentinel URL's query may hold db, sentinel_username, "
                                  "sentinel_password and, for rediss+sentinel://, the ssl_* options; timeouts "
                                  "and keepalive are the MAKESPAN_REDIS_*_S settings")
    user, has_password, password = userinfo.partition(":")
    return SentinelURL(hosts=tuple(hosts), service_name=path[0], db=db, username=unquote(user) or None,
                       password=unquote(password) if has_password and password else None,
                       sentinel_username=auth.get("sentinel_username") or None,
                       sentinel_password=auth.get("sentinel_password") or None,
                       tls=tls, ssl_options=tuple(ssl), userinfo=userinfo)


def check_redis_url(url: str, field_name: str = "MAKESPAN_REDIS_URL") -> str:
    """``url`` when it is a Redis URL makespan's clients and the Celery broker both read
    alike: ``redis://`` / ``rediss://`` ``[user:password@]host[:port][/db]``, ``unix:///path``
    or ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db]``
    (``rediss+sentinel://`` for TLS; the Sentinels' own password as ``?sentinel_password=``,
    see :func:`parse_sentinel_url`) (ports 1..65535, a Sentinel's default 26379; ``db`` a
    whole number, also as ``?db=N``; the query holds nothing else but, for ``rediss://``,
    the ``ssl_*`` options: kombu takes no other). redis-py alone quietly took a database
    that is not a number as 0, and took connection options in the query, where kombu
    refused both.

    Raises:
        ValidationError: another scheme, a port or database that is not a number, a
            Sentinel URL without hosts or service name, or with more path than
            ``/service_name/db`` (the passwords are not shown)."""
    from urllib.parse import parse_qsl, urlparse

    shown = redacted_url(url)
    try:
        u = urlparse(url)
        if u.scheme not in SENTINEL_SCHEMES:  # (a Sentinel URL's host list is checked by parse_sentinel_url)
            u.port  # noqa: B018 - parses the host part: a malformed one raises here, not in a client later
    except ValueError as e:  # e.g. "Invalid IPv6 URL" for an unclosed [ (a traceback before)
        raise ValidationError(field_name, shown, f"not a valid URL ({e})") from None
    if u.scheme not in REDIS_URL_SCHEMES:
        raise ValidationError(field_name, shown, "scheme must be redis://, rediss://, unix://, redis+sentinel:// "
                                                 "or rediss+sentinel://")
    if u.scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url, field_name)
        return url
    path = [p for p in u.path.split("/") if p]
    for key, value in parse_qsl(u.query, keep_blank_values=True):
        if key == "db":
            if not value.isdigit():
                raise ValidationError(field_name, shown, "db must be a whole number")
        elif not (key.startswith("ssl_") and u.scheme == "rediss"):
            raise ValidationError(field_name, shown,
                                  f"option {key!r}: the query may hold db and, for rediss://, the ssl_* "
                                  "options (the Celery broker takes no other); timeouts and keepalive are "
                                  "the MAKESPAN_REDIS_*_S settings")
    if u.scheme == "unix":
        if not u.path:
            raise ValidationError(field_name, shown, "a unix:// URL needs the socket's path (unix:///path/redis.sock)")
        return url
    try:
        u.port  # noqa: B018 - urlparse checks the port only when asked
    except ValueError as e:
        raise ValidationError(field_name, shown, "the port must be a whole number 1..65535") from e
    if len(path) > 1 or (path and not path[0].isdigit()):
        raise ValidationError(field_name, shown, "the path must be the database number (/0)")
    return url


_SECRET_QUERY_OPTION = re.compile(r"([?&][^=&#]*password=)[^&#]*", re.IGNORECASE)  # its value is hidden


def redacted_url(url: str) -> str:
    """``url`` with every password replaced by ``***`` (for errors, logs and spans): the
    userinfo's, and the value of any query option whose name ends in ``password``
    (``sentinel_password``, ``ssl_password``). A userinfo urlparse cannot find (a ``/``,
    ``?`` or ``#`` in the password that is not percent-encoded ends its netloc before the
    ``@``; a ``[`` makes it raise) is hidden whole: everything up to the last ``@``; so is a
    userinfo without a colon (``redis://SECRET@host``: a password written without its
    leading colon, which redis-py sends as a user name)."""
    from urllib.parse import urlparse

    hidden = _SECRET_QUERY_OPTION.sub(lambda m: m.group(1) + "***", url)
    try:
        u = urlparse(url)
        netloc, password = u.netloc, u.password
    except ValueError:  # a netloc urlparse cannot split
        netloc, password = "", None
    scheme, sep, rest = hidden.partition("://")
    if sep and "@" not in netloc and "@" in rest:  # the userinfo ran past what urlparse took as the host
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    if password:
        return hidden.replace(f":{password}@", ":***@")
    if "@" in netloc and ":" not in netloc.rpartition("@")[0]:  # redis://SECRET@host: the password
        return f"{scheme}://***@{rest.partition('@')[2]}"  # written without its colon (a user name to redis-py)
    return hidden


# Bounds on every Redis connection (redis-py clients and kombu's broker), in seconds.
DEFAULT_REDIS_SOCKET_TIMEOUT_S = 5.0
DEFAULT_REDIS_CONNECT_TIMEOUT_S = 5.0
DEFAULT_REDIS_KEEPALIVE_IDLE_S = 10.0
# kombu's default is 25 s: a GPU worker's consumer on a half-open connection stayed deaf for up
# to 1 + 2 x 25 = 51 s while its host still looked live. With 4 s it is back within 9 s, before a
# lease of the default 10 s TTL expires.
DEFAULT_REDIS_HEALTH_CHECK_INTERVAL_S = 4.0
REDIS_KEEPALIVE_PROBES = 3  # unanswered TCP keepalive probes before the kernel drops a connection


def redis_bounds_from_env() -> dict[str, float]:
    """The Redis connection bounds of :class:`Settings` from ``MAKESPAN_REDIS_*_S``
    (``redis_socket_timeout_s``, ``redis_connect_timeout_s``, ``redis_keepalive_idle_s``,
    ``redis_health_check_interval_s``; seconds). Read alone by
    :func:`makespan.redis_conn.connect`, which is called without settings.

    Raises:
        ValidationError: a value that is not a positive finite number."""
    return {
        "redis_socket_timeout_s": _env_float("MAKESPAN_REDIS_SOCKET_TIMEOUT_S", DEFAULT_REDIS_SOCKET_TIMEOUT_S),
        "redis_connect_timeout_s": _env_float("MAKESPAN_REDIS_CONNECT_TIMEOUT_S", DEFAULT_REDIS_CONNECT_TIMEOUT_S),
        "redis_keepalive_idle_s": _env_float("MAKESPAN_REDIS_KEEPALIVE_IDLE_S", DEFAULT_REDIS_KEEPALIVE_IDLE_S),
        "redis_health_check_interval_s": _env_float("MAKESPAN_REDIS_HEALTH_CHECK_INTERVAL_S",
                                                    DEFAULT_REDIS_HEALTH_CHECK_INTERVAL_S),
    }


def _env_bool(name: str) -> bool:
    """A ``MAKESPAN_*`` switch: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``
    (any case; unset or empty: False).

    Raises:
        ValidationError: any other value."""
    raw = (os.environ.get(name) or "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValidationError(name, raw, "must be 1 or 0 (true/false, yes/no, on/off)")


def _env_nonneg(name: str, default: float) -> float:
    """A ``MAKESPAN_*`` number that may be 0 (unset: ``default``)."""
    return _env_float(name, default, allow_zero=True)


def _env_float(name: str, default: float, allow_zero: bool = False) -> float:
    """A positive finite ``MAKESPAN_*`` number (unset or empty: ``default``).

    Raises:
        ValidationError: not a number, not finite, or ≤ 0 (< 0 with ``allow_zero``)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as e:
        raise ValidationError(name, raw, "must be a number") from e
    ok = value >= 0 if allow_zero else value > 0
    if not ok or value == float("inf"):
        raise ValidationError(name, raw, "must be a finite number ≥ 0" if allow_zero else
                              "must be a positive finite number")
    return value


@dataclass(frozen=True)
class Settings:
    """Runtime settings shared by the producer, planner, GPU workers and observer.

    Attributes:
        redis_url: ``redis://``, ``rediss://`` (TLS), ``unix://``, ``redis+sentinel://`` or
            ``rediss+sentinel://`` URL (:func:`check_redis_url`).
        key_prefix: every makespan key (and Celery's, through kombu's
            ``global_keyprefix``) starts with ``{key_prefix}:``.
        time_scale: wall seconds per workload second for simulated endpoints and
            transitions (``0.01`` runs a 100 s job in 1 s of wall time).
        batch_size: most jobs the planner takes in one batch.
        batch_wait_s: longest the planner waits to fill a batch after a submit wakes it
            (only while fewer than ``batch_size`` jobs are queued: a full batch cannot
            grow; never after a lease release: the freed GPUs would idle).
        plan_follow_s: how long (wall s) ticks woken by lease releases may start the next
            jobs of the last plan on the freed GPUs instead of re-planning the batch
            (:mod:`makespan.workers.follow`: only plans without CRITICAL/HIGH jobs,
            preemptions or dependencies, and only while every queued job that plan did not
            read is alike the jobs it starts and queued behind them); 0: every tick re-plans. Default 1.
        lease_ttl_s: a lease not renewed within this many seconds expires and is reclaimed.
        heartbeat_s: how often a lease holder renews its lease; :meth:`from_env` refuses more
            than half ``lease_ttl_s`` (one failed renewal would lose the lease), and a GPU
            worker warns as it starts when one renewal blocked for the whole
            ``redis_socket_timeout_s`` would (:func:`lease_renewal_warning`).
        max_attempts: a job whose lease is reclaimed this many times is failed.
        retry_backoff_s: a job whose lease is reclaimed (fewer than ``max_attempts``
            times) waits ``retry_backoff_s × 2^(attempts−1)`` seconds, at most
            ``retry_backoff_max_s``, as a delayed job before it is queued again; 0 (the
            default): queued again at once.
        retry_backoff_max_s: longest retry backoff, s.
        broker_visibility_timeout_s: the Celery Redis transport's visibility timeout: an
            unacknowledged message older than this is delivered again (phase tasks are
            idempotent and fenced; delayed jobs never reach the broker before they are due).
        max_payload_bytes: largest JSON payload a job may carry, ``payload``, ``args`` and
            ``kwargs`` together (``MAKESPAN_MAX_PAYLOAD_BYTES``, 1 B to 64 MiB; default 64 KiB).
        max_depends_on: most distinct ``depends_on`` ids one submitted job may name
            (``MAKESPAN_MAX_DEPENDS_ON``, 1 to 1,000,000; default 1,000); more is refused
            at submit, nothing written (the submit script and the planner read each one).
        policy: planner policy name used by the live planner, one of
            :data:`makespan.planner.policies.POLICY_REGISTRY` (``MAKESPAN_POLICY``; another name
            fails :meth:`from_env` with the list; default ``default``: the greedy portfolio
            on every tick and the CP-SAT improver in a child process, whose plan a later
            tick adopts when it scores better; see workers/improver.py).
        solve_time_limit_s: CP-SAT time limit per batch (policies that use it), s.
        preemption: ``"plan"`` (default): the policies with a floor
            (:attr:`makespan.planner.policies.Policy.floor`: portfolio, default/cpsat, tardiness*)
            decide preemptions by score (:mod:`makespan.planner.preemption_plan`), the others by the
            fixed rule; ``"rule"``: the fixed rule (:mod:`makespan.planner.preemption`) for all.
        improver_executor: where the live planner's improver solves: ``process`` (the
            default: one child process, off the tick's GIL) or ``thread`` (a thread of
            the planner process; ticks during a solve take longer).
        improver_nice: niceness added to the improver's child process (0–19): on a busy
            CPU the tick comes first, and the solve gets less done within its limit.
        pool_offer_ttl_s: how long a pool's planner's offer (free GPUs, idle warm endpoints)
            stays valid for routing (makespan.pools); a pool whose leader stopped writing one is
            skipped by the routing of jobs that another pool can take.
        planner_tick_s: longest the planner sleeps between cycles when nothing wakes it
            (a submission or a lease release wakes it at once).
        retention_jobs: most finished-job summaries kept (oldest deleted first).
        retention_age_s: a finished job's summary and idempotency key live this long.
        retention_sweep_s: the planner runs a retention sweep at most this often.
        retention_batch: most jobs one sweep compacts or deletes (bounds its cost).
        events_max_len: the events stream is trimmed to about this many entries.
        set_point_weight: ``FleetState.set_point_weight`` of the planner's states: score
            per GPU-second a set-point instance is absent in a plan (weight·s per GPU-s,
            ≥ 0; 0, the default: not weighed). ``MAKESPAN_SET_POINT_WEIGHT``.

    Workload functions and their results (:mod:`makespan.registry`, :mod:`makespan.results`):

    Attributes:
        workload_modules: comma-separated modules a GPU worker imports at start to
            register ``@makespan.workload`` functions (``MAKESPAN_WORKLOADS``; the
            ``--workloads`` option of ``makespan gpu-worker`` sets it).
        result_max_bytes: largest JSON-encoded result a workload function may return;
            a larger one fails the job with an error that says to store the data
            elsewhere and return a reference (default 1 MiB).
        result_ttl_s: how long a job's result (or error) is kept in Redis, s.
        cancel_grace_s: wall seconds a workload function has to return after its
            ``ctx.cancelled`` is set (cancel, timeout or lease loss) before it is stopped
            by an exception raised in its thread.
        default_service_s: planning estimate of a job submitted without ``service_s``
            whose workload declares no ``expected_s``, until enough runs were measured.
        estimate_min_runs: measured runs of a (workload, endpoint) before their median
            replaces the prior as the planning estimate.

    Guarantees (issue 19; docs/planner.md "Guarantees"):

    Attributes:
        preemption_budget: times one job may be preempted; a job preempted that often is
            never a victim again (default 2; a negative number: no budget).
            ``MAKESPAN_PREEMPTION_BUDGET``.
        preemption_min_runtime_s: workload seconds a job holds its GPUs before it may be
            preempted (default 0: at once). ``MAKESPAN_PREEMPTION_MIN_RUNTIME_S``.
        reservation_after_s: aging bound, workload s: a queued job that has waited this long
            and still cannot start gets a reservation of its earliest feasible group
            (others backfill it only when they end before the reservation); default 3600
            (bench/RESULTS.md: with 600 the default policy measured 0.658× fifo, above 0.6×).
            ``MAKESPAN_RESERVATION_AFTER_S``.
        fast_lane: the fast lane's levels, ``LEVEL[:FACTOR]`` comma-separated: no job of
            such a level is planned to complete later than FACTOR (≥ 1, default 1) × the
            response time strict priority would give it from the same state
            (:mod:`makespan.planner.fast_lane`); default ``"CRITICAL,HIGH:1.25"``, ``""``: off.
            ``MAKESPAN_FAST_LANE``.
        fast_lane_start: the lane levels whose *start* the lane bounds instead of their
            completion, ``LEVEL:GRACE_S[/FLOOR_S][/xPEER]`` comma-separated: no job of such a
            level is planned to start later than release + FACTOR × (strict priority's start −
            release) + GRACE_S (s ≥ 0), nor forced to start before release + FLOOR_S, nor
            before release + PEER × FACTOR × the longest strict-priority wait of its level's
            jobs in the batch (the peer floor); default ``"CRITICAL:30,HIGH:30/x1.4"``
            (bench/RESULTS.md, "Peer floor for HIGH"), ``""``: every lane level bounded on
            completion. A level listed here must be in :attr:`fast_lane`.
            ``MAKESPAN_FAST_LANE_START``.

    Transitions (issue 20; :mod:`makespan.estimates`):

    Attributes:
        transition_min_observations: measured transitions of one (endpoint, kind) before
            their running quantile replaces the fleet file's figure (per host: that
            host's own once it has this many, else the other hosts'). Default 5.
            ``MAKESPAN_TRANSITION_MIN_OBSERVATIONS``.
        transition_quantile: the quantile of the measured window that becomes the
            planned duration (a high one: a transition planned too short makes every
            later start late). Default 0.9. ``MAKESPAN_TRANSITION_QUANTILE``.
        simulated_slowdown: ``host=factor,...``: the simulated driver's transitions on
            these hosts take the fleet file's figure × factor (a slow disk, for benches
            and tests of learned durations; empty: none). ``MAKESPAN_SIMULATED_SLOWDOWN``.
        prewarm: the planner wakes a sleeping instance on an idle GPU group ahead of
            forecast demand (:mod:`makespan.planner.prewarm`; a restore lease whose start
            phase wakes it). Default off: no better than not prewarming on the
            swap-heavy scenario and the trace windows, 0.2–0.4 % better only on sparse
            traffic (bench/RESULTS.md, "Issue 20 (a) with 3 seeds"). ``MAKESPAN_PREWARM`` (1/0).

    Redis connection bounds and start checks (:mod:`makespan.redis_conn`):

    Attributes:
        redis_socket_timeout_s: longest one Redis command (and one kombu broker command)
            waits for its reply before it raises a timeout: a half-open connection fails
            within this bound instead of blocking forever. ``MAKESPAN_REDIS_SOCKET_TIMEOUT_S``.
        redis_connect_timeout_s: longest a new Redis connection may take to open.
            ``MAKESPAN_REDIS_CONNECT_TIMEOUT_S``.
        redis_keepalive_idle_s: TCP keepalive on every Redis connection: the first probe
            after this many idle seconds, then one every half of it, and the connection is
            dropped after :data:`REDIS_KEEPALIVE_PROBES` unanswered probes.
            ``MAKESPAN_REDIS_KEEPALIVE_IDLE_S``.
        redis_health_check_interval_s: a pooled connection idle longer than this is
            checked with PING before it is used (redis-py and kombu
            ``health_check_interval``); a Celery consumer's ``BRPOP`` connection whose
            reply is overdue is dropped within kombu's 1 s ``brpop_timeout`` + 2 × this
            (9 s at the default 4). ``MAKESPAN_REDIS_HEALTH_CHECK_INTERVAL_S``.
        allow_evicting_redis: start even when Redis's ``maxmemory-policy`` is not
            ``noeviction`` (a loud warning instead of a refusal; evicted lease keys break
            mutual exclusion). ``MAKESPAN_ALLOW_EVICTING_REDIS=1``.
        submit_wait_replicas: after writing a job, a submit waits (Redis ``WAIT``) until
            this many replicas acknowledged it, so an acknowledged job survives a
            failover; 0: no wait (replication is asynchronous: a job acknowledged just
            before the primary dies can be lost). ``MAKESPAN_SUBMIT_WAIT_REPLICAS``.
        submit_wait_timeout_s: longest that wait; fewer acknowledgements by then make
            the submit raise :class:`makespan.errors.StoreError` (the job is written on
            the primary, not yet known safe). ``MAKESPAN_SUBMIT_WAIT_TIMEOUT_S``.
        worker_liveness_ttl_s: a GPU worker announces its host as consumed with a key of
            this TTL (seconds, on the Redis server's clock), renewed every quarter of it;
            a host seen once whose key has expired gets no new leases until a worker is
            back (:mod:`makespan.workers.host_liveness`). A SIGKILLed worker is noticed
            within this time, a stopped one at once. Keep it under ``lease_ttl_s −
            heartbeat_s``, so the host of a dead worker is known down before its leases
            expire and their jobs are planned again, and over 4/3 of
            ``redis_socket_timeout_s`` (:func:`liveness_warning`). ``MAKESPAN_WORKER_LIVENESS_TTL_S``.
        shutdown_grace_s: every makespan process (planner, GPU worker, observer,
            dashboard) ends within this many seconds (+ 1 s) of SIGTERM: a clean
            shutdown still running then is cut off with exit code 1 and every thread's traceback on stderr
            (:mod:`makespan.shutdown`). ``MAKESPAN_SHUTDOWN_GRACE_S``.
        critical_lane: the leading planner places a CRITICAL job (a workload step too) the
            moment it is submitted, or, one with dependencies, the moment its last one
            completes, without waiting for the tick (:mod:`makespan.workers.critical_lane`: a
            warm idle instance, a free group, or a preemption of lower-priority work; the
            next tick reconciles); default on. ``MAKESPAN_CRITICAL_LANE`` (``0``: off).
    """

    redis_url: str = DEFAULT_REDIS_URL
    key_prefix: str = "makespan"
    time_scale: float = 1.0
    batch_size: int = 256
    batch_wait_s: float = 0.05
    plan_follow_s: float = 1.0
    lease_ttl_s: float = 10.0
    heartbeat_s: float = 2.0
    max_attempts: int = 3
    retry_backoff_s: float = 0.0
    retry_backoff_max_s: float = 300.0
    broker_visibility_timeout_s: float = 6 * 3600.0
    max_payload_bytes: int = 64 * 1024
    max_depends_on: int = 1_000
    policy: str = DEFAULT_POLICY
    solve_time_limit_s: float = 1.0
    preemption: str = "plan"
    improver_executor: str = "process"
    improver_nice: int = 5
    planner_tick_s: float = 0.1
    pool_offer_ttl_s: float = 5.0
    retention_jobs: int = 10_000
    retention_age_s: float = 3600.0
    retention_sweep_s: float = 0.5
    retention_batch: int = 2_000
    events_max_len: int = 50_000
    set_point_weight: float = 0.0
    # workload functions and results
    workload_modules: str = ""
    result_max_bytes: int = 1024 * 1024
    result_ttl_s: float = 7 * 24 * 3600.0
    cancel_grace_s: float = 10.0
    default_service_s: float = 60.0
    estimate_min_runs: int = 3
    # -- guarantees (issue 19; docs/planner.md "Guarantees") --
    preemption_budget: int = 2
    preemption_min_runtime_s: float = 0.0
    reservation_after_s: float = 3600.0
    fast_lane: str = DEFAULT_FAST_LANE
    fast_lane_start: str = DEFAULT_FAST_LANE_START
    # -- transitions (issue 20) --
    transition_min_observations: int = 5
    transition_quantile: float = 0.9
    simulated_slowdown: str = ""
    prewarm: bool = False
    # --
    redis_socket_timeout_s: float = DEFAULT_REDIS_SOCKET_TIMEOUT_S
    redis_connect_timeout_s: float = DEFAULT_REDIS_CONNECT_TIMEOUT_S
    redis_keepalive_idle_s: float = DEFAULT_REDIS_KEEPALIVE_IDLE_S
    redis_health_check_interval_s: float = DEFAULT_REDIS_HEALTH_CHECK_INTERVAL_S
    allow_evicting_redis: bool = False
    submit_wait_replicas: int = 0
    submit_wait_timeout_s: float = 1.0
    worker_liveness_ttl_s: float = 7.0
    shutdown_grace_s: float = 20.0
    critical_lane: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fast_lane_levels(self) -> dict[int, float]:
        """:attr:`fast_lane` as priority level (0 = CRITICAL) -> wait factor, for
        :func:`makespan.planner.fast_lane.enforce`."""
        return fast_lane_levels(self.fast_lane)

    @property
    def fast_lane_start_grace(self) -> dict[int, float | tuple[float, float] | tuple[float, float, float]]:
        """:attr:`fast_lane_start` as priority level -> grace s (or a tuple, see
        :func:`fast_lane_start_grace`), for
        :func:`makespan.planner.fast_lane.enforce`'s ``start_grace_s``."""
        return fast_lane_start_grace(self.fast_lane_start)

    @property
    def planner_lock_ttl_s(self) -> float:
        """TTL of a planner's leader lock, s: half ``lease_ttl_s``, at least 1 s (a standby
        takes over within it after a leader dies)."""
        return max(self.lease_ttl_s / 2, 1.0)

    @property
    def planner_lock_renewal_s(self) -> float:
        """How often the leading planner extends its leader lock, s: a third of its TTL."""
        return self.planner_lock_ttl_s / 3

    @property
    def planner_lock_socket_timeout_s(self) -> float:
        """Longest wait for a reply to one leader-lock command (acquire, extend), s:
        ``redis_socket_timeout_s``, but never more than the lock's TTL − 2 × its extend
        interval (a third of the TTL), so that an extend blocked on a half-open connection
        fails, and the next one is sent, before the lock can expire
        (:func:`planner_lock_warning`). The planner sends them on a client of their own
        (:func:`makespan.redis_conn.with_socket_timeout`)."""
        return min(self.redis_socket_timeout_s, self.planner_lock_ttl_s - 2 * self.planner_lock_renewal_s)

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Build settings from ``MAKESPAN_*`` variables, then apply ``overrides``.

        Raises:
            ValidationError: a variable or override out of its range, an unknown
                override name, a policy not in :data:`makespan.planner.policies.POLICY_REGISTRY`
                (the message lists the known names), or a heartbeat above half the lease TTL."""
        env = os.environ
        s = cls(
            redis_url=check_redis_url(env.get("MAKESPAN_REDIS_URL") or DEFAULT_REDIS_URL),
            key_prefix=env.get("MAKESPAN_KEY_PREFIX") or "makespan",
            time_scale=_env_float("MAKESPAN_TIME_SCALE", 1.0),
            batch_size=_env_int("MAKESPAN_BATCH_SIZE", 256, 1, COUNT_MAX),
            batch_wait_s=_env_float("MAKESPAN_BATCH_WAIT_S", 0.05),
            plan_follow_s=_env_float("MAKESPAN_PLAN_FOLLOW_S", 1.0, allow_zero=True),
            lease_ttl_s=_env_float("MAKESPAN_LEASE_TTL_S", 10.0),
            heartbeat_s=_env_float("MAKESPAN_HEARTBEAT_S", 2.0),
            max_attempts=_env_int("MAKESPAN_MAX_ATTEMPTS", 3, 1, COUNT_MAX),
            retry_backoff_s=_env_nonneg("MAKESPAN_RETRY_BACKOFF_S", 0.0),
            retry_backoff_max_s=_env_float("MAKESPAN_RETRY_BACKOFF_MAX_S", 300.0),
            broker_visibility_timeout_s=_env_float("MAKESPAN_BROKER_VISIBILITY_TIMEOUT_S", 6 * 3600.0),
            policy=check_policy(env.get("MAKESPAN_POLICY") or DEFAULT_POLICY),
            solve_time_limit_s=_env_float("MAKESPAN_SOLVE_TIME_LIMIT_S", 1.0),
            preemption=_env_choice("MAKESPAN_PREEMPTION", PREEMPTION_MODES),
            improver_executor=_env_choice("MAKESPAN_IMPROVER_EXECUTOR", IMPROVER_EXECUTORS),
            improver_nice=_env_int("MAKESPAN_IMPROVER_NICE", 5, 0, IMPROVER_NICE_MAX),
            planner_tick_s=_env_float("MAKESPAN_PLANNER_TICK_S", 0.1),
            pool_offer_ttl_s=_env_float("MAKESPAN_POOL_OFFER_TTL_S", 5.0),
            retention_jobs=_env_int("MAKESPAN_RETENTION_JOBS", 10_000, 1, COUNT_MAX),
            retention_age_s=_env_float("MAKESPAN_RETENTION_AGE_S", 3600.0),
            retention_sweep_s=_env_float("MAKESPAN_RETENTION_SWEEP_S", 0.5),
            retention_batch=_env_int("MAKESPAN_RETENTION_BATCH", 2_000, 1, COUNT_MAX),
            events_max_len=_env_int("MAKESPAN_EVENTS_MAX_LEN", 50_000, 1, COUNT_MAX),  # events_max_len_from_env
            set_point_weight=_env_nonneg("MAKESPAN_SET_POINT_WEIGHT", 0.0),
            workload_modules=env.get("MAKESPAN_WORKLOADS", ""),
            max_payload_bytes=_env_int("MAKESPAN_MAX_PAYLOAD_BYTES", 64 * 1024, 1, MAX_PAYLOAD_BYTES_CAP),
            max_depends_on=_env_int("MAKESPAN_MAX_DEPENDS_ON", 1_000, 1, MAX_DEPENDS_ON_CAP),
            result_max_bytes=_env_int("MAKESPAN_RESULT_MAX_BYTES", 1024 * 1024, 1, 512 * 1024 * 1024),
            result_ttl_s=_env_float("MAKESPAN_RESULT_TTL_S", 7 * 24 * 3600.0),
            cancel_grace_s=_env_float("MAKESPAN_CANCEL_GRACE_S", 10.0),
            default_service_s=_env_float("MAKESPAN_DEFAULT_SERVICE_S", 60.0),
            estimate_min_runs=_env_int("MAKESPAN_ESTIMATE_MIN_RUNS", 3, 1, 10_000),
            **redis_bounds_from_env(),
            allow_evicting_redis=_env_bool("MAKESPAN_ALLOW_EVICTING_REDIS"),
            submit_wait_replicas=_env_int("MAKESPAN_SUBMIT_WAIT_REPLICAS", 0, 0, 100),
            submit_wait_timeout_s=_env_float("MAKESPAN_SUBMIT_WAIT_TIMEOUT_S", 1.0),
            worker_liveness_ttl_s=_env_float("MAKESPAN_WORKER_LIVENESS_TTL_S", 7.0),
            shutdown_grace_s=_env_float("MAKESPAN_SHUTDOWN_GRACE_S", 20.0),
            # unset or empty: on (the default)
            critical_lane=_env_bool("MAKESPAN_CRITICAL_LANE") if env.get("MAKESPAN_CRITICAL_LANE", "").strip() else True,
        )
        s = replace(s, **_guarantees_from_env(), **_transitions_from_env())
        known = {f.name for f in fields(cls)}
        bad = set(overrides) - known
        if bad:
            raise ValidationError("settings", sorted(bad), "unknown setting")
        if "policy" in overrides:
            check_policy(overrides["policy"], "policy")
        s = replace(s, **overrides)
        if s.heartbeat_s > s.lease_ttl_s / 2:
            raise ValidationError("MAKESPAN_HEARTBEAT_S", s.heartbeat_s,
                                  f"must be at most half MAKESPAN_LEASE_TTL_S ({s.lease_ttl_s:g} s): a lease renewed "
                                  "less often is lost to one failed renewal (a Redis blip; at or above the TTL, "
                                  "every lease expires between renewals)")
        if s.submit_wait_replicas > 0 and s.submit_wait_timeout_s >= s.redis_socket_timeout_s:
            raise ValidationError("MAKESPAN_SUBMIT_WAIT_TIMEOUT_S", s.submit_wait_timeout_s,
                                  f"must be below MAKESPAN_REDIS_SOCKET_TIMEOUT_S ({s.redis_socket_timeout_s:g} s): "
                                  "a submit's WAIT for replicas that lasts the whole socket timeout ends as a read "
                                  "timeout, not as the replicas' answer")
        return s

    def slowdown_by_host(self) -> dict[str, float]:
        """``simulated_slowdown`` parsed: host name -> factor (> 0).

        Raises:
            ValidationError: not ``host=factor`` pairs with positive finite factors."""
        return parse_slowdown(self.simulated_slowdown)

    def to_env(self) -> dict[str, str]:
        """The ``MAKESPAN_*`` variables that reproduce these settings in a child process."""
        return {
            "MAKESPAN_REDIS_URL": self.redis_url,
            "MAKESPAN_KEY_PREFIX": self.key_prefix,
            "MAKESPAN_TIME_SCALE": repr(self.time_scale),
            "MAKESPAN_BATCH_SIZE": str(self.batch_size),
            "MAKESPAN_BATCH_WAIT_S": repr(self.batch_wait_s),
            "MAKESPAN_PLAN_FOLLOW_S": repr(self.plan_follow_s),
            "MAKESPAN_LEASE_TTL_S": repr(self.lease_ttl_s),
            "MAKESPAN_HEARTBEAT_S": repr(self.heartbeat_s),
            "MAKESPAN_MAX_ATTEMPTS": str(self.max_attempts),
            "MAKESPAN_RETRY_BACKOFF_S": repr(self.retry_backoff_s),
            "MAKESPAN_RETRY_BACKOFF_MAX_S": repr(self.retry_backoff_max_s),
            "MAKESPAN_BROKER_VISIBILITY_TIMEOUT_S": repr(self.broker_visibility_timeout_s),
            "MAKESPAN_POLICY": self.policy,
            "MAKESPAN_SOLVE_TIME_LIMIT_S": repr(self.solve_time_limit_s),
            "MAKESPAN_PREEMPTION": self.preemption,
            "MAKESPAN_IMPROVER_EXECUTOR": self.improver_executor,
            "MAKESPAN_IMPROVER_NICE": str(self.improver_nice),
            "MAKESPAN_PLANNER_TICK_S": repr(self.planner_tick_s),
            "MAKESPAN_POOL_OFFER_TTL_S": repr(self.pool_offer_ttl_s),
            "MAKESPAN_RETENTION_JOBS": str(self.retention_jobs),
            "MAKESPAN_RETENTION_AGE_S": repr(self.retention_age_s),
            "MAKESPAN_RETENTION_SWEEP_S": repr(self.retention_sweep_s),
            "MAKESPAN_RETENTION_BATCH": str(self.retention_batch),
            "MAKESPAN_EVENTS_MAX_LEN": str(self.events_max_len),
            "MAKESPAN_SET_POINT_WEIGHT": repr(self.set_point_weight),
            "MAKESPAN_WORKLOADS": self.workload_modules,
            "MAKESPAN_MAX_PAYLOAD_BYTES": str(self.max_payload_bytes),
            "MAKESPAN_MAX_DEPENDS_ON": str(self.max_depends_on),
            "MAKESPAN_RESULT_MAX_BYTES": str(self.result_max_bytes),
            "MAKESPAN_RESULT_TTL_S": repr(self.result_ttl_s),
            "MAKESPAN_CANCEL_GRACE_S": repr(self.cancel_grace_s),
            "MAKESPAN_DEFAULT_SERVICE_S": repr(self.default_service_s),
            "MAKESPAN_ESTIMATE_MIN_RUNS": str(self.estimate_min_runs),
            **_guarantees_to_env(self),
            **_transitions_to_env(self),
            "MAKESPAN_REDIS_SOCKET_TIMEOUT_S": repr(self.redis_socket_timeout_s),
            "MAKESPAN_REDIS_CONNECT_TIMEOUT_S": repr(self.redis_connect_timeout_s),
            "MAKESPAN_REDIS_KEEPALIVE_IDLE_S": repr(self.redis_keepalive_idle_s),
            "MAKESPAN_REDIS_HEALTH_CHECK_INTERVAL_S": repr(self.redis_health_check_interval_s),
            "MAKESPAN_ALLOW_EVICTING_REDIS": "1" if self.allow_evicting_redis else "0",
            "MAKESPAN_SUBMIT_WAIT_REPLICAS": str(self.submit_wait_replicas),
            "MAKESPAN_SUBMIT_WAIT_TIMEOUT_S": repr(self.submit_wait_timeout_s),
            "MAKESPAN_WORKER_LIVENESS_TTL_S": repr(self.worker_liveness_ttl_s),
            "MAKESPAN_SHUTDOWN_GRACE_S": repr(self.shutdown_grace_s),
            "MAKESPAN_CRITICAL_LANE": "1" if self.critical_lane else "0",
        }


def retention_warning(s: Settings) -> str | None:
    """Why results would expire before their jobs' summaries under these settings, or None:
    with ``retention_age_s`` above ``result_ttl_s`` a finished workload function's job is
    still found for ``retention_age_s``, but its result is gone after ``result_ttl_s``
    (``Job.result`` raises :class:`makespan.errors.ResultExpired`). Logged by the planner
    (it keeps the summaries) and every GPU worker (it writes the results) as they start."""
    if s.retention_age_s > s.result_ttl_s:
        return (f"MAKESPAN_RETENTION_AGE_S ({s.retention_age_s:g} s) is above MAKESPAN_RESULT_TTL_S "
                f"({s.result_ttl_s:g} s): a finished job's results expire before its summary, and reading one "
                f"then raises ResultExpired; raise MAKESPAN_RESULT_TTL_S with it (on the GPU workers: they write "
                f"the results)")
    return None


def liveness_warning(s: Settings) -> str | None:
    """Why the dead-host gate of these settings would misjudge a host, or None:

    * a worker killed (SIGKILL, a lost host) stops renewing its leases (every
      ``heartbeat_s``) and its host's liveness key (every quarter of its TTL) together; its
      leases may expire ``lease_ttl_s − heartbeat_s`` after its death and the planner plans
      their jobs at once, so its host must be known down by then:
      ``worker_liveness_ttl_s < lease_ttl_s − heartbeat_s``, else a job goes back to the dead
      host for one more lease TTL (an operator saw it in every kill test with both at 10 s);
    * one renewal that blocks on a half-open connection goes a quarter TTL plus
      ``redis_socket_timeout_s`` without a renewal: over the TTL a live host looks down for
      a moment (no new leases there): ``worker_liveness_ttl_s × 3/4 > redis_socket_timeout_s``.

    Logged by the planner and every GPU worker as they start."""
    ttl_s, most_s = s.worker_liveness_ttl_s, s.lease_ttl_s - s.heartbeat_s
    if ttl_s >= most_s:
        return (f"MAKESPAN_WORKER_LIVENESS_TTL_S ({ttl_s:g} s) is not under MAKESPAN_LEASE_TTL_S − MAKESPAN_HEARTBEAT_S "
                f"({most_s:g} s): when a GPU worker dies its leases may expire before its host is known down, and their "
                f"jobs are leased to the dead host again for one more lease TTL; lower MAKESPAN_WORKER_LIVENESS_TTL_S "
                f"or raise MAKESPAN_LEASE_TTL_S")
    if ttl_s * (1 - 0.25) <= s.redis_socket_timeout_s:
        return (f"MAKESPAN_WORKER_LIVENESS_TTL_S ({ttl_s:g} s) is too short for MAKESPAN_REDIS_SOCKET_TIMEOUT_S "
                f"({s.redis_socket_timeout_s:g} s): one liveness renewal that blocks for the whole socket timeout (a "
                f"half-open connection) lets the key expire and a live host look down for a moment; keep the TTL "
                f"over 4/3 of the socket timeout ({s.redis_socket_timeout_s * 4 / 3:.3g} s)")
    return None


# -- guarantees (issue 19): their MAKESPAN_* variables --
def lease_renewal_warning(s: Settings) -> str | None:
    """Why a lease of these settings would be lost to one renewal that blocks (a half-open
    connection: the call waits the whole ``redis_socket_timeout_s``, then fails, and the
    heartbeat tries again, within min(``heartbeat_s``, 0.5 s)), or None. The lease then goes
    up to 2 × ``heartbeat_s`` + ``redis_socket_timeout_s`` without a renewal (a bound: the
    retry comes sooner); over ``lease_ttl_s`` it expires and its job is reclaimed while the
    worker still runs it (and the worker's local deadline gives the run up).

    A warning, not a refusal like :meth:`Settings.from_env`'s heartbeat rule: short lease
    TTLs with the default socket timeout are common (the demo's, tests' and fault benches'
    settings), and a blocked renewal needs a half-open connection, where a failed one needs
    only a blip. Logged by every GPU worker as it starts
    (:mod:`makespan.workers.startup_checks`)."""
    gap_s = 2 * s.heartbeat_s + s.redis_socket_timeout_s
    if gap_s <= s.lease_ttl_s:
        return None
    fits_s = s.lease_ttl_s - 2 * s.heartbeat_s
    advice = (f"set MAKESPAN_REDIS_SOCKET_TIMEOUT_S to at most {fits_s:g} s, or raise MAKESPAN_LEASE_TTL_S"
              if fits_s > 0 else "raise MAKESPAN_LEASE_TTL_S or lower MAKESPAN_HEARTBEAT_S")
    return (f"MAKESPAN_REDIS_SOCKET_TIMEOUT_S ({s.redis_socket_timeout_s:g} s) is too long for MAKESPAN_LEASE_TTL_S "
            f"({s.lease_ttl_s:g} s) with MAKESPAN_HEARTBEAT_S ({s.heartbeat_s:g} s): a lease renewal that blocks for "
            f"the whole socket timeout (a half-open connection) and fails is retried a heartbeat later, "
            f"{gap_s:g} s after the last renewal, when the lease has expired and its job is reclaimed while this "
            f"worker still runs it; keep 2 x heartbeat + socket timeout <= lease TTL: {advice}")


def planner_lock_warning(s: Settings, socket_timeout_s: float | None = None) -> str | None:
    """Why a leading planner of these settings would step down after one lock extend that
    blocks (a half-open connection: the extend waits the whole ``socket_timeout_s``, then
    fails, and is tried again ``planner_lock_renewal_s`` later), or None. The lock then goes
    2 × ``planner_lock_renewal_s`` + ``socket_timeout_s`` without an extend; over
    ``planner_lock_ttl_s`` it may have expired, so the planner steps down (it starts no tick
    step past its last extend + the TTL: :class:`makespan.workers.planner_worker.PlannerWorker`)
    and a standby, or itself, leads again under a new fencing token.

    ``socket_timeout_s``: the lock client's (None: ``planner_lock_socket_timeout_s``, which
    always fits). The planner sends its lock commands on a copy of its client with that
    shorter timeout; only a client whose pool cannot be copied (a custom pool class) keeps
    ``redis_socket_timeout_s``, and then this says so as the planner starts. A warning, like
    :func:`lease_renewal_warning`: the step-down keeps two planners from acting at once, so
    these settings cost a failover, not a double lease."""
    ttl_s, renewal_s = s.planner_lock_ttl_s, s.planner_lock_renewal_s
    timeout_s = s.planner_lock_socket_timeout_s if socket_timeout_s is None else socket_timeout_s
    gap_s = 2 * renewal_s + timeout_s
    if gap_s <= ttl_s + 1e-9:
        return None
    fits_s = ttl_s - 2 * renewal_s
    return (f"the planner's leader lock commands wait up to {timeout_s:g} s for Redis (its client's socket timeout; "
            f"its pool could not be copied with a shorter one), too long for the lock ({ttl_s:g} s: half "
            f"MAKESPAN_LEASE_TTL_S, at least 1 s; extended every {renewal_s:g} s): an extend that blocks for the "
            f"whole socket timeout (a half-open connection) and fails is retried {gap_s:g} s after the last one, "
            f"when the lock may have expired, so the planner steps down and a standby takes over; keep 2 x extend "
            f"interval + socket timeout <= lock TTL: set MAKESPAN_REDIS_SOCKET_TIMEOUT_S to at most {fits_s:g} s, or "
            f"MAKESPAN_LEASE_TTL_S to at least {6 * timeout_s:g} s")


def _guarantees_from_env() -> dict[str, Any]:
    """The guarantee settings from ``MAKESPAN_*`` (unset: the defaults).

    Raises:
        ValidationError: a value that is not a number (the budget: not an integer), or a
            negative runtime / aging bound."""
    raw = os.environ.get("MAKESPAN_PREEMPTION_BUDGET")
    budget = 2
    if raw not in (None, ""):
        try:
            budget = int(raw)
        except ValueError as e:
            raise ValidationError("MAKESPAN_PREEMPTION_BUDGET", raw, "must be an integer") from e
    return {"preemption_budget": budget,
            "preemption_min_runtime_s": _env_nonneg("MAKESPAN_PREEMPTION_MIN_RUNTIME_S", 0.0),
            "reservation_after_s": _env_nonneg("MAKESPAN_RESERVATION_AFTER_S", 3600.0),
            "fast_lane": _env_lane("MAKESPAN_FAST_LANE", DEFAULT_FAST_LANE),
            "fast_lane_start": _env_lane_start("MAKESPAN_FAST_LANE_START", DEFAULT_FAST_LANE_START,
                                               os.environ.get("MAKESPAN_FAST_LANE", DEFAULT_FAST_LANE))}


def fast_lane_levels(names: str) -> dict[int, float]:
    """``"CRITICAL,HIGH:1.25"`` -> {0: 1.0, 1: 1.25} (level -> wait factor ≥ 1, default 1);
    ``""``: {}. Raises ValidationError on an unknown level or a factor below 1."""
    from makespan.models import Priority

    out: dict[int, float] = {}
    for item in (x.strip() for x in names.split(",")):
        if not item:
            continue
        n, _, f = item.partition(":")
        n = n.strip().upper()
        if n not in Priority.__members__:
            raise ValidationError("fast_lane", names, f"levels are {', '.join(Priority.__members__)}")
        try:
            factor = float(f) if f.strip() else 1.0
        except ValueError as e:
            raise ValidationError("fast_lane", names, "a factor (LEVEL:FACTOR) must be a number") from e
        if not 1.0 <= factor < float("inf"):
            raise ValidationError("fast_lane", names, "a factor (LEVEL:FACTOR) must be a finite number >= 1")
        out[int(Priority[n])] = factor
    return dict(sorted(out.items()))


def fast_lane_start_grace(names: str, lane: str | None = None) -> dict[int, float | tuple[float, float] | tuple[float, float, float]]:
    """``"CRITICAL:30,HIGH:60"`` -> {0: 30.0, 1: 60.0} (level -> grace s ≥ 0, the levels
    whose start the fast lane bounds); ``"HIGH:60/200"`` -> {1: (60.0, 200.0)} (grace s,
    wait floor s ≥ 0); ``"HIGH:30/x1.4"`` -> {1: (30.0, 0.0, 1.4)} (grace s, wait floor s,
    peer factor > 0; ``HIGH:30/200/x1.4`` gives both floors): see
    :func:`makespan.planner.fast_lane.allowed_start`; ``""``: {}. With ``lane`` (a
    :attr:`Settings.fast_lane` value), every level must be one of its levels. Raises
    ValidationError on an unknown level, a missing, negative or non-finite grace, wait floor
    or peer factor, a peer factor of 0, or a level not in ``lane``."""
    from makespan.models import Priority

    out: dict[int, float | tuple[float, float] | tuple[float, float, float]] = {}
    for item in (x.strip() for x in names.split(",")):
        if not item:
            continue
        n, sep, g = item.partition(":")
        g, *floors = g.split("/")
        n = n.strip().upper()
        if n not in Priority.__members__:
            raise ValidationError("fast_lane_start", names, f"levels are {', '.join(Priority.__members__)}")
        try:
            grace = float(g) if sep else float("nan")
        except ValueError as e:
            raise ValidationError("fast_lane_start", names, "a grace (LEVEL:GRACE_S) must be a number") from e
        if not 0.0 <= grace < float("inf"):
            raise ValidationError("fast_lane_start", names,
                                  "each level needs a grace, LEVEL:GRACE_S, a finite number of seconds >= 0")
        floor_s, peer, peer_given = 0.0, 0.0, False
        for part in (x.strip() for x in floors):
            is_peer = part[:1].lower() == "x"
            what = "a peer factor (LEVEL:GRACE_S/xPEER)" if is_peer else "a wait floor (LEVEL:GRACE_S/FLOOR_S)"
            try:
                value = float(part[1:] if is_peer else part)
            except ValueError as e:
                raise ValidationError("fast_lane_start", names, f"{what} must be a number") from e
            if not 0.0 <= value < float("inf") or (is_peer and value == 0.0):
                raise ValidationError("fast_lane_start", names,
                                      f"{what} must be a finite number {'> 0' if is_peer else '>= 0'}")
            if is_peer:
                peer, peer_given = value, True
            else:
                floor_s = value
        if lane is not None and int(Priority[n]) not in fast_lane_levels(lane):
            raise ValidationError("fast_lane_start", names, f"{n} is not a fast-lane level ({lane!r})")
        out[int(Priority[n])] = (grace, floor_s, peer) if peer_given else (grace, floor_s) if floors else grace
    return dict(sorted(out.items()))


def _env_lane_start(name: str, default: str, lane: str) -> str:
    """A ``MAKESPAN_FAST_LANE_START`` value (unset: ``default``, restricted to ``lane``'s
    levels; empty: off), checked against ``lane``."""
    raw = os.environ.get(name)
    if raw is None:
        lanes = fast_lane_levels(lane)
        return ",".join(x for x in default.split(",") if x and fast_lane_levels(x.split(":")[0]).keys() <= lanes.keys())
    try:
        fast_lane_start_grace(raw, lane)
    except ValidationError as e:
        raise ValidationError(name, raw, e.reason) from e
    return raw


def _env_lane(name: str, default: str) -> str:
    """A ``MAKESPAN_FAST_LANE`` value (unset: ``default``; empty: off), checked."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        fast_lane_levels(raw)
    except ValidationError as e:
        raise ValidationError(name, raw, e.reason) from e
    return raw


def _guarantees_to_env(s: Settings) -> dict[str, str]:
    return {"MAKESPAN_PREEMPTION_BUDGET": str(s.preemption_budget),
            "MAKESPAN_PREEMPTION_MIN_RUNTIME_S": repr(s.preemption_min_runtime_s),
            "MAKESPAN_RESERVATION_AFTER_S": repr(s.reservation_after_s),
            "MAKESPAN_FAST_LANE": s.fast_lane,
            "MAKESPAN_FAST_LANE_START": s.fast_lane_start}


# -- transitions (issue 20): their MAKESPAN_* variables --
def parse_slowdown(raw: str, name: str = "MAKESPAN_SIMULATED_SLOWDOWN") -> dict[str, float]:
    """``host=factor,host=factor`` -> {host: factor}; empty -> {}.

    Raises:
        ValidationError: a pair without ``=``, or a factor that is not a positive finite number."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in (raw or "").split(",")):
        if not part:
            continue
        host, sep, value = part.partition("=")
        try:
            factor = float(value)
        except ValueError:
            factor = -1.0
        if not sep or not host.strip() or not (0.0 < factor < float("inf")):
            raise ValidationError(name, raw, "must be host=factor pairs (factor > 0), comma-separated")
        out[host.strip()] = factor
    return out


def _transitions_from_env() -> dict[str, Any]:
    """The transition settings from ``MAKESPAN_*`` (unset: the defaults).

    Raises:
        ValidationError: a minimum outside 1..10000, a quantile outside (0, 1], or a bad
            slowdown list."""
    q = _env_float("MAKESPAN_TRANSITION_QUANTILE", 0.9)
    if not 0.0 < q <= 1.0:
        raise ValidationError("MAKESPAN_TRANSITION_QUANTILE", q, "must be in (0, 1]")
    slow = os.environ.get("MAKESPAN_SIMULATED_SLOWDOWN", "")
    parse_slowdown(slow)
    return {"transition_min_observations": _env_int("MAKESPAN_TRANSITION_MIN_OBSERVATIONS", 5, 1, 10_000),
            "transition_quantile": q, "simulated_slowdown": slow, "prewarm": _env_bool("MAKESPAN_PREWARM")}


def _transitions_to_env(s: Settings) -> dict[str, str]:
    return {"MAKESPAN_TRANSITION_MIN_OBSERVATIONS": str(s.transition_min_observations),
            "MAKESPAN_TRANSITION_QUANTILE": repr(s.transition_quantile),
            "MAKESPAN_SIMULATED_SLOWDOWN": s.simulated_slowdown, "MAKESPAN_PREWARM": "1" if s.prewarm else "0"}
