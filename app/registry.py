"""Workload functions: ``@makespan.workload`` and the registry GPU workers publish.

A workload function is user code that a job runs in its execute phase, on the GPUs the
planner leased for it, after the transitions the plan needed (evict, start or wake the
endpoint)::

    import makespan

    @makespan.workload(endpoint="renderer", retries=2, expected_s=30)
    def render_cards(ctx, cards):
        ...                       # ctx: makespan.workers.functions.WorkloadContext
        return {"rendered": len(cards)}

The decorator registers the function in this process's :data:`REGISTRY` under its name
(default ``module.qualname``, as Celery names tasks) and returns a :class:`WorkloadDef`,
which is still callable like the function. A GPU worker imports the modules named by
``--workloads`` (``MAKESPAN_WORKLOADS``), the way ``celery -A`` does, and publishes the
definitions to Redis (:func:`publish`) with a liveness key per name that it renews; a
producer (:class:`makespan.client.Client`) rejects a workload name that no live worker
registered. Arguments and results are JSON only (no pickle).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, overload

import redis

from makespan.errors import MakespanError, StoreError, ValidationError
from makespan.keys import Keys
from makespan.models import MAX_SERVICE_S
from makespan.store.scripts import script as store_script

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-]{0,199}$")
LIVE_TTL_S = 30.0  # a worker renews its names every LIVE_TTL_S / 3


@dataclass(frozen=True)
class WorkloadDef:
    """A registered workload function and how its jobs run.

    Attributes:
        name: the name producers submit (unique per deployment).
        fn: ``fn(ctx, *args, **kwargs)``, returning a JSON value.
        endpoint: the endpoint its jobs run on unless the submit names another; None:
            the submit must name one.
        helpers: endpoints a job needs beside its main one (see docs/workloads.md: they
            are started on the job's GPUs after the main endpoint and stopped by the
            clear phase).
        retries: how often a job whose function raised is run again (0: never).
        retry_backoff_s: the wait before retry n is ``retry_backoff_s × 2^(n−1)`` s.
        timeout_s: wall seconds the function may run; then its ``ctx.cancelled`` is set
            and the job fails (and is retried while retries are left). None: no limit.
        expected_s: the planning estimate until enough runs were measured
            (:mod:`makespan.estimates`), workload seconds.
    """

    name: str
    fn: Callable[..., Any] = field(compare=False)
    endpoint: str | None = None
    helpers: tuple[str, ...] = ()
    retries: int = 0
    retry_backoff_s: float = 1.0
    timeout_s: float | None = None
    expected_s: float | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def describe(self) -> dict[str, Any]:
        """The JSON definition published to Redis (everything but the code)."""
        return {"name": self.name, "endpoint": self.endpoint, "helpers": list(self.helpers),
                "retries": self.retries, "retry_backoff_s": self.retry_backoff_s,
                "timeout_s": self.timeout_s, "expected_s": self.expected_s,
                "module": getattr(self.fn, "__module__", None), "parameters": describe_parameters(self.fn)}


def describe_parameters(fn: Callable[..., Any]) -> list[dict[str, Any]] | None:
    """The parameters a submit must bind, after the first (``ctx``): a list of
    ``{"name", "kind", "required"}`` with ``kind`` one of :class:`inspect.Parameter`'s
    kind names (``POSITIONAL_OR_KEYWORD``, ``VAR_POSITIONAL``, ...). None when the
    function has no inspectable signature (a builtin): then nothing is checked."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if parameters and parameters[0].kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        parameters = parameters[1:]  # ctx, passed by the GPU worker
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [{"name": p.name, "kind": p.kind.name,
             "required": p.default is inspect.Parameter.empty and p.kind not in variadic}
            for p in parameters]


