"""Turn a live run's recorded events and job records into the report JSON.

Wall timestamps become workload seconds: ``(ts − t0) / time_scale`` with ``t0`` the
first submission, so a live report compares directly with a simulated one.
"""

from __future__ import annotations

from typing import Any

import redis

from makespan.awaited import leaked
from makespan.keys import Keys
from makespan.models import FleetSpec, Priority
from makespan.planner.measures import JobRecord, build_report, lower_bounds
from makespan.planner.model import PlanJob
from makespan.planner.restore import set_point_absence, set_point_groups
from makespan.planner.simulator import fleet_state
from makespan.workers.fleet_view import endpoint_models


def drain_counts(r: redis.Redis, keys: Keys, fleet: FleetSpec) -> dict[str, Any]:
    """Count what a drained fleet must not hold, independently of the planner, and list it
    (``awaited_entries``: reverse-dependency index entries of jobs no longer waiting)."""
    gpu_keys = [k for k, v in zip(fleet.gpu_uuids(), r.mget([keys.gpu(g) for g in fleet.gpu_uuids()])) if v]
    leases = r.zrange(keys.leases, 0, -1)
    agenda = r.zrange(keys.agenda_index, 0, -1)
    agenda_keys = [k for k in r.scan_iter(keys.agenda_pattern, count=1000)
                   if k != keys.agenda_index and not k.endswith(":lock")]
    busy = list(r.scan_iter(keys.busy_pattern, count=1000))
    awaited = leaked(r, keys)
    return {"leases": len(set(leases)) + len(gpu_keys), "agenda_entries": max(len(agenda), len(agenda_keys)),
            "busy_slots": len(busy), "awaited_entries": sum(len(v) for v in awaited.values()),
            "left": {"leases": leases, "leased_gpus": gpu_keys, "agenda": agenda, "busy": busy, "awaited": awaited}}


def records_from_run(events: list[dict[str, Any]], jobs: dict[str, dict[str, str]], time_scale: float,
                     t0: float) -> tuple[list[JobRecord], list[tuple[float, float, tuple[str, ...]]]]:
    """JobRecords (workload seconds from ``t0``) and restore intervals of one run."""
    def w(ts: float) -> float:
        return (ts - t0) / time_scale

    by_lease: dict[str, dict[str, Any]] = {}
    restores = []
    for e in events:
        lid = e.get("lease")
        if not lid:
            continue
        L = by_lease.setdefault(lid, {})
        k = e["kind"]
        if k in ("leased", "restore_start"):
            L["start"] = e["ts"]
            L["gpus"] = tuple(e.get("gpus") or ())
            if k == "restore_start":
                L["restore"] = True
        elif k == "phase_start" and e.get("phase") == "execute":
            L["svc"] = e["ts"]
        elif k == "phase_end" and e.get("phase") == "execute":
            L["end"] = e["ts"]
        elif k == "phase_end" and e.get("phase") == "start_endpoint":
            L["load"] = e.get("transition") or ("cold_start" if (e.get("planned_s") or 0) > 0 else "warm")
        elif k == "phase_end" and e.get("phase") == "evict":
            L["evicts"] = tuple(e.get("evicted") or ())
            L["sleeps"] = tuple(e.get("slept") or ())
            levels = e.get("slept_levels") or {}
            L["sleep_levels"] = tuple(int(levels[s]) for s in L["sleeps"]) if set(L["sleeps"]) <= set(levels) else ()
            L["evict_s"] = float(e.get("planned_s") or 0.0)
        elif k in ("restore_end",):
            L["end"] = e["ts"]
    for L in by_lease.values():
        if L.get("restore") and "end" in L:
            restores.append((w(L["start"]), w(L["end"]), L.get("gpus", ())))
    out = []
    for jid, rec in jobs.items():
        if rec.get("state") not in ("completed", "failed"):
            continue
        prio = Priority[rec["priority"]]
        sub = w(float(rec["submitted_at"]))
        L = by_lease.get(rec.get("lease", ""), {})
        fin = w(float(rec.get("finished_at") or rec["submitted_at"]))
        start = w(L["start"]) if "start" in L else fin
        svc = w(L["svc"]) if "svc" in L else start
        end = w(L["end"]) if "end" in L else fin
        out.append(JobRecord(jid, rec["endpoint"], int(prio), float(prio.weight), sub, start, max(svc, start),
                             max(end, svc), tuple(L.get("gpus", ())), L.get("load", "warm"),
                             L.get("evicts", ()), L.get("evict_s", 0.0),
                             "completed" if rec["state"] == "completed" else "failed", L.get("sleeps", ()),
                             L.get("sleep_levels", ())))
    return out, restores


