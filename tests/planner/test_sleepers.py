"""What sleepers hold (issue 20 point 2): host RAM against the host's budget, GPU memory
beside the resident; a sleeper that does not fit is stopped, in the planner's replay
(hence every construction and the evaluator), the simulator and the fleet file."""

from __future__ import annotations

from makespan.models import FleetSpec
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.replay import Replay
from makespan.planner.simulator import fleet_state, simulate
from makespan.planner.sleepers import may_sleep, sleepers_kept
from makespan.workers.host_check import host_memory_mib, host_toml

G0, G1 = "g0", "g1"


def _state(budget: int | None) -> FleetState:
    eps = {
        "a": EndpointModel("a", 1, 24000, 60.0, 5.0, 8.0, 1, asleep_gpu_mib=512, asleep_ram_mib=24000),
        "b": EndpointModel("b", 1, 24000, 60.0, 5.0, 8.0, 1, asleep_gpu_mib=512, asleep_ram_mib=24000),
        "c": EndpointModel("c", 1, 20000, 30.0, 3.0),
        "big": EndpointModel("big", 1, 79800, 200.0, 10.0),
    }
    gpus = [Gpu(G0, "h", 0, 80000), Gpu(G1, "h", 1, 80000)]
    return FleetState(0.0, gpus, eps, resident={G0: "a", G1: "b"},
                      host_ram_mib={"h": budget} if budget is not None else {})


def _job(i: int, ep: str) -> PlanJob:
    return PlanJob(f"j{i}", ep, 1.0, 0.0, 10.0)


def test_host_ram_budget_stops_the_sleeper_that_does_not_fit():
    rep = Replay(_state(budget=30000))
    rep.place(_job(1, "c"), (G0,))
    assert rep.asleep[G0] == frozenset({"a"}) and rep.ram_used["h"] == 24000
    rep.place(_job(2, "c"), (G1,))  # b would need 48000 MiB of sleepers' RAM: stopped
    assert rep.asleep[G1] == frozenset() and rep.ram_used["h"] == 24000
    assert rep.place(_job(3, "a"), (G0,)).load == "wake"
    assert rep.place(_job(4, "b"), (G1,)).load == "cold_start"  # the plan pays for the stop
    unlimited = Replay(_state(budget=None))
    unlimited.place(_job(1, "c"), (G0,))
    unlimited.place(_job(2, "c"), (G1,))
    assert unlimited.asleep[G1] == frozenset({"b"})
    assert unlimited.place(_job(4, "b"), (G1,)).load == "wake"


def test_a_sleeper_that_no_longer_fits_beside_the_resident_is_stopped():
    rep = Replay(_state(budget=None))
    rep.place(_job(1, "c"), (G0,))  # a asleep: 512 MiB beside c's 20000
    assert rep.asleep[G0] == frozenset({"a"})
    rep.place(_job(2, "big"), (G0,))  # 79800 + 512 > 80000: a is stopped
    assert rep.asleep[G0] == frozenset() and rep.ram_used.get("h", 0) == 0
    assert rep.place(_job(3, "a"), (G0,)).load == "cold_start"
    assert sleepers_kept(1000, {"x": 600, "y": 600, "z": 100}) == frozenset({"x", "z"})  # largest (y > x by name) first
    assert may_sleep(0, None, 10**9, 512, 512) and not may_sleep(0, 100, 200, 10**6, 0)


