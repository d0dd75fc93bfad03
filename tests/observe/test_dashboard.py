"""``makespan dashboard``: the read-only web view of the fleet.

The app against a real Redis (basic auth, path prefix, read-only routes, the shipped
assets, the snapshot's queue reasons and the plan ahead), and the whole thing in a real
browser: a live system (planner, both GPU workers, observer) with every GPU held and
jobs queued, ``makespan dashboard`` as its own process, Debian's headless ``chromium``
loading the page (``--dump-dom`` after a server-sent update, and ``--screenshot``): a
lane for every GPU, the queued jobs listed, an incident shown after one is caused, and a
job page.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import html
import re
import threading
import time

import httpx
import pytest
from makespan.dashboard.app import DashboardConfig, create_app
from makespan.dashboard.state import job_detail, snapshot
from makespan.errors import ValidationError
from makespan.live import LiveSystem
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import free_port
from tests.live import stop_checked, wait_for

from . import dashboard_live as dl
from .debian_tools import Chromium, require_tool


@pytest.fixture
def fleet():
    return load_fleet(dl.FLEET)


@contextlib.contextmanager
def _served(redis_url, keys, r, **kw):
    """The app served by a real uvicorn on a free port (a thread); yields an httpx client."""
    import uvicorn

    cfg = DashboardConfig(redis_url=redis_url, key_prefix=keys.prefix, **kw)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(cfg, client=r), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 20, "uvicorn to start")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_assets_ship_in_the_package_and_fetch_nothing_from_elsewhere():
    static = importlib.resources.files("makespan.dashboard") / "static"
    for name in ("index.html", "job.html", "dashboard.js", "dashboard.css"):
        text = (static / name).read_text()
        urls = set(re.findall(r"https?://[^\s\"')]+", text)) - {"http://www.w3.org/2000/svg"}
        assert not urls, (name, urls)


def test_basic_auth_prefix_and_read_only(redis_url, keys, r, fleet):
    r.set(keys.fleet, fleet.model_dump_json())
    with _served(redis_url, keys, r, basic_auth="ops:secret,second:pw", url_prefix="/ops/fleet/") as c:
        _check_auth_and_routes(c)
    with pytest.raises(ValidationError):
        DashboardConfig(redis_url=redis_url, basic_auth="nopassword").credentials()
    with pytest.raises(ValidationError):
        create_app(DashboardConfig(redis_url=redis_url, url_prefix="a/../b"), client=r)


def _check_auth_and_routes(c: httpx.Client) -> None:
    assert c.get("/ops/fleet/api/state").status_code == 401
    resp = c.get("/ops/fleet/api/state", auth=("ops", "wrong"))
    assert resp.status_code == 401 and resp.headers["www-authenticate"].startswith("Basic")
    assert c.get("/ops/fleet/api/state", auth=("second", "pw")).status_code == 200
    page = c.get("/ops/fleet/", auth=("ops", "secret"))
    assert page.status_code == 200 and 'src="static/dashboard.js"' in page.text
    assert c.get("/ops/fleet/static/dashboard.js", auth=("ops", "secret")).status_code == 200
    assert c.get("/ops/fleet", auth=("ops", "secret")).status_code in (302, 307)
    moved = c.get("/ops/fleet?updates=1", auth=("ops", "secret"))  # the query goes with the redirect
    assert moved.status_code in (302, 307) and moved.headers["location"] == "/ops/fleet/?updates=1", moved.headers
    assert c.get("/api/state", auth=("ops", "secret")).status_code == 404
    for method in ("post", "put", "delete"):
        assert getattr(c, method)("/ops/fleet/api/state", auth=("ops", "secret")).status_code == 405
    assert c.get("/ops/fleet/api/job/nope", auth=("ops", "secret")).status_code == 404
    with c.stream("GET", "/ops/fleet/api/stream", auth=("ops", "secret")) as resp:  # server-sent events
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = resp.iter_lines()
        event = next(line for line in lines if line.startswith("event:"))
        data = next(lines)
        assert event == "event: state" and json.loads(data.removeprefix("data: "))["lanes"]


def test_snapshot_lists_waiting_jobs_with_the_plans_eta(r, keys, settings, fleet):
    """No planner runs here: the plan is written as the planner's plan_view writes it."""
    from makespan.planner.model import Assignment, Plan, PlanJob
    from makespan.workers.plan_view import publish_plan

    r.set(keys.fleet, fleet.model_dump_json())
    prod = Producer(r, keys, fleet, settings)
    a = prod.submit({"endpoint": "chat", "priority": "HIGH", "service_s": 100}).id
    b = prod.submit({"endpoint": "judge", "priority": "LOW", "service_s": 50}).id
    now = time.time()
    empty = snapshot(r, keys, now=now)
    assert [q["job"] for q in empty["queue"]] == [a, b]
    assert all(q["reason_code"] == "no_planner" and q["eta"] is None for q in empty["queue"])
    assert [ln["gpu"] for ln in empty["lanes"]] == fleet.gpu_uuids()
    assert {ln["gpu"]: ln["set_point"] for ln in empty["lanes"]}["GPU-host-a-2"] == "embed"
    now_s = now / settings.time_scale
    plan = Plan("portfolio", [Assignment(a, ("GPU-host-a-3",), now_s + 100, now_s + 160, now_s + 260, (), "cold_start")])
    batch = [PlanJob(a, "chat", 4.0, now_s, 100.0, priority=1, seq=1),
             PlanJob(b, "judge", 1.0, now_s, 50.0, priority=3, seq=2)]
    # publish_plan writes its times at its own time.time(), and snapshot moves an ETA from the
    # server's clock to `now` by the server's clock at its read: both are bracketed here, not
    # bounded by how long the calls since `now` took (a loaded machine: seconds, not 0.1 s)
    published_from = time.time()
    publish_plan(r, keys, plan, batch, now_s, settings.time_scale)
    published_by = time.time()
    r.set(keys.planner_leader, "test")  # a planner leads, but has written no wait reason yet
    read_from = _server_now(r)
    s = snapshot(r, keys, now=now)
    read_by = _server_now(r)
    qa, qb = s["queue"]
    assert qa["reason_code"] == "behind_batch" and qa["gpus"] == ["GPU-host-a-3"]
    start = 100 * settings.time_scale  # the plan's start, after its publication
    assert published_from + start + now - read_by - 1e-3 <= qa["eta"] <= published_by + start + now - read_from + 1e-3
    assert qb["eta"] is None and qb["reason"] == "behind_batch: position 1 in the LOW queue"
    # the planner's own reason and ETA (makespan.wait_reasons) win over the plan's
    written = _server_now(r)
    r.hset(keys.job(b), mapping={"wait_reason": "waiting_for_gpus", "wait_detail": "GPU-host-b-0 held by x",
                                 "wait_eta": repr(written + 30.0), "wait_at": repr(written)})
    qb = snapshot(r, keys, now=now)["queue"][1]
    read_by = _server_now(r)
    assert qb["reason"] == "waiting_for_gpus: GPU-host-b-0 held by x"
    # 30 s after the write, moved to `now`: by the server's clock read in between
    assert now + 30.0 - (read_by - written) - 1e-3 <= qb["eta"] <= now + 30.0 + 1e-3
    [bar] = s["planned"]
    assert (bar["gpu"], bar["job"], bar["endpoint"], bar["priority"]) == ("GPU-host-a-3", a, "chat", "HIGH")
    assert s["plan"]["policy"] == "portfolio" and s["counts"]["queued"] == 2
    assert job_detail(r, keys, a)["record"]["state"] == "queued" and job_detail(r, keys, a)["result"] is None
    r.set(keys.result(a), json.dumps({"ok": True, "value": {"cards": 3}, "attempt": 1, "execute_s": 0.5}))
    assert job_detail(r, keys, a)["result"]["value"] == {"cards": 3}
    assert job_detail(r, keys, "missing") is None


