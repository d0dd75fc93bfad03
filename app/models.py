"""Domain model: fleet (hosts, GPUs, endpoints) and jobs, with validation.

Specs are frozen pydantic models that reject unknown keys. :func:`load_fleet` reads a
TOML fleet file (see ``examples/render-pipeline.toml`` and docs/configuration.md).
Every validation failure is raised as :class:`makespan.errors.ValidationError` naming the
field (a dotted path) and the value.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import pydantic
import pydantic_core
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, field_validator, model_validator

from makespan.errors import ValidationError, is_utf8
from makespan.priorities import Priority  # re-exported: its home is the core module makespan.priorities
from makespan.job_states import FINAL_STATES as _FINAL_STATES


# a job in one of these states never changes again: ("completed", "failed", "cancelled"), from makespan.job_states
FINAL_STATES = _FINAL_STATES

MAX_DELAY_S = 30 * 24 * 3600.0  # longest delay_s a job may carry, s
MAX_SERVICE_S = 30 * 24 * 3600.0  # longest service_s a job may carry, workload s: sums of
# near-float-max values overflow to inf in the planner's arithmetic (inf/inf is NaN)
MAX_DEADLINE_S = 365 * 24 * 3600.0  # latest deadline_s a job may carry, workload s after submission:
# the tardiness policies' CP-SAT models take due times as 64-bit integers (9.3e18 and more failed every solve)

_Strict = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


def _not_text_nor_bool(kind: str) -> Callable[[Any], Any]:
    """A before-validator refusing what pydantic's lax mode would read as ``kind``: a
    boolean (``true`` as 1) or text (``"5"`` as 5)."""
    def check(value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"must be {kind}, not a boolean")
        if isinstance(value, str):
            raise ValueError(f"must be {kind}, not text (no quotes)")
        return value
    return check


# the fleet file's numbers and switches as written (a quoted number, a boolean: rejected,
# naming the field); a whole-number float (81920.0) is still a count
Count = Annotated[int, BeforeValidator(_not_text_nor_bool("a whole number"))]
Number = Annotated[float, BeforeValidator(_not_text_nor_bool("a number"))]
Switch = Annotated[bool, Strict()]  # true or false, not 1 or "yes"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def _positive_finite(v: float) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or math.isnan(v) or math.isinf(v) or v <= 0:
        raise ValueError("must be a positive, finite number of seconds")
    return float(v)


def _seconds_at_most(v: float | None, max_s: float) -> float | None:
    """``v`` (None: None) as a positive, finite number of seconds of at most ``max_s``.

    Raises:
        ValueError: another value (pydantic reports it on the field)."""
    if v is None:
        return None
    v = _positive_finite(v)
    if v > max_s:
        raise ValueError(f"must be at most {max_s:.0f} s ({max_s / 86400:.0f} days)")
    return v


def _non_negative_finite(v: float) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or math.isnan(v) or math.isinf(v) or v < 0:
        raise ValueError("must be a non-negative, finite number of seconds")
    return float(v)


class GpuSpec(BaseModel):
    """One GPU, keyed by its UUID (``nvidia-smi -L`` shows it)."""

    model_config = _Strict
    uuid: str = Field(min_length=4, max_length=128)
    memory_mib: Count = Field(gt=0, le=10_000_000)
    index: Count = Field(ge=0, description="CUDA device index on its host")


class HostSpec(BaseModel):
    """A GPU host. Either ``gpus`` (explicit UUIDs) or ``gpu_count`` + ``memory_mib``
    (simulated fleets; UUIDs become ``GPU-{host}-{index}``)."""

    model_config = _Strict
    name: str
    gpus: tuple[GpuSpec, ...] = ()
    gpu_count: int | None = Field(default=None, ge=1, le=64)
    memory_mib: Count | None = Field(default=None, gt=0)
    host_memory_mib: Count | None = Field(default=None, gt=0, description="host RAM sleepers may hold (level 1 "
                                        "keeps weights there), MiB; None: no budget")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("host names use letters, digits, '.', '_' and '-' (at most 64)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any) -> Any:
        n = data.get("gpu_count") if isinstance(data, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 64 and not data.get("gpus"):
            mem = data.get("memory_mib")
            if mem is None:
                raise ValueError("gpu_count needs memory_mib")
            if isinstance(mem, bool) or not isinstance(mem, (int, float)) or not float(mem).is_integer():
                return data  # not a count: reported on the host's own memory_mib, not on GPUs it never listed
            data = dict(data)
            data["gpus"] = [
                {"uuid": f"GPU-{data.get('name')}-{i}", "memory_mib": mem, "index": i}
                for i in range(n)
            ]
        return data

    @property
    def simulated(self) -> bool:
        """A simulated host: ``gpu_count`` made its GPUs (UUIDs ``GPU-{host}-{i}``, which no
        NVML reports; a published fleet carries both fields). Real GPUs listed beside an
        agreeing ``gpu_count`` are not simulated: they are checked against NVML."""
        return self.gpu_count is not None and all(
            g.uuid == f"GPU-{self.name}-{i}" for i, g in enumerate(self.gpus))

    @model_validator(mode="after")
    def _check(self) -> HostSpec:
        if not self.gpus:
            if self.gpu_count is not None:  # given as text or a boolean: _expand took it for no count
                raise ValueError("gpu_count must be a whole number of GPUs (gpu_count = 4, no quotes)")
            raise ValueError("a host needs gpus or gpu_count")
        if self.gpu_count is not None and len(self.gpus) != self.gpu_count:
            raise ValueError(f"gpu_count = {self.gpu_count} but gpus lists {len(self.gpus)}: give gpus for real "
                             "GPUs, or gpu_count alone for simulated ones")
        seen: set[int] = set()
        for g in self.gpus:
            if g.uuid.startswith("MIG-"):
                continue  # MIG instances share their parent GPU's CUDA index (nvidia-smi -L lists them under it)
            if g.index in seen:
                raise ValueError(f"GPU index {g.index} appears twice on host {self.name!r}: each GPU has its own "
                                 "CUDA index (nvidia-smi -L; MIG instances, UUIDs MIG-…, share their GPU's)")
            seen.add(g.index)
        return self


SLEEP_GPU_MEMORY_DEFAULT_MIB = 512  # what a sleeping vLLM instance keeps per GPU (CUDA context, buffers)


class LaunchSpec(BaseModel):
    """How an endpoint instance is started. Only the fleet file sets this: no job
    payload can choose what runs.

    ``driver``: a registered driver (:mod:`makespan.driver_registry`): ``simulated``
    (time-scaled sleep), ``process`` (``command`` is run with ``{port}`` substituted and
    ``CUDA_VISIBLE_DEVICES`` set), ``vllm`` (builds ``vllm serve``) or one a package adds
    through the ``makespan.drivers`` entry points. The fields below are common to every
    driver (one that does not need a field ignores it); any other key is the chosen
    driver's own option, validated against its ``options_model`` (an unknown key is an
    error naming the driver's options); :meth:`driver_options` returns them."""

    model_config = ConfigDict(extra="allow", frozen=True, str_strip_whitespace=True)
    driver: str = "simulated"
    command: tuple[str, ...] = ()
    health_path: str = "/health"
    health_timeout_s: Number = 600.0
    sleep_mode: Switch = False
    gpu_memory_utilization: Number = Field(default=0.9, gt=0, le=1)

    @field_validator("driver")
    @classmethod
    def _driver(cls, v: str) -> str:
        from makespan.driver_registry import DRIVERS  # lazily: the registry loads drivers, which import models

        if v not in DRIVERS:
            raise ValueError(DRIVERS.unknown(v).reason)
        return v

    @model_validator(mode="after")
    def _driver_options(self) -> LaunchSpec:
        if self.model_extra:  # only then is the driver's class needed (models may still be importing)
            self.driver_options()
        return self

    def driver_options(self) -> BaseModel:
        """The chosen driver's own ``launch`` keys, validated against its ``options_model``.

        Raises:
            ValueError: an option the driver does not know, or a bad value.
            ValidationError: the driver cannot be loaded."""
        from makespan.driver_registry import DRIVERS

        return DRIVERS.check_launch_options(self.driver, dict(self.model_extra or {}))


