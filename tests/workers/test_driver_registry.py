"""Drivers by capability (issue 17 point 5): every driver class carries a frozen
DriverCapabilities and an options model; drivers register by name, built-ins in the
core registry and others through the ``makespan.drivers`` entry points (a real
dist-info directory on sys.path here, read in this process and in a fresh interpreter);
a fleet file's ``launch`` table is validated against the chosen driver; the phase
runner drives a plug-in driver by its capabilities alone (real Redis, real phases);
and no module outside the drivers compares a driver name."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from makespan.driver_registry import (BUILTIN_DRIVERS, DRIVERS, ENTRY_POINT_GROUP, DriverCapabilities,
                                      DriverContext, DriverRegistry)
from makespan.errors import ValidationError
from makespan.models import EndpointSpec, FleetSpec, LaunchSpec, parse_fleet
from makespan.producer import Producer
from makespan.workers.agenda import AgendaTracker
from makespan.workers.drivers import capabilities, get_driver
from makespan.workers.drivers.process import ProcessDriver
from makespan.workers.drivers.base import EndpointDriver
from makespan.workers.drivers.registry import list_instances
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner
from makespan.workers.warm import run_phases

ROOT = Path(__file__).resolve().parents[2]
GPU = "GPU-host-a-0"

TOY_MODULE = '''
from pydantic import BaseModel, ConfigDict, Field

from makespan.driver_registry import DriverCapabilities
from makespan.workers.drivers.simulated import SimulatedDriver


class ToyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    warmup_s: float = Field(default=0.0, ge=0)


class ToyDriver(SimulatedDriver):
    """A modelled driver with no sleep mode whose transitions take at least 0.3 s."""

    name = "toy"
    capabilities = DriverCapabilities(spawns_process=False, sleep_levels=(), min_transition_wall_s=0.3)
    options_model = ToyOptions
    calls = []

    def start(self, endpoint, gpus, time_scale=1.0, host="", on_spawn=None):
        ToyDriver.calls.append(("start", endpoint.name, endpoint.launch.driver_options().warmup_s))
        return super().start(endpoint, gpus, time_scale, host, on_spawn)

    def sleep(self, instance, level=1):
        ToyDriver.calls.append(("sleep", instance.endpoint))
        super().sleep(instance, level)

    def stop(self, instance):
        ToyDriver.calls.append(("stop", instance.endpoint))
        super().stop(instance)
'''


def _write_plugin(root: Path, entry_points: str) -> Path:
    """A package ``toy_drivers`` and its installed metadata (dist-info) under ``root``."""
    (root / "toy_drivers").mkdir(parents=True)
    (root / "toy_drivers" / "__init__.py").write_text(TOY_MODULE)
    info = root / "toy_drivers-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-drivers\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return root


@pytest.fixture
def plugin(tmp_path):
    """The toy driver installed as ``toy`` (entry point), seen by the process-wide registry."""
    root = _write_plugin(tmp_path / "site", f"[{ENTRY_POINT_GROUP}]\ntoy = toy_drivers:ToyDriver\n")
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    DRIVERS.refresh()
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("toy_drivers", None)
        importlib.invalidate_caches()
        DRIVERS.refresh()


def test_builtin_drivers_say_what_they_can_do():
    sim, proc, vllm = (capabilities(n) for n in ("simulated", "process", "vllm"))
    assert (sim.spawns_process, sim.reports_alive, sim.min_transition_wall_s) == (False, False, 0.0)
    assert (proc.spawns_process, proc.reports_alive, proc.min_transition_wall_s) == (True, True, 5.0)
    assert vllm == proc  # the vLLM preset is the process driver with its own command
    assert sim.sleep_levels == proc.sleep_levels == (1, 2) and sim.has_sleep_mode
    assert not DriverCapabilities(spawns_process=False).has_sleep_mode
    with pytest.raises(ValueError, match="sleep levels"):
        DriverCapabilities(spawns_process=False, sleep_levels=(3,))
    for name in DRIVERS:
        assert isinstance(get_driver(name), EndpointDriver), name


def test_installed_entry_points_name_the_builtin_drivers():
    """pyproject's ``makespan.drivers`` group (as installed) agrees with the core registry."""
    points = {p.name: p.value for p in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert {n: points.get(n) for n in BUILTIN_DRIVERS} == dict(BUILTIN_DRIVERS)
    assert set(BUILTIN_DRIVERS) <= set(DRIVERS.names())


def test_unknown_driver_names_the_known_ones():
    with pytest.raises(ValidationError) as ei:
        get_driver("docker")
    assert ei.value.field == "launch.driver" and "known drivers: process, simulated, vllm" in ei.value.reason
    doc = {"hosts": [{"name": "host-a", "gpu_count": 1, "memory_mib": 81920}],
           "endpoints": {"chat": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 5,
                                  "launch": {"driver": "docker"}}}}
    with pytest.raises(ValidationError) as ei:
        parse_fleet(doc)
    assert "chat.launch.driver" in ei.value.field and "process, simulated, vllm" in str(ei.value)


