"""CLI: why a job waits and until when (``makespan why ID``) and a listing of jobs with
their reasons (``makespan jobs [--state S --endpoint E --priority P]``). The reason codes
and the record fields are :mod:`makespan.wait_reasons`'s (docs/concepts.md)."""

from __future__ import annotations

import json
from typing import Any

import redis
import typer

from makespan.errors import MakespanError, ValidationError
from makespan.cli_support import context, fail, published_fleet
from makespan.cli_support import utc_text as _utc_text
from makespan.pools import published_pools
from makespan.wait_reasons import planned_priority

WAITING = ("queued", "delayed")
FINISHED = ("completed", "failed", "cancelled")  # listed from P:finished and P:retained, the latest first
LEASED = ("leased", "running")  # holding a GPU lease (running: in its execute phase)
LISTED_STATES = ("queued", "delayed", "leased", "running", *FINISHED)  # running: leased and in its execute phase
POOL_CHARS = 12  # the ``jobs`` listing's POOL column (shown when a listed job is routed to a pool)


def _header(pooled: bool, level_chars: int = 8) -> str:
    """The ``jobs`` listing's header row, with a POOL column after ENDPOINT when ``pooled``
    (:data:`HEADER` without) and a PRIORITY column ``level_chars`` wide (an inherited level,
    ``NORMAL>CRITICAL``, is wider than 8)."""
    pool = f"{'POOL':{POOL_CHARS}} " if pooled else ""
    return f"{'ID':32}  {'PRIORITY':{level_chars}} {'ENDPOINT':14} {pool}{'STATE':9} {'REASON':22} ETA/OUTCOME"


# a waiting job's ETA; an ended one's outcome: when it ended (UTC) and why (a failure's error, a cancel's cause)
HEADER = _header(False)
DETAIL_CHARS = 100  # a finished job's outcome in the ``jobs`` listing, at most (``why ID`` prints it whole)


