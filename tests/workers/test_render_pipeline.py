"""The render pipeline end to end: real endpoint processes, real Redis, a real
observer process watching (time scale 0.01, 20 cards)."""

from __future__ import annotations

from typer.testing import CliRunner

import typer

from makespan.cli_lifecycle import PHASES, register, run_render_pipeline
from makespan.workers.drivers.registry import list_instances


def test_render_pipeline_phase_order_and_no_incident(settings, r, keys, tmp_path):
    out = run_render_pipeline(settings, cards=20, card_latency_ms=10, observer=True, probe_interval_s=0.2,
                              log_dir=str(tmp_path))
    assert [p["phase"] for p in out["phases"]] == list(PHASES)
    starts = [p["start_s"] for p in out["phases"]]
    assert starts == sorted(starts)
    # each of start_s, duration_s and makespan_s is rounded to 1 ms (±0.5 ms): 1.5 ms of rounding at most
    assert all(p["start_s"] + p["duration_s"] <= out["makespan_s"] + 1.5e-3 + 1e-9 for p in out["phases"])
    assert out["cards"] == 20
    assert out["gpus"] == ["GPU-host-a-0", "GPU-host-a-1"]
    assert out["incidents"] == []  # the planned eviction paged no one
    assert out["agenda_left"] == 0
    assert list_instances(r, keys) == []  # it stopped what it started
    logs = sorted(p.name.split("-")[0] for p in tmp_path.iterdir())
    assert logs.count("coder") == 2 and "renderer" in logs and "embed" in logs  # set point + restore


def test_incidents_command_lists_records(settings, r, keys):
    r.xadd(keys.incidents, {"kind": "incident", "endpoint": "coder", "instance_id": "abc", "host": "host-a",
                            "gpus": '["GPU-host-a-0"]', "failure_mode": "process_exited",
                            "detected_at": "1700000000.0", "cycle": "5", "last_ok_cycle": "4",
                            "effect": "endpoint coder unavailable", "agenda_context": "[]"})
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # typer runs a single command app without its name otherwise
        pass

    res = CliRunner().invoke(app, ["incidents", "--redis-url", settings.redis_url, "--prefix", keys.prefix])
    assert res.exit_code == 0, res.output
    assert "coder  process_exited  gpus=GPU-host-a-0  agenda=none  recovery=pending" in res.output
