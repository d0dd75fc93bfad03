"""The client API: ``makespan.connect()`` → :class:`Client` → :class:`Job`.

::

    import makespan

    client = makespan.connect()                       # MAKESPAN_REDIS_URL by default
    job = client.submit("render_cards", cards, priority="HIGH")
    print(job.result(timeout_s=600))                  # the function's return value

The fleet comes from Redis, where the planner publishes it at start with its version
(``P:fleet``, ``P:fleet:version``), so a producer needs no fleet file; one passed to
:func:`connect` is checked against the published one. A workload name must have been
registered by a live GPU worker (:mod:`makespan.registry`); its definition gives the
default endpoint and the planning estimate when ``service_s`` is not given
(:mod:`makespan.estimates`). Everything is validated before anything is written
(:class:`makespan.errors.ValidationError`); the write itself is the one atomic submit
script of :class:`makespan.producer.Producer`, the layer underneath.

Waiting calls (:meth:`Job.result`, :meth:`Job.wait`) poll the job record with a
backoff from 10 ms to 250 ms; :meth:`Job.result_async` and :meth:`Job.wait_async` are
their asyncio twins (redis-py's asyncio client, no thread per waiter): the waiters of one
event loop share one client of at most :data:`ASYNC_MAX_CONNECTIONS` connections, however
many wait, closed when its last waiter ends (so ``asyncio.run`` called again and again
leaves none open). A wait rides out a Redis restart or
failover: connection errors are retried with the poll's backoff for up to
:data:`WAIT_RECONNECT_S` (not past its ``timeout_s``), then raised as
:class:`makespan.errors.RedisUnreachable`, as a submit raises them.
"""

from __future__ import annotations

import asyncio
import json
import math
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio
import redis.sentinel

from makespan.errors import (JobCancelled, JobFailed, ResultExpired, ResultTimeout, StoreError,
                             SubmitOutcomeUnknown, ValidationError, WorkloadError, is_utf8)
from makespan.keys import Keys
from makespan.models import FINAL_STATES, FleetSpec, Priority, fleet_version, load_fleet, parse_fleet
from makespan.producer import CancelOutcome, Producer, ended_dependency_warnings, job_not_found
from makespan.redis_conn import AUTH_ERRORS, auth_failed, unreachable
from makespan.registry import WorkloadDef, check_call, submit_definition
from makespan.results import REFERENCE, UNRESOLVED_REFERENCE
from makespan.settings import Settings, is_sentinel_url

if TYPE_CHECKING:
    from makespan.workloads import Workload, WorkloadSpec

T = TypeVar("T")
log = logging.getLogger("makespan.client")

_POLL_MIN_S, _POLL_MAX_S = 0.01, 0.25
_DEPENDENCY_CANCEL = re.compile(r"dependency (\S+) did not complete")
ASYNC_MAX_CONNECTIONS = 8  # connections the asyncio waiters of one client and event loop share
WAIT_RECONNECT_S = 30.0  # how long a wait retries a lost Redis (a restart, a Sentinel failover) before it raises


def connect(url: str | None = None, *, fleet: str | Path | FleetSpec | None = None, key_prefix: str | None = None,
            settings: Settings | None = None) -> Client:
    """A :class:`Client` on the Redis at ``url`` (default ``MAKESPAN_REDIS_URL``, else
    ``redis://127.0.0.1:6379/0``).

    Args:
        fleet: a fleet file or spec to check against the one the planner published
            (a mismatch is a ValidationError at the first submit); when no planner has
            published one yet, submits are validated against this one.
        key_prefix: the deployment's key prefix (default ``MAKESPAN_KEY_PREFIX`` or ``makespan``).
    Raises:
        ValidationError: a bad URL or fleet file.
        RedisUnreachable: no Redis answers at the URL (the message names it and
            ``MAKESPAN_REDIS_URL``).
        RedisAuthFailed: Redis refused the URL's credentials (a wrong or missing password).
        StoreError: the server answered with an error (a database number it does not
            have; not a Redis server at that address).
    """
    from makespan.redis_conn import answered_with_error, connect as redis_connect

    if url is not None and not isinstance(url, str):
        raise ValidationError("url", url, "must be a Redis URL string, e.g. redis://127.0.0.1:6379/0")
    base = settings or Settings.from_env()
    overrides: dict[str, Any] = {}
    if url:
        overrides["redis_url"] = url
    if key_prefix:
        overrides["key_prefix"] = key_prefix
    if overrides:
        from dataclasses import replace

        base = replace(base, **overrides)
    spec = load_fleet(fleet) if isinstance(fleet, (str, Path)) else fleet
    r = redis_connect(base.redis_url)
    try:
        r.ping()
    except AUTH_ERRORS as e:
        r.close()
        raise auth_failed(base.redis_url, e) from None
    except (redis.ConnectionError, redis.TimeoutError) as e:  # a Sentinel refusing AUTH too (unreachable())
        r.close()
        raise unreachable(base.redis_url, e) from None
    except redis.RedisError as e:  # answered with an error: a database number out of range, not Redis
        r.close()
        raise answered_with_error(base.redis_url, e) from None
    return Client(r, base, spec)


