"""CLI for multi-step workloads: ``makespan submit-workload FILE [--fleet FLEET]``,
``makespan workload-status ID`` and ``makespan cancel-workload ID`` (see docs/workloads.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from makespan.errors import MakespanError, SubmitOutcomeUnknown
from makespan.cli_support import EXIT_ALREADY_ENDED, context, fail, outcome_unknown, utc_text



JSON_ALREADY = ("the output is JSON already (as `why --json` and `jobs --json`): accepted, changes nothing "
                "(a script that adds --json everywhere works)")


def register(app: typer.Typer) -> None:
    """Add the workload commands to the ``makespan`` CLI."""

    _ctx, _fail = context, fail

    @app.command("functions")
    def functions_cmd(as_json: bool = typer.Option(False, "--json", help="print the list as JSON")):
        """The workload functions GPU workers registered: live or not, the hosts the planner places their jobs
        on, endpoint, parameters, retries, timeout, and the execute time the planner uses (learned median of
        the last runs, or the function's expected_s until MAKESPAN_ESTIMATE_MIN_RUNS runs were measured)."""
        from makespan.cli_support import held_only_by_the_dead_here, published_fleet
        from makespan.estimates import estimate_s
        from makespan.registry import listing

        try:
            s, r, k = _ctx()
            rows = listing(r, k)
            try:
                fleet = published_fleet(r, k, required=False)
            except MakespanError:
                fleet = None
            for row in rows:
                if row["live"] and held_only_by_the_dead_here(r, k, row["name"]):
                    row["live"] = False  # its workers on this machine died; their marks outlive them (as `ready` says)
                endpoints = [row["definition"].get("endpoint"), *(row["definition"].get("helpers") or [])]
                row["missing_endpoints"] = ([name for name in endpoints if name and name not in fleet.endpoints]
                                            if fleet is not None else [])
                definition = row["definition"]
                endpoint = definition.get("endpoint")
                expected = definition.get("expected_s")
                if endpoint:
                    planned_s, runs = estimate_s(r, k, row["name"], endpoint, float(expected or 0.0),
                                                 s.estimate_min_runs)
                    row["planned_execute_s"] = planned_s if runs >= s.estimate_min_runs or expected else None
                    row["measured_runs"] = runs
                else:  # the submit names the endpoint: estimates are per (function, endpoint)
                    row["planned_execute_s"], row["measured_runs"] = None, None
        except MakespanError as e:
            _fail(e)
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        if not rows:
            typer.echo(f"no GPU worker has registered a workload function under key prefix {k.prefix!r} "
                       "(`makespan gpu-worker --workloads MODULE` registers its module's functions)", err=True)
            return
        for row in rows:
            definition = row["definition"]
            state = "refused" if row["refused"] else "live" if row["live"] else "not live"
            if row["missing_endpoints"]:  # submits are refused: the planner's fleet cannot run it
                state += (f" (the planner's fleet has no endpoint {', '.join(row['missing_endpoints'])}: a submit that "
                          "does not name another with --endpoint is refused)")
            where = ", ".join(row["hosts"]) or "any host"
            if row["hosts"] and not row["hosts_live"]:
                where = f"registered last on {where}"
            planned = row["planned_execute_s"]
            runs = row["measured_runs"]
            estimate = ("" if planned is None else
                        f", planned execute {planned:.3g} s ({'median of ' + str(runs) + ' runs' if runs and runs >= s.estimate_min_runs else 'expected_s'})")
            if not definition:  # refused before it was ever published: only the refusal is known
                typer.echo(f"{row['name']}: {state}: {row['refused']}")
                continue
            typer.echo(f"{row['name']}({row['signature'] if row['signature'] is not None else '?'}): {state}, "
                       f"endpoint {definition.get('endpoint') or '(named by each submit)'}, {where}; "
                       f"retries {definition.get('retries', 0)}, timeout "
                       f"{str(definition.get('timeout_s')) + ' s' if definition.get('timeout_s') else 'none'}"
                       f"{estimate}" + (f"; refused: {row['refused']}" if row["refused"] else ""))

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
        except SubmitOutcomeUnknown as e:
            outcome_unknown(e)
        except MakespanError as e:
            _fail(e)
        typer.echo(wid)

    @app.command("workload-status")
    def workload_status_cmd(workload_id: str, report: bool = typer.Option(False, help="add the workload report"),
                            as_json: bool = typer.Option(False, "--json", help=JSON_ALREADY)):
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
    def cancel_workload_cmd(workload_id: str, as_json: bool = typer.Option(False, "--json", help=JSON_ALREADY)):
        """Cancel a workload: queued steps now, running steps at their next phase boundary. Prints JSON:
        {"cancelled": n queued steps, "cancel_requested": n running steps, "already_ended": null, or the state the
        workload had already ended in (completed, failed, cancelled)}. Exit 0: this call cancelled something (on a
        failed workload, its independent steps still going); 5: it had already ended and nothing was cancelled
        (stderr says how and when); 2: an unknown workload; 69: Redis unreachable."""
        from makespan import telemetry
        from makespan.workloads import cancel_workload_outcome

        telemetry.setup_cli_tracing()  # its queued steps' root spans end here
        try:
            s, r, k = _ctx()
            out = cancel_workload_outcome(r, k, workload_id)
        except MakespanError as e:
            _fail(e)
        ended_at = out.pop("ended_at")
        typer.echo(json.dumps(out))
        if out["already_ended"] is None:
            return
        when = f" at {utc_text(ended_at)}" if ended_at is not None else ""
        if out["cancelled"] or out["cancel_requested"]:
            typer.echo(f"workload {workload_id} had already {out['already_ended']}{when}; its steps still going "
                       "were cancelled", err=True)
            return
        typer.echo(f"workload {workload_id} had already ended ({out['already_ended']}{when}): nothing to cancel",
                   err=True)
        raise typer.Exit(EXIT_ALREADY_ENDED)
