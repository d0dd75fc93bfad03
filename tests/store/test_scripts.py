"""The store's Lua scripts as files: headers, one loader, the shared library, the events cap,
keys built from one prefix, and redis-py errors translated at the boundary."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import redis

from makespan.errors import StoreError
from makespan.keys import Keys
from makespan.store import EventLog, JobStore
from makespan.store import scripts as store_scripts

ROOT = Path(__file__).resolve().parents[2]
LUA_DIR = ROOT / "app" / "store" / "lua"
NAMES = store_scripts.script_names()


def body_of(name: str) -> str:
    """The script's text after its header comment."""
    lines = store_scripts.source(name).splitlines()
    return "\n".join(lines[len(store_scripts.header_lines(name)):])


def workload_key_indices(name: str) -> set[int]:
    """The KEYS indices the script's header names as a workload record (``P:workload:{id}``):
    a workload's ``state`` field is not a job's."""
    return {int(index) for line in store_scripts.header(name).keys
            for index in re.findall(r"^KEYS\[(\d+)\]\s+P:workload:", line)}


def literal_job_state_writes(name: str) -> set[str]:
    """The states the script's text writes as a literal ``'state', '<value>'`` pair, less
    those written on a workload record (a line that HSETs one of its KEYS)."""
    workload_keys = workload_key_indices(name)
    out: set[str] = set()
    for line in body_of(name).splitlines():
        if any(re.search(rf"'HSET', KEYS\[{index}\]", line) for index in workload_keys):
            continue
        out |= set(re.findall(r"'state',\s*'(\w+)'", line))
    return out


def test_workload_records_are_told_apart_from_job_records():
    assert workload_key_indices("fail_workload") == {1} and workload_key_indices("finish_workload") == {1}
    assert literal_job_state_writes("fail_workload") == set()
    assert workload_key_indices("preempt") == set()
    assert "running" in literal_job_state_writes("fenced")  # a job's state on a job key still counts


def test_every_lua_file_is_a_listed_script_or_the_library():
    on_disk = sorted(p.stem for p in LUA_DIR.glob("*.lua"))
    assert on_disk == sorted([*NAMES, store_scripts.LIBRARY])
    assert len(NAMES) == 36  # 25 + fail_workload, finish_workload (advance_workloads) + fn_hold, fn_withdraw, fn_host_gone (registrations) + reroute (pools)
    # + index_if_exists (the per-GPU instance index, workers/drivers/registry.py) + claim_phase (workers/phases.py)
    # + incidents_mark, hosts_down (the observer) + write_drain (the drain check, fenced)


@pytest.mark.parametrize("name", NAMES)
def test_header_names_every_key_and_argument_the_script_uses(name):
    head = store_scripts.header(name)
    used = {kind: {int(i) for i in re.findall(rf"\b{kind}\[(\d+)\]", body_of(name))} for kind in ("KEYS", "ARGV")}
    for kind, declared_lines in (("KEYS", head.keys), ("ARGV", head.argv)):
        exact = {int(m) for line in declared_lines for m in re.findall(rf"^{kind}\[(\d+)\]", line)}
        ranges = [int(m) for line in declared_lines for m in re.findall(rf"^{kind}\[(\d+)\.\.", line)]
        open_ended = any(re.match(rf"^{kind}\s", line) for line in declared_lines)  # "ARGV  field, value, ..."
        for index in used[kind]:
            assert index in exact or any(start <= index for start in ranges) or open_ended, \
                f"{name}.lua uses {kind}[{index}] but its header does not name it"
    assert head.keys or "KEYS: none" in "\n".join(store_scripts.header_lines(name)) or not used["KEYS"]


def test_no_lua_is_left_outside_the_store():
    offenders = []
    for folder in ("app", "workers", "planner"):
        for path in (ROOT / folder).rglob("*.py"):
            if "store" in path.relative_to(ROOT).parts[:2]:
                continue
            text = path.read_text()
            if re.search(r"redis\.call\(|register_script\(|\.eval\(|\.evalsha\(", text):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_only_the_library_appends_events_and_its_cap_is_not_hard_coded():
    for name in NAMES:
        incidents = {int(i) for line in store_scripts.header(name).keys
                     for i in re.findall(r"^KEYS\[(\d+)\]\s+P:incidents\s", line)}
        for line in body_of(name).splitlines():
            if "'XADD'" in line or "MAXLEN" in line:  # the incidents stream (the observer's), never P:events
                assert re.search(r"'XADD', KEYS\[(\d+)\], 'MAXLEN', '~', ARGV\[\d+\]", line), \
                    f"{name}.lua: use lib.lua's append_event ({line.strip()})"
                assert int(re.search(r"KEYS\[(\d+)\]", line).group(1)) in incidents, f"{name}.lua: {line.strip()}"
    lib = store_scripts.source(store_scripts.LIBRARY)
    assert lib.count("'XADD'") == 1 and "'__EVENTS_MAX_LEN__'" in lib
    assert "'12340'" in store_scripts.text("submit", 1234) and "__EVENTS_MAX_LEN__" not in store_scripts.text("submit")  # 10 × the cap
    with pytest.raises(ValueError):
        store_scripts.text("submit", 0)