class Client:
    """Producer side of one makespan deployment (one Redis, one key prefix).

    Thread-safe (redis-py's connection pool); create one per process."""

    def __init__(self, r: redis.Redis, settings: Settings, fleet: FleetSpec | None = None):
        self.r, self.settings = r, settings
        self.keys = Keys(settings.key_prefix)
        self._own_fleet = fleet
        # (version, fleet) of the last published fleet read: one attribute, so threads that
        # re-read it at once never pair one read's version with another's fleet
        self._published: tuple[str | None, FleetSpec | None] = (None, None)
        self._producer = Producer(r, self.keys, None, settings)
        # event loop -> [the asyncio client its waiters share (bound to that loop), waiters using it]
        self._async: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        self._async_lock = threading.Lock()  # loops in several threads share the dict

    # -- the fleet ----------------------------------------------------------------------
    def fleet(self, version: str | None = "") -> FleetSpec:
        """The fleet the planner published (re-read when its version changes; ``version``:
        the published version when the caller has just read it), else the one given to
        :func:`connect`.

        Raises:
            ValidationError: no planner has published a fleet and none was given, or the
                given one differs from the published one.
            StoreError: Redis failed."""
        try:
            if version == "":
                version = self.r.get(self.keys.fleet_version)
            cached_version, published = self._published
            if version is None or version != cached_version:
                raw = self.r.get(self.keys.fleet)
                published = parse_fleet(json.loads(raw)) if raw else None
                self._published = (version if raw else None, published)
        except redis.RedisError as e:
            raise StoreError(f"reading the published fleet: {e}") from e
        if published is None:
            if self._own_fleet is None:
                from makespan.settings import redacted_url

                raise ValidationError("fleet", None, f"no planner has published a fleet yet under key prefix "
                                                     f"{self.keys.prefix!r} at {redacted_url(self.settings.redis_url)}: "
                                                     "start `makespan planner --fleet FILE` (with the same "
                                                     "MAKESPAN_REDIS_URL and MAKESPAN_KEY_PREFIX), or give the fleet "
                                                     "yourself (--fleet FILE on the command line, "
                                                     "makespan.connect(fleet=...) in Python)", show_value=False)
            return self._own_fleet
        if self._own_fleet is not None and fleet_version(self._own_fleet) != fleet_version(published):
            raise ValidationError("fleet", self._own_fleet.name,
                                  f"differs from the fleet the planner published (version {fleet_version(published)}, "
                                  f"given {fleet_version(self._own_fleet)}): use the planner's fleet file, or give none (omit "
                                  "--fleet on the command line, fleet= in Python)")
        return published

    # -- submit -------------------------------------------------------------------------
    def submit(self, workload: str | WorkloadDef, /, *args: Any, priority: Priority | str | int = "NORMAL",
               endpoint: str | None = None, idempotency_key: str | None = None,
               depends_on: str | Job | list[str | Job] | tuple[str | Job, ...] | None = (), delay_s: float | None = None,
               service_s: float | None = None, deadline_s: float | None = None, **kwargs: Any) -> Job:
        """Submit a call of ``workload(*args, **kwargs)`` (a registered name, or the
        :class:`~makespan.registry.WorkloadDef` the decorator returned).

        A :class:`Job` among the top-level ``args``/``kwargs`` is passed as that job's
        result value, and the new job depends on it. Keyword arguments named like this
        method's options (:data:`SUBMIT_OPTIONS`) are taken as options: pass a function's
        parameter of such a name positionally (``workload`` is positional-only here, so a
        keyword ``workload=`` reaches the function).

        Args:
            priority: CRITICAL, HIGH, NORMAL (default) or LOW.
            endpoint: the endpoint to run on (default: the workload's own).
            idempotency_key: a repeated key returns the existing job (``job.created`` False).
            depends_on: jobs (or ids) that must complete first: one job or id, or a list of them.
            delay_s: queue the job only this many wall seconds from now.
            service_s: planning estimate, workload seconds (default: learned, see
                :mod:`makespan.estimates`).
            deadline_s: due time, workload seconds after submission (tardiness policies).
        Returns:
            The :class:`Job`.
        Raises:
            ValidationError: unknown workload or endpoint, a workload no GPU worker ever
                registered (one whose workers all stopped, restart or died is accepted: the
                job waits with reason ``waiting_for_function``, or ``host_down`` while those
                workers' hosts are down, and a warning is logged on ``makespan.client``),
                arguments that do not bind to the function's parameters,
                arguments that are not JSON or too large, a ``depends_on`` id that names
                no job, ... (nothing written; limits: docs/configuration.md, "Jobs").
            StoreError: Redis failed.
        """
        return self._redis_call(lambda: self._submit(workload, args, priority, endpoint, idempotency_key, depends_on,
                                                     delay_s, service_s, deadline_s, kwargs))

    def _submit(self, workload: str | WorkloadDef, args: tuple[Any, ...], priority: Priority | str | int,
                endpoint: str | None, idempotency_key: str | None, depends_on: str | Job | list[str | Job] | tuple[str | Job, ...] | None,
                delay_s: float | None, service_s: float | None, deadline_s: float | None, kwargs: dict[str, Any]) -> Job:
        name = workload.name if isinstance(workload, WorkloadDef) else workload
        if not isinstance(name, str) or not name or not is_utf8(name):
            raise ValidationError("workload", workload, "must be a workload name or a @makespan.workload function")
        if endpoint is not None and (not isinstance(endpoint, str) or not is_utf8(endpoint)):
            raise ValidationError("endpoint", endpoint, "must be an endpoint name of the fleet")
        depends_on = _dependencies(depends_on)
        definition, (version,), last_hosts = submit_definition(self.r, self.keys, name, [self.keys.fleet_version])
        endpoint = endpoint or definition.get("endpoint")
        if not endpoint:
            raise ValidationError("endpoint", None, f"workload {name!r} has no default endpoint: pass endpoint= "
                                                    "(--endpoint on the command line), or give the decorator one",
                                  show_value=False)
        deps = [d.id if isinstance(d, Job) else d for d in depends_on]
        call_args = [self._argument(a, deps) for a in args]
        call_kwargs = {k: self._argument(v, deps) for k, v in kwargs.items()}
        try:
            check_call(definition, call_args, call_kwargs)
        except ValidationError as e:
            taken = sorted({p.get("name") for p in definition.get("parameters") or []} & SUBMIT_OPTIONS)
            if not taken:
                raise
            raise ValidationError(e.field, e.value, f"{e.reason}; submit() takes the keyword(s) {', '.join(taken)} "
                                                    "as its own option(s): pass such an argument positionally",
                                  show_value=e.show_value) from None
        estimated = service_s is None
        if estimated:
            from makespan.estimates import estimate_s

            prior = definition.get("expected_s") or self.settings.default_service_s
            service_s, _runs = estimate_s(self.r, self.keys, name, endpoint, float(prior), self.settings.estimate_min_runs)
        job: dict[str, Any] = {"endpoint": endpoint, "priority": priority, "service_s": service_s, "workload": name,
                               "args": call_args, "kwargs": call_kwargs}
        if definition.get("helpers"):  # placed with the job: priced and checked against the fleet
            job["helpers"] = list(definition["helpers"])
        if idempotency_key is not None:
            job["idempotency_key"] = idempotency_key
        if deps:
            job["depends_on"] = list(dict.fromkeys(deps))
        if delay_s is not None:
            job["delay_s"] = delay_s
        if deadline_s is not None:
            job["deadline_s"] = deadline_s
        self._producer.fleet = self.fleet(version)
        if endpoint not in self._producer.fleet.endpoints and endpoint == definition.get("endpoint"):
            known = ", ".join(sorted(self._producer.fleet.endpoints))  # the decorator's: the user gave none
            raise ValidationError("endpoint", endpoint, f"the endpoint of workload {name!r} (its decorator's, as the "
                                  f"GPU worker registered it) is not in the planner's fleet (known: {known}): "
                                  "pass endpoint= (--endpoint), or restart the planner with the GPU workers' fleet "
                                  "file")
        handle = self._producer.submit(job, extra_fields={"service_estimated": 1} if estimated else None)
        if last_hosts and handle.created:
            log.warning("job %s of workload %r waits, queued, until a GPU worker registers the function again: "
                        "none is live now, the GPU workers of %s registered it last (stopped, restarting, dead, or running now without its module in --workloads); "
                        "`makespan why %s` says what it waits for", handle.id, name, ", ".join(last_hosts), handle.id)
        if deps and handle.created:
            for warning in ended_dependency_warnings(self.r, self.keys, deps, delayed=bool(delay_s)):
                log.warning("job %s: %s", handle.id, warning)
        return Job(self, handle.id, created=handle.created, ignored=handle.ignored)

    def submit_job(self, endpoint: str, *, service_s: float, priority: Priority | str | int = "NORMAL",
                   payload: dict[str, Any] | None = None, idempotency_key: str | None = None,
                   depends_on: str | Job | list[str | Job] | tuple[str | Job, ...] | None = (), delay_s: float | None = None,
                   deadline_s: float | None = None) -> Job:
        """Submit a job that calls no workload function, as ``makespan submit --endpoint E
        --service-s S`` does: its execute holds the endpoint's GPUs for ``service_s``
        workload seconds (a modelled job, e.g. on simulated hosts), or, with a ``payload``
        of ``{"requests": N, ...}``, sends N requests to the endpoint's instance
        (docs/concepts.md). The options are :meth:`submit`'s.

        Returns:
            The :class:`Job` (``job.wait()`` for its end; it has no result value).
        Raises:
            ValidationError: an unknown endpoint, a bad ``service_s``, ``priority``,
                ``payload`` or ``depends_on`` id (nothing written).
            StoreError: Redis failed.
        """
        def submit() -> Job:
            job: dict[str, Any] = {"endpoint": endpoint, "service_s": service_s, "priority": priority}
            for field, value in (("payload", payload), ("idempotency_key", idempotency_key), ("delay_s", delay_s),
                                 ("deadline_s", deadline_s)):
                if value is not None:
                    job[field] = value
            deps = [d.id if isinstance(d, Job) else d for d in _dependencies(depends_on)]
            if deps:
                job["depends_on"] = list(dict.fromkeys(deps))
            self._producer.fleet = self.fleet()
            handle = self._producer.submit(job)
            if deps and handle.created:
                for warning in ended_dependency_warnings(self.r, self.keys, deps, delayed=bool(delay_s)):
                    log.warning("job %s: %s", handle.id, warning)
            return Job(self, handle.id, created=handle.created, ignored=handle.ignored)

        return self._redis_call(submit)

    async def submit_async(self, workload: str | WorkloadDef, /, *args: Any, **kwargs: Any) -> Job:
        """:meth:`submit` for asyncio (an ``async def`` web handler, an arq or FastAPI app):
        the same arguments, options, checks and errors, run in a worker thread
        (``asyncio.to_thread``) so the event loop is not blocked by the Redis round trips."""
        return await asyncio.to_thread(self.submit, workload, *args, **kwargs)

    # -- multi-step workloads -----------------------------------------------------------
    def submit_workload(self, workload: Workload | WorkloadSpec | dict[str, Any] | str | Path) -> str:
        """Validate a multi-step workload (a :class:`~makespan.workloads.Workload` built
        in Python, its dict or :class:`~makespan.workloads.WorkloadSpec`, or a YAML/JSON
        file's path) against the fleet the planner published, as :meth:`submit` does, and
        enqueue all its steps at once (docs/workloads.md).

        Returns:
            The workload id (hex): :meth:`workload_status`, :meth:`cancel_workload`.
        Raises:
            ValidationError: an invalid workload or file, or no published fleet (nothing written).
            StoreError: Redis failed (nothing or everything written, see
                :func:`makespan.workloads.submit_workload`).
        """
        from makespan.workloads import load_workload, submit_workload

        def submit() -> str:
            fleet = self.fleet()
            spec = load_workload(workload, fleet) if isinstance(workload, (str, Path)) else workload
            return submit_workload(self.r, self.keys, fleet, spec, self.settings)
        return self._redis_call(submit)

    def workload_status(self, workload_id: str) -> dict[str, Any]:
        """A workload's ``{id, name, priority, state, reason, retry_budget, submitted_at,
        finished_at, failed_at, deps, steps: {step: {job, state, retries, attempts, reason,
        started_at, finished_at}}}`` with one JSON type per kind of value (counts int,
        times unix s float or None, each with an ISO-8601 UTC ``{field}_utc`` twin;
        :func:`makespan.workloads.workload_status` gives the types), as ``makespan
        workload-status ID`` prints it; state ``running``, ``completed``, ``failed`` or
        ``cancelled``.

        Raises:
            NotFoundError: no such workload.
            StoreError: Redis failed.
        """
        from makespan.workloads import workload_status

        return self._redis_call(lambda: workload_status(self.r, self.keys, workload_id))

    def cancel_workload(self, workload_id: str) -> dict[str, int]:
        """Cancel a workload: queued steps at once, running ones at their next phase
        boundary; finished steps keep their results. Returns ``{"cancelled": n queued
        steps, "cancel_requested": n running steps}``.

        Raises:
            NotFoundError: no such workload.
            StoreError: Redis failed.
        """
        from makespan.workloads import cancel_workload

        return self._redis_call(lambda: cancel_workload(self.r, self.keys, workload_id))

    def _redis_call(self, call: Callable[[], T]) -> T:
        """``call()``, with Redis's connection and authentication errors (raw or as the
        cause of a StoreError) raised as :class:`RedisUnreachable` / :class:`RedisAuthFailed`."""
        try:
            return call()
        except SubmitOutcomeUnknown:
            raise  # sent, no reply: not "cannot reach Redis" (a new submit may run the job twice)
        except StoreError as e:
            if isinstance(e.__cause__, AUTH_ERRORS):
                raise auth_failed(self.settings.redis_url, e.__cause__) from None
            if isinstance(e.__cause__, (redis.ConnectionError, redis.TimeoutError)):
                raise unreachable(self.settings.redis_url, e.__cause__) from None
            raise
        except AUTH_ERRORS as e:
            raise auth_failed(self.settings.redis_url, e) from None
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise unreachable(self.settings.redis_url, e) from None

    @staticmethod
    def _argument(value: Any, deps: list[str]) -> Any:
        if isinstance(value, Job):
            deps.append(value.id)
            return {REFERENCE: value.id}
        return value

    def job(self, job_id: str) -> Job:
        """A handle on an existing job (its existence is checked by its first call).

        Raises:
            ValidationError: ``job_id`` is not a non-empty string (a job id, as a submit
                returned it)."""
        if not isinstance(job_id, str) or not job_id.strip():
            raise ValidationError("job_id", job_id, "must be a job id, the string a submit returned")
        return Job(self, job_id)

    def _async_acquire(self) -> redis.asyncio.Redis:
        """The running event loop's shared asyncio client, created for its first waiter (at
        most :data:`ASYNC_MAX_CONNECTIONS` connections; a waiter beyond them waits for one).
        Pair with :meth:`_async_release`."""
        loop = asyncio.get_running_loop()
        with self._async_lock:
            entry = self._async.get(loop)
            if entry is None:
                from urllib.parse import urlparse

                from makespan.redis_conn import TCP_ONLY_OPTIONS, client_options

                options = client_options(self.settings)
                if urlparse(self.settings.redis_url).scheme == "unix":
                    options = {k: v for k, v in options.items() if k not in TCP_ONLY_OPTIONS}
                pool = redis.asyncio.BlockingConnectionPool.from_url(
                    self.settings.redis_url, max_connections=ASYNC_MAX_CONNECTIONS, timeout=None,
                    decode_responses=True, **options)
                entry = self._async[loop] = [redis.asyncio.Redis(connection_pool=pool), 0]
            entry[1] += 1
            return entry[0]

    async def _async_release(self, client: redis.asyncio.Redis) -> None:
        """One waiter of :meth:`_async_acquire` is done; the last one closes the client
        (a loop's connections do not outlive its waits: an entry kept per loop held every
        loop ``asyncio.run`` made, with its connections)."""
        loop = asyncio.get_running_loop()
        with self._async_lock:
            entry = self._async.get(loop)
            if entry is None or entry[0] is not client:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del self._async[loop]
        await client.aclose()
        await client.connection_pool.disconnect()

    def close(self) -> None:
        """Close the Redis connections (the asyncio waiters' close with their last waiter)."""
        self.r.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


