"""Observability commands of the ``makespan`` CLI: ``makespan report RUN_DIR`` and
``makespan dashboard``.

``makespan.cli`` calls :func:`register` on its typer app. ``report`` reads
``RUN_DIR/events.jsonl`` (written by ``makespan demo`` and ``makespan replay``), takes
the GPU lane order from ``RUN_DIR/fleet.toml`` when present, writes
``RUN_DIR/gantt.png`` and prints the text summary of :func:`makespan.gantt.summarize`.
``dashboard`` serves the live, read-only web view of :mod:`makespan.dashboard`
(docs/dashboard.md) for the deployment named by ``MAKESPAN_REDIS_URL`` and
``MAKESPAN_KEY_PREFIX``.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from makespan.cli_support import fail
from makespan.errors import MakespanError


def _gpu_order(run_dir: Path, published_first: bool = False) -> list[str] | None:
    """The GPU lane order of RUN_DIR's fleet.toml, else of its fleet.json (the published
    fleet --from-redis wrote: first with ``published_first``, over an older fleet.toml)."""
    from makespan.models import load_fleet, parse_fleet

    readers = [(run_dir / "fleet.toml", load_fleet),
               (run_dir / "fleet.json", lambda path: parse_fleet(json.loads(path.read_text())))]
    for path, read in (readers[::-1] if published_first else readers):
        try:
            if path.exists():
                return read(path).gpu_uuids()
        except (MakespanError, ValueError, OSError):
            return None
    return None


def _export_events(run_dir: Path) -> None:
    """Write RUN_DIR/events.jsonl from the deployment's events stream (``P:events``), and
    RUN_DIR/fleet.json from its published fleet; exit 69 when Redis cannot be reached."""
    import redis

    from makespan import events
    from makespan.cli_support import context, store_error

    try:
        _settings, r, keys = context()
        rows = list(events.read_all(r, keys.events))
        fleet_json = r.get(keys.fleet)
    except MakespanError as e:
        fail(e)
    except redis.RedisError as e:
        fail(store_error("reading the events stream", e))
    if not rows:
        typer.echo(f"error: the events stream {keys.events} is empty (no deployment under key prefix "
                   f"{keys.prefix!r} at this MAKESPAN_REDIS_URL?)", err=True)
        raise typer.Exit(2)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        events.dump_jsonl(rows, run_dir / "events.jsonl")
        if fleet_json:
            (run_dir / "fleet.json").write_text(fleet_json)
    except OSError as e:  # a file where the directory should be, no permission
        typer.echo(f"error: cannot write the run directory {run_dir}: {e.strerror or e}", err=True)
        raise typer.Exit(2) from e
    typer.echo(f"wrote {len(rows)} events to {run_dir / 'events.jsonl'}", err=True)


def report(
    run_dir: Path = typer.Argument(..., help="run directory holding events.jsonl (and fleet.toml)"),
    out: Path = typer.Option(None, "--out", help="PNG path (default RUN_DIR/gantt.png)"),
    title: str = typer.Option("", "--title", help="chart title (default: the run directory name)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON object"),
    from_redis: bool = typer.Option(False, "--from-redis", help="first write RUN_DIR/events.jsonl (and RUN_DIR/"
                                    "fleet.json) from the running deployment at MAKESPAN_REDIS_URL and "
                                    "MAKESPAN_KEY_PREFIX: the events its stream still holds"),
) -> None:
    """Draw RUN_DIR/gantt.png (one lane per GPU) and print a summary of the run (a demo's or a
    replay's run directory, or, with --from-redis, a live deployment's events)."""
    from makespan.gantt import load_events, render_gantt, summarize, summary_stats

    events_file = run_dir / "events.jsonl"
    if from_redis:
        _export_events(run_dir)
    if not events_file.exists():
        typer.echo(f"error: {events_file} not found (run `makespan demo` or `makespan replay` first, or give "
                   "--from-redis for a running deployment's events)", err=True)
        raise typer.Exit(2)
    try:
        events = load_events(events_file, on_cut_tail=lambda notice: typer.echo(f"warning: {notice}", err=True))
        if not events:
            typer.echo(f"error: {events_file} holds no events", err=True)
            raise typer.Exit(2)
        gpus = _gpu_order(run_dir, published_first=from_redis)
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


def dashboard(
    port: int = typer.Option(9180, "--port", help="TCP port to serve on"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind (0.0.0.0: every interface)"),
    basic_auth: str = typer.Option("", "--basic-auth", envvar="MAKESPAN_DASHBOARD_BASIC_AUTH",
                                   help="user:password[,user2:password2] (as Flower's; from the environment, it "
                                        "stays out of ps); default: no auth"),
    url_prefix: str = typer.Option("", "--url-prefix", help="serve under /PREFIX/ (behind a reverse proxy)"),
    window_min: float = typer.Option(10.0, "--window-min", help="minutes of history in the Gantt"),
    refresh_s: float = typer.Option(1.0, "--refresh-s", help="seconds between live updates (server-sent events)"),
    fleet: Path = typer.Option(None, "--fleet", help="fleet file (default: the one the planner stored in Redis)"),
) -> None:
    """Serve the live read-only dashboard: GPU lanes with the plan ahead, queue, endpoints, incidents."""
    from makespan.dashboard.app import DashboardConfig, serve
    from makespan.settings import Settings
    from makespan.wait_reasons import stale_after_s

    try:
        s = Settings.from_env()
        spec = None
        if fleet is not None:
            from makespan.models import load_fleet

            spec = load_fleet(fleet)
        cfg = DashboardConfig(redis_url=s.redis_url, key_prefix=s.key_prefix, window_s=window_min * 60.0,
                              refresh_s=refresh_s, basic_auth=basic_auth, url_prefix=url_prefix, fleet=spec,
                              stale_after_s=stale_after_s(s.lease_ttl_s))  # as `makespan why`
        from makespan.redis_conn import redacted

        if not basic_auth and host not in ("127.0.0.1", "localhost", "::1"):
            typer.echo(f"warning: the dashboard on {host} has no authentication: anyone who reaches it sees every "
                       "job's arguments, results and tracebacks (set --basic-auth or MAKESPAN_DASHBOARD_BASIC_AUTH, "
                       "and put it behind a TLS proxy)", err=True)
        serve(cfg, host, port, announce=lambda url: typer.echo(
            f"makespan dashboard on {url} (Redis {redacted(s.redis_url)}, key prefix {s.key_prefix})", err=True),
            shutdown_grace_s=s.shutdown_grace_s)
    except MakespanError as e:
        fail(e)  # Redis unreachable: RedisUnreachable's message


def register(app: typer.Typer) -> None:
    """Add the ``report`` and ``dashboard`` commands to ``app``."""
    app.command("report")(report)
    app.command("dashboard")(dashboard)