def _short(text: str) -> str:
    """``text`` on one line, cut to :data:`DETAIL_CHARS` (an ellipsis marks the cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= DETAIL_CHARS else flat[:DETAIL_CHARS - 1] + "…"


def explain(r, keys, settings, job_id: str) -> dict[str, Any]:
    """``{id, state, priority, endpoint, pool, reason, detail, eta, eta_in_s, as_of_s, finished_at,
    leased_at, started_at, since_s, phase, cancel_requested}`` of one job (``reason`` None
    when it is not waiting; ETA in unix s on the Redis server's clock; ``finished_at``, unix
    s, for a completed, failed or cancelled job, else None). A leased or running job also
    has ``leased_at`` and ``started_at`` (unix s; ``started_at``: its execute phase began,
    None before), ``since_s`` (seconds since ``started_at`` for a running job, else since
    ``leased_at``, on the Redis server's clock), ``phase`` (the phase running now:
    ``evict``, ``start_endpoint``, ``execute`` or ``clear``; None between two phases) and
    ``cancel_requested`` (bool), ``progress`` (``{done, total, note}`` of its run's
    last ``ctx.progress`` report, None before one), ``host`` (the host its lease holds GPUs
    on), ``host_live`` (whether a GPU worker of that host is live now), ``host_stopping``
    (no live worker because its last one is shutting down cleanly: it hands its leases back) and
    ``lease_expires_in_s`` (s until its lease runs out, when that host has no live worker:
    the planner then reclaims it; else None); other states have them None (False), but a
    completed, failed or cancelled job keeps ``leased_at`` and ``started_at`` of its last lease
    (None when it never got that far or only its retained summary is left). Every job has
    ``preemptions`` (times it was preempted) and ``preemption_budget`` (the one its pool's
    leading planner published, else ``MAKESPAN_PREEMPTION_BUDGET`` as this process reads it;
    negative: none).

    Raises:
        NotFoundError: no such job."""
    # the planner's last reason write is read before the record (_context): a record read
    # after it holds every later write, so an older wait_at means the job was not in that write
    context = _context(r, keys.for_pool(r.hget(keys.job(job_id), "pool")))
    rec = r.hgetall(keys.job(job_id))
    if not rec:
        from makespan.producer import job_not_found

        raise job_not_found(job_id, keys, settings)
    (marks,) = _phase_marks(r, keys, [rec])
    (holder,) = _lease_hosts(r, keys, [rec])
    return _explain_rec(r, keys, settings, job_id, rec, *context, phase_marks=marks, lease_host=holder,
                        budget=_published_budget(r, keys.for_pool(rec.get("pool"))))


def _published_budget(r, keys) -> int | None:
    """The preemption budget the leading planner of ``keys``' pool plans with (its
    ``Keys.planner_config``), or None when none published one (an older planner, none yet)."""
    try:
        value = json.loads(r.get(keys.planner_config) or "{}").get("preemption_budget")
    except ValueError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _phase_marks(r, keys, recs: list[dict[str, str]]) -> list[dict[str, str] | None]:
    """Per record, the phase markers of the lease a leased or running one names
    (``P:phase:{lease}``, in one pipeline); None for the others."""
    leases = [rec.get("lease") if rec.get("state") in LEASED else None for rec in recs]
    p = r.pipeline(transaction=False)
    for lease_id in leases:
        if lease_id:
            p.hgetall(keys.phase(lease_id))
    found = iter(p.execute() if any(leases) else [])
    return [next(found) if lease_id else None for lease_id in leases]


def _lease_hosts(r, keys, recs: list[dict[str, str]]) -> list[tuple[str, float | None, bool, bool] | None]:
    """Per record, for a leased or running one: (the host its lease holds GPUs on, the
    lease's expiry in unix ms on the Redis server's clock or None, whether a GPU worker of
    that host is live now, ``P:host:live:{host}``, and whether its last worker stopped
    cleanly, ``stopped:`` in ``P:hosts:seen``: it is shutting down and hands its leases back);
    None for the others (and for a lease record already gone). Two pipelines, whatever the
    number of records."""
    leases = [rec.get("lease") if rec.get("state") in LEASED else None for rec in recs]
    if not any(leases):
        return [None] * len(recs)
    p = r.pipeline(transaction=False)
    for lease_id in leases:
        if lease_id:
            p.hmget(keys.lease(lease_id), "holder", "expires_ms")
    found = iter(p.execute())
    held = [next(found) if lease_id else None for lease_id in leases]
    hosts = sorted({row[0] for row in held if row and row[0]})
    from makespan.workers.host_liveness import STOPPED

    if not hosts:
        return [None] * len(recs)
    p = r.pipeline(transaction=False)
    for host in hosts:
        p.exists(keys.host_live(host))
    p.hmget(keys.hosts_seen, hosts)
    *exists, seen = p.execute()
    live = dict(zip(hosts, (bool(n) for n in exists)))
    # its last worker withdrew on a clean stop: shutting down (it hands its leases back itself)
    stopping = dict(zip(hosts, (str(value or "").startswith(STOPPED) for value in seen)))
    return [(row[0], _float_or_none(row[1]), live[row[0]], stopping[row[0]]) if row and row[0] else None
            for row in held]


def _context(r, keys) -> tuple[bool, float, float | None]:
    """(its planner leads, the server's now, its last reason write's time or None)."""
    sec, usec = r.time()
    written = r.get(keys.wait_reasons_at)
    return bool(r.exists(keys.planner_leader)), sec + usec / 1e6, float(written) if written else None


def _leader_silent(r, keys) -> str:
    """A note when the leading planner has missed two renewals of its leader lock (its TTL
    left is under ``lock_ttl_s`` − 2 × ``lock_renewal_s``, as the leader published them in
    ``Keys.planner_config``): it died or stalled, and until the lock runs out nothing is
    planned (a pools operator saw only ``behind_batch``, position 1, for the CRITICAL job of a
    killed leader). '' otherwise, or when either cannot be read (a leader of an older version)."""
    try:
        p = r.pipeline(transaction=False)
        p.pttl(keys.planner_leader)
        p.get(keys.planner_config)
        left_ms, raw = p.execute()
        config = json.loads(raw or "{}")
        ttl_s, renewal_s = float(config["lock_ttl_s"]), float(config["lock_renewal_s"])
    except (KeyError, TypeError, ValueError, AttributeError, redis.RedisError):
        return ""
    if int(left_ms) < 0 or left_ms / 1000.0 >= ttl_s - 2 * renewal_s:
        return ""
    return (f"; the leading planner has not renewed its leader lock for {ttl_s - left_ms / 1000.0:.1f} s (it "
            f"stopped or stalled): a standby, if one runs, takes over within {left_ms / 1000.0:.1f} s, when the "
            "lock runs out")


def _float_or_none(raw: str | None) -> float | None:
    return float(raw) if raw else None


_UNREAD: Any = object()  # _explain_rec's queue position when the caller did not read it


def _explain_rec(r, keys, settings, job_id: str, rec: dict[str, str], leads: bool, now_s: float,
                 written_at_s: float | None = None, phase_marks: dict[str, str] | None = None,
                 lease_host: tuple[str, float | None, bool, bool] | None = None,
                 budget: int | None = None, leader_note: str | None = None,
                 queue_position: Any = _UNREAD, ahead_by_level: dict[tuple, str] | None = None) -> dict[str, Any]:
    """:func:`explain`'s answer for the record ``rec``. A listing passes what it read for many
    rows at once (one round trip per chunk, not two per queued row: a fleet-scale operator's
    listing of 19,488 queued jobs took 39 s): ``queue_position`` (its ``ZRANK``, None when not
    queued) and ``ahead_by_level``, a cache of :func:`makespan.producer.higher_levels_ahead`
    per (pool, level) filled here."""
    from makespan.wait_reasons import reason_of, stale_after_s

    out: dict[str, Any] = {"id": job_id, "state": rec.get("state"), "priority": rec.get("priority"),
                           "planned_priority": None, "endpoint": rec.get("endpoint"), "pool": rec.get("pool"), "fn": rec.get("fn") or None,
                           "reason": None, "detail": "", "eta": None,
                           "eta_in_s": None, "as_of_s": None, "finished_at": None, "leased_at": None,
                           "started_at": None, "since_s": None, "phase": None, "cancel_requested": False,
                           "progress": None, "host": None, "host_live": None, "host_stopping": None,
                           "lease_expires_in_s": None, "preemptions": int(rec.get("preemptions") or 0),
                           # the leading planner's, else this process's MAKESPAN_PREEMPTION_BUDGET
                           "preemption_budget": budget if budget is not None else getattr(settings,
                                                                                          "preemption_budget", None)}
    if rec.get("state") in LEASED:  # when it was leased, the phase it is in (and since when)
        from makespan.producer import phase_now

        leased_at, started_at = _float_or_none(rec.get("leased_at")), _float_or_none(rec.get("started_at"))
        since = started_at if rec.get("state") == "running" and started_at is not None else leased_at
        out.update(leased_at=leased_at, started_at=started_at,
                   since_s=None if since is None else round(max(0.0, now_s - since), 3),
                   phase=phase_now(phase_marks or {})["phase"], cancel_requested=rec.get("cancel_requested") == "1")
        if lease_host is not None:  # where it runs; a host with no live GPU worker: its lease runs out, then requeued
            host, expires_ms, live, stopping = lease_host
            out.update(host=host, host_live=live, host_stopping=not live and stopping)
            if not live and expires_ms is not None:
                out["lease_expires_in_s"] = round(max(0.0, expires_ms / 1000.0 - now_s), 3)
        if rec.get("progress_total"):  # its run's last ctx.progress report (a new lease clears an earlier run's)
            out["progress"] = {"done": float(rec.get("progress_done") or 0.0), "total": float(rec["progress_total"]),
                               "note": rec.get("progress_note") or None}
    if rec.get("state") not in WAITING:
        if rec.get("state") in FINISHED and rec.get("finished_at"):
            out["finished_at"] = float(rec["finished_at"])
        if rec.get("state") in FINISHED:  # when its last lease was granted and its execute phase began (None:
            # it never got that far, or its record was compacted to a retained summary without them)
            out.update(leased_at=_float_or_none(rec.get("leased_at")), started_at=_float_or_none(rec.get("started_at")),
                       host=rec.get("host") or None)  # where its last lease ran (acquire.lua keeps it on the record)
        if rec.get("reason") and rec.get("state") in FINISHED:  # the outcome's reason; a leased or running
            out["detail"] = rec["reason"]  # job's record still holds its last requeue's ("preempted by …")
        return out
    if queue_position is _UNREAD:
        queue = keys.for_pool(rec.get("pool")).queue(rec.get("priority") or "NORMAL")  # its pool's queue
        queue_position = r.zrank(queue, job_id) if rec.get("state") == "queued" else None
    reason, detail, eta = reason_of(rec, planner_leads=leads, server_now_s=now_s, queue_position=queue_position,
                                    stale_after_s=stale_after_s(settings.lease_ttl_s), written_at_s=written_at_s)
    if reason == "behind_batch" and detail.startswith("position "):
        from makespan.producer import higher_levels_ahead

        level_key = (rec.get("pool"), rec.get("priority") or "NORMAL")
        if ahead_by_level is None or level_key not in ahead_by_level:
            ahead = higher_levels_ahead(r, keys.for_pool(rec.get("pool")), rec.get("priority") or "NORMAL")
            if ahead_by_level is None:
                ahead_by_level = {}
            ahead_by_level[level_key] = ahead
        detail += ahead_by_level[level_key]
    if reason == "behind_batch":  # leader_note: the listing's, read once per pool
        detail += leader_note if leader_note is not None else _leader_silent(r, keys.for_pool(rec.get("pool")))
    out.update(reason=reason, detail=detail, eta=eta, eta_in_s=None if eta is None else round(eta - now_s, 3))
    # the level it is planned at: a dependant's it inherits (the planner's entry), else its own
    out["planned_priority"] = (planned_priority(rec) if reason not in ("behind_batch", "no_planner") else None) \
        or rec.get("priority")
    if rec.get("wait_at") and reason not in ("no_planner", "delayed_until", "retry_backoff"):
        # clamped: a write stamped a moment after this read's server time is as of 0 s, not -0.0
        out["as_of_s"] = round(max(0.0, now_s - float(rec["wait_at"])), 3)
    return out


def _when(eta: float | None, in_s: float | None) -> str:
    """``ETA 2026-12-06 08:53:08Z (in 12 s)``, or ``(passed 40 s ago)`` when the plan it
    came from expected the start earlier (what holds the GPUs runs past its estimate)."""
    if eta is None:
        return "no ETA"
    if in_s is not None and in_s < -0.5:
        return f"ETA {_utc_text(eta)} (passed {-in_s:.0f} s ago)"
    return f"ETA {_utc_text(eta)} (in {max(0.0, in_s or 0.0):.0f} s)"


def _activity(x: dict[str, Any]) -> str:
    """What a leased or running job does now: ``leased 2026-12-06 00:10:03Z (12 s ago) on
    gpu-a, phase start_endpoint`` (``running since`` its execute phase began for a running
    job; the host its lease holds, and when no GPU worker of that host is live, that its
    lease runs out in N s and the planner then reclaims it: queued again, or failed after its
    last attempt, completed if it had executed; ``between phases`` while the next
    phase waits for its GPU worker), ``, cancel requested`` when it was asked to stop; ""
    for other states."""
    if x["state"] not in LEASED:
        return ""
    since = x["started_at"] if x["state"] == "running" and x["started_at"] is not None else x["leased_at"]
    head = "running since" if x["state"] == "running" and x["started_at"] is not None else "leased"
    text = head if since is None else f"{head} {_utc_text(since)}" + (
        f" ({x['since_s']:.0f} s ago)" if x["since_s"] is not None else "")
    text += f" on {x['host']}" if x.get("host") else ""
    if x.get("host_live") is False:
        expires = x.get("lease_expires_in_s")
        if x.get("host_stopping"):  # a clean stop in its grace period: it hands the lease back itself
            text += (" (its GPU worker is shutting down: it hands the lease back when the job's phase stops"
                     + (f", else the lease runs out in {expires:.0f} s and the planner reclaims it)"
                        if expires is not None else ")"))
        else:
            text += (f" (no live GPU worker there: its lease runs out in {expires:.0f} s, then the planner reclaims "
                     "it)" if expires is not None else " (no live GPU worker there)")
    text += f", phase {x['phase']}" if x["phase"] else ", between phases"
    progress = x.get("progress")
    if progress:
        text += f", progress {progress['done']:g}/{progress['total']:g}" + (
            f" ({_short(progress['note'])[:40]})" if progress["note"] else "")
    return text + (", cancel requested" if x["cancel_requested"] else "")


def _outcome(x: dict[str, Any]) -> str:
    """The ETA/OUTCOME cell of a job that is not waiting: an ended job's finish time (UTC)
    and why it ended (cut to :data:`DETAIL_CHARS`); a leased or running job's, when it was
    leased (or began executing), its phase now and whether it was asked to stop
    (:func:`_activity`)."""
    if x["finished_at"] is None:
        return _activity(x) or _short(x["detail"])
    return f"ended {_utc_text(x['finished_at'])}" + (f": {_short(x['detail'])}" if x["detail"] else "")


def preemption_budget_line(x: dict[str, Any]) -> str:
    """``preempted 1 time of its budget of 2 (MAKESPAN_PREEMPTION_BUDGET): …`` for a job that
    was preempted and has not ended (issue 19 point 2: how many more preemptions it may take),
    "" for one never preempted or ended."""
    count, budget = x.get("preemptions") or 0, x.get("preemption_budget")
    if not count or x["finished_at"] is not None or x["state"] in FINISHED:
        return ""
    times = f"{count} time{'s' if count != 1 else ''}"
    if budget is None or budget < 0:
        return f"preempted {times} (no preemption budget is set: it may be preempted again)"
    if count >= budget:
        return (f"preempted {times}, its whole budget of {budget} (MAKESPAN_PREEMPTION_BUDGET): "
                "it is not preempted again")
    return (f"preempted {times} of its budget of {budget} (MAKESPAN_PREEMPTION_BUDGET): it may be preempted "
            f"{budget - count} more time{'s' if budget - count != 1 else ''}")


def line(x: dict[str, Any]) -> str:
    """The one-line form of :func:`explain`'s answer."""
    if x["reason"] is None:
        ended = f", ended {_utc_text(x['finished_at'])}" if x["finished_at"] is not None else ""
        activity = _activity(x) if x.get("leased_at") or x.get("phase") else ""
        if x["state"] and activity.startswith(x["state"]):  # "running since …": the state is its first word
            return f"{x['id']}: {activity}" + (f" ({x['detail']})" if x["detail"] else "")
        doing = f", {activity}" if activity else ""
        state = x["state"] or "no state (its record has none: a damaged record, `makespan status ID` shows the rest)"
        return f"{x['id']}: {state}{ended}{doing}" + (f" ({x['detail']})" if x["detail"] else "")
    return f"{x['id']}: {x['state']}, {x['reason']}, {_when(x['eta'], x['eta_in_s'])}"


