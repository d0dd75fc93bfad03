"""A host whose GPU worker stops consuming is an incident (a new user killed the only GPU
worker with the observer up: the jobs waited with reason ``host_down`` and ``makespan
incidents`` said "no incidents"). Real Redis, the real liveness keys a GPU worker writes
(:mod:`makespan.workers.host_liveness`), the observer's own cycle and script, the real CLI.
The grace is on the Redis server's clock: the tests use 0 s (at once) or an hour (never
within the test), no sleep."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from makespan import metrics
from makespan.cli import app as cli_app
from makespan.models import parse_fleet
from makespan.workers.host_liveness import announce, cordon, uncordon, withdraw
from makespan.workers.observer import Observer, list_incidents

HOSTS = [{"name": "host-a", "gpu_count": 2, "memory_mib": 81920}, {"name": "host-b", "gpu_count": 2, "memory_mib": 81920}]
ENDPOINTS = {"echo": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 1}}
FLEET = parse_fleet({"name": "hosts", "hosts": HOSTS, "endpoints": ENDPOINTS})
ONLY_A = parse_fleet({"name": "hosts", "hosts": HOSTS[:1], "endpoints": ENDPOINTS})


def _host_rows(r, keys) -> list[dict]:
    return [i for i in list_incidents(r, keys) if i["failure_mode"] == "host_down"]


def _counted(host: str) -> float:
    return metrics._m().registry.get_sample_value("makespan_host_down_incidents_total", {"host": host}) or 0.0


def test_a_host_that_loses_its_worker_is_one_incident_until_a_worker_is_back(r, keys, redis_url, prefix):
    first, second = Observer(r, keys, FLEET, host_down_grace_s=0.0), Observer(r, keys, FLEET, host_down_grace_s=0.0)
    try:
        assert first.probe_once() == [] and _host_rows(r, keys) == []  # never announced: not down (bring-up)
        announce(r, keys, "host-a", "worker-1", 30.0)
        announce(r, keys, "host-b", "worker-2", 30.0)
        assert first.probe_once() == []
        r.set(keys.gpu(FLEET.hosts[0].gpus[0].uuid), "lease-1")  # one of host-a's GPUs is leased
        before = _counted("host-a")
        assert withdraw(r, keys, "host-a", "worker-1")  # its worker stops (a crash: the key expires)
        raised = first.probe_once() + second.probe_once() + first.probe_once()  # at once (grace 0), and once
        assert [(i["host"], i["failure_mode"], i["endpoint"]) for i in raised] == [("host-a", "host_down", "")]
        assert _counted("host-a") == before + 1
        incident = _host_rows(r, keys)[0]
        assert incident["gpus"] == [gpu.uuid for gpu in FLEET.hosts[0].gpus] and incident["recovery"] is None
        assert incident["incident_id"] == raised[0]["incident_id"]
        assert "1 of its 2 GPUs are leased" in incident["effect"]
        assert "makespan gpu-worker --fleet FLEET --host host-a --workloads MODULES" in incident["effect"]

        listed = CliRunner().invoke(cli_app, ["incidents"], env={"MAKESPAN_REDIS_URL": redis_url,
                                                                   "MAKESPAN_KEY_PREFIX": prefix})
        assert listed.exit_code == 0 and "host host-a  host_down" in listed.output, listed.output
        assert "recovery=pending" in listed.output

        announce(r, keys, "host-a", "worker-3", 30.0)  # a worker is back
        assert second.probe_once() == [] and first.probe_once() == []
        rows = _host_rows(r, keys)
        assert len(rows) == 1 and rows[0]["recovery"]["outcome"] == "recovered: a GPU worker consumes its queue again"
        assert rows[0]["recovery"]["recovery_s"] >= 0.0
        assert len([x for _, x in r.xrange(keys.incidents) if x.get("kind") == "recovery"]) == 1  # once, not twice
        assert not r.exists(keys.incidents_hosts_down)

        assert withdraw(r, keys, "host-a", "worker-3")  # down again: a new incident
        assert [i["host"] for i in second.probe_once() + second.probe_once()] == ["host-a"]
        assert len(_host_rows(r, keys)) == 2
    finally:
        first.close()
        second.close()


def test_a_host_back_within_the_grace_is_no_incident(r, keys):
    """A rolling restart, or one of two workers of a host stopping (the other renews the
    shared key within a quarter TTL): down for less than the grace, nothing is reported."""
    observer = Observer(r, keys, FLEET, host_down_grace_s=3600.0)
    try:
        announce(r, keys, "host-a", "worker-1", 30.0)
        assert withdraw(r, keys, "host-a", "worker-1")
        assert observer.probe_once() == [] and observer.probe_once() == []
        assert r.hget(keys.incidents_hosts_down, "host-a").startswith("since:")  # down, not reported yet
        announce(r, keys, "host-a", "worker-2", 30.0)
        assert observer.probe_once() == []
        assert not r.exists(keys.incidents_hosts_down) and r.xlen(keys.incidents) == 0  # no incident, no recovery
    finally:
        observer.close()


def test_an_observer_leaves_hosts_outside_its_fleet_file_to_the_others(r, keys):
    """During a fleet-file rollout one observer's file may lack a host another's has: it
    neither closes that host's incident nor reopens it; the incident closes only when the
    published fleet no longer has the host."""
    full, partial = Observer(r, keys, FLEET, host_down_grace_s=0.0), Observer(r, keys, ONLY_A, host_down_grace_s=0.0)
    try:
        r.set(keys.fleet, FLEET.model_dump_json())  # what the planner publishes
        announce(r, keys, "host-b", "worker-1", 30.0)
        assert withdraw(r, keys, "host-b", "worker-1")
        assert [i["host"] for i in full.probe_once() + full.probe_once()] == ["host-b"]
        for _ in range(3):
            assert partial.probe_once() == [] and full.probe_once() == []
        rows = _host_rows(r, keys)
        assert len(rows) == 1 and rows[0]["recovery"] is None  # no flapping between the two files

        r.set(keys.fleet, json.dumps({**json.loads(FLEET.model_dump_json()), "hosts": [HOSTS[0]]}))  # host-b removed
        assert partial.probe_once() == []
        rows = _host_rows(r, keys)
        assert rows[0]["recovery"]["outcome"] == "recovered: the host left the published fleet"
        assert not r.exists(keys.incidents_hosts_down)
        # the observer still on the old file (it lists host-b) neither raises it again nor flaps
        for _ in range(3):
            assert full.probe_once() == [] and partial.probe_once() == []
        assert len(_host_rows(r, keys)) == 1 and not r.exists(keys.incidents_hosts_down)
    finally:
        full.close()
        partial.close()


def test_a_cordoned_host_s_stopped_worker_is_no_incident(r, keys, redis_url, prefix):
    """An operator cordons a host, waits for it to drain and stops its GPU worker: out of
    service on purpose, no ``host_down``; a cordoned host whose worker dies under a running
    lease is one, until a worker is back. Cordoning a host whose incident is open closes it;
    uncordoning a host whose worker is still stopped makes it an incident again."""
    observer = Observer(r, keys, FLEET, host_down_grace_s=0.0)
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    try:
        r.set(keys.fleet, FLEET.model_dump_json())
        for host in ("host-a", "host-b"):
            announce(r, keys, host, f"worker-{host}", 30.0)
        done = CliRunner().invoke(cli_app, ["cordon", "host-a", "--reason", "new NICs"], env=env)
        assert done.exit_code == 0 and "cordoned host host-a" in done.output and "drained" in done.output, done.output
        assert withdraw(r, keys, "host-a", "worker-host-a")  # the operator stops its worker
        for _ in range(3):
            assert observer.probe_once() == []
        assert _host_rows(r, keys) == [] and not r.exists(keys.incidents_hosts_down)
        hosts = CliRunner().invoke(cli_app, ["hosts", "--json"], env=env)
        assert hosts.exit_code == 0, hosts.output
        rows = {row["host"]: row for row in map(json.loads, hosts.output.splitlines())}
        # the cordon's reason, then (no planner runs here) that none leads, as on every host
        assert (rows["host-a"]["state"], rows["host-a"]["worker"], rows["host-a"]["reason"].split("; ")[0]) == \
            ("drained", "down", "new NICs")
        assert (rows["host-b"]["state"], rows["host-b"]["worker"]) == ("schedulable", "live")

        # cordoned, but a lease still runs there when its worker dies (its key expires: no
        # withdraw): an incident all the same
        r.set(keys.gpu(FLEET.hosts[1].gpus[0].uuid), "lease-b")
        cordon(r, keys, "host-b", "drain for a kernel update")
        r.delete(keys.host_live("host-b"))  # as the TTL does after a SIGKILL
        assert [i["host"] for i in observer.probe_once()] == ["host-b"]
        r.delete(keys.gpu(FLEET.hosts[1].gpus[0].uuid))  # its lease expires and is reclaimed
        assert observer.probe_once() == []
        # still an incident: the worker died under a running lease, not stopped on purpose (with the
        # default TTLs the leases expire before the grace ends: a crash looked like a clean drain)
        assert _host_rows(r, keys)[-1]["recovery"] is None
        announce(r, keys, "host-b", "worker-host-b2", 30.0)  # a worker is back
        assert observer.probe_once() == []
        assert _host_rows(r, keys)[-1]["recovery"]["outcome"].startswith("recovered: a GPU worker")

        assert uncordon(r, keys, "host-a") is not None  # back in service, but no worker: now it is down
        assert [i["host"] for i in observer.probe_once()] == ["host-a"]
        cordon(r, keys, "host-a", "still waiting for the NICs")  # cordoned again: the incident closes
        assert observer.probe_once() == []
        row = next(i for i in _host_rows(r, keys) if i["host"] == "host-a")
        assert row["recovery"]["outcome"] == "closed: the host was cordoned (out of service on purpose)"
        assert not r.exists(keys.incidents_hosts_down)
    finally:
        observer.close()



def test_a_host_down_recovery_gives_the_outage_not_the_time_since_the_incident(r, keys):
    """An operator read "recovered ... in 8 s" for a host down 49 s: the figure ran from the
    incident (a grace after the outage began). It runs from when the host was first seen down."""
    observer = Observer(r, keys, FLEET, host_down_grace_s=50.0)
    try:
        announce(r, keys, "host-a", "worker-1", 30.0)
        assert withdraw(r, keys, "host-a", "worker-1")
        assert observer.probe_once() == []  # seen down now: within the grace
        seconds, micros = r.time()
        r.hset(keys.incidents_hosts_down, "host-a", f"since:{seconds + micros / 1e6 - 100.0:.6f}")  # 100 s ago
        assert [i["host"] for i in observer.probe_once()] == ["host-a"]  # past the grace: reported
        announce(r, keys, "host-a", "worker-2", 30.0)
        assert observer.probe_once() == []
        (row,) = _host_rows(r, keys)
        assert 100.0 <= row["recovery"]["recovery_s"] < 130.0, row["recovery"]
    finally:
        observer.close()


def test_a_cordoned_host_stopped_before_it_drained_is_no_incident(r, keys):
    """The operator cordons a host and stops its worker (SIGTERM) while a lease still runs
    there (it is handed back): stopped on purpose, not a crash, so no incident that would
    never close (review)."""
    observer = Observer(r, keys, FLEET, host_down_grace_s=0.0)
    try:
        announce(r, keys, "host-a", "worker-1", 30.0)
        r.set(keys.gpu(FLEET.hosts[0].gpus[0].uuid), "lease-a")  # not drained yet
        cordon(r, keys, "host-a", "reboot")
        assert withdraw(r, keys, "host-a", "worker-1")  # a clean stop: the hand-back follows
        for _ in range(3):
            assert observer.probe_once() == []
        assert _host_rows(r, keys) == [] and not r.exists(keys.incidents_hosts_down)
    finally:
        observer.close()


def test_an_observer_on_an_older_fleet_file_says_which_hosts_it_does_not_watch(r, keys, caplog):
    """The planner published host-b, the observer's file had only host-a: it raised no
    host_down incident for host-b and said nothing at start (an SRE's report)."""
    import logging

    from makespan.models import fleet_version
    from makespan.workers.observer import warn_if_fleet_differs

    assert warn_if_fleet_differs(r, keys, ONLY_A) is None  # nothing published yet
    r.mset({keys.fleet: FLEET.model_dump_json(), keys.fleet_version: fleet_version(FLEET)})
    assert warn_if_fleet_differs(r, keys, FLEET) is None  # the same file
    with caplog.at_level(logging.WARNING, logger="makespan.observer"):
        said = warn_if_fleet_differs(r, keys, ONLY_A)
    assert said is not None and "it does not watch host host-b (no host_down incident for it)" in said
    assert said in caplog.text
