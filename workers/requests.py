"""Request-level execution: a step's N model requests against an endpoint instance.

An async OpenAI-compatible client (:class:`httpx.AsyncClient`) sends the requests to
the instance's URL with at most ``slots`` in flight. Each in-flight request holds a
*request lease* in Redis: a member of the zset ``P:reqlease:{instance}`` (score =
expiry, unix ms on the Redis server's clock, read by the script itself) added by a Lua
script only while ZCARD < slots, so the cap holds across every process sending to that
instance; expired members (a dead sender) are dropped before counting. Senders on hosts
whose clocks disagree agree on expiry: one whose clock runs ahead cannot drop another's
live request lease (which would break the cap). ``P:reqwaiters:{instance}`` holds the
requests waiting for a lease (a zset scored by a deadline on the server's clock, which each
try of the waiter moves :data:`WAITER_TTL_S` on, written by the same script: a waiter that
dies, or whose removal a Redis outage loses, stops counting by its deadline instead of
leaving the count above zero for good) and ``P:reqpeak:{instance}`` keeps the most leases
ever held at once (the cap check). After a batch both the lease zset and the waiter count
(:func:`request_drain`) drain to zero. Request leases are
taken and given back on a ``redis.asyncio`` twin of the caller's client
(:func:`makespan.redis_conn.async_twin`, the same Lua script through the store's loader),
so one slow Redis round trip never stalls the other requests in flight; Redis errors
surface as :class:`makespan.errors.StoreError`.

Every request is recorded in ``P:requests:{job}`` (JSON: ``i``, ``t0``/``t1`` unix s,
``ms`` latency, ``ok``, ``status``, ``text`` first 200 characters of the answer) and
the step's latency summary is returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from collections.abc import AsyncIterator, Callable

import httpx
import redis

from makespan.errors import PhaseError, StoreError
from makespan.keys import Keys
from makespan.redis_conn import async_twin, is_store_bug
from makespan.store.scripts import script, store_error

log = logging.getLogger("makespan.requests")

REQUEST_LEASE_TTL_S = 30.0  # a request lease's expiry beyond its request's longest run (a dead sender's expires)
WAITER_TTL_S = 10.0  # a waiter counts this long past its latest try (it tries every POLL_MAX_S at most)
POLL_S = 0.002  # a waiter's first poll for a free request lease; doubles up to POLL_MAX_S
POLL_MAX_S = 0.016
KEEP_TEXT = 200


def _error_text(error: Exception, after_s: float, timeout_s: float) -> str:
    """A failed request in words: the exception's type and message, and for a timeout
    (httpx's are raised without a message) which limit it hit and after how long."""
    text = f"{type(error).__name__}: {error}".rstrip(": ") if str(error) else type(error).__name__
    if isinstance(error, httpx.TimeoutException):
        text += (f" (no answer within request_timeout_s = {timeout_s:g} s, applied to the connect, the send and each "
                 f"read; gave up after {after_s:.1f} s)")
    return text


def request_lease_ttl_s(request_timeout_s: float) -> float:
    """How long a request lease lives, s: longer than the longest run the request timeout
    allows (httpx applies it to the connect, the write and each read: 3 × the timeout), plus
    :data:`REQUEST_LEASE_TTL_S`. A lease that expired while its request still ran would let
    another sender past the endpoint's cap; one of a dead sender expires after this."""
    return 3.0 * request_timeout_s + REQUEST_LEASE_TTL_S


@dataclass
class RequestResult:
    """Outcome of a step's requests. Latencies in milliseconds."""

    sent: int = 0
    ok: int = 0
    errors: int = 0
    latency_ms: list[float] = field(default_factory=list)
    peak_in_flight: int = 0
    first_error: str = ""
    records: list[str] = field(default_factory=list)  # JSON per request, pushed once at the end
    answers: dict[int, Any] = field(default_factory=dict)  # request index -> answer (ctx.requests only)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latency_ms)

        def q(p: float) -> float:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else 0.0
        return {"requests": self.sent, "ok": self.ok, "errors": self.errors, "latency_ms_p50": q(0.5),
                "latency_ms_p95": q(0.95), "latency_ms_max": round(lat[-1], 3) if lat else 0.0,
                "peak_in_flight": self.peak_in_flight}


def _body(route: str, payload: dict[str, Any], i: int, model: str) -> dict[str, Any]:
    items = payload.get("items")
    if items is not None and isinstance(items[i], dict):  # a whole request body (ctx.requests)
        return {**items[i], "model": items[i].get("model", model)}
    if items is not None:
        prompt = str(items[i])
    else:
        try:  # validated at submit (makespan.workload_spec); a record written otherwise fails the step cleanly
            prompt = str(payload.get("prompt", "request {i}")).format(i=i, step=payload.get("step", ""))
        except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
            raise PhaseError(f"prompt template does not format: {type(e).__name__}: {e}") from None
    if route.endswith("embeddings"):
        return {"model": model, "input": prompt}
    if route.endswith("chat/completions"):
        return {"model": model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": int(payload.get("max_tokens", 16))}
    return {"model": model, "prompt": prompt, "max_tokens": int(payload.get("max_tokens", 16))}


def _text(route: str, data: dict[str, Any]) -> str:
    try:
        if route.endswith("embeddings"):
            return json.dumps(data["data"][0]["embedding"][:4])
        ch = data["choices"][0]
        return ch["message"]["content"] if "message" in ch else ch["text"]
    except (KeyError, IndexError, TypeError):
        return ""


def _answer(route: str, data: dict[str, Any]) -> Any:
    """The whole answer of one response (``ctx.requests``): the embedding vector, the chat
    message's content or the completion's text."""
    try:
        if route.endswith("embeddings"):
            return data["data"][0]["embedding"]
        ch = data["choices"][0]
        return ch["message"]["content"] if "message" in ch else ch["text"]
    except (KeyError, IndexError, TypeError):
        return None


def _unverified_context() -> ssl.SSLContext:
    """A TLS context that checks nothing, for clients that only speak plain http (no CA
    bundle loaded: well under a millisecond)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


RELEASE_RETRY_S = 5.0  # how long a request lease's release is retried through a Redis error, s


class RequestRunner:
    """Sends one step's requests to one endpoint instance under its concurrency cap.

    Args:
        r, keys: Redis and key builder (request leases, waiter count, records).
        instance_id / url / model: the endpoint instance to call.
        slots: the endpoint's concurrency cap.
        should_stop: polled between requests; True stops sending (lease lost, cancel).
    """

    def __init__(self, r: redis.Redis, keys: Keys, instance_id: str, url: str, model: str, slots: int,
                 should_stop: Callable[[], bool] = lambda: False):
        self.r, self.keys, self.instance_id, self.url, self.model = r, keys, instance_id, url.rstrip("/"), model
        self.slots, self.should_stop = max(1, int(slots)), should_stop
        self._acquire = script(r, "request_lease")
        self._ar: Any = None  # the redis.asyncio twin of r while run_async runs (see _connected)
        self.lease_ttl_s = request_lease_ttl_s(60.0)  # run_async sets it from the request timeout
        self.timeout_s = 60.0  # request_timeout_s (run_async sets it from the payload)
        self._aborted = False  # a request of the running step could not be sent: send no more

    def _write(self, ops: list[tuple]) -> bool:
        """Apply ``ops`` (DEL or RPUSH of the request records) directly, unfenced."""
        for cmd, key, *args in ops:
            self.r.execute_command(cmd, key, *args)
        return True

    # -- request leases (awaited on a redis.asyncio client: the event loop stays free) --
    @contextlib.asynccontextmanager
    async def _connected(self) -> AsyncIterator[None]:
        """Open the asyncio twin of ``r`` for the running loop (None: a pool without one,
        e.g. Sentinel; the sync client then runs in a worker thread) and close it after."""
        self._ar = async_twin(self.r)
        try:
            yield
        finally:
            twin, self._ar = self._ar, None
            if twin is not None:
                await twin.aclose()

    async def _call(self, command: str, *args: Any) -> Any:
        """One Redis command (``zrem``) without blocking the loop.

        Raises:
            StoreError: Redis failed."""
        try:
            if self._ar is not None:
                return await getattr(self._ar, command)(*args)
            return await asyncio.to_thread(getattr(self.r, command), *args)
        except redis.RedisError as e:
            raise store_error(e, f"request lease {command} on {self.instance_id}") from e

    async def _try_acquire(self, member: str) -> int:
        """Take one request lease (``request_lease.lua``): the leases now held, 0 at the cap
        (``member`` then counts as a waiter for :data:`WAITER_TTL_S`; taking a lease ends that).
        A Redis outage (a restart, a failover, a dropped connection) is waited out for up to
        :data:`RELEASE_RETRY_S`, as a release is: a fan-out whose next request came due while
        Redis restarted failed the user's function with the outage.

        Raises:
            StoreError: Redis failed for longer than that, or with a bug
                (:func:`makespan.redis_conn.is_store_bug`: raised at once)."""
        keys = [self.keys.req_leases(self.instance_id), self.keys.req_peak(self.instance_id),
                self.keys.req_waiters(self.instance_id)]
        args = [member, int(self.lease_ttl_s * 1000), self.slots, int(WAITER_TTL_S * 1000)]
        pause_s, give_up = 0.05, time.monotonic() + RELEASE_RETRY_S
        while True:
            try:
                if self._ar is not None:
                    return int(await self._acquire.call_async(self._ar, keys, args))
                return int(await asyncio.to_thread(self._acquire, keys, args))
            except (StoreError, redis.RedisError) as e:
                if is_store_bug(e) or time.monotonic() + pause_s > give_up or self.should_stop():
                    raise
                log.warning("request lease for %s on %s: Redis failed (%s); trying again in %.2f s",
                            member, self.instance_id, e, pause_s)
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, 1.0)

    async def _lease(self, member: str) -> int:
        """Take a request lease for ``member``, waiting (a waiter, see the module doc) while
        the cap is reached: the leases now held, 0 when ``should_stop`` ended the wait.

        Raises:
            StoreError: Redis failed."""
        n = await self._try_acquire(member)
        if n:
            return n
        poll_s = POLL_S
        try:
            while True:
                await asyncio.sleep(poll_s)
                poll_s = min(POLL_MAX_S, poll_s * 2)  # many waiters: fewer polls, a few ms later at most
                if self.should_stop():
                    return 0
                n = await self._try_acquire(member)
                if n:  # the script stopped counting it as a waiter
                    return n
        finally:
            if not n:  # stopped, cancelled or a Redis error: no longer waiting
                try:
                    await self._call("zrem", self.keys.req_waiters(self.instance_id), member)
                except StoreError as e:  # a gauge for the drain check: never fail a request for it
                    log.warning("request waiter %s of %s not removed (%s): it stops counting in %.0f s",
                                member, self.instance_id, e, WAITER_TTL_S)

    async def _release(self, member: str) -> None:
        """Give the request lease back; a Redis error (a restart, a failover) is retried for
        up to :data:`RELEASE_RETRY_S` and then left to the lease's expiry, logged: the request
        itself was sent and answered, so the step does not fail for it."""
        pause_s, give_up = 0.05, time.monotonic() + RELEASE_RETRY_S
        while True:
            try:
                await self._call("zrem", self.keys.req_leases(self.instance_id), member)
                return
            except StoreError as e:
                if time.monotonic() + pause_s > give_up:
                    log.warning("request lease %s not given back (%s): it expires by its TTL", member, e)
                    return
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, 1.0)

    # -- sending ----------------------------------------------------------------------
    async def _one(self, clients: asyncio.Queue[httpx.AsyncClient], sem: asyncio.Semaphore, i: int,
                   payload: dict[str, Any], job_id: str, res: RequestResult) -> None:
        route = payload.get("route", "/v1/completions")
        async with sem:
            if self.should_stop() or self._aborted:
                return
            member = f"{job_id}:{i}:{uuid.uuid4().hex[:6]}"
            held = await self._lease(member)
            if not held:
                return
            if self._aborted:  # another request could not be sent meanwhile: the step fails, send no more
                await self._release(member)
                return
            res.peak_in_flight = max(res.peak_in_flight, held)
            t0 = time.time()
            status, text, err = 0, "", ""
            client = clients.get_nowait()  # never empty: at most `slots` requests hold the semaphore
            try:
                resp = await client.post(self.url + route, json=_body(route, payload, i, self.model))
                status = resp.status_code
                if status == 200:
                    data = resp.json()
                    text = _text(route, data)
                    if "items" in payload:  # ctx.requests keeps every whole answer
                        res.answers[i] = data if payload.get("raw") else _answer(route, data)
                else:
                    err = f"HTTP {status}: {resp.text[:120]}"
            except (httpx.HTTPError, ValueError) as e:
                err = _error_text(e, time.time() - t0, self.timeout_s)
            finally:
                t1 = time.time()  # before the release: [t0, t1] lies inside the lease
                clients.put_nowait(client)
                await self._release(member)
            res.sent += 1
            ms = (t1 - t0) * 1000.0
            if err:
                res.errors += 1
                res.first_error = res.first_error or err
            else:
                res.ok += 1
                res.latency_ms.append(ms)
            res.records.append(json.dumps(
                {"i": i, "t0": t0, "t1": t1, "ms": round(ms, 3), "ok": not err, "status": status,
                 "text": (text or err)[:KEEP_TEXT], "instance": self.instance_id}, separators=(",", ":")))

    async def run_async(self, job_id: str, payload: dict[str, Any]) -> RequestResult:
        n = len(payload["items"]) if "items" in payload else int(payload.get("requests", 0))
        res = RequestResult()
        timeout_s = float(payload.get("request_timeout_s", 60.0))
        self.timeout_s = timeout_s
        timeout = httpx.Timeout(timeout_s)
        self.lease_ttl_s = request_lease_ttl_s(timeout_s)
        # One single-connection client per slot, handed out through a queue: httpcore's pool
        # scans all of its connections (a socket poll each) for every request it assigns, so
        # one pool of `slots` connections cost O(slots) per request (encode/httpcore#924, #928):
        # at 64 slots 139 req/s of the 160 planned, 3.9 ms of CPU per request against 2.5 now
        # (bench/requests_sender.py).
        # The clients share one TLS context: building one loads the CA bundle (~30 ms each);
        # for http one that verifies nothing (never used, but httpx builds one per client
        # without it: 34 ms for 64 clients against 4 ms shared).
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        tls = httpx.create_ssl_context() if self.url.startswith("https:") else _unverified_context()
        sem = asyncio.Semaphore(self.slots)
        clients: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
        async with self._connected(), contextlib.AsyncExitStack() as stack:
            for _ in range(min(self.slots, max(n, 1))):
                client = httpx.AsyncClient(timeout=timeout, limits=limits, verify=tls)
                clients.put_nowait(await stack.enter_async_context(client))
            failures: list[Exception] = []

            async def one(i: int) -> None:
                try:
                    await self._one(clients, sem, i, payload, job_id, res)
                except Exception as e:  # noqa: BLE001 - a request that cannot be sent (a body JSON cannot encode)
                    self._aborted = True
                    failures.append(e)

            # every request ends here, its lease given back, before the clients and the Redis
            # twin close (a plain gather raised at the first failure and left the others to be
            # cancelled at the loop's end, when their releases could no longer reach Redis)
            self._aborted = False
            await asyncio.gather(*(one(i) for i in range(n)))
            if failures:
                raise failures[0]
        return res

    def run(self, job_id: str, payload: dict[str, Any], *, fresh: bool = True,
            commit: Callable[[list[tuple]], bool] | None = None) -> RequestResult:
        """Send ``payload["requests"]`` requests; blocks until all finished or stopped.

        ``fresh``: drop the job's earlier request records first (a retried step records
        afresh; False for each ``ctx.requests`` call of a function, whose run cleared
        them once). ``commit(ops) -> bool``: applies the record writes only while the
        caller's lease is current (:meth:`makespan.workers.leases.LeaseStore.fenced`), so a
        stale attempt never wipes or mixes into the records of the one running now; None:
        written directly.

        Raises:
            PhaseError: a request failed (HTTP error, timeout); the step fails.
        """
        write = commit or self._write
        if fresh:
            write([("DEL", self.keys.requests(job_id))])
        res = asyncio.run(self.run_async(job_id, payload))
        if res.records:  # one round trip after the batch, not one per request (keeps slots busy)
            write([("RPUSH", self.keys.requests(job_id), *res.records)])
        if res.errors:
            raise PhaseError(f"{res.errors} of {res.sent} requests to {self.url} failed; first: {res.first_error}")
        return res


def request_drain(r: redis.Redis, keys: Keys, instance_ids: list[str]) -> dict[str, int]:
    """``{"request_leases": n, "waiters": n}`` left on the given instances (target 0):
    request leases held (``P:reqlease``) and requests waiting for one now (``P:reqwaiters``
    members whose deadline, on the Redis server's clock, has not passed).

    Raises:
        redis.RedisError: Redis failed."""
    leases = sum(int(r.zcard(keys.req_leases(i))) for i in instance_ids)
    seconds, micros = r.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    waiters = sum(int(r.zcount(keys.req_waiters(i), now_ms, "+inf")) for i in instance_ids)
    return {"request_leases": leases, "waiters": waiters}
