"""``makespan hosts``, ``cordon`` and ``uncordon`` through the real CLI on a real Redis
(the planner side of a cordon: tests/guarantees/test_wait_reasons.py ``test_host_cordoned``;
the observer's: tests/workers/test_observer_host_down.py), and the cordon's Prometheus gauge."""

from __future__ import annotations

import json
import uuid

from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.metrics import RedisStateCollector
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.host_liveness import announce
from makespan.workers.leases import LeaseStore

FLEET = parse_fleet({"name": "ops", "hosts": [{"name": "a", "gpu_count": 2, "memory_mib": 81920},
                                             {"name": "b", "gpu_count": 1, "memory_mib": 81920}],
                     "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 1}}})


def _cli(env, *argv):
    return CliRunner().invoke(cli_app, list(argv), env=env)


def _rows(env) -> dict[str, dict]:
    out = _cli(env, "hosts", "--json")
    assert out.exit_code == 0, out.output
    return {row["host"]: row for row in map(json.loads, out.output.splitlines())}


def test_cordon_drain_and_uncordon_as_an_operator_sees_them(r, keys, settings, redis_url, prefix):
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    r.set(keys.fleet, FLEET.model_dump_json())  # what a planner publishes
    announce(r, keys, "a", "worker-a", 30.0)
    job = Producer(r, keys, FLEET, settings).submit({"endpoint": "e", "service_s": 100}).id
    lease = LeaseStore(r, keys).acquire(uuid.uuid4().hex, ("GPU-a-0",), 60.0, job_id=job, kind="job", holder="a",
                                        queue=keys.queue("NORMAL"), info={})
    assert lease is not None
    rows = _rows(env)
    assert (rows["a"]["state"], rows["a"]["worker"], rows["a"]["leased"], rows["a"]["jobs"]) == \
        ("schedulable", "live", 1, [job])
    assert (rows["b"]["state"], rows["b"]["worker"]) == ("schedulable", "never")
    # no planner leads: nothing is scheduled anywhere, and each row says so (operator check)
    assert not rows["b"]["planner_leads"] and rows["b"]["reason"].startswith("no planner leads")
    # ... also on a host that has a reason of its own (a docs auditor saw it on one host of
    # two), and the WORKER column fits "never (unconsumed)"
    from makespan.workers.host_liveness import mark_unconsumed

    mark_unconsumed(r, keys, ["b"], "test")
    b = _rows(env)["b"]
    assert b["worker"] == "never (unconsumed)" and b["reason"].startswith("no GPU worker ever consumed"), b
    assert b["reason"].endswith("; no planner leads: nothing new is scheduled until one does"), b
    header, row_a, row_b = _cli(env, "hosts").output.splitlines()[:3]
    assert header.index("STATE") == row_a.index("schedulable") == row_b.index("down"), (header, row_a, row_b)
    r.hdel(keys.hosts_seen, "b")
    r.set(keys.planner_leader, "planner-1")
    assert _rows(env)["b"]["planner_leads"] and _rows(env)["b"]["reason"] == ""

    out = _cli(env, "cordon", "a", "--reason", "firmware")
    assert out.exit_code == 0, out.output
    assert "cordoned host a" in out.output and f"1 of its 2 GPUs is still leased (jobs {job})" in out.output
    assert _rows(env)["a"]["state"] == "cordoned"
    table = _cli(env, "hosts")
    assert table.exit_code == 0 and "cordoned" in table.output and "firmware" in table.output, table.output
    again = _cli(env, "cordon", "a", "--reason", "firmware, then NICs")
    assert again.exit_code == 0 and "already cordoned" in again.output, again.output
    assert _rows(env)["a"]["reason"] == "firmware, then NICs"
    # a repeated cordon without --reason keeps the reason (it wiped it: a new user's report)
    kept = _cli(env, "cordon", "a")
    assert kept.exit_code == 0 and "reason now: firmware, then NICs (kept: no --reason given)" in kept.output, kept.output
    assert _rows(env)["a"]["reason"] == "firmware, then NICs"

    r.delete(keys.gpu("GPU-a-0"))  # its last lease ends (what a release does to the GPU key)
    assert _rows(env)["a"]["state"] == "drained"
    families = {family.name: family for family in RedisStateCollector(r, keys).collect()}
    assert [(s.labels, s.value) for s in families["makespan_host_cordoned"].samples] == [({"host": "a"}, 1.0),
                                                                                         ({"host": "b"}, 0.0)]

    out = _cli(env, "uncordon", "a")
    assert out.exit_code == 0 and "uncordoned host a" in out.output and "firmware, then NICs" in out.output
    assert _rows(env)["a"]["state"] == "schedulable"
    out = _cli(env, "uncordon", "a")
    assert out.exit_code == 0 and "was not cordoned" in out.output


def test_a_host_dropped_from_the_fleet_can_be_uncordoned_and_is_not_exported(r, keys, settings, redis_url, prefix):
    """Decommissioning: cordon b, then drop it from the fleet file. `uncordon b` was refused
    ("not a host of the fleet") and the gauge said b was cordoned for ever (review)."""
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    r.set(keys.fleet, FLEET.model_dump_json())
    assert _cli(env, "cordon", "b", "--reason", "decommission").exit_code == 0
    smaller = parse_fleet({"name": "ops", "hosts": [{"name": "a", "gpu_count": 2, "memory_mib": 81920}],
                           "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 1}}})
    r.set(keys.fleet, smaller.model_dump_json())  # b left the fleet
    listed = _cli(env, "hosts")
    assert listed.exit_code == 0 and "cordoned hosts the fleet does not have: b" in listed.output, listed.output
    families = {family.name: family for family in RedisStateCollector(r, keys).collect()}
    assert [(s.labels, s.value) for s in families["makespan_host_cordoned"].samples] == [({"host": "a"}, 0.0)]
    out = _cli(env, "uncordon", "b")
    assert out.exit_code == 0 and "uncordoned host b" in out.output, out.output
    assert not r.exists(keys.hosts_cordoned)


def test_a_lease_on_a_cordoned_host_is_refused_by_the_lease_script(r, keys, settings):
    """A plan read before the cordon cannot lease there after it: `makespan cordon` printed
    "drained" while a tick in flight could still lease on the host (review)."""
    from makespan.workers.host_liveness import cordon, uncordon

    job = Producer(r, keys, FLEET, settings).submit({"endpoint": "e", "service_s": 100}).id
    cordon(r, keys, "a", "maintenance")
    store = LeaseStore(r, keys)
    args = dict(job_id=job, kind="job", holder="a", queue=keys.queue("NORMAL"))
    assert store.acquire(uuid.uuid4().hex, ("GPU-a-0",), 60.0, **args) is None
    assert r.hget(keys.job(job), "state") == "queued" and not r.exists(keys.gpu("GPU-a-0"))
    uncordon(r, keys, "a")
    assert store.acquire(uuid.uuid4().hex, ("GPU-a-0",), 60.0, **args) is not None


def test_an_unknown_host_is_refused_and_nothing_is_written(r, keys, redis_url, prefix):
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    out = _cli(env, "cordon", "a")
    assert out.exit_code == 2 and "no planner has published a fleet yet" in out.output, out.output
    r.set(keys.fleet, FLEET.model_dump_json())
    out = _cli(env, "cordon", "c")
    assert out.exit_code == 2 and "not a host of the fleet (hosts: a, b)" in out.output, out.output
    assert not r.exists(keys.hosts_cordoned)


def test_a_host_removed_from_the_fleet_is_listed_while_its_leases_run(r, keys, settings, redis_url, prefix):
    """The planner restarted on a file without host-b hid it from `makespan hosts` while two
    of its jobs still ran there: nothing to wait on before stopping its worker (an SRE's
    report). It is listed, 'not in fleet', until its last lease ends."""
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    r.set(keys.fleet, FLEET.model_dump_json())
    r.set(keys.planner_leader, "planner-1")
    announce(r, keys, "gone", "worker-gone", 30.0)
    job = Producer(r, keys, FLEET, settings).submit({"endpoint": "e", "service_s": 100}).id
    assert LeaseStore(r, keys).acquire(uuid.uuid4().hex, ("GPU-gone-0",), 60.0, job_id=job, kind="job",
                                       holder="gone", queue=keys.queue("NORMAL"), info={}) is not None
    row = _rows(env)["gone"]
    assert (row["state"], row["leased"], row["jobs"], row["worker"]) == ("not in fleet", 1, [job], "live"), row
    assert row["gpus"] is None  # no fleet file says how many it has (it showed the leased count)
    assert "its leases run to their end" in row["reason"]
    assert "not in fleet" in _cli(env, "hosts").output
    r.delete(keys.leases, keys.gpu("GPU-gone-0"))  # its lease ended; its worker still runs
    assert _rows(env)["gone"]["reason"].startswith("not in the planner's fleet file: its GPU worker gets no job; adding")
    r.delete(keys.host_live("gone"))  # and stopped: nothing left to show
    assert "gone" not in _rows(env)


def test_jobs_with_a_filter_finds_matches_behind_many_other_jobs(r, keys, settings, monkeypatch):
    """``makespan jobs --endpoint judge --limit 5`` read 4 × 5 ids per queue and said "no job
    queued or delayed" with two judge jobs queued behind 30 others (SRE's soak)."""
    from makespan.models import load_fleet
    from tests.conftest import FLEET_TOML

    fleet = load_fleet(FLEET_TOML)
    monkeypatch.setenv("MAKESPAN_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", settings.key_prefix)
    r.set(keys.fleet, fleet.model_dump_json())
    prod = Producer(r, keys, fleet, settings)
    for _ in range(30):
        prod.submit({"endpoint": "renderer", "service_s": 1, "priority": "LOW"})
    wanted = [prod.submit({"endpoint": "embed", "service_s": 1, "priority": "LOW"}).id for _ in range(2)]
    res = CliRunner().invoke(cli_app, ["jobs", "--endpoint", "embed", "--limit", "5", "--json"])
    assert res.exit_code == 0, res.output
    assert [json.loads(line)["id"] for line in res.output.splitlines() if line.startswith("{")] == wanted


def test_a_cordon_reason_past_its_limit_is_refused_and_nothing_is_written(r, keys, redis_url, prefix):
    """A 5,000-character reason was taken (it is shown in every waiting job's `why`)."""
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    r.set(keys.fleet, FLEET.model_dump_json())
    out = _cli(env, "cordon", "a", "--reason", "x" * 5000)
    assert out.exit_code == 2 and "is 5000 characters: at most 500" in out.output, out.output
    assert not r.exists(keys.hosts_cordoned)


def test_hosts_instances_lists_each_hosts_endpoints_and_their_sleep(r, keys, redis_url, prefix):
    """A vLLM operator had no command that said which endpoint instance is on which GPU and
    whether it runs or sleeps (and at which level): they read ``P:instance:*`` by hand.
    `hosts --instances` lists them per host; `--json` carries them as ``instances``."""
    from makespan.workers.drivers import get_driver
    from makespan.workers.drivers.registry import register_instance, set_instance_state

    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    r.set(keys.fleet, FLEET.model_dump_json())
    driver = get_driver("simulated")
    running = driver.start(FLEET.endpoints["e"], ["GPU-a-0"], time_scale=0.0, host="a")
    asleep = driver.start(FLEET.endpoints["e"], ["GPU-a-1"], time_scale=0.0, host="a")
    register_instance(r, keys, running)
    register_instance(r, keys, asleep)
    set_instance_state(r, keys, asleep.id, "asleep", sleep_level=2)
    rows = {row["host"]: row for row in map(json.loads, _cli(env, "hosts", "--json", "--instances").output.splitlines())}
    assert sorted((i["gpus"], i["state"], i["sleep_level"]) for i in rows["a"]["instances"]) == \
        [(["GPU-a-0"], "running", None), (["GPU-a-1"], "asleep", 2)]
    assert rows["b"]["instances"] == []
    assert "instances" not in _rows(env)["a"]  # only when asked (it reads every instance)
    text = _cli(env, "hosts", "--instances").output
    assert f"  e                asleep (sleep level 2) on GPU-a-1 [simulated, instance {asleep.id[:8]}]" in text, text
    assert f"  e                running on GPU-a-0 [simulated, instance {running.id[:8]}]" in text, text
    assert "  (no endpoint instance)" in text
