"""One exception root for makespan, translated at the boundaries.

Every error raised on purpose by makespan derives from :class:`MakespanError`.
redis-py errors are wrapped (``raise StoreError(...) from e``) at the store layer so
that callers never need to import redis to handle a failure.
"""

from __future__ import annotations

from typing import Any


class MakespanError(Exception):
    """Root of every makespan error.

    Every one pickles and copies with its attributes (``job_id``, ``error_type``, ``url``…):
    a :class:`WorkloadError` raised in a ``ProcessPoolExecutor`` or multiprocessing worker, a
    logging queue, or a Celery result backend reaches the caller as itself."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own reduce calls cls(*self.args): the subclasses whose __init__ takes
        # other arguments than the message (WorkloadError(job_id, error_type, message…))
        # could not be rebuilt from it
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[MakespanError], args: tuple[Any, ...], state: dict[str, Any]) -> MakespanError:
    """The error ``cls`` with ``args`` and attributes ``state``, without calling its
    ``__init__`` (:meth:`MakespanError.__reduce__`)."""
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class ValidationError(MakespanError):
    """Input (a job, a fleet file, a CLI argument) is invalid; nothing was changed.

    The message is one line: ``[source: ]field: reason (got value)``, the reason's line
    breaks (a YAML parser's message) folded into spaces; ``show_value=False`` leaves out
    ``(got value)`` where no value was given (a missing fleet, a missing endpoint), so
    the message says only what to do.

    Attributes:
        field: dotted path of the offending field, e.g. ``"endpoints.coder.tensor_parallel"``.
        value: the offending value (already redacted when it may hold a secret).
        source: the file the field was read from (a fleet, workload or trace file), or None.
        also: the other problems found in the same input, each ``field: reason (got value)``
            (a fleet file with three bad fields names all three; at most
            :data:`makespan.models.MORE_ERRORS_SHOWN`), after ``; also`` in the message.
    """

    def __init__(self, field: str, value: Any, reason: str, source: str | None = None, *, show_value: bool = True,
                 also: tuple[str, ...] = ()):
        self.field = field
        self.value = value
        self.reason = " ".join(str(reason).split())
        self.source = source
        self.show_value = show_value
        self.also = also
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        where = f"{source}: " if source else ""
        got = f" (got {shown})" if show_value else ""
        more = f"; also {'; '.join(also)}" if also else ""
        super().__init__(f"{where}{field}: {self.reason}{got}{more}")

    def in_file(self, path: object) -> ValidationError:
        """This error, naming ``path`` as the file the field was read from (kept when it
        already names one)."""
        if self.source is not None:
            return self
        return ValidationError(self.field, self.value, self.reason, source=str(path), show_value=self.show_value,
                               also=self.also)


class NotFoundError(MakespanError):
    """A job, lease or workload id is unknown."""


class PlannerError(MakespanError):
    """The planner could not produce a plan (never raised for a merely infeasible job:
    those are rejected at submit time)."""


class LeaseError(MakespanError):
    """A lease could not be acquired, renewed or released as asked."""


class StaleFencingToken(LeaseError):
    """The caller's fencing token is older than the GPU's current lease: stop acting."""


class LeaseLostDuringPhase(StaleFencingToken):
    """The lease ran out (not renewed within its TTL: the worker was paused, overloaded or
    cut off from Redis) while a phase waited or sent requests: its run is given up."""


class PhaseError(MakespanError):
    """A phase (evict, start endpoint, execute, clear, restore) failed."""


class NoEndpointServer(PhaseError):
    """``ctx.requests`` on a job whose endpoint runs no server (a simulated endpoint: no
    ``launch`` driver with a process): a retry cannot help, so the run is not retried."""


class PhaseCancelled(PhaseError):
    """A phase stopped early because its job's cancel was requested (the job ends
    ``cancelled``, not ``failed``)."""


class StoreError(MakespanError):
    """Redis could not be reached or answered an error; wraps the redis-py exception."""


class StoreBug(StoreError):
    """Redis answered, but refused the command itself: a Lua script that raised
    (``ERR user_script:...``), ``WRONGTYPE``, a wrong number of arguments, an argument
    redis-py cannot send. A bug in makespan (or a key someone else wrote), not an outage:
    waiting does not help. :func:`makespan.redis_conn.store_error` raises it (its class also
    derives from the redis-py class it wraps); :func:`makespan.redis_conn.is_store_bug`
    tells a bug from an outage, also for a redis-py error that was never wrapped. The
    message starts with the command or script that failed (``"script promote_delayed: ..."``)."""


class SubmitOutcomeUnknown(StoreError):
    """A submit whose script was sent but whose reply never came (a read timeout, the
    connection closed mid-reply): the job (or workload: ``job_id``, chosen by the client)
    may or may not be written. Not a :class:`RedisUnreachable`: resubmitting without the
    same idempotency key can run the job twice; look it up first (``makespan status ID``,
    ``makespan workload-status ID``).

    Attributes:
        job_id: the id the job (or the workload) has if it was written."""

    def __init__(self, job_id: str, message: str):
        self.job_id = job_id
        super().__init__(message)


class RedisUnreachable(StoreError):
    """No Redis answered at the deployment's URL (connection refused, unknown host,
    timeout; through Sentinel: no Sentinel answered, or they know no master of the URL's
    service name, or see it down): the message names the URL (password redacted), why, and
    ``MAKESPAN_REDIS_URL`` (``hint``: what to do; :attr:`SERVICE_HINT` for a wrong service name).

    Attributes:
        url: the URL tried, password redacted.
    """

    HINT = "start Redis there, or set MAKESPAN_REDIS_URL (or makespan.connect(url=...)) to your makespan deployment's Redis"
    SERVICE_HINT = ("name a service the Sentinels monitor in MAKESPAN_REDIS_URL "
                    "(redis+sentinel://[USER]:PASSWORD@S1:PORT,.../SERVICE/DB, or makespan.connect(url=...))")

    def __init__(self, url: str, reason: str, hint: str = HINT):
        self.url = url
        super().__init__(f"cannot reach Redis at {url} ({reason}): {hint}")


class RedisAuthFailed(StoreError):
    """Redis answered but refused the deployment's credentials (a wrong or missing
    password, an ACL user that is unknown or lacks a command): the message names the URL
    (password redacted) and where the password goes.

    Attributes:
        url: the URL tried, password redacted.
    """

    HINT = ("put the deployment's password in MAKESPAN_REDIS_URL as redis://[USER]:PASSWORD@HOST:PORT/DB "
            "(or makespan.connect(url=...))")
    SENTINEL_DATA_HINT = ("put the deployment's password in MAKESPAN_REDIS_URL as "
                          "redis+sentinel://[USER]:PASSWORD@S1:PORT,.../SERVICE/DB (the primary's and replicas' AUTH; "
                          "or makespan.connect(url=...))")
    SENTINEL_HINT = ("the Sentinels' own password goes in the URL's query as ?sentinel_password=PASSWORD "
                     "(&sentinel_username=USER for an ACL user); the URL's [USER]:PASSWORD@ is the primary's")

    def __init__(self, url: str, reason: str, hint: str = HINT):
        self.url = url
        super().__init__(f"Redis at {url} refused the credentials ({reason}): {hint}")


class WorkloadError(MakespanError):
    """A workload function raised: :meth:`makespan.client.Job.result` re-raises its error.

    Attributes:
        job_id: the job whose function raised.
        error_type: the exception's qualified class name (``"ValueError"``, ``"mymod.MyError"``).
        message: ``str()`` of the exception.
        traceback: the formatted traceback from the GPU worker (text; empty when the
            failure was not an exception, e.g. a result over the size limit).
        attempt: the attempt (1-based) whose failure this is.
    """

    def __init__(self, job_id: str, error_type: str, message: str, traceback: str = "", attempt: int = 1):
        self.job_id, self.error_type, self.message = job_id, error_type, message
        self.traceback, self.attempt = traceback, attempt
        said = f"{error_type}: {message}" if message else f"{error_type} (no message)"  # as the worker's log says it
        super().__init__(f"job {job_id} failed (attempt {attempt}): {said}")


class JobCancelled(MakespanError):
    """:meth:`makespan.client.Job.result` of a job that ended ``cancelled``.

    Attributes: ``job_id``; ``reason``, the job record's reason (a user's or a workload's
    cancel, or ``dependency ID did not complete``); ``dependency``, the id of the dependency
    whose failure or cancel cancelled this job (its own ``result()`` raises the root
    error), else None."""

    def __init__(self, job_id: str, reason: str = "", dependency: str | None = None):
        self.job_id, self.reason, self.dependency = job_id, reason, dependency
        super().__init__(f"job {job_id} was cancelled: {reason}" if reason else f"job {job_id} was cancelled")


class JobFailed(MakespanError):
    """:meth:`makespan.client.Job.result` of a job that failed without a workload error
    of its own (its lease was lost too often, a phase failed): ``reason`` says why."""

    def __init__(self, job_id: str, state: str, reason: str):
        self.job_id, self.state, self.reason = job_id, state, reason
        super().__init__(f"job {job_id} {state}: {reason}")


class ResultExpired(NotFoundError):
    """:meth:`makespan.client.Job.result` of a workload function's job that completed, but
    whose result is gone: results live ``MAKESPAN_RESULT_TTL_S`` (the GPU workers' setting)
    from the job's end. A :class:`NotFoundError` (``makespan result`` exits 2), not a return
    value of None: the function may have returned None."""


class ResultTimeout(MakespanError, TimeoutError):
    """:meth:`makespan.client.Job.result` / ``wait`` ran out of ``timeout_s`` before the job ended
    (also a :class:`TimeoutError`, so ``except TimeoutError`` and ``asyncio.timeout`` code catch it).
    Attributes: ``job_id`` and ``state``, the job's state when the wait ended ("" when not
    given)."""

    def __init__(self, message: str, job_id: str = "", state: str = ""):
        self.job_id, self.state = job_id, state
        super().__init__(message)


class RedisConfigError(StoreError):
    """Redis is configured in a way that breaks makespan's guarantees (an evicting
    ``maxmemory-policy``); the process refuses to run. Attributes: ``setting``, ``value``."""

    def __init__(self, setting: str, value: str, reason: str):
        self.setting, self.value = setting, value
        super().__init__(f"Redis {setting} is {value!r}: {reason}")


def utf8_text(value: object) -> str:
    """``str(value)`` with any lone surrogate (``os.fsdecode`` of bytes that are not UTF-8,
    text read with ``surrogateescape``) written as backslash text (``\\udce9``), so it
    can be encoded as UTF-8: logged, sent through Celery or xdist, stored, decoded by
    Lua's cjson (which refuses a lone surrogate's JSON escape). Other text is unchanged."""
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def is_utf8(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8 (no lone surrogate): a name or id that does not
    can never be a key in Redis (redis-py raises UnicodeEncodeError)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
