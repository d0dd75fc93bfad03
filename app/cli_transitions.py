"""``makespan transitions``: configured vs learned vs last duration of every transition
kind of every endpoint (:mod:`makespan.estimates`), per host and over all hosts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from makespan.errors import MakespanError, ValidationError
from makespan.estimates import TRANSITION_KINDS, prior_s, read_transition_windows, transition_estimate
from makespan.keys import Keys
from makespan.models import FleetSpec
from makespan.settings import Settings
from makespan.cli_support import fail, published_fleet


def transition_table(r: Any, keys: Keys, fleet: FleetSpec, settings: Settings) -> list[dict[str, Any]]:
    """One row per (endpoint, kind, host) that applies — ``host`` ``"*"`` is the planner's
    figure over every host — with ``configured_s`` (the fleet file), ``learned_s`` (the
    figure planned now: see :func:`makespan.estimates.transition_estimate`), ``source``
    (learned, others, prior), ``observations`` and ``last_s`` (the latest measured on that
    host; for ``"*"`` the latest of the last host in fleet order that has one; None: none). Workload seconds. Kinds an endpoint cannot have are left out
    (sleep and wake without a sleep mode, wake_level2 without ``wake_level2_s`` beside
    sleep level 1). Raises StoreError: Redis failed."""
    hosts = [h.name for h in fleet.hosts]
    windows = read_transition_windows(r, keys, fleet.endpoints, hosts)
    rows = []
    for name, spec in sorted(fleet.endpoints.items()):
        for kind in TRANSITION_KINDS:
            if kind in ("sleep", "wake") and spec.wake_s is None:
                continue
            if kind == "wake_level2" and len(spec.sleep_options) < 2:  # no level 2 beside level 1
                continue
            prior = prior_s(spec, kind)
            for host in ["*", *hosts]:
                est = transition_estimate(windows, name, None if host == "*" else host, kind, prior,
                                          settings.transition_min_observations, settings.transition_quantile)
                last = None
                if host == "*":
                    lasts = [windows[(name, h, kind)][0] for h in hosts if windows.get((name, h, kind))]
                    last = lasts[-1] if lasts else None
                else:
                    last = est.last_s
                rows.append({"endpoint": name, "kind": kind, "host": host, "configured_s": prior,
                             "learned_s": round(est.seconds, 3), "source": est.source,
                             "observations": est.observations, "last_s": None if last is None else round(last, 3)})
    return rows


def transitions(fleet: Path | None = typer.Option(None, "--fleet", help="TOML fleet file (default: the fleet the "
                                                                          "planner published)"),
                redis_url: str | None = typer.Option(None, "--redis-url", help="default: MAKESPAN_REDIS_URL"),
                prefix: str | None = typer.Option(None, "--prefix", help="default: MAKESPAN_KEY_PREFIX"),
                as_json: bool = typer.Option(False, "--json", help="one JSON object per line"),
                endpoint: str | None = typer.Option(None, "--endpoint", help="only this endpoint's rows"),
                host: str | None = typer.Option(None, "--host", help="only this host's rows ('*': the planner's "
                                                "figures over all hosts)"),
                every_host: bool = typer.Option(False, "--all", help="also list the rows of hosts with no measurement "
                                                "of their own (--json always has them)")) -> None:
    """Transition durations per endpoint and kind (evict, sleep, wake, wake_level2, cold_start, restore):
    configured (fleet file) vs learned (what is planned now: the running p90 of measured
    ones once there are enough, MAKESPAN_TRANSITION_MIN_OBSERVATIONS) vs the last measured;
    host * is the planner's figure over all hosts, then each host that measured the kind
    (--all: every host). Workload seconds."""
    from makespan.models import load_fleet
    from makespan.redis_conn import connect

    try:
        s = Settings.from_env()
        r = connect(redis_url or s.redis_url)
        keys = Keys(prefix or s.key_prefix)
        spec = load_fleet(fleet) if fleet is not None else published_fleet(r, keys)
        if endpoint is not None and endpoint not in spec.endpoints:
            raise ValidationError("endpoint", endpoint, f"not in the fleet; known: {', '.join(sorted(spec.endpoints))}")
        if host is not None and host != "*" and host not in {h.name for h in spec.hosts}:
            raise ValidationError("host", host, f"not in the fleet; known: {', '.join(h.name for h in spec.hosts)}")
        rows = transition_table(r, keys, spec, s)
    except MakespanError as e:
        fail(e)
    rows = [row for row in rows if (endpoint is None or row["endpoint"] == endpoint)
            and (host is None or row["host"] == host)]
    if as_json:  # every row (the filters given)
        for row in rows:
            typer.echo(json.dumps(row, sort_keys=True))
        return
    def measured_here(row: dict[str, Any]) -> bool:  # this kind, or one pooled with it, measured on the host
        return row["last_s"] is not None or row["source"] == "learned" or (row["source"] == "prior"
                                                                            and row["observations"] > 0)

    unmeasured = [row for row in rows if row["host"] != "*" and not measured_here(row)]
    if not every_host and host is None:  # a host with no measurement of its own repeats the * row's figure
        rows = [row for row in rows if row["host"] == "*" or measured_here(row)]
    typer.echo(f"{'endpoint':<14} {'kind':<11} {'host':<12} {'configured_s':>12} {'learned_s':>10} {'source':<8} "
               f"{'n':>4} {'last_s':>8}")
    for x in rows:
        last = "-" if x["last_s"] is None else f"{x['last_s']:.3f}"
        typer.echo(f"{x['endpoint']:<14} {x['kind']:<11} {x['host']:<12} {x['configured_s']:>12.3f} "
                   f"{x['learned_s']:>10.3f} {x['source']:<8} {x['observations']:>4} {last:>8}")
    typer.echo(f"n: the measurements behind learned_s (cold_start and restore pool each other's; last_s is the kind's "
               f"own); learned once n >= {s.transition_min_observations} (MAKESPAN_TRANSITION_MIN_OBSERVATIONS), "
               "'others': other hosts' measurements, 'prior': the fleet file's figure"
               + (f"; {len(unmeasured)} rows of hosts with no measurement of their own left out (--all shows them)"
                  if unmeasured and not every_host and host is None else ""), err=True)



def register(app: typer.Typer) -> None:
    """Add ``transitions``."""
    app.command("transitions")(transitions)
