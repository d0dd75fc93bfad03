"""The shipped Grafana dashboard against a real Prometheus (Debian's ``prometheus``)
scraping the live processes of the Procfile layout: a planner, the GPU workers of both
hosts and the observer. Every PromQL expression of the dashboard must return at least
one series while jobs run, so the dashboard cannot point at metrics that do not exist
(labelled counters are initialised: a quiet fleet shows 0, not 'No data')."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import free_port
from tests.live import stop_checked, wait_for

from .debian_tools import Prometheus, require_tool
from .deploy_checks import ROOT

FLEET = ROOT / "examples" / "render-pipeline.toml"
DASHBOARD = ROOT / "compose" / "grafana" / "dashboards" / "makespan.json"
MIX = [("embed", "CRITICAL"), ("chat", "HIGH"), ("summarizer", "NORMAL"), ("coder", "LOW"), ("chat", "NORMAL")]


def dashboard_expressions(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel of a Grafana dashboard JSON."""
    out = []

    def walk(panels):
        for p in panels:
            out.extend((p.get("title", "?"), t["expr"]) for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(json.loads(path.read_text())["panels"])
    return out


def test_dashboard_has_expressions():
    exprs = dashboard_expressions()
    assert len(exprs) >= 18, exprs


def test_every_dashboard_expression_returns_series_while_jobs_run(r, keys, settings, tmp_path):
    binary = require_tool("prometheus")
    fleet = load_fleet(FLEET)
    # below the ephemeral range (LiveSystem skips bound ports), and apart from test_live_scrape's
    # 20000-24999: both systems' checks could pass for one port before either child binds it (xdist)
    base = random.Random().randrange(25000, 30000)
    system = LiveSystem(FLEET, fleet, settings, tmp_path / "logs", metrics_base_port=base)
    stop = threading.Event()
    try:
        system.start()
        ports = system.metrics_ports
        assert {"planner-0", "gpu-host-a-0", "gpu-host-b-0", "observer"} <= set(ports), ports
        prod = Producer(r, keys, fleet, settings)
        # wait for the planner to lead (it stores P:fleet): its collector exports the fleet's endpoints
        wait_for(lambda: r.exists(keys.fleet), 30, "the planner to store the fleet")

        def feed():  # jobs keep arriving and running for the whole check
            i = 0
            while not stop.is_set():
                ep, prio = MIX[i % len(MIX)]
                prod.submit({"endpoint": ep, "priority": prio, "service_s": 200})
                i += 1
                stop.wait(0.3)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        targets = {"makespan-planner": [f"127.0.0.1:{ports['planner-0']}"],
                   "makespan-gpu-worker": [f"127.0.0.1:{ports[n]}" for n in ports if n.startswith("gpu-")],
                   "makespan-observer": [f"127.0.0.1:{ports['observer']}"]}
        exprs = dashboard_expressions()
        with Prometheus(binary, targets, tmp_path / "prometheus", free_port(), scrape_interval_s=1.0) as prom:
            wait_for(lambda: all(h == "up" for h in prom.targets_up().values()) and len(prom.targets_up()) == 4,
                     60, "prometheus to scrape all four processes")
            wait_for(lambda: r.zcard(keys.running) > 0, 60, "jobs to run")
            time.sleep(3)  # rate()/increase() need two samples of each series
            empty: list[tuple[str, str]] = []

            def all_answer() -> bool:
                empty[:] = [(t, e) for t, e in exprs if not prom.query(e)]
                return not empty

            try:
                wait_for(all_answer, 30, "every dashboard expression to return a series", poll_s=1.0)
            except TimeoutError:
                raise AssertionError(f"{len(empty)} of {len(exprs)} dashboard expressions return no series "
                                     f"while jobs run: {empty}") from None
            assert r.zcard(keys.running) > 0 or r.zcard(keys.leases) > 0, "jobs were running during the check"
    finally:
        stop.set()
        stop_checked(system)
