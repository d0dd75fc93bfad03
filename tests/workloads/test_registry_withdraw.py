"""A GPU worker that stops cleanly withdraws its workload functions (issue 16): while
another live worker holds a name it stays live; when the last one stops, it is not live at
once (not after the 30 s mark runs out), and a submit of it is accepted as a job that
waits for a worker (``waiting_for_function``, a warning naming the hosts that had it: a
rolling restart does not refuse producers, found by a Celery user's check); a name no
worker ever registered is still refused. Real GPU worker processes on real Redis."""

from __future__ import annotations

import logging
import signal
import uuid

import pytest

import makespan
from makespan.keys import Keys
from makespan.live import LiveSystem, delete_prefix, wait_for
from makespan.models import load_fleet
from makespan.redis_conn import connect

FLEET = """
name = "withdraw-test"

[[hosts]]
name = "host-a"
gpu_count = 1
memory_mib = 81920

[[hosts]]
name = "host-b"
gpu_count = 1
memory_mib = 81920

[endpoints.sim]
model = "sim"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
"""


def _stop(system: LiveSystem, name: str) -> None:
    (proc,) = system.kill(name, signal.SIGTERM)
    proc.popen.wait(timeout=60)
    assert proc.popen.returncode == 0, proc.log_path.read_text(errors="replace")[-2000:]


def test_the_last_worker_to_stop_withdraws_its_functions(redis_url, tmp_path, caplog):
    fleet_path = tmp_path / "fleet.toml"
    fleet_path.write_text(FLEET)
    prefix = f"mst-wd-{uuid.uuid4().hex[:8]}"
    settings = makespan.settings.Settings(redis_url=redis_url, key_prefix=prefix, time_scale=0.01,
                                          workload_modules="tests.workloads.fns")
    system = LiveSystem(fleet_path, load_fleet(fleet_path), settings, tmp_path / "logs", observer=False)
    client = makespan.connect(redis_url, key_prefix=prefix, fleet=fleet_path)
    live = client.keys.fn_live("add")
    try:
        system.start_gpu_worker("host-a")
        system.start_gpu_worker("host-b")
        system.wait_workers(90)
        wait_for(lambda: client.r.zcard(client.keys.fn_holders("add")) == 2, 30, "both workers to hold 'add'")
        _stop(system, "gpu-host-a")
        assert client.r.exists(live) and client.r.zcard(client.keys.fn_holders("add")) == 1  # host-b holds it
        assert client.submit("add", 1, 2).created
        _stop(system, "gpu-host-b")
        ttl_ms = client.r.pttl(live)
        assert ttl_ms == -2, f"'add' is still live for {ttl_ms} ms after the last worker stopped"
        with caplog.at_level(logging.WARNING, logger="makespan.client"):
            waiting = client.submit("add", 1, 2)
        assert waiting.status()["state"] == "queued"
        assert "waits, queued, until a GPU worker registers the function again" in caplog.text
        assert "host-a, host-b registered it last" in caplog.text
        with pytest.raises(makespan.ValidationError, match="no live GPU worker registered this workload"):
            client.submit("never_registered", 1, 2)
    finally:
        system.stop()
        client.close()
        r = connect(redis_url)
        delete_prefix(r, Keys(prefix))
        r.close()
