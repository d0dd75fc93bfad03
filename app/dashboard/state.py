"""The dashboard's view of a makespan deployment: one JSON snapshot read from Redis.

Read-only: every read goes through :class:`makespan.keys.Keys` and nothing is written.
:func:`snapshot` builds what the page draws (shape below; times are unix wall seconds);
:func:`job_detail` what the job page shows. Sources:

* lanes: the fleet spec the planner stored at ``P:fleet`` (or the one passed in), each
  GPU's holder ``P:gpu:{uuid}`` and resident ``P:resident:{uuid}``, the set point;
* bars of the last ``window_s``: phase intervals of the ``P:events`` stream
  (:func:`makespan.gantt.intervals`), an open phase drawn up to now;
* the plan ahead: ``P:plan`` (:mod:`makespan.workers.plan_view`), assignments of jobs
  still waiting;
* the queue: ``P:queue:{level}`` and ``P:delayed`` with each job's record; the reason
  code, detail and ETA the planner wrote on it (:mod:`makespan.wait_reasons`, as
  ``makespan why``), the last plan's start as the ETA of a job it has not written yet;
* endpoints: instances per endpoint from the residents, loading / evicting from open
  phases, asleep for an endpoint with a sleep mode evicted and not resident, the
  instance registry's state; transitions in progress: the open agenda entries;
* incidents (``P:incidents``, recoveries merged) and the last drain check (``P:drain``).

Shape of :func:`snapshot`::

    {"now", "window_s", "fleet": {"name", "hosts"},
     "hosts": [{"name", "state", "worker_down", "reason", "since"}],  # schedulable, down, cordoned, drained (docs/operations.md)
     "lanes": [{"gpu", "host", "index", "set_point", "resident", "lease", "host_state", "worker_down"}],
     "bars": [{"gpu", "job", "endpoint", "priority", "phase", "start", "end", "open"}],
     "planned": [{"gpu", "job", "endpoint", "priority", "start", "service_start", "end", "load"}],
     "queue": [{"job", "priority", "endpoint", "state", "submitted_at", "wait_s", "attempts", "reason_code",
                "reason", "eta", "gpus"}],
     "endpoints": [{"name", "slots", "wake_s", "cold_start_s", "set_point", "instances": [{"gpus", "host", "state"}]}],
     "agenda": [{"op_id", "mode", "endpoints", "gpus", "planned_start", "expected_end", "overdue"}],
     "incidents": [{"incident_id", "endpoint", "host", "gpus", "failure_mode", "detected_at", "effect", "recovery"}],
     "drain": {"checks", "checked_at", "leases", "agenda_entries", "busy_slots", "awaited_entries",
               "set_points_failed"} | None,
     "plan": {"at", "policy", "batch"} | None, "counts": {"queued", "delayed", "running", "leases", "listed", "list_limit"},
     "pools": [{"name", "leads", "queued", "drain"}]}  # [] without pools

A fleet with pools (``[[pools]]``): the plan is every pool's ``P:pool:{name}:plan`` together,
the queue every pool's queues (each job with its ``pool``), ``drain`` the latest pool check,
and ``pools`` each pool's leader, queued jobs and last drain check. ``worker_down``: no live
GPU worker on the host (its ``state`` says ``down`` unless it is cordoned, when ``cordoned``
or ``drained`` wins, as in ``makespan hosts``, whose WORKER column says ``down``).

``queue`` lists the first :data:`QUEUE_LIMIT` jobs of each priority queue and of the delayed
set; ``counts`` ``queued`` and ``delayed`` are the totals (``ZCARD``), ``listed`` how many
``queue`` holds.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from makespan.errors import StoreError
from makespan.gantt import intervals
from makespan.keys import Keys
from makespan.models import FleetSpec, Priority
from makespan.producer import attempts_made, typed_waiting_record, waiting_record
from makespan.workers import host_liveness

QUEUE_LIMIT = 500  # waiting jobs listed per priority
EVENTS_LIMIT = 50_000  # most events read for one snapshot
INCIDENTS_LIMIT = 50
JOB_EVENTS_SCAN = 20_000  # newest events searched for one job's page


def _f(v: Any) -> float | None:
    try:
        return float(v) if v not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _fleet(r: redis.Redis, keys: Keys, fleet: FleetSpec | None) -> dict[str, Any] | None:
    if fleet is not None:
        return json.loads(fleet.model_dump_json())
    raw = r.get(keys.fleet)
    return json.loads(raw) if raw else None


def _gpus(fleet: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for h in fleet.get("hosts", []):
        for g in h.get("gpus") or []:
            out.append({"gpu": g["uuid"], "host": h["name"], "index": g.get("index", 0)})
    return out


def _set_point(fleet: dict[str, Any]) -> dict[str, str]:
    """GPU uuid -> set-point endpoint."""
    by_host = {h["name"]: {g.get("index"): g["uuid"] for g in h.get("gpus") or []} for h in fleet.get("hosts", [])}
    out = {}
    for name, ep in (fleet.get("endpoints") or {}).items():
        for sp in ep.get("set_point") or []:
            for i in sp.get("gpus", []):
                u = by_host.get(sp.get("host"), {}).get(i)
                if u:
                    out[u] = name
    return out


def _events_since(r: redis.Redis, keys: Keys, since: float) -> list[dict[str, Any]]:
    """The events of the window from ``since`` (unix s) on, at most :data:`EVENTS_LIMIT`:
    the newest ones when the window holds more (read newest first: the oldest 50,000 left
    out the last ones, so a busy fleet's chart missed "now": a large-queue check)."""
    rows = r.xrevrange(keys.events, max="+", min=f"{max(0, int(since * 1000))}-0", count=EVENTS_LIMIT)
    out = []
    for _sid, fields in rows:
        try:
            ev = json.loads(fields.get("e", ""))
        except ValueError:
            continue
        if isinstance(ev, dict) and isinstance(ev.get("ts"), (int, float)) and isinstance(ev.get("kind"), str):
            out.append(ev)
    out.sort(key=lambda e: e["ts"])
    return out


def _bars(evs: list[dict[str, Any]], now: float, since: float) -> list[dict[str, Any]]:
    if not evs:
        return []
    t0, t_last = evs[0]["ts"], evs[-1]["ts"]
    out = []
    for iv in intervals(evs):
        start, end = t0 + iv.start_s, t0 + iv.end_s
        still_open = not iv.complete and abs(end - t_last) < 1e-9
        if still_open:
            end = now
        if end < since or (iv.complete and end - start < 0.001):  # a no-op phase (a restore's evict of
            continue                                                  # nothing): no bar to draw
        for g in iv.gpus:
            out.append({"gpu": g, "job": iv.job, "endpoint": iv.endpoint, "priority": iv.priority, "phase": iv.phase,
                        "start": max(start, since), "end": end, "open": still_open})
    return out


def _incidents(r: redis.Redis, keys: Keys) -> list[dict[str, Any]]:
    rows = r.xrevrange(keys.incidents, count=INCIDENTS_LIMIT * 2)
    recoveries: dict[str | None, dict] = {}
    for _sid, rec in rows:  # newest first: an incident's latest recovery record wins (a given-up one is later
        if rec.get("kind") == "recovery":  # closed by a second, "recovered" record; makespan incidents shows it)
            recoveries.setdefault(rec.get("incident_id"), rec)
    out = []
    for sid, rec in rows:
        if rec.get("kind") == "recovery":
            continue
        try:
            gpus = json.loads(rec.get("gpus", "[]"))
        except ValueError:
            gpus = []
        rcv = recoveries.get(sid)
        out.append({"incident_id": sid, "endpoint": rec.get("endpoint"), "host": rec.get("host"), "gpus": gpus,
                    "instance_id": rec.get("instance_id"), "failure_mode": rec.get("failure_mode"),
                    "detected_at": _f(rec.get("detected_at")), "effect": rec.get("effect"),
                    "recovery": None if rcv is None else {"outcome": rcv.get("outcome"),
                                                           "recovery_s": _f(rcv.get("recovery_s"))}})
    return out[:INCIDENTS_LIMIT]


def _agenda(r: redis.Redis, keys: Keys, now: float) -> list[dict[str, Any]]:
    """The open agenda entries. Their times are on the Redis server's clock (the agenda
    writes them with ``TIME``): ``overdue`` compares ``expected_end`` with the server's
    clock, read in the same round trip, and the times shown are moved to this machine's
    clock (``now``), as the queue's ETAs are, so a skewed host neither calls a transition
    late early nor misses one that is."""
    ids = r.zrange(keys.agenda_index, 0, -1)
    if not ids:
        return []
    p = r.pipeline(transaction=False)
    for op in ids:
        p.hgetall(keys.agenda(op))
    p.time()
    *recs, (sec, usec) = p.execute()
    server_now = sec + usec / 1e6
    shift = now - server_now  # the server's clock -> this machine's
    out = []
    for op, h in zip(ids, recs):
        if not h:
            continue
        try:
            eps, gpus = json.loads(h.get("endpoints", "[]")), json.loads(h.get("gpus", "[]"))
        except ValueError:
            eps, gpus = [], []
        start, end = _f(h.get("planned_start")), _f(h.get("expected_end"))
        out.append({"op_id": op, "mode": h.get("mode"), "endpoints": eps, "gpus": gpus,
                    "planned_start": None if start is None else start + shift,
                    "expected_end": None if end is None else end + shift,
                    "overdue": bool(end is not None and end < server_now)})
    return out


def _plan(r: redis.Redis, keys: Keys) -> dict[str, Any] | None:
    raw = r.get(keys.plan)
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


_JOB_FIELDS = ("state", "endpoint", "priority", "submitted_at", "attempts", "tries", "result_attempt", "reason",
               "service_s", "deps", "not_before", "workload_id", "wait_reason", "wait_detail", "wait_eta", "wait_at",
               "pool")


def _queue(r: redis.Redis, keys: Keys, plan: dict[str, Any] | None, now: float,
           stale_after_s: float, delayed_pools: frozenset[str] | None = None) -> list[dict[str, Any]]:
    """Waiting jobs, CRITICAL first then by submission. The reason and ETA are the
    planner's (:func:`makespan.wait_reasons.reason_of`, as ``makespan why`` gives
    them); a queued job the planner gave no reason yet falls back to what the last
    published plan says of it. ``delayed_pools``: a pool's queue (``keys.pool`` set) lists
    the delayed jobs (one set shared by every pool) whose record names one of these pools
    ('' for none); None: every delayed job."""
    from makespan.wait_reasons import reason_of

    p = r.pipeline(transaction=False)
    for prio in Priority:
        p.zrange(keys.queue(prio), 0, QUEUE_LIMIT - 1)
    p.zrange(keys.delayed, 0, QUEUE_LIMIT - 1, withscores=True)
    p.exists(keys.planner_leader)
    p.time()
    p.get(keys.wait_reasons_at)  # before the records (as `makespan why`: makespan.cli_why.explain)
    *queued, delayed, leads, (sec, usec), written = p.execute()
    server_now = sec + usec / 1e6
    position = {j: i for q in queued for i, j in enumerate(q)}
    ids = [j for q in queued for j in q]
    due = {j: s for j, s in delayed}
    ids += [j for j in due if j not in position]
    if not ids:
        return []
    p = r.pipeline(transaction=False)
    for j in ids:
        p.hmget(keys.job(j), _JOB_FIELDS)
    planned = {a["job"]: a for a in (plan or {}).get("assignments", [])}
    out = []
    for j, vals in zip(ids, p.execute()):
        rec = {k: v for k, v in zip(_JOB_FIELDS, vals) if v is not None}
        if not rec.get("state"):
            continue  # gone between the two reads
        if j not in position and delayed_pools is not None and (rec.get("pool") or "") not in delayed_pools:
            continue  # another pool's delayed job: listed with its own pool
        if j in due and not rec.get("not_before"):
            rec["not_before"] = repr(due[j])
        try:
            code, detail, eta = reason_of(rec, planner_leads=bool(leads), server_now_s=server_now,
                                          queue_position=position.get(j), stale_after_s=stale_after_s,
                                          written_at_s=float(written) if written else None)
        except ValueError:  # started or finished between the two reads
            continue
        a = planned.get(j)
        if eta is None and a and code == "behind_batch":
            eta = a["start"]
        if eta is not None:
            eta += now - server_now  # the server's clock -> this machine's
        sub = _f(rec.get("submitted_at"))
        out.append({"job": j, "priority": rec.get("priority"), "endpoint": rec.get("endpoint"),
                    "state": rec["state"], "submitted_at": sub, "wait_s": (now - sub) if sub else None,
                    "attempts": attempts_made(rec), "service_s": _f(rec.get("service_s")),
                    "reason_code": code, "reason": f"{code}: {detail}" if detail else code, "eta": eta,
                    "gpus": a["gpus"] if a else []})
    rank = {p.name: p.value for p in Priority}
    out.sort(key=lambda q: (rank.get(q["priority"] or "", 9), q["submitted_at"] or 0))
    return out


def _queued_total(r: redis.Redis, keys: Keys) -> int:
    """Jobs in ``keys``' four priority queues, all of them (:func:`_queue` lists at most
    :data:`QUEUE_LIMIT` of each): ``ZCARD``, as ``makespan_queue_depth_jobs`` counts them."""
    p = r.pipeline(transaction=False)
    for prio in Priority:
        p.zcard(keys.queue(prio))
    return sum(p.execute())


def _seen_pools(r: redis.Redis, keys: Keys) -> set[str]:
    """Every pool a job record may name ('' for none): ``P:pools:seen`` and the implicit pool."""
    return {*r.smembers(keys.pools_seen), ""}


def _pools(r: redis.Redis, keys: Keys, names: list[str], now: float,
           stale_after_s: float) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]:
    """A fleet with pools: every pool's plan (assignments together), its waiting jobs (each
    with its ``pool``; all sorted as :func:`_queue` sorts them), and per pool ``{name,
    leads, queued, drain, drain_at}``."""
    plans, queue, pools = [], [], []
    for index, name in enumerate(names):
        scoped = keys.for_pool(name)
        plan = _plan(r, scoped)
        # the delayed set is shared: each delayed job once, with the pool its record names (the
        # first pool also lists those whose record names no declared pool: a planner moves them
        # once they are due, makespan.workers.pool_rehome)
        mine = {name} if index else {name, *(_seen_pools(r, keys) - set(names))}
        waiting = _queue(r, scoped, plan, now, stale_after_s, frozenset(mine))
        queue += [{**q, "pool": name} for q in waiting]
        if plan:
            plans.append(plan)
        drain = r.hgetall(scoped.drain)
        # waiting in the pool: all its queued jobs (not only the listed ones) and its delayed ones
        pools.append({"name": name, "leads": bool(r.exists(scoped.planner_leader)),
                      "queued": _queued_total(r, scoped) + sum(1 for q in waiting if q["state"] == "delayed"),
                      "drain": _drain_view(drain), "drain_at": _f(drain.get("checked_at"))})
    rank = {p.name: p.value for p in Priority}
    queue.sort(key=lambda q: (rank.get(q["priority"] or "", 9), q["submitted_at"] or 0))
    merged = None
    if plans:
        merged = {**plans[0], "batch": sum(int(p.get("batch") or 0) for p in plans),
                  "assignments": [a for p in plans for a in p.get("assignments", [])],
                  "restores": [x for p in plans for x in p.get("restores", [])]}
    return merged, queue, pools