def test_the_counts_are_totals_when_the_queue_lists_part_of_it(r, keys, settings, fleet, monkeypatch):
    """Found by a user with 600 LOW jobs queued: the page said '505 queued' (the listed
    part, QUEUE_LIMIT per priority), makespan_queue_depth_jobs 600."""
    from makespan.dashboard import state

    monkeypatch.setattr(state, "QUEUE_LIMIT", 2)
    r.set(keys.fleet, fleet.model_dump_json())
    prod = Producer(r, keys, fleet, settings)
    for _ in range(3):
        prod.submit({"endpoint": "judge", "priority": "LOW", "service_s": 50})
    prod.submit({"endpoint": "chat", "priority": "HIGH", "service_s": 100})
    for _ in range(3):
        prod.submit({"endpoint": "judge", "priority": "LOW", "service_s": 50, "delay_s": 600})
    counts = snapshot(r, keys, now=time.time())["counts"]
    assert (counts["queued"], counts["delayed"], counts["listed"], counts["list_limit"]) == (4, 3, 5, 2), counts


def test_the_job_page_runs_the_open_phase_until_now(r, keys):
    """A running job's page showed its execute phase as lasting 0 s (closed at the job's
    last event, its own start): it runs until now; an ended job's open phase does not."""
    now = _server_now(r)
    r.hset(keys.job("j-run"), mapping={"state": "running", "priority": "NORMAL", "endpoint": "chat"})
    for phase, kind, ago in (("evict", "phase_start", 9.0), ("evict", "phase_end", 8.0), ("execute", "phase_start", 7.0)):
        r.xadd(keys.events, {"e": json.dumps({"ts": now - ago, "kind": kind, "job": "j-run", "lease": "L1",
                                               "phase": phase, "gpus": ["GPU-host-a-0"]})})
    page = job_detail(r, keys, "j-run")
    evict, execute = page["phases"]
    assert (evict["complete"], evict["running"], evict["end"] - evict["start"]) == (True, False, pytest.approx(1.0))
    assert execute["running"] and not execute["complete"] and execute["end"] - execute["start"] >= 7.0, execute
    r.hset(keys.job("j-run"), "state", "failed")  # ended without the phase's end event: not running
    execute = job_detail(r, keys, "j-run")["phases"][1]
    assert not execute["running"] and execute["end"] == execute["start"], execute