def check_call(definition: dict[str, Any], args: list[Any] | tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Check that ``args``/``kwargs`` bind to the published parameters of a workload
    (``definition`` as :func:`live_definition` returns it), as Python would bind them
    at run time, so a wrong call is refused at submit instead of failing (and using up
    a retry) on the GPU worker. A definition published without parameters (a worker
    of an older makespan) is not checked.

    Raises:
        ValidationError: the arguments do not bind (the message is Python's: a missing
            or unexpected argument, too many positional ones)."""
    published = definition.get("parameters")
    if published is None:
        return
    try:
        signature = inspect.Signature([
            inspect.Parameter(p["name"], getattr(inspect.Parameter, p["kind"]),
                              default=inspect.Parameter.empty if p["required"] else None)
            for p in published])
    except (KeyError, TypeError, ValueError, AttributeError):
        return  # a description this version cannot read: the worker checks at run time
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        shown = _signature_text(published)
        given = f"{len(args)} positional argument{'' if len(args) == 1 else 's'}" + (
            f" and keyword arguments {', '.join(sorted(kwargs))}" if kwargs else "")
        raise ValidationError("args", None, f"do not match {definition.get('name')}({shown}) (makespan passes its "
                              f"ctx first; give the others): {e}; this submit gave {given}",
                              show_value=False) from None


def _signature_text(published: list[dict[str, Any]]) -> str:
    """A function's published parameters (less its ctx) as Python writes them: ``a, /, b=…,
    *, c`` (``/`` after the positional-only ones, ``*`` before the keyword-only ones when no
    ``*args`` stands there), an optional one with ``=…``."""
    stars = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}
    parts: list[str] = []
    kinds = [p["kind"] for p in published]
    for index, p in enumerate(published):
        if p["kind"] == "KEYWORD_ONLY" and "KEYWORD_ONLY" not in kinds[:index] and "VAR_POSITIONAL" not in kinds:
            parts.append("*")
        parts.append(stars.get(p["kind"], "") + p["name"] + ("" if p["required"] or p["kind"] in stars else "=…"))
        if p["kind"] == "POSITIONAL_ONLY" and (index + 1 == len(kinds) or kinds[index + 1] != "POSITIONAL_ONLY"):
            parts.append("/")
    return ", ".join(parts)


REGISTRY: dict[str, WorkloadDef] = {}


def _seconds(value: Any, field_name: str, allow_none: bool) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValidationError(f"workload.{field_name}", value, "must be a positive, finite number of seconds")
    return float(value)


def _takes_ctx(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` can be called with the run's context as its first positional argument
    (a builtin whose signature cannot be read counts as yes)."""
    try:  # the function as called: a functools.wraps wrapper's own parameters, not its body's
        parameters = list(inspect.signature(fn, follow_wrapped=False).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)
    return bool(parameters) and parameters[0].kind in positional


@overload
def workload(endpoint: Callable[..., Any], /) -> WorkloadDef: ...


@overload
def workload(endpoint: str | None = None, *, helpers: Iterable[str] = (), name: str | None = None, retries: int = 0,
             retry_backoff_s: float = 1.0, timeout_s: float | None = None,
             expected_s: float | None = None) -> Callable[[Callable[..., Any]], WorkloadDef]: ...


def workload(endpoint: str | Callable[..., Any] | None = None, *, helpers: Iterable[str] = (), name: str | None = None,
             retries: int = 0, retry_backoff_s: float = 1.0, timeout_s: float | None = None,
             expected_s: float | None = None) -> Callable[[Callable[..., Any]], WorkloadDef] | WorkloadDef:
    """Register a workload function (see the module docstring). ``@makespan.workload``
    without parentheses registers it with every option at its default.

    An ``async def`` function is run to completion on an event loop of its own (in its
    run's thread, ``asyncio.run``); a generator function is refused. Its first parameter
    receives the run's :class:`makespan.WorkloadContext` (``ctx``).

    Raises:
        ValidationError: a bad option (negative retries, a non-positive time or an
            ``expected_s`` over 30 days, an endpoint or helper that is not a non-empty name,
            ``helpers`` given as one string, a name with characters other than letters,
            digits and ``_.:-``), a generator function, a function with no first parameter
            for ``ctx``, or a second, different function under a name already registered
            in this process (the same module's function defined again, as a reload or a
            re-run notebook cell does, replaces it)."""
    if callable(endpoint):  # @makespan.workload, no parentheses: the function itself
        if helpers or name is not None or retries or retry_backoff_s != 1.0 or timeout_s is not None \
                or expected_s is not None:  # makespan.workload(fn, name=...): the options would be dropped
            raise ValidationError("workload", getattr(endpoint, "__qualname__", endpoint),
                                  "options go in the decorator's call: @makespan.workload(name=..., retries=...)")
        return workload()(endpoint)
    if endpoint is not None and (not isinstance(endpoint, str) or not endpoint.strip()):
        raise ValidationError("workload.endpoint", endpoint, "must be an endpoint name of the fleet (a non-empty "
                                                             "string), or omitted")
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100:
        raise ValidationError("workload.retries", retries, "must be a whole number from 0 to 100")
    backoff = _seconds(retry_backoff_s, "retry_backoff_s", allow_none=False)
    timeout = _seconds(timeout_s, "timeout_s", allow_none=True)
    expected = _seconds(expected_s, "expected_s", allow_none=True)
    if expected is not None and expected > MAX_SERVICE_S:  # every submit would refuse it as service_s
        raise ValidationError("workload.expected_s", expected_s, f"must be at most {MAX_SERVICE_S:.0f} s (30 days)")
    if isinstance(helpers, str):  # tuple("embed") would be ('e', 'm', 'b', 'e', 'd')
        raise ValidationError("workload.helpers", helpers, f"must be a list of endpoint names: helpers=[{helpers!r}]")
    helper_names = tuple(helpers)
    bad_helper = next((h for h in helper_names if not isinstance(h, str) or not h.strip()), None)
    if helper_names and bad_helper is not None:
        raise ValidationError("workload.helpers", bad_helper, "must be endpoint names of the fleet (non-empty strings)")
    if endpoint is not None and endpoint in helper_names:
        raise ValidationError("workload.helpers", helper_names, "must not name the main endpoint")

    def register(fn: Callable[..., Any]) -> WorkloadDef:
        if not callable(fn):
            raise ValidationError("workload", fn, "decorates a function")
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise ValidationError("workload", getattr(fn, "__qualname__", fn),
                                  "is a generator function: its result would be a generator, which is not JSON; "
                                  "return a list (or report steps with ctx.progress)")
        if not _takes_ctx(fn):
            raise ValidationError("workload", getattr(fn, "__qualname__", fn),
                                  "takes no positional parameter: its first one receives the run's context, "
                                  "e.g. def run(ctx, *args)")
        if name is None and not hasattr(fn, "__qualname__"):  # a functools.partial, a callable object
            raise ValidationError("workload", fn, "has no __qualname__ to name it by: give name=")
        wname = name or f"{fn.__module__}.{fn.__qualname__}"
        if not _NAME.match(wname):
            hint = "; give it one with name=" if name is None else ""  # a lambda, a nested function: '<lambda>'
            raise ValidationError("workload.name", wname, f"use letters, digits and '_.:-' (at most 200){hint}")
        definition = WorkloadDef(wname, fn, endpoint, helper_names, retries, float(backoff or 1.0), timeout, expected)
        old = REGISTRY.get(wname)
        where = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))  # noqa: E731
        redefined = old is not None and where(old.fn) == where(fn)  # its module reloaded, a notebook cell re-run
        if old is not None and not redefined and getattr(old.fn, "__code__", None) is not getattr(fn, "__code__", None):
            raise ValidationError("workload.name", wname, "already registered by "
                                  f"{old.fn.__module__}.{getattr(old.fn, '__qualname__', '?')}: give this one another "
                                  "name=")
        REGISTRY[wname] = definition
        return definition

    return register