def _endpoints(fleet: dict[str, Any], residents: dict[str, str | None], bars: list[dict[str, Any]],
               registry: list[dict[str, str]]) -> list[dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    gpu_host = {g["gpu"]: g["host"] for g in _gpus(fleet)}
    for _gpu, val in residents.items():
        ep, _, gpu_list = (val or "").partition("@")  # P:resident value: endpoint@uuid1,uuid2
        if ep:
            gpus = gpu_list.split(",") if gpu_list else []
            groups.setdefault(f"{ep}@{','.join(gpus)}", {"endpoint": ep, "gpus": gpus,
                                                         "host": gpu_host.get(gpus[0]) if gpus else None,
                                                         "state": "resident"})
    evicted: set[str] = set()
    for b in bars:
        if not b["endpoint"]:
            continue
        if b["open"] and b["phase"] in ("start_endpoint", "restore"):
            key = f"{b['endpoint']}@loading@{b['gpu']}"
            groups.setdefault(key, {"endpoint": b["endpoint"], "gpus": [], "host": gpu_host.get(b["gpu"]),
                                    "state": "loading"})["gpus"].append(b["gpu"])
        elif b["phase"] == "evict":
            evicted.add(b["endpoint"])
    failed = {(x.get("endpoint"), x.get("gpus")) for x in registry if x.get("state") == "failed"}
    out = []
    for name, ep in sorted((fleet.get("endpoints") or {}).items()):
        insts = [g for g in groups.values() if g["endpoint"] == name]
        for g in insts:
            if (name, json.dumps(g["gpus"])) in failed:
                g["state"] = "failed"
        if not any(g["state"] == "resident" for g in insts) and (ep.get("wake_s") or 0) > 0 and name in evicted:
            insts.append({"endpoint": name, "gpus": [], "host": None, "state": "asleep"})
        sp = [f"{s.get('host')}:{','.join(str(i) for i in s.get('gpus', []))}" for s in ep.get("set_point") or []]
        out.append({"name": name, "slots": ep.get("slots"), "wake_s": ep.get("wake_s"),
                    "cold_start_s": ep.get("cold_start_s"), "tensor_parallel": ep.get("tensor_parallel"),
                    "set_point": sp, "instances": sorted(insts, key=lambda g: (g["state"], g["gpus"]))})
    return out


def _registry(r: redis.Redis, keys: Keys) -> list[dict[str, str]]:
    ids = sorted(r.smembers(keys.instances))
    if not ids:
        return []
    p = r.pipeline(transaction=False)
    for i in ids:
        p.hgetall(keys.instance(i))
    return [h for h in p.execute() if h]


def snapshot(r: redis.Redis, keys: Keys, fleet: FleetSpec | None = None, window_s: float = 600.0,
             now: float | None = None, stale_after_s: float = 1.5) -> dict[str, Any]:
    """The dashboard's JSON-ready view (module doc for the shape). ``r`` is a decoded
    redis-py client; ``fleet`` defaults to the spec stored at ``P:fleet`` (lanes are
    empty until a planner stored one); ``window_s``: seconds of history drawn;
    ``stale_after_s``: a planner's wait reason older than this while no planner leads is
    not trusted (``no_planner``; ``makespan why`` uses half the lease TTL).

    Raises:
        StoreError: Redis could not be read.
    """
    now = time.time() if now is None else now
    since = now - window_s
    try:
        spec = _fleet(r, keys, fleet)
        gpus = _gpus(spec) if spec else []
        uuids = [g["gpu"] for g in gpus]
        p = r.pipeline(transaction=False)
        p.mget([keys.gpu(u) for u in uuids] or [keys.fleet])
        p.mget([keys.resident(u) for u in uuids] or [keys.fleet])
        p.hgetall(keys.drain)
        p.zcard(keys.running)
        p.zcard(keys.leases)
        host_names = [h["name"] for h in (spec or {}).get("hosts", [])]
        host_liveness.queue_reads(p, keys, host_names)
        held, res, drain_hash, running, leases, seen, live, cordoned = p.execute()
        hosts_now = host_liveness.availability(host_names, seen, live, cordoned)
        drain = _drain_view(drain_hash)
        evs = _events_since(r, keys, since - window_s)  # a margin: phases open since before the window
        bars = _bars(evs, now, since)
        pool_names = [str(pool["name"]) for pool in (spec or {}).get("pools", [])]
        if pool_names:  # a fleet with pools: each pool's plan, queues, leader and drain check
            plan, queue, pools = _pools(r, keys, pool_names, now, stale_after_s)
            drain = next((pool["drain"] for pool in sorted(pools, key=lambda x: -(x["drain_at"] or 0))), drain)
        else:
            plan = _plan(r, keys)
            queue = _queue(r, keys, plan, now, stale_after_s)
            pools = []
        # the totals, not the listed part (QUEUE_LIMIT per priority, and of the delayed set)
        queued_total = (sum(_queued_total(r, keys.for_pool(name)) for name in pool_names) if pool_names
                        else _queued_total(r, keys))
        delayed_total = int(r.zcard(keys.delayed))
        agenda = _agenda(r, keys, now)
        incidents = _incidents(r, keys)
        registry = _registry(r, keys)
    except redis.RedisError as e:
        raise StoreError(f"dashboard snapshot: {e}") from e
    sp = _set_point(spec) if spec else {}
    residents = dict(zip(uuids, res)) if uuids else {}
    leased_hosts = {g["host"] for g, h in zip(gpus, held) if h}
    # as `makespan hosts` says it: a cordoned host with no lease left is drained (its worker may stop)
    host_state = {name: ("cordoned" if name in leased_hosts else "drained") if name in hosts_now.cordoned
                  else "down" if name in hosts_now.down else "schedulable" for name in host_names}
    lanes = [{**g, "set_point": sp.get(g["gpu"]), "resident": (residents.get(g["gpu"]) or "").partition("@")[0] or None,
              "lease": (h or "").partition(":")[0] or None, "host_state": host_state.get(g["host"]),
              "worker_down": g["host"] in hosts_now.down}
             for g, h in zip(gpus, held)]
    waiting = {q["job"] for q in queue}
    planned = []
    for a in (plan or {}).get("assignments", []):
        if a["job"] in waiting and a["end"] >= now:
            for g in a["gpus"]:
                planned.append({"gpu": g, "job": a["job"], "endpoint": a.get("endpoint"),
                                "priority": a.get("priority"), "start": max(a["start"], now),
                                "service_start": a.get("service_start"), "end": a["end"], "load": a.get("load")})
    drain_view = drain
    return {
        "now": now, "window_s": window_s,
        "fleet": {"name": spec.get("name") if spec else None, "hosts": [h["name"] for h in (spec or {}).get("hosts", [])]},
        "hosts": [{"name": name, "state": host_state[name], "worker_down": name in hosts_now.down,
                   "reason": hosts_now.cordoned[name].reason if name in hosts_now.cordoned else "",
                   "since": hosts_now.cordoned[name].since_s if name in hosts_now.cordoned else None}
                  for name in host_names],
        "lanes": lanes, "bars": bars, "planned": planned, "queue": queue,
        "endpoints": _endpoints(spec, residents, bars, registry) if spec else [],
        "agenda": agenda, "incidents": incidents, "drain": drain_view,
        "pools": [{k: v for k, v in pool.items() if k != "drain_at"} for pool in pools],
        "plan": None if plan is None else {"at": plan.get("at"), "policy": plan.get("policy"),
                                          "batch": plan.get("batch")},
        "counts": {"queued": queued_total, "delayed": delayed_total, "running": running, "leases": leases,
                   "listed": len(queue), "list_limit": QUEUE_LIMIT},
    }


def _drain_view(drain: dict[str, str]) -> dict[str, Any] | None:
    """A drain check's hash (``P:drain``) as the snapshot gives it: ``checks`` an int, the
    counts and ``checked_at`` floats; None when there is none."""
    return {k: (_f(v) if k != "checks" else int(v)) for k, v in drain.items()} if drain else None


def job_detail(r: redis.Redis, keys: Keys, job_id: str, stale_after_s: float = 1.5) -> dict[str, Any] | None:
    """One job for the job page, or None when ``P:job:{id}`` does not exist:
    ``{"job", "record" (the hash, ``spec`` decoded, ``attempts`` the attempts made as
    ``makespan status`` counts them, :func:`makespan.producer.attempts_made`, and the hash's
    own count as ``reclaimed_attempts``), "phases": [{"phase", "gpus",
    "start", "end", "complete", "running"}], "events": [...], "result"}``. ``result`` is the JSON
    of ``P:result:{id}`` (:mod:`makespan.results`: ``{"ok": true, "value": ...}`` or
    ``{"ok": false, "error": {...}}``), None when there is none (a phase still ``running``,
    the job holding its lease, ends at ``now``); ``now``: the Redis server's
    clock as it was read (unix s: an ETA the page says has passed is judged on it). A queued or delayed job's
    ``wait_reason``, ``wait_detail`` and ``wait_eta`` are as ``makespan status`` gives them
    (:func:`makespan.producer.waiting_record`; ``stale_after_s``: its planner staleness).

    Raises:
        StoreError: Redis could not be read.
    """
    try:
        rec = r.hgetall(keys.job(job_id))
        if rec.get("state") in ("queued", "delayed"):  # its reason now, as `makespan status` and `why` give it
            rec = waiting_record(r, keys, job_id, rec, stale_after_s)
        if not rec:
            return None
        rows = r.xrevrange(keys.events, count=JOB_EVENTS_SCAN)
        raw = r.get(keys.result(job_id))
        seconds, micros = r.time()
    except redis.RedisError as e:
        raise StoreError(f"job {job_id}: {e}") from e
    try:
        result = json.loads(raw) if raw else None
    except ValueError:
        result = raw
    evs = []
    for _sid, fields in rows:
        try:
            ev = json.loads(fields.get("e", ""))
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("job") == job_id and isinstance(ev.get("ts"), (int, float)):
            evs.append(ev)
    evs.sort(key=lambda e: e["ts"])
    phases = []
    server_now = seconds + micros / 1e6
    if evs:
        t0 = evs[0]["ts"]
        holds = rec.get("state") in ("leased", "running")
        for iv in intervals(evs):
            # the phase running now (no end yet) lasts until now, not until the job's last event
            running = holds and iv.cut_by == "open_at_end"
            phases.append({"phase": iv.phase, "gpus": list(iv.gpus), "start": t0 + iv.start_s,
                           "end": max(server_now, t0 + iv.end_s) if running else t0 + iv.end_s,
                           "complete": iv.complete, "running": running})
    if rec.get("spec"):
        try:
            rec["spec"] = json.loads(rec["spec"])
        except ValueError:
            pass
    # one type per kind of value, as `makespan status` gives it (attempts the attempts made;
    # the hash's own count, the reclaimed ones, as reclaimed_attempts)
    return {"job": job_id, "record": typed_waiting_record(rec), "phases": phases, "events": evs, "result": result,
            "now": server_now}
