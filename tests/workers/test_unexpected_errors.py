"""The GPU worker against errors no phase anticipated (real Redis, the real phase code).

A GPU worker started with a fleet file that differs from the planner's (an endpoint it
lacks, another host name or GPU UUIDs, another tensor-parallel size) got a lease the
planner's fleet allows: the phase code raised ``KeyError`` (``self.fleet.endpoints[...]``),
the exception left the Celery task, and the lease was held until its TTL; its reclaim
requeued the job, the planner leased it to the same host again, and so on until
``max_attempts`` was spent, the job's reason never naming the fleet. Now the first phase
fails the job at once with a reason that names the missing piece and both fleet versions,
and releases the lease (fenced) in the same commit.

More generally any exception that is not one a phase expects (a plug-in driver's own
``RuntimeError``, a bug) escaped :meth:`PhaseRunner.run` and :func:`run_warm` the same way:
the job stayed ``leased``/``running`` with its GPUs held to the TTL and no reason. Now one
catch (:meth:`PhaseRunner.guarded`) fails it through the normal path: reason with the
error's type, message and place, traceback in its final event, lease released at once. A
Redis error still passes (nothing could be recorded; the lease's expiry requeues the job).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from makespan.driver_registry import DRIVERS, ENTRY_POINT_GROUP
from makespan.models import fleet_version, parse_fleet
from makespan.producer import Producer
from makespan.workers.drivers.base import Instance
from makespan.workers.drivers.registry import list_instances, register_instance
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner, instance_value, restore_failure
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.warm import run_phases, run_warm
from tests.live import all_events


def _fleet_data() -> dict:
    return {"name": "planner", "hosts": [{"name": "h1", "gpus": [
        {"uuid": "GPU-h1-0", "memory_mib": 80000, "index": 0}, {"uuid": "GPU-h1-1", "memory_mib": 80000, "index": 1}]}],
        "endpoints": {name: {"model": name, "memory_mib_per_gpu": 10000, "cold_start_s": 5, "evict_s": 1}
                      for name in ("a", "b")}}


def _publish(r, keys, fleet) -> None:
    """What a planner leading with ``fleet`` writes (P:fleet, its version)."""
    r.mset({keys.fleet: fleet.model_dump_json(), keys.fleet_version: fleet_version(fleet)})


def _planned(r, keys, settings, fleet, endpoint: str):
    """Submit a job for ``endpoint`` and let a real planner tick lease it (dispatch
    captured): ``(planner, ctx)``."""
    _publish(r, keys, fleet)
    job_id = Producer(r, keys, fleet, settings).submit({"endpoint": endpoint, "service_s": 5}).id
    sent: list[PhaseContext] = []
    planner = PlannerWorker(r, settings, fleet, dispatch=lambda ctx, q: sent.append(ctx))
    planner.token = str(r.incr(planner.keys.planner_fence))
    planner.tick()
    assert [c.job_id for c in sent] == [job_id]
    return planner, sent[0]


def _released(r, keys, ctx) -> None:
    """The lease and its GPUs are free now (not at the TTL) and the job left the running set."""
    assert not r.exists(keys.lease(ctx.lease_id)) and r.zscore(keys.leases, ctx.lease_id) is None
    assert r.mget([keys.gpu(g) for g in ctx.gpus]) == [None] * len(ctx.gpus)
    assert not r.exists(keys.busy(ctx.lease_id)) and r.zscore(keys.running, ctx.job_id) is None


def _final_event(r, keys, job_id: str) -> dict:
    [event] = [e for e in all_events(r, keys) if e.get("job") == job_id and e["kind"] in ("failed", "completed")]
    return event


# -- a GPU worker whose fleet differs from the planner's ----------------------------------------
@pytest.mark.parametrize("path", [run_phases, run_warm], ids=["phases", "warm"])
def test_a_job_for_an_endpoint_the_workers_fleet_lacks_fails_at_once_saying_why(r, keys, settings, path):
    planner_fleet = parse_fleet(_fleet_data())
    data = _fleet_data()
    del data["endpoints"]["b"]
    worker_fleet = parse_fleet(data)  # the GPU worker started with an older fleet file
    planner, ctx = _planned(r, keys, settings, planner_fleet, "b")
    if path is run_warm:  # as if b were resident there (a worker with the planner's fleet started it)
        r.mset({keys.resident(g): instance_value("b", ctx.gpus) for g in ctx.gpus})

    assert path(PhaseRunner(r, settings, worker_fleet), ctx) == "failed"  # raised KeyError: 'b' before

    rec = r.hgetall(keys.job(ctx.job_id))
    assert rec["state"] == "failed" and int(rec.get("attempts") or 0) == 0, rec
    assert rec["reason"] == (
        f"evict: this GPU worker's fleet (version {fleet_version(worker_fleet)}) has no endpoint 'b'; it differs "
        f"from the planner's (version {fleet_version(planner_fleet)}): start the planner and the GPU workers with "
        "the same fleet file")
    assert _final_event(r, keys, ctx.job_id)["reason"] == rec["reason"]
    _released(r, keys, ctx)
    # nothing of the lease ran: no phase ended, no instance started
    assert not [e for e in all_events(r, keys) if e.get("lease") == ctx.lease_id and e["kind"] == "phase_end"]
    assert list_instances(r, keys) == []
    planner.tick()  # the job is not requeued (and leased to the same worker again)
    assert planner.check_drain()["leases"] == 0 and r.zcard(keys.queue("NORMAL")) == 0


def _other_host(data: dict) -> None:
    data["hosts"][0]["name"] = "h9"


def _other_gpus(data: dict) -> None:
    for g in data["hosts"][0]["gpus"]:
        g["uuid"] = g["uuid"].replace("h1", "x1")


def _tensor_parallel_2(data: dict) -> None:
    data["endpoints"]["a"]["tensor_parallel"] = 2


@pytest.mark.parametrize(("change", "says"), [
    (_other_host, "has no host 'h1'"),
    (_other_gpus, "has no GPU GPU-h1-"),
    (_tensor_parallel_2, "gives endpoint 'a' tensor_parallel 2, but its lease holds 1 GPUs"),
], ids=["host", "gpus", "tensor_parallel"])
def test_a_lease_on_hosts_or_gpus_the_workers_fleet_does_not_have_fails_saying_why(r, keys, settings, change, says):
    data = _fleet_data()
    change(data)
    worker_fleet = parse_fleet(data)
    _planner, ctx = _planned(r, keys, settings, parse_fleet(_fleet_data()), "a")
    assert run_phases(PhaseRunner(r, settings, worker_fleet), ctx) == "failed"
    reason = r.hget(keys.job(ctx.job_id), "reason")
    assert reason.startswith(f"evict: this GPU worker's fleet (version {fleet_version(worker_fleet)}) {says}"), reason
    assert "differs from the planner's" in reason
    _released(r, keys, ctx)


PLANNER_FLEET = """
name = "planner"
[[hosts]]
name = "h1"
gpu_count = 1
memory_mib = 80000
[endpoints.a]
model = "a"
memory_mib_per_gpu = 10000
cold_start_s = 1
evict_s = 1
[endpoints.b]
model = "b"
memory_mib_per_gpu = 10000
cold_start_s = 1
evict_s = 1
"""


def test_a_gpu_worker_process_with_an_older_fleet_file_is_not_given_the_job(r, keys, settings, tmp_path):
    """The same through real processes: a planner with the new fleet file, a ``makespan
    gpu-worker`` with the old one (without ``b``). Before, the job was leased, the phase task
    raised ``KeyError: 'b'``, the lease expired and was reclaimed, max_attempts times, and the
    job failed with the reclaim's reason; then the worker failed it at its first lease; now
    the worker publishes its fleet's version and the planner leaves the job queued
    (``host_fleet_differs``, makespan.workers.worker_fleets) until a worker can run it."""
    from makespan.live import LiveSystem
    from makespan.models import load_fleet
    from tests.live import stop_checked, wait_for

    planner_path, worker_path = tmp_path / "planner.toml", tmp_path / "worker.toml"
    planner_path.write_text(PLANNER_FLEET)
    worker_path.write_text(PLANNER_FLEET.replace('name = "planner"', 'name = "older"').split("[endpoints.b]")[0])
    planner_fleet, worker_fleet = load_fleet(planner_path), load_fleet(worker_path)
    worker = LiveSystem(worker_path, worker_fleet, settings, tmp_path / "logs", planners=0, observer=False)
    planner = LiveSystem(planner_path, planner_fleet, settings, tmp_path / "logs", planners=1, observer=False)
    try:
        worker.start_gpu_worker("h1")
        worker.wait_workers(120)
        planner.start_planner()
        wait_for(lambda: r.get(keys.fleet_version) == fleet_version(planner_fleet), 60, "the planner to publish")
        job_id = Producer(r, keys, planner_fleet, settings).submit({"endpoint": "b", "service_s": 1}).id
        wait_for(lambda: r.hget(keys.job(job_id), "wait_reason") == "host_fleet_differs", 60, "the job's reason")
        rec = r.hgetall(keys.job(job_id))
        assert rec["state"] == "queued" and f"h1 (fleet version {fleet_version(worker_fleet)}; no 'b')" in rec["wait_detail"]
        kinds = [e["kind"] for e in all_events(r, keys) if e.get("job") == job_id]
        assert "leased" not in kinds, kinds
        # and a job the worker's fleet has still runs there
        ok = Producer(r, keys, planner_fleet, settings).submit({"endpoint": "a", "service_s": 1}).id
        wait_for(lambda: r.hget(keys.job(ok), "state") == "completed", 60, "the job of endpoint a to complete")
        # these test settings (lease TTL 3 s, heartbeat 0.5 s, the default 5 s socket timeout) are
        # warned of as the worker starts (makespan.settings.lease_renewal_warning)
        log_text = worker.procs[0].log_path.read_text(errors="replace")
        assert "MAKESPAN_REDIS_SOCKET_TIMEOUT_S (5 s) is too long for MAKESPAN_LEASE_TTL_S (3 s)" in log_text
    finally:
        stop_checked(planner)
        stop_checked(worker)


def test_the_same_fleet_runs_the_job(r, keys, settings):
    fleet = parse_fleet(_fleet_data())
    _planner, ctx = _planned(r, keys, settings, fleet, "b")
    assert run_phases(PhaseRunner(r, settings, fleet), ctx) == "completed"


def test_the_fleet_check_reads_the_job_s_helpers_in_the_first_phase_only(r, keys, settings):
    """The check compares the lease with this worker's fleet without Redis; only the job's
    helper endpoints are read from its record, once, in the first phase (evict, before
    anything changes). Before, every phase read them again: one round trip more per phase
    of every cold job (four per job), which the start phase then repeated itself."""
    import redis

    fleet = parse_fleet(_fleet_data())
    _planner, ctx = _planned(r, keys, settings, fleet, "b")
    helper_reads: list[str] = []

    class Recording(redis.Redis):
        def execute_command(self, *args, **options):
            if args[:2] == ("HMGET", keys.job(ctx.job_id)) and "helpers" in args[2:]:
                helper_reads.append(phase)
            return super().execute_command(*args, **options)

    runner = PhaseRunner(Recording(connection_pool=r.connection_pool), settings, fleet)
    outcomes = []
    for phase in ("evict", "start_endpoint", "execute", "clear"):
        outcomes.append(runner.run(ctx, phase))
    assert outcomes == ["done", "done", "done", "completed"]
    # evict: the fleet check; start_endpoint: the start of the helpers (its own read)
    assert helper_reads == ["evict", "start_endpoint"], helper_reads


# -- any error no phase anticipated ----------------------------------------------------------------
BUGGY_MODULE = '''
from makespan.driver_registry import DriverCapabilities
from makespan.workers.drivers.simulated import SimulatedDriver


class BuggyDriver(SimulatedDriver):
    """A plug-in driver with bugs: its start and is_alive raise RuntimeError (no PhaseError)."""

    name = "buggy"
    capabilities = DriverCapabilities(spawns_process=True)

    def start(self, endpoint, gpus, time_scale=1.0, host="", on_spawn=None):
        raise RuntimeError("bug in the buggy driver's start")

    def is_alive(self, instance):
        raise RuntimeError("bug in the buggy driver's is_alive")
'''


@pytest.fixture
def buggy_driver(tmp_path):
    """The plug-in driver ``buggy`` installed through the ``makespan.drivers`` entry points."""
    root = tmp_path / "site"
    (root / "buggy_drivers").mkdir(parents=True)
    (root / "buggy_drivers" / "__init__.py").write_text(BUGGY_MODULE)
    info = root / "buggy_drivers-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: buggy-drivers\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nbuggy = buggy_drivers:BuggyDriver\n")
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    DRIVERS.refresh()
    try:
        yield "buggy"
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("buggy_drivers", None)
        importlib.invalidate_caches()
        DRIVERS.refresh()


def _buggy_fleet():
    data = _fleet_data()
    data["endpoints"]["b"]["launch"] = {"driver": "buggy", "command": ["true"]}
    return parse_fleet(data)


def _acquire(r, keys, job_id: str, lease_id: str, gpu: str, kind: str = "job"):
    queue = keys.queue("NORMAL") if kind == "job" else ""
    lease = LeaseStore(r, keys).acquire(lease_id, (gpu,), 30.0, job_id=job_id, kind=kind, holder="h1", queue=queue,
                                        instance=instance_value("b", [gpu]))
    assert lease is not None
    return lease


def test_an_unexpected_error_in_a_phase_fails_the_job_and_releases_the_lease(r, keys, settings, buggy_driver):
    fleet = _buggy_fleet()
    job_id = Producer(r, keys, fleet, settings).submit({"endpoint": "b", "service_s": 5}).id
    lease = _acquire(r, keys, job_id, "L1", "GPU-h1-0")
    ctx = PhaseContext("L1", lease.token, ["GPU-h1-0"], "h1", "job", "b", job_id, "NORMAL", 5.0)

    assert run_phases(PhaseRunner(r, settings, fleet), ctx) == "failed"  # the RuntimeError escaped before

    rec = r.hgetall(keys.job(job_id))
    assert rec["state"] == "failed", rec
    assert rec["reason"].startswith("start_endpoint: unexpected error in the GPU worker on h1: RuntimeError: bug in "
                                    "the buggy driver's start at __init__.py:"), rec["reason"]
    assert "in start (traceback in the worker's log and the job's 'failed' event)" in rec["reason"]
    event = _final_event(r, keys, job_id)
    assert event["kind"] == "failed" and event["reason"] == rec["reason"]
    assert "Traceback (most recent call last)" in event["traceback"]
    assert "RuntimeError: bug in the buggy driver's start" in event["traceback"]
    _released(r, keys, ctx)
    assert [e["phase"] for e in all_events(r, keys) if e.get("lease") == "L1" and e["kind"] == "phase_end"] == \
        ["evict"]


def test_an_unexpected_error_on_the_warm_path_fails_the_running_job_and_releases_the_lease(r, keys, settings,
                                                                                          buggy_driver):
    fleet = _buggy_fleet()
    gpu = "GPU-h1-1"
    register_instance(r, keys, Instance("b", [gpu], "buggy", host="h1", url="http://127.0.0.1:9", pid=0, id="i1"))
    r.set(keys.resident(gpu), instance_value("b", [gpu]))
    job_id = Producer(r, keys, fleet, settings).submit({"endpoint": "b", "service_s": 5}).id
    lease = _acquire(r, keys, job_id, "L2", gpu)
    assert lease.warm
    ctx = PhaseContext("L2", lease.token, [gpu], "h1", "job", "b", job_id, "NORMAL", 5.0)

    assert run_warm(PhaseRunner(r, settings, fleet), ctx) == "failed"  # the job stayed 'running' before

    rec = r.hgetall(keys.job(job_id))
    assert rec["state"] == "failed" and "started_at" in rec, rec
    assert rec["reason"].startswith("execute: unexpected error in the GPU worker on h1: RuntimeError: bug in the "
                                    "buggy driver's is_alive at __init__.py:"), rec["reason"]
    assert "RuntimeError: bug in the buggy driver's is_alive" in _final_event(r, keys, job_id)["traceback"]
    _released(r, keys, ctx)


def test_an_unexpected_error_in_a_restore_fails_it_and_releases_the_lease(r, keys, settings, buggy_driver):
    fleet = _buggy_fleet()
    lease = LeaseStore(r, keys).acquire("R1", ("GPU-h1-0",), 30.0, kind="restore", holder="h1")
    assert lease is not None
    ctx = PhaseContext("R1", lease.token, ["GPU-h1-0"], "h1", "restore", "b")
    runner = PhaseRunner(r, settings, fleet)
    assert runner.run(ctx, "evict") == "done"
    assert runner.run(ctx, "restore") == "failed"
    [end] = [e for e in all_events(r, keys) if e["kind"] == "restore_end"]
    assert end["outcome"] == "failed" and "RuntimeError: bug in the buggy driver's start" in end["reason"]
    assert "Traceback (most recent call last)" in end["traceback"]
    assert r.get(keys.restore_failed("GPU-h1-0")) == "1"  # the usual backoff of a failed restore
    assert restore_failure(r.get(keys.restore_failures("GPU-h1-0")))["failures"] == 1
    assert not r.exists(keys.lease("R1")) and r.get(keys.gpu("GPU-h1-0")) is None


def test_a_redis_error_still_leaves_the_lease_to_its_expiry(r, keys, settings):
    """Redis did not answer: nothing can be recorded, so the error passes (the task fails;
    the lease expires and its reclaim requeues the job), as before."""
    import redis

    from makespan.errors import StoreError

    fleet = parse_fleet(_fleet_data())
    job_id = Producer(r, keys, fleet, settings).submit({"endpoint": "a", "service_s": 5}).id
    lease = _acquire(r, keys, job_id, "L3", "GPU-h1-0")
    ctx = PhaseContext("L3", lease.token, ["GPU-h1-0"], "h1", "job", "a", job_id, "NORMAL", 5.0)
    runner = PhaseRunner(r, settings, fleet)

    def outage() -> str:
        raise redis.ConnectionError("Redis went away")

    with pytest.raises(redis.ConnectionError):
        runner.guarded(ctx, "execute", outage)
    with pytest.raises(StoreError):
        runner.guarded(ctx, "execute", lambda: (_ for _ in ()).throw(StoreError("Redis went away")))
    assert r.hget(keys.job(job_id), "state") == "leased" and r.exists(keys.lease("L3"))


def test_the_reason_of_an_unexpected_error_is_one_line_and_bounded(r, keys, settings):
    fleet = parse_fleet(_fleet_data())
    job_id = Producer(r, keys, fleet, settings).submit({"endpoint": "a", "service_s": 5}).id
    lease = _acquire(r, keys, job_id, "L4", "GPU-h1-0")
    ctx = PhaseContext("L4", lease.token, ["GPU-h1-0"], "h1", "job", "a", job_id, "NORMAL", 5.0)

    def bug() -> str:
        raise ValueError("first line\nsecond line " + "x" * 5000)

    assert PhaseRunner(r, settings, fleet).guarded(ctx, "execute", bug) == "failed"
    reason = r.hget(keys.job(job_id), "reason")
    assert reason.startswith("execute: unexpected error in the GPU worker on h1: ValueError: first line second line xx")
    assert "\n" not in reason and len(reason) < 1300
    assert f" at {Path(__file__).name}:" in reason and " in bug (traceback" in reason
    assert "x" * 5000 in _final_event(r, keys, job_id)["traceback"]  # the whole message is in the traceback