def test_a_page_of_n_updates_stops_when_redis_does_not_answer(redis_url, keys, r, tmp_path):
    """The docs' headless recipe (?updates=2) hung on a Redis that did not answer: the
    stream's 'failure' updates were not counted (a dashboard user's report). Real uvicorn,
    real headless Chromium, a client on a port nothing listens on."""
    import redis as redis_py

    from makespan.redis_conn import free_port as closed_port

    dead = redis_py.Redis(port=closed_port(), decode_responses=True, socket_connect_timeout=0.2, socket_timeout=0.2)
    browser = Chromium(require_tool("chromium"), tmp_path / "profile")
    with _served(redis_url, keys, dead, refresh_s=0.2) as c:
        dom = browser.dump_dom(f"{c.base_url}/?updates=2", budget_ms=3000, timeout_s=60)
    assert "Redis unavailable" in dom and "stopped after 2 live updates" in dom, dom[-2000:]


def _server_now(r) -> float:
    sec, usec = r.time()
    return sec + usec / 1e6


def test_the_dashboard_counts_attempts_as_status_does(r, keys, settings, fleet):
    """The queue table and the job page show the attempts ``makespan status`` shows (found by
    a new-user trial: a preempted-then-completed job read attempts 1 in status and "0" on the
    job page, which showed the hash's reclaimed count; a job waiting out a function retry read 0)."""
    prod = Producer(r, keys, fleet, settings)
    done = prod.submit({"endpoint": "chat", "service_s": 5}).id
    # what the GPU worker's fenced commit leaves for a function job that completed on its first try
    r.hset(keys.job(done), mapping={"state": "completed", "result_attempt": 1})
    rec = job_detail(r, keys, done)["record"]
    assert (rec["attempts"], rec["reclaimed_attempts"]) == (prod.status(done)["attempts"], 0) == (1, 0)
    # one type per kind of value, as status gives it (a new user read "attempts": "1", "service_s": "5.0")
    status = prod.status(done)
    assert {k: rec[k] for k in ("service_s", "submitted_at", "submitted_at_utc", "tries", "cancel_requested")} == \
        {k: status[k] for k in ("service_s", "submitted_at", "submitted_at_utc", "tries", "cancel_requested")}
    retried = prod.submit({"endpoint": "chat", "service_s": 5}).id
    r.hset(keys.job(retried), "tries", 1)  # its first run failed, the function's retry waits queued
    [row] = [q for q in snapshot(r, keys, now=time.time())["queue"] if q["job"] == retried]
    assert row["attempts"] == prod.status(retried)["attempts"] == 1


