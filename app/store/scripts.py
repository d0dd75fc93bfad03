"""The store's Lua scripts: read from ``makespan/store/lua/*.lua``, registered once per client.

Each ``.lua`` file opens with a header comment (dramatiq's ``dispatch.lua`` is the model)
that names its ``KEYS`` and ``ARGV`` one per line, and two tags:

* ``-- Library: lib`` (or ``none``): the shared library ``lib.lua`` (server clock, key
  builders from one prefix, append an event, finish / requeue / delay a job, free a lease's
  GPUs) is prepended to the script's text;
* ``-- Transitions: queued -> leased, ...`` (or ``none``): the job-state transitions the
  script may make, checked against :data:`makespan.store.states.TRANSITIONS` by the tests.

:func:`script` returns a :class:`StoreScript` registered with redis-py once per client and
events cap; a call translates every ``redis.RedisError`` into
:class:`makespan.errors.StoreError` (see :func:`store_error`).
"""

from __future__ import annotations

import functools
import re
import weakref
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script

from makespan.errors import StoreError
from makespan.redis_conn import store_error  # re-exported: the store's modules translate with it
from makespan.settings import EVENTS_WRITE_TRIM_FACTOR, events_max_len_from_env

LIBRARY = "lib"
_CAP_MARK = "'__EVENTS_MAX_LEN__'"


@dataclass(frozen=True)
class ScriptHeader:
    """What a script's header declares.

    Attributes:
        name: the file name without ``.lua``.
        library: whether ``lib.lua`` is prepended.
        transitions: ``(source, target)`` job-state values; source ``"new"``: no record yet.
        keys / argv: the header's ``KEYS[..]`` / ``ARGV[..]`` lines, as written.
    """

    name: str
    library: bool
    transitions: tuple[tuple[str, str], ...]
    keys: tuple[str, ...]
    argv: tuple[str, ...]


def _lua_dir() -> Any:
    return resources.files("makespan.store").joinpath("lua")


@functools.cache
def script_names() -> tuple[str, ...]:
    """Every script's name (the library excluded), sorted."""
    return tuple(sorted(entry.name[:-4] for entry in _lua_dir().iterdir()
                        if entry.name.endswith(".lua") and entry.name[:-4] != LIBRARY))


@functools.cache
def source(name: str) -> str:
    """The text of ``lua/{name}.lua`` as stored (the library not prepended).

    Raises:
        FileNotFoundError: no such script."""
    return str(_lua_dir().joinpath(f"{name}.lua").read_text(encoding="utf-8"))


def header_lines(name: str) -> list[str]:
    """The leading ``--`` comment lines of a script, without the ``--``."""
    out = []
    for line in source(name).splitlines():
        if not line.startswith("--"):
            break
        out.append(line[2:].strip())
    return out


@functools.cache
def header(name: str) -> ScriptHeader:
    """The parsed header of ``lua/{name}.lua``.

    Raises:
        ValueError: the header lacks its Library or Transitions tag."""
    lines = header_lines(name)
    lib = next((m for m in (re.match(r"Library:\s*(\w+)$", line) for line in lines) if m), None)
    at = next((i for i, line in enumerate(lines) if line.startswith("Transitions:")), None)
    if lib is None or at is None:
        raise ValueError(f"{name}.lua: header needs 'Library:' and 'Transitions:' lines")
    parts = [lines[at].split(":", 1)[1]]
    for line in lines[at + 1:]:  # continuation lines: more "a -> b" pairs
        if not re.match(r"\w+ -> \w+", line):
            break
        parts.append(line)
    pairs: list[tuple[str, str]] = []
    spec = " ".join(" ".join(parts).split())
    if spec != "none":
        for part in spec.split(","):
            source_state, target_state = (s.strip() for s in part.split("->"))
            pairs.append((source_state, target_state))
    return ScriptHeader(name, lib.group(1) == LIBRARY, tuple(pairs),
                        tuple(line for line in lines if line.startswith("KEYS")),
                        tuple(line for line in lines if line.startswith("ARGV")))