#: :meth:`Client.submit`'s keyword options: a keyword argument of one of these names is the
#: option, not an argument of the function (the CLI's --kwargs refuses them)
SUBMIT_OPTIONS = frozenset({"priority", "endpoint", "idempotency_key", "depends_on", "delay_s", "service_s",
                            "deadline_s"})


def _dependencies(depends_on: Any) -> list[str | Job]:
    """``depends_on`` as a list: a lone job or id (a string is one id, not its characters),
    a list or tuple of them, or None (none).

    Raises:
        ValidationError: anything else."""
    if depends_on is None:
        return []
    if isinstance(depends_on, (str, Job)):
        return [depends_on]
    if not isinstance(depends_on, (list, tuple)):
        raise ValidationError("depends_on", repr(depends_on)[:200], "must be a job, a job id, or a list of them")
    return list(depends_on)


class _Outage:
    """A wait's view of a lost Redis (module doc): connection errors and timeouts are
    retried for up to :data:`WAIT_RECONNECT_S`, not past the wait's deadline; any other
    error, or one past those, is raised (a lost connection as :class:`RedisUnreachable`)."""

    def __init__(self, url: str):
        self.url = url
        self.since: float | None = None  # when the current outage began (the wait's clock), s
        self.retry_s = _POLL_MIN_S

    def failed(self, error: StoreError, now: float, deadline: float | None) -> None:
        cause = error.__cause__
        if isinstance(cause, AUTH_ERRORS):
            raise auth_failed(self.url, cause) from None
        if not isinstance(cause, (redis.ConnectionError, redis.TimeoutError)):
            raise error
        if self.since is None:
            self.since, self.retry_s = now, _POLL_MIN_S
            # the wait's own deadline may come first (--no-wait, --timeout-s 3): say the real limit
            limit_s = WAIT_RECONNECT_S if deadline is None else max(0.0, min(WAIT_RECONNECT_S, deadline - now))
            log.warning("waiting on a job: Redis connection lost (%s); retrying for up to %.1f s", cause, limit_s)
        if now - self.since >= WAIT_RECONNECT_S or (deadline is not None and now >= deadline):
            raise unreachable(self.url, cause) from None

    def pause(self, now: float, deadline: float | None) -> float:
        """The pause before the next try, s (doubling from 10 ms to 1 s; not past the deadline)."""
        pause, self.retry_s = self.retry_s, min(self.retry_s * 2, 1.0)
        return pause if deadline is None else max(0.0, min(pause, deadline - now))


