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
