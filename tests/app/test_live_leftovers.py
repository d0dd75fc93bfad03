"""LiveSystem.stop() leaves no process of its own behind: a child of an endpoint server
that ignores SIGTERM outlived a run of the chaos test in CI (2026-12-05): the GPU worker
stopping it had already forgotten the instance and was killed before its SIGKILL, so
neither the worker nor ``stop_instances`` knew of it. ``stop()`` now kills what still
carries the system's mark (``MAKESPAN_LIVE_SYSTEM_ID``), and nothing else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.workers.drivers.pids import process_alive
from makespan.workers.endpoint_server import _STUBBORN_CHILD
from tests.conftest import FLEET_TOML
from tests.live import wait_for


def _stubborn(env: dict[str, str]) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", _STUBBORN_CHILD], env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, start_new_session=True)
    child.stdout.readline()  # 'ready': SIGTERM is ignored from now on
    child.stdout.close()
    return child


def test_stop_kills_a_marked_process_that_ignores_sigterm_and_spares_others(settings, tmp_path):
    system = LiveSystem(Path(FLEET_TOML), load_fleet(FLEET_TOML), settings, tmp_path / "logs", observer=False)
    other = LiveSystem(Path(FLEET_TOML), load_fleet(FLEET_TOML), settings, tmp_path / "logs2", observer=False)
    ours, theirs = _stubborn(system._env()), _stubborn(other._env())
    try:
        system.stop(grace_s=0.1)
        wait_for(lambda: ours.poll() is not None, 30, "the marked process to be killed")
        assert ours.returncode == -9
        assert process_alive(theirs.pid), "another system's process was killed"
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait(timeout=30)
