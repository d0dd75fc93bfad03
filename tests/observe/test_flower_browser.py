"""Flower's own pages in a real browser (Debian's headless ``chromium``) against the
live system: the GPU host workers, their ``gpu.<host>`` queues and the execute tasks
are on the pages, behind Flower's basic auth."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import free_port
from tests.live import flower_receives_events, stop_checked, wait_for

from .debian_tools import Chromium, require_tool
from .deploy_checks import ROOT

FLEET = ROOT / "examples" / "render-pipeline.toml"
USER, PASSWORD = "ops", "pw-browser"


def _start_flower(settings, port: int, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROMETHEUS_"))}
    env.update(settings.to_env(), MAKESPAN_FLEET=str(FLEET), PYTHONPATH=str(ROOT))
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "celery", "-A", "makespan.workers.tasks:celery", "flower",
                                 f"--port={port}", "--address=127.0.0.1", f"--basic-auth={USER}:{PASSWORD}",
                                 "--persistent=False", "--inspect_timeout=3000"],
                                cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)


def _stop(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def test_flower_pages_show_gpu_workers_queues_and_execute_tasks(r, keys, settings, tmp_path):
    browser = Chromium(require_tool("chromium"), tmp_path / "chromium-profile")
    fleet = load_fleet(FLEET)
    system = LiveSystem(FLEET, fleet, settings, tmp_path / "logs", observer=False)
    port = free_port()
    flower = None
    try:
        system.start()
        flower = _start_flower(settings, port, tmp_path / "flower.log")
        api = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(f"{api}/healthcheck"), 90, "Flower to answer")  # a start on a loaded host
        wait_for(lambda: {f"gpu-{h.name}" for h in fleet.hosts} <= _worker_names(api), 40,
                 "Flower to see both GPU workers")
        # the workers above answered Flower's broadcast; the tasks page is built from events,
        # which Flower misses for good when the jobs run before its receiver subscribes
        wait_for(lambda: flower_receives_events(port, (USER, PASSWORD)), 60, "Flower's event receiver to see a worker heartbeat")
        prod = Producer(r, keys, fleet, settings)
        ids = [prod.submit({"endpoint": ep, "priority": p, "service_s": 20}).id
               for ep, p in (("embed", "CRITICAL"), ("chat", "NORMAL"), ("summarizer", "LOW"))]
        wait_for(lambda: all(r.hget(keys.job(j), "state") == "completed" for j in ids), 90, "jobs to complete")

        base = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}"
        workers_dom = browser.dump_dom(f"{base}/workers")
        names = sorted(n for n in _worker_names(api, full=True))
        for h in fleet.hosts:
            assert f"gpu-{h.name}@" in workers_dom, (h.name, workers_dom[-3000:])
        for name in names:
            page = browser.dump_dom(f"{base}/worker/{name}")
            host = name.split("@")[0].removeprefix("gpu-")
            assert f"gpu.{host}" in page, (name, page[-3000:])
        tasks_dom = browser.dump_dom(f"{base}/tasks", budget_ms=10000)
        rows = _task_rows(tasks_dom)
        execute = [row for row in rows if row["task"] == "makespan.execute"]
        assert execute, tasks_dom[-3000:]
        assert all(row["state"] == "SUCCESS" and row["worker"].startswith("gpu-host-") for row in execute), execute
        # a job runs as execute (after evict / start_endpoint) or, on a resident endpoint, as warm_job
        assert len(execute) + sum(row["task"] == "makespan.warm_job" for row in rows) == len(ids), rows
        browser.screenshot(f"{base}/workers", tmp_path / "flower-workers.png")
        browser.screenshot(f"{base}/tasks", tmp_path / "flower-tasks.png")
        # without credentials the same page is refused
        assert httpx.get(f"{api}/workers", timeout=5).status_code == 401
    finally:
        if flower is not None:
            _stop(flower)
        stop_checked(system)


def _task_rows(dom: str) -> list[dict[str, str]]:
    """{task, state, worker} of each row of Flower's tasks table (as the browser built it)."""
    rows = []
    for chunk in dom.split("<tr")[1:]:
        task = re.search(r">(makespan\.[a-z_]+)</a>", chunk)
        if not task:
            continue
        state = re.search(r'class="badge[^"]*">([A-Z]+)<', chunk)
        worker = re.search(r'worker-name-link"[^>]*title="([^"]+)"', chunk)
        rows.append({"task": task.group(1), "state": state.group(1) if state else "",
                     "worker": worker.group(1) if worker else ""})
    return rows


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _worker_names(api: str, full: bool = False) -> set[str]:
    try:
        got = httpx.get(f"{api}/api/workers?refresh=1", auth=(USER, PASSWORD), timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return set()
    return set(got) if full else {n.split("@")[0] for n in got}