def _finished_ids(r, keys, count: int) -> list[str]:
    """The ``count`` latest finished job ids: those not compacted yet (``P:finished``) and
    the retained summaries (``P:retained``, compacted by the planner's retention sweep
    within ``MAKESPAN_RETENTION_SWEEP_S``), merged by finish time, the latest first."""
    p = r.pipeline(transaction=False)
    p.zrevrange(keys.finished, 0, count - 1, withscores=True)
    p.zrevrange(keys.retained, 0, count - 1, withscores=True)
    fresh, retained = p.execute()
    merged = sorted(dict(retained + fresh).items(), key=lambda item: item[1], reverse=True)
    return [job_id for job_id, _ in merged[:count]]


def published_endpoints(r, keys) -> list[str] | None:
    """The endpoint names of the fleet the planner published (``P:fleet``), sorted; None
    when none is published yet (or it holds no endpoint table)."""
    raw = r.get(keys.fleet)
    if not raw:
        return None
    try:
        known = sorted(json.loads(raw).get("endpoints") or {})
    except (ValueError, TypeError, AttributeError):
        return None
    return known or None


def _check_endpoint(r, keys, endpoint: str) -> None:
    """Raise ValidationError when the fleet the planner published (``P:fleet``) has no
    endpoint ``endpoint``; nothing to check when none is published yet."""
    known = published_endpoints(r, keys)
    if known is not None and endpoint not in known:
        raise ValidationError("endpoint", endpoint, f"not an endpoint of the published fleet; known: {', '.join(known)}")