def load_modules(modules: str | Iterable[str]) -> list[str]:
    """Import the user modules that define workload functions (``"a.b,c"`` or a list).

    Returns:
        The names registered after the imports.
    Raises:
        ValidationError: a module cannot be imported, or its code raised while it was
            imported (a SyntaxError, a RuntimeError: named with the file and line; the
            error is chained); a decorator's own ValidationError as it is."""
    names = [m.strip() for m in (modules.split(",") if isinstance(modules, str) else modules) if m.strip()]
    import os
    import sys

    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `celery -A` does: the user's modules sit where the worker starts
    for module in names:
        try:
            with _slow_import_warning(module):
                importlib.import_module(module)
        except (ImportError, TypeError) as e:  # TypeError: a relative name ("./jobs.py") without a package
            hint = ""
            if module.endswith(".py") or "/" in module:  # a file path: a module name is asked
                dotted = module.removesuffix(".py").strip("./").replace("/", ".")
                hint = f" (--workloads takes a module name, as python -m does: did you mean {dotted!r}?)"
            # an import inside the module failed (not the module itself): where, as for other errors
            inside = _raised_at(e) if isinstance(e, ImportError) and e.name and e.name != module else ""
            raise ValidationError("workloads", module, f"cannot import: {e}{inside}{hint}") from e
        except MakespanError:
            raise  # a bad decorator option, a name registered twice: its own error says what
        except Exception as e:  # noqa: BLE001 - the module's own code raised (or does not parse)
            raise ValidationError("workloads", module, f"importing it raised {type(e).__name__}: {e}"
                                                       f"{_raised_at(e)}") from e
    return sorted(REGISTRY)


