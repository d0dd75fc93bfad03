"""Lifecycle commands of the ``makespan`` CLI and the render pipeline.

``makespan.cli`` calls :func:`register` on its typer app, adding:

* ``makespan incidents``: list incidents raised by the health observer.
* ``makespan observer --fleet FILE``: run the health observer process.
* ``makespan endpoint-server --port P``: the small real endpoint program.
* ``makespan render-pipeline``: the render pipeline of issue 4, end to end with the
  process driver (see :func:`run_render_pipeline`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import typer

from makespan.cli_support import fail
from makespan.errors import MakespanError, PhaseError, ValidationError
from makespan.keys import Keys
from makespan.models import FleetSpec, load_fleet
from makespan.settings import Settings

from makespan.examples import FLEET as EXAMPLE_FLEET  # noqa: E402 - the render-pipeline fleet
SPAWN_OVERHEAD_S = 2.0  # wall seconds a real process start adds to a time-scaled cold start
PHASES = ("allocate", "evict_coder", "start_renderer", "start_embed", "execute_cards", "clear_embed",
          "restore_coder", "agenda_complete")


def _group(fleet: FleetSpec, endpoint: str, host: str) -> list[str]:
    """GPU UUIDs of ``endpoint``'s set-point group on ``host``."""
    by_index = {g.index: g.uuid for h in fleet.hosts if h.name == host for g in h.gpus}
    for sp in fleet.endpoints[endpoint].set_point:
        if sp.host == host:
            return [by_index[i] for i in sp.gpus]
    raise PhaseError(f"endpoint {endpoint!r} has no set point on host {host!r}")


def _set_point_on(fleet: FleetSpec, host: str) -> list[tuple[str, list[str]]]:
    out = []
    for name, e in fleet.endpoints.items():
        for sp in e.set_point:
            if sp.host == host:
                out.append((name, _group(fleet, name, host)))
    return out


