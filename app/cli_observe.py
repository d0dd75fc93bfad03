"""Observability commands of the ``makespan`` CLI: ``makespan report RUN_DIR``.

``makespan.cli`` calls :func:`register` on its typer app. ``report`` reads
``RUN_DIR/events.jsonl`` (written by ``makespan demo`` and ``makespan replay``), takes
the GPU lane order from ``RUN_DIR/fleet.toml`` when present, writes
``RUN_DIR/gantt.png`` and prints the text summary of :func:`makespan.gantt.summarize`.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from makespan.errors import MakespanError


def _gpu_order(run_dir: Path) -> list[str] | None:
    fleet_file = run_dir / "fleet.toml"
    if not fleet_file.exists():
        return None
    from makespan.models import load_fleet

    try:
        return load_fleet(fleet_file).gpu_uuids()
    except MakespanError:
        return None


def report(
    run_dir: Path = typer.Argument(..., help="run directory holding events.jsonl (and fleet.toml)"),
    out: Path = typer.Option(None, "--out", help="PNG path (default RUN_DIR/gantt.png)"),
    title: str = typer.Option("", "--title", help="chart title (default: the run directory name)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON object"),
) -> None:
    """Draw RUN_DIR/gantt.png (one lane per GPU) and print a summary of the run."""
    from makespan.gantt import load_events, render_gantt, summarize, summary_stats

    events_file = run_dir / "events.jsonl"
    if not events_file.exists():
        typer.echo(f"error: {events_file} not found (run `makespan demo` or `makespan replay` first)", err=True)
        raise typer.Exit(2)
    try:
        events = load_events(events_file)
        if not events:
            typer.echo(f"error: {events_file} holds no events", err=True)
            raise typer.Exit(2)
        gpus = _gpu_order(run_dir)
        png = render_gantt(events, str(out or run_dir / "gantt.png"), gpu_order=gpus,
                           title=title or f"makespan run {run_dir.resolve().name}")
    except MakespanError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    if as_json:
        typer.echo(json.dumps({"gantt": png, **summary_stats(events, gpus)}, sort_keys=True))
    else:
        typer.echo(summarize(events, gpus))
        typer.echo(f"gantt chart: {png}")


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to ``app``."""
    app.command("report")(report)