SLOW_IMPORT_WARN_S = 30.0  # a workload module still importing after this long is logged with its stack


@contextlib.contextmanager
def _slow_import_warning(module: str) -> Iterator[None]:
    """Log a WARNING, with the importing thread's stack, if the import of ``module``
    takes longer than :data:`SLOW_IMPORT_WARN_S` (a module that waits on a network
    share, a lock or a model download at import time): a GPU worker that hangs there
    says where, instead of nothing."""
    import logging
    import sys
    import threading
    import traceback

    importer = threading.get_ident()
    started = time.monotonic()

    def warn() -> None:
        frame = sys._current_frames().get(importer)
        stack = "".join(traceback.format_stack(frame)[-8:]) if frame is not None else "(stack not available)\n"
        logger = logging.getLogger("makespan.registry")
        text = (f"importing workload module {module!r} has taken {time.monotonic() - started:.0f} s and goes on; the "
                f"importing thread is at:\n{stack.rstrip()}")
        if logger.hasHandlers():
            logger.warning("%s", text)
        else:  # a GPU worker imports before Celery sets its logging up: a line of the same shape on stderr
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
            sys.stderr.write(f"[{stamp}: WARNING/makespan.registry] {text}\n")
            sys.stderr.flush()

    timer = threading.Timer(SLOW_IMPORT_WARN_S, warn)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _raised_at(error: BaseException) -> str:
    """`` at FILE:LINE`` of where ``error`` was raised (a SyntaxError: the line that does
    not parse), '' when unknown."""
    import traceback

    if isinstance(error, SyntaxError) and error.filename:
        return f" at {error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def publish(r: redis.Redis, keys: Keys, definitions: Iterable[WorkloadDef], ttl_s: float = LIVE_TTL_S,
            holder: str = "", refused: dict[str, str] | None = None, host: str = "") -> None:
    """Publish ``definitions`` and mark each name live for ``ttl_s``, with ``holder`` (the
    GPU worker's id, :func:`holder_id`) among its holders and ``host`` (its fleet host; ''
    unknown) among the hosts the planner places the name's jobs on (a GPU worker calls this
    at start and every ``ttl_s / 3``; :func:`withdraw` when it stops). ``refused`` (name -> why,
    the definitions this worker does not publish) is written for ``ttl_s`` too, for
    ``makespan ready`` and a submit (:func:`live_definition`) to name.

    Raises:
        StoreError: Redis failed."""
    hold = store_script(r, "fn_hold")
    pipe = r.pipeline(transaction=False)
    for name, why in (refused or {}).items():
        pipe.set(keys.fn_refused(name), why, px=int(ttl_s * 1000))
    for d in definitions:
        pipe.set(keys.fn(d.name), json.dumps(d.describe()))
        hold(keys=[keys.fn_live(d.name), keys.fn_holders(d.name), keys.fn_hosts(d.name)],
             args=[holder, int(ttl_s * 1000), host, int(HOST_MARKS_KEPT_S * 1000)], client=pipe)
        pipe.sadd(keys.fns, d.name)
    try:
        pipe.execute()
    except redis.RedisError as e:
        raise StoreError(f"publishing workload functions: {e}") from e


