"""Results of workload functions: how a return value or an error is stored and read.

``P:result:{job}`` holds one JSON object, written by the GPU worker in the same fenced
commit that ends the job's execute phase (a success) or the job (a final failure), with
``EX`` = ``Settings.result_ttl_s``. A stale attempt (its lease reclaimed) cannot write
it: the commit is fenced by the lease's token. Shapes::

    {"ok": true,  "value": <JSON>, "attempt": 1, "execute_s": 0.42}
    {"ok": false, "error": {"type": "ValueError", "message": "...", "traceback": "..."},
     "attempt": 3}

A job argument that is a :class:`makespan.client.Job` travels as the reference
``{"__makespan_result__": "<job id>"}`` (and the job depends on it); the worker replaces
it with that job's result value before the call (:func:`resolve_references`).
"""

from __future__ import annotations

import json
from typing import Any

import redis

from makespan.errors import PhaseError, StoreError
from makespan.keys import Keys

REFERENCE = "__makespan_result__"
"""The key of a result reference: reserved. A submit refuses it unless the job also
depends on the job it names (the Python client writes both for a :class:`Job` argument)."""
UNRESOLVED_REFERENCE = "argument refers to job"
"""How a run's failure to read a referenced result begins (the function did not run)."""


class ResultTooLarge(PhaseError):
    """A workload function returned more than ``Settings.result_max_bytes`` of JSON."""


class ResultNotJson(PhaseError):
    """A workload function returned a value JSON cannot carry."""


def encode_value(value: Any, attempt: int, execute_s: float, max_bytes: int) -> str:
    """The stored JSON of a successful run.

    Raises:
        ResultNotJson: ``value`` is not JSON (NaN, a set, an object, a lone surrogate, a
            mapping key that is not a string: arguments are refused for the same).
        ResultTooLarge: its encoding is over ``max_bytes``."""
    try:
        body = json.dumps(value, allow_nan=False, ensure_ascii=False)
        size = len(body.encode("utf-8"))
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as e:
        from makespan.models import first_not_json

        found = first_not_json(value, "the return value") if not isinstance(e, RecursionError) else None
        where = f"; {found[0]} is {found[1]}" if found else ""  # e.g. a numpy scalar: the .item() hint
        raise ResultNotJson(f"the return value is not JSON ({type(e).__name__}: {e}){where}; return JSON values "
                            "only (dict, list, str, number, bool, None)") from None
    from makespan.models import first_key_not_str

    key = first_key_not_str(value)
    if key is not None:  # json.dumps writes 1 as "1": the caller would get {"1": ...}, and {1: a, "1": b} loses one
        raise ResultNotJson(f"the return value is not JSON: mapping keys must be strings, got {key} (JSON would "
                            "turn it into a string key); return string keys")
    if size > max_bytes:
        raise ResultTooLarge(f"the result is {size} bytes of JSON, over the limit of {max_bytes} bytes "
                             "(MAKESPAN_RESULT_MAX_BYTES): store the data elsewhere (object store, database) "
                             "and return a reference to it")
    return '{"ok":true,"attempt":%d,"execute_s":%s,"value":%s}' % (attempt, repr(round(execute_s, 6)), body)


ERROR_TEXT_MAX_CHARS = 65536  # an error's message and traceback are each cut to this (marked where cut)


def encode_error(error_type: str, message: str, traceback_text: str, attempt: int) -> str:
    """The stored JSON of a failed run: the message cut to its first
    :data:`ERROR_TEXT_MAX_CHARS` characters, the traceback to its last, each with a
    ``[… N characters cut]`` marker where text was dropped."""
    if len(message) > ERROR_TEXT_MAX_CHARS:
        message = message[:ERROR_TEXT_MAX_CHARS] + f" [… {len(message) - ERROR_TEXT_MAX_CHARS} characters cut]"
    if len(traceback_text) > ERROR_TEXT_MAX_CHARS:
        traceback_text = (f"[… {len(traceback_text) - ERROR_TEXT_MAX_CHARS} characters cut] "
                          + traceback_text[-ERROR_TEXT_MAX_CHARS:])
    return json.dumps({"ok": False, "attempt": attempt,
                       "error": {"type": error_type, "message": message, "traceback": traceback_text}})


def read(r: redis.Redis, keys: Keys, job_id: str) -> dict[str, Any] | None:
    """The stored result object of ``job_id``, or None (not written, or expired).

    Raises:
        StoreError: Redis failed."""
    try:
        raw = r.get(keys.result(job_id))
    except redis.RedisError as e:
        raise StoreError(f"result of {job_id}: {e}") from e
    return json.loads(raw) if raw else None


def references(value: Any) -> list[str]:
    """Job ids referenced at the top level of an argument list or mapping."""
    items = value.values() if isinstance(value, dict) else value
    return [v[REFERENCE] for v in items if isinstance(v, dict) and set(v) == {REFERENCE}]


def resolve_references(r: redis.Redis, keys: Keys, args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Replace each top-level result reference by that job's result value.

    Raises:
        PhaseError: a referenced job has no successful result (it failed, or its result
            expired)."""
    def value_of(v: Any) -> Any:
        if not (isinstance(v, dict) and set(v) == {REFERENCE}):
            return v
        rec = read(r, keys, v[REFERENCE])
        if not rec or not rec.get("ok"):
            raise PhaseError(f"{UNRESOLVED_REFERENCE} {v[REFERENCE]}, which has no result "
                             f"({'it failed' if rec else 'not stored or expired'})")
        return rec["value"]
    return [value_of(a) for a in args], {k: value_of(v) for k, v in kwargs.items()}