def _spawn_observer(settings: Settings, fleet_path: Path, probe_interval_s: float) -> subprocess.Popen:
    env = {**os.environ, **settings.to_env()}
    return subprocess.Popen([sys.executable, "-m", "makespan.workers.observer", "--fleet", str(fleet_path),
                             "--probe-interval-s", repr(probe_interval_s)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=str(Path(__file__).resolve().parent.parent))


def run_render_pipeline(settings: Settings, fleet_path: Path = EXAMPLE_FLEET, host: str | None = None,
                        cards: int = 20, card_latency_ms: float = 50.0, observer: bool = True,
                        probe_interval_s: float = 0.2, log_dir: str | None = None) -> dict[str, Any]:
    """Run the render pipeline with real endpoint processes and return its record.

    Steps: bring up ``host``'s set point (coder on its TP group, embed), then
    allocate the coder's GPUs → evict the coder (agenda ``POSITIVE``) → start the
    renderer (spawn + health check) → start the embedding helper → execute ``cards``
    cards (a completion on the renderer, then an embedding per card, over HTTP) →
    clear the embedding helper → restore the coder (stop the renderer, start the
    coder) → complete the agenda entry; finally stop what it started. With
    ``observer`` a health-observer process watches throughout.

    Returns:
        ``{"phases": [{"phase", "start_s", "duration_s"}], "makespan_s", "cards",
        "gpus", "incidents": [...raised during the pipeline], "agenda_left"}``;
        times in wall seconds from the start of ``allocate``.

    Raises:
        PhaseError: a start failed its health check, or a card request failed.
        LeaseError: the agenda lock was lost mid-pipeline.
    """
    from makespan.redis_conn import connect
    from makespan.workers.agenda import AgendaTracker
    from makespan.workers.drivers import get_driver
    from makespan.workers.drivers.registry import list_instances, register_instance, unregister_instance
    from makespan.workers.observer import list_incidents

    fleet = load_fleet(fleet_path)
    missing = sorted({"coder", "embed", "renderer"} - set(fleet.endpoints))
    if missing:
        raise ValidationError("fleet", str(fleet_path), f"the render pipeline needs endpoints coder, embed and "
                                                        f"renderer; this fleet lacks {', '.join(missing)}")
    host = host or next((sp.host for sp in fleet.endpoints["coder"].set_point), None)
    hosts_with_coder = sorted({sp.host for sp in fleet.endpoints["coder"].set_point})
    if host not in hosts_with_coder:
        raise ValidationError("host", host, f"the render pipeline runs on a host where coder is at the set point: "
                                            f"{', '.join(hosts_with_coder) or 'none in this fleet'}")
    r, keys, ts = connect(settings.redis_url), Keys(settings.key_prefix), settings.time_scale
    drv = get_driver("process", **({"log_dir": log_dir} if log_dir else {}))
    agenda = AgendaTracker(r, keys)
    ep = fleet.endpoints
    started: list = []
    obs = None
    before = {i.id for i in list_instances(r, keys)}
    try:
        for name, gpus in _set_point_on(fleet, host):  # the baseline the pipeline starts from
            inst = drv.start(ep[name], gpus, ts, host)
            register_instance(r, keys, inst)
            started.append(inst)
        coder = next(i for i in started if i.endpoint == "coder")
        if observer:
            obs = _spawn_observer(settings, fleet_path, probe_interval_s)
            time.sleep(max(3 * probe_interval_s, 1.0))  # let it see the set point healthy
        t_start = time.time()
        phases: list[dict] = []
        t0 = time.monotonic()

        def phase(name: str, fn):
            p0 = time.monotonic()
            out = fn()
            phases.append({"phase": name, "start_s": round(p0 - t0, 3),
                           "duration_s": round(time.monotonic() - p0, 3)})
            return out

        gpus = phase("allocate", lambda: _group(fleet, "coder", host))
        r_gpus = gpus[:ep["renderer"].tensor_parallel]
        e_gpus = (gpus[len(r_gpus):] or gpus)[:ep["embed"].tensor_parallel]
        execute_s = cards * card_latency_ms / 1000.0 * 2 / ep["renderer"].slots
        planned_s = ((ep["coder"].evict_s + ep["renderer"].cold_start_s + ep["embed"].cold_start_s
                      + ep["embed"].evict_s + ep["renderer"].evict_s + ep["coder"].cold_start_s) * ts
                     + execute_s + 3 * SPAWN_OVERHEAD_S)
        entry = agenda.register(f"render-{uuid.uuid4().hex[:8]}", "POSITIVE", ["coder", "renderer", "embed"],
                                gpus, planned_s, lock_ttl_s=max(settings.lease_ttl_s, 3.0))
        try:
            def evict():
                unregister_instance(r, keys, coder.id, gpus=coder.gpus)
                drv.stop(coder)
                started.remove(coder)
            phase("evict_coder", evict)
            entry.check()
            renderer = phase("start_renderer", lambda: drv.start(ep["renderer"], r_gpus, ts, host))
            started.append(renderer)
            register_instance(r, keys, renderer)
            helper = phase("start_embed", lambda: drv.start(ep["embed"], e_gpus, ts, host))
            started.append(helper)
            register_instance(r, keys, helper)
            entry.check()
            n_done = phase("execute_cards", lambda: _execute_cards(renderer.url, helper.url, cards,
                                                                   ep["renderer"].slots))
            entry.check()

            def clear():
                unregister_instance(r, keys, helper.id, gpus=helper.gpus)
                drv.stop(helper)
                started.remove(helper)
            phase("clear_embed", clear)

            def restore():
                unregister_instance(r, keys, renderer.id, gpus=renderer.gpus)
                drv.stop(renderer)
                started.remove(renderer)
                back = drv.start(ep["coder"], gpus, ts, host)
                started.append(back)
                register_instance(r, keys, back)
            phase("restore_coder", restore)
        finally:
            phase("agenda_complete", lambda: agenda.complete(entry))
        makespan_s = round(time.monotonic() - t0, 3)
        if obs is not None:
            time.sleep(2 * probe_interval_s)  # one more look at the restored set point
        incidents = [i for i in list_incidents(r, keys) if i["detected_at"] >= t_start]
        return {"phases": phases, "makespan_s": makespan_s, "cards": n_done, "gpus": gpus,
                "incidents": incidents, "agenda_left": agenda.count()}
    finally:
        if obs is not None:
            obs.terminate()
            obs.wait(timeout=10)
        for inst in list_instances(r, keys):  # ours, and any the observer restarted
            if inst.id not in before:
                unregister_instance(r, keys, inst.id, gpus=inst.gpus)
                drv.stop(inst)
        for inst in started:
            drv.stop(inst)
        r.close()


def _execute_cards(render_url: str, embed_url: str, cards: int, slots: int) -> int:
    """Render each card (completion) then embed it, ``slots`` at a time; returns cards done."""
    import httpx  # here, not at module level: it costs every CLI command ~0.1-0.3 s of import

    with httpx.Client(timeout=30.0) as client:
        def one(i: int) -> bool:
            c = client.post(f"{render_url}/v1/completions", json={"prompt": f"render card {i}", "max_tokens": 64})
            if c.status_code != 200:
                raise PhaseError(f"card {i}: renderer answered HTTP {c.status_code}")
            text = c.json()["choices"][0]["text"]
            e = client.post(f"{embed_url}/v1/embeddings", json={"input": text})
            if e.status_code != 200:
                raise PhaseError(f"card {i}: embedding answered HTTP {e.status_code}")
            return True

        with ThreadPoolExecutor(max_workers=max(1, slots)) as pool:
            return sum(pool.map(one, range(cards)))


# -- commands ----------------------------------------------------------------------------
def _conn(redis_url: str | None, prefix: str | None):
    from makespan.redis_conn import connect

    s = Settings.from_env()
    return connect(redis_url or s.redis_url), Keys(prefix or s.key_prefix)


def incidents(redis_url: str | None = typer.Option(None, "--redis-url", help="default: MAKESPAN_REDIS_URL"),
              prefix: str | None = typer.Option(None, "--prefix", help="default: MAKESPAN_KEY_PREFIX"),
              as_json: bool = typer.Option(False, "--json", help="one JSON object per line"),
              limit: int = typer.Option(100, "--limit", min=0, help="the latest N incidents (oldest of them first); "
                                        "0: every one the stream holds")) -> None:
    """List incidents raised by the health observer (with their recovery), the latest --limit of them."""
    from makespan.workers.observer import list_incidents

    try:
        r, keys = _conn(redis_url, prefix)
        rows = list_incidents(r, keys)
    except MakespanError as e:
        fail(e)  # Redis unreachable: RedisUnreachable's message
    if limit and len(rows) > limit:  # a big fleet's stream holds up to its cap (10,000): the newest matter
        still_open = sum(1 for row in rows[:-limit] if row["recovery"] is None)  # not hidden silently (a verifier)
        typer.echo(f"the latest {limit} of {len(rows)} incidents (--limit 0: all)"
                   + (f"; {still_open} older ones have no recovery yet" if still_open else ""), err=True)
        rows = rows[-limit:]
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row, sort_keys=True))
        return
    if not rows:
        typer.echo("no incidents")
    for i in rows:
        rec = i["recovery"] or {}
        when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(i["detected_at"]))  # UTC, as why and jobs
        ctx = ",".join(f"{c['op_id']}({c['mode']})" for c in i["agenda_context"]) or "none"
        # how long it took, for an outcome that ended it (a "not restarted" or "failed" one took no time to speak of)
        ended = str(rec.get("outcome", "")).startswith(("recovered", "closed"))
        took = f" in {rec['recovery_s']:g} s" if ended and rec.get("recovery_s") is not None else ""
        subject = i["endpoint"] or f"host {i.get('host', '')}"  # host_down: no endpoint
        gpus = (",".join(i["gpus"]) if len(i["gpus"]) <= 4 else  # a host_down of a 32-GPU host: not 32 ids
                f"{','.join(i['gpus'][:2])},… ({len(i['gpus'])} GPUs: --json lists them)")
        typer.echo(f"{i['incident_id']}  {when}  {subject}  {i['failure_mode']}  gpus={gpus}  "
                   f"agenda={ctx}  recovery={rec.get('outcome', 'pending')}{took}\n    effect: {i['effect']}")


