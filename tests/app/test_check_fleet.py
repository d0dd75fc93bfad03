"""``makespan check-fleet FILE``: a fleet file checked by this version without starting
anything (an upgrading operator found the new planner refused a file the old one took,
after the old planner was stopped: no planner at all). Real CLI, real Redis for
``--against-published``."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.models import fleet_version, load_fleet

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "render-pipeline.toml"


def _env(redis_url: str, prefix: str) -> dict[str, str]:
    return {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}


def test_a_good_file_prints_its_summary_and_version():
    res = CliRunner().invoke(cli_app, ["check-fleet", str(EXAMPLE), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    fleet = load_fleet(EXAMPLE)
    assert summary["fleet_version"] == fleet_version(fleet)
    assert summary["hosts"] == len(fleet.hosts) and summary["gpus"] == len(fleet.gpu_uuids())
    assert set(summary["endpoints"]) == set(fleet.endpoints)
    text = CliRunner().invoke(cli_app, ["check-fleet", str(EXAMPLE)])
    assert text.exit_code == 0 and text.output.startswith("ok: ") and summary["fleet_version"] in text.output


def test_a_bad_file_exits_2_naming_the_field(tmp_path):
    bad = tmp_path / "fleet.toml"
    bad.write_text(EXAMPLE.read_text().replace("cold_start_s = 45", 'cold_start_s = "45"', 1))
    assert 'cold_start_s = "45"' in bad.read_text()
    res = CliRunner().invoke(cli_app, ["check-fleet", str(bad)])
    assert res.exit_code == 2
    assert "cold_start_s: must be a number, not text" in res.output, res.output


def test_against_the_published_fleet_names_what_differs(r, keys, redis_url, prefix, tmp_path):
    env = _env(redis_url, prefix)
    res = CliRunner().invoke(cli_app, ["check-fleet", str(EXAMPLE), "--against-published"], env=env)
    assert res.exit_code == 0 and "no planner has published a fleet yet" in res.output, res.output
    fleet = load_fleet(EXAMPLE)
    r.set(keys.fleet, fleet.model_dump_json())  # as the planner publishes it
    res = CliRunner().invoke(cli_app, ["check-fleet", str(EXAMPLE), "--against-published"], env=env)
    assert "the same as the published fleet" in res.output, res.output
    changed = tmp_path / "fleet.toml"
    extra = '\n[endpoints.extra]\nmodel = "m"\nmemory_mib_per_gpu = 1000\ncold_start_s = 10\nevict_s = 1\n'
    changed.write_text(EXAMPLE.read_text() + extra)
    res = CliRunner().invoke(cli_app, ["check-fleet", str(changed), "--against-published", "--json"], env=env)
    assert res.exit_code == 0, res.output
    published = json.loads(res.output)["published"]
    assert published[0].startswith("differs from the published fleet") and "endpoints added: extra" in published
    assert json.loads(res.output)["against_published"] == "differs"  # for a script, beside the prose
    for path, verdict in ((EXAMPLE, "same"),):
        res = CliRunner().invoke(cli_app, ["check-fleet", str(path), "--against-published", "--json"], env=env)
        assert json.loads(res.output)["against_published"] == verdict, res.output
    r.delete(keys.fleet)
    res = CliRunner().invoke(cli_app, ["check-fleet", str(EXAMPLE), "--against-published", "--json"], env=env)
    assert json.loads(res.output)["against_published"] == "none_published", res.output


def test_a_published_fleet_this_version_refuses_is_named_not_blamed_on_the_file(r, keys, redis_url, prefix, tmp_path):
    """A verifier: the published fleet of an older planner that this version validates more
    strictly failed the check of a good file (exit 2, as if the file were wrong)."""
    env = _env(redis_url, prefix)
    published = json.loads(load_fleet(EXAMPLE).model_dump_json())
    published["old_top_level_key"] = 1  # a key this version does not know
    r.set(keys.fleet, json.dumps(published))
    res = CliRunner().invoke(cli_app, ["check-fleet", str(EXAMPLE), "--against-published"], env=env)
    assert res.exit_code == 0, res.output
    assert "the published fleet (the running planner's) does not load with this version" in res.output, res.output
    r.set(keys.fleet, "not json")
    res = CliRunner().invoke(cli_app, ["check-fleet", str(EXAMPLE), "--against-published"], env=env)
    assert res.exit_code == 0 and "does not load with this version" in res.output, res.output


SMALL = """
name = "small"

