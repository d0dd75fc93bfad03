"""Request-level execution against the real endpoint program over HTTP: the cap holds
(also across two senders on one instance), request leases and waiters drain to zero,
per-request latency is measured, and failures surface as PhaseError."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import pytest
import redis

from makespan.errors import PhaseError, StoreError
from makespan.redis_conn import async_twin, connect, free_port, start_embedded
from tests.live import wait_for
from makespan.workers.requests import RequestRunner, request_drain


@pytest.fixture
def server():
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "makespan.workers.endpoint_server", "--port", str(port), "--latency-ms", "20",
                          "--model", "m"], stderr=subprocess.DEVNULL)
    import httpx

    def up():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False
    # bounds a hang only: a Python server process starting on a loaded 2-core host (tests
    # on the other xdist worker, a browser) takes seconds to import and bind, not always 10
    wait_for(up, 60, "endpoint server")
    yield f"http://127.0.0.1:{port}"
    p.terminate()
    p.wait(30)


def max_overlap(recs):
    pts = sorted([(x["t0"], 1) for x in recs] + [(x["t1"], -1) for x in recs], key=lambda p: (p[0], p[1]))
    cur = best = 0
    for _, d in pts:
        cur += d
        best = max(best, cur)
    return best


def _records(r, keys, job):
    return [json.loads(x) for x in r.lrange(keys.requests(job), 0, -1)]


def test_cap_holds_and_leases_drain(r, keys, server):
    cap = 3
    runner = RequestRunner(r, keys, "inst1", server, "m", cap)
    res = runner.run("job1", {"requests": 20, "prompt": "item {i} of {step}", "step": "s",
                              "route": "/v1/chat/completions"})
    recs = _records(r, keys, "job1")
    assert res.ok == 20 and res.errors == 0 and len(recs) == 20
    assert sorted(x["i"] for x in recs) == list(range(20))
    assert all(x["ms"] >= 20 for x in recs)  # the server's latency is measured
    assert 1 <= max_overlap(recs) <= cap
    assert int(r.get(keys.req_peak("inst1"))) == cap
    assert request_drain(r, keys, ["inst1"]) == {"request_leases": 0, "waiters": 0}
    assert "reply" in recs[0]["text"]


def test_two_senders_share_one_cap(r, keys, server):
    cap = 4
    out = {}

    def go(job):
        out[job] = RequestRunner(r, keys, "shared", server, "m", cap).run(job, {"requests": 16})

    ts = [threading.Thread(target=go, args=(j,)) for j in ("a", "b")]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    recs = _records(r, keys, "a") + _records(r, keys, "b")
    assert out["a"].ok == out["b"].ok == 16
    assert max_overlap(recs) <= cap
    assert int(r.get(keys.req_peak("shared"))) <= cap
    assert request_drain(r, keys, ["shared"]) == {"request_leases": 0, "waiters": 0}


def test_timeouts_fail_the_step_and_still_drain(r, keys, server):
    runner = RequestRunner(r, keys, "inst2", server, "m", 2)
    with pytest.raises(PhaseError, match="requests to .* failed") as err:
        runner.run("job2", {"requests": 4, "request_timeout_s": 0.005})
    # httpx's timeouts carry no message: the error says which limit was hit (a new user read "ReadTimeout: ")
    assert "no answer within request_timeout_s = 0.005 s" in str(err.value), str(err.value)
    assert not str(err.value).endswith(": ")
    assert request_drain(r, keys, ["inst2"]) == {"request_leases": 0, "waiters": 0}


def test_stop_sends_no_more(r, keys, server):
    sent = []
    runner = RequestRunner(r, keys, "inst3", server, "m", 1, should_stop=lambda: len(sent) >= 2)
    orig = runner._release

    async def rel(m):
        sent.append(m)
        await orig(m)
    runner._release = rel
    res = runner.run("job3", {"requests": 10})
    assert 2 <= res.sent < 10
    assert request_drain(r, keys, ["inst3"]) == {"request_leases": 0, "waiters": 0}


@pytest.fixture
def private_redis():
    """A redis-server of this test's own (paused or stopped by the test)."""
    emb = start_embedded()
    yield emb
    emb.stop()