def observer(fleet: Path = typer.Option(..., "--fleet", help="TOML fleet file"),
             probe_interval_s: float = typer.Option(1.0, "--probe-interval-s", help="wall s between two probes of "
                                                    "every endpoint instance"),
             overrun_factor: float = typer.Option(1.5, "--overrun-factor",
                                                  help="a transition later than factor × its planned length is an incident"),
             min_overrun_slack_s: float = typer.Option(2.0, "--min-overrun-slack-s",
                                                       help="least slack past a transition's expected end before it "
                                                            "is late, s (the scheduling jitter of a loaded host)"),
             host_down_grace_s: float = typer.Option(30.0, "--host-down-grace-s",
                                                     help="how long a host has no live GPU worker before its "
                                                          "host_down incident, s (a rolling restart is shorter)"),
             failure_threshold: int = typer.Option(3, "--failure-threshold",
                                                   help="failed probes in a row before a live endpoint instance is an "
                                                        "incident and restarted (a process found gone: at once)"),
             probe_timeout_s: float = typer.Option(2.0, "--probe-timeout-s",
                                                   help="how long one probe waits for a process endpoint's health "
                                                        "route, s (a loaded server answers late)"),
             metrics_port: int | None = typer.Option(None, "--metrics-port",
                                                     help="Prometheus port (0: none; default: MAKESPAN_METRICS_PORT)")
             ) -> None:
    """Run the health observer process (probes endpoint instances; raises incidents)."""
    from makespan.workers.observer import main

    port = [] if metrics_port is None else ["--metrics-port", str(metrics_port)]
    raise typer.Exit(main(["--fleet", str(fleet), "--probe-interval-s", repr(probe_interval_s),
                           "--overrun-factor", repr(overrun_factor), "--min-overrun-slack-s", repr(min_overrun_slack_s),
                           "--host-down-grace-s", repr(host_down_grace_s), "--failure-threshold", str(failure_threshold),
                           "--probe-timeout-s", repr(probe_timeout_s), *port]))


