"""``makespan transitions`` reads the fleet the planner published (a new user ran it
without ``--fleet``, as ``submit``, ``jobs`` and ``why`` take it, and got "Missing
option"), and says what its ``n`` column counts. Real Redis, the real CLI."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.models import load_fleet
from tests.conftest import FLEET_TOML


def test_transitions_reads_the_published_fleet_or_says_to_give_one(r, keys, redis_url, prefix):
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    none = CliRunner().invoke(cli_app, ["transitions"], env=env)
    assert none.exit_code == 2 and "no planner has published a fleet yet under key prefix" in none.output and "give --fleet FILE" in none.output, none.output

    fleet = load_fleet(FLEET_TOML)
    r.set(keys.fleet, fleet.model_dump_json())  # what a leading planner publishes
    listed = CliRunner().invoke(cli_app, ["transitions", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert {row["endpoint"] for row in rows} == set(fleet.endpoints)
    assert {row["host"] for row in rows} == {"*", *(host.name for host in fleet.hosts)}
    given = CliRunner().invoke(cli_app, ["transitions", "--json", "--fleet", str(FLEET_TOML)], env=env)
    assert given.exit_code == 0 and given.stdout == listed.stdout  # the same table as from the file

    text = CliRunner().invoke(cli_app, ["transitions"], env=env)
    assert text.exit_code == 0 and text.stdout.splitlines()[0].split()[:3] == ["endpoint", "kind", "host"]
    assert "cold_start and restore pool each other's" in text.stderr and "learned once n >= 5" in text.stderr


def test_transitions_lists_measured_hosts_and_filters(r, keys, redis_url, prefix):
    """On 16 hosts × 4 endpoints the listing printed 206 rows, nearly all per-host copies of
    the fleet file's figure (a fleet-scale operator): a host with no measurement of its own is
    left out (said, --all lists it), and --endpoint / --host narrow it."""
    from makespan.estimates import transition_record_ops

    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    fleet = load_fleet(FLEET_TOML)
    r.set(keys.fleet, fleet.model_dump_json())
    endpoint, host = sorted(fleet.endpoints)[0], fleet.hosts[0].name
    pipe = r.pipeline()
    for op, *args in transition_record_ops(keys, endpoint, host, "cold_start", 12.5):
        pipe.execute_command(op, *args)
    pipe.execute()
    text = CliRunner().invoke(cli_app, ["transitions"], env=env)
    hosts = {line.split()[2] for line in text.stdout.splitlines()[1:]}
    assert hosts == {"*", host}, text.stdout
    assert "rows of hosts with no measurement of their own left out (--all shows them)" in text.stderr
    every = CliRunner().invoke(cli_app, ["transitions", "--all"], env=env)
    assert {line.split()[2] for line in every.stdout.splitlines()[1:]} == {"*", *(h.name for h in fleet.hosts)}
    one = CliRunner().invoke(cli_app, ["transitions", "--endpoint", endpoint, "--host", host, "--json"], env=env)
    rows = [json.loads(line) for line in one.stdout.splitlines()]
    assert rows and {(row["endpoint"], row["host"]) for row in rows} == {(endpoint, host)}
    assert any(row["kind"] == "cold_start" and row["last_s"] == 12.5 for row in rows), rows
    bad = CliRunner().invoke(cli_app, ["transitions", "--endpoint", "nope"], env=env)
    assert bad.exit_code == 2 and "not in the fleet; known:" in bad.output
