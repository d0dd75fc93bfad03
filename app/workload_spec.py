"""Workload specs: the step and workload models, their validation against a fleet, and loading.

:class:`StepSpec` (one step: endpoint, work, dependencies) and :class:`WorkloadSpec`
(name, priority, retry budget, steps) are frozen pydantic models that reject unknown keys;
:func:`parse_workload` checks a mapping against a fleet (unknown endpoint or step
reference, a duplicate step, an endpoint that can never fit, a cycle named by
:func:`find_cycle`) and :func:`load_workload` reads a YAML or JSON file
(docs/workloads.md shows the format). Every error is :class:`makespan.errors.ValidationError`
naming the field. No I/O beyond reading the file; nothing here touches Redis.
"""

from __future__ import annotations

import json
import math
import string
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from makespan.errors import ValidationError
from makespan.models import _NAME, MAX_SERVICE_S, FleetSpec, Priority, _seconds_at_most, read_user_file, validate

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")
_Strict = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class StepSpec(BaseModel):
    """One step of a workload.

    Attributes:
        name: unique within the workload (letters, digits, ``._-``).
        endpoint: endpoint name of the fleet.
        depends_on: names of steps that must complete before this one starts (a repeated
            name counts once).
        requests: number of model requests (request-level execution), or None.
        prompt: template formatted per request with ``{i}`` (request index) and ``{step}``.
        route: OpenAI route: /v1/completions, /v1/chat/completions or /v1/embeddings.
        max_tokens: per-request ``max_tokens``.
        request_s: estimated seconds per request (planning estimate when service_s is absent).
        request_timeout_s: per-request HTTP timeout, s.
        service_s: estimated service time, s (at most MAX_SERVICE_S, 30 days, as a job's);
            derived as ⌈requests / slots⌉ × request_s when absent (and held to the same bound).
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
    service_s: float | None = None

    @field_validator("requests", "max_tokens", "request_s", "request_timeout_s", "service_s", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):  # pydantic would read true as 1 (YAML's yes/no/on/off are booleans too)
            raise ValueError("must be a number, not a boolean")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("step names use letters, digits, '.', '_' and '-' (at most 64)")
        return v

    @field_validator("service_s")
    @classmethod
    def _service(cls, v: float | None) -> float | None:
        return _seconds_at_most(v, MAX_SERVICE_S)

    @field_validator("depends_on")
    @classmethod
    def _deps(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v))  # a repeated name is one dependency

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
        try:  # as the execute phase formats it: a bad format spec or conversion fails here, not on the GPUs
            v.format(i=0, step="step")
        except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
            raise ValueError(f"prompt template does not format: {type(e).__name__}: {e}") from None
        return v

    @model_validator(mode="after")
    def _work(self) -> StepSpec:
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
    name: str = Field(default="workload", min_length=1, max_length=200)
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
        order = {s.name: i for i, s in enumerate(self.steps)}
        waiting = {s.name: len(set(s.depends_on)) for s in self.steps}
        dependants: dict[str, list[str]] = {s.name: [] for s in self.steps}
        for s in self.steps:
            for d in set(s.depends_on):
                dependants[d].append(s.name)
        out: list[str] = []
        ready = [s.name for s in self.steps if not waiting[s.name]]
        while ready:  # one layer at a time, in declaration order (O(steps + edges))
            out += ready
            nxt = []
            for n in ready:
                for m in dependants[n]:
                    waiting[m] -= 1
                    if not waiting[m]:
                        nxt.append(m)
            ready = sorted(nxt, key=order.__getitem__)
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
        estimated_s = s.estimated_service_s(fleet.endpoints[s.endpoint].slots)
        if estimated_s > MAX_SERVICE_S:
            raise ValidationError(f"workload.steps.{i}.requests", s.requests,
                                  f"⌈requests / slots⌉ × request_s = {estimated_s:.0f} s, more than "
                                  f"{MAX_SERVICE_S:.0f} s (30 days): split it into smaller steps")
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
        ValidationError: a file that cannot be read (missing, a folder, not UTF-8:
            :func:`makespan.models.read_user_file`), unparsable, or an invalid workload
            (the error names the file as its ``source``).
    """
    p = Path(path)
    text = read_user_file(p, "workload file")
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError / RecursionError
        kind = "YAML" if p.suffix.lower() in (".yaml", ".yml") else "JSON"
        read_as = "" if p.suffix.lower() in (".yaml", ".yml", ".json") else (
            " (a file not named .yaml, .yml or .json is read as JSON)")
        raise ValidationError("workload file", str(p), f"not valid {kind}{read_as}: {e}") from e
    try:
        return parse_workload(data, fleet)
    except ValidationError as e:
        raise e.in_file(p) from None