def _not_finished(job_id: str, state: str, timeout_s: float) -> ResultTimeout:
    """The error of a wait that ended before the job did (``timeout_s`` 0: a look, no wait)."""
    if timeout_s == 0:
        return ResultTimeout(f"job {job_id} is {state}: not finished yet", job_id, state)
    return ResultTimeout(f"job {job_id} still {state} after {timeout_s:g} s", job_id, state)


def _timeout(timeout_s: Any) -> float | None:
    """``timeout_s`` checked: None (no limit) or a finite number of seconds >= 0.

    Raises:
        ValidationError: NaN, infinite, negative or not a number (a NaN deadline never passes)."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) \
            or timeout_s < 0:
        raise ValidationError("timeout_s", timeout_s, "must be None or a finite number of seconds >= 0")
    return float(timeout_s)


class Job:
    """A submitted job: its id, and calls to follow it.

    Attributes:
        id: the job id (32 hex digits).
        created: False when :meth:`Client.submit` returned an existing job of the same
            idempotency key.
        ignored: with ``created`` False, what that submit asked for differently from the
            existing job (e.g. ``("priority", "args")``): not used, the key returns the
            first job as it was submitted (:class:`makespan.producer.JobHandle`); ``()``
            otherwise.
    """

    def __init__(self, client: Client, job_id: str, created: bool = True, ignored: tuple[str, ...] = ()):
        self.client, self.id, self.created, self.ignored = client, job_id, created, ignored

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def __eq__(self, other: object) -> bool:
        """Two handles are equal when they name the same job on the same Redis URL and key
        prefix (``client.job(job.id) == job``), so jobs can go in sets and be dict keys."""
        if not isinstance(other, Job):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def _identity(self) -> tuple[str, str, str]:
        return self.id, self.client.keys.prefix, self.client.settings.redis_url

    def status(self) -> dict[str, Any]:
        """The job record: ``state`` (queued, delayed, leased, running, completed, failed,
        cancelled), times (unix s, each with an ISO-8601 UTC ``{field}_utc`` twin), ``attempts``, ``reason``, progress fields; a leased or
        running job's ``gpus`` (the UUIDs its lease holds), ``phase`` (the phase running
        now: evict, start_endpoint, execute or clear; None between phases) and
        ``phases_done`` (:meth:`makespan.producer.Producer.status`).

        Raises:
            NotFoundError: no such job (or it expired after its retention).
            RedisUnreachable, RedisAuthFailed: Redis cannot be reached (as every client call).
            StoreError: another Redis failure."""
        return self.client._redis_call(lambda: self.client._producer.status(self.id))

    @property
    def state(self) -> str:
        """The job's state now (one Redis read per access: it blocks; in asyncio code read
        ``(await job.status_async())["state"]``).

        Raises:
            NotFoundError: no such job (or it expired after its retention).
            RedisUnreachable, RedisAuthFailed, StoreError: as :meth:`status`."""
        return str(self.status()["state"])

    def cancel(self) -> str:
        """Cancel: a queued or delayed job at once; a running one's function sees
        ``ctx.cancelled`` and is stopped after ``Settings.cancel_grace_s``. Returns the
        outcome (``cancelled``, ``cancel_requested``) or the final state; to tell a cancel
        that did something from one that found the job already ended, see
        :meth:`cancel_outcome`. A running job's function that returns before it sees the
        cancel completes: the outcome is then ``cancel_requested`` and the job ends
        ``completed`` with its result (the cancel acts at the function's next check or the
        next phase boundary).

        Raises:
            NotFoundError: no such job.
            RedisUnreachable, RedisAuthFailed, StoreError: as :meth:`status`."""
        return self.client._redis_call(lambda: self.client._producer.cancel(self.id))

    async def status_async(self) -> dict[str, Any]:
        """:meth:`status` for asyncio (in a worker thread)."""
        return await asyncio.to_thread(self.status)

    async def cancel_async(self) -> str:
        """:meth:`cancel` for asyncio (in a worker thread)."""
        return await asyncio.to_thread(self.cancel)

    async def cancel_outcome_async(self) -> CancelOutcome:
        """:meth:`cancel_outcome` for asyncio (in a worker thread)."""
        return await asyncio.to_thread(self.cancel_outcome)

    def cancel_outcome(self) -> CancelOutcome:
        """Cancel as :meth:`cancel` does; returns what this call did
        (:class:`makespan.producer.CancelOutcome`: ``state``, ``already_ended``,
        ``requested_before``, ``finished_at``, ``cancelled_now``).

        Raises:
            NotFoundError: no such job.
            RedisUnreachable, RedisAuthFailed, StoreError: as :meth:`status`."""
        return self.client._redis_call(lambda: self.client._producer.cancel_outcome(self.id))

    def wait(self, timeout_s: float | None = None) -> str:
        """Block until the job ends; returns its final state.

        Raises:
            ResultTimeout: ``timeout_s`` passed first (``job_id``, ``state``).
            NotFoundError: no such job.
            RedisUnreachable: Redis stayed unreachable past the wait's outage limit (a
                shorter outage is ridden out).
            ValidationError: ``timeout_s`` is negative or not a number."""
        timeout_s = _timeout(timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = _POLL_MIN_S
        outage = _Outage(self.client.settings.redis_url)
        while True:
            try:
                state = self._state()
            except StoreError as e:
                outage.failed(e, time.monotonic(), deadline)  # raises once the outage is too long
                time.sleep(outage.pause(time.monotonic(), deadline))
                continue
            outage.since = None
            if state in FINAL_STATES:
                return state
            if deadline is not None and time.monotonic() >= deadline:
                raise _not_finished(self.id, state, timeout_s)
            time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(pause * 1.5, _POLL_MAX_S)

    def result(self, timeout_s: float | None = None) -> Any:
        """Wait for the job and return its function's return value.

        Raises:
            WorkloadError: the function raised (type, message, traceback) on its last
                attempt, or its run failed in the GPU worker (``error_type``
                ``makespan.ResultTooLarge``, ``makespan.ResultNotJson``, ``makespan.WorkloadTimeout``,
                ``makespan.UnknownWorkload``).
            JobCancelled: the job was cancelled (``job_id``, ``reason``, and ``dependency``: the
                dependency whose failure or cancel cancelled it, else None).
            JobFailed: it failed without an error of its function's run (e.g. its lease
                expired ``max_attempts`` times, a transition failed).
            ResultTimeout: ``timeout_s`` passed first (``job_id``, ``state``).
            ResultExpired: it completed, but its result is gone (kept ``MAKESPAN_RESULT_TTL_S``
                after the job ends); a :class:`NotFoundError`.
            NotFoundError: no such job.
            RedisUnreachable, ValidationError: as :meth:`wait`."""
        return self._outcome(self.wait(timeout_s))

    def _state(self) -> str:
        if not is_utf8(self.id):
            raise job_not_found(self.id, self.client.keys, self.client.settings)
        try:
            state = self.client.r.hget(self.client.keys.job(self.id), "state")
        except redis.RedisError as e:
            raise StoreError(f"job {self.id}: {e}") from e
        if state is None:
            raise job_not_found(self.id, self.client.keys, self.client.settings)
        return state

    def _ago(self, field: str) -> str:
        """`` at 2026-12-07T03:04:05Z (52 s ago)`` from the job's unix-s ``field`` ('' when unset)."""
        import datetime

        try:
            at = float(self._field(field) or "")
            seconds, micros = self.client.r.time()
        except (ValueError, redis.RedisError, StoreError):
            return ""
        stamp = datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f" at {stamp} ({seconds + micros / 1e6 - at:.0f} s ago)"

    def _outcome(self, state: str) -> Any:
        from makespan.results import read

        rec = read(self.client.r, self.client.keys, self.id)
        if state == "completed":
            if rec is None and self._field("fn"):  # a function's job whose result expired: not "None"
                raise ResultExpired(f"job {self.id} completed{self._ago('finished_at')}, but its result is gone: a "
                                    "result is kept MAKESPAN_RESULT_TTL_S after the job ends, as the GPU worker "
                                    f"that ran it was set ({self.client.settings.result_ttl_s:g} s in this "
                                    "process's environment; the workers' may differ)")
            if rec is None or not rec.get("ok"):
                return None  # a job without a workload function
            return rec.get("value")
        if state == "cancelled":
            reason = self._reason()
            failed_dependency = _DEPENDENCY_CANCEL.match(reason)  # workers/batch.py's reason for a dependant
            raise JobCancelled(self.id, reason, failed_dependency.group(1) if failed_dependency else None)
        if rec is not None and not rec.get("ok"):
            err = rec.get("error") or {}
            raise WorkloadError(self.id, err.get("type", "Error"), err.get("message", ""), err.get("traceback", ""),
                                int(rec.get("attempt", 1)))
        reason = self._reason()
        if (rec is None and self._field("fn") and reason.startswith("execute: ")  # its stored error expired
                and not reason.startswith(f"execute: {UNRESOLVED_REFERENCE}")):  # (no error: the function never ran)
            reason += (" (the function's stored error, with its type and traceback, is gone: it is kept "
                       "MAKESPAN_RESULT_TTL_S after the job ends; this is the reason the job's record keeps)")
        raise JobFailed(self.id, state, reason)

    def _reason(self) -> str:
        return self._field("reason")

    def _field(self, name: str) -> str:
        """One field of the job's record ("" when absent)."""
        try:
            return self.client.r.hget(self.client.keys.job(self.id), name) or ""
        except redis.RedisError as e:
            raise StoreError(f"job {self.id}: {e}") from e

    # -- asyncio twins ------------------------------------------------------------------
    async def wait_async(self, timeout_s: float | None = None) -> str:
        """:meth:`wait` for asyncio (redis-py's asyncio client; cancellable). With a Sentinel
        URL (redis-py's asyncio Sentinel is not wired here) each poll is a short blocking read
        in a worker thread, the pauses on the loop: no thread is held for the whole wait."""
        timeout_s = _timeout(timeout_s)
        if not is_utf8(self.id):
            raise job_not_found(self.id, self.client.keys, self.client.settings)
        url = self.client.settings.redis_url
        sentinel = is_sentinel_url(url)
        aredis = None if sentinel else self.client._async_acquire()
        key = self.client.keys.job(self.id)
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        pause = _POLL_MIN_S
        outage = _Outage(url)
        task = asyncio.current_task()
        cancelling = task.cancelling() if task is not None else 0  # cancels the caller swallowed before this wait
        try:
            while True:
                try:
                    if aredis is not None:
                        state = await aredis.hget(key, "state")
                    else:
                        state = await asyncio.to_thread(self.client.r.hget, key, "state")
                    if task is not None and task.cancelling() > cancelling:  # redis-py can return a read the task's
                        raise asyncio.CancelledError  # cancellation hit (a verifier: wait_for hung, 3 %)
                except redis.RedisError as e:
                    error = StoreError(f"job {self.id}: {e}")
                    error.__cause__ = e
                    outage.failed(error, loop.time(), deadline)  # raises once the outage is too long
                    await asyncio.sleep(outage.pause(loop.time(), deadline))
                    continue
                outage.since = None
                if state is None:
                    raise job_not_found(self.id, self.client.keys, self.client.settings)
                if state in FINAL_STATES:
                    return str(state)
                if deadline is not None and loop.time() >= deadline:
                    raise _not_finished(self.id, state, timeout_s)
                await asyncio.sleep(pause if deadline is None else max(0.0, min(pause, deadline - loop.time())))
                pause = min(pause * 1.5, _POLL_MAX_S)
        finally:
            if aredis is not None:
                await self.client._async_release(aredis)

    async def result_async(self, timeout_s: float | None = None) -> Any:
        """:meth:`result` for asyncio."""
        state = await self.wait_async(timeout_s)
        return await asyncio.to_thread(self._outcome, state)
