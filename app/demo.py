"""``makespan demo`` and ``makespan replay``: the live system on one machine.

Both resolve a Redis (``MAKESPAN_REDIS_URL`` if one answers, else an embedded
redis-server), start a planner and one GPU worker per host as real processes, submit
jobs at their (compressed) arrival times, show progress, then write the run directory
(``events.jsonl``, ``report.json``, ``fleet.toml``, ``gantt.png``, process logs) and stop
every process they started. Each run uses its own key prefix and deletes its keys at
the end (``--keep`` is not offered: the run directory holds everything).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from makespan import events as ev
from makespan import shutdown, telemetry
from makespan.errors import MakespanError, ValidationError
from makespan.examples import FLEET as EXAMPLE_FLEET
from makespan.keys import Keys
from makespan.live import LiveSystem, delete_prefix, wait_for
from makespan.models import FINAL_STATES, FleetSpec, load_fleet
from makespan.redis_conn import EmbeddedRedis, connect, ping, redacted, start_embedded
from makespan.run_report import live_report
from makespan.settings import Settings, check_policy
from makespan.traces import TraceJob, read_trace

DATA = Path(__file__).parent / "data"
DEMO_FLEET = EXAMPLE_FLEET
DEMO_TRACE = DATA / "itp-cluster05-head400.csv"
TERMINAL = FINAL_STATES

console = Console(stderr=True)


def _redis(url: str | None) -> tuple[str, EmbeddedRedis | None]:
    """The Redis to run on: ``url`` (else ``MAKESPAN_REDIS_URL``, else the default) when it
    answers, else an embedded redis-server started here (returned to be stopped).

    Raises:
        RedisAuthFailed: a Redis answered at ``url`` and refused its credentials (the user's
            Redis, with a wrong password: not passed over for an embedded one)."""
    url = url or os.environ.get("MAKESPAN_REDIS_URL") or "redis://127.0.0.1:6379/0"
    if ping(url):
        console.print(f"Redis: using {redacted(url)}")
        return url, None
    _raise_if_credentials_refused(url)
    emb = start_embedded()
    console.print(f"Redis: none answered at {redacted(url)}; started an embedded redis-server at {emb.url}")
    return emb.url, emb


def _raise_if_credentials_refused(url: str, timeout_s: float = 0.5) -> None:
    """Raise :class:`makespan.errors.RedisAuthFailed` when a Redis at ``url`` answers and
    refuses its credentials; return for any other failure (nothing answers)."""
    from makespan.redis_conn import AUTH_ERRORS, auth_failed

    try:
        c = connect(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
        try:
            c.ping()
        finally:
            c.close()
    except AUTH_ERRORS as e:
        raise auth_failed(url, e) from e
    except (redis.RedisError, OSError):
        return


def render_cards_pipeline(run_id: str) -> list[dict[str, Any]]:
    """The render-cards pipeline of the design notes as one call of the example workload
    function ``render_cards`` (:mod:`makespan.examples.render_cards`): 20 cards rendered on
    the renderer endpoint (a real process) with the ``embed`` helper started beside it
    and cleared after execute. Planned at 15 s a card."""
    return [{"key": f"{run_id}:render-cards", "workload": "render_cards", "args": [20],
             "options": {"priority": "HIGH", "service_s": 20 * 15.0}}]


DEMO_WORKLOADS = "makespan.examples.render_cards,makespan.examples.trace_jobs"  # what the demo's GPU workers load


def choose_time_scale(jobs: list[TraceJob], fleet: FleetSpec, target_wall_s: float) -> float:
    """Wall seconds per workload second so that the run lasts about ``target_wall_s``."""
    tp = {n: e.tensor_parallel for n, e in fleet.endpoints.items()}
    area = sum(tp[j.endpoint] * j.service_s for j in jobs) / max(1, fleet.gpu_count())
    span = max([area * 1.25] + [j.submit_s + j.service_s for j in jobs])
    return target_wall_s / max(span, 1.0)


def run_live(trace_jobs: list[TraceJob], fleet_path: Path, *, time_scale: float, report_path: Path | None,
             run_dir: Path | None, policy: str | None, extra: list[dict[str, Any]] | None = None,
             redis_url: str | None = None, timeout_s: float = 600.0, title: str = "makespan",
             render_pipeline: bool = False) -> dict[str, Any]:
    """Run ``trace_jobs`` (plus ``extra`` pipeline jobs at t=0) on the live system.
    With ``render_pipeline`` the render pipeline of the design notes first runs on its
    own with real endpoint processes (``makespan render-pipeline``) and its phase
    timings go into the report under ``render_pipeline``."""
    from makespan.planner.simulator import writable_report_path

    fleet = load_fleet(fleet_path)
    if policy:  # an unknown policy fails before anything starts
        check_policy(policy, "--policy")
    else:
        Settings.from_env()  # checks MAKESPAN_POLICY
    if report_path:
        report_path = writable_report_path(report_path)
    telemetry.instrument_producer("makespan-producer")
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
    run_dir = Path(run_dir or Path("runs") / run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(fleet_path, run_dir / "fleet.toml")
    base = Settings.from_env()
    # SIGTERM ends the run as Ctrl-C does: the finally blocks below stop the children (each in
    # a session of its own) and the embedded Redis, within the SIGTERM bound (makespan.shutdown)
    in_main = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    restore_sigterm = shutdown.on_sigterm(base.shutdown_grace_s, "demo", _exit_on_sigterm()) if in_main else None
    try:
        url, emb = _redis(redis_url)
        try:
            return _run_on(url, base, trace_jobs, fleet, fleet_path, run_dir, run_id, time_scale=time_scale,
                           report_path=report_path, policy=policy, extra=extra, timeout_s=timeout_s, title=title,
                           render_pipeline=render_pipeline)
        finally:
            if emb:
                emb.stop()
    finally:
        if restore_sigterm is not None:
            restore_sigterm()


def _exit_on_sigterm() -> Callable[[], None]:
    """A SIGTERM handler body that raises ``SystemExit(143)`` in the main thread once (a
    second SIGTERM does not cut the clean-up short; the watchdog bounds it)."""
    seen = threading.Event()

    def stop() -> None:
        if not seen.is_set():
            seen.set()
            raise SystemExit(128 + signal.SIGTERM)
    return stop


def _run_on(url: str, base: Settings, trace_jobs: list[TraceJob], fleet: FleetSpec, fleet_path: Path, run_dir: Path,
            run_id: str, *, time_scale: float, report_path: Path | None, policy: str | None,
            extra: list[dict[str, Any]] | None, timeout_s: float, title: str,
            render_pipeline: bool) -> dict[str, Any]:
    """:func:`run_live` on the Redis at ``url``: start the system, drive the jobs, report;
    everything started here is stopped on the way out."""
    modules = ",".join(m for m in (DEMO_WORKLOADS, base.workload_modules) if m)
    lease_ttl_s, heartbeat_s = max(5.0, base.lease_ttl_s), 1.0
    settings = Settings.from_env(redis_url=url, key_prefix=f"{base.key_prefix}-run-{run_id}",
                                 time_scale=time_scale, policy=policy or base.policy,
                                 lease_ttl_s=lease_ttl_s, heartbeat_s=heartbeat_s, planner_tick_s=0.05,
                                 # one renewal blocked for the whole socket timeout must not lose a
                                 # lease (makespan.settings.lease_renewal_warning): 3 s at the 5 s TTL
                                 redis_socket_timeout_s=min(base.redis_socket_timeout_s,
                                                            lease_ttl_s - 2 * heartbeat_s),
                                 workload_modules=modules)
    keys = Keys(settings.key_prefix)
    r = connect(url)
    system = LiveSystem(run_dir / "fleet.toml", fleet, settings, run_dir / "logs")
    started = time.monotonic()
    try:
        pipeline = _render_pipeline(settings, fleet_path, run_dir) if render_pipeline else None
        console.print(f"Starting a planner and {len(fleet.hosts)} GPU workers for {fleet.gpu_count()} simulated GPUs "
                      f"(policy {settings.policy}, time scale {time_scale:.2e} wall s per workload s) ...")
        system.start()
        out = _drive(r, keys, fleet, settings, trace_jobs, extra or [], timeout_s, title, system)
        job_ids, rejected = out
        events = list(ev.read_all(r, keys.events))
        ev.dump_jsonl(events, run_dir / "events.jsonl")
        report = live_report(r, keys, fleet, events, job_ids, time_scale, settings.policy, rejected=rejected)
        report["wall_s"] = round(time.monotonic() - started, 2)
        if pipeline is not None:
            report["render_pipeline"] = pipeline
        report["run_dir"] = str(run_dir)
        from makespan.planner.simulator import write_report

        write_report(run_dir / "report.json", report)
        if report_path:
            write_report(report_path, report)
        _gantt(events, fleet, run_dir, title)
        _print_summary(report, run_dir, report_path)
        return report
    finally:
        system.stop(grace_s=min(10.0, settings.shutdown_grace_s / 2))  # within the demo's own SIGTERM bound
        try:
            delete_prefix(r, keys)
        finally:
            r.close()


def _render_pipeline(settings: Settings, fleet_path: Path, run_dir: Path) -> dict[str, Any]:
    from dataclasses import replace

    from makespan.cli_lifecycle import run_render_pipeline

    console.print("Render pipeline with real endpoint processes (evict coder → start renderer → 20 cards → "
                  "clear embedding helper → restore coder) ...")
    rec = run_render_pipeline(replace(settings, time_scale=0.01), fleet_path, log_dir=str(run_dir / "logs"))
    for ph in rec["phases"]:
        console.print(f"  {ph['phase']:<16} +{ph['start_s']:6.2f} s  {ph['duration_s']:6.3f} s")
    console.print(f"  makespan {rec['makespan_s']:.2f} s, {rec['cards']} cards, incidents during the pipeline: "
                  f"{len(rec['incidents'])}, agenda entries left: {rec['agenda_left']}")
    return rec


def _drive(r, keys: Keys, fleet: FleetSpec, settings: Settings, trace_jobs: list[TraceJob],
           extra: list[dict[str, Any]], timeout_s: float, title: str,
           system: LiveSystem | None = None) -> tuple[list[str], int]:
    from makespan.client import Client

    client = Client(r, settings, fleet)  # the public API, as any producer submits
    wait_for(lambda: r.exists(keys.fn_live("trace_job")), 60, "the GPU workers to publish their workload functions")
    ids: list[str] = []
    rejected = 0
    lock = threading.Lock()
    for x in extra:
        job = client.submit(x["workload"], *x.get("args", ()), idempotency_key=x["key"], **x.get("options", {}))
        ids.append(job.id)
    t0 = time.monotonic()
    done_submitting = threading.Event()

    def feeder() -> None:
        nonlocal rejected
        for tj in trace_jobs:
            delay = t0 + tj.submit_s * settings.time_scale - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                h = client.submit("trace_job", tj.service_s, row=tj.id, endpoint=tj.endpoint, priority=tj.priority,
                                  service_s=tj.service_s, idempotency_key=f"trace:{tj.id}")
                with lock:
                    ids.append(h.id)
            except MakespanError as e:
                with lock:
                    rejected += 1
                console.print(f"[yellow]rejected trace job {tj.id}: {e}")
        done_submitting.set()

    th = threading.Thread(target=feeder, daemon=True)
    th.start()
    total = len(trace_jobs) + len(extra)
    deadline = time.monotonic() + timeout_s
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task(title, total=total, detail="")
        while True:
            with lock:
                snapshot = list(ids)
            p = r.pipeline(transaction=False)
            for j in snapshot:
                p.hget(keys.job(j), "state")
            states = p.execute()
            counts: dict[str, int] = {}
            for s in states:
                counts[s] = counts.get(s, 0) + 1
            finished = sum(counts.get(s, 0) for s in TERMINAL)
            depth = sum(r.zcard(q) for q in keys.queues())
            bar.update(task, completed=finished, detail=(
                f"queued {depth} running {counts.get('leased', 0) + counts.get('running', 0)} "
                f"failed {counts.get('failed', 0)}"))
            if done_submitting.is_set() and finished == len(snapshot) and _drained(r, keys):
                break
            if time.monotonic() > deadline:
                raise MakespanError(f"run did not finish within {timeout_s} s: {counts}")
            if system is not None:
                system.check_alive()  # a planner or worker that died: fail now, not at the timeout
            time.sleep(0.25)
    with lock:
        return list(ids), rejected


def _drained(r, keys: Keys) -> bool:
    """The planner has restored set points and run its drain check after the last job."""
    if r.zcard(keys.leases) or r.zcard(keys.running):
        return False
    d = r.hgetall(keys.drain)
    if not d:
        return False
    last_finish = 0.0
    for e in r.xrevrange(keys.events, count=50):
        body = json.loads(e[1]["e"])
        if body["kind"] in TERMINAL or body["kind"] == "restore_end":
            last_finish = max(last_finish, body["ts"])
    return float(d.get("checked_at", 0)) >= last_finish


def _gantt(events, fleet: FleetSpec, run_dir: Path, title: str) -> None:
    try:
        from makespan.gantt import render_gantt
    except ImportError:  # pragma: no cover
        console.print("[yellow]Gantt chart skipped: makespan.gantt not available")
        return
    render_gantt(events, str(run_dir / "gantt.png"), gpu_order=fleet.gpu_uuids(), title=title)


def _print_summary(rep: dict[str, Any], run_dir: Path, report_path: Path | None) -> None:
    """The run's summary on the console. Its times are workload seconds (the report's,
    :func:`makespan.run_report.live_report`), labelled so, with the time scale that turns
    them into the wall seconds ``makespan report RUN_DIR`` prints; ``wall`` is wall time."""
    j = rep["jobs"]
    ws = "workload s"
    scale = rep.get("time_scale")
    console.print(f"\n[bold]{rep['policy']}[/bold] on {rep['gpus']} GPUs — jobs: {j['submitted']} submitted, "
                  f"{j['completed']} completed, {j['failed']} failed, {j['rejected']} rejected")
    console.print("times below in workload s" + (f" (1 = {scale:g} wall s)" if scale else "")
                  + "; `makespan report` prints wall s")
    console.print(f"weighted completion {rep['weighted_completion_s']:.0f} {ws}·w   makespan "
                  f"{rep['makespan_s']:.0f} {ws}")
    console.print(f"utilization {rep['utilization']:.1%}   idle-while-queued "
                  f"{rep['idle_while_queued_gpu_s']:.0f} GPU·{ws}")
    lb = rep.get("best_over_lower_bound")
    console.print(f"transitions {rep['transitions']}   best ÷ lower bound {lb:.2f}" if lb else
                  f"transitions {rep['transitions']}")
    console.print(f"waits p50/p95 ({ws}): " + "  ".join(
        f"{k} {v['p50']:.0f}/{v['p95']:.0f}" for k, v in rep["wait_s"].items() if v.get("p50") is not None))
    if rep.get("set_point_absent_gpu_s") is not None:
        console.print(f"set points absent {rep['set_point_absent_gpu_s']:.0f} GPU·{ws}")
    console.print(f"drain {rep['drain']}   planner {rep['planner']}   wall time {rep['wall_s']} s")
    console.print(f"run directory: {run_dir} (events.jsonl, report.json, gantt.png, logs/)"
                  + (f"; report also at {report_path}" if report_path else ""))


def run_demo(report_path: Path | None = Path("report.json"), n_jobs: int = 200, seed: int = 0,
             policy: str | None = None, run_dir: Path | None = None, target_wall_s: float = 75.0) -> dict[str, Any]:
    """The main job: the render-cards pipeline plus ``n_jobs`` jobs of the shipped ITP
    slice (cluster05), services capped at 1,800 s and inter-arrival times divided by 4
    so the 8-GPU fleet is busy; compressed to about ``target_wall_s`` of wall time."""
    if n_jobs < 1:
        raise ValidationError("--jobs", n_jobs, "must be >= 1 (trace jobs to submit besides the render-cards pipeline)")
    fleet = load_fleet(DEMO_FLEET)
    jobs = read_trace(DEMO_TRACE, fleet, seed=seed, limit=n_jobs, max_service_s=1800.0)
    jobs = [TraceJob(j.id, j.submit_s / 4.0, j.service_s, j.endpoint, j.priority, j.num_gpu) for j in jobs]
    scale = choose_time_scale(jobs, fleet, target_wall_s)
    run_id = uuid.uuid4().hex[:6]
    return run_live(jobs, DEMO_FLEET, time_scale=scale, report_path=report_path, run_dir=run_dir, policy=policy,
                    extra=render_cards_pipeline(run_id), title="makespan demo")


DISPATCH_FLOOR_S = 0.02  # wall s the live path adds to each job at least (lease, publish, worker pick-up, phases)
SPEEDUP_COST_LIMIT = 0.05  # that floor, in workload s, as a share of the median job's service time: warned above


def speedup_warning(jobs: list[TraceJob], speedup: float) -> str:
    """"" or why ``speedup`` distorts a replay of ``jobs``: the live path's per-job floor
    (:data:`DISPATCH_FLOOR_S` wall s) is ``speedup`` × that in workload s, and above
    :data:`SPEEDUP_COST_LIMIT` of the median job's service time the replay's waits and
    weighted completion come out worse than the trace would see (a capacity planner's
    replay at the default 10,000× reported 5.4× the weighted completion of one at 100×)."""
    if not jobs:
        return ""
    median_s = sorted(job.service_s for job in jobs)[len(jobs) // 2]
    floor_s = DISPATCH_FLOOR_S * speedup
    if floor_s <= SPEEDUP_COST_LIMIT * median_s:
        return ""
    faithful = SPEEDUP_COST_LIMIT * median_s / DISPATCH_FLOOR_S
    return (f"--speedup {speedup:g} turns the live path's ~{DISPATCH_FLOOR_S * 1000:.0f} ms per job into "
            f"{floor_s:,.0f} workload s, {floor_s / median_s:.0%} of the median job's {median_s:,.0f} s: waits and "
            f"weighted completion come out worse than this trace would see; a faithful replay uses --speedup "
            f"{faithful:,.0f} or less (docs/planner.md \"Replay\")")


def run_replay(trace: Path, fleet_path: Path, *, speedup: float, report_path: Path | None, start: int = 0,
               limit: int | None = 200, seed: int = 0, policy: str | None = None,
               run_dir: Path | None = None) -> dict[str, Any]:
    """Replay ``limit`` rows of ``trace`` from row ``start`` on the live system,
    ``speedup``× faster than real time."""
    if not speedup > 0:
        raise MakespanError(f"--speedup: must be positive (got {speedup})")
    fleet = load_fleet(fleet_path)
    jobs = read_trace(trace, fleet, seed=seed, start=start, limit=limit)
    warning = speedup_warning(jobs, speedup)
    if warning:
        console.print(f"[yellow]warning: {warning}")
    return run_live(jobs, Path(fleet_path), time_scale=1.0 / speedup, report_path=report_path, run_dir=run_dir,
                    policy=policy, title=f"replay {Path(trace).name}", timeout_s=3600.0)