def test_a_driver_option_it_does_not_take_is_an_error():
    with pytest.raises(ValidationError) as ei:
        get_driver("process", graze_s=1.0)
    assert ei.value.field == "driver.process" and "graze_s" in ei.value.reason
    with pytest.raises(ValueError, match=r"driver 'simulated' has no launch option 'cmd' \(its own options: none\)"):
        LaunchSpec(driver="simulated", cmd="rm -rf /")
    # the common fields are every driver's (one that does not read a field ignores it)
    assert LaunchSpec(driver="simulated", health_timeout_s=60).driver_options().model_dump() == {}


def test_registry_rejects_a_second_driver_of_a_name_and_a_class_that_is_no_driver():
    reg = DriverRegistry({"simulated": BUILTIN_DRIVERS["simulated"]}, entry_point_group=None)
    with pytest.raises(ValidationError, match="already registered"):
        reg.register("simulated", BUILTIN_DRIVERS["process"])
    reg.register("plain", "json:JSONDecoder")  # a class without capabilities
    with pytest.raises(ValidationError, match="is not a driver"):
        reg.driver_class("plain")
    reg.register("missing", "makespan.no_such_module:Driver")
    with pytest.raises(ValidationError, match="cannot be imported"):
        reg.create("missing")
    assert reg.get("missing") is None and reg.names() == ("missing", "plain", "simulated")


def test_a_driver_registered_under_another_name_than_its_own_is_refused():
    """Instance records keep the class's ``name``; the observer, the phases and shutdown
    look the driver up by it, so a class registered under another name would start and
    then never be found again: refused when it is loaded."""
    reg = DriverRegistry({}, entry_point_group=None)
    reg.register("sglang", BUILTIN_DRIVERS["simulated"])  # a class whose name is 'simulated'
    with pytest.raises(ValidationError, match="says its name is 'simulated'"):
        reg.driver_class("sglang")


def test_an_entry_point_driver_is_found_validated_and_made(plugin):
    assert "toy" in DRIVERS and DRIVERS.capabilities("toy").min_transition_wall_s == 0.3
    launch = LaunchSpec(driver="toy", warmup_s=2)
    assert launch.driver_options().warmup_s == 2.0
    with pytest.raises(ValueError, match=r"driver 'toy' has no launch option 'warmup' \(its own options: warmup_s\)"):
        LaunchSpec(driver="toy", warmup=2)
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        LaunchSpec(driver="toy", warmup_s=-1)
    waits: list[float] = []  # a modelled driver spends its durations through the context's wait
    driver = get_driver("toy", context=DriverContext(slowdown_by_host={"host-b": 2.0}, wait=waits.append))
    spec = EndpointSpec(name="chat", model="m", memory_mib_per_gpu=1000, cold_start_s=30, launch=launch)
    inst = driver.start(spec, ["GPU-x"], time_scale=0.01, host="host-b")
    assert inst.driver == "toy" and waits == [pytest.approx(0.6)]  # 30 s × 2 (host-b) × 0.01


def test_a_plugin_may_not_replace_a_builtin_driver(tmp_path, caplog):
    root = _write_plugin(tmp_path / "site", f"[{ENTRY_POINT_GROUP}]\nsimulated = toy_drivers:ToyDriver\n")
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        reg = DriverRegistry(BUILTIN_DRIVERS)
        with caplog.at_level(logging.WARNING, logger="makespan.driver_registry"):
            assert reg.driver_class("simulated").__module__ == "makespan.workers.drivers.simulated"
        assert "is a built-in driver" in caplog.text
    finally:
        sys.path.remove(str(root))
        importlib.invalidate_caches()