def pool_mismatch(r, keys, endpoint: str, pool: str) -> str | None:
    """Why ``jobs --endpoint E --pool P`` can list nothing: the published fleet's pool
    ``pool`` does not serve ``endpoint`` (the message names the pools that do); None when it
    does, or when no fleet (or no such pool) is published to check against."""
    try:
        fleet = published_fleet(r, keys, required=False)
    except (ValueError, TypeError, ValidationError):
        return None
    if fleet is None or pool not in fleet.pool_names() or endpoint not in fleet.endpoints:
        return None
    serving = fleet.pools_serving(endpoint)
    if pool in serving:
        return None
    return (f"pool {pool!r} does not serve endpoint {endpoint!r}, so no job lists here; "
            + (f"its jobs go to {', '.join(repr(name) for name in serving)}" if serving else "no pool serves it"))


SCAN_MAX_IDS = 200_000  # ids read per source at most by one listing, past its filters' rejects


def list_jobs(r, keys, settings, states: tuple[str, ...] = WAITING, endpoint: str | None = None,
              priority: str | None = None, limit: int = 100, pool: str | None = None) -> list[dict[str, Any]]:
    """:func:`scan_jobs`'s jobs (without whether the scan was cut short)."""
    return scan_jobs(r, keys, settings, states, endpoint, priority, limit, pool)[0]