def withdraw(r: redis.Redis, keys: Keys, names: Iterable[str], holder: str, host: str = "") -> list[str]:
    """``holder`` (a GPU worker that stops cleanly) no longer holds ``names``: each name
    whose other holders' marks have all expired stops being live at once, so a submit is
    refused now rather than accepted until the TTL runs out; and its fleet ``host``'s marks
    of them end (:func:`end_host_marks`; '' none): a worker restarted there without one of
    them gets none of its jobs while another host's worker has it.

    Returns:
        The names no longer live (sorted).
    Raises:
        StoreError: Redis failed."""
    gone = store_script(r, "fn_withdraw")
    pipe = r.pipeline(transaction=False)
    names = sorted(names)
    for name in names:
        gone(keys=[keys.fn_live(name), keys.fn_holders(name)], args=[holder], client=pipe)
    try:
        ended = [name for name, ended in zip(names, pipe.execute()) if ended]
    except redis.RedisError as e:
        raise StoreError(f"withdrawing workload functions: {e}") from e
    if host:
        end_host_marks(r, keys, host, names, past=True)
    return ended


def end_host_marks(r: redis.Redis, keys: Keys, host: str, names: Iterable[str], past: bool = False) -> int:
    """Fleet ``host``'s GPU worker does not hold ``names``: with ``past`` (it held them and
    stopped cleanly) the host's live mark of each (``P:fn:hosts:{name}``) ends now and is
    kept as a past holder's (:func:`function_placement`: no mark live, the jobs wait for a
    worker that registers it); without (it started without them, or found a job of one it
    lacks) the host's mark is dropped, live or not: it is no holder, so it is never one of
    the last holders either, unless it is the only host marked: then its mark ends now and
    is kept (a function no host has any more is not "any host": its jobs stay queued,
    ``waiting_for_function``, until a worker registers it). Another worker of the same host
    that holds one marks it again at its next renewal.

    Returns:
        How many marks ended or were dropped.
    Raises:
        StoreError: Redis failed."""
    names = sorted(set(names))
    if not host or not names:
        return 0
    try:
        return int(store_script(r, "fn_host_gone")(keys=[keys.fn_hosts(name) for name in names],
                                                    args=[host, "past" if past else "drop"]))
    except redis.RedisError as e:
        raise StoreError(f"ending host {host!r}'s workload function marks: {e}") from e


def end_host_marks_except(r: redis.Redis, keys: Keys, host: str, held: Iterable[str]) -> int:
    """At a GPU worker's start: drop fleet ``host``'s marks of every workload function ever
    published (``P:fns``) but ``held`` (the names this worker publishes): a worker that
    restarted without one (after a crash, or after its marks expired) gets none of its jobs
    while another host's worker has it, or ever had it. Returns how many marks it dropped.

    Raises:
        StoreError: Redis failed."""
    if not host:
        return 0
    try:
        known = r.smembers(keys.fns)
    except redis.RedisError as e:
        raise StoreError(f"reading the published workload functions: {e}") from e
    return end_host_marks(r, keys, host, {str(name) for name in known} - set(held))


HOST_MARKS_KEPT_S = 7 * 24 * 3600.0  # P:fn:hosts:{name} outlives its last renewal by this (function_hosts)


def function_hosts(r: redis.Redis, keys: Keys, name: str) -> tuple[str, ...]:
    """The fleet hosts the planner places workload ``name``'s jobs on (``P:fn:hosts:{name}``),
    sorted; one round trip: :func:`function_placement`'s hosts.

    Raises:
        redis.RedisError: Redis failed."""
    return function_placement(r, keys, name)[0]


