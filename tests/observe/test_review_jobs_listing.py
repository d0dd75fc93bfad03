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
