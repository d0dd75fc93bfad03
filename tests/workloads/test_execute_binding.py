"""The execute phase on arguments that do not bind to the function (the submit check is
skipped when the registering worker published no parameters, or the function's
parameters changed while the job waited): a clear TypeError that is not retried, as every
attempt would fail the same way. In-process, on the real Redis: run_function as the GPU
worker's execute phase calls it."""

from __future__ import annotations

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