def test_agenda_overdue_is_judged_on_the_redis_clock_whatever_the_hosts(r, keys):
    """The agenda writes its entries' times on the Redis server's clock: ``overdue`` must
    compare them with that clock, not the dashboard host's (``now``), and the times shown
    move to the host's clock. A host 2 h ahead called every open transition overdue; one
    2 h behind, none. (found by a review, 2026-12-05; fails on the code before its fix)"""
    from makespan.workers.agenda import AgendaTracker, server_now_s

    agenda = AgendaTracker(r, keys)
    running = agenda.register("lease-a:evict", "POSITIVE", ["chat"], ["GPU-host-a-0"], expected_duration_s=3600,
                              heartbeat=False)
    late = agenda.register("lease-b:evict", "POSITIVE", ["judge"], ["GPU-host-a-1"], expected_duration_s=1,
                           heartbeat=False)
    late_end = server_now_s(r) - 30.0  # planned on the Redis clock to have ended 30 s ago
    r.hset(keys.agenda(late.op_id), "expected_end", repr(late_end))
    for skew_s in (7200.0, -7200.0, 0.0):
        now = server_now_s(r) + skew_s  # this dashboard host's clock
        shown = {a["op_id"]: a for a in snapshot(r, keys, now=now)["agenda"]}
        assert shown[running.op_id]["overdue"] is False, skew_s
        assert shown[late.op_id]["overdue"] is True, skew_s
        assert shown[late.op_id]["expected_end"] == pytest.approx(late_end + skew_s, abs=1.0)
        assert shown[running.op_id]["expected_end"] == pytest.approx(running.expected_end + skew_s, abs=1.0)
    assert agenda.complete(running) and agenda.complete(late)


def _lanes(dom: str) -> list[str]:
    return re.findall(r'<g class="lane" data-gpu="([^"]+)"', dom)


def _queued(dom: str) -> set[str]:
    return set(re.findall(r'<tr class="queued-job" data-job="([^"]+)"', dom))


def _body(dom: str) -> dict[str, str]:
    tag = re.search(r"<body([^>]*)>", dom).group(1)
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag))