def test_finishing_a_job_is_written_once_in_lua():
    """The final-state HSET lives in lib.lua's finish_job alone; scripts call it."""
    finals = ("completed", "failed", "cancelled")
    for name in NAMES:
        writes = literal_job_state_writes(name)
        assert not writes & set(finals), f"{name}.lua writes a final state itself: call finish_job"
    lib = store_scripts.source(store_scripts.LIBRARY)
    assert len(re.findall(r"HSET', key_job\(prefix, job_id\), 'state', state", lib)) == 1


def test_a_script_is_registered_once_per_client_and_cap(r):
    first = store_scripts.script(r, "acquire")
    assert store_scripts.script(r, "acquire") is first
    assert store_scripts.script(r, "acquire", 10) is not first
    assert first.sha == store_scripts.script(r, "acquire", 50_000).sha


def test_the_library_key_builders_equal_keys(r, keys):
    probe = store_scripts.text("expired") + "\n-- probe\n"
    probe = probe.split("return redis.call")[0] + (
        "return {key_job(ARGV[1], 'j1'), key_queue(ARGV[1], 'HIGH'), key_delayed(ARGV[1]), key_running(ARGV[1]),"
        " key_finished(ARGV[1]), key_gpu(ARGV[1], 'GPU-0'), key_resident(ARGV[1], 'GPU-0'), key_phase(ARGV[1], 'L1'),"
        " key_busy(ARGV[1], 'L1'), key_awaited(ARGV[1], 'j1'), key_idem(ARGV[1], 'k'), key_requests(ARGV[1], 'j1'),"
        " key_result(ARGV[1], 'j1'), key_workloads_active(ARGV[1]), key_instance(ARGV[1], 'i1'),"
        " key_submit_counts(ARGV[1])}")
    built = r.eval(probe, 0, keys.script_prefix)
    assert built == [keys.job("j1"), keys.queue("HIGH"), keys.delayed, keys.running, keys.finished, keys.gpu("GPU-0"),
                     keys.resident("GPU-0"), keys.phase("L1"), keys.busy("L1"), keys.awaited("j1"), keys.idem("k"),
                     keys.requests("j1"), keys.result("j1"), keys.workloads_active, keys.instance("i1"),
                     keys.submit_counts]


def test_the_events_cap_comes_from_the_setting(r, keys):
    cap = 10
    jobs = JobStore(r, keys, events_max_len=cap)
    for i in range(400):  # Lua: submit.lua appends through lib.lua's append_event
        jobs.submit(f"j{i}", {"id": f"j{i}", "state": "queued", "priority": "NORMAL"}, '{"kind":"submitted"}',
                    keys.queue("NORMAL"))
    # MAXLEN ~ trims whole stream nodes (100 entries each): far fewer than 400 remain
    assert r.xlen(keys.events) <= 200
    log = EventLog(r, Keys(keys.prefix + "-py"), events_max_len=cap)
    try:
        for i in range(400):
            log.record("probe", n=i)
        assert log.length() <= 200
        assert log.read(count=1)[0][1]["kind"] == "probe"
    finally:
        r.delete(log.keys.events)


def test_redis_errors_leave_the_store_as_store_error(keys):
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, decode_responses=True)
    with pytest.raises(StoreError) as caught:
        JobStore(dead, keys).cancel("j1", keys.queue("NORMAL"), "{}", 0.0)
    # ... and still a redis-py ConnectionError for callers that catch that
    assert isinstance(caught.value, redis.ConnectionError)
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    with pytest.raises(StoreError):
        EventLog(dead, keys).record("probe")


def test_a_script_error_is_a_store_error(r, keys):
    r.set(keys.job("j1"), "not a hash")  # HGET on a string: WRONGTYPE inside the script
    with pytest.raises(StoreError) as caught:
        JobStore(r, keys).cancel("j1", keys.queue("NORMAL"), "{}", 0.0)
    assert isinstance(caught.value, redis.ResponseError)