def endpoint_server(port: int = typer.Option(..., "--port", min=0, max=65535, help="TCP port to serve on (127.0.0.1)"),
                    model: str = typer.Option("stub", "--model", help="model name it reports"),
                    load_time_s: float = typer.Option(0.0, "--load-time-s", help="wall s before it answers healthy "
                                                      "(a model load)"),
                    latency_ms: float = typer.Option(0.0, "--latency-ms", help="wall ms each request takes"),
                    hold_gpu_mib: int = typer.Option(0, "--hold-gpu-mib", help="GPU memory held while awake (torch)"),
                    sleep_s: float = typer.Option(0.0, "--sleep-s", help="wall s a POST /sleep takes"),
                    wake_s: float = typer.Option(0.0, "--wake-s", help="wall s a POST /wake_up takes"),
                    sleep_ram_mib: int = typer.Option(0, "--sleep-ram-mib", help="host RAM a level-1 sleeper holds")) -> None:
    """Run the small real endpoint program (OpenAI-compatible routes, vLLM sleep/wake)."""
    from makespan.workers.endpoint_server import serve

    try:
        serve(port, model, load_time_s, latency_ms, hold_gpu_mib=hold_gpu_mib, sleep_s=sleep_s, wake_s=wake_s,
              sleep_ram_mib=sleep_ram_mib)
    except OSError as e:  # the port taken (errno 98), or not ours to bind
        fail(MakespanError(f"--port {port}: cannot serve there: {e.strerror or e}"))


def render_pipeline(fleet: Path = typer.Option(EXAMPLE_FLEET, "--fleet", help="fleet with coder, embed, renderer"),
                    host: str | None = typer.Option(None, "--host", help="default: the coder's first set-point host"),
                    time_scale: float = typer.Option(0.01, "--time-scale", help="wall s per modelled s of cold starts"),
                    cards: int = typer.Option(20, "--cards", help="cards to render (a completion, then an "
                                              "embedding, each)"),
                    card_latency_ms: float = typer.Option(50.0, "--card-latency-ms", help="wall ms each endpoint "
                                                          "request takes"),
                    with_observer: bool = typer.Option(True, "--observer/--no-observer", help="run the health "
                                                       "observer alongside"),
                    as_json: bool = typer.Option(False, "--json", help="print the record as JSON")) -> None:
    """Run the render pipeline end to end with real endpoint processes; print phase timings."""
    try:
        if cards < 1:
            raise ValidationError("cards", cards, "must be at least 1")
        if not 0.0 < time_scale < float("inf"):
            raise ValidationError("time_scale", time_scale, "must be a positive, finite number")
        s = Settings.from_env(time_scale=time_scale)
        out = run_render_pipeline(s, fleet, host, cards, card_latency_ms, with_observer)
    except MakespanError as e:
        fail(e)  # Redis unreachable: RedisUnreachable's message
    if as_json:
        typer.echo(json.dumps(out, sort_keys=True, default=str))
        return
    typer.echo(f"render pipeline on {', '.join(out['gpus'])} (time scale {time_scale}):")
    for p in out["phases"]:
        typer.echo(f"  {p['phase']:<16} start {p['start_s']:7.3f} s   duration {p['duration_s']:7.3f} s")
    typer.echo(f"  makespan {out['makespan_s']:.3f} s; cards {out['cards']}; agenda entries left "
               f"{out['agenda_left']}; incidents during the pipeline {len(out['incidents'])}")


def register(app: typer.Typer) -> None:
    """Add ``incidents``, ``observer``, ``endpoint-server`` and ``render-pipeline``."""
    app.command("incidents")(incidents)
    app.command("observer")(observer)
    app.command("endpoint-server")(endpoint_server)
    app.command("render-pipeline")(render_pipeline)