def function_placement(r: redis.Redis, keys: Keys, name: str) -> tuple[tuple[str, ...], bool]:
    """(hosts, live) of workload ``name`` (``P:fn:hosts:{name}``; one round trip): the hosts
    whose live GPU worker registers it (marks not expired on the Redis server's clock) and
    True; when no mark is live (the workers that had it stopped, died, or restarted without
    it), the hosts that registered it last (marks renewed within one :data:`LIVE_TTL_S` of
    the latest; the key is kept :data:`HOST_MARKS_KEPT_S` after its last renewal, a host's
    mark as long after its own) and False: the planner keeps its jobs queued
    (``waiting_for_function``) until a worker registers it again, rather than send them to a
    host without it. ((), True) when no host ever marked it (workers from before these
    marks): any host.

    Raises:
        redis.RedisError: Redis failed."""
    pipe = r.pipeline(transaction=False)
    pipe.time()
    pipe.zrange(keys.fn_hosts(name), 0, -1, withscores=True)
    (seconds, micros), marks = pipe.execute()
    now_ms = seconds * 1000 + micros // 1000
    live = tuple(sorted(host for host, expires_ms in marks if expires_ms > now_ms))
    if live or not marks:
        return live, True
    # the last holders: the marks renewed within one TTL of the latest (a host whose worker
    # dropped the function days ago is not among them)
    latest_ms = max(expires_ms for _host, expires_ms in marks)
    return tuple(sorted(host for host, expires_ms in marks if expires_ms >= latest_ms - LIVE_TTL_S * 1000)), False


def listing(r: redis.Redis, keys: Keys) -> list[dict[str, Any]]:
    """Every workload function a GPU worker has registered under ``keys`` (``P:fns``), or
    refuses to publish now (``P:fn:refused:{name}``), sorted by name, for ``makespan functions``: ``{"name", "live", "hosts", "hosts_live",
    "refused", "signature", "definition"}``. ``live``: a live GPU worker registers it now;
    ``hosts``: where the planner places its jobs (:func:`function_placement`: the live
    marks, else the hosts that had it last, ``hosts_live`` False); ``refused``: why a live
    worker does not publish it (it names an endpoint the fleet lacks), else None;
    ``signature``: its parameters after ``ctx`` as Python writes them (None: not published);
    ``definition``: the published JSON (:meth:`WorkloadDef.describe`), {} when unreadable.
    A name whose definition was deleted is left out.

    Raises:
        StoreError: Redis failed."""
    try:
        # a name a live worker refuses to publish (it names an endpoint the worker's fleet lacks)
        # was never registered: found by its refusal, the listing's most needed line (a verifier)
        refused_prefix = keys.fn_refused("")
        refused_names = {key[len(refused_prefix):] for key in r.scan_iter(match=keys.fn_refused("*"), count=1000)}
        names = sorted(set(r.smembers(keys.fns)) | refused_names)
        if not names:
            return []
        pipe = r.pipeline(transaction=False)
        for name in names:
            pipe.get(keys.fn(name))
            pipe.exists(keys.fn_live(name))
            pipe.get(keys.fn_refused(name))
        answers = pipe.execute()
        out = []
        for index, name in enumerate(names):
            raw, live, refused = answers[3 * index: 3 * index + 3]
            if raw is None and not refused:
                continue
            try:
                definition = json.loads(raw) if raw else {}
            except ValueError:
                definition = {}
            if not isinstance(definition, dict):
                definition = {}
            hosts, hosts_live = function_placement(r, keys, name)
            parameters = definition.get("parameters")
            out.append({"name": name, "live": bool(live), "hosts": list(hosts), "hosts_live": hosts_live,
                        "refused": refused, "definition": definition,
                        "signature": _signature_text(parameters) if isinstance(parameters, list) else None})
        return out
    except redis.RedisError as e:
        raise StoreError(f"reading the workload functions: {e}") from e


def holder_id() -> str:
    """A GPU worker process's holder id: host name, pid and a random suffix."""
    import os
    import socket
    import uuid

    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def live_names(r: redis.Redis, keys: Keys) -> list[str]:
    """The workload function names a live GPU worker registers now, sorted.

    Raises:
        StoreError: Redis failed."""
    try:
        known = sorted(r.smembers(keys.fns))
        return [n for n, ok in zip(known, r.mget([keys.fn_live(n) for n in known]) if known else []) if ok]
    except redis.RedisError as e:
        raise StoreError(f"reading the live workload functions: {e}") from e