[[hosts]]
name = "a"
gpu_count = 2
memory_mib = 81920
{extra_host}
[endpoints.chat]
model = "m"
memory_mib_per_gpu = {memory}
cold_start_s = 10
evict_s = 1
"""
HOST_B = """
[[hosts]]
name = "b"
gpu_count = 2
memory_mib = 81920
"""


def test_a_host_removed_and_another_memory_are_named(r, keys, redis_url, prefix, tmp_path):
    before, after = tmp_path / "before.toml", tmp_path / "after.toml"
    before.write_text(SMALL.format(extra_host=HOST_B, memory=1000))
    after.write_text(SMALL.format(extra_host="", memory=2000))
    r.set(keys.fleet, load_fleet(before).model_dump_json())
    res = CliRunner().invoke(cli_app, ["check-fleet", str(after), "--against-published", "--json"],
                             env=_env(redis_url, prefix))
    assert res.exit_code == 0, res.output
    published = json.loads(res.output)["published"]
    assert "hosts removed: b" in published and "memory_mib_per_gpu changed: chat 1000 -> 2000" in published, published
    # a host's memory and an endpoint's launch command are named too (a verifier)
    third = tmp_path / "third.toml"
    third.write_text(SMALL.format(extra_host=HOST_B.replace("81920", "98304"), memory=1000)
                     + 'launch = { driver = "process", command = ["/bin/true"] }\n')
    res = CliRunner().invoke(cli_app, ["check-fleet", str(third), "--against-published", "--json"],
                             env=_env(redis_url, prefix))
    published = json.loads(res.output)["published"]
    assert "GPU memory_mib changed: b 81920 -> 98304" in published, published
    assert "launch changed (what runs on the GPUs): chat" in published, published


def test_a_gpu_swap_and_changes_of_several_kinds_are_each_named(r, keys, redis_url, prefix, tmp_path):
    """A fleet-change operator: one swapped GPU UUID printed only "other settings changed",
    gpu_count turned into its equivalent gpus list printed "host memory_mib changed: b 81920
    -> None", and a memory change hid a moved set point and a cold start beside it."""
    before, after = tmp_path / "before.toml", tmp_path / "after.toml"
    before.write_text(SMALL.format(extra_host=HOST_B, memory=1000))
    r.set(keys.fleet, load_fleet(before).model_dump_json())
    listed = HOST_B.replace("gpu_count = 2\nmemory_mib = 81920\n",
                            "gpus = [{ index = 0, uuid = \"GPU-b-0\", memory_mib = 81920 },"
                            " { index = 1, uuid = \"GPU-new-1\", memory_mib = 81920 }]\n")
    after.write_text(SMALL.format(extra_host=listed, memory=2000).replace("cold_start_s = 10", "cold_start_s = 20")
                     + 'set_point = [{ host = "a", gpus = [0] }]\n')
    res = CliRunner().invoke(cli_app, ["check-fleet", str(after), "--against-published", "--json"],
                             env=_env(redis_url, prefix))
    assert res.exit_code == 0, res.output
    published = json.loads(res.output)["published"]
    assert published[1:] == ["GPU UUIDs changed (cordon the host until its GPU worker runs this file): b (1 new, "
                             "1 gone)", "memory_mib_per_gpu changed: chat 1000 -> 2000", "set point changed: chat",
                             "other fields changed: chat.cold_start_s"], published
    # the same GPUs in another order, and gpu_count written as its gpus list: named as such (a verifier)
    for gpus, said in (("gpus = [{ index = 1, uuid = \"GPU-b-1\", memory_mib = 81920 },"
                        " { index = 0, uuid = \"GPU-b-0\", memory_mib = 81920 }]\n",
                        "GPUs listed in another order or with other CUDA indices (same UUIDs): b"),
                       ("gpus = [{ index = 0, uuid = \"GPU-b-0\", memory_mib = 81920 },"
                        " { index = 1, uuid = \"GPU-b-1\", memory_mib = 81920 }]\n",
                        "hosts written another way, the same GPUs (gpu_count as a gpus list, or back): b")):
        after.write_text(SMALL.format(extra_host=HOST_B.replace("gpu_count = 2\nmemory_mib = 81920\n", gpus),
                                      memory=1000))
        res = CliRunner().invoke(cli_app, ["check-fleet", str(after), "--against-published", "--json"],
                                 env=_env(redis_url, prefix))
        assert json.loads(res.output)["published"][1:] == [said], res.output


