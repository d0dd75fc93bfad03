"""A GPU worker does not publish as live a workload function that names an endpoint its
fleet lacks, and says why: `makespan ready NAME` printed "ready" for it while every submit
was refused (`job.endpoint: unknown endpoint`), and the worker only logged an error (found
by a new-user check). Its Ctrl-C (SIGINT) is named as such in the shutdown line. Real GPU
worker processes on real Redis."""

from __future__ import annotations

import signal
import uuid

import pytest
from typer.testing import CliRunner

import makespan
from makespan.cli import app as cli_app
from makespan.keys import Keys
from makespan.live import LiveSystem, delete_prefix, wait_for
from makespan.models import load_fleet
from makespan.redis_conn import connect

FLEET = """
name = "refused-test"

[[hosts]]
name = "host-a"
gpu_count = 1
memory_mib = 81920

[endpoints.sim]
model = "sim"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
"""


@pytest.fixture
def worker(redis_url, tmp_path, monkeypatch):
    fleet_path = tmp_path / "fleet.toml"
    fleet_path.write_text(FLEET)
    prefix = f"mst-rf-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("MAKESPAN_REDIS_URL", redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", prefix)
    settings = makespan.settings.Settings(redis_url=redis_url, key_prefix=prefix, time_scale=0.01,
                                          workload_modules="tests.workloads.fns,tests.workloads.fns_badep")
    system = LiveSystem(fleet_path, load_fleet(fleet_path), settings, tmp_path / "logs", observer=False)
    client = makespan.connect(redis_url, key_prefix=prefix, fleet=fleet_path)
    try:
        system.start_gpu_worker("host-a")
        system.wait_workers(90)
        wait_for(lambda: client.r.exists(client.keys.fn_live("add")), 30, "the worker to publish 'add'")
        yield system, client
    finally:
        system.stop()
        client.close()
        r = connect(redis_url)
        delete_prefix(r, Keys(prefix))
        r.close()


def test_a_function_naming_an_unknown_endpoint_is_not_ready_and_says_why(worker):
    _system, client = worker
    assert not client.r.exists(client.keys.fn_live("badep"))
    res = CliRunner().invoke(cli_app, ["ready", "add", "badep", "--timeout-s", "30"])
    assert res.exit_code == 1, res.output
    assert "'badep'" in res.output and "names endpoint 'nope', which the fleet does not have" in res.output
    with pytest.raises(makespan.ValidationError, match="names endpoint 'nope'"):
        client.submit("badep")


def test_ctrl_c_on_a_gpu_worker_names_sigint(worker):
    system, _client = worker
    (proc,) = system.kill("gpu-host-a", signal.SIGINT)
    proc.popen.wait(timeout=60)
    log_text = proc.log_path.read_text(errors="replace")
    assert "makespan gpu-worker: SIGINT; ending within" in log_text, log_text[-2000:]
    assert "SIGTERM; ending within" not in log_text
