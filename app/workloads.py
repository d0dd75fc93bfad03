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
and a cycle (named, e.g. ``a -> b -> c -> a``) are :class:`app.errors.ValidationError`.
The write is one Lua script: every step's job record, its queue entry, the workload
record and the submitted events, or nothing.

Redis (see :mod:`app.keys`): ``P:workload:{id}`` hash (name, priority, state,
retry_budget, steps = JSON {step: job id}, deps = JSON {step: [steps]}, times),
``P:workloads`` zset (all, by submission time) and ``P:workloads:active`` set (what
the planner advances, :func:`advance_workloads`).
"""

from __future__ import annotations

import json
import math
import string
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.awaited import ADD_LUA, DROP_LUA
from app.errors import NotFoundError, StoreError, ValidationError
from app.keys import Keys
from app.models import _NAME, FleetSpec, Priority, validate
from app.settings import Settings

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")
_Strict = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class StepSpec(BaseModel):
    """One step of a workload.

    Attributes:
        name: unique within the workload (letters, digits, ``._-``).
        endpoint: endpoint name of the fleet.
        depends_on: names of steps that must complete before this one starts.
        requests: number of model requests (request-level execution), or None.
        prompt: template formatted per request with ``{i}`` (request index) and ``{step}``.
        route: OpenAI route: /v1/completions, /v1/chat/completions or /v1/embeddings.
        max_tokens: per-request ``max_tokens``.
        request_s: estimated seconds per request (planning estimate when service_s is absent).
        request_timeout_s: per-request HTTP timeout, s.
        service_s: estimated service time, s; derived as ⌈requests / slots⌉ × request_s
            when absent.
    """

    model_config = _Strict
    name: str
    endpoint: str
    depends_on: tuple[str, ...] = ()
    requests: int | None = Field(default=None, ge=1, le=1_000_000)
    prompt: str = "request {i} of step {step}"
    route: str = "/v1/completions"
    max_tokens: int = Field(default=16, ge=1, le=1_000_000)
    request_s: float = Field(default=1.0, gt=0, le=86_400)
    request_timeout_s: float = Field(default=60.0, gt=0, le=86_400)
    service_s: float | None = Field(default=None, gt=0, le=10_000_000)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("step names use letters, digits, '.', '_' and '-' (at most 64)")
        return v

    @field_validator("route")
    @classmethod
    def _route(cls, v: str) -> str:
        if v not in ROUTES:
            raise ValueError(f"unknown route; use one of {', '.join(ROUTES)}")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str) -> str:
        for _lit, field, _spec, _conv in string.Formatter().parse(v):
            if field is not None and field not in ("i", "step"):
                raise ValueError(f"prompt template field {{{field}}} is unknown; use {{i}} and {{step}}")
        return v

    @model_validator(mode="after")
    def _work(self) -> "StepSpec":
        if self.requests is None and self.service_s is None:
            raise ValueError("a step needs requests or service_s")
        return self

    def estimated_service_s(self, slots: int) -> float:
        """Planning estimate, s: ``service_s`` or ⌈requests / slots⌉ × request_s."""
        if self.service_s is not None:
            return self.service_s
        return math.ceil((self.requests or 1) / max(slots, 1)) * self.request_s

    def payload(self) -> dict[str, Any]:
        """The job payload the execute phase reads (empty for a service-time step)."""
        if self.requests is None:
            return {}
        return {"requests": self.requests, "prompt": self.prompt, "route": self.route,
                "max_tokens": self.max_tokens, "request_timeout_s": self.request_timeout_s, "step": self.name}


class WorkloadSpec(BaseModel):
    """A DAG of steps submitted together.

    Attributes:
        name: workload name; priority: CRITICAL..LOW (every step's priority);
        retry_budget: times each failed step is queued again before the workload fails.
        steps: the steps, in any order.
    """

    model_config = _Strict
    name: str = "workload"
    priority: Priority = Priority.NORMAL
    retry_budget: int = Field(default=0, ge=0, le=100)
    steps: tuple[StepSpec, ...] = Field(min_length=1, max_length=10_000)

    @field_validator("priority", mode="before")
    @classmethod
    def _prio(cls, v: Any) -> Priority:
        try:
            return Priority.parse(v)
        except ValidationError as e:
            raise ValueError(e.reason) from None

    def by_name(self) -> dict[str, StepSpec]:
        return {s.name: s for s in self.steps}

    def topo_order(self) -> list[str]:
        """Step names, every step after its dependencies (Kahn; ties by declaration)."""
        deps = {s.name: set(s.depends_on) for s in self.steps}
        out: list[str] = []
        while deps:
            ready = [n for n, d in deps.items() if not d]
            for n in ready:
                out.append(n)
                del deps[n]
            for d in deps.values():
                d.difference_update(ready)
        return out


def find_cycle(deps: dict[str, Iterable[str]]) -> list[str] | None:
    """A cycle of the dependency graph as ``[a, b, ..., a]`` (a depends on b ...), or None.

    Iterative DFS with white/grey/black colouring (CLRS §22.3)."""
    colour: dict[str, int] = {}
    for root in deps:
        if colour.get(root):
            continue
        stack: list[tuple[str, Any]] = [(root, iter(deps.get(root, ())))]
        path = [root]
        colour[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not colour.get(nxt) and nxt in deps:
                colour[nxt] = 1
                stack.append((nxt, iter(deps.get(nxt, ()))))
                path.append(nxt)
    return None


def parse_workload(data: dict[str, Any] | WorkloadSpec, fleet: FleetSpec) -> WorkloadSpec:
    """Validate a workload mapping against a fleet.

    Raises:
        ValidationError: naming the field (``workload.steps.2.endpoint``, ...) and value:
            unknown keys, unknown endpoint, unknown or duplicate step, a cycle.
    """
    wl = validate(WorkloadSpec, data, "workload")
    names: set[str] = set()
    for i, s in enumerate(wl.steps):
        if s.name in names:
            raise ValidationError(f"workload.steps.{i}.name", s.name, "duplicate step name")
        names.add(s.name)
    for i, s in enumerate(wl.steps):
        if s.endpoint not in fleet.endpoints:
            raise ValidationError(f"workload.steps.{i}.endpoint", s.endpoint,
                                  f"unknown endpoint; known: {', '.join(sorted(fleet.endpoints))}")
        ok, why = fleet.can_ever_fit(s.endpoint)
        if not ok:
            raise ValidationError(f"workload.steps.{i}.endpoint", s.endpoint, why)
        for d in s.depends_on:
            if d not in names:
                raise ValidationError(f"workload.steps.{i}.depends_on", d, f"unknown step (in step {s.name!r})")
            if d == s.name:
                raise ValidationError(f"workload.steps.{i}.depends_on", d, f"cycle: {d} -> {d}")
    cyc = find_cycle({s.name: s.depends_on for s in wl.steps})
    if cyc:
        raise ValidationError("workload.steps", " -> ".join(cyc), "cycle: " + " -> ".join(cyc))
    return wl


def load_workload(path: str | Path, fleet: FleetSpec) -> WorkloadSpec:
    """Read a YAML (``.yaml``/``.yml``) or JSON workload file and validate it.

    Raises:
        ValidationError: missing file, unparsable file, or an invalid workload.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError as e:
        raise ValidationError("workload file", str(p), "no such file") from e
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError
        raise ValidationError("workload file", str(p), f"not valid {p.suffix.lstrip('.') or 'JSON'}: {e}") from e
    return parse_workload(data, fleet)


# -- builder -------------------------------------------------------------------------
class StepRef:
    """A step of a :class:`Workload` under construction (returned by ``Workload.step``)."""

    def __init__(self, wl: "Workload", name: str):
        self.wl, self.name = wl, name

    def heads(self) -> list["StepRef"]:
        return [self]

    def tails(self) -> list["StepRef"]:
        return [self]

    def after(self, *others: "StepRef | Group") -> "StepRef":
        """Make this step depend on ``others`` (every tail of a group or chain). Returns self."""
        for o in others:
            for t in o.tails():
                self.wl._deps[self.name].append(t.name)
        return self

    def __repr__(self) -> str:
        return f"StepRef({self.name!r})"


class Group:
    """Steps (or chains) that run in parallel, as Celery canvas ``group``."""

    def __init__(self, *members: "StepRef | Group"):
        self.members = members

    def heads(self) -> list[StepRef]:
        return [h for m in self.members for h in m.heads()]

    def tails(self) -> list[StepRef]:
        return [t for m in self.members for t in m.tails()]


class Chain(Group):
    """A sequence, as Celery canvas ``chain``: its heads are the first item's, its tails the last's."""

    def heads(self) -> list[StepRef]:
        return self.members[0].heads() if self.members else []

    def tails(self) -> list[StepRef]:
        return self.members[-1].tails() if self.members else []


def group(*members: StepRef | Group) -> Group:
    """Parallel steps: ``chain(a, group(b, c), d)`` is the diamond a → {b, c} → d."""
    return Group(*members)


def chain(*items: StepRef | Group) -> Chain:
    """Sequence: every head of item k+1 depends on every tail of item k."""
    for prev, nxt in zip(items, items[1:]):
        for h in nxt.heads():
            h.after(prev)
    return Chain(*items)


class Workload:
    """Builder: ``Workload(name, priority, retry_budget)``, ``.step(...)``, ``.spec(fleet)``."""

    def __init__(self, name: str = "workload", priority: Priority | str = Priority.NORMAL, retry_budget: int = 0):
        self.name, self.priority, self.retry_budget = name, priority, retry_budget
        self._steps: dict[str, dict[str, Any]] = {}
        self._deps: dict[str, list[str]] = {}

    def step(self, name: str, endpoint: str, *, after: Iterable[StepRef | Group] = (), **work: Any) -> StepRef:
        """Add a step (``requests=``, ``prompt=``, ``service_s=`` ... as :class:`StepSpec`)."""
        if name in self._steps:
            raise ValidationError("workload.steps.name", name, "duplicate step name")
        self._steps[name] = {"name": name, "endpoint": endpoint, **work}
        self._deps[name] = []
        ref = StepRef(self, name)
        ref.after(*after)
        return ref

    def to_dict(self) -> dict[str, Any]:
        steps = [{**s, "depends_on": list(dict.fromkeys(self._deps[n]))} for n, s in self._steps.items()]
        return {"name": self.name, "priority": Priority.parse(self.priority).name,
                "retry_budget": self.retry_budget, "steps": steps}

    def spec(self, fleet: FleetSpec) -> WorkloadSpec:
        return parse_workload(self.to_dict(), fleet)


# -- submit ----------------------------------------------------------------------------
# KEYS: seq, queue, events, workload, workloads, active ; then one job key per step
# ARGV: n, workload_id, workload fields JSON, now, key prefix, then per step: job_id, fields JSON, event JSON
# A step with deps joins the reverse-dependency index of each (app.awaited).
_SUBMIT_WORKLOAD = ADD_LUA + """
local n = tonumber(ARGV[1])
for i = 1, n do
  if redis.call('EXISTS', KEYS[6 + i]) == 1 then return 0 end
end
local wl = cjson.decode(ARGV[3])
local flat = {}
for k, v in pairs(wl) do table.insert(flat, k); table.insert(flat, tostring(v)) end
redis.call('HSET', KEYS[4], unpack(flat))
redis.call('ZADD', KEYS[5], ARGV[4], ARGV[2])
redis.call('SADD', KEYS[6], ARGV[2])
for i = 1, n do
  local base = 5 + (i - 1) * 3
  local seq = redis.call('INCR', KEYS[1])
  local fields = cjson.decode(ARGV[base + 2])
  local f = {}
  for k, v in pairs(fields) do table.insert(f, k); table.insert(f, tostring(v)) end
  table.insert(f, 'seq'); table.insert(f, tostring(seq))
  redis.call('HSET', KEYS[6 + i], unpack(f))
  awaited_add(ARGV[5], ARGV[base + 1], fields['deps'])
  redis.call('ZADD', KEYS[2], seq, ARGV[base + 1])
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', '1000000', '*', 'e', ARGV[base + 3])
end
return 1
"""


def submit_workload(r: redis.Redis, keys: Keys, fleet: FleetSpec, workload: WorkloadSpec | dict[str, Any] | Workload,
                    settings: Settings | None = None) -> str:
    """Validate ``workload`` completely, then enqueue all its steps atomically.

    Returns:
        the workload id (hex).
    Raises:
        ValidationError: invalid workload (nothing was written).
        StoreError: Redis failed (the script is atomic: nothing or everything written).
    """
    settings = settings or Settings()
    if isinstance(workload, Workload):
        workload = workload.to_dict()
    wl = parse_workload(workload, fleet)
    wid = uuid.uuid4().hex
    ids = {s.name: uuid.uuid4().hex for s in wl.steps}
    now = time.time()
    args: list[str] = []
    job_keys: list[str] = []
    templates: dict[str, dict[str, Any]] = {}
    for name in wl.topo_order():
        s = wl.by_name()[name]
        ep = fleet.endpoints[s.endpoint]
        svc = s.estimated_service_s(ep.slots)
        spec = {"endpoint": s.endpoint, "priority": wl.priority.name, "service_s": svc, "payload": s.payload(),
                "idempotency_key": None, "deadline_s": None, "workload_id": wid, "step": s.name,
                "depends_on": [ids[d] for d in s.depends_on]}
        size = len(json.dumps(spec["payload"]).encode())
        if size > settings.max_payload_bytes:
            raise ValidationError(f"workload.steps.{name}.prompt", f"{size} bytes",
                                  f"payload larger than the limit of {settings.max_payload_bytes} bytes")
        fields = {"id": ids[name], "state": "queued", "endpoint": s.endpoint, "priority": wl.priority.name,
                  "service_s": repr(svc), "submitted_at": repr(now), "attempts": 0, "tp": ep.tensor_parallel,
                  "spec": json.dumps(spec), "workload_id": wid, "step": name, "retries": 0}
        if s.depends_on:
            fields["deps"] = json.dumps([ids[d] for d in s.depends_on])
        ev = json.dumps({"ts": now, "kind": "submitted", "job": ids[name], "endpoint": s.endpoint,
                         "priority": wl.priority.name, "planned_s": svc, "workload": wid, "step": name})
        args += [ids[name], json.dumps(fields), ev]
        templates[name] = fields
        job_keys.append(keys.job(ids[name]))
    wfields = {"id": wid, "name": wl.name, "priority": wl.priority.name, "state": "running",
               "retry_budget": wl.retry_budget, "submitted_at": repr(now), "steps": json.dumps(ids),
               "deps": json.dumps({s.name: list(s.depends_on) for s in wl.steps}), "spec": wl.model_dump_json(),
               "history": json.dumps({n: [j] for n, j in ids.items()}),
               **{f"job:{j}": n for n, j in ids.items()},
               **{f"tmpl:{n}": json.dumps({k: v for k, v in f.items() if k not in ("id", "deps")})
                  for n, f in templates.items()}}
    script = r.register_script(_SUBMIT_WORKLOAD)
    k = [keys.seq, keys.queue(wl.priority), keys.events, keys.workload(wid), keys.workloads, keys.workloads_active,
         *job_keys]
    try:
        ok = script(keys=k, args=[str(len(job_keys)), wid, json.dumps(wfields), repr(now), keys.prefix, *args])
    except redis.RedisError as e:
        raise StoreError(f"submit workload failed: {e}") from e
    if not ok:  # pragma: no cover - uuid4 collision
        raise StoreError("submit workload: a job id already exists")
    return wid


def workload_status(r: redis.Redis, keys: Keys, workload_id: str) -> dict[str, Any]:
    """``{id, name, priority, state, reason, retry_budget, submitted_at, finished_at,
    steps: {step: {job, state, retries, reason, started_at, finished_at}}}``.

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
                       "started_at": float(row[2]) if row[2] else None,
                       "finished_at": float(row[3]) if row[3] else None}
    out = {k: v for k, v in rec.items() if k not in ("steps", "deps", "spec", "history") and ":" not in k}
    out["deps"] = json.loads(rec["deps"])
    out["steps"] = steps
    return out


# -- execution: retries, failure, cancellation, completion ------------------------------
# A failed step is retried as a new job (the failed attempt's record stays as it is,
# for its history and for retention): the workload's step map and every queued
# dependant's deps are pointed at the new id in the same script.
# KEYS: workload, new job, queue, events, seq, finished, then dependant job keys
# ARGV: step, old id, new id, fields JSON, event JSON, key prefix, then per dependant its deps JSON
# The reverse-dependency index (app.awaited) follows: the new job joins it for its deps, a
# queued dependant moves from the old id's set to the new id's.
_RETRY = ADD_LUA + DROP_LUA + """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
local steps = cjson.decode(redis.call('HGET', KEYS[1], 'steps'))
if steps[ARGV[1]] ~= ARGV[2] then return 0 end
steps[ARGV[1]] = ARGV[3]
local hist = cjson.decode(redis.call('HGET', KEYS[1], 'history'))
table.insert(hist[ARGV[1]], ARGV[3])
redis.call('HSET', KEYS[1], 'steps', cjson.encode(steps), 'history', cjson.encode(hist), 'job:' .. ARGV[3], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'retries:' .. ARGV[1], 1)
local seq = redis.call('INCR', KEYS[5])
local fields = cjson.decode(ARGV[4])
local f = {}
for k, v in pairs(fields) do table.insert(f, k); table.insert(f, tostring(v)) end
table.insert(f, 'seq'); table.insert(f, tostring(seq))
redis.call('HSET', KEYS[2], unpack(f))
awaited_add(ARGV[6], ARGV[3], fields['deps'])
redis.call('ZADD', KEYS[3], seq, ARGV[3])
for i = 7, #KEYS do
  if redis.call('HGET', KEYS[i], 'state') == 'queued' then
    local waiter = redis.call('HGET', KEYS[i], 'id')
    awaited_drop(ARGV[6], waiter, redis.call('HGET', KEYS[i], 'deps'))
    redis.call('HSET', KEYS[i], 'deps', ARGV[i])
    awaited_add(ARGV[6], waiter, ARGV[i])
  end
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000000', '*', 'e', ARGV[5])
return 1
"""

# KEYS: workload, active, events, queue, finished index, delayed, then job keys
# ARGV: now, reason, final state, key prefix, then job ids
# Queued steps (and delayed ones: waiting out a retry backoff) are cancelled at once;
# leased/running ones are asked to stop at their next phase boundary (the GPU worker
# then releases their lease). A cancelled step leaves the reverse-dependency index (app.awaited).
_CANCEL_WORKLOAD = DROP_LUA + """
local n = #KEYS - 6
local out = {0, 0}
for i = 1, n do
  local st = redis.call('HGET', KEYS[6 + i], 'state')
  if st == 'queued' or st == 'delayed' then
    redis.call('ZREM', KEYS[4], ARGV[4 + i])
    redis.call('ZREM', KEYS[6], ARGV[4 + i])
    awaited_drop(ARGV[4], ARGV[4 + i], redis.call('HGET', KEYS[6 + i], 'deps'))
    redis.call('HSET', KEYS[6 + i], 'state', 'cancelled', 'finished_at', ARGV[1], 'reason', ARGV[2])
    redis.call('ZADD', KEYS[5], ARGV[1], ARGV[4 + i])
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', '1000000', '*', 'e',
               cjson.encode({ts = tonumber(ARGV[1]), kind = 'cancelled', job = ARGV[4 + i], reason = ARGV[2]}))
    out[1] = out[1] + 1
  elseif st == 'leased' or st == 'running' then
    redis.call('HSET', KEYS[6 + i], 'cancel_requested', '1')
    out[2] = out[2] + 1
  end
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'state', ARGV[3], 'reason', ARGV[2], 'finished_at', ARGV[1])
end
return out
"""

TERMINAL = ("completed", "failed", "cancelled")


def _job_ids(r: redis.Redis, keys: Keys, workload_id: str) -> dict[str, str]:
    raw = r.hget(keys.workload(workload_id), "steps")
    if raw is None:
        raise NotFoundError(f"no workload {workload_id!r}")
    return json.loads(raw)


def cancel_workload(r: redis.Redis, keys: Keys, workload_id: str, reason: str = "workload cancelled") -> dict[str, int]:
    """Cancel a workload: queued (and delayed) steps at once, running steps at their next phase
    boundary (their GPUs are then released). Finished steps keep their results.

    Returns ``{"cancelled": n queued steps, "cancel_requested": n running steps}``.
    Raises NotFoundError: no such workload."""
    ids = _job_ids(r, keys, workload_id)
    prio = r.hget(keys.workload(workload_id), "priority") or "NORMAL"
    if r.hget(keys.workload(workload_id), "state") in TERMINAL:
        return {"cancelled": 0, "cancel_requested": 0}
    return _cancel_steps(r, keys, workload_id, prio, list(ids.values()), reason, "cancelled")


def _cancel_steps(r, keys, wid, prio, job_ids, reason, final_state) -> dict[str, int]:
    script = r.register_script(_CANCEL_WORKLOAD)
    k = [keys.workload(wid), keys.workloads_active, keys.events, keys.queue(prio), f"{keys.prefix}:finished",
         keys.delayed, *[keys.job(j) for j in job_ids]]
    a, b = script(keys=k, args=[repr(time.time()), reason, final_state, keys.prefix, *job_ids])
    if final_state:
        from app import events

        events.record(r, keys.events, "workload_" + final_state, workload=wid, reason=reason)
    return {"cancelled": int(a), "cancel_requested": int(b)}


def retry_pending(r: redis.Redis, keys: Keys, job_id: str) -> bool:
    """True if ``job_id`` is a failed workload step that was or will be retried (its
    workload is running and the step's retries are within the budget), so its
    dependants must wait rather than be cancelled."""
    wid = r.hget(keys.job(job_id), "workload_id")
    if not wid:
        return False
    wstate, budget, steps, step = r.hmget(keys.workload(wid), "state", "retry_budget", "steps", f"job:{job_id}")
    if wstate != "running" or not step or not steps:
        return False
    if json.loads(steps).get(step) != job_id:
        return True  # already retried under a new job id
    return int(r.hget(keys.workload(wid), f"retries:{step}") or 0) < int(budget or 0)


def _dependants(deps: dict[str, list[str]], roots: set[str]) -> set[str]:
    out, frontier = set(), set(roots)
    while frontier:
        nxt = {s for s, ds in deps.items() if s not in out and frontier.intersection(ds)}
        out |= nxt
        frontier = nxt
    return out


def advance_workloads(r: redis.Redis, keys: Keys) -> dict[str, int]:
    """One planner pass over the active workloads (called from ``form_batch``):

    * a failed step with retries left (``retries < retry_budget``) is queued again;
    * a step failed beyond the budget (or cancelled) fails the workload and cancels
      every step that depends on it, transitively; independent steps go on;
    * a workload whose steps are all final is closed: ``completed`` when all completed.

    Returns counts ``{"retried", "failed", "finished"}``."""
    out = {"retried": 0, "failed": 0, "finished": 0}
    for wid in r.smembers(keys.workloads_active):
        rec = r.hmget(keys.workload(wid), "state", "retry_budget", "steps", "deps", "priority")
        if rec[2] is None:
            r.srem(keys.workloads_active, wid)
            continue
        wstate, budget, ids, deps, prio = rec[0], int(rec[1] or 0), json.loads(rec[2]), json.loads(rec[3]), rec[4]
        p = r.pipeline(transaction=False)
        for jid in ids.values():
            p.hmget(keys.job(jid), "state", "reason")
        p.hgetall(keys.workload(wid))
        *jrows, wrec = p.execute()
        rows = {step: [st, int(wrec.get(f"retries:{step}") or 0), reason]
                for step, (st, reason) in zip(ids, jrows)}
        dead: set[str] = set()
        for step, (st, retries, reason) in rows.items():
            if st == "failed" and wstate == "running" and retries < budget:
                if _retry(r, keys, wid, wrec, step, ids, deps, prio, retries, reason):
                    out["retried"] += 1
                    rows[step] = ["queued", retries + 1, ""]
            elif st in ("failed", "cancelled"):
                dead.add(step)
        if dead and wstate == "running":
            victims = _dependants(deps, dead)
            first = sorted(dead)[0]
            reason = f"step {first} {rows[first][0]} after {rows[first][1]} retries: {rows[first][2]}"
            _cancel_steps(r, keys, wid, prio, [ids[s] for s in sorted(victims)], f"dependency {first} did not complete",
                          "")
            with r.pipeline() as pp:
                pp.hset(keys.workload(wid), mapping={"state": "failed", "reason": reason,
                                                     "failed_at": repr(time.time())})
                from app import events

                events.record(r, keys.events, "workload_failed", pipe=pp, workload=wid, step=first, reason=reason)
                pp.execute()
            out["failed"] += 1
            continue
        if all(row[0] in TERMINAL for row in rows.values()):
            ok = all(row[0] == "completed" for row in rows.values())
            final = wstate if wstate in ("failed", "cancelled") else ("completed" if ok else "failed")
            with r.pipeline() as pp:
                now = time.time()
                pp.hset(keys.workload(wid), mapping={"state": final, "finished_at": repr(now)})
                pp.srem(keys.workloads_active, wid)
                pp.zadd(keys.workloads_done, {wid: now})  # retention deletes it after retention_age_s
                if wstate == "running":
                    from app import events

                    events.record(r, keys.events, "workload_" + final, pipe=pp, workload=wid)
                pp.execute()
            out["finished"] += 1
    return out


def _retry(r, keys, wid, wrec, step, ids, deps, prio, retries, reason) -> bool:
    new_id = uuid.uuid4().hex
    now = time.time()
    fields = {**json.loads(wrec[f"tmpl:{step}"]), "id": new_id, "state": "queued", "submitted_at": repr(now),
              "retries": retries + 1}
    new_ids = {**ids, step: new_id}
    if deps.get(step):
        fields["deps"] = json.dumps([new_ids[d] for d in deps[step]])
    dependants = [s for s, ds in deps.items() if step in ds]
    ev = json.dumps({"ts": now, "kind": "retried", "job": new_id, "previous": ids[step], "workload": wid,
                     "step": step, "retry": retries + 1, "reason": reason})
    k = [keys.workload(wid), keys.job(new_id), keys.queue(prio), keys.events, keys.seq, f"{keys.prefix}:finished",
         *[keys.job(ids[d]) for d in dependants]]
    a = [step, ids[step], new_id, json.dumps(fields), ev, keys.prefix,
         *[json.dumps([new_ids[x] for x in deps[d]]) for d in dependants]]
    return bool(r.register_script(_RETRY)(keys=k, args=a))
