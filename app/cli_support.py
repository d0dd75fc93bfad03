"""What every ``makespan`` CLI module shares: the settings, Redis and keys of a command,
the one way a command fails (``error: ...`` in red on stderr, exit 2), and the one place
a failure to reach Redis (or a refusal of its credentials) becomes :class:`makespan.RedisUnreachable`'s
(or :class:`makespan.RedisAuthFailed`'s) message."""

from __future__ import annotations

import json
import os
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import redis
import typer
from typer.core import TyperGroup

from makespan.errors import MakespanError, RedisAuthFailed, RedisUnreachable, StoreError, SubmitOutcomeUnknown

if TYPE_CHECKING:  # pragma: no cover
    from makespan.keys import Keys
    from makespan.models import FleetSpec
    from makespan.settings import Settings

#: exit code of ``makespan result`` for a job not finished yet (--no-wait, or --timeout-s
#: passed): not 1 (the job failed) nor 2 (an unknown job), nor 69 (Redis unreachable), nor 3 (a
#: process that refused to start, makespan.redis_conn.EXIT_REFUSED)
EXIT_NOT_FINISHED = 4

#: exit code of ``makespan cancel`` and ``makespan cancel-workload`` when the job (or the
#: workload) had already ended before the call: nothing was cancelled (0: this call
#: cancelled it or asked it to stop; 2: unknown id; 69: Redis unreachable)
EXIT_ALREADY_ENDED = 5

#: exit code of a command that could not reach Redis (:class:`makespan.errors.RedisUnreachable`:
#: refused, timed out, no Sentinel or master): trying again later may work, unlike the
#: permanent errors of exit 2 (bad input, unknown id, refused credentials); BSD's EX_UNAVAILABLE
EXIT_REDIS_UNAVAILABLE = 69

#: exit code of ``makespan submit`` and ``makespan submit-workload`` when Redis took the
#: submit but its reply never came (:class:`makespan.errors.SubmitOutcomeUnknown`): the id is
#: printed on stdout all the same, for the caller to look it up (BSD's EX_TEMPFAIL)
EXIT_OUTCOME_UNKNOWN = 75

#: exit code of a command whose output's reader went away (``makespan jobs | head -2``): 128 +
#: SIGPIPE, as a shell reports ``yes | head``; quietly (click's own handling exited 1, the code of
#: an unexpected error)
EXIT_BROKEN_PIPE = 141


def _quiet_stdout() -> None:
    """Point stdout's file descriptor at /dev/null, so that the interpreter's last flush of
    what is still buffered does not fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass

# the click context of the command running now (set by CliGroup): its parameters name
# the Redis URL of a command with --redis-url
_RUNNING: ContextVar[Any] = ContextVar("makespan_cli_running_command", default=None)


def context() -> tuple[Settings, redis.Redis, Keys]:
    """Settings from the environment, a Redis client and the key builder."""
    from makespan.keys import Keys
    from makespan.redis_conn import connect
    from makespan.settings import Settings

    s = Settings.from_env()
    return s, connect(s.redis_url), Keys(s.key_prefix)


def _command_redis_url() -> str:
    """The Redis URL of the running command: its ``--redis-url`` where it has one, else
    ``MAKESPAN_REDIS_URL`` (else the default), as :class:`makespan.settings.Settings` reads it."""
    ctx = _RUNNING.get()
    if ctx is not None and ctx.params.get("redis_url"):
        return str(ctx.params["redis_url"])
    from makespan.settings import Settings

    try:
        return Settings.from_env().redis_url
    except MakespanError:
        return os.environ.get("MAKESPAN_REDIS_URL", "redis://127.0.0.1:6379/0")


def unreachable_redis(error: BaseException) -> RedisUnreachable | RedisAuthFailed | None:
    """The :class:`RedisUnreachable` or :class:`RedisAuthFailed` that ``error`` amounts to
    (itself; a redis-py ``ConnectionError``, ``TimeoutError``, ``AuthenticationError`` or
    ``AuthorizationError``; a :class:`makespan.StoreError` raised from one), naming the
    running command's Redis URL with the password redacted; None for any other error."""
    if isinstance(error, (RedisUnreachable, RedisAuthFailed)):
        return error
    if isinstance(error, SubmitOutcomeUnknown):  # sent, no reply: its own message says what to do
        return None
    from makespan.redis_conn import AUTH_ERRORS, auth_failed, unreachable

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, AUTH_ERRORS):
            return auth_failed(_command_redis_url(), seen)
        if isinstance(seen, (redis.ConnectionError, redis.TimeoutError)):
            return unreachable(_command_redis_url(), seen)
        seen = seen.__cause__
    return None


