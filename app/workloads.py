"""Multi-step workloads: DAGs of steps across endpoints (design notes, "workload").

A workload is a set of named steps; each step names its endpoint, its work (``requests``
model requests built from a ``prompt`` template, or an estimated ``service_s``) and the
steps it depends on. Build one in Python::

    wl = Workload("synth", priority="HIGH", retry_budget=1)
    gen = wl.step("generate", endpoint="chat", requests=64, prompt="Write item {i}")
    judge = wl.step("judge", endpoint="judge", requests=64, prompt="Judge item {i}")
    emb = wl.step("embed", endpoint="embed", requests=64, prompt="item {i}")
    chain(gen, group(judge, emb))          # generate → {judge, embed}

or load it from YAML/JSON (:func:`load_workload`, docs/workloads.md shows the format)
and submit with :func:`submit_workload` (``makespan submit-workload FILE``).

Validation happens completely before anything is written: unknown keys, an unknown
endpoint or step reference, a duplicate step, a prompt template that does not format,
and a cycle (named, e.g. ``a -> b -> c -> a``) are :class:`makespan.errors.ValidationError`.
The write is one Lua script: every step's job record, its queue entry, the workload
record and the submitted events, or nothing.

Redis (see :mod:`makespan.keys`): ``P:workload:{id}`` hash (name, priority, state,
retry_budget, steps = JSON {step: job id}, deps = JSON {step: [steps]}, times),
``P:workloads`` zset (all, by submission time) and ``P:workloads:active`` set (what
the planner advances, :func:`advance_workloads`).

This module holds the submit script, :func:`submit_workload` and :func:`workload_status`,
and re-exports the rest of the workload API from where it lives:
:mod:`makespan.workload_spec` (``StepSpec``, ``WorkloadSpec``, ``parse_workload``,
``load_workload``, ``find_cycle``), :mod:`makespan.workload_builder` (``Workload``, ``chain``,
``group``) and :mod:`makespan.workload_execution` (``advance_workloads``, ``cancel_workload``,
``cancel_workload_outcome``, ``retry_pending``, ``TERMINAL``). Import any of them from here.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import redis

from makespan import pools, telemetry
from makespan.errors import NotFoundError, StoreError, SubmitOutcomeUnknown, ValidationError
from makespan.events import add_utc_times
from makespan.keys import Keys
from makespan.models import FleetSpec
from makespan.redis_conn import sent_without_reply
from makespan.settings import Settings
from makespan.store import JobState, JobStore
from makespan.workload_builder import Chain, Group, StepRef, Workload, chain, group
from makespan.workload_execution import (TERMINAL, advance_workloads, cancel_workload, cancel_workload_outcome,
                                         retry_pending)
from makespan.workload_spec import ROUTES, StepSpec, WorkloadSpec, find_cycle, load_workload, parse_workload

__all__ = ["ROUTES", "TERMINAL", "Chain", "Group", "StepRef", "StepSpec", "Workload", "WorkloadSpec",
           "advance_workloads", "cancel_workload", "cancel_workload_outcome", "chain", "find_cycle", "group",
           "load_workload", "parse_workload", "retry_pending", "submit_workload", "workload_status"]


# -- submit ----------------------------------------------------------------------------
def submit_workload(r: redis.Redis, keys: Keys, fleet: FleetSpec, workload: WorkloadSpec | dict[str, Any] | Workload,
                    settings: Settings | None = None) -> str:
    """Validate ``workload`` completely, then enqueue all its steps atomically.

    Returns:
        the workload id (hex).
    Raises:
        ValidationError: invalid workload (nothing was written).
        StoreError: Redis failed (an outage writes nothing: the script runs whole or not at
            all; a StoreBug keeps what it wrote before it, docs/operations.md), or
            fewer than ``settings.submit_wait_replicas`` replicas acknowledged the write within
            ``settings.submit_wait_timeout_s`` (written on the primary, not yet known safe; the
            message names the workload).
    """
    settings = settings or Settings()
    if isinstance(workload, Workload):
        workload = workload.to_dict()
    wl = parse_workload(workload, fleet)
    wid = uuid.uuid4().hex
    ids = {s.name: uuid.uuid4().hex for s in wl.steps}
    now = time.time()
    steps: list[tuple[str, dict[str, Any], str]] = []
    templates: dict[str, dict[str, Any]] = {}
    by_name = wl.by_name()
    workload_tp = telemetry.job_traceparent()  # one trace per workload: each step's makespan span in it
    for name in wl.topo_order():
        s = by_name[name]
        ep = fleet.endpoints[s.endpoint]
        svc = s.estimated_service_s(ep.slots)
        spec = {"endpoint": s.endpoint, "priority": wl.priority.name, "service_s": svc, "payload": s.payload(),
                "idempotency_key": None, "deadline_s": None, "workload_id": wid, "step": s.name,
                "depends_on": [ids[d] for d in s.depends_on]}
        size = len(json.dumps(spec["payload"]).encode())
        if size > settings.max_payload_bytes:
            raise ValidationError(f"workload.steps.{name}.prompt", f"{size} bytes",
                                  f"payload larger than the limit of {settings.max_payload_bytes} bytes "
                                  f"(MAKESPAN_MAX_PAYLOAD_BYTES, where you submit, raises it)")
        fields = {"id": ids[name], "state": JobState.QUEUED.value, "endpoint": s.endpoint, "priority": wl.priority.name,
                  "service_s": repr(svc), "submitted_at": repr(now), "attempts": 0, "tp": ep.tensor_parallel,
                  "spec": json.dumps(spec), "workload_id": wid, "step": name, "retries": 0}
        if s.depends_on:
            fields["deps"] = json.dumps([ids[d] for d in s.depends_on])
        if workload_tp:
            fields["traceparent"] = telemetry.sibling_traceparent(workload_tp)
        pool = pools.route(r, keys, fleet, s.endpoint, wl.priority)  # None: the fleet has no pools
        if pool is not None:
            fields["pool"] = pool
        ev = json.dumps({"ts": now, "kind": "submitted", "job": ids[name], "endpoint": s.endpoint,
                         "priority": wl.priority.name, "planned_s": svc, "workload": wid, "step": name})
        steps.append((ids[name], fields, ev))
        templates[name] = fields
    wfields = {"id": wid, "name": wl.name, "priority": wl.priority.name, "state": "running",
               "retry_budget": wl.retry_budget, "submitted_at": repr(now), "steps": json.dumps(ids),
               "deps": json.dumps({s.name: list(s.depends_on) for s in wl.steps}), "spec": wl.model_dump_json(),
               "history": json.dumps({n: [j] for n, j in ids.items()}),
               **{f"job:{j}": n for n, j in ids.items()},
               **{f"tmpl:{n}": json.dumps({k: v for k, v in f.items() if k not in ("id", "deps")})
                  for n, f in templates.items()}}
    want = settings.submit_wait_replicas
    try:
        ok, acked = JobStore(r, keys, settings.events_max_len).submit_workload(
            wid, wfields, now, steps, want, max(1, int(settings.submit_wait_timeout_s * 1000)))
    except StoreError as e:
        if not sent_without_reply(e):
            raise
        raise SubmitOutcomeUnknown(wid, f"submit of workload {wid}: Redis did not answer ({e.__cause__}): the "
                                        f"workload may or may not be written; look it up (`makespan workload-status "
                                        f"{wid}`) before submitting it again (a second submit runs every step "
                                        "twice)") from e
    if not ok:  # pragma: no cover - uuid4 collision
        raise StoreError("submit workload: a job id already exists")
    if acked < want:
        raise StoreError(f"submit of workload {wid}: only {acked} of {want} replica(s) acknowledged it within "
                         f"{settings.submit_wait_timeout_s} s (MAKESPAN_SUBMIT_WAIT_REPLICAS); it is written on the "
                         "primary but may be lost if the primary fails now; unless lost or cancelled (makespan "
                         f"cancel-workload {wid}) it will still run: check makespan workload-status {wid} before "
                         "submitting it again (a workload has no idempotency key: a second submit runs it twice)")
    return wid


WORKLOAD_TIME_FIELDS = ("submitted_at", "finished_at", "failed_at")
"""A workload's times in :func:`workload_status`: unix s (float) on the clock of the
process that wrote them, or None while not reached (``failed_at`` is set when a step
fails beyond the retry budget; ``finished_at`` when every step is final)."""


def _float_or_none(raw: str | None) -> float | None:
    return float(raw) if raw else None


def workload_status(r: redis.Redis, keys: Keys, workload_id: str) -> dict[str, Any]:
    """A workload's state, with the same JSON type for the same kind of value wherever it
    appears: ``{id: str, name: str, priority: str, state: str (running, completed,
    failed or cancelled), reason: str ("" when none), retry_budget: int, submitted_at,
    finished_at, failed_at: float unix s or None (:data:`WORKLOAD_TIME_FIELDS`), deps:
    {step: [steps]}, steps: {step: {job: str, state: str, retries: int, attempts: [job
    ids, the first first], reason: str ("" when none), started_at, finished_at: float
    unix s or None}}}``. Each time also has its ISO-8601 UTC twin, ``{field}_utc``
    (``"2026-12-05T23:52:03.123Z"``, or None), as :meth:`makespan.producer.Producer.status`
    gives a job's.

    Raises:
        NotFoundError: no such workload.
    """
    rec = r.hgetall(keys.workload(workload_id))
    if not rec:
        raise NotFoundError(f"no workload {workload_id!r}")
    ids = json.loads(rec["steps"])
    p = r.pipeline(transaction=False)
    for jid in ids.values():
        p.hmget(keys.job(jid), "state", "reason", "started_at", "finished_at")
    steps = {}
    history = json.loads(rec.get("history") or "{}")
    for (name, jid), row in zip(ids.items(), p.execute()):
        steps[name] = {"job": jid, "state": row[0], "retries": int(rec.get(f"retries:{name}") or 0),
                       "attempts": history.get(name, [jid]), "reason": row[1] or "",
                       "started_at": _float_or_none(row[2]), "finished_at": _float_or_none(row[3])}
        add_utc_times(steps[name], ("started_at", "finished_at"))
    out: dict[str, Any] = {"id": rec.get("id", workload_id), "name": rec.get("name"), "priority": rec.get("priority"),
                           "state": rec.get("state"), "reason": rec.get("reason") or "",
                           "retry_budget": int(rec.get("retry_budget") or 0)}
    for field in WORKLOAD_TIME_FIELDS:
        out[field] = _float_or_none(rec.get(field))
    add_utc_times(out, WORKLOAD_TIME_FIELDS)
    out.update({k: v for k, v in rec.items()  # any other field a later version writes, as stored
                if k not in out and k not in ("steps", "deps", "spec", "history") and ":" not in k})
    out["deps"] = json.loads(rec["deps"])
    out["steps"] = steps
    return out