def test_a_removed_endpoints_waiting_jobs_are_counted_before_the_change(r, keys, settings, redis_url, prefix,
                                                                         tmp_path):
    """Removing `judge` printed "ok … endpoints removed: judge", and the planner then cancelled
    its 50 queued jobs (a fleet-change operator): the check counts them first."""
    from makespan.producer import Producer

    before, after = tmp_path / "before.toml", tmp_path / "after.toml"
    judge = '\n[endpoints.judge]\nmodel = "j"\nmemory_mib_per_gpu = 1000\ncold_start_s = 10\n'
    before.write_text(SMALL.format(extra_host="", memory=1000) + judge)
    after.write_text(SMALL.format(extra_host="", memory=1000))
    fleet = load_fleet(before)
    r.set(keys.fleet, fleet.model_dump_json())
    prod = Producer(r, keys, fleet, settings)
    for _ in range(2):
        prod.submit({"endpoint": "judge", "service_s": 5})
    prod.submit({"endpoint": "judge", "service_s": 5, "delay_s": 600})
    prod.submit({"endpoint": "chat", "service_s": 5})
    res = CliRunner().invoke(cli_app, ["check-fleet", str(after), "--against-published"], env=_env(redis_url, prefix))
    assert res.exit_code == 0, res.output
    assert "endpoints removed: judge" in res.output
    assert "queued or delayed jobs of removed endpoints, which the planner cancels when it runs this file: judge 3" \
        in res.output, res.output


def test_sleep_settings_that_do_nothing_are_warned_about(tmp_path):
    """`check-fleet` said ok for sleep_level = 2 without wake_s, wake_level2_s with
    sleep_level = 2, a sleep_gpu_memory_mib above the model's memory and a level-1 sleeper
    no host's RAM budget can hold: each did nothing, silently (a sleep-level operator)."""
    fleet = tmp_path / "sleepy.toml"
    fleet.write_text("""
name = "sleepy"

[[hosts]]
name = "a"
gpu_count = 2
memory_mib = 81920
host_memory_mib = 30000

[endpoints.nowake]
model = "m"
memory_mib_per_gpu = 1000
cold_start_s = 10
sleep_level = 2

[endpoints.both]
model = "m"
memory_mib_per_gpu = 1000
cold_start_s = 10
wake_s = 2
sleep_level = 2
wake_level2_s = 5
sleep_gpu_memory_mib = 4000
sleep_host_memory_mib = 9000

[endpoints.huge]
model = "m"
memory_mib_per_gpu = 20000
tensor_parallel = 2
cold_start_s = 10
wake_s = 2

[endpoints.fine]
model = "m"
memory_mib_per_gpu = 1000
cold_start_s = 10
wake_s = 2
""")
    res = CliRunner().invoke(cli_app, ["check-fleet", str(fleet), "--json"])
    assert res.exit_code == 0, res.output
    warnings = json.loads(res.output)["warnings"]
    assert len(warnings) == 5, warnings
    assert warnings[0].startswith("endpoints.nowake: sleep_level without wake_s") and "set wake_s" in warnings[0]
    assert warnings[1].startswith("endpoints.both: sleep_host_memory_mib is the host RAM of a level-1 sleeper")
    assert warnings[2].startswith("endpoints.both: wake_level2_s is used with sleep_level = 1 only")
    assert warnings[3].startswith("endpoints.both: sleep_gpu_memory_mib 4000 is above memory_mib_per_gpu 1000")
    assert warnings[4].startswith("endpoints.huge: its level-1 sleeper holds 40000 MiB of host RAM") and \
        "raise host_memory_mib" in warnings[4]
    res = CliRunner().invoke(cli_app, ["check-fleet", str(fleet)])
    assert res.exit_code == 0 and res.output.count("  warning: endpoints.") == 5, res.output
    res = CliRunner().invoke(cli_app, ["check-fleet", str(EXAMPLE), "--json"])
    assert json.loads(res.output)["warnings"] == [], res.output