def test_a_slow_lease_call_leaves_the_event_loop_free(keys, server, private_redis):
    """While Redis holds a request-lease call (CLIENT PAUSE on a private server) the other
    coroutines of the sender's loop keep running: the longest gap between a ticker's
    5 ms ticks stays far below the pause (a blocking call on the loop: a gap of the whole pause)."""
    r = connect(private_redis.url)
    pauser = connect(private_redis.url)
    runner = RequestRunner(r, keys, "slow", server, "m", 2)
    pause_ms = 1000

    async def main():
        ticks: list[float] = []
        done = asyncio.Event()

        async def ticker():
            while not done.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.005)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        pauser.client_pause(pause_ms)  # every client of this server waits pause_ms
        res = await runner.run_async("slowjob", {"requests": 2})
        done.set()
        await task
        return res, ticks

    res, ticks = asyncio.run(main())
    assert res.ok == 2
    assert ticks[-1] - ticks[0] >= pause_ms / 1000 * 0.9  # the run did wait out the pause
    assert max(b - a for a, b in zip(ticks, ticks[1:])) < pause_ms / 1000 / 2
    assert request_drain(r, keys, ["slow"]) == {"request_leases": 0, "waiters": 0}


def test_redis_down_is_a_store_error(keys, server, private_redis):
    r = connect(private_redis.url)
    runner = RequestRunner(r, keys, "gone", server, "m", 2)
    private_redis.stop()
    with pytest.raises(StoreError, match="request_lease|request lease"):
        asyncio.run(runner.run_async("gonejob", {"requests": 3}))


def test_many_senders_never_exceed_the_cap_and_the_cap_sets_the_pace(r, keys, server):
    """Three senders (threads, one event loop each) on one instance with 4 slots: never more
    than 4 requests in flight, leases and waiters drain, and the 60 requests of 20 ms take
    at least ⌈60 / 4⌉ × 20 ms (the cap, not speed, is checked)."""
    cap, per_sender, senders = 4, 20, 3
    out: dict[str, object] = {}

    def go(job):
        out[job] = RequestRunner(r, keys, "many", server, "m", cap).run(job, {"requests": per_sender})

    threads = [threading.Thread(target=go, args=(f"s{i}",)) for i in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    recs = [x for i in range(senders) for x in _records(r, keys, f"s{i}")]
    assert len(recs) == per_sender * senders and all(x["ok"] for x in recs)
    assert max_overlap(recs) <= cap
    assert int(r.get(keys.req_peak("many"))) <= cap
    span_s = max(x["t1"] for x in recs) - min(x["t0"] for x in recs)
    assert span_s >= (per_sender * senders // cap) * 0.020 * 0.95
    assert request_drain(r, keys, ["many"]) == {"request_leases": 0, "waiters": 0}


def test_a_pool_without_an_asyncio_twin_runs_the_lease_calls_in_a_thread(r, keys, server):
    """A client whose pool has no asyncio counterpart (a Sentinel pool, a custom class):
    the sync client's lease calls run in worker threads; the cap and the drain still hold."""

    class OwnPool(redis.ConnectionPool):
        pass

    kwargs = {k: v for k, v in r.connection_pool.connection_kwargs.items()
              if k in ("host", "port", "db", "decode_responses", "socket_timeout")}
    own = redis.Redis(connection_pool=OwnPool(**kwargs))
    assert async_twin(own) is None
    res = RequestRunner(own, keys, "thread", server, "m", 2).run("tjob", {"requests": 8})
    recs = _records(r, keys, "tjob")
    assert res.ok == 8 and len(recs) == 8 and max_overlap(recs) <= 2
    assert request_drain(r, keys, ["thread"]) == {"request_leases": 0, "waiters": 0}


def test_the_lease_script_is_loaded_again_after_a_script_flush(keys, server, private_redis):
    """EVALSHA answered NOSCRIPT (a restarted or flushed Redis): the full text is sent."""
    r = connect(private_redis.url)
    runner = RequestRunner(r, keys, "flushed", server, "m", 2)
    assert runner.run("f1", {"requests": 2}).ok == 2
    r.script_flush()
    assert runner.run("f2", {"requests": 2}).ok == 2
    assert request_drain(r, keys, ["flushed"]) == {"request_leases": 0, "waiters": 0}


def test_ctx_requests_refuses_a_lone_prompt_and_an_unknown_route_before_sending():
    """A string iterated as prompts sent one request per character, and a route the body
    builder does not know was sent as a completion and failed on the server's 404."""
    from makespan.workers.functions import WorkloadContext

    sent: list[tuple] = []
    ctx = WorkloadContext("j1", "NORMAL", 1, "fn", ["GPU-0"], "h0", "gen", "http://127.0.0.1:1", {},
                          _requests=lambda prompts, **kw: sent.append((prompts, kw)) or ["ok"] * len(prompts))
    with pytest.raises(TypeError, match="list of prompts"):
        ctx.requests("hello")
    with pytest.raises(ValueError, match="unknown route '/v1/chat'.*/v1/chat/completions"):
        ctx.requests(["hello"], route="/v1/chat")
    assert sent == []
    assert ctx.requests(["hello"], route="/v1/chat/completions") == ["ok"]