def live_definition(r: redis.Redis, keys: Keys, name: str, also: list[str] = ()) -> tuple[dict[str, Any], list[Any]]:
    """The published definition of ``name``, if a live GPU worker registered it, and the
    values of the keys ``also`` (read in the same round trip).

    Raises:
        ValidationError: no live worker registered ``name`` (the message lists the live names,
            and the closest to ``name`` when one is close: a misspelt name; or, when a live
            worker refused to publish it, why: it names an endpoint the fleet lacks; or the
            hosts whose workers registered it last).
        StoreError: Redis failed."""
    definition, extra, last_hosts = submit_definition(r, keys, name, also)
    if last_hosts:
        raise ValidationError("workload", name, f"no live GPU worker registers it now: {_gone(last_hosts)}")
    return definition, extra


def submit_definition(r: redis.Redis, keys: Keys, name: str,
                      also: list[str] = ()) -> tuple[dict[str, Any], list[Any], tuple[str, ...]]:
    """(definition, the values of the keys ``also``, last hosts) of workload ``name`` for a
    submit: its published definition when a live GPU worker registers it (last hosts
    ``()``), or when none does now but the workers of some hosts registered it last
    (:func:`function_placement`: their marks are kept :data:`HOST_MARKS_KEPT_S`; a rolling
    restart, a crash): then those hosts, and the job waits, queued, with reason
    ``waiting_for_function`` until a worker registers it again, as the jobs queued before.

    Raises:
        ValidationError: ``name`` was never registered (or not within the marks' 7 days):
            the message lists the live names, and the closest to ``name`` when one is close
            (a misspelt name); when a live worker refused to publish it, why (it names an
            endpoint the fleet lacks).
        StoreError: Redis failed."""
    try:
        live, raw, *extra = r.mget([keys.fn_live(name), keys.fn(name), *also])
        if live and raw:
            return json.loads(raw), extra, ()
        refused = r.get(keys.fn_refused(name))
        hosts, marks_live = function_placement(r, keys, name) if raw and not refused else ((), False)
        if hosts:  # marks live without the live key: a renewal in between; else the hosts that had it last
            return json.loads(raw), extra, () if marks_live else hosts
        alive = live_names(r, keys)
        known = bool(r.scard(keys.fns))
    except (redis.RedisError, StoreError) as e:
        # the redis-py error as the cause (live_names raises a StoreError made from one; redis-py
        # 8 chains the OS error under its own ConnectionError, so that one's cause is no redis error)
        cause = e.__cause__ if isinstance(e, StoreError) and e.__cause__ is not None else e
        raise StoreError(f"reading workload function {name!r}: {e}") from cause
    if refused:
        raise ValidationError("workload", name, f"its GPU worker does not publish it: {refused}")
    if alive:
        hint = f"live now: {', '.join(alive)}"
    elif known:
        hint = "no GPU worker is live now: the workers that registered functions under this key prefix stopped"
    else:
        hint = (f"no GPU worker has registered any workload function under key prefix {keys.prefix!r} "
                "(MAKESPAN_KEY_PREFIX: the GPU workers' must be the same)")
    close = closest_name(name, alive)
    guess = f"; did you mean {close!r}?" if close else ""
    raise ValidationError("workload", name, "no live GPU worker registered this workload; start one with "
                                            f"`makespan gpu-worker --workloads MODULE` ({hint}){guess}")


def _gone(last_hosts: tuple[str, ...]) -> str:
    """The words on a function that no live worker registers now, whose ``last_hosts`` had it."""
    return (f"the GPU workers of {', '.join(last_hosts)} registered it last (stopped, restarting, dead, or running now without its module in --workloads); "
            "`makespan ready NAME` waits for one")


def closest_name(name: str, alive: list[str]) -> str | None:
    """The live workload name most like ``name`` (difflib's closest, cutoff 0.6), whose
    function part is itself like ``name``'s: ``mymodule.nope`` suggests nothing, not
    ``mymodule.slow`` because the module matches; a bare function name (``shout``) suggests
    the one live name whose function part it is (``gpu_jobs.shout``). None if there is none."""
    function = name.rsplit(".", 1)[-1]
    if "." not in name:
        whole = [candidate for candidate in alive if candidate.rsplit(".", 1)[-1] == name]
        if len(whole) == 1:
            return whole[0]
    for candidate in difflib.get_close_matches(name, alive, n=3):
        if difflib.SequenceMatcher(None, function, candidate.rsplit(".", 1)[-1]).ratio() >= 0.6:
            return candidate
    return None
