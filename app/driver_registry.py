"""The endpoint driver registry: which drivers exist, what each can do, how to make one.

A driver is a class (see :class:`makespan.workers.drivers.base.EndpointDriver`) with a
``name``, a frozen :class:`DriverCapabilities` and an ``options_model`` (the pydantic
model of the driver's own keys in an endpoint's ``launch`` table). Callers ask a
driver's capabilities, never its name: "does it spawn a process", "which sleep levels",
"can it tell that its process exited", "least wall time a transition takes".

Drivers come from two places, both registered by name and imported only when first
used (this module is core: it imports no driver, so :mod:`makespan.models` can check a
fleet file's ``launch.driver`` against it without an import cycle):

* the built-in drivers (``simulated``, ``process``, ``vllm``), registered below;
* the entry-point group ``makespan.drivers``: a user package adds a driver with

  .. code-block:: toml

     [project.entry-points."makespan.drivers"]
     sglang = "my_package.sglang_driver:SglangDriver"

  (read once, at the first lookup; :meth:`DriverRegistry.refresh` reads it again). A
  plugin may not replace a built-in driver: such an entry point is logged and ignored.

Errors: an unknown name raises :class:`makespan.errors.ValidationError` on field
``launch.driver`` whose reason lists the known drivers; a name whose class cannot be
imported, or is not a driver, raises the same error with the import failure.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from makespan.errors import ValidationError

if TYPE_CHECKING:  # annotations only: models imports this module lazily
    from makespan.models import EndpointSpec

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "makespan.drivers"

BUILTIN_DRIVERS: Mapping[str, str] = {  # name -> "module:Class", imported on first use
    "simulated": "makespan.workers.drivers.simulated:SimulatedDriver",
    "process": "makespan.workers.drivers.process:ProcessDriver",
    "vllm": "makespan.workers.drivers.vllm:VllmDriver",
}


@dataclass(frozen=True)
class DriverCapabilities:
    """What a driver can do; callers branch on these, never on a driver's name.

    Attributes:
        spawns_process: an instance is a real process on the worker's host (it has a
            ``pid`` and a ``url``; the orphan sweep and the shutdown stop handle it; a job
            planned on it never runs without a live instance).
        sleep_levels: the sleep levels ``sleep(instance, level)`` accepts (vLLM's 1 and
            2); empty: no sleep mode (an evicted instance is stopped instead).
        reports_alive: ``is_alive(instance)`` tells whether the instance's process still
            runs, so a failed health probe with ``is_alive`` False is a process that
            exited (the observer's ``process_exited``), not just an unhealthy server.
        min_transition_wall_s: least wall time, seconds, any transition of its instances
            is expected to take whatever the time scale (a real process's start-up:
            interpreter, imports, port; 0 for a driver whose transitions are waits).
    """

    spawns_process: bool
    sleep_levels: tuple[int, ...] = ()
    reports_alive: bool = False
    min_transition_wall_s: float = 0.0

    def __post_init__(self) -> None:
        if self.min_transition_wall_s < 0:
            raise ValueError(f"min_transition_wall_s must be >= 0, got {self.min_transition_wall_s}")
        if any(level not in (1, 2) for level in self.sleep_levels):
            raise ValueError(f"sleep levels are 1 or 2, got {self.sleep_levels}")

    @property
    def has_sleep_mode(self) -> bool:
        """True when the driver can put an instance to sleep at some level."""
        return bool(self.sleep_levels)


def no_wait(wall_s: float) -> None:
    """A modelled wait that takes no time (see :attr:`DriverContext.wait`)."""


@dataclass(frozen=True)
class DriverContext:
    """What the process that uses a driver knows, given to every driver class as its
    ``context`` keyword (a driver uses what it needs and ignores the rest).

    Attributes:
        endpoints: endpoint name -> spec (the fleet file's), for the durations of
            instances this driver object did not start (read back from the registry).
        slowdown_by_host: host name -> factor (> 0) on every modelled duration there.
        wait: spends a modelled wait of ``wall_s`` seconds (a driver whose transitions
            are waits calls it instead of sleeping); default :func:`time.sleep`. The
            phase runner passes one that stops early when its lease is lost (raising
            :class:`makespan.errors.StaleFencingToken`), or one that only notes it.
        pause: sleeps up to ``wall_s`` seconds between the polls of a real transition
            (a process driver's health probes during a cold start, its wait for a wake's
            answer); it may raise to abandon the transition: the phase runner's raises
            :class:`makespan.errors.StaleFencingToken` when the lease is lost or, for a
            job, the GPU worker shuts down, and :class:`makespan.errors.PhaseCancelled`
            when the job's cancel is requested during a start (the driver stops what it
            spawned and lets the error go on). Default :func:`time.sleep`.
    """

    endpoints: Mapping[str, EndpointSpec] = field(default_factory=dict)
    slowdown_by_host: Mapping[str, float] = field(default_factory=dict)
    wait: Callable[[float], None] | None = None
    pause: Callable[[float], None] | None = None


class DriverRegistry:
    """Driver name -> driver class, filled by :meth:`register` and the entry points.

    Iterating it, or ``in``, gives the names (sorted), so ``", ".join(DRIVERS)`` lists them.
    """

    def __init__(self, builtins: Mapping[str, str] | None = None,
                 entry_point_group: str | None = ENTRY_POINT_GROUP) -> None:
        self._targets: dict[str, str | type] = dict(builtins or {})
        self._builtin_names = frozenset(self._targets)
        self._classes: dict[str, type] = {}
        self._group = entry_point_group
        self._plugins: dict[str, str | type] | None = None  # None: entry points not read yet
        self._lock = threading.Lock()

    # -- registration ------------------------------------------------------------------
    def register(self, name: str, target: str | type, *, replace: bool = False) -> None:
        """Register driver ``target`` (a class, or ``"module:Class"`` imported on first
        use) as ``name``. Raises ValidationError: ``name`` taken and not ``replace``."""
        with self._lock:
            if not replace and name in self._all_targets():
                raise ValidationError("launch.driver", name, "a driver of that name is already registered")
            self._targets[name] = target
            self._classes.pop(name, None)

    def refresh(self) -> None:
        """Read the entry-point group again (a package installed since the first lookup)."""
        with self._lock:
            self._plugins = None
            self._classes = {n: c for n, c in self._classes.items() if n in self._targets}

    def _all_targets(self) -> dict[str, str | type]:
        if self._plugins is None:
            self._plugins = self._read_entry_points()
        return {**self._plugins, **self._targets}

    def _read_entry_points(self) -> dict[str, str | type]:
        if self._group is None:
            return {}
        found: dict[str, str | type] = {}
        for point in importlib.metadata.entry_points(group=self._group):
            if point.name in self._builtin_names:
                if point.value != self._targets.get(point.name):
                    log.warning("entry point %s = %r of group %s ignored: %r is a built-in driver",
                                point.name, point.value, self._group, point.name)
                continue
            found[point.name] = point.value
        return found

    # -- lookup --------------------------------------------------------------------------
    def names(self) -> tuple[str, ...]:
        """Every registered driver name, sorted (built-ins and entry points)."""
        with self._lock:
            return tuple(sorted(self._all_targets()))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def unknown(self, name: str) -> ValidationError:
        """The error for an unknown driver ``name`` (its reason lists the known ones)."""
        return ValidationError("launch.driver", name, f"unknown driver; known drivers: {', '.join(self.names())}")

    def driver_class(self, name: str) -> type:
        """The class registered as ``name`` (imported now if needed).

        Raises:
            ValidationError: unknown name, or its class cannot be imported or is not a
                driver (no ``capabilities`` :class:`DriverCapabilities`).
        """
        with self._lock:
            if name in self._classes:
                return self._classes[name]
            target = self._all_targets().get(name)
        if target is None:
            raise self.unknown(name)
        cls = _load(name, target)
        with self._lock:
            self._classes[name] = cls
        return cls

    def get(self, name: str) -> type | None:
        """The class of ``name``, or None when no driver of that name can be loaded."""
        try:
            return self.driver_class(name)
        except ValidationError:
            return None

    def capabilities(self, name: str) -> DriverCapabilities:
        """The capabilities of driver ``name``. Raises ValidationError as :meth:`driver_class`."""
        return self.driver_class(name).capabilities

    def create(self, name: str, context: DriverContext | None = None, **options: Any) -> Any:
        """A new driver ``name``: its class called with ``context`` and ``options`` (the
        class's own constructor keywords, e.g. the process driver's ``grace_s``).

        Raises:
            ValidationError: unknown name; an option the driver does not take (field
                ``driver.{name}``, the reason names the error).
        """
        cls = self.driver_class(name)
        try:
            return cls(context=context, **options)
        except TypeError as e:
            raise ValidationError(f"driver.{name}", sorted(options), f"bad driver options: {e}") from e

    # -- the launch table ------------------------------------------------------------------
    def check_launch_options(self, name: str, options: Mapping[str, Any]) -> Any:
        """Validate an endpoint's driver-specific ``launch`` keys (those beyond the common
        ones of :class:`makespan.models.LaunchSpec`) against driver ``name``'s
        ``options_model``; returns the validated model.

        Raises:
            ValueError: an option the driver does not know (the message lists its
                options), or a bad value (pydantic's message). Raised as ValueError so a
                pydantic validator turns it into a field error.
            ValidationError: unknown driver name (as :meth:`driver_class`).
        """
        model = self.driver_class(name).options_model
        known = sorted(model.model_fields)
        strangers = sorted(set(options) - set(known))
        if strangers:
            raise ValueError(f"driver {name!r} has no launch option {', '.join(map(repr, strangers))} "
                             f"(its own options: {', '.join(known) or 'none'})")
        return model.model_validate(dict(options))


def _load(name: str, target: str | type) -> type:
    if isinstance(target, str):
        module_name, _, attr = target.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValidationError("launch.driver", name, f"driver {target!r} cannot be imported: {e}") from e
    else:
        cls = target
    if not isinstance(getattr(cls, "capabilities", None), DriverCapabilities) or \
            not hasattr(cls, "options_model"):
        raise ValidationError("launch.driver", name, f"{target!r} is not a driver: it needs a DriverCapabilities "
                              "'capabilities' and an 'options_model' (makespan.workers.drivers.base.EndpointDriver)")
    declared = getattr(cls, "name", None)
    if isinstance(declared, str) and declared != name:  # instance records store the class's name, and
        # the observer, the phases and shutdown look the driver up again by it
        raise ValidationError("launch.driver", name, f"{target!r} says its name is {declared!r}: a driver's 'name' "
                              "must be the name it is registered under (its entry point's name)")
    return cls


DRIVERS = DriverRegistry(BUILTIN_DRIVERS)  # the process-wide registry

__all__ = ["BUILTIN_DRIVERS", "DRIVERS", "DriverCapabilities", "DriverContext", "DriverRegistry",
           "ENTRY_POINT_GROUP", "no_wait"]