def residency_from_run(events: list[dict[str, Any]], time_scale: float,
                       t0: float) -> dict[str, list[tuple[float, str | None]]]:
    """Per-GPU residency changes of one live run, in workload seconds from ``t0``, as
    :func:`makespan.planner.restore.set_point_absence` takes them: nothing ready from a lease's
    start when it evicts or loads (an ``evict`` phase that evicted something, a
    ``start_endpoint`` phase that cold-started or woke, ``planned_s`` > 0, or a restore),
    its endpoint from the end of that load (``start_endpoint``'s end, ``restore_end``).
    A lease cut during its load leaves the GPUs empty (no endpoint ready)."""
    def w(ts: float) -> float:
        return (ts - t0) / time_scale

    start: dict[str, float] = {}
    gpus: dict[str, tuple[str, ...]] = {}
    restore_ep: dict[str, str] = {}
    out: dict[str, list[tuple[float, str | None]]] = {}

    def change(lid: str, ts: float, ep: str | None) -> None:
        for u in gpus.get(lid, ()):
            out.setdefault(u, []).append((w(ts), ep))

    for e in sorted(events, key=lambda e: e["ts"]):
        lid, k = e.get("lease"), e["kind"]
        if not lid:
            continue
        if k in ("leased", "restore_start"):
            start[lid], gpus[lid] = e["ts"], tuple(e.get("gpus") or ())
            if k == "restore_start":
                restore_ep[lid] = e.get("endpoint", "")
                change(lid, e["ts"], None)
        elif k == "phase_end" and e.get("phase") == "evict" and e.get("evicted") and lid in start:
            change(lid, start[lid], None)
        elif k == "phase_end" and e.get("phase") == "start_endpoint" and (e.get("planned_s") or 0) > 0:
            if lid in start:
                change(lid, start[lid], None)
                change(lid, e["ts"], e.get("endpoint"))
        elif k == "restore_end" and lid in restore_ep:  # a failed restore leaves nothing resident
            change(lid, e["ts"], restore_ep[lid] if e.get("outcome", "completed") == "completed" else None)
    for changes in out.values():
        changes.sort(key=lambda x: x[0])
    return out


def live_report(r: redis.Redis, keys: Keys, fleet: FleetSpec, events: list[dict[str, Any]], job_ids: list[str],
                time_scale: float, policy: str, rejected: int = 0) -> dict[str, Any]:
    """The design notes' report for one live run (see :func:`makespan.planner.measures.build_report`)."""
    p = r.pipeline(transaction=False)
    for j in job_ids:
        p.hgetall(keys.job(j))
    jobs = {j: rec for j, rec in zip(job_ids, p.execute()) if rec}
    t0 = min(float(rec["submitted_at"]) for rec in jobs.values()) if jobs else 0.0
    records, restores = records_from_run(events, jobs, time_scale, t0)
    solve = [float(x.split(":")[0]) for x in r.lrange(keys.planner_solve_times, 0, -1)]
    drain = drain_counts(r, keys, fleet)
    eps = endpoint_models(fleet)
    pj = [PlanJob(rec["id"], rec["endpoint"], float(Priority[rec["priority"]].weight),
                  (float(rec["submitted_at"]) - t0) / time_scale, float(rec["service_s"]))
          for rec in jobs.values()]
    lb = lower_bounds(pj, eps, fleet.gpu_count(), resident=set(fleet.set_point_by_gpu().values()))
    eligible = {}
    for name, e in fleet.endpoints.items():
        eligible[name] = [g.uuid for h in fleet.hosts for g in h.gpus
                          if g.memory_mib >= e.memory_mib_per_gpu and len(h.gpus) >= e.tensor_parallel]
    rep = build_report(records, policy=policy, gpus=fleet.gpu_count(), submitted=len(job_ids), rejected=rejected,
                       preempted=sum(1 for e in events if e["kind"] == "preempted"), restores=restores,
                       drain={k: drain[k] for k in ("leases", "agenda_entries", "busy_slots", "awaited_entries")},
                       solve_times_s=solve, lower_bound_makespan_s=lb["makespan_s"],
                       lower_bound_weighted_s=lb["weighted_completion_s"], gpu_ids=fleet.gpu_uuids(),
                       eligible=eligible)
    state = fleet_state(fleet)
    end_s = max([*(x.end_s for x in records), *(b for _, b, _ in restores)], default=0.0)
    rep["set_point_absent_gpu_s"] = set_point_absence(residency_from_run(events, time_scale, t0),
                                                      set_point_groups(state), state.resident, 0.0, end_s)
    rep["jobs"]["cancelled"] = sum(1 for rec in jobs.values() if rec.get("state") == "cancelled")
    rep["time_scale"] = time_scale
    rep["drain_left"] = drain["left"]
    rep["estimate_error"] = estimate_errors(events)
    rep["transition_error"] = transition_errors(events)
    rep["transitions"].update(executed_transition_counts(events))
    # prewarms (issue 20 point 5) run as restore leases: counted apart, their GPU-s stay in
    ended = {e.get("lease") for e in events if e.get("kind") == "restore_end"}
    prewarms = sum(1 for e in events if e.get("kind") == "restore_start" and e.get("prewarm") and e.get("lease") in ended)
    rep["transitions"]["restore"] -= prewarms
    rep["transitions"]["prewarm"] = prewarms
    rep["transitions"]["wake_failed"] = sum(1 for e in events if e.get("kind") == "phase_end" and e.get("wake_failed"))
    rep["transitions"]["sleep_failed"] = sum(1 for e in events if e.get("kind") == "phase_end" and e.get("sleep_failed"))
    # deadlines (job.deadline_s: workload s after its submission), as the simulator reports them
    due = {job_id: x.submit_s + float(jobs[job_id]["deadline_s"]) for x in records
           if (job_id := x.id) in jobs and jobs[job_id].get("deadline_s")}
    late = [x.weight * (x.end_s - due[x.id]) for x in records if x.id in due and x.end_s > due[x.id]]
    rep["weighted_tardiness_s"], rep["tardy_jobs"], rep["jobs_with_deadline"] = sum(late), len(late), len(due)
    return rep