def scan_jobs(r, keys, settings, states: tuple[str, ...] = WAITING, endpoint: str | None = None,
              priority: str | None = None, limit: int = 100,
              pool: str | None = None, fn: str | None = None) -> tuple[list[dict[str, Any]], int | None]:
    """(the jobs, None; or the jobs found and how many ids each source was read to, when
    the scan stopped at :data:`SCAN_MAX_IDS` with more left): the jobs in ``states``
    (queued: every queue, CRITICAL first, FIFO; delayed: by due time; leased: by lease;
    completed, failed, cancelled: the latest finished first, whether compacted to a summary
    by retention or not yet, while their records are kept, see docs/operations.md on
    retention) filtered by endpoint, priority (a level name or 0–3), pool (a fleet with
    ``[[pools]]``) and workload function name ``fn``, at most ``limit``, each as :func:`explain` answers. Each source is read
    ``4 × limit`` ids first, four times as many again while fewer than ``limit`` match and a
    source has more (a filter that matches few jobs behind many others: the listing said
    "no job" with matching jobs queued, found by an SRE's soak).

    Raises:
        ValidationError: an unknown state or priority, an endpoint the published
            fleet does not have, or a pool it does not declare."""
    from makespan.models import Priority

    bad = [s for s in states if s not in LISTED_STATES]
    if bad:
        raise ValidationError("state", bad[0], f"must be one of {', '.join(LISTED_STATES)}")
    level = Priority.parse(priority) if priority is not None else None  # a name or 0–3, as submit takes
    if pool is not None:
        known = [name for name in published_pools(r, keys) if name]
        if pool not in known:
            raise ValidationError("pool", pool, f"not a pool of the published fleet; known: {', '.join(known)}"
                                  if known else "the published fleet declares no pools (or none is published yet)")
    if endpoint:
        _check_endpoint(r, keys, endpoint)
    if fn is not None and (not fn or not r.sismember(keys.fns, fn)):  # as --endpoint: a name no GPU worker
        from makespan.registry import closest_name                   # registered is refused ("" too)

        known = sorted(r.smembers(keys.fns))
        close = closest_name(fn, known) or next((name for name in known if name.lower() == fn.lower()), None)
        raise ValidationError("fn", fn, (f"no GPU worker has registered this workload function under key prefix "
                                         f"{keys.prefix!r}" + (f"; did you mean {close!r}?" if close else "") +
                                         (f"; known: {', '.join(known[:20])}" if known else "")))
    states = tuple(dict.fromkeys(states))  # a state given twice is listed once
    scan, most = 4 * limit, max(4 * limit, SCAN_MAX_IDS)
    while True:
        ids, more = _listed_ids(r, keys, states, level, pool, scan)
        out = _filtered(r, keys, settings, ids, states, endpoint, level, pool, limit, fn)
        if len(out) >= limit or not more:
            return out, None
        if scan >= most:
            return out, scan
        scan = min(scan * 4, most)