def text(name: str, events_max_len: int | None = None) -> str:
    """The full text sent to Redis: the library (with the events cap written in: None,
    ``MAKESPAN_EVENTS_MAX_LEN`` or its default) and the script, when its header asks for the
    library; else the script alone.

    Raises:
        ValueError: ``events_max_len`` is not a positive int."""
    if events_max_len is None:  # MAKESPAN_EVENTS_MAX_LEN, as every writer of the stream
        events_max_len = events_max_len_from_env()
    if not isinstance(events_max_len, int) or isinstance(events_max_len, bool) or events_max_len < 1:
        raise ValueError(f"events_max_len must be a positive int, got {events_max_len!r}")
    if not header(name).library:
        return source(name)
    # a script's event trims the stream only past the factor × the cap: the planner's sweep trims to its cap
    return source(LIBRARY).replace(_CAP_MARK, f"'{EVENTS_WRITE_TRIM_FACTOR * events_max_len}'") + "\n" + source(name)


class StoreScript:
    """One registered script (redis-py's ``Script``: EVALSHA, loaded on NOSCRIPT).

    Attributes:
        name: the script's file name without ``.lua``.
        text: the full text sent to Redis.
        sha: its SHA1.
    """

    def __init__(self, client: redis.Redis, name: str, events_max_len: int):
        self.name = name
        self.text = text(name, events_max_len)
        self._script: Script = client.register_script(self.text)
        self.sha: str = self._script.sha
        # the cache (_REGISTERED) is keyed weakly by the client: a strong reference from its
        # value (redis-py's Script keeps its client) kept every client, and its connections, alive
        try:
            self._client: Any = weakref.ref(client)
        except TypeError:  # not weakly referable: script() does not cache it, a strong reference leaks nothing
            self._client = lambda: client
        self._script.registered_client = None  # type: ignore[assignment]  # every call passes its client

    def __call__(self, keys: list[str] | tuple[str, ...] = (), args: list[Any] | tuple[Any, ...] = (),
                 client: Any = None) -> Any:
        """Run the script (with ``client``, e.g. a pipeline, queue it there: its reply comes
        from ``execute()``, where redis-py raises its own errors).

        Raises:
            StoreError: Redis failed or the script raised (also a ``type(redis error)``)."""
        if client is None:
            client = self._client()
            if client is None:  # its client was collected: redis-py would raise AttributeError on None
                raise StoreError(f"script {self.name}: the client it was registered on is gone; pass client=")
        try:
            return self._script(keys=list(keys), args=list(args), client=client)
        except redis.RedisError as e:
            raise store_error(e, f"script {self.name}") from e

    async def call_async(self, client: Any, keys: list[str] | tuple[str, ...] = (),
                         args: list[Any] | tuple[Any, ...] = ()) -> Any:
        """Run the script on a ``redis.asyncio`` client without blocking its event loop:
        EVALSHA, and on NOSCRIPT (a restarted or flushed Redis) EVAL of the full text.

        Raises:
            StoreError: Redis failed or the script raised (also a ``type(redis error)``)."""
        try:
            try:
                return await client.evalsha(self.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                return await client.eval(self.text, len(keys), *keys, *args)
        except redis.RedisError as e:
            raise store_error(e, f"script {self.name}") from e

    def queue_eval(self, pipe: Any, keys: list[str] | tuple[str, ...] = (),
                   args: list[Any] | tuple[Any, ...] = ()) -> None:
        """Queue the script on ``pipe`` as EVAL (its full text: no SCRIPT EXISTS round trip,
        no NOSCRIPT after a Redis restart); its reply comes from ``pipe.execute()``."""
        pipe.eval(self.text, len(keys), *keys, *args)


_REGISTERED: weakref.WeakKeyDictionary[Any, dict[tuple[str, int], StoreScript]] = weakref.WeakKeyDictionary()


def script(client: redis.Redis, name: str, events_max_len: int | None = None) -> StoreScript:
    """The script ``name`` registered on ``client`` (once per client and events cap).

    Args:
        client: a redis-py client.
        name: a file name of ``makespan/store/lua`` without ``.lua``.
        events_max_len: the events stream cap (:attr:`makespan.settings.Settings.events_max_len`);
            None: the setting's default.
    Raises:
        FileNotFoundError: no such script.
    """
    cap = events_max_len_from_env() if events_max_len is None else events_max_len
    try:
        per_client = _REGISTERED.setdefault(client, {})
    except TypeError:  # a client that cannot be weakly referenced: register without the cache
        return StoreScript(client, name, cap)
    found = per_client.get((name, cap))
    if found is None:
        found = per_client[(name, cap)] = StoreScript(client, name, cap)
    return found