def test_a_fresh_interpreter_finds_the_entry_point_driver(tmp_path):
    """What a user's installed package does: nothing but its metadata on the path."""
    root = _write_plugin(tmp_path / "site", f"[{ENTRY_POINT_GROUP}]\ntoy = toy_drivers:ToyDriver\n")
    code = textwrap.dedent("""
        import json
        from makespan.models import parse_fleet
        from makespan.driver_registry import DRIVERS
        fleet = parse_fleet({"hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                             "endpoints": {"chat": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 5,
                                                    "launch": {"driver": "toy", "warmup_s": 1.5}}}})
        caps = DRIVERS.capabilities("toy")
        print(json.dumps([DRIVERS.names(), fleet.endpoints["chat"].launch.driver_options().warmup_s,
                          caps.spawns_process, caps.min_transition_wall_s]))
    """)
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60, cwd=tmp_path, check=True)
    assert json.loads(out.stdout) == [["process", "simulated", "toy", "vllm"], 1.5, False, 0.3]


def _toy_fleet() -> FleetSpec:
    return FleetSpec.model_validate({
        "name": "toys",
        "hosts": [{"name": "host-a", "gpu_count": 1, "memory_mib": 81920}],
        "endpoints": {
            "chat": {"model": "m", "memory_mib_per_gpu": 24000, "cold_start_s": 20, "evict_s": 5,
                     "launch": {"driver": "toy", "warmup_s": 2}},
            "embed": {"model": "e", "memory_mib_per_gpu": 6000, "cold_start_s": 10, "evict_s": 3},
        }})


def _run_job(r, keys, runner: PhaseRunner, fleet: FleetSpec, settings, endpoint: str, lease_id: str) -> PhaseContext:
    job_id = Producer(r, keys, fleet, settings).submit({"endpoint": endpoint, "service_s": 1, "priority": "HIGH"}).id
    lease = LeaseStore(r, keys).acquire(lease_id, (GPU,), 30.0, job_id=job_id, kind="job", holder="host-a",
                                        queue=keys.queue("HIGH"))
    assert lease is not None
    ctx = PhaseContext(lease_id, lease.token, [GPU], "host-a", "job", endpoint, job_id, "HIGH", 1.0)
    assert run_phases(runner, ctx) == "completed"
    return ctx


def _phase_end(r, keys, lease_id: str, phase: str) -> dict:
    for _id, fields in r.xrange(keys.events):
        event = json.loads(fields["e"])
        if event["kind"] == "phase_end" and event.get("lease") == lease_id and event.get("phase") == phase:
            return event
    raise AssertionError(f"no phase_end of {phase} for {lease_id}")


def test_the_phase_runner_drives_a_plugin_driver_by_its_capabilities(plugin, r, keys, settings):
    """The toy driver starts chat (with its own launch option); having no sleep level, its
    evicted instance is stopped (a fleet file cannot give it a wake_s:
    test_a_sleep_mode_the_driver_lacks_is_refused_in_the_fleet_file); its transitions'
    agenda entries last at least its min_transition_wall_s."""
    toy = DRIVERS.driver_class("toy")
    toy.calls.clear()
    fleet = _toy_fleet()
    runner = PhaseRunner(r, settings, fleet)
    _run_job(r, keys, runner, fleet, settings, "chat", "L1")
    assert toy.calls == [("start", "chat", 2.0)]
    [(inst, state)] = list_instances(r, keys, with_state=True)
    assert (inst.driver, inst.endpoint, state) == ("toy", "chat", "running")
    _run_job(r, keys, runner, fleet, settings, "embed", "L2")
    assert toy.calls[1:] == [("stop", "chat")]  # no ("sleep", ...): the driver has no sleep mode
    evict = _phase_end(r, keys, "L2", "evict")
    assert evict["transition"] == "evict" and "sleep_failed" not in evict  # a stop, as asked: no failed sleep
    assert [(i.endpoint, s) for i, s in list_instances(r, keys, with_state=True)] == [("embed", "running")]
    ctx = PhaseContext("L3", 1, [GPU], "host-a", "job", "chat")
    agenda = AgendaTracker(r, keys)
    for endpoints, floor_s in ((["chat"], 0.3), (["embed"], 0.001)):
        with runner._transition("start", ctx, endpoints, 0.0):
            [entry] = agenda.open_entries()
            assert entry["expected_end"] - entry["planned_start"] == pytest.approx(floor_s, abs=1e-3)


