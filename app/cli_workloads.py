"""CLI for multi-step workloads: ``makespan submit-workload FILE [--fleet FLEET]``,
``makespan workload-status ID`` and ``makespan cancel-workload ID`` (see docs/workloads.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from makespan.errors import MakespanError
from makespan.cli_support import context, fail



def register(app: typer.Typer) -> None:
    """Add the workload commands to the ``makespan`` CLI."""

    _ctx, _fail = context, fail

    @app.command("submit-workload")
    def submit_workload_cmd(file: Path = typer.Argument(..., help="workload file (YAML or JSON)"),
                            fleet: Path | None = typer.Option(None, "--fleet", help="default: the fleet the "
                                                              "planner runs (a file given must be that fleet)")):
        """Validate a workload DAG and enqueue all its steps at once (or none). Prints its id. Validated
        against the fleet the planner published, as `makespan submit WORKLOAD` is; --fleet FILE is checked
        against it (and used while no planner has published one)."""
        from makespan.client import Client
        from makespan.models import load_fleet
        from makespan.workloads import load_workload, submit_workload

        try:
            s, r, k = _ctx()
            f = Client(r, s, load_fleet(fleet) if fleet is not None else None).fleet()
            wid = submit_workload(r, k, f, load_workload(file, f), s)
        except MakespanError as e:
            _fail(e)
        typer.echo(wid)

    @app.command("workload-status")
    def workload_status_cmd(workload_id: str, report: bool = typer.Option(False, help="add the workload report")):
        """A workload's state and its steps (JSON; times in unix s and ISO-8601 UTC, as `makespan status`); with --report its makespan, critical path and time waiting / in transitions / executing."""
        from makespan.workloads import workload_status

        try:
            s, r, k = _ctx()
            out = workload_status(r, k, workload_id)
            if report:
                from makespan.workload_report import workload_report

                out["report"] = workload_report(r, k, workload_id)
        except MakespanError as e:
            _fail(e)
        typer.echo(json.dumps(out, indent=2))

    @app.command("cancel-workload")
    def cancel_workload_cmd(workload_id: str):
        """Cancel a workload: queued steps now, running steps at their next phase boundary."""
        from makespan.workloads import cancel_workload

        try:
            s, r, k = _ctx()
            out = cancel_workload(r, k, workload_id)
        except MakespanError as e:
            _fail(e)
        typer.echo(json.dumps(out))
