"""SIGHUP, as a log rotator's ``postrotate kill -HUP`` or a ``systemctl reload`` sends it:
the planner and the observer died of it without a line (Python's default action), and a
detached Celery GPU worker warm-restarted by re-executing itself, past makespan's shutdown:
it stayed live while taking no job, and a later SIGTERM started a new worker instead of
stopping (a production-deployment helper). Each now ignores it and says so on stderr; the
GPU worker still runs jobs after it and stops on SIGTERM. Real processes on real Redis."""

from __future__ import annotations

import signal
import uuid

import pytest

import makespan
from makespan.keys import Keys
from makespan.live import LiveSystem, delete_prefix, wait_for
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect
from tests.workloads.test_refused_workload import FLEET


@pytest.fixture
def system(redis_url, tmp_path):
    fleet_path = tmp_path / "fleet.toml"
    fleet_path.write_text(FLEET)
    prefix = f"mst-hup-{uuid.uuid4().hex[:8]}"
    settings = makespan.settings.Settings(redis_url=redis_url, key_prefix=prefix, time_scale=0.01)
    live = LiveSystem(fleet_path, load_fleet(fleet_path), settings, tmp_path / "logs", planners=1)
    try:
        live.start(wait_s=120)
        yield live
    finally:
        live.stop()
        r = connect(redis_url)
        delete_prefix(r, Keys(prefix))
        r.close()


def test_sighup_is_ignored_by_the_planner_the_observer_and_the_gpu_worker(system):
    r = connect(system.settings.redis_url)
    keys = Keys(system.settings.key_prefix)
    for name in ("planner", "observer", "gpu-host-a"):
        (proc,) = system.kill(name, signal.SIGHUP)
        wait_for(lambda proc=proc: "SIGHUP ignored" in proc.log_path.read_text(errors="replace"), 30,
                 f"{name} to say it ignored SIGHUP")
        assert proc.alive(), name
    worker = next(p for p in system.procs if p.name.startswith("gpu-host-a"))
    assert "Restarting celery worker" not in worker.log_path.read_text(errors="replace")
    job = Producer(r, keys, system.fleet, system.settings).submit({"endpoint": "sim", "service_s": 1}).id
    wait_for(lambda: r.hget(keys.job(job), "state") == "completed", 60, "a job after the SIGHUPs")
    (worker,) = system.kill("gpu-host-a", signal.SIGTERM)
    assert worker.popen.wait(timeout=60) == 0
    assert worker.log_path.read_text(errors="replace").count("celery@") <= 1  # no second worker started
    r.close()
