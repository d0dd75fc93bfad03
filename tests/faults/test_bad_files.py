"""Bad files a user hands the CLI (fleet, workload, trace and events files): each command
exits 2 with one line, ``error: FILE: field: reason``, never a traceback, and writes
nothing to Redis. (Found by a review of the file inputs; each test fails on the code
before its fix.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.errors import ValidationError
from makespan.models import load_fleet, parse_fleet
from makespan.traces import read_trace
from makespan.workloads import workload_status
from tests.conftest import FLEET_TOML

FLEET = load_fleet(FLEET_TOML)
SMALL_FLEET = '''name = "f"
[[hosts]]
name = "a"
gpu_count = 2
memory_mib = 1000
[endpoints.e]
model = "m"
memory_mib_per_gpu = 100
cold_start_s = 1
'''


def _own_keys(r, prefix):
    return sorted(r.scan_iter(f"{prefix}:*", count=1000))


def _one_line_error(res, *names: str) -> str:
    """The command failed as :func:`makespan.cli_support.fail` does: exit 2, one line
    ``error: ...`` naming each of ``names``, no traceback."""
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


# -- fleet files ------------------------------------------------------------------------------
def test_fleet_file_that_is_not_utf8_is_one_line_naming_the_file(r, prefix, redis_url, tmp_path):
    """A fleet file with a Latin-1 byte (an editor's encoding): UnicodeDecodeError's
    traceback before; now the file, the line and what to do."""
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(SMALL_FLEET.replace('model = "m"', 'model = "m\xe9"').encode("latin-1"))
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps({"steps": [{"name": "a", "endpoint": "e", "service_s": 1}]}))
    for args in (["submit-workload", str(wl), "--fleet", str(bad)], ["planner", "--fleet", str(bad)],
                 ["submit", "--fleet", str(bad), "--endpoint", "e", "--service-s", "1"]):
        res = CliRunner().invoke(cli_app, args, env=env)
        line = _one_line_error(res, str(bad), "UTF-8", "line 7")
        assert "fleet file" in line
    assert _own_keys(r, prefix) == []


def test_fleet_content_errors_name_the_file(tmp_path):
    """A field error of a fleet file names the file as well as the field (it named the field alone)."""
    bad = tmp_path / "fleet.toml"
    bad.write_text(SMALL_FLEET.replace("memory_mib = 1000", "memory_mib = 0"))
    with pytest.raises(ValidationError) as ei:
        load_fleet(bad)
    assert ei.value.field == "fleet.hosts.0.gpus.0.memory_mib" and ei.value.source == str(bad)
    assert str(ei.value).startswith(f"{bad}: fleet.hosts.0.gpus.0.memory_mib: ")


def test_fleet_gpu_index_twice_on_a_host_is_refused():
    """Two GPUs of one host at the same CUDA index (a copy-paste of a gpus entry) were
    accepted: CUDA_VISIBLE_DEVICES then names one GPU twice and a set point's index maps
    to the last of them."""
    doc = {"hosts": [{"name": "a", "gpus": [{"uuid": "GPU-1", "memory_mib": 100, "index": 0},
                                            {"uuid": "GPU-2", "memory_mib": 100, "index": 0}]}],
           "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10, "cold_start_s": 1}}}
    with pytest.raises(ValidationError) as ei:
        parse_fleet(doc)
    assert ei.value.field == "fleet.hosts.0" and "index 0 appears twice" in ei.value.reason


def test_fleet_gpu_count_in_quotes_says_so():
    """``gpu_count = "4"`` said "a host needs gpus or gpu_count" though gpu_count is there."""
    doc = {"hosts": [{"name": "a", "gpu_count": "4", "memory_mib": 100}],
           "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10, "cold_start_s": 1}}}
    with pytest.raises(ValidationError) as ei:
        parse_fleet(doc)
    assert "gpu_count must be a whole number" in ei.value.reason


# -- workload files ---------------------------------------------------------------------------
@pytest.mark.parametrize("step,field", [({"service_s": True}, "service_s"),
                                        ({"requests": True}, "requests"),
                                        ({"service_s": 5, "requests": "yes"}, "requests")])
def test_workload_step_boolean_is_not_a_number(r, prefix, redis_url, tmp_path, step, field):
    """YAML reads yes/true/on as booleans; ``service_s: true`` was a 1-second step and
    ``requests: true`` one request (a job's service_s refuses booleans)."""
    wl = tmp_path / "w.yaml"
    body = ", ".join(f"{k}: {'true' if v is True else v}" for k, v in step.items())
    wl.write_text(f"steps:\n  - {{name: a, endpoint: chat, {body}}}\n")
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    res = CliRunner().invoke(cli_app, ["submit-workload", str(wl), "--fleet", FLEET_TOML], env=env)
    _one_line_error(res, str(wl), f"workload.steps.0.{field}")
    assert _own_keys(r, prefix) == []


def test_workload_yaml_syntax_error_is_one_line(r, prefix, redis_url, tmp_path):
    """PyYAML's message spans lines (a caret under the column): the error was four lines."""
    wl = tmp_path / "w.yaml"
    wl.write_text("steps: [\n  {name: a, endpoint: chat\n")
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    res = CliRunner().invoke(cli_app, ["submit-workload", str(wl), "--fleet", FLEET_TOML], env=env)
    _one_line_error(res, str(wl), "not valid YAML", "line 3")
    assert _own_keys(r, prefix) == []
    txt = tmp_path / "w.txt"  # read as JSON: said "not valid txt" (a helper's report)
    txt.write_text("steps:\n  - {name: a, endpoint: chat, service_s: 1}\n")
    res = CliRunner().invoke(cli_app, ["submit-workload", str(txt), "--fleet", FLEET_TOML], env=env)
    _one_line_error(res, str(txt), "not valid JSON (a file not named .yaml, .yml or .json is read as JSON)")
    assert _own_keys(r, prefix) == []
    upper = tmp_path / "W.YAML"  # the suffix in capitals is YAML too (it was read as JSON)
    upper.write_text("steps: [\n  {name: a, endpoint: chat\n")
    res = CliRunner().invoke(cli_app, ["submit-workload", str(upper), "--fleet", FLEET_TOML], env=env)
    _one_line_error(res, str(upper), "not valid YAML", "line 3")


def test_workload_of_3000_steps_is_submitted_whole(r, prefix, redis_url, tmp_path):
    """A workload may have 10,000 steps, but one of more than about 2,000 failed in the
    submit script ("too many results to unpack": the workload record was one HSET of
    two fields per step)."""
    n = 3000
    steps = [{"name": f"s{i}", "endpoint": "chat", "service_s": 1, **({"depends_on": [f"s{i - 1}"]} if i else {})}
             for i in range(n)]
    wl = tmp_path / "big.json"
    wl.write_text(json.dumps({"name": "big", "steps": steps}))
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    res = CliRunner().invoke(cli_app, ["submit-workload", str(wl), "--fleet", FLEET_TOML], env=env)
    assert res.exit_code == 0, res.output
    from makespan.keys import Keys

    status = workload_status(r, Keys(prefix), res.output.strip())
    assert len(status["steps"]) == n and {s["state"] for s in status["steps"].values()} == {"queued"}
    assert r.zcard(Keys(prefix).queue("NORMAL")) == n


# -- trace files ------------------------------------------------------------------------------
ITP = "job_id,submission_time,duration,num_gpu\n"
BAD_TRACES = [  # (file name, content, field the error names)
    ("short.csv", ITP + "a,0,10,1\nb,1\n", "trace row 3"),            # TypeError before
    ("quote.csv", ITP + 'a,0,10,1\n"b,1,10,1\n', "trace row 3"),      # TypeError before
    ("nan.csv", ITP + "a,0,nan,1\n", "trace row 2.duration"),         # AssertionError in the simulator
    ("inf.csv", ITP + "a,0,inf,1\n", "trace row 2.duration"),         # the simulation never ended
    ("inf_submit.csv", ITP + "a,0,10,1\nb,inf,10,1\n", "trace row 3.submission_time"),
    ("negative.csv", ITP + "a,0,-10,1\nb,1,10,1\n", "trace row 2.duration"),  # silently dropped
    ("negative_gpus.csv", ITP + "a,0,10,-3\n", "trace row 2.num_gpu"),
    ("endpoint.jsonl", '{"endpoint": "nope", "service_s": 1}\n', "trace line 1.endpoint"),  # KeyError
    ("negative.jsonl", '{"endpoint": "chat", "service_s": -1}\n', "trace line 1.service_s"),  # simulated
    ("nan.jsonl", '{"endpoint": "chat", "service_s": NaN}\n', "trace line 1.service_s"),
    ("list.jsonl", '[1, 2]\n', "trace line 1"),                        # AttributeError
    ("priority.jsonl", '{"endpoint": "chat", "service_s": 1}\n{"endpoint": "chat", "service_s": 1, '
                       '"priority": "URGENT"}\n', "trace line 2.priority"),  # named no line
    # a capacity planner's trace (helper report): each was accepted silently
    ("typo.jsonl", '{"endpoint": "chat", "service_s": 1, "sumbit_s": 50}\n', "trace line 1.sumbit_s"),  # arrived at 0
    ("twice.jsonl", '{"id": "j1", "endpoint": "chat", "service_s": 1}\n{"id": "j1", "endpoint": "chat", '
                    '"service_s": 2}\n', "trace line 2.id"),  # the second job was lost
    ("gpus.jsonl", '{"endpoint": "chat", "service_s": 1, "num_gpu": 16}\n', "trace line 1.num_gpu"),  # ignored
    ("array.json", '[{"endpoint": "chat", "service_s": 1}]\n', "trace line 1"),  # read as CSV: "unknown CSV columns"
]


@pytest.mark.parametrize("name,content,field", BAD_TRACES, ids=[t[0] for t in BAD_TRACES])
def test_bad_trace_row_is_named(tmp_path, name, content, field):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValidationError) as ei:
        read_trace(path, FLEET)
    assert ei.value.field == field and ei.value.source == str(path), str(ei.value)


def test_a_json_lines_trace_is_sorted_and_a_window_starts_at_its_first_job(tmp_path):
    """`simulate` sorted a JSON-lines trace by submit_s but `replay` fed it in file order (a
    late row went in first); a window read from --start kept its absolute submit_s (a replay
    from row 100 sat idle until then). Rows come back sorted, a window from row N starts at
    its first job, as CSV rows do; a `.json` file is JSON lines too."""
    path = tmp_path / "unsorted.json"
    rows = [("late", 30.0), ("early", 10.0), ("mid", 20.0), ("last", 40.0)]
    path.write_text("".join(json.dumps({"id": i, "endpoint": "chat", "service_s": 1, "submit_s": t}) + "\n"
                            for i, t in rows))
    assert [(j.id, j.submit_s) for j in read_trace(path, FLEET)] == [("early", 10.0), ("mid", 20.0), ("late", 30.0),
                                                                     ("last", 40.0)]
    assert [(j.id, j.submit_s) for j in read_trace(path, FLEET, start=2)] == [("mid", 0.0), ("last", 20.0)]


def test_trace_that_is_not_utf8_fails_in_one_line(tmp_path):
    trace = tmp_path / "latin1.csv"
    trace.write_bytes((ITP + "a,0,10,1\nb\xe9,1,10,1\n").encode("latin-1"))
    for args in (["simulate", str(trace), "--fleet", FLEET_TOML, "-q"],
                 ["simulate", str(tmp_path / "short.csv"), "--fleet", FLEET_TOML, "-q"]):
        (tmp_path / "short.csv").write_text(ITP + "a,0,10,1\nb,1\n")
        res = CliRunner().invoke(cli_app, args)
        _one_line_error(res, args[1])


def test_trace_with_a_byte_order_mark_is_read(tmp_path):
    """A CSV saved by a spreadsheet starts with a UTF-8 byte-order mark: its first column
    was '\\ufeffjob_id' and the file an "unknown CSV columns" error."""
    trace = tmp_path / "bom.csv"
    trace.write_bytes(("\ufeff" + ITP + "a,0,10,1\n").encode("utf-8"))
    assert [j.id for j in read_trace(trace, FLEET)] == ["a"]


# -- makespan report on a run directory ------------------------------------------------------
def _run_dir(tmp_path: Path, text: str | bytes) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    path = run / "events.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return run


def _events_text() -> str:
    t0 = 1_700_000_000.0
    evs = [{"ts": t0, "kind": "submitted", "job": "j1", "priority": "HIGH", "endpoint": "chat"},
           {"ts": t0 + 1, "kind": "leased", "job": "j1", "priority": "HIGH", "gpus": ["GPU-a-0"], "lease": "l1"},
           {"ts": t0 + 1, "kind": "phase_start", "job": "j1", "phase": "execute", "gpus": ["GPU-a-0"],
            "lease": "l1"},
           {"ts": t0 + 5, "kind": "phase_end", "job": "j1", "phase": "execute", "gpus": ["GPU-a-0"], "lease": "l1"},
           {"ts": t0 + 5, "kind": "completed", "job": "j1"},
           {"ts": t0 + 6, "kind": "submitted", "job": "j2", "priority": "LOW", "endpoint": "chat"}]
    return "".join(json.dumps(e) + "\n" for e in evs)


def test_report_on_events_cut_off_mid_line_reports_the_rest(tmp_path):
    """A run killed while events.jsonl was written leaves its last line cut off: the
    report refused the whole run ("not JSON"); now it reports every whole line and warns."""
    text = _events_text()
    run = _run_dir(tmp_path, text[:-25])
    res = CliRunner().invoke(cli_app, ["report", str(run), "--json"])
    assert res.exit_code == 0, res.output
    assert "warning:" in res.output and "line 6 is cut off" in res.output
    summary = json.loads(res.output.splitlines()[-1])
    assert summary["jobs"]["completed"] == 1 and summary["jobs"]["submitted"] == 1


def test_report_bad_line_in_the_middle_still_fails(tmp_path):
    lines = _events_text().splitlines(keepends=True)
    run = _run_dir(tmp_path, "".join(lines[:2]) + lines[2][:20] + "\n" + "".join(lines[3:]))
    res = CliRunner().invoke(cli_app, ["report", str(run)])
    _one_line_error(res, "events.jsonl:3")


@pytest.mark.parametrize("content,expect", [
    (_events_text().encode()[:-40] + b"\xff\xfe\n", "UTF-8"),                    # UnicodeDecodeError before
    (_events_text() + '{"ts": NaN, "kind": "x"}\n', "events.jsonl:7.ts"),      # matplotlib's ValueError before
], ids=["not-utf8", "nan-ts"])
def test_report_on_a_bad_events_file_is_one_line(tmp_path, content, expect):
    run = _run_dir(tmp_path, content)
    res = CliRunner().invoke(cli_app, ["report", str(run)])
    _one_line_error(res, str(run / "events.jsonl"), expect)


def test_replay_warns_when_its_speedup_swamps_the_jobs():
    """A capacity planner's replay at the default --speedup 10,000 reported 5.4× the weighted
    completion of one at 100×, with no warning: the live path's ~20 ms per job is 200
    workload s there. `replay` warns when that floor passes 5 % of the median job."""
    from makespan.demo import speedup_warning
    from makespan.models import Priority
    from makespan.traces import TraceJob

    jobs = [TraceJob(f"j{i}", float(i), service_s, "chat", Priority.NORMAL, 1)
            for i, service_s in enumerate([300.0, 600.0, 900.0])]  # median 600 s
    warning = speedup_warning(jobs, 10000.0)
    assert "--speedup 10000 turns the live path's ~20 ms per job into 200 workload s, 33% of the median job's " \
           "600 s" in warning and "--speedup 1,500 or less" in warning, warning
    assert speedup_warning(jobs, 1500.0) == "" and speedup_warning([], 10000.0) == ""
