"""The execute phase on arguments that do not bind to the function (the submit check is
skipped when the registering worker published no parameters, or the function's
parameters changed while the job waited): a clear TypeError that is not retried, as every
attempt would fail the same way. In-process, on the real Redis: run_function as the GPU
worker's execute phase calls it."""

from __future__ import annotations

import json
import threading

import pytest

from makespan.registry import WorkloadDef
from makespan.workers.functions import WorkloadContext, WorkloadFailed, run_function


def _two(ctx, a, b=1):
    return a + b


def _raises_type_error(ctx, a):
    return a + "x"  # a TypeError inside the body: the function's own failure, retried as any


def _run(r, keys, definition, args, kwargs):
    ctx = WorkloadContext(job_id="j" * 32, priority="NORMAL", attempt=1, workload=definition.name, gpus=["GPU-0"],
                          host="h", endpoint="embed", endpoint_url=None, endpoint_urls={})
    return run_function(definition, ctx, args, kwargs, r=r, keys=keys, lease_lost=threading.Event(), grace_s=0.5,
                        result_max_bytes=1000)


@pytest.mark.parametrize("args, kwargs, says", [
    ([], {}, "missing a required argument: 'a'"),
    ([1, 2, 3], {}, "too many positional arguments"),
    ([1], {"c": 3}, "unexpected keyword argument 'c'"),
])
def test_arguments_that_do_not_bind_fail_once_with_a_type_error(r, keys, args, kwargs, says):
    """They used to raise inside the call and count as a retryable failure: ``retries``
    more runs of a call that could never bind."""
    with pytest.raises(WorkloadFailed) as e:
        _run(r, keys, WorkloadDef("tests.two", _two, "embed", retries=5), args, kwargs)
    assert (e.value.error_type, e.value.retryable) == ("TypeError", False)
    assert says in e.value.message and "tests.two(ctx, a, b=1)" in e.value.message


def test_a_type_error_the_function_raises_is_retried_as_any_failure(r, keys):
    with pytest.raises(WorkloadFailed) as e:
        _run(r, keys, WorkloadDef("tests.te", _raises_type_error, "embed", retries=5), [1], {})
    assert (e.value.error_type, e.value.retryable) == ("TypeError", True)


def test_arguments_that_bind_run(r, keys):
    result, _wall_s = _run(r, keys, WorkloadDef("tests.two", _two, "embed"), [1], {"b": 2})
    assert '3' in result


class _UnhashableCallable:
    """A callable that cannot be a dict key (``__eq__`` without ``__hash__``)."""

    def __eq__(self, other):
        return self is other

    def __call__(self, ctx, a):
        return a


def test_the_signature_is_read_once_per_function(r, keys, monkeypatch):
    """The signature is cached per function object (it was read on every job); the
    arguments are still checked against it on every run."""
    from makespan.workers import functions

    reads = []
    real_read = functions._read_signature
    monkeypatch.setattr(functions, "_read_signature", lambda fn: reads.append(fn) or real_read(fn))

    def _three(ctx, a, b=1, c=2):
        return a + b + c

    definition = WorkloadDef("tests.three", _three, "embed")
    for _ in range(3):
        assert json.loads(_run(r, keys, definition, [1], {})[0])["value"] == 4
    with pytest.raises(WorkloadFailed) as e:
        _run(r, keys, definition, [], {})
    assert (e.value.error_type, e.value.retryable) == ("TypeError", False)
    assert "tests.three(ctx, a, b=1, c=2)" in e.value.message
    assert reads == [_three]


def test_an_unhashable_callable_is_still_checked(r, keys):
    definition = WorkloadDef("tests.unhashable", _UnhashableCallable(), "embed")
    assert json.loads(_run(r, keys, definition, [5], {})[0])["value"] == 5
    with pytest.raises(WorkloadFailed) as e:
        _run(r, keys, definition, [1, 2], {})
    assert (e.value.error_type, e.value.retryable) == ("TypeError", False)
    assert "too many positional arguments" in e.value.message


class _UnreadableSignature:
    """A callable whose signature ``inspect.signature`` refuses (TypeError)."""

    __signature__ = "not a Signature"

    def __call__(self, ctx, *args):
        return len(args)


def test_a_function_whose_signature_cannot_be_read_is_not_checked(r, keys):
    """The call runs unchecked, as before the cache (and stays so on the next run)."""
    definition = WorkloadDef("tests.unreadable", _UnreadableSignature(), "embed")
    for _ in range(2):
        assert json.loads(_run(r, keys, definition, [1, 2, 3], {})[0])["value"] == 3


def _sleeps(ctx):
    import time

    time.sleep(3)  # blocked outside Python code: ctx.cancelled is never read, the stop cannot reach it
    return 1


def _stops_when_told(ctx):
    ctx.cancelled.wait(30)
    return 1


@pytest.mark.parametrize("fn, says", [
    (_sleeps, "did not stop within the 0.5 s grace period after ctx.cancelled was set and was told to stop, but "
              "its thread still runs: it is blocked outside Python code"),
    (_stops_when_told, "returned after ctx.cancelled was set")])
def test_a_timeout_says_how_the_run_ended(r, keys, fn, says):
    """A timed-out run's reason said only 'ran longer than timeout_s' while its thread still
    slept in the background (reliability review): it says how the run ended, as a cancel's
    reason does."""
    with pytest.raises(WorkloadFailed) as e:
        _run(r, keys, WorkloadDef("tests.slow", fn, "embed", timeout_s=0.2), [], {})
    assert e.value.error_type == "makespan.WorkloadTimeout"
    assert "ran longer than timeout_s=0.2 s; it " + says in e.value.message, e.value.message
