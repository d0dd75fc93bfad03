"""A host whose GPU worker stops consuming is an incident (a new user killed the only GPU
worker with the observer up: the jobs waited with reason ``host_down`` and ``makespan
incidents`` said "no incidents"). Real Redis, the real liveness keys a GPU worker writes
(:mod:`makespan.workers.host_liveness`), the observer's own cycle and the real CLI."""

from __future__ import annotations

from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.models import parse_fleet
from makespan.workers.host_liveness import announce, withdraw
from makespan.workers.observer import Observer, list_incidents

FLEET = parse_fleet({"name": "hosts", "hosts": [{"name": "host-a", "gpu_count": 2, "memory_mib": 81920},
                                                 {"name": "host-b", "gpu_count": 2, "memory_mib": 81920}],
                     "endpoints": {"echo": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 1}}})


def _host_rows(r, keys) -> list[dict]:
    return [i for i in list_incidents(r, keys) if i["failure_mode"] == "host_down"]


def test_a_host_that_loses_its_worker_is_one_incident_until_a_worker_is_back(r, keys, redis_url, prefix):
    first, second = Observer(r, keys, FLEET), Observer(r, keys, FLEET)  # two observers (one per machine)
    try:
        assert first.probe_once() == [] and _host_rows(r, keys) == []  # never announced: not down (bring-up)
        announce(r, keys, "host-a", "worker-1", 30.0)
        announce(r, keys, "host-b", "worker-2", 30.0)
        assert first.probe_once() == []
        r.set(keys.gpu(FLEET.hosts[0].gpus[0].uuid), "lease-1")  # one of host-a's GPUs is leased
        assert withdraw(r, keys, "host-a", "worker-1")  # its worker stops (a crash: the key expires)
        raised = first.probe_once() + second.probe_once() + first.probe_once()
        assert [(i["host"], i["failure_mode"], i["endpoint"]) for i in raised] == [("host-a", "host_down", "")]
        incident = _host_rows(r, keys)[0]
        assert incident["gpus"] == [gpu.uuid for gpu in FLEET.hosts[0].gpus] and incident["recovery"] is None
        assert "1 of its 2 GPUs are leased" in incident["effect"]
        assert "makespan gpu-worker --host host-a" in incident["effect"]

        listed = CliRunner().invoke(cli_app, ["incidents"], env={"MAKESPAN_REDIS_URL": redis_url,
                                                                   "MAKESPAN_KEY_PREFIX": prefix})
        assert listed.exit_code == 0 and "host host-a  host_down" in listed.output, listed.output
        assert "recovery=pending" in listed.output

        announce(r, keys, "host-a", "worker-3", 30.0)  # a worker is back
        assert second.probe_once() == [] and first.probe_once() == []
        rows = _host_rows(r, keys)
        assert len(rows) == 1 and rows[0]["recovery"]["outcome"].startswith("recovered: a GPU worker consumes")
        assert rows[0]["recovery"]["recovery_s"] >= 0.0
        assert len([x for _, x in r.xrange(keys.incidents) if x.get("kind") == "recovery"]) == 1  # once, not twice
        assert not r.exists(keys.incidents_hosts_down)

        assert withdraw(r, keys, "host-a", "worker-3")  # down again: a new incident
        assert [i["host"] for i in second.probe_once()] == ["host-a"]
        assert len(_host_rows(r, keys)) == 2
    finally:
        first.close()
        second.close()
