"""The shipped dashboard's queue-depth panel over several pools, evaluated by a real
``promtool test rules`` (Debian's ``prometheus`` package) on synthetic series: each pool's
planner (and its standby) exports its own pool's queue depth with a ``pool`` label, the
same value from every replica (docs/metrics.md)."""

from __future__ import annotations

import json
import subprocess

import yaml

from .debian_tools import require_tool
from .deploy_checks import ROOT

DASHBOARD = ROOT / "compose" / "grafana" / "dashboards" / "makespan.json"


def _queue_depth_expr() -> str:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    (panel,) = [p for p in panels if "queue depth" in p["title"].lower()]
    (target,) = panel["targets"]
    return target["expr"]


def _evaluate(tmp_path, series: dict[str, int], expected: int) -> subprocess.CompletedProcess:
    promtool = require_tool("promtool", "prometheus")
    test = {"rule_files": [], "evaluation_interval": "1m",
            "tests": [{"interval": "1m",
                       "input_series": [{"series": name, "values": f"{value}x3"} for name, value in series.items()],
                       "promql_expr_test": [{"expr": _queue_depth_expr(), "eval_time": "1m",
                                             "exp_samples": [{"labels": '{priority="NORMAL"}', "value": expected}]}]}]}
    path = tmp_path / "queue_depth_test.yml"
    path.write_text(yaml.safe_dump(test))
    return subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)


def test_the_queue_depth_panel_sums_the_pools_and_counts_each_pools_replicas_once(tmp_path):
    """It took the max over every series: with two pools it showed the deeper pool's queue."""
    series = {'makespan_queue_depth_jobs{priority="NORMAL",pool="a",instance="planner-a"}': 3,
              'makespan_queue_depth_jobs{priority="NORMAL",pool="a",instance="standby-a"}': 3,
              'makespan_queue_depth_jobs{priority="NORMAL",pool="b",instance="planner-b"}': 5}
    done = _evaluate(tmp_path, series, 8)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_queue_depth_panel_without_pools_counts_the_replicas_once(tmp_path):
    series = {'makespan_queue_depth_jobs{priority="NORMAL",instance="planner"}': 4,
              'makespan_queue_depth_jobs{priority="NORMAL",instance="standby"}': 4}
    done = _evaluate(tmp_path, series, 4)
    assert done.returncode == 0, done.stdout + done.stderr
