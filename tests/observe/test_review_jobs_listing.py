"""`makespan jobs` listing: duplicates and ordering across pools. (found by a review, 2026-12-04; fails on the code before its fix)"""
from __future__ import annotations

import json

from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.keys import Keys

ONE = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                   "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})


def _env(monkeypatch, settings):
    monkeypatch.setenv("MAKESPAN_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", settings.key_prefix)


def test_repeated_state_lists_each_job_once(r, settings, monkeypatch):
    _env(monkeypatch, settings)
    prod = Producer(r, Keys(settings.key_prefix), ONE, settings)
    jid = prod.submit({"endpoint": "e", "service_s": 10, "priority": "LOW"}).id
    res = CliRunner().invoke(cli_app, ["jobs", "--state", "queued", "--state", "queued", "--json"])
    assert res.exit_code == 0, res.output
    ids = [json.loads(line)["id"] for line in res.output.splitlines() if line.strip()]
    assert ids.count(jid) == 1, ids


def _pooled():
    data = {"name": "two-pools",
            "hosts": [{"name": h, "gpu_count": 1, "memory_mib": 80000} for h in ("a1", "b1")],
            "endpoints": {n: {"model": f"sim/{n}", "memory_mib_per_gpu": 10000, "cold_start_s": 5}
                          for n in ("onlya", "onlyb")},
            "pools": [{"name": "a", "hosts": ["a1"], "endpoints": ["onlya"]},
                      {"name": "b", "hosts": ["b1"], "endpoints": ["onlyb"]}]}
    return parse_fleet(data)


def test_queued_listing_is_critical_first_across_pools(r, settings, monkeypatch):
    _env(monkeypatch, settings)
    fleet = _pooled()
    keys = Keys(settings.key_prefix)
    r.set(keys.fleet, fleet.model_dump_json())  # as the planners publish it
    prod = Producer(r, keys, fleet, settings)
    lows = [prod.submit({"endpoint": "onlya", "service_s": 10, "priority": "LOW"}).id for _ in range(3)]
    crit = prod.submit({"endpoint": "onlyb", "service_s": 10, "priority": "CRITICAL"}).id
    res = CliRunner().invoke(cli_app, ["jobs", "--json", "--limit", "2"])
    assert res.exit_code == 0, res.output
    ids = [json.loads(line)["id"] for line in res.stdout.splitlines() if line.strip()]  # stderr: "listed the first 2"
    assert ids == [crit, lows[0]], ids  # docs: queued jobs are listed CRITICAL first


def test_listing_and_bulk_cancel_take_round_trips_per_chunk_not_per_job(r, settings):
    """A fleet-scale operator's `makespan jobs --limit 100000` of 19,488 queued jobs took 39 s,
    and `cancel --state queued ...` of 15,034 jobs 52 s: two round trips per queued row (its
    queue position, the higher levels ahead of it) and two per cancel. Now a chunk of rows
    costs a few round trips whatever its size."""
    from bench.cli_listing import RoundTrips
    from makespan.cli_why import scan_jobs

    keys = Keys(settings.key_prefix)
    prod = Producer(r, keys, ONE, settings)
    ids = [prod.submit({"endpoint": "e", "service_s": 10, "priority": level}).id
           for level in ("LOW", "NORMAL") for _ in range(150)]
    r.set(keys.planner_leader, "a-planner", px=60_000)  # a planner leads, and has not read them yet: behind_batch
    trips = RoundTrips(r)  # on this test's own client
    rows, cut_at = scan_jobs(r, keys, settings, ("queued",), limit=1000)
    assert len(rows) == 300 and cut_at is None
    low = [row for row in rows if row["priority"] == "LOW"]
    assert low[-1]["detail"].startswith("position 150 in the LOW queue, behind 150 queued jobs"), low[-1]
    assert trips.count < 30, trips.count  # 600+ before
    trips.count = 0
    outcomes = prod.cancel_outcomes([*ids, "no-such-job"])
    assert [o.state for o in outcomes[:-1]] == ["cancelled"] * 300 and outcomes[-1] is None
    assert all(o.finished_at is not None and not o.already_ended for o in outcomes[:-1])
    assert trips.count < 10, trips.count  # 600+ before
    again = prod.cancel_outcomes(ids[:2])
    assert [(o.state, o.already_ended) for o in again] == [("cancelled", True)] * 2
