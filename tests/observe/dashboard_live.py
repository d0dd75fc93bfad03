"""A live system with a queue, an incident and the dashboard, for the browser test and
for the screenshot in docs/ (``python -m tests.observe.dashboard_live OUT.png``).

:func:`fill_fleet` occupies every GPU of the render-pipeline fleet with long jobs (a
renderer among them: a real endpoint process, which :func:`cause_incident` kills) and
queues more behind them; :func:`start_dashboard` runs ``makespan dashboard`` as a child
process with basic auth and a path prefix.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from makespan.keys import Keys
from makespan.live import wait_for
from makespan.models import FleetSpec
from makespan.producer import Producer
from makespan.settings import Settings

ROOT = Path(__file__).resolve().parent.parent.parent
FLEET = ROOT / "examples" / "render-pipeline.toml"
USER, PASSWORD, URL_PREFIX = "viewer", "pw-dash", "fleet"
# (endpoint, priority): TP-1 endpoints, so that eight of them hold all eight GPUs
FILLERS = [("renderer", "HIGH"), ("chat", "NORMAL"), ("chat", "LOW"), ("embed", "NORMAL"), ("chat", "HIGH"),
           ("renderer", "NORMAL"), ("chat", "NORMAL"), ("embed", "LOW")]
WAITING = [("chat", "LOW"), ("embed", "NORMAL"), ("renderer", "LOW"), ("chat", "NORMAL"), ("embed", "LOW"),
           ("chat", "LOW")]


def fill_fleet(r, keys: Keys, fleet: FleetSpec, settings: Settings, service_s: float = 4000.0,
               timeout_s: float = 60.0) -> tuple[list[str], list[str]]:
    """Submit :data:`FILLERS` and wait until every GPU is held (by a job or a set-point
    restore), then :data:`WAITING` (LOW and NORMAL: they preempt nothing), and wait for
    the plan. The planner may hold some fillers back behind others (and start a short
    waiting job first): which jobs wait is the planner's choice. Returns (filler ids,
    waiting ids)."""
    prod = Producer(r, keys, fleet, settings)
    gpus = fleet.gpu_uuids()
    fillers = [prod.submit({"endpoint": ep, "priority": p, "service_s": service_s}).id for ep, p in FILLERS]
    wait_for(lambda: all(r.mget([keys.gpu(g) for g in gpus])), timeout_s, "every GPU to be held")
    waiting = [prod.submit({"endpoint": ep, "priority": p, "service_s": service_s / 4}).id for ep, p in WAITING]
    wait_for(lambda: r.exists(keys.plan), timeout_s, "the planner to publish its plan")
    return fillers, waiting


def queued_ids(r, keys: Keys) -> set[str]:
    return {j for q in keys.queues() for j in r.zrange(q, 0, -1)}


def cause_incident(r, keys: Keys, endpoint: str = "renderer", timeout_s: float = 30.0) -> dict:
    """SIGKILL a running ``endpoint`` process (its pid from the instance registry) and
    wait for the observer's incident; returns the incident's stream record."""
    from makespan.workers.drivers.registry import list_instances

    inst = wait_for(lambda: next((i for i in list_instances(r, keys) if i.endpoint == endpoint and i.pid), None),
                    timeout_s, f"a running {endpoint} instance")
    os.kill(inst.pid, signal.SIGKILL)

    def incident():
        return next((rec for _sid, rec in r.xrange(keys.incidents)
                     if rec.get("kind") == "incident" and rec.get("instance_id") == inst.id), None)

    return wait_for(incident, timeout_s, f"the incident of the killed {endpoint} instance")


def start_dashboard(settings: Settings, port: int, log_path: Path, refresh_s: float = 0.5) -> subprocess.Popen:
    """``makespan dashboard`` on 127.0.0.1:port under /fleet/ with basic auth; returns
    once it answers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROMETHEUS_"))}
    env.update(settings.to_env(), PYTHONUNBUFFERED="1")
    with open(log_path, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-m", "makespan.cli", "dashboard", "--port", str(port),
                                 "--basic-auth", f"{USER}:{PASSWORD}", "--url-prefix", URL_PREFIX,
                                 "--window-min", "2", "--refresh-s", repr(refresh_s)],
                                cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"makespan dashboard exited {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/{URL_PREFIX}/api/state", auth=(USER, PASSWORD),
                             timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answers, 90, "makespan dashboard to answer")  # bounds a hang: a start on a loaded host takes seconds
    return proc


def page_url(port: int, path: str = "", live_updates: int = 1) -> str:
    """The page URL with credentials; ``?updates=N`` stops the page after N live updates,
    so that a headless browser (which waits for open connections) finishes."""
    query = f"?updates={live_updates}" if live_updates else ""
    return f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/{URL_PREFIX}/{path}{query}"


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(out_png: str) -> None:  # pragma: no cover - run by hand for docs/dashboard.png
    """Run the live system, fill it, cause an incident, screenshot the dashboard (to
    ``out_png``) and a finished job's page (beside it, ``-job`` added to the name)."""
    import shutil
    import uuid

    from makespan.live import LiveSystem, delete_prefix
    from makespan.models import load_fleet
    from makespan.redis_conn import connect, free_port

    from tests.observe.debian_tools import Chromium

    settings = Settings.from_env(key_prefix=f"dash-demo-{uuid.uuid4().hex[:6]}", time_scale=0.01, lease_ttl_s=3.0,
                                 heartbeat_s=0.5, batch_wait_s=0.02, planner_tick_s=0.05)
    fleet = load_fleet(FLEET)
    r, keys = connect(settings.redis_url), Keys(settings.key_prefix)
    work = Path(f"/tmp/{settings.key_prefix}")
    system = LiveSystem(FLEET, fleet, settings, work / "logs")
    port = free_port()
    dash = None
    try:
        system.start()
        # some history first: short jobs of every kind, then a full fleet and a queue
        prod = Producer(r, keys, fleet, settings)
        first = [prod.submit({"endpoint": ep, "priority": p, "service_s": 600}).id
                 for ep, p in FILLERS + WAITING + [("summarizer", "CRITICAL"), ("judge", "HIGH")]]
        wait_for(lambda: all(r.hget(keys.job(j), "state") == "completed" for j in first), 120, "the first jobs")
        fill_fleet(r, keys, fleet, settings)
        cause_incident(r, keys)
        dash = start_dashboard(settings, port, work / "dashboard.log")
        time.sleep(2)
        browser = Chromium(shutil.which("chromium") or "chromium", work / "profile", window=(1500, 1000))
        browser.screenshot(page_url(port), Path(out_png), budget_ms=3000)
        job_png = Path(out_png).with_name(Path(out_png).stem + "-job.png")  # a finished job's page
        browser.screenshot(page_url(port, f"job/{first[-1]}", live_updates=0), job_png, budget_ms=3000)
        print(out_png, job_png)
    finally:
        if dash is not None:
            stop(dash)
        system.stop()
        delete_prefix(r, keys)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard.png")