def test_the_sleeping_set_point_example_is_what_its_docs_say():
    """docs/configuration.md "Sleep levels, by example" describes examples/sleepy-set-point.toml."""
    fleet = load_fleet(EXAMPLE.parent / "sleepy-set-point.toml")
    coder = fleet.endpoints["coder"]
    assert coder.sleep_options == ((1, 8.0, 124000), (2, 40.0, 0)) and fleet.sleep_warnings() == []
    assert fleet.set_point_by_gpu() == {"GPU-host-a-0": "coder", "GPU-host-a-1": "coder"}
    assert fleet.host_ram_budgets() == {"host-a": 131072} and fleet.endpoints["chat"].sleep_options == ((1, 5.0, 24000),)


def test_pool_changes_are_each_named_not_lumped_with_the_name():
    """A pools operator moved endpoint ``both`` out of pool a: check-fleet said only "other
    settings changed (pools, the fleet's name…)", though the name had not changed."""
    from makespan.cli_hosts import fleet_difference
    from makespan.models import parse_fleet

    def fleet(pool_a_endpoints, pool_b_hosts=("b1",), name="two-pools"):
        return parse_fleet({
            "name": name,
            "hosts": [{"name": h, "gpu_count": 1, "memory_mib": 80000} for h in ("a1", "b1", "b2")],
            "endpoints": {e: {"model": f"sim/{e}", "memory_mib_per_gpu": 10000, "cold_start_s": 5}
                          for e in ("onlya", "onlyb", "both")},
            "pools": [{"name": "a", "hosts": ["a1", *(h for h in ("b1", "b2") if h not in pool_b_hosts)],
                       "endpoints": list(pool_a_endpoints)},
                      {"name": "b", "hosts": list(pool_b_hosts), "endpoints": ["onlyb", "both"]}]})

    before = fleet(["onlya", "both"])
    lines = fleet_difference(before, fleet(["onlya"]))
    assert lines == ["pools stop serving an endpoint (its queued jobs there move to a pool, or the whole fleet, that "
                     "serves it): both a,b -> b"], lines
    assert fleet_difference(fleet(["onlya"]), before) == ["more pools serve an endpoint: both b -> a,b"]
    reordered = parse_fleet({**before.model_dump(mode="json"), "pools": [p.model_dump(mode="json")
                                                                         for p in reversed(before.pools)]})
    assert fleet_difference(before, reordered) == [
        "pool order changed (a job two pools could start equally soon goes to the first)"]
    no_pools = parse_fleet({**before.model_dump(mode="json"), "pools": []})
    lines = fleet_difference(before, no_pools)
    assert lines[0] == "pools removed: a, b (their queued jobs move to the whole fleet's one planner (no pools))"
    assert any("both a,b -> the whole fleet (no pools)" in line for line in lines), lines
    lines = fleet_difference(before, fleet(["onlya", "both"], pool_b_hosts=("b1", "b2"), name="renamed"))
    assert "pool a hosts: -b2" in lines and "pool b hosts: +b2" in lines
    assert "fleet name changed: 'two-pools' -> 'renamed'" in lines
    assert not any("other" in line for line in lines), lines
    assert fleet_difference(before, before) == []