def test_a_sleeper_that_does_not_fit_beside_the_job_s_helpers_is_stopped():
    """The job's helpers count with its main endpoint (planner/helpers.py ``need_mib``), as
    the GPU worker's start phase counts them: beside c (20000) and a helper of 59600 MiB, a
    (512 asleep) no longer fits in 80000 — on a cold load and on a warm one; a job of c
    without helpers keeps it."""
    def with_helper():
        st = _state(budget=None)
        st.endpoints["h2"] = EndpointModel("h2", 1, 59600, 30.0, 3.0)
        return Replay(st)
    helped = PlanJob("j2", "c", 1.0, 0.0, 10.0, helpers=("h2",))
    cold = with_helper()
    cold.place(helped, (G0,))  # a evicted by c: it would sleep, but not beside c + h2
    assert cold.asleep[G0] == frozenset()
    warm = with_helper()
    warm.place(_job(1, "c"), (G0,))  # a asleep beside c alone
    assert warm.asleep[G0] == frozenset({"a"})
    warm.place(_job(3, "c"), (G0,))  # warm, no helpers: kept
    assert warm.asleep[G0] == frozenset({"a"})
    assert warm.place(helped, (G0,)).load == "warm"  # warm with the helper: stopped
    assert warm.asleep[G0] == frozenset()
    assert warm.place(_job(4, "a"), (G0,)).load == "cold_start"  # the plan pays for the stop


def test_models_without_sleeper_costs_replay_as_before():
    """EndpointModels that hold nothing asleep and no budget: the old rule, unchanged."""
    st = _state(None)
    st = FleetState(0.0, st.gpus, {n: EndpointModel(e.name, e.tp, e.memory_mib, e.cold_start_s, e.evict_s, e.wake_s)
                                   for n, e in st.endpoints.items()}, resident=dict(st.resident))
    rep = Replay(st)
    rep.place(_job(1, "big"), (G0,))
    assert rep.asleep[G0] == frozenset({"a"})  # nothing held asleep: it always fits


FLEET = {
    "name": "ram",
    "hosts": [{"name": "h", "gpu_count": 2, "memory_mib": 81920}],
    "endpoints": {
        "a": {"model": "m/a", "memory_mib_per_gpu": 24000, "cold_start_s": 60, "evict_s": 5, "wake_s": 8},
        "b": {"model": "m/b", "memory_mib_per_gpu": 24000, "cold_start_s": 60, "evict_s": 5, "wake_s": 8},
        "c": {"model": "m/c", "memory_mib_per_gpu": 20000, "cold_start_s": 30, "evict_s": 3},
    }}


def test_fleet_file_budget_reaches_the_simulator_and_costs_wakes():
    # a, then b, then two c at once: both sleepers are displaced together (two sleepers' RAM)
    offset_s = {0: 0.0, 1: 200.0, 2: 400.0, 3: 400.0}
    jobs = [PlanJob(f"j{i}", ep, 2.0, (i // 4) * 800.0 + offset_s[i % 4], 50.0, 2, seq=i)
            for i, ep in enumerate(["a", "b", "c", "c"] * 6)]
    # portfolio, a policy that chooses transitions: fifo stops every displaced instance (issue 20 point 3)
    free = simulate(jobs, FleetSpec.model_validate(FLEET), "portfolio", restore=False)
    tight = FleetSpec.model_validate({**FLEET, "hosts": [{**FLEET["hosts"][0], "host_memory_mib": 24000}]})
    st = fleet_state(tight)
    assert st.host_ram_mib == {"h": 24000} and st.endpoints["a"].asleep_ram_mib == 24000
    assert st.endpoints["a"].asleep_gpu_mib == 512 and st.endpoints["c"].asleep_gpu_mib == 0
    budget = simulate(jobs, tight, "portfolio", restore=False)
    assert budget["transitions"]["wake"] < free["transitions"]["wake"], (budget["transitions"], free["transitions"])
    assert budget["transitions"]["cold_start"] > free["transitions"]["cold_start"]


def test_sleep_level_2_holds_no_ram_and_gpus_proposes_a_budget(tmp_path):
    spec = FleetSpec.model_validate({**FLEET, "endpoints": {**FLEET["endpoints"], "a": {
        **FLEET["endpoints"]["a"], "sleep_level": 2, "sleep_gpu_memory_mib": 300}}})
    assert (spec.endpoints["a"].asleep_ram_mib, spec.endpoints["a"].asleep_gpu_mib) == (0, 300)
    assert spec.endpoints["b"].asleep_ram_mib == 24000  # level 1: its weights
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemFree: 1 kB\n")
    assert host_memory_mib(str(meminfo)) == 128000
    assert "host_memory_mib = 64000" in host_toml("h", [], 128000)