def test_the_store_imports_only_the_core():
    allowed = {"makespan.keys", "makespan.errors", "makespan.job_states", "makespan.models", "makespan.settings",
               "makespan.redis_conn", "makespan.events"}
    for path in (ROOT / "app" / "store").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if name.startswith("makespan") and not name.startswith("makespan.store"):
                    assert name in allowed, f"{path.name} imports {name}"


def test_every_key_is_built_by_keys():
    """No module outside makespan.keys formats a key from the prefix itself."""
    offenders = []
    for folder in ("app", "workers", "planner"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "app" / "keys.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"""f["'][^"']*\{[\w.]*\bprefix\}:""", line) or ".agenda(" in line and '+ ":' in line:
                    offenders.append(f"{path.relative_to(ROOT)}:{number}")
    assert offenders == []


def test_the_library_pool_key_builders_equal_keys_for_pool(r, keys):
    probe = store_scripts.text("expired") + "\n-- probe\n"
    probe = probe.split("return redis.call")[0] + (
        "return {key_queue(ARGV[1], 'HIGH', 'west'), key_queue(ARGV[1], 'LOW', ''), key_planner_wake(ARGV[1], 'west'),"
        " key_planner_wake(ARGV[1], nil), key_planner_critical(ARGV[1], 'west'), key_planner_critical(ARGV[1], false)}")
    built = r.eval(probe, 0, keys.script_prefix)
    west = keys.for_pool("west")
    assert built == [west.queue("HIGH"), keys.queue("LOW"), west.planner_wake, keys.planner_wake,
                     west.planner_critical, keys.planner_critical]
    assert west.queue("HIGH") != keys.queue("HIGH") and west.job("j") == keys.job("j")


def test_a_client_that_ran_a_script_is_freed_with_its_connections(redis_url):
    """Each ``makespan.connect()`` whose client ran a script stayed alive for good (its cached
    scripts held it: redis-py's Script keeps its client), with its Redis connection: a
    notebook cell re-run 30 times held 30 connections (a notebook user, 2026-12-07; fails on
    the code before)."""
    import gc
    import weakref

    from makespan.redis_conn import connect

    refs = []
    for _ in range(5):
        client = connect(redis_url)
        assert store_scripts.script(client, "fn_hold").sha  # cached for this client
        client.ping()
        refs.append(weakref.ref(client))
        del client
    gc.collect()
    assert [ref() for ref in refs] == [None] * 5
    used = connect(redis_url)
    try:  # a cached script still runs, on its own client (it keeps no strong reference to it)
        assert store_scripts.script(used, "fn_hold") is store_scripts.script(used, "fn_hold")
    finally:
        used.close()


def test_every_writer_trims_the_events_stream_to_the_environments_cap(r, keys, monkeypatch):
    """``MAKESPAN_EVENTS_MAX_LEN=500000`` was ignored: writers made without the setting (the
    planner's LeaseStore, ``events.record``, the delayed jobs' store) used the built-in 50,000
    and trimmed the whole stream to it (an SRE's check). Each now reads the environment."""
    from makespan import events
    from makespan.store.events import EventLog

    monkeypatch.setenv("MAKESPAN_EVENTS_MAX_LEN", "30")
    for index in range(2000):
        events.record(r, keys.events, "probe", index=index)
    assert r.xlen(keys.events) <= 600  # past 10 × 30 (approximate trimming, MAXLEN ~: up to a node more)
    assert EventLog(r, keys).max_len == 30
    assert "'300'" in store_scripts.script(r, "acquire").text and "'300'" not in store_scripts.text("acquire", 50_000)


def test_a_writer_without_the_setting_does_not_cut_a_deployments_longer_stream(r, keys, monkeypatch):
    """The fix above moved the loss: a submit from a shell without MAKESPAN_EVENTS_MAX_LEN
    trimmed a stream the deployment keeps at 100,000 to 50,000 (a verifier). A write trims
    only past 10 × its own cap; the planner's retention sweep trims to the planner's."""
    from makespan import events

    monkeypatch.setenv("MAKESPAN_EVENTS_MAX_LEN", "100")  # this process: 100 (the deployment keeps more)
    for index in range(800):
        events.record(r, keys.events, "probe", index=index)
    assert r.xlen(keys.events) == 800  # below 10 × 100: nothing trimmed