def test_dashboard_in_a_real_browser_against_the_live_system(r, keys, settings, fleet, tmp_path):
    browser = Chromium(require_tool("chromium"), tmp_path / "profile", window=(1500, 1000))
    system = LiveSystem(dl.FLEET, fleet, settings, tmp_path / "logs")
    port = free_port()
    dash = None
    try:
        system.start()
        fillers, waiting = dl.fill_fleet(r, keys, fleet, settings)
        dash = dl.start_dashboard(settings, port, tmp_path / "dashboard.log")
        assert httpx.get(f"http://127.0.0.1:{port}/{dl.URL_PREFIX}/", timeout=5).status_code == 401

        before = dl.queued_ids(r, keys)
        dom = browser.dump_dom(dl.page_url(port), budget_ms=3000)
        after = dl.queued_ids(r, keys)
        body = _body(dom)
        assert body.get("source") == "sse" and int(body["updates"]) >= 1, body  # drawn by a server-sent update
        assert _lanes(dom) == fleet.gpu_uuids()  # a lane for every GPU, in fleet order
        shown = _queued(dom)
        assert before & after, "jobs stayed queued while the page loaded"
        assert before & after <= shown <= before | after, (shown, before, after)
        assert shown <= set(waiting) | set(fillers)
        rows = re.findall(r'<tr class="queued-job".*?</tr>', dom)
        assert all('class="reason">' in row and 'class="reason"></td>' not in row for row in rows)  # a reason each
        assert re.search(r'<g class="bar(?: planned)?" data-job="[0-9a-f]+" data-phase="execute"', dom), \
            "running jobs drawn on the lanes"
        for ep in fleet.endpoints:
            assert f'<tr class="endpoint" data-endpoint="{ep}">' in dom
        assert "resident" in dom and 'class="incident"' not in dom

        incident = dl.cause_incident(r, keys)
        time.sleep(1.0)  # one refresh
        dom = browser.dump_dom(dl.page_url(port), budget_ms=3000)
        assert _body(dom).get("source") == "sse"
        shown_incidents = re.findall(r'<li class="incident" data-incident="[^"]+" data-endpoint="([^"]+)"', dom)
        assert incident["endpoint"] == "renderer" and "renderer" in shown_incidents, dom[-4000:]
        # its recovery as `makespan incidents` says it: recovered, not restarted / failed, or pending
        # (a user saw "not restarted" in the green of "recovered", and nothing for an open one)
        assert re.search(r'data-endpoint="renderer">(?:(?!</li>).)*<span class="recovery (?:ok|bad|pending)"', dom), \
            dom[-4000:]
        # a host_down incident (no endpoint) names its host, as `makespan incidents` does: the
        # first host's worker key withdrawn for a moment (its worker announces it again within a
        # quarter TTL; the incident then gets its recovery), an observer with no grace reporting it
        from makespan.workers.host_liveness import withdraw
        from makespan.workers.observer import Observer

        host = fleet.hosts[0].name
        watcher = Observer(r, keys, fleet, host_down_grace_s=0.0)
        try:
            assert withdraw(r, keys, host, r.get(keys.host_live(host)))
            raised = watcher.check_hosts()  # at once: its worker renews the key every quarter TTL
        finally:
            watcher.close()
        assert [i["host"] for i in raised] == [host], raised
        dom = browser.dump_dom(dl.page_url(port), budget_ms=3000)
        assert re.search(rf'<li class="incident" data-incident="[^"]+" data-endpoint=""><b>host {host} · host_down</b>',
                         dom), dom[-4000:]
        # a recovery whose outcome says how ("recovered: a GPU worker consumes its queue again",
        # as hosts_down.lua writes it) is green, as "recovered" is (it was drawn red), and the
        # header counts open incidents only
        r.xadd(keys.incidents, {"kind": "recovery", "incident_id": raised[0]["incident_id"], "recovery_s": "0.5",
                                "outcome": "recovered: a GPU worker consumes its queue again"})
        time.sleep(1.0)  # one refresh
        dom = browser.dump_dom(dl.page_url(port), budget_ms=3000)
        assert re.search(rf'data-endpoint=""><b>host {host} · host_down</b>(?:(?!</li>).)*'
                         r'<span class="recovery ok"> → recovered: a GPU worker consumes its queue again in ', dom), \
            dom[-4000:]
        assert re.search(r"\d+ open incidents?( |<)", dom), dom[:3000]

        shot = browser.screenshot(dl.page_url(port), tmp_path / "dashboard.png", budget_ms=3000)
        assert shot.stat().st_size > 20_000  # a drawn page, not a blank one

        job = fillers[0]
        page = browser.dump_dom(dl.page_url(port, f"job/{job}", live_updates=0), budget_ms=3000)
        assert _body(page).get("loaded") == "1", page[:1500]
        assert job in page and '<tr class="phase" data-phase="execute">' in page
        state = json.loads(httpx.get(f"http://127.0.0.1:{port}/{dl.URL_PREFIX}/api/job/{job}",
                                     auth=(dl.USER, dl.PASSWORD), timeout=5).text)["record"]["state"]
        assert f"<td>{state}</td>" in page
    finally:
        if dash is not None:
            dl.stop(dash)
        stop_checked(system)


