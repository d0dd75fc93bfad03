"""Workload functions the live tests register (``--workloads tests.workloads.fns``)."""

from __future__ import annotations

import os
import time

import makespan

MARK_DIR = os.environ.get("MAKESPAN_TEST_MARK_DIR", "/tmp")


def _mark(ctx, what: str) -> None:
    with open(os.path.join(MARK_DIR, f"{ctx.job_id}.{what}"), "a") as f:
        f.write(f"{ctx.attempt}\n")


@makespan.workload(endpoint="sim", name="add")
def add(ctx, a, b):
    return {"sum": a + b, "gpus": ctx.gpus, "cuda": ctx.cuda_visible_devices, "attempt": ctx.attempt,
            "priority": ctx.priority, "url": ctx.endpoint_url}


@makespan.workload(endpoint="sim", name="boom")
def boom(ctx, message):
    raise ValueError(message)


@makespan.workload(endpoint="sim", name="big")
def big(ctx, n_bytes):
    return "x" * n_bytes


@makespan.workload(endpoint="sim", name="wait_for_cancel")
def wait_for_cancel(ctx):
    _mark(ctx, "started")
    ctx.progress(1, 10, "waiting")
    if ctx.cancelled.wait(120):
        _mark(ctx, "saw_cancel")
        return "stopped"
    return "not cancelled"


@makespan.workload(endpoint="sim", name="loop_until_cancelled")
def loop_until_cancelled(ctx):
    """The idiom a user writes first: ``while not ctx.cancelled`` (a plain Event is always
    true, so this loop used to end at once)."""
    _mark(ctx, "started")
    end = time.monotonic() + 120
    while not ctx.cancelled and time.monotonic() < end:
        time.sleep(0.01)
    _mark(ctx, "saw_cancel" if ctx.cancelled else "ran_to_the_end")
    return "stopped"


@makespan.workload(endpoint="sim", name="loop_until_told_why")
def loop_until_told_why(ctx):
    """Loops until ``ctx.cancelled`` and writes ``ctx.cancel_reason`` to
    ``{job_id}.cancel_reason``; a later run of the job (that file written: a run given up
    at a worker's shutdown, which is no attempt) returns at once, saying its attempt."""
    if os.path.exists(os.path.join(MARK_DIR, f"{ctx.job_id}.cancel_reason")):
        return {"resumed_at_attempt": ctx.attempt}
    _mark(ctx, "started")
    end = time.monotonic() + 120
    while not ctx.cancelled and time.monotonic() < end:
        time.sleep(0.01)
    with open(os.path.join(MARK_DIR, f"{ctx.job_id}.cancel_reason"), "a") as f:
        f.write(f"{getattr(ctx, 'cancel_reason', None)}\n")
    return {"stopped_at_attempt": ctx.attempt}


@makespan.workload(endpoint="sim", name="ignore_cancel")
def ignore_cancel(ctx):
    _mark(ctx, "started")
    end = time.monotonic() + 120
    while time.monotonic() < end:  # ignores ctx.cancelled: stopped after the grace period
        time.sleep(0.01)
    _mark(ctx, "ran_to_the_end")
    return "ran"


@makespan.workload(endpoint="sim", name="sleep_ignoring_cancel")
def sleep_ignoring_cancel(ctx, sleep_s):
    """Ignores ctx.cancelled inside one ``time.sleep`` (C code: the exception that stops a
    function is only raised in it when the sleep returns)."""
    _mark(ctx, "started")
    time.sleep(sleep_s)
    _mark(ctx, "ran_to_the_end")
    return "slept"


@makespan.workload(endpoint="sim", name="flaky", retries=2, retry_backoff_s=0.2)
def flaky(ctx, fail_times):
    _mark(ctx, "ran")
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    return {"attempt": ctx.attempt}


@makespan.workload(endpoint="sim", name="slow_first", expected_s=1)
def slow_first(ctx, seconds):
    _mark(ctx, "ran")
    if ctx.attempt == 1:
        time.sleep(seconds)  # the test SIGKILLs the worker here
    return {"attempt": ctx.attempt}


@makespan.workload(endpoint="sim", name="fixed_time", expected_s=5)
def fixed_time(ctx, wall_s):
    time.sleep(wall_s)
    return wall_s


@makespan.workload(endpoint="gen", name="prompts")
def prompts(ctx, items):
    return ctx.requests(items)


@makespan.workload(endpoint="gen", helpers=("embed",), name="gen_and_embed")
def gen_and_embed(ctx, items):
    texts = ctx.requests(items)
    vectors = ctx.requests(texts, route="/v1/embeddings", endpoint="embed")
    return {"texts": texts, "dims": [len(v) for v in vectors], "urls": sorted(ctx.endpoint_urls)}


@makespan.workload(endpoint="sim", name="concat")
def concat(ctx, *parts):
    return "".join(str(p) for p in parts)


@makespan.workload(endpoint="sim", name="side_effect_after_work")
def side_effect_after_work(ctx, wall_s):
    """Works ``wall_s`` seconds without looking at ``ctx.cancelled`` (as a process paused by
    SIGSTOP would), then checks it right before its side effect, as docs/workloads.md asks:
    marks ``cancelled`` (with its reason in ``{job_id}.why``) or ``side_effect``."""
    _mark(ctx, "ran")
    end = time.monotonic() + wall_s
    while time.monotonic() < end:
        time.sleep(0.01)
    if ctx.cancelled:
        _mark(ctx, "cancelled")
        with open(os.path.join(MARK_DIR, f"{ctx.job_id}.why"), "a") as f:
            f.write(f"{ctx.cancel_reason}\n")
        return None
    _mark(ctx, "side_effect")
    return {"attempt": ctx.attempt}


@makespan.workload(endpoint="sim", name="crashes_once")
def crashes_once(ctx):
    """Its first run ends its own process (a segmentation fault, as a C extension's would);
    the next returns."""
    import signal

    if not os.path.exists(os.path.join(MARK_DIR, f"{ctx.job_id}.crashed")):
        _mark(ctx, "crashed")
        os.kill(os.getpid(), signal.SIGSEGV)
    return {"attempt": ctx.attempt}