class SetPointGroup(BaseModel):
    """A GPU group of a host where an endpoint instance runs at the set point."""

    model_config = _Strict
    host: str
    gpus: tuple[Count, ...] = Field(min_length=1, description="CUDA indices on that host")


class EndpointSpec(BaseModel):
    """A model server definition (design notes, "endpoint")."""

    model_config = _Strict
    name: str
    model: str
    tensor_parallel: Count = Field(default=1, ge=1, le=64)
    memory_mib_per_gpu: Count = Field(gt=0)
    cold_start_s: Number
    evict_s: Number = 5.0
    wake_s: Number | None = None
    sleep_level: Count = Field(default=1, ge=1, le=2)
    wake_level2_s: Number | None = Field(default=None, gt=0, description="wake time from sleep level 2, s; "
                                        "set (with sleep_level 1): the plan chooses level 1, level 2 or stop")
    sleep_gpu_memory_mib: Count | None = Field(default=None, ge=0, description="GPU memory per GPU a sleeping "
                                             "instance still holds; None: min(512, memory_mib_per_gpu)")
    sleep_host_memory_mib: Count | None = Field(default=None, ge=0, description="host RAM a level-1 sleeper holds; "
                                              "None: its weights, memory_mib_per_gpu × tensor_parallel")
    slots: Count = Field(default=1, ge=1, le=4096)
    set_point: tuple[SetPointGroup, ...] = ()
    launch: LaunchSpec = LaunchSpec()

    @property
    def asleep_gpu_mib(self) -> int:
        """GPU memory per GPU one sleeping instance holds, MiB (0 without a sleep mode)."""
        if self.wake_s is None:
            return 0
        if self.sleep_gpu_memory_mib is not None:
            return min(self.sleep_gpu_memory_mib, self.memory_mib_per_gpu)
        return min(SLEEP_GPU_MEMORY_DEFAULT_MIB, self.memory_mib_per_gpu)

    @property
    def asleep_ram_mib(self) -> int:
        """Host RAM one sleeping instance holds, MiB: level 1 its weights (or
        ``sleep_host_memory_mib``), level 2 none (0 without a sleep mode)."""
        if self.wake_s is None or self.sleep_level == 2:
            return 0
        if self.sleep_host_memory_mib is not None:
            return self.sleep_host_memory_mib
        return self.memory_mib_per_gpu * self.tensor_parallel

    @property
    def sleep_options(self) -> tuple[tuple[int, float, int], ...]:
        """The sleep levels the plan may choose among (``EndpointModel.sleep_options``):
        ``(level, wake_s, host RAM MiB held)``, the configured ``sleep_level`` first, level 2
        too when ``wake_level2_s`` is given; () without a sleep mode."""
        if self.wake_s is None:
            return ()
        first = (self.sleep_level, self.wake_s, self.asleep_ram_mib)
        if self.sleep_level == 1 and self.wake_level2_s is not None:
            return (first, (2, self.wake_level2_s, 0))
        return (first,)

    def sleep_warnings(self) -> list[str]:
        """Sleep settings of this endpoint that have no effect as written (accepted, as an
        older file may hold them): each a line naming the key and what to do."""
        given = self.model_fields_set
        out = []
        if self.wake_s is None:
            inert = sorted(given & {"sleep_level", "wake_level2_s", "sleep_gpu_memory_mib", "sleep_host_memory_mib"})
            if inert:
                out.append(f"endpoints.{self.name}: {', '.join(inert)} without wake_s (its sleep mode, the level-"
                           f"{self.sleep_level} wake time) does nothing: an evicted instance is stopped; set wake_s")
            return out
        if self.sleep_level == 2 and "sleep_host_memory_mib" in given:
            out.append(f"endpoints.{self.name}: sleep_host_memory_mib is the host RAM of a level-1 sleeper; with "
                       "sleep_level = 2 a sleeper holds none: remove it")
        if self.sleep_level == 2 and self.wake_level2_s is not None:
            out.append(f"endpoints.{self.name}: wake_level2_s is used with sleep_level = 1 only (the plan's level-2 "
                       "option); with sleep_level = 2, wake_s is the wake time: remove wake_level2_s")
        if self.sleep_gpu_memory_mib is not None and self.sleep_gpu_memory_mib > self.memory_mib_per_gpu:
            out.append(f"endpoints.{self.name}: sleep_gpu_memory_mib {self.sleep_gpu_memory_mib} is above "
                       f"memory_mib_per_gpu {self.memory_mib_per_gpu}; {self.memory_mib_per_gpu} is used")
        return out

    @model_validator(mode="after")
    def _sleep_levels_of_driver(self) -> EndpointSpec:
        """A sleep mode (``wake_s``), its ``sleep_level`` and a level-2 option
        (``wake_level2_s``) only where the endpoint's driver has those sleep levels
        (``DriverCapabilities.sleep_levels``): the plan chose level 2 for a driver without it,
        and its evicts became stops reported as failed sleeps (a driver author's report)."""
        if self.wake_s is None and self.wake_level2_s is None:
            return self
        from makespan.driver_registry import DRIVERS
        from makespan.errors import MakespanError

        try:
            levels = DRIVERS.capabilities(self.launch.driver).sleep_levels
        except MakespanError:
            return self  # a driver that cannot be loaded is named where it is used
        driver = self.launch.driver
        if not levels:
            raise ValueError(f"driver {driver!r} has no sleep mode (its sleep_levels are empty): remove wake_s "
                             "and wake_level2_s (an evicted instance is stopped)")
        if self.wake_s is not None and self.sleep_level not in levels:
            raise ValueError(f"sleep_level {self.sleep_level}: driver {driver!r} has sleep levels "
                             f"{', '.join(map(str, levels))} only")
        if self.wake_level2_s is not None and 2 not in levels:
            raise ValueError(f"wake_level2_s: driver {driver!r} has no sleep level 2 (sleep levels "
                             f"{', '.join(map(str, levels))}): remove wake_level2_s")
        return self

    @field_validator("cold_start_s")
    @classmethod
    def _cold(cls, v: float) -> float:
        return _positive_finite(v)

    @field_validator("evict_s")
    @classmethod
    def _evict(cls, v: float) -> float:
        return _non_negative_finite(v)

    @field_validator("wake_s")
    @classmethod
    def _wake(cls, v: float | None) -> float | None:
        return None if v is None else _positive_finite(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("endpoint names use letters, digits, '.', '_' and '-' (at most 64)")
        return v


class PoolSpec(BaseModel):
    """A pool (design notes, "pool"): a set of hosts with its own leader-locked planner
    (``makespan planner --pool NAME``) and the endpoints it serves. ``endpoints`` empty:
    every endpoint of the fleet whose gang fits one of the pool's hosts."""

    model_config = _Strict
    name: str
    hosts: tuple[str, ...] = Field(min_length=1)
    endpoints: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("pool names use letters, digits, '.', '_' and '-' (at most 64)")
        return v


class FleetSpec(BaseModel):
    """Hosts, their GPUs and the endpoints that may run on them; optionally split into
    ``pools`` (every host in exactly one; none declared: one implicit pool, the whole fleet)."""

    model_config = _Strict
    name: str = Field(default="fleet", min_length=1)
    hosts: tuple[HostSpec, ...] = Field(min_length=1)
    endpoints: dict[str, EndpointSpec] = Field(min_length=1)
    pools: tuple[PoolSpec, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _names(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("endpoints"), dict):
            data = dict(data)
            data["endpoints"] = {
                k: ({"name": k, **v} if isinstance(v, dict) and "name" not in v else v)
                for k, v in data["endpoints"].items()
            }
        return data

    @model_validator(mode="after")
    def _check(self) -> FleetSpec:
        names = [h.name for h in self.hosts]  # first: two simulated hosts of one name also share GPU UUIDs
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise _FleetFieldError("hosts.name", twice[0], "host names must be unique")
        seen: set[str] = set()
        for h in self.hosts:
            for g in h.gpus:
                if g.uuid in seen:
                    raise _FleetFieldError(f"hosts.{h.name}.gpus.uuid", g.uuid, "this GPU UUID appears twice")
                seen.add(g.uuid)
        hosts = {h.name: h for h in self.hosts}
        largest_host = max(len(h.gpus) for h in self.hosts)
        largest_mem = max(g.memory_mib for h in self.hosts for g in h.gpus)
        used: dict[tuple[str, int], str] = {}
        for e in self.endpoints.values():
            if e.tensor_parallel > largest_host:
                raise _FleetFieldError(
                    f"endpoints.{e.name}.tensor_parallel", e.tensor_parallel,
                    f"larger than the largest host ({largest_host} GPUs)")
            if e.memory_mib_per_gpu > largest_mem:
                raise _FleetFieldError(
                    f"endpoints.{e.name}.memory_mib_per_gpu", e.memory_mib_per_gpu,
                    f"above the largest GPU's memory ({largest_mem} MiB)")
            if not _fits_some(e, list(hosts.values())):  # as a pool's endpoints are checked: its jobs could never run
                raise _FleetFieldError(
                    f"endpoints.{e.name}.memory_mib_per_gpu", e.memory_mib_per_gpu,
                    f"no host has an aligned group of tensor_parallel={e.tensor_parallel} GPUs with this much memory "
                    "each (its jobs could never run)")
            for position, sp in enumerate(e.set_point):
                if sp.host not in hosts:
                    raise _FleetFieldError(f"endpoints.{e.name}.set_point.{position}.host", sp.host, "unknown host")
                if len(sp.gpus) != e.tensor_parallel:
                    raise _FleetFieldError(f"endpoints.{e.name}.set_point.{position}.gpus", list(sp.gpus),
                                           f"needs exactly tensor_parallel={e.tensor_parallel} GPUs")
                idx = {g.index for g in hosts[sp.host].gpus}
                for i in sp.gpus:
                    if i not in idx:
                        raise _FleetFieldError(f"endpoints.{e.name}.set_point.{position}.gpus", i, f"no such GPU on {sp.host}")
                    if (sp.host, i) in used:
                        raise _FleetFieldError(f"endpoints.{e.name}.set_point.{position}.gpus", i,
                                               f"already in the set point of {used[(sp.host, i)]}")
                    used[(sp.host, i)] = e.name
        self._check_pools(hosts)
        return self

    def _check_pools(self, hosts: dict[str, HostSpec]) -> None:
        """Pools, when declared: unique names, every host in exactly one, known endpoints
        whose gang fits one of the pool's hosts, every endpoint served by some pool."""
        if not self.pools:
            return
        owner: dict[str, str] = {}
        names: set[str] = set()
        for pool in self.pools:
            if pool.name in names:
                raise _FleetFieldError("pools.name", pool.name, "pool names must be unique")
            names.add(pool.name)
            for host in pool.hosts:
                if host not in hosts:
                    raise _FleetFieldError(f"pools.{pool.name}.hosts", host,
                                           f"unknown host; known: {', '.join(sorted(hosts))}")
                if host in owner:
                    raise _FleetFieldError(f"pools.{pool.name}.hosts", host,
                                           f"already in pool {owner[host]!r}: a host belongs to exactly one pool")
                owner[host] = pool.name
            for endpoint in pool.endpoints:
                if endpoint not in self.endpoints:
                    raise _FleetFieldError(f"pools.{pool.name}.endpoints", endpoint,
                                           f"unknown endpoint; known: {', '.join(sorted(self.endpoints))}")
                if not _fits_some(self.endpoints[endpoint], [hosts[h] for h in pool.hosts]):
                    raise _FleetFieldError(f"pools.{pool.name}.endpoints", endpoint,
                                           "no host of the pool has an aligned group of the endpoint's "
                                           "tensor_parallel GPUs with its memory_mib_per_gpu")
        missing = sorted(set(hosts) - set(owner))
        if missing:
            raise _FleetFieldError("pools", missing, "every host must be in exactly one pool when pools are "
                                                           f"declared; in none: {', '.join(missing)}")
        unserved = sorted(e for e in self.endpoints if not self.pools_serving(e))
        if unserved:
            raise _FleetFieldError("pools", unserved, f"no pool serves endpoint(s) {', '.join(unserved)}")
        for e in self.endpoints.values():
            for position, sp in enumerate(e.set_point):
                if self.pool_of_host(sp.host) not in self.pools_serving(e.name):
                    raise _FleetFieldError(f"endpoints.{e.name}.set_point.{position}.host", sp.host,
                                           f"in pool {self.pool_of_host(sp.host)!r}, which does not serve {e.name!r}")

    # -- pools -----------------------------------------------------------------------
    def pool_names(self) -> list[str]:
        """The declared pools' names, in file order ([] for the implicit pool)."""
        return [pool.name for pool in self.pools]

    def pool(self, name: str) -> PoolSpec:
        """The pool called ``name``. Raises :class:`ValidationError` naming the known ones."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        known = ", ".join(self.pool_names()) or "none: this fleet declares no pools"
        raise ValidationError("pool", name, f"unknown pool; known: {known}")

    def pool_of_host(self, host: str) -> str | None:
        """The pool ``host`` belongs to (None for the implicit pool)."""
        for pool in self.pools:
            if host in pool.hosts:
                return pool.name
        return None

    def pool_endpoints(self, name: str) -> list[str]:
        """The endpoints pool ``name`` serves (its ``endpoints``, or every one that fits)."""
        pool = self.pool(name)
        if pool.endpoints:
            return list(pool.endpoints)
        own = [h for h in self.hosts if h.name in pool.hosts]
        return [e.name for e in self.endpoints.values() if _fits_some(e, own)]

    def pools_serving(self, endpoint: str) -> list[str]:
        """The pools that serve ``endpoint``, file order ([] without pools: the implicit pool)."""
        return [pool.name for pool in self.pools if endpoint in self.pool_endpoints(pool.name)]

    def pool_fleet(self, name: str) -> FleetSpec:
        """The fleet one pool's planner runs on: the pool's hosts, the endpoints it serves
        (set points kept on its own hosts only), no pools."""
        pool = self.pool(name)
        served = set(self.pool_endpoints(name))
        endpoints = {}
        for endpoint in self.endpoints.values():
            if endpoint.name in served:
                kept = tuple(sp for sp in endpoint.set_point if sp.host in pool.hosts)
                endpoints[endpoint.name] = endpoint.model_copy(update={"set_point": kept})
        hosts = tuple(h for h in self.hosts if h.name in pool.hosts)
        return FleetSpec(name=f"{self.name}/{name}", hosts=hosts, endpoints=endpoints)

    # -- derived views -------------------------------------------------------------
    def gpu_uuids(self) -> list[str]:
        return [g.uuid for h in self.hosts for g in h.gpus]

    def gpu_count(self) -> int:
        return sum(len(h.gpus) for h in self.hosts)

    def host_of(self, uuid: str) -> str:
        for h in self.hosts:
            for g in h.gpus:
                if g.uuid == uuid:
                    return h.name
        raise KeyError(uuid)

    def sleep_warnings(self) -> list[str]:
        """Lines naming the sleep settings that have no effect as written
        (:meth:`EndpointSpec.sleep_warnings`), and the endpoints whose level-1 sleeper's host
        RAM exceeds the ``host_memory_mib`` of every host that gives one (they are stopped
        there, or sleep at level 2 where ``wake_level2_s`` allows)."""
        out = [line for spec in self.endpoints.values() for line in spec.sleep_warnings()]
        budgets = self.host_ram_budgets()
        if budgets and len(budgets) == len(self.hosts):
            for spec in self.endpoints.values():
                ram = spec.asleep_ram_mib
                if ram and all(ram > budget for budget in budgets.values()):
                    instead = ("sleeps at level 2 instead (wake_level2_s)" if spec.wake_level2_s is not None
                               else "is stopped instead")
                    out.append(f"endpoints.{spec.name}: its level-1 sleeper holds {ram} MiB of host RAM, more than "
                               f"any host's host_memory_mib (largest {max(budgets.values())}): it never sleeps at level "
                               f"1 and {instead}; raise host_memory_mib, set sleep_host_memory_mib, or use "
                               "sleep_level = 2")
        return out

    def host_ram_budgets(self) -> dict[str, int]:
        """Host name -> ``host_memory_mib`` (the RAM sleepers may hold), for hosts that give one."""
        return {h.name: h.host_memory_mib for h in self.hosts if h.host_memory_mib is not None}

    def set_point_by_gpu(self) -> dict[str, str]:
        """GPU UUID -> endpoint name resident at the set point."""
        out: dict[str, str] = {}
        hosts = {h.name: h for h in self.hosts}
        for e in self.endpoints.values():
            for sp in e.set_point:
                by_index = {g.index: g.uuid for g in hosts[sp.host].gpus}
                for i in sp.gpus:
                    out[by_index[i]] = e.name
        return out

    def can_ever_fit(self, endpoint: str) -> tuple[bool, str]:
        """Whether some aligned GPU group of ``endpoint`` (its tensor-parallel size, GPUs in
        index order on one host: {0,1}, {2,3} ... for TP 2, as the planner groups them,
        :meth:`makespan.planner.model.FleetState.groups`) has its ``memory_mib_per_gpu`` on
        every GPU. Returns (True, "") or (False, the reason). ``endpoint`` must be an
        endpoint of the fleet."""
        e = self.endpoints[endpoint]
        if _fits_some(e, list(self.hosts)):
            return True, ""
        return False, (f"endpoint {endpoint!r} needs {e.tensor_parallel} GPUs with "
                       f"{e.memory_mib_per_gpu} MiB each on one host, in an aligned group (GPUs in index "
                       f"order, groups of {e.tensor_parallel} from the first); no host has them")

    def can_ever_fit_with(self, endpoint: str, helpers: Sequence[str]) -> tuple[bool, str]:
        """Whether some aligned GPU group of ``endpoint`` (its tensor-parallel size, GPUs
        in index order on one host, as the planner groups them) also holds its ``helpers``:
        each helper starts on the group's first GPUs (its own tensor-parallel size), so GPU
        ``i`` needs the endpoint's memory plus that of every helper wider than ``i``, MiB.
        Returns (True, "") or (False, the reason). Every name must be an endpoint of the fleet."""
        main = self.endpoints[endpoint]
        tp = main.tensor_parallel
        wide = [h for h in helpers if self.endpoints[h].tensor_parallel > tp]
        if wide:
            return False, (f"helper {wide[0]!r} needs {self.endpoints[wide[0]].tensor_parallel} GPUs, more than the "
                           f"{tp} of {endpoint!r} it starts on")
        need = [main.memory_mib_per_gpu] * tp
        for h in helpers:
            for position in range(self.endpoints[h].tensor_parallel):
                need[position] += self.endpoints[h].memory_mib_per_gpu
        if any(_aligned_fit(host, need) for host in self.hosts):
            return True, ""
        parts = ", ".join(f"{h} {self.endpoints[h].memory_mib_per_gpu} MiB on its first "
                          f"{self.endpoints[h].tensor_parallel} GPU(s)" for h in helpers)
        largest = max((g.memory_mib for host in self.hosts for g in host.gpus), default=0)
        return False, (f"endpoint {endpoint!r} ({main.memory_mib_per_gpu} MiB per GPU) with its helpers ({parts}) "
                       f"needs {', '.join(str(mib) for mib in need)} MiB on the GPUs of one aligned TP-{tp} group; "
                       f"no group of the fleet has that much (largest GPU: {largest} MiB)")

    def placement_problem(self, endpoint: str, helpers: Sequence[str] = ()) -> tuple[str, Any, str] | None:
        """Why a job of ``endpoint`` with ``helpers`` can never run on this fleet, as
        ``(field, value, reason)`` (``job.endpoint`` or ``job.helpers``: an unknown name, or
        no aligned group that holds them, :meth:`can_ever_fit` / :meth:`can_ever_fit_with`);
        None when some group can hold it. The one rule of the submit's check
        (:func:`parse_job`) and of the planner's for jobs queued before the fleet changed."""
        known = ", ".join(sorted(self.endpoints))
        if endpoint not in self.endpoints:
            return "job.endpoint", endpoint, f"unknown endpoint; known: {known}"
        ok, why = self.can_ever_fit(endpoint)
        if not ok:
            return "job.endpoint", endpoint, why
        if not helpers:
            return None
        for name in helpers:
            if name not in self.endpoints:
                return "job.helpers", name, f"unknown endpoint; known: {known}"
        ok, why = self.can_ever_fit_with(endpoint, helpers)
        return None if ok else ("job.helpers", list(helpers), why)


def _aligned_fit(host: HostSpec, need_mib: Sequence[int]) -> bool:
    """Whether an aligned group of ``len(need_mib)`` GPUs of ``host`` (index order, groups
    from the first GPU, as the planner forms them) has at least ``need_mib[i]`` MiB on its
    ``i``-th GPU."""
    tp = len(need_mib)
    gpus = sorted(host.gpus, key=lambda g: g.index)
    return any(all(g.memory_mib >= mib for g, mib in zip(gpus[start:start + tp], need_mib))
               for start in range(0, len(gpus) - tp + 1, tp))


def _fits_some(endpoint: EndpointSpec, hosts: list[HostSpec]) -> bool:
    """Whether one of ``hosts`` has an aligned group of ``tensor_parallel`` GPUs with the
    endpoint's memory (:func:`_aligned_fit`)."""
    return any(_aligned_fit(h, [endpoint.memory_mib_per_gpu] * endpoint.tensor_parallel) for h in hosts)


class _FleetFieldError(ValueError):
    def __init__(self, field: str, value: Any, reason: str):
        super().__init__(reason)
        self.field, self.value, self.reason = field, value, reason


class JobSpec(BaseModel):
    """One unit of submitted work (design notes, "job").

    Attributes:
        endpoint: name of an endpoint of the fleet.
        priority: CRITICAL, HIGH, NORMAL or LOW.
        service_s: estimated service time in seconds (positive, finite). Optional for a
            job that names a workload function: the producer then plans it with the
            learned estimate of (workload, endpoint) (:mod:`makespan.estimates`).
        payload: JSON object handed to the execute phase; size-limited.
        workload: name of a ``@makespan.workload`` function that a live GPU worker
            registered (:mod:`makespan.registry`); None: the execute phase sleeps
            ``service_s`` or sends the payload's templated requests (simulations).
        args / kwargs: the function's JSON arguments (size-limited with the payload).
        idempotency_key: resubmitting the same key returns the existing job.
        deadline_s: optional due time, seconds after submission (positive, at most
            MAX_DEADLINE_S, a year; workload seconds like ``service_s``). The planner sees it as
            release + deadline_s; only the ``tardiness`` policies use it (Σ w·max(0, C − d)).
        delay_s: optional delay, seconds after submission (at most MAX_DELAY_S): the job
            is kept as ``delayed`` in Redis and queued only when due.
        depends_on: ids of jobs that must complete first (a repeated id counts once:
            kept in first-seen order); each must name an existing job when the job is
            written (the submit script checks it: :class:`makespan.store.JobStore`).
        workload_id / step: set for steps of a multi-step workload.
        helpers: endpoints started beside ``endpoint`` on the job's GPUs (a workload
            function's ``helpers``, which :meth:`makespan.client.Client.submit` copies from
            the published definition); the planner prices their cold start and places the
            job only where they fit beside it.
    """

    model_config = _Strict
    endpoint: str
    priority: Priority = Priority.NORMAL
    service_s: float | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    workload: str | None = Field(default=None, min_length=1, max_length=200)
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    deadline_s: float | None = None
    delay_s: float | None = None
    workload_id: str | None = None
    step: str | None = None
    depends_on: tuple[str, ...] = ()
    helpers: tuple[str, ...] = ()

    @field_validator("priority", mode="before")
    @classmethod
    def _prio(cls, v: Any) -> Priority:
        try:
            return Priority.parse(v)
        except ValidationError as e:
            raise ValueError(e.reason) from None

    @field_validator("idempotency_key", mode="before")
    @classmethod
    def _idem(cls, v: Any) -> Any:
        # checked before the model's whitespace stripping: a key is an identity, and
        # "k " silently becoming "k" would return another submitter's job
        if isinstance(v, str):
            if v != v.strip():
                raise ValueError("must not start or end with whitespace")
            if any(unicodedata.category(c) == "Cc" for c in v):
                raise ValueError("must not contain control characters")
        return v

    @field_validator("service_s", "deadline_s", "delay_s", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):  # pydantic would read true as 1 s
            raise ValueError("must be a number of seconds, not a boolean")
        return v

    @field_validator("service_s")
    @classmethod
    def _service(cls, v: float | None) -> float | None:
        return _seconds_at_most(v, MAX_SERVICE_S)

    @field_validator("deadline_s")
    @classmethod
    def _deadline(cls, v: float | None) -> float | None:
        return _seconds_at_most(v, MAX_DEADLINE_S)

    @field_validator("depends_on")
    @classmethod
    def _deps(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v))  # a repeated id is one dependency

    @field_validator("delay_s")
    @classmethod
    def _delay(cls, v: float | None) -> float | None:
        if v is None:
            return None
        v = _non_negative_finite(v)  # 0 is allowed: the message says so
        if v == 0:  # a computed max(0, due - now): queued at once, as Celery's countdown=0
            return None
        return _seconds_at_most(v, MAX_DELAY_S)


MORE_ERRORS_SHOWN = 4  # problems besides the first that one validation error names (ValidationError.also)


def _one_error(first: Any, root: str) -> ValidationError:
    ctx = first.get("ctx") or {}
    inner = ctx.get("error")
    if isinstance(inner, _FleetFieldError):
        return ValidationError(inner.field, inner.value, inner.reason)
    loc = ".".join(str(p) for p in first.get("loc", ()))
    field = f"{root}.{loc}" if loc else root
    msg = first.get("msg", "invalid")
    if first.get("type") == "extra_forbidden":
        msg = "unknown key"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return ValidationError(field, first.get("input"), msg)


def _translate(err: pydantic.ValidationError, root: str, data: Any) -> ValidationError:
    """The first problem of ``err`` as a :class:`ValidationError`, the others (up to
    :data:`MORE_ERRORS_SHOWN`, then a count) in its ``also``: a user fixes them in one go."""
    errors = err.errors()
    locs = [tuple(e.get("loc", ())) for e in errors]
    # a container's own error that follows from a bad item in it (a tuple left short of
    # its minimum after its bad item) says nothing the item's error does not
    kept = [e for e, loc in zip(errors, locs)
            if e is errors[0] or not any(len(other) > len(loc) and other[:len(loc)] == loc for other in locs)]
    found = [_one_error(e, root) for e in kept]
    first, rest = found[0], found[1:]
    also = tuple(str(e) for e in rest[:MORE_ERRORS_SHOWN])
    if len(rest) > MORE_ERRORS_SHOWN:
        also += (f"{len(rest) - MORE_ERRORS_SHOWN} more",)
    return ValidationError(first.field, first.value, first.reason, show_value=first.show_value, also=also)


def validate(model: type[BaseModel], data: Any, root: str) -> Any:
    """``model.model_validate(data)`` (``model`` instances pass through as dumps); any
    failure is raised as :class:`ValidationError` naming ``root.field`` and the value."""
    if isinstance(data, model):
        data = data.model_dump()
    if not isinstance(data, dict):
        raise ValidationError(root, data, "must be a mapping")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as e:
        raise _translate(e, root, data) from None


def parse_fleet(data: dict[str, Any]) -> FleetSpec:
    """Validate a fleet mapping. Raises :class:`ValidationError`."""
    if not isinstance(data, dict):
        raise ValidationError("fleet", data, "must be a table")
    try:
        return FleetSpec.model_validate(data)
    except pydantic.ValidationError as e:
        raise _translate(e, "fleet", data) from None


def read_user_file(path: str | Path, what: str) -> str:
    """The text of a file a user names (a fleet, workload, trace or events file), strict
    UTF-8, line endings kept as written (``newline=""``, as :mod:`csv` wants them).

    Raises:
        ValidationError: field ``what`` (``"fleet file"``, ...), the path as the value:
            no such file, a folder, no permission, or bytes that are not UTF-8 (the line
            and byte named)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read()
    except FileNotFoundError as e:
        where = "" if p.is_absolute() else f" (relative to the working directory {os.getcwd()})"
        raise ValidationError(what, str(p), f"no such file{where}") from e
    except IsADirectoryError as e:
        raise ValidationError(what, str(p), "cannot read it: not a file but a folder; give the file itself") from e
    except OSError as e:  # no permission, a device that fails
        raise ValidationError(what, str(p), f"cannot read it: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValidationError(what, str(p), f"cannot read it: not UTF-8 text: byte {raw[e.start:e.start + 1]!r} at line {line} "
                                            f"(offset {e.start}); save the file as UTF-8") from None
    return text.removeprefix("\ufeff")  # a byte-order mark (spreadsheet exports) is not content


def load_fleet(path: str | Path) -> FleetSpec:
    """Read and validate a TOML fleet file.

    Raises:
        ValidationError: the file cannot be read (:func:`read_user_file`), is not TOML,
            or its content is invalid; the error names the file (``source``)."""
    p = Path(path)
    text = read_user_file(p, "fleet file")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        hint = "; a fleet file is TOML (examples/render-pipeline.toml), not YAML or JSON" \
            if p.suffix.lower() in (".yaml", ".yml", ".json") else ""
        raise ValidationError("fleet file", str(p), f"not valid TOML: {e}{hint}") from e
    except RecursionError:
        raise ValidationError("fleet file", str(p), "not valid TOML: nested too deeply") from None
    try:
        return parse_fleet(data)
    except ValidationError as e:
        raise e.in_file(p) from None


#: how to get past the payload limit, in its errors (a job's and a workload step's)
PAYLOAD_LIMIT_HINT = ("MAKESPAN_MAX_PAYLOAD_BYTES, where you submit, raises it; better, pass a reference: a path "
                      "or URL the function reads the data from, or a job whose result it takes")


DEFAULT_MAX_DEPENDS_ON = 1_000  # Settings.max_depends_on (MAKESPAN_MAX_DEPENDS_ON)


def parse_job(data: dict[str, Any] | JobSpec, fleet: FleetSpec, max_payload_bytes: int = 64 * 1024,
              max_depends_on: int = DEFAULT_MAX_DEPENDS_ON) -> JobSpec:
    """Validate a job against a fleet. Raises :class:`ValidationError` naming the field.

    Checks: unknown keys, unknown endpoint or priority, non-positive or non-finite
    durations, payload size (JSON-encoded bytes), at most ``max_depends_on`` distinct
    ``depends_on`` ids (``MAKESPAN_MAX_DEPENDS_ON``; checked before the ids are read one by
    one), and that the endpoint's gang (with its helpers) fits some aligned GPU group of
    the fleet, as the planner forms them (:meth:`FleetSpec.placement_problem`)."""
    if isinstance(data, dict):
        _check_depends_on_count(data.get("depends_on"), max_depends_on)
    job = validate(JobSpec, data, "job")
    _check_depends_on_count(job.depends_on, max_depends_on)
    if job.helpers and (job.endpoint in job.helpers or len(set(job.helpers)) != len(job.helpers)):
        raise ValidationError("job.helpers", list(job.helpers), "must not repeat a name nor name the main endpoint "
                                                                f"{job.endpoint!r}")
    problem = fleet.placement_problem(job.endpoint, job.helpers)
    if problem is not None:
        raise ValidationError(*problem)
    if job.service_s is None and job.workload is None:
        raise ValidationError("job.service_s", None, "required (a positive number of seconds) unless the job "
                                                     "names a workload function, whose service time is learned")
    size = json_size(job.payload, "job.payload")
    for name, value in (("args", list(job.args)), ("kwargs", job.kwargs)):
        if value:  # empty ones are not written
            size += json_size(value, f"job.{name}")
    if size > max_payload_bytes:
        raise ValidationError("job.payload", f"{size} bytes", f"payload, args and kwargs together are larger than "
                                                              f"the limit of {max_payload_bytes} bytes: "
                                                              f"{PAYLOAD_LIMIT_HINT}")
    try:  # what the producer writes: must encode too (pydantic's own depth limit, surrogates)
        job.model_dump_json()
    except (ValueError, TypeError, RecursionError, pydantic_core.PydanticSerializationError) as e:
        raise ValidationError("job", "<job>", f"cannot be encoded as JSON: {e}") from None
    return job


def _check_depends_on_count(depends_on: Any, max_depends_on: int) -> None:
    """Refuse a ``depends_on`` list of more than ``max_depends_on`` distinct ids (a repeated
    id counts once, as the job keeps it). Anything else (not a list, ids of the wrong type)
    is left to the model's validation.

    Raises:
        ValidationError: on ``job.depends_on``, naming the count, the limit and its variable."""
    if not isinstance(depends_on, (list, tuple)) or len(depends_on) <= max_depends_on:
        return
    try:
        count = len(set(depends_on))
    except TypeError:  # an unhashable id: the model refuses it
        return
    if count > max_depends_on:
        raise ValidationError("job.depends_on", f"{count} ids",
                              f"more than the limit of {max_depends_on} dependencies (MAKESPAN_MAX_DEPENDS_ON); "
                              "depend on fewer jobs, e.g. on a workload step or one job that waits for the rest")


def json_size(value: Any, field: str) -> int:
    """Bytes of ``value`` encoded as strict UTF-8 JSON (no NaN or infinity, no lone
    surrogates, no objects JSON cannot carry, no mapping keys other than strings).

    Raises:
        ValidationError: naming ``field`` when it cannot be encoded."""
    try:
        size = len(json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8"))
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        where = first_not_json(value, field) if not isinstance(e, RecursionError) else None
        hint = ("; a Job is replaced by its result only as a top-level argument: pass it as one") if where and where[1] == "of type Job" else ""
        raise ValidationError(field, f"<{type(value).__name__}>", f"must be JSON (no pickle): {reason}"
                              + (f" ({where[0]}: {where[1]})" if where else "") + hint,
                              show_value=where is None) from None
    key = first_key_not_str(value, field)
    if key is not None:  # json.dumps writes 1 as "1": the function would get {"1": ...}, not {1: ...}
        raise ValidationError(field, f"<{type(value).__name__}>", f"must be JSON (no pickle): mapping keys must be "
                                                                  f"strings, got {key}", show_value=False)
    return size


def first_not_json(value: Any, path: str, depth: int = 0) -> tuple[str, str] | None:
    """(path, type name) of the first value in ``value`` (nested lists, tuples and dicts)
    that JSON cannot carry, e.g. ``("args[1]", "of type set")``, ``("args[0]", "the float nan")``,
    ``("kwargs", "a mapping with a key of type tuple")``, ``("args[0]", "a string with a lone
    surrogate (not UTF-8)")`` (a mapping key with one: the encoder's own message says so);
    None when none is found."""
    if depth > 50:
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = first_not_json(item, f"{path}[{index}]", depth + 1)
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                return path, f"a mapping with a key of type {type(key).__name__}"
            found = first_not_json(item, f"{path}[{key!r}]", depth + 1)
            if found:
                return found
        return None
    if isinstance(value, float) and not math.isfinite(value):
        written = (" (a number beyond a float's range in JSON, such as 1e400, reads as inf)"
                   if math.isinf(value) and path.startswith("job.") else "")  # submitted JSON, not a return value
        return path, f"the float {value!r}{written}"
    if isinstance(value, str):
        return None if is_utf8(value) else (path, "a string with a lone surrogate (not UTF-8)")
    if value is None or isinstance(value, (int, float, bool)):
        return None
    kind = type(value)
    name = kind.__name__ if kind.__module__ in ("builtins", "makespan.client") else f"{kind.__module__}.{kind.__qualname__}"
    if kind.__module__.split(".")[0] == "numpy":  # np.float32(1.5), np.bool_(True), an ndarray
        return path, f"of type {name}: convert it with .item() (an array: .tolist())"
    return path, f"of type {name}"


def first_key_not_str(value: Any, path: str = "") -> str | None:
    """The first mapping key in ``value`` (nested lists, tuples and dicts) that is not a
    string, as ``type repr`` (``int 1``), followed by `` at PATH`` (``at job.args[0]``)
    when ``path`` names ``value``; or None. ``value`` has encoded as JSON: no cycles, depth
    within Python's limit."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    return f"{type(k).__name__} {k!r}"[:100] + (f" at {where}" if path else "")
                stack.append((v, f"{where}[{k!r}]"))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, f"{where}[{index}]") for index, v in reversed(list(enumerate(item))))
    return None


def fleet_version(fleet: FleetSpec) -> str:
    """A short content hash of a fleet (sha256 of its canonical JSON, 16 hex digits): the
    planner publishes it beside the fleet (``Keys.fleet_version``) and a producer that
    brings its own fleet file is checked against it."""
    import hashlib

    return hashlib.sha256(fleet.model_dump_json().encode()).hexdigest()[:16]