def test_simulated_transitions_in_the_phase_runner_are_the_drivers(r, keys, settings):
    """The cold start a phase takes is the simulated driver's wait (the fleet file's
    cold_start_s × the host's slowdown × the time scale), not a copy of it."""
    import dataclasses

    fleet = FleetSpec.model_validate({
        "hosts": [{"name": "host-a", "gpu_count": 1, "memory_mib": 81920}],
        "endpoints": {"chat": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 20}}})
    runner = PhaseRunner(r, dataclasses.replace(settings, simulated_slowdown="host-a=2"), fleet)
    waits: list[float] = []
    driver = runner._driver("simulated", waits.append)
    driver.start(fleet.endpoints["chat"], [GPU], settings.time_scale, "host-a")
    assert waits == [pytest.approx(20 * 2 * settings.time_scale)]
    started = time.monotonic()
    _run_job(r, keys, runner, fleet, settings, "chat", "L1")
    assert time.monotonic() - started >= 20 * 2 * settings.time_scale
    (t,) = _phase_end(r, keys, "L1", "start_endpoint")["transitions"]
    assert t["kind"] == "cold_start" and t["actual_s"] >= 40.0  # measured in workload s


# -- no caller outside the drivers asks a driver's name -----------------------------------------
CALLERS = ("app", "workers", "planner")
OWNERS = ("workers/drivers/", "app/driver_registry.py")


def _name_checks(path: Path, root: Path = ROOT) -> list[str]:
    """``x.driver == "simulated"`` (or !=, in, not in) with a built-in driver name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names = {c.value for side in sides for c in ast.walk(side)
                 if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in BUILTIN_DRIVERS}
        asks_driver = any(isinstance(a, ast.Attribute) and a.attr == "driver" for side in sides for a in ast.walk(side))
        if names and asks_driver:
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_module_outside_the_drivers_compares_a_driver_name(tmp_path):
    found = [hit for top in CALLERS for path in sorted((ROOT / top).rglob("*.py"))
             if not str(path.relative_to(ROOT)).startswith(OWNERS) for hit in _name_checks(path)]
    assert found == [], "ask the driver's capabilities (makespan.driver_registry), not its name"
    bad = tmp_path / "bad.py"  # the check itself finds one
    bad.write_text('def f(inst, spec):\n    return inst.driver != "simulated" or spec.launch.driver in ("vllm",)\n')
    assert _name_checks(bad, tmp_path) == ["bad.py:2", "bad.py:2"]


class _LevelOneDriver(ProcessDriver):
    """A plug-in driver whose runtime sleeps at level 1 only."""

    name = "level-one"
    capabilities = DriverCapabilities(spawns_process=True, sleep_levels=(1,), reports_alive=True)


class _NoSleepDriver(ProcessDriver):
    """A plug-in driver without a sleep mode."""

    name = "no-sleep"
    capabilities = DriverCapabilities(spawns_process=True, sleep_levels=(), reports_alive=True)


def test_a_sleep_mode_the_driver_lacks_is_refused_in_the_fleet_file():
    """A driver author's report: with `wake_level2_s` on a driver that sleeps at level 1 only,
    the plan chose level 2 and the GPU worker stopped the set point instead (`sleep_failed …
    has no sleep level 2`), restored later by a cold start; with a driver without a sleep mode
    every evict was a failed sleep. The fleet file is refused, naming the field and the
    driver's levels."""
    for name, cls in (("level-one", _LevelOneDriver), ("no-sleep", _NoSleepDriver)):
        if name not in DRIVERS:
            DRIVERS.register(name, cls)

    def fleet(driver: str, **endpoint) -> dict:
        return {"name": "f", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                "endpoints": {"chat": {"model": "m", "memory_mib_per_gpu": 60000, "cold_start_s": 6,
                                       "launch": {"driver": driver, "command": ["srv", "{port}"]}, **endpoint}}}

    parse_fleet(fleet("level-one", wake_s=1))  # level 1 is its level
    parse_fleet(fleet("process", wake_s=1, wake_level2_s=3))  # the built-in process driver has both
    with pytest.raises(ValidationError, match="wake_level2_s: driver 'level-one' has no sleep level 2"):
        parse_fleet(fleet("level-one", wake_s=1, wake_level2_s=3))
    with pytest.raises(ValidationError, match="sleep_level 2: driver 'level-one' has sleep levels 1 only"):
        parse_fleet(fleet("level-one", wake_s=1, sleep_level=2))
    with pytest.raises(ValidationError, match="driver 'no-sleep' has no sleep mode"):
        parse_fleet(fleet("no-sleep", wake_s=1))
    parse_fleet(fleet("no-sleep"))  # no sleep mode asked: its evicts are stops