def utc_text(unix_s: float) -> str:
    """``unix_s`` as ``YYYY-MM-DD HH:MM:SSZ`` (UTC), as ``why``, ``jobs`` and ``incidents`` print times."""
    import datetime as dt

    return dt.datetime.fromtimestamp(unix_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def ignored_fleet_option(fleet: object, command: str) -> None:
    """Warn on stderr that ``command``'s ``--fleet`` (deprecated, hidden) is ignored when
    one was given: the command reads a job without its fleet. Old invocations go on."""
    if fleet is not None:
        typer.echo(f"warning: --fleet is deprecated and ignored by `makespan {command}` (a job is read without its "
                   "fleet): leave it out", err=True)


def outcome_unknown(e: SubmitOutcomeUnknown, quiet: bool = True) -> None:
    """A submit whose outcome is unknown: its id on stdout (``--quiet``: alone; else as
    ``{"id", "created": null, "outcome": "unknown"}``), the error on stderr, exit
    :data:`EXIT_OUTCOME_UNKNOWN`: a script's ``ID=$(makespan submit -q ...)`` gets the id to look up."""
    typer.echo(e.job_id if quiet else json.dumps({"id": e.job_id, "created": None, "outcome": "unknown"}))
    typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
    raise typer.Exit(EXIT_OUTCOME_UNKNOWN)


def store_error(what: str, error: BaseException) -> StoreError:
    """``StoreError("{what}: {error}")`` raised from ``error``, so that :func:`fail` still tells
    an unreachable Redis (exit :data:`EXIT_REDIS_UNAVAILABLE`) from an error answer."""
    wrapped = StoreError(f"{what}: {error}")
    wrapped.__cause__ = error
    return wrapped


def fail(e: Exception) -> None:
    """Print ``error: {e}`` and exit 2, or :data:`EXIT_REDIS_UNAVAILABLE` when Redis could not
    be reached (:class:`RedisUnreachable`'s message; refused credentials:
    :class:`RedisAuthFailed`'s, exit 2)."""
    e = unreachable_redis(e) or e
    from makespan.redis_conn import answer_is_misconfiguration, answered_with_error

    from makespan.errors import RedisConfigError

    # a refusal (RedisConfigError) and an unknown outcome already say what happened and what to do
    wrong_url = answer_is_misconfiguration(e) if not isinstance(e, (SubmitOutcomeUnknown, RedisConfigError)) else None
    if wrong_url is not None and "answered with an error" not in str(e):  # "reading X: DB index is out of range":
        e = answered_with_error(_command_redis_url(), wrong_url)            # say which URL, and what to check
    typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
    raise typer.Exit(EXIT_REDIS_UNAVAILABLE if isinstance(e, RedisUnreachable) else 2)


class CliGroup(TyperGroup):
    """The ``makespan`` command group: a command that lets a failure to reach Redis
    escape (a redis-py error outside its own error handling) fails as :func:`fail` does,
    with :class:`RedisUnreachable`'s message and exit 69 (or :class:`RedisAuthFailed`'s and exit 2),
    instead of a traceback; so does any other redis-py error that escapes (Redis answered
    with an error: :func:`makespan.redis_conn.answered_with_error`)."""

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None and not getattr(cmd, "_makespan_guarded", False):
            inner = cmd.invoke

            def invoke(sub_ctx: typer.Context) -> Any:
                running = _RUNNING.set(sub_ctx)
                try:
                    return inner(sub_ctx)
                except (typer.Exit, typer.Abort):
                    raise  # the command's own exit, its error already reported
                except BrokenPipeError:  # the reader of its output went away: end quietly
                    _quiet_stdout()
                    raise typer.Exit(EXIT_BROKEN_PIPE) from None
                except Exception as e:
                    if unreachable_redis(e) is not None:
                        fail(e)
                    if isinstance(e, redis.RedisError):  # an error answer the command did not expect: a
                        # database number out of range, WRONGTYPE on a key of another program, not Redis at all
                        from makespan.redis_conn import answered_with_error

                        fail(answered_with_error(_command_redis_url(), e))
                    raise
                finally:
                    _RUNNING.reset(running)

            cmd.invoke = invoke
            cmd._makespan_guarded = True
        return cmd


def published_fleet(r: redis.Redis, keys: Keys, required: bool = True) -> FleetSpec | None:
    """The fleet the planner published (``P:fleet``); None when none is published and not
    ``required``.

    Raises:
        ValidationError: none is published and ``required`` (the message says to give
            ``--fleet``), or what is published does not parse.
        StoreError: Redis failed."""
    import json

    from makespan.errors import StoreError, ValidationError
    from makespan.models import parse_fleet

    try:
        raw = r.get(keys.fleet)
    except redis.RedisError as e:
        raise StoreError(f"reading the published fleet: {e}") from e
    if not raw:
        if required:
            from makespan.settings import redacted_url

            raise ValidationError("fleet", None, f"no planner has published a fleet yet under key prefix "
                                                 f"{keys.prefix!r} at {redacted_url(_command_redis_url())}: give "
                                                 "--fleet FILE, or check MAKESPAN_REDIS_URL and MAKESPAN_KEY_PREFIX "
                                                 "against the planner's", show_value=False)
        return None
    try:
        return parse_fleet(json.loads(raw))
    except ValueError as e:  # not JSON (a JSONDecodeError): another program's key under this prefix
        raise ValidationError("fleet", None, f"the published fleet ({keys.fleet}) is not a fleet: {e}; another "
                              "program's key under this prefix? give each deployment a MAKESPAN_KEY_PREFIX of "
                              "its own", show_value=False) from e


def dead_here(consumer: str) -> bool:
    """Whether GPU worker consumer id ``consumer`` (``machine:pid:suffix``,
    :func:`makespan.registry.holder_id`) names a process of this machine that no longer runs
    (a worker killed and started again: its liveness mark outlives it by up to its TTL)."""
    import socket

    machine, _, rest = consumer.partition(":")
    pid_text = rest.partition(":")[0]
    if machine != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def held_only_by_the_dead_here(r, keys, name: str) -> bool:
    """Whether every GPU worker whose live mark holds workload ``name`` (``P:fn:holders``)
    is a process of this machine that no longer runs (:func:`dead_here`): a worker killed
    a moment ago, whose 30 s mark outlives it (``ready`` said ready while ``makespan hosts``
    already showed the host down: a Celery user's check).

    Raises:
        redis.RedisError: Redis failed."""
    seconds, micros = r.time()
    holders = r.zrangebyscore(keys.fn_holders(name), seconds * 1000 + micros // 1000, "+inf")
    return bool(holders) and all(dead_here(holder) for holder in holders)