def _listed_ids(r, keys, states: tuple[str, ...], level, pool: str | None, scan: int) -> tuple[list[str], bool]:
    """(up to ``scan`` ids of each source of ``states``, in listing order; whether a source
    has more)."""
    from makespan.models import Priority

    ids: list[str] = []
    more = False

    def take(got: list[str]) -> None:
        nonlocal more
        ids.extend(got)
        more = more or len(got) >= scan

    for st in states:
        if st == "queued":  # every queue, CRITICAL first: levels before pools
            levels = [level] if level is not None else list(Priority)
            # without --pool also the implicit pool's queues: jobs submitted before the fleet
            # declared pools wait there until a leading planner routes them
            pools = [pool] if pool else list(dict.fromkeys([*published_pools(r, keys), None]))
            for lvl in levels:
                for queue_pool in pools:
                    take(r.zrange(keys.for_pool(queue_pool).queue(lvl), 0, scan - 1))
        elif st == "delayed":
            take(r.zrange(keys.delayed, 0, scan - 1))
        elif st in FINISHED:
            if st == next(s for s in states if s in FINISHED):  # the two indexes hold all three: read them once
                take(_finished_ids(r, keys, scan))
        elif "leased" not in states or st == "leased":  # P:running holds leased and running jobs: read it once
            take(r.zrange(keys.running, 0, scan - 1))
    return list(dict.fromkeys(ids)), more  # a job that moved between two sources while they were read: once