def test_the_page_shows_each_pool_and_whether_a_planner_leads_it(redis_url, keys, r, settings, tmp_path):
    """With two pools running, the page said nothing of them (a new user saw a pool without a
    leader only as each of its jobs' no_planner reason). Real uvicorn, real headless Chromium."""
    from makespan.models import parse_fleet
    from tests.pools.test_pools import fleet_data

    from makespan.workers.host_liveness import cordon

    pooled = parse_fleet(fleet_data())
    r.set(keys.fleet, pooled.model_dump_json())
    r.set(keys.for_pool("a").planner_leader, "planner-a")  # pool a's planner leads; pool b has none
    cordon(r, keys, "b2", "new PSU")  # an operator took host b2 out of service: its lane says so
    # ... and its GPU worker has died since (seen once, no live key): the lane said only
    # "drained" while `makespan hosts` said the worker was down (a user's report)
    r.hset(keys.hosts_seen, "b2", "gone-worker")
    Producer(r, keys, pooled, settings).submit({"endpoint": "onlyb", "service_s": 5})
    browser = Chromium(require_tool("chromium"), tmp_path / "profile")
    with _served(redis_url, keys, r) as c:
        dom = browser.dump_dom(f"{c.base_url}/?updates=1", budget_ms=3000)
    rows = dict(re.findall(r'<tr class="pool[^"]*" data-pool="(\w+)" data-leads="(\d)">', dom))
    assert rows == {"a": "1", "b": "0"}, dom[-3000:]
    assert '<section id="pools-section">' in dom and "none: its jobs wait (no_planner)" in dom
    b_row = re.search(r'data-pool="b".*?</tr>', dom).group(0)
    assert '<td class="num">1</td>' in b_row, b_row  # its queued job
    assert {host: css for css, host in re.findall(r'<g class="(lane[^"]*)" data-gpu="[^"]+" data-host="(\w+)"', dom)} \
        == {"a1": "lane", "a2": "lane", "b1": "lane", "b2": "lane host-cordoned"}, dom[-3000:]
    assert "b2 · GPU 0 · drained · worker down" in dom and "a1 · GPU 0 · worker down" not in dom
    from makespan.dashboard.state import snapshot

    hosts = {h["name"]: h for h in snapshot(r, keys)["hosts"]}
    assert (hosts["b2"]["state"], hosts["b2"]["reason"], hosts["a1"]["state"]) == ("drained", "new PSU", "schedulable")
    assert (hosts["b2"]["worker_down"], hosts["a1"]["worker_down"]) == (True, False)