def executed_transition_counts(events: list[dict[str, Any]]) -> dict[str, int]:
    """Every transition the run executed, from the ``transitions`` lists of its phases'
    ``phase_end`` events: every attempt of a job (a preempted or retried one too) and
    restore leases included, as :func:`transition_errors` and ``makespan report`` count.

    Returns ``{"evict", "sleep", "sleep_level1", "sleep_level2", "cold_start", "wake"}``:
    ``evict`` every endpoint displaced (stopped or put to sleep), ``sleep`` those put to
    sleep, split by the level of the evict phase's ``slept_levels``, ``cold_start`` and
    ``wake`` the endpoint loads of that kind (``wake_level2`` ones counted as wakes; a restore lease's cold start is its kind
    ``restore``, counted in ``transitions.restore``; a wake it does is a ``wake``).
    """
    out = {"evict": 0, "sleep": 0, "sleep_level1": 0, "sleep_level2": 0, "cold_start": 0, "wake": 0}
    for e in events:
        if e.get("kind") != "phase_end":
            continue
        for t in e.get("transitions") or ():
            kind = t.get("kind")
            if kind in ("evict", "sleep"):
                out["evict"] += 1
            if kind in ("sleep", "cold_start", "wake"):
                out[kind] += 1
            elif kind == "wake_level2":  # a wake from level 2, timed in its own window
                out["wake"] += 1
        if e.get("phase") == "evict":
            for level in (e.get("slept_levels") or {}).values():
                if f"sleep_level{level}" in out:
                    out[f"sleep_level{level}"] += 1
    return out


def transition_errors(events: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Planned vs actual duration of executed transitions, per kind (evict, sleep, wake,
    cold_start, restore): ``{kind: {"n", "p50", "p90", "planned_s_p50", "actual_s_p50"}}``
    with the error |actual − planned| ÷ actual, from the ``transitions`` lists of the
    phases' ``phase_end`` events (workload seconds; planned: the learned figure, or the
    fleet file's until learned)."""
    by_kind: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("kind") == "phase_end":
            for t in e.get("transitions") or ():
                actual = float(t.get("actual_s") or 0.0)
                if actual > 0:
                    by_kind.setdefault(t["kind"], []).append((float(t.get("planned_s") or 0.0), actual))
    out = {}
    for kind, pairs in sorted(by_kind.items()):
        errs = sorted(abs(a - p) / a for p, a in pairs)
        def q(xs: list[float], frac: float) -> float:
            xs = sorted(xs)
            return round(xs[min(len(xs) - 1, int(frac * len(xs)))], 4)
        out[kind] = {"n": len(pairs), "p50": q(errs, 0.5), "p90": q(errs, 0.9),
                     "planned_s_p50": q([p for p, _ in pairs], 0.5), "actual_s_p50": q([a for _, a in pairs], 0.5)}
    return out


def estimate_errors(events: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Planned vs actual execute time of workload-function runs, per workload: ``{name:
    {"runs", "p50", "p90"}}`` of |actual − planned| ÷ actual, from the execute phases'
    ``phase_end`` events (``planned_s``: the job's service_s, learned or given;
    ``execute_s``: measured, workload seconds). Same quantile rule as the waits."""
    by_workload: dict[str, list[float]] = {}
    for e in events:
        if e.get("kind") == "phase_end" and e.get("phase") == "execute" and e.get("workload"):
            actual = float(e.get("execute_s") or 0.0)
            if actual > 0:
                by_workload.setdefault(e["workload"], []).append(abs(actual - float(e.get("planned_s") or 0.0)) / actual)
    out = {}
    for name, errs in sorted(by_workload.items()):
        errs.sort()
        def q(frac: float, errs: list[float] = errs) -> float:
            return round(errs[min(len(errs) - 1, int(frac * len(errs)))], 4)
        out[name] = {"runs": len(errs), "p50": q(0.5), "p90": q(0.9)}
    return out