def _filtered(r, keys, settings, ids: list[str], states: tuple[str, ...], endpoint: str | None, level,
              pool: str | None, limit: int, fn: str | None = None) -> list[dict[str, Any]]:
    """The jobs of ``ids`` in ``states`` that pass the filters, at most ``limit``, each as
    :func:`explain` answers (records read in chunks, so a wide scan stops reading at ``limit``)."""
    # each pool's context (its last reason write) before the records: see explain()
    leads_by_pool: dict[str | None, tuple[bool, float, float | None]] = {
        name: _context(r, keys.for_pool(name)) for name in published_pools(r, keys)}
    out: list[dict[str, Any]] = []
    budget_by_pool: dict[str | None, int | None] = {}
    silent_by_pool: dict[str | None, str] = {}  # pool -> _leader_silent's note
    ahead_by_level: dict[tuple, str] = {}  # (pool, level) -> higher_levels_ahead, once per listing
    chunk = min(max(4 * limit, 1000), 5000)
    for first in range(0, len(ids), chunk):
        part = ids[first:first + chunk]
        p = r.pipeline(transaction=False)
        for j in part:
            p.hgetall(keys.job(j))
        recs = p.execute()
        positions = _queue_positions(r, keys, part, recs)
        for j, rec, marks, holder, position in zip(part, recs, _phase_marks(r, keys, recs),
                                                   _lease_hosts(r, keys, recs), positions):
            if not rec or rec.get("state") not in states and not (rec.get("state") == "running" and "leased" in states):
                continue
            if endpoint and rec.get("endpoint") != endpoint or level is not None and rec.get("priority") != level.name:
                continue
            if fn and rec.get("fn") != fn:
                continue
            job_pool = rec.get("pool")
            if pool and job_pool != pool:
                continue
            if job_pool not in leads_by_pool:  # a pool not in the published fleet: read after its records, so
                leads, now_s, _written = _context(r, keys.for_pool(job_pool))  # its last write is not compared
                leads_by_pool[job_pool] = (leads, now_s, None)
            if job_pool not in budget_by_pool:
                budget_by_pool[job_pool] = _published_budget(r, keys.for_pool(job_pool))
            if rec.get("state") == "queued" and job_pool not in silent_by_pool:  # once per pool, not per row
                silent_by_pool[job_pool] = _leader_silent(r, keys.for_pool(job_pool))
            out.append(_explain_rec(r, keys, settings, j, rec, *leads_by_pool[job_pool], phase_marks=marks,
                                    lease_host=holder, budget=budget_by_pool[job_pool],
                                    leader_note=silent_by_pool.get(job_pool), queue_position=position,
                                    ahead_by_level=ahead_by_level))
            if len(out) >= limit:
                return out
    return out


def _queue_positions(r, keys, ids: list[str], recs: list[dict[str, str]]) -> list[int | None]:
    """Per record, a queued one's position in its pool's queue of its level (``ZRANK``, in one
    pipeline); None for the others."""
    queued = [rec.get("state") == "queued" for rec in recs]
    if not any(queued):
        return [None] * len(recs)
    p = r.pipeline(transaction=False)
    for job_id, rec, is_queued in zip(ids, recs, queued):
        if is_queued:
            p.zrank(keys.for_pool(rec.get("pool")).queue(rec.get("priority") or "NORMAL"), job_id)
    found = iter(p.execute())
    return [next(found) if is_queued else None for is_queued in queued]


def _queue_depths(r, keys, pool: str | None = None) -> dict[str, int]:
    """Queued jobs per level, in ``pool`` or over the published fleet's pools (one round trip)."""
    from makespan.models import Priority

    pools = [pool] if pool else published_pools(r, keys)
    p = r.pipeline(transaction=False)
    for level in Priority:  # CRITICAL first
        for name in pools:
            p.zcard(keys.for_pool(name).queue(level))
    counts = [int(n) for n in p.execute()]
    return {level.name: sum(counts[i * len(pools):(i + 1) * len(pools)]) for i, level in enumerate(Priority)}