def test_a_passed_eta_and_the_wait_reason_are_shown_as_why_gives_them(redis_url, keys, r, settings, fleet, tmp_path):
    """A job whose ETA the plan has passed (its holder overran) showed "now" in the queue,
    and its job page showed no reason or ETA at all (new-user check): the queue says
    "passed N s ago" as `makespan why` does, and the job page gives the wait reason, its
    detail and the ETA. Real uvicorn, real headless Chromium."""
    r.set(keys.fleet, fleet.model_dump_json())
    r.set(keys.planner_leader, "test")  # a planner leads: its entries are trusted
    job = Producer(r, keys, fleet, settings).submit({"endpoint": "chat", "priority": "NORMAL", "service_s": 5}).id
    written = _server_now(r)
    r.hset(keys.job(job), mapping={"wait_reason": "waiting_for_gpus", "wait_detail": "GPU-host-a-0 held by job x",
                                   "wait_eta": repr(written - 40.0), "wait_at": repr(written)})
    # a step of a DAG of function calls: its function, step and dependencies, and its last progress report
    # (a DAG user's report: the page showed none of them, `makespan jobs` did)
    r.hset(keys.job(job), mapping={"fn": "evalfns.shard", "step": "judge", "deps": '["d1", "d2"]', "progress_done": 7,
                                   "progress_total": 20, "progress_note": "batch 7"})
    browser = Chromium(require_tool("chromium"), tmp_path / "profile")
    with _served(redis_url, keys, r) as c:
        dom = browser.dump_dom(f"{c.base_url}/?updates=1", budget_ms=3000)
        page = browser.dump_dom(f"{c.base_url}/job/{job}?updates=0", budget_ms=3000)
    row = re.search(rf'<tr class="queued-job" data-job="{job}".*?</tr>', dom).group(0)
    eta = re.search(r'<td class="num eta">([^<]*)</td>', row).group(1)
    assert re.fullmatch(r"passed 4\d\.\d s ago", eta), row
    assert re.search(r'<tr data-field="wait_reason"><th>wait_reason</th><td>waiting_for_gpus</td></tr>', page), page[-3000:]
    assert "GPU-host-a-0 held by job x" in page
    assert re.search(r'<tr data-field="wait_eta"><th>wait_eta</th><td>[^<]*\(passed 4\d\.\d s ago\)</td></tr>', page), \
        page[-3000:]
    for field, shown in (("progress", "7/20 (batch 7)"), ("fn", "evalfns.shard"), ("step", "judge"),
                         ("deps", "d1, d2")):
        assert f'<tr data-field="{field}"><th>{field}</th><td>{html.escape(shown, quote=False)}</td></tr>' in page, \
            (field, page[-3000:])


def test_an_agenda_operation_is_shown_short_with_the_whole_id_in_its_title(redis_url, keys, r, fleet, tmp_path):
    """The whole operation id (32 hex digits and the phase, no place to wrap) pushed the side
    column past a 1400 px window: a sideways scroll bar (new-user check). The cell shows the
    first 8 digits, as job ids are shown; its title holds the whole id. Real headless Chromium."""
    from makespan.workers.agenda import AgendaTracker

    r.set(keys.fleet, fleet.model_dump_json())
    op = AgendaTracker(r, keys).register("78ec451acf614a8aa951ccb9accd6f17:start", "POSITIVE", ["chat"],
                                         ["GPU-host-a-0", "GPU-host-a-1"], expected_duration_s=600, heartbeat=False)
    browser = Chromium(require_tool("chromium"), tmp_path / "profile")
    with _served(redis_url, keys, r) as c:
        dom = browser.dump_dom(f"{c.base_url}/?updates=1", budget_ms=3000)
    row = re.search(rf'<tr class="agenda-entry" data-op="{op.op_id}">.*?</tr>', dom)
    assert row, dom[-3000:]
    assert f'<td title="{op.op_id}">78ec451a:start</td>' in row.group(0), row.group(0)


def test_a_window_with_more_events_than_the_read_limit_keeps_the_newest(r, keys, monkeypatch):
    """A large-queue check: the snapshot read the window's OLDEST events up to its limit, so a
    busy fleet (or a raised MAKESPAN_EVENTS_MAX_LEN) showed a chart that missed "now"."""
    from makespan import events
    from makespan.dashboard import state

    monkeypatch.setattr(state, "EVENTS_LIMIT", 10)
    now = time.time()
    for i in range(25):
        events.record(r, keys.events, "drain", ts=now - 25 + i, seq=i)
    got = state._events_since(r, keys, now - 3600)
    assert [e["seq"] for e in got] == list(range(15, 25))