def register(app: typer.Typer) -> None:
    """Add ``why`` and ``jobs`` to the ``makespan`` CLI."""

    _ctx, _fail = context, fail

    @app.command("why")
    def why_cmd(job_id: str, as_json: bool = typer.Option(False, "--json", help="print the answer as JSON")):
        """Why a job waits and until when: one line (state, reason code, ETA), then the detail."""
        try:
            s, r, k = _ctx()
            x = explain(r, k, s, job_id)
        except MakespanError as e:
            _fail(e)
        if as_json:
            typer.echo(json.dumps(x))
            return
        typer.echo(line(x))
        if x["reason"] is not None:
            typer.echo(f"  {x['detail']}" if x["detail"] else "  (no detail)")
            if x["as_of_s"] is not None:
                typer.echo(f"  as of {x['as_of_s']:.1f} s ago (the planner's last tick that read it)")
        budget_line = preemption_budget_line(x)
        if budget_line:
            typer.echo(f"  {budget_line}")

    @app.command("jobs")
    def jobs_cmd(state: list[str] = typer.Option(None, "--state", help="queued, delayed, leased (leased or running), running, "
                                                                         "completed, failed or cancelled (repeatable); "
                                                                         "default: queued and delayed"),
                 endpoint: str = typer.Option(None, "--endpoint", help="only jobs of this endpoint (a name the "
                                              "published fleet has: another one fails, exit 2; with no fleet "
                                              "published it cannot be checked, and a warning says so)"),
                 priority: str = typer.Option(None, "--priority", help="only jobs of this level: CRITICAL, HIGH, "
                                              "NORMAL or LOW, or 0–3 (0: CRITICAL, 3: LOW)"),
                 pool: str = typer.Option(None, "--pool", help="only jobs of this pool (a fleet file with "
                                          "\\[\\[pools]]: a pool it does not declare fails, exit 2)"),
                 fn: str = typer.Option(None, "--fn", help="only calls of this workload function (its registered "
                                        "name, e.g. mymodule.train)"),
                 limit: int = typer.Option(100, "--limit", min=1, help="list at most this many jobs"),
                 as_json: bool = typer.Option(False, "--json", help="print JSON lines")):
        """Jobs with their state, reason and ETA (one line each); a leased or running job's ETA/OUTCOME says when it
        was leased (or began executing) and its phase now, an ended job's when and why it ended."""
        try:
            s, r, k = _ctx()
            rows, cut_at = scan_jobs(r, k, s, tuple(state) if state else WAITING, endpoint, priority, limit, pool, fn)
            unchecked = bool(endpoint) and published_endpoints(r, k) is None
            mismatch = pool_mismatch(r, k, endpoint, pool) if endpoint and pool else None
        except MakespanError as e:
            _fail(e)
        if unchecked:
            typer.echo(f"warning: no planner has published a fleet yet: --endpoint {endpoint!r} could not be checked "
                       "(an unknown endpoint lists nothing)", err=True)
        if mismatch:
            typer.echo(f"warning: {mismatch}", err=True)
        if cut_at is not None:
            typer.echo(f"note: read the first {cut_at} jobs of each list ({', '.join(state or WAITING)}) and found "
                       f"{len(rows)} matching; more may match further on", err=True)
        if not rows and not as_json:
            typer.echo(f"no job {' or '.join(state or WAITING)}" + (" among those read" if cut_at else ""), err=True)
        pooled = any(x.get("pool") for x in rows)  # a fleet with [[pools]]: which pool each job is routed to

        def level_of(x: dict[str, Any]) -> str:  # an inherited level as LOW>CRITICAL (an issue-19 check:
            level = x["priority"] or "-"        # only why and --json said it)
            if x.get("planned_priority") and x["planned_priority"] != x["priority"]:
                level = f"{level}>{x['planned_priority']}"
            return level

        level_chars = max([8, *(len(level_of(x)) for x in rows)]) if not as_json else 8
        if rows and not as_json:
            typer.echo(_header(pooled, level_chars))
        for x in rows:
            if as_json:
                typer.echo(json.dumps(x))
            else:
                tail = _when(x["eta"], x["eta_in_s"]) if x["reason"] else _outcome(x)
                pool_cell = f"{x.get('pool') or '-':{POOL_CHARS}} " if pooled else ""
                typer.echo(f"{x['id']:32}  {level_of(x):{level_chars}} {x['endpoint'] or '-':14} {pool_cell}"
                           f"{x['state']:9} {x['reason'] or '-':22} {tail}")
        if len(rows) >= limit:  # it stopped at --limit without saying so (new-user check)
            typer.echo(f"listed the first {limit} (--limit {limit}); more may match: raise --limit, or narrow with "
                       "--state, --endpoint, --priority, --pool or --fn", err=True)
            if "queued" in (state or WAITING):  # how many there are (a large-queue user had no total anywhere)
                depths = _queue_depths(r, k, pool)
                typer.echo("queued now: " + ", ".join(f"{level} {n:,}" for level, n in depths.items()) +
                           f" ({sum(depths.values()):,} in all)", err=True)
